"""Training configuration: one dataclass, read by ``HfArgumentParser`` from the command line and YAML."""

from __future__ import annotations

import json
import shlex
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

from ..validation import check_choice, check_float, check_int, did_you_mean

#: the values of each typed choice (``--help`` lists them; the dataclass fields use these ``Literal`` types)
ReportTo = Literal["tensorboard", "wandb", "none"]
ModelSize = Literal["tiny", "small", "standard", "none"]
SchedulerType = Literal["constant", "constant_with_warmup", "linear", "cosine"]
#: the registered ICL architectures (hf_icl.modeling.MODEL_CLASSES; a test keeps the two equal)
ModelType = Literal[
    "gpt2_icl", "sgpt", "mlp_icl", "one_layer_feature_map", "linear_gpt", "kernel_icl", "gd_transformer"
]
TRACKERS = get_args(ReportTo)
#: the size presets every registered ICL config offers ("none": the config's own defaults, shape in model_overrides)
MODEL_SIZES = ("tiny", "small", "standard")
SCHEDULERS = get_args(SchedulerType)
#: arguments a resumed run may change (the others must equal the checkpoint's): the length of the run,
#: logging/evaluation/checkpoint cadence, where and how results go, and the two recovery knobs
RESUMABLE_CHANGES = (
    "max_steps",
    "logging_steps",
    "eval_steps",
    "save_steps",
    "save_total_limit",
    "report_to",
    "run_name",
    "disable_tqdm",
    "output_dir",
    "resume_from_checkpoint",
    "overwrite_output_dir",
    "push_to_hub",
    "hub_model_id",
    "hub_private_repo",
    "learning_rate",
    "max_grad_norm",
)
#: names of earlier versions, still read from YAML files and saved ``training_args.json`` (old checkpoints)
LEGACY_NAMES = {
    "train_steps": "max_steps",
    "batch_size": "per_device_train_batch_size",
    "lr_scheduler": "lr_scheduler_type",
    "logging_every": "logging_steps",
    "eval_every": "eval_steps",
    "save_every": "save_steps",
}


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
    model_type: ModelType = field(default="gpt2_icl", metadata={"help": "registered ICL architecture"})
    model_size: ModelSize | None = field(
        default="standard",
        metadata={"help": "size preset; none: no preset (set the shape in model_overrides)"},
    )
    model_overrides: str = field(default="{}", metadata={"help": "JSON object of extra config fields"})
    attn_implementation: str | None = field(default=None, metadata={"help": "attention backend (sdpa, eager, …)"})
    # -- optimisation --------------------------------------------------------------------------
    max_steps: int = field(default=500_001, metadata={"help": "optimizer steps"})
    per_device_train_batch_size: int = field(default=64, metadata={"help": "prompts per device per micro-batch"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "micro-batches per optimizer step"})
    learning_rate: float = field(default=1e-4, metadata={"help": "peak learning rate (AdamW)"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    lr_scheduler_type: SchedulerType = field(default="constant", metadata={"help": "learning-rate schedule"})
    warmup_steps: int = field(default=0, metadata={"help": "learning-rate warm-up steps"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping (0: off)"})
    bf16: bool = field(default=False, metadata={"help": "bf16 mixed precision (autocast)"})
    fp16: bool = field(default=False, metadata={"help": "fp16 mixed precision with a gradient scaler (GPU only)"})
    seed: int = field(default=0, metadata={"help": "seed of weights and prompts"})
    seeds: int = field(
        default=1,
        metadata={
            "help": "train this many seeds at once (seed, seed+1, ...), each bit-identical to its own run with that "
            "--seed, its final model in OUTPUT_DIR/seed-S"
        },
    )
    # -- evaluation, checkpoints, logging ------------------------------------------------------
    eval_steps: int = field(default=1000, metadata={"help": "steps between evaluations (0: only at the end)"})
    eval_prompts: int = field(default=1280, metadata={"help": "prompts in the fixed evaluation set"})
    save_steps: int = field(default=10_000, metadata={"help": "steps between checkpoints (0: only at the end)"})
    logging_steps: int = field(
        default=50, metadata={"help": "steps between logs (the loss averaged over them) and progress lines"}
    )
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
    report_to: ReportTo = field(default="tensorboard", metadata={"help": "experiment tracker"})
    run_name: str | None = field(
        default=None, metadata={"help": "name of the run for the tracker and the model card (None: output_dir's name)"}
    )
    disable_tqdm: bool = field(
        default=False,
        metadata={
            "help": "no progress output (else a tqdm bar at a terminal, a line every logging_steps steps otherwise)"
        },
    )
    # -- data on disk, Hub -----------------------------------------------------------------------
    train_dataset: str | None = field(
        default=None,
        metadata={
            "help": "an ICLTasks dataset saved by `hf-icl dataset --save-to-disk`: train on its prompts (a finite "
            "pool) instead of drawing fresh ones; task, n_dims and n_points must match it"
        },
    )
    train_dataset_split: str = field(default="train", metadata={"help": "the split of train_dataset to train on"})
    push_to_hub: bool = field(default=False, metadata={"help": "upload the final model folder to the Hub"})
    hub_model_id: str | None = field(
        default=None, metadata={"help": "Hub repo of push_to_hub, 'user/name' (None: output_dir's name)"}
    )
    hub_private_repo: bool = field(default=False, metadata={"help": "create the Hub repo private"})

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
        for name in (
            "max_steps",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "eval_prompts",
            "logging_steps",
        ):
            check_int(name, getattr(self, name), low=1)
        for name in ("warmup_steps", "eval_steps", "save_steps", "seed"):
            check_int(name, getattr(self, name), low=0)
        check_int("seeds", self.seeds, low=1)
        if self.seeds > 1 and self.push_to_hub:
            raise ValueError(
                f"push_to_hub=True with seeds={self.seeds}: a run of several seeds writes one model folder per seed "
                "(OUTPUT_DIR/seed-S); train without push_to_hub and upload the seed you want"
            )
        check_float("learning_rate", self.learning_rate, low=0, low_inclusive=False)
        check_float("weight_decay", self.weight_decay, low=0)
        check_float("max_grad_norm", self.max_grad_norm, low=0)
        check_choice("lr_scheduler_type", self.lr_scheduler_type, SCHEDULERS)
        check_choice("report_to", self.report_to, TRACKERS)
        for name in ("bf16", "fp16", "overwrite_output_dir", "disable_tqdm", "push_to_hub", "hub_private_repo"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.bf16 and self.fp16:
            raise ValueError("bf16=True and fp16=True: pass at most one mixed-precision mode")
        for name in ("run_name", "hub_model_id", "train_dataset"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value.strip()):
                raise ValueError(f"{name} must be a non-empty string or None, got {value!r}")
        if self.hub_model_id is not None and not self.push_to_hub:
            raise ValueError(
                f"hub_model_id={self.hub_model_id!r} without push_to_hub=True would be ignored; pass push_to_hub=True"
            )
        if self.train_dataset is not None and self.curriculum_dims_start is not None:
            raise ValueError(
                f"curriculum_dims_start={self.curriculum_dims_start} with train_dataset={self.train_dataset!r}: a "
                "saved dataset's labels were computed on all n_dims inputs, so the active dimension cannot grow; "
                "drop one of the two"
            )
        if self.save_total_limit is not None:
            check_int("save_total_limit", self.save_total_limit, low=1)
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
        if "n_classes" in overrides:
            self._check_n_classes(task, overrides["n_classes"])
        check_choice("model_type", self.model_type, sorted(MODEL_CLASSES))
        build_config(self.model_type, self.model_size, **self.model_config_fields(task))
        check_attn_implementation(self.model_type, self.attn_implementation)

    def _check_n_classes(self, task, n_classes: Any) -> None:
        """A model's ``n_classes`` (from ``model_overrides``) must be the task's: the model would otherwise
        predict a different number of classes than the labels hold, found only when training or evaluating."""
        if task.target_kind != "categorical":
            raise ValueError(
                f"model_overrides sets n_classes={n_classes!r}, but task {self.task!r} has {task.target_kind} "
                "targets: n_classes applies only to categorical tasks; drop it from model_overrides"
            )
        if n_classes != task.n_classes:
            raise ValueError(
                f"model_overrides n_classes={n_classes!r} disagrees with the task's n_classes={task.n_classes} "
                f"(task {self.task!r}, task_params={self.task_params}): the {self.model_type} model would predict "
                f"{n_classes!r} classes for labels in [0, {task.n_classes}); drop n_classes from model_overrides "
                "(the task's is used) or set it in task_params"
            )

    def command_line(self, resume_from_checkpoint: str | None = None) -> str:
        """The ``hf-icl train`` command of these arguments: ``--output_dir`` and every field that differs from its
        default, shell-quoted; with ``resume_from_checkpoint`` the command that resumes this run from it (without
        ``overwrite_output_dir``, which resuming must not combine with)."""
        parts = ["hf-icl", "train", "--output_dir", self.output_dir]
        skip = {"output_dir", "resume_from_checkpoint"}
        if resume_from_checkpoint is not None:
            skip.add("overwrite_output_dir")
        for spec in fields(self):
            value = getattr(self, spec.name)
            if spec.name in skip or value == spec.default:
                continue
            text = "none" if value is None and spec.name == "model_size" else str(value)
            parts += [f"--{spec.name}", text]
        if resume_from_checkpoint is not None:
            parts += ["--resume_from_checkpoint", str(resume_from_checkpoint)]
        return " ".join(shlex.quote(str(part)) for part in parts)

    @property
    def mixed_precision(self) -> str:
        """The mode as accelerate spells it: "bf16", "fp16" or "no"."""
        return "bf16" if self.bf16 else "fp16" if self.fp16 else "no"

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
        """Every field, as ``training_args.json`` and checkpoint manifests store them; ``seeds`` only when it is not
        1, so a run of one seed writes the same files as before the field existed (and resumes their checkpoints)."""
        values = asdict(self)
        if values["seeds"] == 1:
            del values["seeds"]
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "the training arguments") -> ICLTrainingArguments:
        """Build from a mapping (a YAML file, a saved ``training_args.json``): names of earlier versions are
        renamed (with a FutureWarning), unknown names are refused with the closest known ones."""
        values = upgrade_names(values, source)
        known = [f.name for f in fields(cls)]
        for key in values:
            if key not in known:
                hint = f"{close} " if (close := did_you_mean(key, known)) else ""
                raise ValueError(f"{source}: unknown training argument {key!r}; {hint}(hf-icl train --help lists them)")
        for key in ("task_params", "model_overrides"):
            if isinstance(values.get(key), dict):
                values[key] = json.dumps(values[key])
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides) -> ICLTrainingArguments:
        """Read a YAML file of fields (dicts allowed for task_params / model_overrides); ``overrides`` win."""
        import yaml

        with open(path) as handle:
            values = yaml.safe_load(handle) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{path} must hold a mapping of training arguments, got {type(values).__name__}")
        values.update(overrides)
        return cls.from_dict(values, source=str(path))


def upgrade_names(values: dict[str, Any], source: str = "the training arguments") -> dict[str, Any]:
    """``values`` with the argument names of earlier versions renamed to today's (a FutureWarning each)."""
    values = dict(values)
    for old, new in LEGACY_NAMES.items():
        if old in values:
            if new in values:
                raise ValueError(f"{source}: {old!r} is the old name of {new!r}; pass only {new!r}")
            warnings.warn(f"{source}: {old!r} is now called {new!r}", FutureWarning, stacklevel=3)
            values[new] = values.pop(old)
    if "mixed_precision" in values:  # one field then, two booleans now
        mode = values.pop("mixed_precision")
        check_choice("mixed_precision", mode, ("no", "fp16", "bf16"))
        warnings.warn(f"{source}: 'mixed_precision' is now bf16 / fp16 (booleans)", FutureWarning, stacklevel=3)
        values.setdefault("bf16", mode == "bf16")
        values.setdefault("fp16", mode == "fp16")
    if "progress_bar" in values:
        values.setdefault("disable_tqdm", not values.pop("progress_bar"))
    return values


def _json_object(name: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (TypeError, json.JSONDecodeError) as err:
        raise ValueError(f"{name} must be a JSON object, got {text!r} ({err})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object, got {text!r}")
    return value
