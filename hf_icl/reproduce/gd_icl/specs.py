"""The gd-icl study's sizes (:class:`Scale`: the seeds, :class:`SyntheticScale`, :class:`FeatureScale`), what it
trains (:class:`ModelSpec`, each on a :class:`Stream` of prompts), the models' config fields, the run cache's spec
(:func:`training_spec`), and what an experiment gets (:class:`ExperimentState`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from ...data.tasks import get_task
from ...validation import check_choice
from ..report import ExperimentStateBase

#: seed offsets of the training data and of the evaluation prompts (model weights use the seed itself); the batches
#: of a training set are picked by a generator seeded BATCH_STREAM + seed
TRAIN_STREAM, BATCH_STREAM, EVAL_STREAM = 1000, 2000, 50_000
#: seed offset of the stationarity measurement's prompts
STATIONARITY_STREAM = 70_000


# -- sizes -------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SyntheticScale:
    """The synthetic study: C classes, N context pairs, the L grid, the models and their training."""

    n_classes: int = 25
    n_context: int = 10
    n_dims: int = 3
    task_bandwidth: float = 1.0
    #: what L counts: "prompts", L fixed training prompts, one task each, revisited every epoch (the document's code
    #: draws its training contexts once); "task_pool", L tasks of which each training prompt picks one and draws
    #: fresh inputs and labels (the package's task-scaling protocol, ``n_tasks=L``)
    training_set: str = "prompts"
    embed_dim: int = 32
    task_counts: tuple[int, ...] = (1000, 5000, 10000, 25000, 50000)
    #: (kernel, blocks) of the GD models and of the models trained from scratch
    gd_models: tuple[tuple[str, int], ...] = (
        ("rbf", 1),
        ("softmax", 1),
        ("rbf", 2),
        ("softmax", 2),
        ("rbf", 6),
        ("softmax", 6),
    )
    trained_models: tuple[tuple[str, int], ...] = (("rbf", 1), ("softmax", 1), ("softmax", 2))
    batch_size: int = 64
    gd_steps: int = 500
    trained_steps: int = 3000
    gd_learning_rate: float = 1e-2
    trained_learning_rate: float = 1e-3
    eval_prompts: int = 2000
    #: fresh prompts of the stationarity measurement (its noise floor falls as one over their square root)
    stationarity_prompts: int = 50_000

    def __post_init__(self):
        check_choice("training_set", self.training_set, ("prompts", "task_pool"))


@dataclass(frozen=True)
class FeatureScale:
    """The image-feature study on scikit-learn's digits."""

    train_classes: tuple[int, ...] = (0, 1, 2, 3, 4, 5)
    test_classes: tuple[int, ...] = (6, 7, 8, 9)
    n_components: int = 16
    n_ways: int = 4
    n_shots: int = 10
    n_queries: int = 5
    blocks: tuple[int, ...] = (1, 2, 3)
    kernel: str = "softmax"
    embed_dim: int = 16
    batch_size: int = 64
    steps: int = 500
    learning_rate: float = 1e-2
    eval_episodes: int = 400


@dataclass(frozen=True)
class Scale:
    """Sizes of a run: the seeds and each experiment's sizes."""

    seeds: tuple[int, ...] = (0, 1, 2)
    synthetic: SyntheticScale = field(default_factory=SyntheticScale)
    features: FeatureScale = field(default_factory=FeatureScale)

    def describe(self, experiment: str) -> str:
        seeds = f"{len(self.seeds)} seeds {list(self.seeds)}"
        if experiment == "synthetic":
            s = self.synthetic
            counted = "training prompts" if s.training_set == "prompts" else "pooled tasks"
            return (
                f"{seeds}; C = {s.n_classes}, N = {s.n_context}, d = {s.n_dims}, d' = {s.embed_dim}; L ∈ "
                f"{list(s.task_counts)} ({counted}); GD {_models(s.gd_models)} {s.gd_steps} steps (Adam "
                f"{s.gd_learning_rate:g}); trained {_models(s.trained_models)} {s.trained_steps} steps "
                f"(Adam {s.trained_learning_rate:g}); batch {s.batch_size}; {s.eval_prompts} fresh evaluation tasks "
                "(the same for every seed)"
            )
        if experiment != "features":
            return seeds  # an experiment with its own sizes (stories) writes them into the report itself
        f = self.features
        return (
            f"{seeds}; digits PCA-{f.n_components}, train classes {list(f.train_classes)}, test classes "
            f"{list(f.test_classes)}; {f.n_ways}-way {f.n_shots}-shot episodes (N = {f.n_ways * f.n_shots}), "
            f"{f.n_queries} queries each; GD {f.kernel} with {list(f.blocks)} blocks, d' = {f.embed_dim}, {f.steps} "
            f"steps (Adam {f.learning_rate:g}, batch {f.batch_size}); {f.eval_episodes} test episodes (the same for "
            "every seed)"
        )


def _models(pairs) -> str:
    return ", ".join(f"{kernel} × {blocks}" for kernel, blocks in pairs)


#: the CPU default. Measured on the 2-core VM with one thread per process (load ~3.8 from other jobs), per step of
#: three stacked seeds: GD 12-13 / 24-25 / 64-67 ms with 1 / 2 / 6 blocks, trained 17-18 / 30 ms with 1 / 2 blocks
#: (synthetic); GD 26 / 51 / 82 ms with 1 / 2 / 3 blocks plus 50 ms of episode sampling (features). That is about
#: 300 s of one core per L (1500 s for the grid, shared by two processes) and 2 min for the features: about 15 min
#: for both experiments, less on an idle machine
CPU = Scale()
#: ``--full``: five seeds, a finer L grid, longer training, every trained depth, more evaluation prompts. Everything
#: trains on the CPU (as SeedEnsemble does): about 2.3 h of one core per L, 14 h for the grid on this VM (plus half
#: an hour for the features), so it is for a machine with many cores
FULL = Scale(
    seeds=(0, 1, 2, 3, 4),
    synthetic=SyntheticScale(
        task_counts=(1000, 2000, 5000, 10000, 25000, 50000),
        trained_models=(("rbf", 1), ("softmax", 1), ("rbf", 2), ("softmax", 2), ("rbf", 6), ("softmax", 6)),
        gd_steps=2000,
        trained_steps=20000,
        eval_prompts=10000,
    ),
    features=FeatureScale(steps=2000, eval_episodes=2000),
)


# -- what is trained ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSpec:
    """One model of a study: GD-constructed (``kind="gd"``) or trained from scratch (``"trained"``)."""

    kind: str
    kernel: str
    n_blocks: int
    steps: int
    learning_rate: float

    @property
    def name(self) -> str:
        return f"{self.kind}_{self.kernel}_{self.n_blocks}"

    @property
    def label(self) -> str:
        who = "GD" if self.kind == "gd" else "trained"
        return f"{who} {self.n_blocks} block{'s' if self.n_blocks > 1 else ''} ({self.kernel})"

    @property
    def cost(self) -> float:
        """Relative training cost (steps × blocks, trained models a third dearer: measured on the CPU)."""
        return self.steps * (self.n_blocks + 1) * (1.3 if self.kind == "trained" else 1.0)


@dataclass(frozen=True)
class Stream:
    """Where a model's training prompts come from: the synthetic pool of ``n_tasks`` tasks, or digit episodes."""

    experiment: str
    n_tasks: int | None = None

    @property
    def name(self) -> str:
        return f"L{self.n_tasks}" if self.experiment == "synthetic" else "digits"


def gd_transformer_fields(scale: Scale, stream: Stream, spec: ModelSpec) -> dict:
    """The :class:`GDTransformerConfig` fields of a model (the GD construction adds its erase temperature)."""
    if stream.experiment == "synthetic":
        s = scale.synthetic
        sizes = {"n_dims": s.n_dims, "n_points": s.n_context + 1, "n_classes": s.n_classes, "embed_dim": s.embed_dim}
    else:
        f = scale.features
        sizes = {
            "n_dims": f.n_components,
            "n_points": f.n_ways * f.n_shots + 1,
            "n_classes": f.n_ways,
            "embed_dim": f.embed_dim,
        }
    fields = {**sizes, "normalize_by_count": True, "context_attention": "full"}
    if spec.kind == "trained":
        fields |= {"n_blocks": spec.n_blocks, "kernel": spec.kernel}
    return fields


def training_spec(scale: Scale, stream: Stream, spec: ModelSpec) -> dict:
    """Everything that fixes what a run learns (a finished run with the same spec is reused)."""
    if stream.experiment == "synthetic":
        s = scale.synthetic
        task = synthetic_task(s, stream.n_tasks if s.training_set == "task_pool" else None)
        data = task.to_dict() | {"training_set": s.training_set, "L": stream.n_tasks, "seed": "the run's seed"}
        batch_size = scale.synthetic.batch_size
    else:
        f = scale.features
        data = {
            "dataset": "sklearn digits",
            "train_classes": list(f.train_classes),
            "n_components": f.n_components,
            "n_ways": f.n_ways,
            "n_shots": f.n_shots,
        }
        batch_size = f.batch_size
    return {
        "model": asdict(spec),
        "fields": gd_transformer_fields(scale, stream, spec),
        "data": data,
        "seeds": list(scale.seeds),
        "batch_size": batch_size,
        "train_stream": TRAIN_STREAM,
    }


def synthetic_task(s: SyntheticScale, n_tasks: int | None = None, pool_seed: int = 0):
    """The categorical RKHS task family (a pool of ``n_tasks`` tasks, or fresh tasks with None)."""
    return get_task(
        "categorical",
        n_dims=s.n_dims,
        n_classes=s.n_classes,
        function="rbf",
        bandwidth=s.task_bandwidth,
        inputs="uniform",
        n_tasks=n_tasks,
        pool_seed=pool_seed,
    )


def synthetic_training_prompts(s: SyntheticScale, n_prompts: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed training set of ``n_prompts`` prompts (each its own fresh task) of ``training_set="prompts"``."""
    return synthetic_task(s).sample(n_prompts, s.n_context + 1, seed=TRAIN_STREAM + seed)


def synthetic_specs(scale: Scale, steps: int | None = None) -> list[ModelSpec]:
    s = scale.synthetic
    gd = [ModelSpec("gd", k, b, steps or s.gd_steps, s.gd_learning_rate) for k, b in s.gd_models]
    trained = [
        ModelSpec("trained", k, b, steps or s.trained_steps, s.trained_learning_rate) for k, b in s.trained_models
    ]
    return gd + trained


def feature_specs(scale: Scale, steps: int | None = None) -> list[ModelSpec]:
    f = scale.features
    return [ModelSpec("gd", f.kernel, b, steps or f.steps, f.learning_rate) for b in f.blocks]


@dataclass
class ExperimentState(ExperimentStateBase):
    """What an experiment gets (:class:`~hf_icl.reproduce.report.ExperimentStateBase`: ``full`` and ``seed`` as
    given, for experiments with sizes of their own) and the synthetic study's results, once measured."""

    scale: Scale
    synthetic: dict | None = None
