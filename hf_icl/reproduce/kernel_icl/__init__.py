"""``hf-icl reproduce kernel-icl table1|table2|figures|all``: ICL as kernel regression (seed 000).

The document compares, on a 1-D noisy sin(x) (Table 1), ridge regression, softmax attention on raw inputs, Nadaraya–
Watson with an RBF kernel, kernel ridge, a pre-trained single attention head and three angular kernels (cosine,
Cayley, geometric-algebra) on a random-Fourier-feature embedding; and, on 10-D tasks where 3 features share a latent
(Table 2), eight ``UnifiedICL`` models: {row attention only, GA column attention + row} × {softmax, cosine, Cayley,
GA}, against kernel ridge. It reports one run; we run every seed of :attr:`Scale.seeds` and give the mean and the
95 % t interval over seeds, and judge its seven "key insights" across the seeds.

The models are :class:`~hf_icl.modeling.kernel_icl.KernelICLForInContextRegression`, trained in the document's
context/query protocol (``n_context=``) with the document's recipe (Adam 1e-3, batch 64, no clipping, clean query
targets), the seeds of one architecture as one stacked model (:class:`~hf_icl.training.seed_ensemble.SeedEnsemble`,
the seed-stacked trainer, which checks every seed's loss, gradient norm and parameters finite each step and saves
manifested model folders) and all architectures in one loop over steps on shared batches. The classical estimators
are the package's, called in the same protocol (``predict_queries``).

The package: :mod:`.document` (the document's numbers and names), :mod:`.specs` (run sizes, training groups, the run
cache's spec), :mod:`.data` (prompts, held-out tasks, the trivial predictor), :mod:`.training` (every group's seeds,
cached), :mod:`.experiments` (the tables, insights and figures, and their claims), :mod:`.plots` (the figures).
"""

from __future__ import annotations

from .data import (
    context_query_batch,
    sine_prompt,
    table1_references,
    table2_eval_batch,
    table2_references,
    trivial_errors,
    zero_predictor_mse,
)
from .document import KERNEL_NAMES, ROW_KERNELS, TABLE1, TABLE2, TABLE2_KRR, grid_label, grid_name
from .experiments import (
    EXPERIMENTS,
    PAPER_SPEC,
    ExperimentState,
    evaluate_grid,
    insights,
    subjects,
    table1,
    table1_predictions,
    table2,
    train_grid,
    train_heads,
)
from .specs import CPU, FULL, PAPER, TABLE1_MODELS, TRIVIAL_LABEL, Group, Scale, Training, group_model_config
from .training import train_groups

__all__ = [
    "CPU",
    "EXPERIMENTS",
    "FULL",
    "KERNEL_NAMES",
    "PAPER",
    "ROW_KERNELS",
    "TABLE1",
    "TABLE1_MODELS",
    "TABLE2",
    "TABLE2_KRR",
    "TRIVIAL_LABEL",
    "ExperimentState",
    "Group",
    "Scale",
    "Training",
    "context_query_batch",
    "evaluate_grid",
    "grid_label",
    "grid_name",
    "group_model_config",
    "insights",
    "PAPER_SPEC",
    "sine_prompt",
    "subjects",
    "table1",
    "table1_predictions",
    "table1_references",
    "table2",
    "table2_eval_batch",
    "table2_references",
    "train_grid",
    "train_groups",
    "train_heads",
    "trivial_errors",
    "zero_predictor_mse",
]
