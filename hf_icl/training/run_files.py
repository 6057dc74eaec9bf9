"""The names of the files and folders a training run writes into its output directory, in one place for every
module that writes or reads them (the trainer, ``hf-icl evaluate``, the reproductions, the model zoo).

A run's ``OUTPUT_DIR`` holds the final model folder (``config.json``, ``model.safetensors``, ``manifest.json``),
:data:`TRAINING_ARGS_FILE`, :data:`METRICS_FILE`, :data:`CURVE_FILE`, :data:`PLOT_FILE`, the model card and
``checkpoints/step-N``. A run of several seeds (``seeds > 1``) holds one such folder per seed,
``OUTPUT_DIR/seed-S`` (:func:`seed_dir`), and one ``checkpoints/step-N`` holding every seed's state.
"""

from __future__ import annotations

from pathlib import Path

from ..evaluation.runs import METRICS_FILE

TRAINING_ARGS_FILE = "training_args.json"  # lets `hf-icl evaluate` rebuild the training task
PLOT_FILE = "context_scaling.png"
CURVE_FILE = "context_scaling.csv"  # the per-position curves of metrics.json's "standard" evaluation
EVAL_SEED_OFFSET = 7_919  # keeps the evaluation prompts apart from every training step's prompts
#: the folder of one seed of a run of several seeds: its final model folder, and its part of each checkpoint
SEED_DIR_PREFIX = "seed-"


def seed_dir(directory: str | Path, seed: int) -> Path:
    """``directory/seed-SEED``: one seed's final model folder (under OUTPUT_DIR) or state (under a checkpoint)."""
    return Path(directory) / f"{SEED_DIR_PREFIX}{seed}"


__all__ = [
    "CURVE_FILE",
    "EVAL_SEED_OFFSET",
    "METRICS_FILE",
    "PLOT_FILE",
    "SEED_DIR_PREFIX",
    "TRAINING_ARGS_FILE",
    "seed_dir",
]
