"""``hf-icl reproduce PAPER EXPERIMENT``: one module per seed document, one function per figure.

Each experiment trains with the package's trainer, evaluates on fresh tasks and writes
``OUTPUT_DIR/PAPER/EXPERIMENT/results.md`` (plots, tables and a verdict for every claim of the
document: holds, does not hold, or not testable at this size) plus ``results.json``.
"""

from __future__ import annotations

from pathlib import Path

from ..validation import check_choice
from . import gd_icl, kernel_icl, linear_attention, sgpt

#: paper name -> its module (``EXPERIMENTS`` and ``run``)
PAPERS = {"sgpt": sgpt, "linear-attention": linear_attention, "kernel-icl": kernel_icl, "gd-icl": gd_icl}


def experiments(paper: str) -> dict:
    """``{name: Experiment}`` of a paper."""
    check_choice("paper", paper, sorted(PAPERS))
    return PAPERS[paper].EXPERIMENTS


def reproduce(paper: str, experiment: str, **options) -> Path:
    """Run ``experiment`` of ``paper``; ``options`` as in the paper module's ``run`` (``full``,
    ``output_dir``, ``seed``, ``retrain``, ``steps``). Returns the path of ``results.md``."""
    check_choice("experiment", experiment, sorted(experiments(paper)))
    return PAPERS[paper].run(experiment, **options)
