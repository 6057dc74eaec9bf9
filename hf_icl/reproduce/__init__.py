"""``hf-icl reproduce PAPER EXPERIMENT``: one package per seed document, run by one :func:`run_experiment`.

Each paper package holds that document's numbers, specs, experiments, claims and plots, and describes itself with a
:class:`~.runs.Paper`; :mod:`.engine` runs any of them the same way. An experiment trains, evaluates on fresh tasks
and writes ``OUTPUT_DIR/PAPER/EXPERIMENT/results.md`` (plots, tables and a verdict for every claim of the document:
holds, does not hold, or not testable at this size) plus ``results.json``.
"""

from __future__ import annotations

from .engine import MLP_PAPERS, PAPERS, check_options, experiments, run_experiment

#: the name ``hf-icl reproduce`` and earlier releases used for :func:`run_experiment`
reproduce = run_experiment

__all__ = ["MLP_PAPERS", "PAPERS", "check_options", "experiments", "reproduce", "run_experiment"]
