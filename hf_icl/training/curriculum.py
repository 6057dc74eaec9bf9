"""Garg et al.'s curriculum: active input dimension and prompt length as a function of the step.

A pure function of the step, so a resumed run is at exactly the stage it left.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """``start`` at step 0, ``+inc`` every ``interval`` steps, capped at ``end``."""

    start: int
    end: int
    inc: int
    interval: int

    def at(self, step: int) -> int:
        return min(self.end, self.start + self.inc * (step // self.interval))


@dataclass(frozen=True)
class Curriculum:
    dims: Schedule
    points: Schedule

    @classmethod
    def from_args(cls, args) -> Curriculum:
        def schedule(kind: str, end: int) -> Schedule:
            start = getattr(args, f"curriculum_{kind}_start")
            return Schedule(
                start=end if start is None else start,
                end=end,
                inc=getattr(args, f"curriculum_{kind}_inc"),
                interval=getattr(args, f"curriculum_{kind}_interval"),
            )

        return cls(dims=schedule("dims", args.n_dims), points=schedule("points", args.n_points))

    def at(self, step: int) -> tuple[int, int]:
        """``(active dims, prompt length)`` at ``step``."""
        return self.dims.at(step), self.points.at(step)
