"""Training configuration: one dataclass, read by ``HfArgumentParser`` from the command line and YAML."""

from __future__ import annotations

import difflib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..validation import check_choice, check_float, check_int

MIXED_PRECISION = ("no", "fp16", "bf16")
TRACKERS = ("tensorboard", "wandb", "none")
#: the size presets every registered ICL config offers (None: the config's own defaults)
MODEL_SIZES = ("tiny", "small", "standard")
SCHEDULERS = ("constant", "constant_with_warmup", "linear", "cosine")
#: arguments a resumed run may change (the others must equal the checkpoint's): the length of the run,
#: logging/evaluation/checkpoint cadence, where and how results go, and the two recovery knobs
RESUMABLE_CHANGES = (
    "train_steps",
    "logging_every",
    "eval_every",
    "save_every",
    "save_total_limit",
    "report_to",
    "progress_bar",
    "output_dir",
    "resume_from_checkpoint",
    "overwrite_output_dir",
    "learning_rate",
    "max_grad_norm",
)


@dataclass
class ICLTrainingArguments:
    """Everything a training run needs. Defaults follow Garg et al.'s linear-regression run
    (``configs/garg_linear_regression.yaml`` adds their curriculum).

    The curriculum grows the active input dimension from ``curriculum_dims_start`` to ``n_dims``
    and the prompt length from ``curriculum_points_start`` to ``n_points``, by ``*_inc`` every
    ``*_interval`` steps (Garg et al.: dims 5→20 by 1 and points 11→41 by 2 every 2000 steps).
    """

    # -- task ---------------------------------------------------------------------------------
    task: str = field(default="linear_regression", metadata={"help": "task family (hf-icl tasks lists them)"})
    task_params: str = field(default="{}", metadata={"help": "JSON object of the family's hyperparameters"})
    n_dims: int = field(default=20, metadata={"help": "input dimension d"})
    n_points: int = field(default=41, metadata={"help": "examples per prompt at the end of the curriculum"})
    n_tasks: int | None = field(default=None, metadata={"help": "finite task-pool size (None: fresh tasks)"})
    pool_seed: int = field(default=0, metadata={"help": "seed of the finite task pool"})
    # -- curriculum ----------------------------------------------------------------------------
    curriculum_dims_start: int | None = field(
        default=None, metadata={"help": "first active dims (None: no curriculum, n_dims throughout)"}
    )
    curriculum_dims_inc: int = field(default=1, metadata={"help": "dims added per curriculum interval"})
    curriculum_dims_interval: int = field(default=2000, metadata={"help": "steps between dims increments"})
    curriculum_points_start: int | None = field(
        default=None, metadata={"help": "first prompt length (None: no curriculum, n_points throughout)"}
    )
    curriculum_points_inc: int = field(default=2, metadata={"help": "points added per curriculum interval"})
    curriculum_points_interval: int = field(default=2000, metadata={"help": "steps between points increments"})
    # -- model ---------------------------------------------------------------------------------
    model_type: str = field(
        default="gpt2_icl",
        metadata={
            "help": "registered ICL architecture: gpt2_icl, sgpt, mlp_icl, one_layer_feature_map, linear_gpt, "
            "kernel_icl, gd_transformer"
        },
    )
    model_size: str | None = field(
        default="standard",
        metadata={"help": "size preset: tiny, small or standard; none: no preset (set the shape in model_overrides)"},
    )
    model_overrides: str = field(default="{}", metadata={"help": "JSON object of extra config fields"})
    attn_implementation: str | None = field(default=None, metadata={"help": "attention backend (sdpa, eager, …)"})
    # -- optimisation --------------------------------------------------------------------------
    train_steps: int = field(default=500_001, metadata={"help": "optimizer steps"})
    batch_size: int = field(default=64, metadata={"help": "prompts per rank per micro-batch"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "micro-batches per optimizer step"})
    learning_rate: float = field(default=1e-4, metadata={"help": "peak learning rate (AdamW)"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    lr_scheduler: str = field(default="constant", metadata={"help": "constant, constant_with_warmup, linear, cosine"})
    warmup_steps: int = field(default=0, metadata={"help": "learning-rate warm-up steps"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping (0: off)"})
    mixed_precision: str = field(default="no", metadata={"help": "no, fp16 or bf16"})
    seed: int = field(default=0, metadata={"help": "seed of weights and prompts"})
    # -- evaluation, checkpoints, logging ------------------------------------------------------
    eval_every: int = field(default=1000, metadata={"help": "steps between evaluations (0: never)"})
    eval_prompts: int = field(default=1280, metadata={"help": "prompts in the fixed evaluation set"})
    save_every: int = field(default=10_000, metadata={"help": "steps between checkpoints (0: only at the end)"})
    logging_every: int = field(default=50, metadata={"help": "steps between tracker logs"})
    output_dir: str = field(default="outputs/icl", metadata={"help": "checkpoints, final model and model card"})
    resume_from_checkpoint: str | None = field(
        default=None, metadata={"help": "checkpoint dir to resume from, or 'latest'"}
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "start afresh in an output_dir that holds another run (its files are removed first)"},
    )
    save_total_limit: int | None = field(
        default=None, metadata={"help": "keep only the newest N checkpoints (None: keep all)"}
    )
    report_to: str = field(default="tensorboard", metadata={"help": "tensorboard, wandb or none"})
    progress_bar: bool = field(
        default=True,
        metadata={
            "help": "show progress: a tqdm bar at a terminal, a line every logging_every steps when stderr is not one"
        },
    )

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        check_int("n_dims", self.n_dims, low=1)
        check_int("n_points", self.n_points, low=1)
        if self.n_tasks is not None:
            check_int("n_tasks", self.n_tasks, low=1)
        check_int("pool_seed", self.pool_seed, low=0)
        for kind, total in (("dims", self.n_dims), ("points", self.n_points)):
            start = getattr(self, f"curriculum_{kind}_start")
            if start is not None:
                check_int(f"curriculum_{kind}_start", start, low=1, high=total)
            check_int(f"curriculum_{kind}_inc", getattr(self, f"curriculum_{kind}_inc"), low=0)
            check_int(f"curriculum_{kind}_interval", getattr(self, f"curriculum_{kind}_interval"), low=1)
        if isinstance(self.model_size, str) and self.model_size.lower() == "none":  # the command line's spelling
            self.model_size = None
        if self.model_size is not None:
            check_choice("model_size", self.model_size, MODEL_SIZES)
        for name in ("train_steps", "batch_size", "gradient_accumulation_steps", "eval_prompts", "logging_every"):
            check_int(name, getattr(self, name), low=1)
        for name in ("warmup_steps", "eval_every", "save_every", "seed"):
            check_int(name, getattr(self, name), low=0)
        check_float("learning_rate", self.learning_rate, low=0, low_inclusive=False)
        check_float("weight_decay", self.weight_decay, low=0)
        check_float("max_grad_norm", self.max_grad_norm, low=0)
        check_choice("lr_scheduler", self.lr_scheduler, SCHEDULERS)
        check_choice("mixed_precision", self.mixed_precision, MIXED_PRECISION)
        check_choice("report_to", self.report_to, TRACKERS)
        if self.save_total_limit is not None:
            check_int("save_total_limit", self.save_total_limit, low=1)
        if not isinstance(self.overwrite_output_dir, bool):
            raise ValueError(f"overwrite_output_dir must be True or False, got {self.overwrite_output_dir!r}")
        if self.resume_from_checkpoint is not None and not (
            isinstance(self.resume_from_checkpoint, str) and self.resume_from_checkpoint.strip()
        ):
            raise ValueError(
                "resume_from_checkpoint must be a checkpoint directory or 'latest', "
                f"got {self.resume_from_checkpoint!r}"
            )
        if self.overwrite_output_dir and self.resume_from_checkpoint == "latest":
            raise ValueError(
                "overwrite_output_dir=True with resume_from_checkpoint='latest': overwriting would delete the "
                "checkpoints to resume from; pass one of the two"
            )
        self._check_task_and_model()

    def _check_task_and_model(self) -> None:
        """Build the task family and the model config (no weights) these arguments describe, so a bad
        ``task``, ``task_params``, ``model_type`` or ``model_overrides`` fails now, before any work."""
        task_params, overrides = self.task_kwargs(), self.model_kwargs()
        for name, extra, owned in (
            ("task_params", task_params, ("n_dims", "n_tasks", "pool_seed")),
            ("model_overrides", overrides, ("n_dims", "n_points", "target_kind")),
        ):
            clash = [key for key in owned if key in extra]
            if clash:
                where = "it comes from the task" if clash[0] == "target_kind" else f"use --{clash[0]} instead"
                raise ValueError(
                    f"{name} must not set {clash[0]} (got {name}={json.dumps(extra)}): {where} "
                    "(two values would silently disagree)"
                )
        from ..modeling import MODEL_CLASSES, build_config, check_attn_implementation

        task = self.task_family()
        check_choice("model_type", self.model_type, sorted(MODEL_CLASSES))
        build_config(self.model_type, self.model_size, **self.model_config_fields(task))
        check_attn_implementation(self.model_type, self.attn_implementation)

    def task_family(self):
        """The task family these arguments train on (its finite pool, if ``n_tasks`` is set)."""
        from ..data.tasks import get_task

        return get_task(
            self.task, n_dims=self.n_dims, n_tasks=self.n_tasks, pool_seed=self.pool_seed, **self.task_kwargs()
        )

    def model_config_fields(self, task) -> dict[str, Any]:
        """The config fields of the model these arguments build for ``task`` (size preset aside)."""
        fields = {
            "n_dims": self.n_dims,
            "n_points": self.n_points,
            "target_kind": task.target_kind,
            **self.model_kwargs(),
        }
        if task.target_kind == "categorical":
            fields.setdefault("n_classes", task.n_classes)
        return fields

    def task_kwargs(self) -> dict[str, Any]:
        return _json_object("task_params", self.task_params)

    def model_kwargs(self) -> dict[str, Any]:
        return _json_object("model_overrides", self.model_overrides)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides) -> ICLTrainingArguments:
        """Read a YAML file of fields (dicts allowed for task_params / model_overrides); ``overrides`` win."""
        import yaml

        with open(path) as handle:
            values = yaml.safe_load(handle) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{path} must hold a mapping of training arguments, got {type(values).__name__}")
        values.update(overrides)
        known = [f.name for f in fields(cls)]
        for key in values:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=2, cutoff=0.6)
                hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
                raise ValueError(f"{path}: unknown training argument {key!r}; {hint}(hf-icl train --help lists them)")
        for key in ("task_params", "model_overrides"):
            if isinstance(values.get(key), dict):
                values[key] = json.dumps(values[key])
        return cls(**values)


def _json_object(name: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (TypeError, json.JSONDecodeError) as err:
        raise ValueError(f"{name} must be a JSON object, got {text!r} ({err})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object, got {text!r}")
    return value
