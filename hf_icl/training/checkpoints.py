"""Checkpoints that are never half-written: save to a temporary folder, then rename."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

CHECKPOINT_PATTERN = re.compile(r"^step-(\d+)$")


class TrainingProgress:
    """The step counter, saved with every checkpoint through ``accelerator.register_for_checkpointing``."""

    def __init__(self, step: int = 0):
        self.step = step

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step-{step:08d}"


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The checkpoint with the highest step under ``output_dir/checkpoints`` (None if there is none)."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return None
    steps = [(int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_PATTERN.match(p.name)) and p.is_dir()]
    return max(steps)[1] if steps else None


def save_checkpoint(accelerator, output_dir: str | Path, step: int) -> Path:
    """``accelerator.save_state`` into ``step-N.tmp``, then an atomic rename to ``step-N``.

    Every process writes its own RNG state, so all processes must call this.
    """
    final = checkpoint_dir(output_dir, step)
    staging = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process and staging.exists():
        shutil.rmtree(staging)  # left over from a run that died while saving
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    accelerator.wait_for_everyone()
    return final
