"""Reproductions of the context-scaling vs task-scaling study (seed ``001``): SGPT, ψ features, MLPs.

One function per figure. Each trains its models with the package's trainer, scores them on fresh
tasks, and reports the document's claims with a verdict at the size it ran:

* ``CPU`` (the default) shrinks d, widths, depths, steps and pools so each figure takes minutes on a
  laptop CPU; the output says so on every page.
* ``FULL`` (``--full``) uses the document's sizes (8 layers of width 256, MLPs of width 1024, d = 20 /
  8, millions of training prompts) and wants a GPU.

The models train on every prefix of prompts of the longest context (one MLP / one transformer for
all lengths, as the document does for its MLPs) and are read at the document's context lengths.

Beyond the figures: ``hilbert`` measures the consistency of the Hilbert estimate the document relies on
(:mod:`~hf_icl.reproduce.sgpt.hilbert`), ``lengths`` evaluates GPT-2 and SGPT past the prompt length they
trained on (:mod:`~hf_icl.reproduce.sgpt.lengths`). Every claim passes the models and baselines it is
about to :meth:`Report.claim` as :class:`~hf_icl.reproduce.report.Subject` s (:func:`subject`): one that
learned nothing, or a baseline worse than the trivial predictor, makes the claim "not testable at this size".

The package: :mod:`.common` (run sizes, the experiment state, the curve helpers), :mod:`.figures` (Fig. 1–7 and their
claims), :mod:`.hilbert`, :mod:`.lengths`, :mod:`.experiments` (the experiments by name and :data:`PAPER_SPEC`).
"""

from __future__ import annotations

from .common import (
    CPU,
    FULL,
    PAPER,
    ExperimentState,
    Scale,
    at,
    best_of,
    fmt,
    in_context_subject,
    subject,
    table,
    trivial_error,
)
from .experiments import EXPERIMENTS, PAPER_SPEC
from .figures import (
    FEATURE_MAP_NAMES,
    FIG4_TASKS,
    FIG5_TASKS,
    FIG7_TASKS,
    LinearOnEstimate,
    fig1,
    fig2,
    fig3,
    fig4,
    fig5,
    fig6,
    fig7,
    fig7_inputs,
    fit_linear_on_estimate,
)

__all__ = [
    "CPU",
    "EXPERIMENTS",
    "FEATURE_MAP_NAMES",
    "FIG4_TASKS",
    "FIG5_TASKS",
    "FIG7_TASKS",
    "FULL",
    "PAPER",
    "ExperimentState",
    "LinearOnEstimate",
    "Scale",
    "at",
    "best_of",
    "fig1",
    "fig2",
    "fig3",
    "fig4",
    "fig5",
    "fig6",
    "fig7",
    "fig7_inputs",
    "fit_linear_on_estimate",
    "fmt",
    "in_context_subject",
    "PAPER_SPEC",
    "subject",
    "table",
    "trivial_error",
]
