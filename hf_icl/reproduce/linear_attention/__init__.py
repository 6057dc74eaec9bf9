"""Reproduction of the linear vs softmax attention study (seed ``002``): Tables 1–3 and Figs. 1–3.

The document trains softmax GPT-2 (``gpt2_icl``) and causal linear attention with φ = ReLU² (``linear_gpt``) on
noiseless linear regression (d = 5, w ~ N(0, I), x ~ N(0, I), 10 points per prompt, the last one the query), at
depths 1, 3 and 6 (d_model 256, 4 heads, MLP 4×), five seeds each:

* softmax: Adam 1e-4, batches of 32, 30 000 steps; linear: Adam 3e-4, batches of 64, 7 500 / 8 000 / 10 000 steps;
  both: gradient clipping at 1.0 on the loss MSE/d over every position;
* test loss: the query's squared error / d; also on the anisotropic shift x ~ N(0, diag(0.5, 1, 1.5, 1, 1.75));
* convergence: samples seen (steps × batch) until 90 % of the gap between the initial and final test loss is closed.

Experiments (``hf-icl reproduce linear-attention EXPERIMENT``): ``table1`` (loss by depth, parameters), ``table2``
(the anisotropic shift), ``table3`` (convergence), ``all`` (the three from one set of runs), ``ablation`` (the
appendix's feature maps: identity, ReLU, the quadratic map and ReLU², each training the 6-layer linear model the same
way) and ``engines`` (how fast each way of training the seeds runs on this machine). The runs are shared: ``table2``
after ``table1`` trains nothing, and the ablation's ReLU² row is the 6-layer linear model of the tables.

Every claim is judged by the project's testability rule (:meth:`~hf_icl.reproduce.report.Report.claim` with one
:class:`~hf_icl.reproduce.report.Subject` per model the claim is about: its final test loss and the zero predictor's on
the same prompts): a claim about a model that learned nothing is "not testable at this size". Two checks of this
study come on top (:func:`~.claims.testability`): a model still improving at the end of training, and one seed
where a claim needs an interval, also make a claim not testable.

Sizes: ``CPU`` (the default) keeps the task, depths, heads, learning rates, batch sizes and the ratio of the step
counts, at width 64, 3 seeds and a fifth of the steps, and is sized to finish in under 30 minutes on 2 cores (about
15 by an estimate from per-step timings); ``FULL`` (``--full``) is the document's (width 256, 5 seeds, its step
counts; many hours on a CPU). The seeds of one (architecture, depth) train in lockstep as one stacked model
(:class:`~hf_icl.training.seed_ensemble.SeedEnsemble`, the seed-stacked trainer: each seed's loss, gradient norm and
parameters checked finite every step, manifested model folders), and the six groups run in single-thread processes,
one per core: ``engines`` times these choices against the package trainer.

Where the document leaves a detail open, the study's own code (``Yushgoel/icl-benchmarking``) decides, and
``docs/results/linear_attention.md`` lists each case: a fixed training set of 16 000 prompts sampled with
replacement, 4 000 test prompts, the test loss every 500 steps, 10 points in all per prompt.

The package: :mod:`.document` (the document's numbers, tables and names), :mod:`.specs` (recipes, sizes, the
training groups and the run cache's spec), :mod:`.data` (prompts and the test loss), :mod:`.training` (the seed
ensembles in worker processes, cached results, the curves' statistics, an experiment's state), :mod:`.claims`
(the report's tables and claims), :mod:`.plots` (the figures), :mod:`.timing` (``engines``) and
:mod:`.experiments` (the experiments and :data:`PAPER_SPEC` (run by :func:`hf_icl.reproduce.run_experiment`)).
"""

from __future__ import annotations

# the t interval of a seed mean, which every table of this study uses (kept here for its callers)
from ..report import seed_interval
from .claims import Testability, ablation_claims, isotropic_claims, subjects, testability
from .data import (
    anisotropic_weight_prompts,
    draw_batches,
    evaluation_sets,
    query_errors,
    study_task,
    training_prompts,
    trivial_errors,
)
from .document import (
    ABLATION_DEPTH,
    ABLATION_MAPS,
    CONVERGED,
    DATA_SEED,
    DEFAULT_FEATURE_MAP,
    DEPTHS,
    DOCUMENT,
    DOCUMENT_ABLATION,
    DOCUMENT_STEPS_TO_90,
    DOCUMENT_WIDTH,
    FAILED,
    FEATURE_MAP_FORMULAS,
    GPT2_VOCAB,
    N_DIMS,
    N_HEAD,
    N_POINTS,
    PAPER,
    SEEDS,
    SMALL_SHIFT,
    DocumentRow,
)
from .experiments import EXPERIMENTS, PAPER_SPEC, ablation, all_tables, describe, table1, table2, table3
from .plots import plot_ablation, plot_curves, plot_shift
from .specs import CPU, FULL, RECIPES, GroupSpec, Recipe, Scale, ablation_specs, group_specs
from .timing import WAYS, engines, time_way
from .training import (
    ExperimentState,
    GroupResult,
    document_interval,
    parameter_counts,
    plateaued,
    run_groups,
    samples_to_converge,
    separated,
    train_group,
)

__all__ = [
    "ABLATION_DEPTH",
    "ABLATION_MAPS",
    "CONVERGED",
    "CPU",
    "DATA_SEED",
    "DEFAULT_FEATURE_MAP",
    "DEPTHS",
    "DOCUMENT",
    "DOCUMENT_ABLATION",
    "DOCUMENT_STEPS_TO_90",
    "DOCUMENT_WIDTH",
    "DocumentRow",
    "EXPERIMENTS",
    "ExperimentState",
    "FAILED",
    "FEATURE_MAP_FORMULAS",
    "FULL",
    "GPT2_VOCAB",
    "GroupResult",
    "GroupSpec",
    "N_DIMS",
    "N_HEAD",
    "N_POINTS",
    "PAPER",
    "RECIPES",
    "Recipe",
    "SEEDS",
    "SMALL_SHIFT",
    "Scale",
    "Testability",
    "WAYS",
    "ablation",
    "ablation_claims",
    "ablation_specs",
    "all_tables",
    "anisotropic_weight_prompts",
    "describe",
    "document_interval",
    "draw_batches",
    "engines",
    "evaluation_sets",
    "group_specs",
    "isotropic_claims",
    "parameter_counts",
    "plateaued",
    "plot_ablation",
    "plot_curves",
    "plot_shift",
    "query_errors",
    "PAPER_SPEC",
    "run_groups",
    "samples_to_converge",
    "seed_interval",
    "separated",
    "study_task",
    "subjects",
    "table1",
    "table2",
    "table3",
    "testability",
    "time_way",
    "train_group",
    "training_prompts",
    "trivial_errors",
]
