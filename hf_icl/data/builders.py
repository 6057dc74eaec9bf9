"""``datasets`` builders that materialise ICL prompts from the task samplers.

``ICLTasks`` writes fixed train / validation / test sets of prompts for any registered task
family. The numbers on disk are exactly those of :func:`hf_icl.data.tasks.iterate_prompts`
with the same family, seed and batch size, so a saved dataset and an on-the-fly stream agree.

Example::

    from hf_icl.data.builders import ICLTasks

    builder = ICLTasks(config_name="linear_regression", n_dims=5, n_points=11,
                       n_prompts={"train": 1000, "validation": 128, "test": 128})
    builder.download_and_prepare()
    ds = builder.as_dataset().with_format("torch")   # DatasetDict of xs (N×d), ys (N), task_id
    ds.save_to_disk("linreg-d5")                      # or ds.push_to_hub("me/linreg-d5")

``NeedleInAHaystack`` (from :mod:`hf_icl.data.niah`) writes needle-in-a-haystack passkey prompts.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import dataclass, field
from typing import Any

import datasets

from ..validation import check_int
from . import inputs as _inputs_module
from . import linear_tasks as _linear_tasks_module
from . import nonlinear_tasks as _nonlinear_tasks_module
from . import task_family as _task_family_module
from . import tasks as _tasks_module
from .niah import NeedleInAHaystack as NeedleInAHaystack  # re-exported: the passkey builder lives in niah.py
from .niah import NeedleInAHaystackConfig as NeedleInAHaystackConfig
from .saved_prompts import FAMILY_MARKER
from .stories.builder import StoryCorpus as StoryCorpus  # re-exported: the story-corpus builder lives in stories/
from .stories.builder import StoryCorpusConfig as StoryCorpusConfig
from .tasks import TASK_REGISTRY, TaskFamily, iterate_prompts, make_task

SPLITS = ("train", "validation", "test")
DEFAULT_CONFIG = "linear_regression"
# Reserved for the config itself: the family gets them from n_dims / n_tasks / seed.
_CONFIG_OWNED = ("n_dims", "n_tasks", "pool_seed")


def code_hash() -> str:
    """Digest of the code that generates prompts; part of the cache key so edits invalidate caches."""
    digest = hashlib.sha256()
    task_modules = (_tasks_module, _task_family_module, _linear_tasks_module, _nonlinear_tasks_module)
    for module in (*task_modules, _inputs_module):
        digest.update(inspect.getsource(module).encode())
    digest.update(inspect.getsource(ICLTasksConfig).encode())
    digest.update(inspect.getsource(ICLTasks).encode())
    return digest.hexdigest()[:16]


def split_seed(seed: int, split: str) -> int:
    """Seed of one split's prompt stream; distinct for every (seed, split) pair."""
    return seed * len(SPLITS) + SPLITS.index(split)


@dataclass
class ICLTasksConfig(datasets.BuilderConfig):
    """What to generate.

    Args:
        family: a registered task family name (``hf_icl.data.tasks.available_tasks()``).
        task_params: the family's hyperparameters other than n_dims / n_tasks / pool_seed,
            e.g. ``{"noise_std": 0.5, "inputs": {"name": "diagonal", "variances": [...]}}``.
        n_dims: input dimension (``None``: the family's default, if it has one).
        n_points: examples per prompt.
        n_prompts: prompts per split, a dict over ``train`` / ``validation`` / ``test``.
        n_tasks: finite task-pool size shared by all splits (``None``: a fresh task per prompt).
        seed: fixes the pool (``pool_seed = seed``) and, through :func:`split_seed`, each split.
        batch_size: prompts drawn per sampler call (part of the stream's definition).
    """

    family: str = "linear_regression"
    task_params: dict[str, Any] = field(default_factory=dict)
    n_dims: int | None = 20
    n_points: int = 41
    n_prompts: dict[str, int] = field(default_factory=lambda: {"train": 12_800, "validation": 1_280, "test": 1_280})
    n_tasks: int | None = None
    seed: int = 0
    batch_size: int = 1024

    def build_family(self) -> TaskFamily:
        """Validate this config and return the task family it describes."""
        if self.family not in TASK_REGISTRY:
            raise ValueError(f"family must be one of {sorted(TASK_REGISTRY)}, got {self.family!r}")
        if not isinstance(self.task_params, dict):
            raise ValueError(f"task_params must be a dict of hyperparameters, got {self.task_params!r}")
        owned = sorted(set(self.task_params) & set(_CONFIG_OWNED))
        if owned:
            raise ValueError(f"set {owned} on ICLTasksConfig itself (n_dims, n_tasks, seed), not in task_params")
        check_int("n_points", self.n_points, low=1)
        check_int("seed", self.seed, low=0)
        check_int("batch_size", self.batch_size, low=1)
        if not isinstance(self.n_prompts, dict) or not self.n_prompts or set(self.n_prompts) - set(SPLITS):
            raise ValueError(f"n_prompts must be a dict over {list(SPLITS)}, got {self.n_prompts!r}")
        for split, count in self.n_prompts.items():
            check_int(f"n_prompts[{split!r}]", count, low=1)
        spec = {"name": self.family, **self.task_params, "n_tasks": self.n_tasks, "pool_seed": self.seed}
        if self.n_dims is not None:
            spec["n_dims"] = self.n_dims
        return make_task(spec)


class ICLTasks(datasets.GeneratorBasedBuilder):
    """Train / validation / test prompts of one task family; features ``xs``, ``ys``, ``task_id``.

    ``task_id`` is the pool index of the prompt's task when ``n_tasks`` is set, and otherwise the
    prompt's index within its split (every prompt has its own task).
    """

    VERSION = datasets.Version("1.0.0")
    BUILDER_CONFIG_CLASS = ICLTasksConfig
    BUILDER_CONFIGS = [
        ICLTasksConfig(name="linear_regression", family="linear_regression"),
        ICLTasksConfig(name="sparse_linear_regression", family="sparse_linear_regression"),
        ICLTasksConfig(
            name="noisy_linear_regression", family="noisy_linear_regression", task_params={"noise_std": 0.5}
        ),
        ICLTasksConfig(
            name="two_noise_linear_regression",
            family="noisy_linear_regression",
            task_params={"noise_std": [0.1, 0.5], "weight_prior": "scaled"},
        ),
        ICLTasksConfig(name="linear_classification", family="linear_classification"),
        ICLTasksConfig(name="quadratic_regression", family="quadratic_regression"),
        ICLTasksConfig(name="relu_2nn_regression", family="relu_2nn_regression", n_points=101),
        ICLTasksConfig(name="decision_tree", family="decision_tree", n_points=101),
        ICLTasksConfig(name="sinusoid", family="sinusoid", n_dims=1, n_points=100),
        ICLTasksConfig(name="latent_group_sinusoid", family="latent_group_sinusoid", n_dims=10, n_points=100),
        ICLTasksConfig(name="categorical", family="categorical", n_dims=10, n_points=10, task_params={"n_classes": 25}),
    ]
    DEFAULT_CONFIG_NAME = DEFAULT_CONFIG

    def __init__(self, *args, hash: str | None = None, **kwargs):
        super().__init__(*args, hash=hash or code_hash(), **kwargs)

    @classmethod
    def for_family(cls, family: TaskFamily, *, name: str | None = None, **config) -> ICLTasks:
        """A builder for an existing :class:`TaskFamily` instance (its hyperparameters are copied)."""
        spec = family.to_dict()
        params = {k: v for k, v in spec.items() if k not in ("name", *_CONFIG_OWNED)}
        # Custom names are not accepted as config_name when predefined configs exist: override one.
        return cls(
            config_name=DEFAULT_CONFIG,
            name=name or f"custom_{family.name}",
            family=family.name,
            task_params=params,
            n_dims=family.n_dims,
            n_tasks=family.n_tasks,
            **config,
        )

    def _info(self) -> datasets.DatasetInfo:
        family = self.config.build_family()  # fails here, before any work, on a bad config
        label = datasets.Value("int64" if family.target_kind == "categorical" else "float32")
        return datasets.DatasetInfo(
            # the family as JSON after the marker: SavedPrompts checks a training run against it
            description=f"In-context prompts of {family.name}. {FAMILY_MARKER}{json.dumps(family.to_dict())}",
            features=datasets.Features(
                {
                    "xs": datasets.Array2D(shape=(self.config.n_points, family.n_dims), dtype="float32"),
                    "ys": datasets.List(label, length=self.config.n_points),
                    "task_id": datasets.Value("int64"),
                }
            ),
        )

    def _split_generators(self, dl_manager):
        names = {"train": datasets.Split.TRAIN, "validation": datasets.Split.VALIDATION, "test": datasets.Split.TEST}
        return [
            datasets.SplitGenerator(name=names[split], gen_kwargs={"split": split})
            for split in SPLITS
            if split in self.config.n_prompts
        ]

    def _generate_examples(self, split: str):
        family = self.config.build_family()
        stream = iterate_prompts(
            family,
            self.config.n_prompts[split],
            self.config.n_points,
            seed=split_seed(self.config.seed, split),
            batch_size=self.config.batch_size,
        )
        index = 0
        for xs, ys, params in stream:
            ids = params["task_id"].tolist() if "task_id" in params else range(index, index + len(xs))
            for x, y, task_id in zip(xs.numpy(), ys.numpy(), ids, strict=True):
                yield index, {"xs": x, "ys": y, "task_id": task_id}
                index += 1
