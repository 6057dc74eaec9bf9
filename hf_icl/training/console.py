"""What a training run says on the console (stderr, main process): a banner before the first step (model, size, task,
steps, output folder, device, where a resumed run starts), an estimate of the remaining time once the first steps are
timed, and every periodic evaluation. Plain lines, so a log file gets them as a terminal does."""

from __future__ import annotations

import sys
import time

#: steps timed before the remaining time is estimated
ESTIMATE_AFTER_STEPS = 20


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def banner(trainer) -> str:
    """The run in one line: ``hf-icl train: gpt2_icl (0.41M parameters) on linear_regression (d=5, 11 points), ..."""
    args, model = trainer.args, trainer.accelerator.unwrap_model(trainer.model)
    parameters = sum(p.numel() for p in model.parameters())
    dims, points = trainer.curriculum.at(trainer.progress.step)
    start = trainer.progress.step
    steps = f"steps {start} → {args.max_steps}" if start else f"{args.max_steps} steps"
    size = f"{parameters / 1e6:.2f}M parameters"
    return (
        f"hf-icl train{trainer.seed_note}: {args.model_type} ({size}) on {trainer.task.name} "
        f"(d={args.n_dims}, {args.n_points} points; curriculum now d={dims}, {points} points), {steps} × "
        f"{args.per_device_train_batch_size} prompts, output {trainer.output_dir}, device {trainer.accelerator.device}"
    )


class ProgressClock:
    """Times the first :data:`ESTIMATE_AFTER_STEPS` steps of a run (or of its resumed part) and says how long the rest
    should take; ``clock`` is injectable (tests)."""

    def __init__(self, start_step: int, max_steps: int, clock=time.perf_counter):
        self.start_step, self.max_steps, self.clock = start_step, max_steps, clock
        self.started = clock()
        self.done = False

    def estimate(self, step: int) -> str | None:
        """The estimate line, once: after :data:`ESTIMATE_AFTER_STEPS` steps (or at the last step, if sooner)."""
        taken = step - self.start_step
        if self.done or (taken < ESTIMATE_AFTER_STEPS and step < self.max_steps):
            return None
        self.done = True
        per_step = (self.clock() - self.started) / max(taken, 1)
        remaining = (self.max_steps - step) * per_step
        return (
            f"{per_step * 1000:.0f} ms per step over the first {taken} steps: about {_duration(remaining)} for the "
            f"remaining {self.max_steps - step} steps"
        )


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def evaluation_line(step: int, max_steps: int, metrics: dict, seed_note: str = "") -> str:
    """``evaluation at step 500/5000: eval/loss 0.1234, ...`` (numbers, rounded)."""
    shown = ", ".join(f"{name} {value:.4g}" for name, value in metrics.items() if isinstance(value, float))
    return f"evaluation at step {step}/{max_steps}{seed_note}: {shown}"
