"""``hf-icl reproduce gd-icl synthetic|features``: categorical in-context learning with the functional-GD transformer
(seed 004, arXiv 2405.17248).

The document builds a transformer whose blocks (two-head self-attention, then cross-attention to the class embeddings
``W_e``) compute multi-step functional gradient descent on the cross-entropy of the context pairs, and compares, on
synthetic classification with C = 25 classes and N = 10 context examples, that construction ("GD") with the same
architecture trained from scratch ("Trained TF") as the number of training tasks L grows; and, on real image features
with disjoint train/test classes, GD models with 1-3 blocks against linear probing.

**GD** here is :meth:`~hf_icl.modeling.gd_transformer.GDTransformerForInContextClassification.from_gd_construction`
with only the numbers the construction leaves free learned from the training prompts (:class:`GDConstructionEnsemble`):
the class embeddings ``W_e`` (d' × C), the step size η (one number shared by every block: the construction's constant
step) and the kernel bandwidth h (one number; the construction is a family over it, and
:func:`~hf_icl.modeling.gd_transformer.distance_to_construction` treats its scale as free). Everything else (the
query/key maps reading x, the erase head, the cross-attention to ``W_e``) stays at the construction's values, so a
trained GD model *is* K steps of functional GD with the learned ``W_e``, η, h — a test checks its predictions against
:func:`~hf_icl.modeling.gd_transformer.functional_gd_logits`. **Trained** models are the same architecture
(:class:`~hf_icl.modeling.gd_transformer.GDTransformerConfig`, same kernel, ``normalize_by_count``) from a random
initialisation with every parameter learned, the seeds of one model stacked
(:class:`~hf_icl.training.seed_ensemble.SeedEnsemble`). Every model attends as the document's transformer does
(``context_attention="full"``: the context tokens attend to the whole context, the query to the context only), so a
GD model's K blocks are K steps of the document's functional GD; both kinds train on the document's prompt, N context
pairs and one query (``n_context=N``, the cross-entropy at the query), with Adam, and are scored at that query.
(Before issue 29 the models attended causally and trained on every prefix: the causal variant, which for K ≥ 2 is a
different algorithm.) The GD construction's stationarity (the document's theorem) is measured on the trained GD models
(:mod:`.stationary`).

**synthetic**: the package's ``categorical`` task family with ``function="rbf"`` (labels drawn from softmax of a
random RKHS function of x: random Fourier features of an RBF kernel), x uniform on [−1, 1]^d as in the document's
code. L counts training prompts as in the document's code, which draws its L training contexts (each its own task)
once and trains on them repeatedly (``training_set="prompts"``); ``training_set="task_pool"`` is the package's
task-scaling protocol instead (a pool of L tasks, ``n_tasks=L``, fresh inputs and labels for every prompt). Evaluation
is on fresh tasks.

**features**: scikit-learn's bundled digits (64-d) through PCA fitted on the training classes only, episodes of
``n_ways`` classes with a random class→label permutation each (:func:`sample_episodes`, usable with any
``(features, labels)``), GD models trained on train-class episodes and evaluated on held-out classes, against a
logistic regression fitted on each test episode's context (:func:`linear_probe`).

**stories** (the document's language generation) lives in :mod:`.stories`.

The package: :mod:`.document` (the document's numbers and names), :mod:`.specs` (sizes, model specs, prompt streams,
the run cache's spec, :class:`ExperimentState`), :mod:`.training` (:class:`GDConstructionEnsemble`, the training
driver and its worker processes, cached runs), :mod:`.metrics` (query accuracy and NLL, learned η and h),
:mod:`.synthetic` and :mod:`.features` (the experiments and their claims), :mod:`.stationary` (the stationary-point
measurement), :mod:`.stories` with :mod:`.stories_training` and :mod:`.stories_claims` (the language generation),
:mod:`.plots` (the figures), :mod:`.experiments` (:data:`EXPERIMENTS`, :data:`PAPER_SPEC`).
"""

from __future__ import annotations

# the episode sampler, digit features, linear probing and the seed ensemble are the package's own (hf_icl.data,
# hf_icl.estimators, hf_icl.training.seed_ensemble); the study's namespace has always offered them
from ...data.episodes import Episodes, digit_features, sample_episodes
from ...estimators.linear_probe import linear_probe
from ...training.seed_ensemble import SeedEnsemble
from .document import ACCURACY_TOLERANCE, ALIGNED, PAPER
from .experiments import EXPERIMENTS, PAPER_SPEC
from .features import feature_eval_episodes, features
from .metrics import (
    interval_text,
    learned_values,
    mean_of,
    model_query_metrics,
    query_logits,
    query_metrics,
    seed_stats,
)
from .specs import (
    BATCH_STREAM,
    CPU,
    EVAL_STREAM,
    FULL,
    STATIONARITY_STREAM,
    TRAIN_STREAM,
    ExperimentState,
    FeatureScale,
    ModelSpec,
    Scale,
    Stream,
    SyntheticScale,
    feature_specs,
    gd_transformer_fields,
    synthetic_specs,
    synthetic_task,
    synthetic_training_prompts,
    training_spec,
)
from .synthetic import HEAD_GROUPS, needs_more_tasks_claim, relevant_groups, synthetic, synthetic_eval_set
from .training import GDConstructionEnsemble, initial_embeddings, train_models

__all__ = [
    "ACCURACY_TOLERANCE",
    "ALIGNED",
    "BATCH_STREAM",
    "CPU",
    "EVAL_STREAM",
    "EXPERIMENTS",
    "FULL",
    "HEAD_GROUPS",
    "PAPER",
    "STATIONARITY_STREAM",
    "TRAIN_STREAM",
    "Episodes",
    "ExperimentState",
    "FeatureScale",
    "GDConstructionEnsemble",
    "ModelSpec",
    "Scale",
    "SeedEnsemble",
    "Stream",
    "SyntheticScale",
    "digit_features",
    "feature_eval_episodes",
    "feature_specs",
    "features",
    "gd_transformer_fields",
    "initial_embeddings",
    "interval_text",
    "learned_values",
    "linear_probe",
    "mean_of",
    "model_query_metrics",
    "needs_more_tasks_claim",
    "query_logits",
    "query_metrics",
    "relevant_groups",
    "PAPER_SPEC",
    "sample_episodes",
    "seed_stats",
    "synthetic",
    "synthetic_eval_set",
    "synthetic_specs",
    "synthetic_task",
    "synthetic_training_prompts",
    "train_models",
    "training_spec",
]
