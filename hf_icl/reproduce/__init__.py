"""``hf-icl reproduce PAPER EXPERIMENT``: one package per seed document, run by one :func:`run_experiment`.

Each paper package holds that document's numbers, specs, experiments, claims and plots, and describes itself with a
:class:`~.report.Paper`; :mod:`.engine` runs any of them the same way. An experiment trains, evaluates on fresh tasks
and writes ``OUTPUT_DIR/PAPER/EXPERIMENT/results.md`` (plots, tables and a verdict for every claim of the document:
holds, does not hold, or not testable at this size) plus ``results.json``.

How the reproductions train: through the package's training stack. sgpt's models train with
:func:`hf_icl.training.train` (the :class:`~hf_icl.training.ICLTrainer`, via :func:`~.report.train_or_reuse`).
linear-attention, kernel-icl and gd-icl's synthetic and features experiments train the seeds of one small model in
lockstep as one stacked model, the seed-stacked trainer :class:`hf_icl.training.seed_ensemble.SeedEnsemble` (gd-icl's
constructed models, :class:`~.gd_icl.GDConstructionEnsemble`, step through its same checked optimizer step): every
step checks each seed's loss, gradient norm and updated parameters finite and stops with
:class:`~hf_icl.training.TrainingDivergedError` naming the seed and the step, and each seed's model is saved with
``save_pretrained`` into ``RUN/seed<seed>`` with a model manifest that ``from_pretrained`` verifies when a finished
run is reused. gd-icl's stories (causal language models) train with ``transformers.Trainer``.
"""

from __future__ import annotations

from .engine import MLP_PAPERS, PAPERS, check_options, experiments, run_experiment

#: the name ``hf-icl reproduce`` and earlier releases used for :func:`run_experiment`
reproduce = run_experiment

__all__ = ["MLP_PAPERS", "PAPERS", "check_options", "experiments", "reproduce", "run_experiment"]
