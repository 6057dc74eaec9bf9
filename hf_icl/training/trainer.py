"""The Accelerate training loop for ICL models.

Every step draws fresh prompts on the training device (or picks tasks from a finite pool)
from a generator seeded by ``(seed, rank, step)``: ranks see different prompts, and a resumed
run sees exactly the prompts the uninterrupted run would have seen, with no sampler state to
save. With ``train_dataset`` the prompts come instead from a saved ``ICLTasks`` dataset (a finite
pool), drawn by the same seeded generator. Launch on one device with ``python`` / ``hf-icl train``,
on many with ``accelerate launch``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, set_seed
from tqdm.auto import tqdm
from transformers import get_scheduler

from ..data.saved_prompts import SavedPrompts, check_saved_dataset_early
from ..data.tasks import TaskFamily, make_task
from ..evaluation import ContextScalingResult, evaluate_context_scaling
from ..evaluation.baselines import default_baselines
from ..evaluation.metrics import metric_for_task
from ..evaluation.predictors import evaluation_mode, output_tensor
from ..evaluation.runs import evaluation_entry, write_curve_csv, write_metrics
from ..files import apply_umask
from ..modeling import build_model
from ..modeling.model_folder import write_model_manifest
from . import console
from .arguments import ICLTrainingArguments
from .checkpoints import CheckpointSaveError, TrainingProgress, capture_rng_state, quiet_progress, save_checkpoint
from .curriculum import Curriculum
from .hub import check_hub_access, default_repo_name, push_model_folder
from .model_card import eval_results_from_context_scaling, write_model_card
from .resume import ResumeRules, TrainingDivergedError  # noqa: F401  (re-exported: defined here before)
from .run_files import (  # re-exported: these names were defined here before hf_icl.training.run_files
    CURVE_FILE,
    EVAL_SEED_OFFSET,
    METRICS_FILE,
    PLOT_FILE,
    TRAINING_ARGS_FILE,
)

#: packages that provide each tracker of ``report_to`` (any one of them will do)
TRACKER_PACKAGES = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",)}
#: sharded setups: their weights and optimizer state are split across processes, which our checkpoints do not gather
UNSUPPORTED_DISTRIBUTED = (DistributedType.FSDP, DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM)


@dataclass
class TrainingResult:
    model: torch.nn.Module
    output_dir: Path
    step: int
    history: list[dict] = field(default_factory=list)
    final_metrics: dict[str, float] = field(default_factory=dict)
    #: the final model against the default baselines (main process only; None on other ranks)
    context_scaling: ContextScalingResult | None = None
    #: the Hub commit of push_to_hub (None without it)
    hub_url: str | None = None


def step_seed(seed: int, rank: int, step: int) -> int:
    """Seed of the prompts one rank draws at one step (distinct for every triple)."""
    return ((seed * 1_000_003 + rank) * 1_000_000_007 + step) % (2**63 - 1)


def check_environment(args: ICLTrainingArguments) -> None:
    """Refuse what would run wrongly or fail late: a tracker whose package is missing, fp16 on a CPU
    (accelerate would silently train in fp32); warn that bf16 on a CPU is slow."""
    packages = TRACKER_PACKAGES.get(args.report_to, ())
    if packages and not any(importlib.util.find_spec(name) for name in packages):
        raise ValueError(
            f"report_to={args.report_to!r} needs the {' or '.join(packages)} package, which is not installed: "
            f"pip install {packages[0]}, or pass report_to='none'"
        )
    if args.mixed_precision == "no":
        return
    device = PartialState().device
    if device.type != "cpu":
        return
    if args.fp16:
        raise ValueError(
            "fp16=True needs a GPU (fp16 autocast with a gradient scaler), but this run is on the CPU, "
            "where it would silently train in fp32; drop fp16 (or use bf16=True)"
        )
    if PartialState().is_main_process:
        warnings.warn(
            "bf16=True on a CPU: bf16 autocast is usually much slower than fp32 there; "
            "drop bf16 unless you mean to test it",
            stacklevel=3,
        )


def build_task(args: ICLTrainingArguments) -> TaskFamily:
    return args.task_family()


def build_icl_model(args: ICLTrainingArguments, task: TaskFamily) -> torch.nn.Module:
    return build_model(args.model_type, args.model_size, args.attn_implementation, **args.model_config_fields(task))


class ICLTrainer(ResumeRules):
    """Train ``args.model_type`` on ``args.task``; see :class:`ICLTrainingArguments` for every knob. One seed:
    ``seeds > 1`` is :class:`~hf_icl.training.seed_stack.SeedStackTrainer`'s (:func:`hf_icl.training.train` picks)."""

    def __init__(self, args: ICLTrainingArguments, model: torch.nn.Module | None = None):
        args.validate()
        if args.seeds != 1:
            raise ValueError(
                f"ICLTrainer trains one seed, got seeds={args.seeds}: train several with "
                "hf_icl.training.SeedStackTrainer (hf_icl.training.train picks the trainer)"
            )
        check_environment(args)
        if args.train_dataset is not None:  # a dataset of another task or too short: refused before any work
            check_saved_dataset_early(
                args.train_dataset, args.train_dataset_split, build_task(args).to_dict(), args.n_points
            )
        self.args = self.run_args = args  # run_args: whose command line restarts the run (the stack's, for a seed)
        self.output_dir = self.checkpoint_root = Path(args.output_dir)
        self.seed_note = ""  # " (seed S)" for one seed of a stack: errors name the seed
        self.run_name = args.run_name or self.output_dir.resolve().name
        self.hub_repo_id = self.hub_url = None
        if args.push_to_hub:  # offline, not logged in or a refused token: fail now, not after training
            self.hub_repo_id = args.hub_model_id or default_repo_name(self.output_dir)
            check_hub_access(self.hub_repo_id)
        self.accelerator = Accelerator(
            mixed_precision=args.mixed_precision,
            log_with=None if args.report_to == "none" else args.report_to,
            project_dir=str(self.output_dir),
        )
        if self.accelerator.distributed_type in UNSUPPORTED_DISTRIBUTED:
            raise ValueError(
                f"ICLTrainer runs on one device or data-parallel (DDP), not {self.accelerator.distributed_type.value}: "
                "its checkpoints hold full weights and optimizer state, which sharded setups split across "
                "processes; launch with configs/accelerate/multi_gpu.yaml"
            )
        set_seed(args.seed)  # the same initial weights on every rank
        self.task = build_task(args)
        self.curriculum = Curriculum.from_args(args)
        self.saved_prompts = None  # a finite pool of saved prompts (train_dataset), else prompts drawn afresh
        if args.train_dataset is not None:
            self.saved_prompts = SavedPrompts(args.train_dataset, args.train_dataset_split)
            self.saved_prompts.check_matches(self.task.to_dict(), args.n_points)
        model = model if model is not None else build_icl_model(args, self.task)
        # fused: one kernel for all parameters (CPU and CUDA); 5-7 % of a tiny model's CPU step otherwise
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay, fused=True
        )
        # stepped here once per optimizer step: accelerate's prepared scheduler would step once per process
        self.scheduler = get_scheduler(
            args.lr_scheduler_type, optimizer, num_warmup_steps=args.warmup_steps, num_training_steps=args.max_steps
        )
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.progress = TrainingProgress()
        self.history: list[dict] = []
        self._eval_set = None
        self._start_step = 0  # the step this run started (or resumed) at: no checkpoint is written there
        self._last_good: Path | None = None  # the newest checkpoint this run wrote or resumed from
        self._resumed_from: tuple[int, Path] | None = None  # (step, folder) of resume_from_checkpoint
        self._writing_final = False  # writing the final model folder (after the last checkpoint)
        self._window: list[float] = []  # the losses since the last log: the logged loss is their mean, not one step's
        self._show = self._interactive = False  # progress lines (set by start_tracking)

    # -- data ------------------------------------------------------------------------------------
    def draw_batch(self, step: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        dims, points = self.curriculum.at(step)
        if self.saved_prompts is not None:
            return self.saved_prompts.sample(
                self.args.per_device_train_batch_size, points, generator, device=self.accelerator.device
            )
        return self.task.sample(
            self.args.per_device_train_batch_size,
            points,
            generator=generator,
            n_dims_truncated=dims if dims < self.args.n_dims else None,
        )

    def eval_set(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed prompts at the full dimension and length, the same on every rank and every run."""
        if self._eval_set is None:
            eval_task = make_task({**self.task.to_dict(), "n_tasks": None})  # fresh tasks from the prior
            self._eval_set = eval_task.sample(
                self.args.eval_prompts, self.args.n_points, seed=self.args.seed + EVAL_SEED_OFFSET
            )
        return self._eval_set

    # -- loop ------------------------------------------------------------------------------------
    def train(self) -> TrainingResult:
        """Train to ``args.max_steps``, resuming first if asked. The main process holds
        ``OUTPUT_DIR/train.lock`` meanwhile, and refuses an output directory that holds another run
        (unless ``overwrite_output_dir`` or ``resume_from_checkpoint``)."""
        return self.run_locked(self._train, [self])

    def final_write_error(self, err: BaseException) -> CheckpointSaveError | None:
        """``err`` (an ``OSError``) as the error of writing the final model folder with its recovery command, if it
        happened there (the last checkpoint is complete); None if it happened elsewhere."""
        if not self._writing_final or isinstance(err, CheckpointSaveError):
            return None
        return self._final_write_failed(err)

    def _train(self) -> TrainingResult:
        args = self.args
        self._maybe_resume()
        self.start_tracking()
        # A bar redraws with carriage returns: right at a terminal, megabytes of noise in a log file, which gets a
        # plain line every logging_steps steps instead.
        bar = tqdm(
            total=args.max_steps,
            initial=self.progress.step,
            disable=not (self._show and self._interactive),
            desc="training",
            dynamic_ncols=True,
        )
        generator = torch.Generator(device=self.accelerator.device)
        while self.progress.step < args.max_steps:
            loss = self.train_step(generator)
            dims, points = self.curriculum.at(self.progress.step - 1)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", dims=dims, points=points, refresh=False)
        bar.close()
        return self.write_final_folder(self.final_evaluation())

    def start_tracking(self) -> None:
        """Start the tracker and the progress output, and put the model in training mode (after resuming)."""
        args, accelerator = self.args, self.accelerator
        if args.report_to != "none":
            # the tracker's project directory stays OUTPUT_DIR/hf_icl (a rerun's overwrite knows it); the run's
            # name goes where each tracker shows it
            accelerator.init_trackers("hf_icl", config=args.to_dict(), init_kwargs={"wandb": {"name": self.run_name}})
        self._show = not args.disable_tqdm and accelerator.is_local_main_process
        self._interactive = sys.stderr.isatty()
        if self._show:
            console.say(console.banner(self))
            if self._start_step:
                console.say(f"resumed from {self._last_good} at step {self._start_step}{self.seed_note}")
        self._clock = console.ProgressClock(self.progress.step, args.max_steps)
        self.model.train()

    def train_step(self, generator: torch.Generator) -> float:
        """One optimizer step (:meth:`_optimizer_step`), then its logs and a due evaluation; returns its loss."""
        args, step = self.args, self.progress.step
        loss = self._optimizer_step(step, generator)
        self._window.append(loss)
        self.progress.step = step + 1
        if self.progress.step % args.logging_steps == 0:
            dims, points = self.curriculum.at(step)
            mean_loss, self._window = sum(self._window) / len(self._window), []
            if self._show and not self._interactive:
                print(
                    f"training step {self.progress.step}/{args.max_steps}{self.seed_note}: loss {mean_loss:.4f} "
                    f"(mean of the last {args.logging_steps} steps), dims {dims}, points {points}",
                    file=sys.stderr,
                    flush=True,
                )
            self._log(
                {
                    "train/loss": mean_loss,
                    "train/lr": self.scheduler.get_last_lr()[0],
                    "curriculum/dims": dims,
                    "curriculum/points": points,
                }
            )
        estimate = self._clock.estimate(self.progress.step) if self._show else None
        if estimate:
            console.say(estimate)
        if args.eval_steps and self.progress.step % args.eval_steps == 0:
            metrics = self.evaluate()
            self._log(metrics)
            if self._show:
                console.say(console.evaluation_line(self.progress.step, args.max_steps, metrics, self.seed_note))
        return loss

    def final_evaluation(self) -> dict[str, float]:
        """Evaluate the final weights (refused if their loss is not finite) and write the last checkpoint."""
        final_rng = capture_rng_state(self.accelerator.device)  # the state the next step (of an extended run) starts in
        final_metrics = self.evaluate()
        self._log(final_metrics)
        final_loss = final_metrics.get("eval/loss")
        if final_loss is not None and not math.isfinite(final_loss):
            raise self._diverged(
                self.progress.step, f"the evaluation loss of the final weights is {final_loss} (they were not saved)"
            )
        if self.progress.step != self._start_step:
            self._save_checkpoint(self.progress.step, final_rng)
        return final_metrics

    def write_final_folder(self, final_metrics: dict[str, float]) -> TrainingResult:
        """The final model folder (weights, training arguments, manifest, results, model card), the Hub push."""
        args, accelerator = self.args, self.accelerator
        interactive = self._interactive
        self._writing_final = True  # an OSError from here to the Hub push: the final folder could not be written
        model = accelerator.unwrap_model(self.model)
        scaling = None
        if accelerator.is_main_process:
            with nullcontext() if interactive else quiet_progress():  # no one-tick bar in a log file
                model.save_pretrained(self.output_dir)
            apply_umask(self.output_dir)  # transformers writes the weights through a private (0600) temporary file
            (self.output_dir / TRAINING_ARGS_FILE).write_text(json.dumps(args.to_dict(), indent=2))
            write_model_manifest(self.output_dir)  # the sha256 of the model files (not of card or plots)
            scaling = self.context_scaling()
            self._write_results(scaling, final_metrics)
            self._writing_final = False
            if args.push_to_hub:
                self.hub_url = push_model_folder(self.output_dir, self.hub_repo_id, private=args.hub_private_repo)
        accelerator.wait_for_everyone()
        accelerator.end_training()
        return TrainingResult(
            model, self.output_dir, self.progress.step, self.history, final_metrics, scaling, self.hub_url
        )

    def _write_results(self, scaling: ContextScalingResult, final_metrics: dict[str, float]) -> None:
        """The plot, ``metrics.json``, the per-position CSV, the tracker's curves and the model card."""
        args, name = self.args, self.args.model_type
        scaling.plot(self.output_dir / PLOT_FILE)
        scalars = {"steps": self.progress.step, **{k: v for k, v in final_metrics.items() if k != "step"}}
        write_metrics(
            self.output_dir / METRICS_FILE,
            {"standard": evaluation_entry(scaling, seed=args.seed + EVAL_SEED_OFFSET)},
            model=name,
            task=self.task.name,
            scalars=scalars,
            run_name=self.run_name,
        )
        write_curve_csv(self.output_dir / CURVE_FILE, scaling)
        self._log_curves(scaling)
        table = f"## {scaling.metric.axis_label} by number of in-context examples\n\n{scaling.to_markdown()}"
        write_model_card(
            self.output_dir,
            args.to_dict(),
            final_metrics,
            plot_file=PLOT_FILE,
            results_table=table,
            eval_results=eval_results_from_context_scaling(scaling, name),
            model_id=self.hub_repo_id,
        )

    def _log_curves(self, scaling: ContextScalingResult) -> None:
        """TensorBoard gets each predictor's per-position curve: tag ``context_scaling/NAME``, step = examples."""
        if self.args.report_to != "tensorboard":
            return
        writer = self.accelerator.get_tracker("tensorboard", unwrap=True)
        for name in scaling.predictors:
            for examples, value in enumerate(scaling.values[name].tolist()):
                writer.add_scalar(f"context_scaling/{name}", value, global_step=examples)
        writer.flush()

    def _optimizer_step(self, step: int, generator: torch.Generator) -> float:
        """One optimizer step. A checkpoint due at ``step`` is written inside it, after this step's
        loss and gradient norm (computed with the weights it saves) are checked finite and before the
        update: a checkpoint's weights are ones that gave a finite loss and finite gradients."""
        args, accelerator = self.args, self.accelerator
        save = self._save_due(step)
        rng = capture_rng_state(accelerator.device) if save else None  # as the step starts
        generator.manual_seed(step_seed(args.seed, accelerator.process_index, step))
        total = torch.zeros((), device=accelerator.device)
        for micro in range(args.gradient_accumulation_steps):
            xs, ys = self.draw_batch(step, generator)
            last = micro == args.gradient_accumulation_steps - 1
            sync = accelerator.no_sync(self.model) if not last else nullcontext()
            with sync, accelerator.autocast():
                loss = self.model(xs, ys, check_inputs=False).loss / args.gradient_accumulation_steps
            accelerator.backward(loss)
            total += loss.detach()
        # one device sync for both numbers the step must check
        mean_loss, grad_norm = torch.stack(
            (accelerator.reduce(total, reduction="mean"), self._gradient_norm())
        ).tolist()
        if not math.isfinite(mean_loss):
            raise self._diverged(step, f"the loss is {mean_loss} (no update was applied)")
        # under fp16 an overflowing gradient is routine: the gradient scaler skips the update, lowers its scale
        if not math.isfinite(grad_norm) and accelerator.scaler is None:
            raise self._diverged(step, f"the gradient norm is {grad_norm} (the update was not applied)")
        if save:
            self._save_checkpoint(step, rng)
        self.optimizer.step()
        if not self.optimizer.step_was_skipped:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        # non-finite parameters show in the next step's loss; _save_checkpoint checks them before any save
        return mean_loss

    def _gradient_norm(self) -> torch.Tensor:
        """The global gradient norm as a 0-d float32 tensor on the device (no sync; after clipping to
        ``max_grad_norm``, its value before clipping)."""
        parameters = [p for p in self.model.parameters() if p.grad is not None]
        if not parameters:
            return torch.zeros((), device=self.accelerator.device)
        if self.args.max_grad_norm > 0:
            norm = self.accelerator.clip_grad_norm_(parameters, self.args.max_grad_norm)
        else:
            self.accelerator.unscale_gradients()  # fp16: the true gradients, as clip_grad_norm_ would see
            norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
        return norm.float()

    def evaluate(self) -> dict[str, float]:
        """Loss and the per-position metric on the fixed evaluation set, scored in full precision
        by the same :func:`~hf_icl.evaluation.metric_for_task` as ``evaluate_context_scaling``
        and the model card, so the three report the same numbers."""
        xs, ys = (t.to(self.accelerator.device) for t in self.eval_set())
        metric = metric_for_task(self.task)
        with evaluation_mode(self.accelerator.unwrap_model(self.model)) as model:
            out = model(xs, ys)
        curve = metric.per_prompt(output_tensor(out, metric.target_kind, self.args.model_type), ys).mean(dim=0)
        return {
            "eval/loss": out.loss.item(),
            f"eval/{metric.summary_name('last')}": curve[-1].item(),
            f"eval/{metric.summary_name('mean')}": curve.mean().item(),
            "step": self.progress.step,
        }

    def context_scaling(self) -> ContextScalingResult:
        """The model against the task's default baselines at every context length, on the
        evaluation prompts (one forward pass, bootstrap bands)."""
        eval_task = make_task({**self.task.to_dict(), "n_tasks": None})
        predictors = {self.args.model_type: self.accelerator.unwrap_model(self.model), **default_baselines(eval_task)}
        return evaluate_context_scaling(
            predictors,
            eval_task,
            n_prompts=self.args.eval_prompts,
            n_points=self.args.n_points,
            seed=self.args.seed + EVAL_SEED_OFFSET,
        )

    def _log(self, values: dict) -> None:
        record = {"step": self.progress.step, **values}
        self.history.append(record)
        if self.args.report_to != "none":
            self.accelerator.log({k: v for k, v in values.items() if k != "step"}, step=self.progress.step)

    # -- checkpoints (resume and recovery: .resume.ResumeRules) ------------------------------------
    def _save_due(self, step: int) -> bool:
        every = self.args.save_steps
        return bool(every) and step % every == 0 and step != self._start_step

    def _save_checkpoint(self, step: int, rng_state: dict) -> Path:
        if not all_finite(self.model.parameters()):
            raise self._diverged(step, "the parameters are non-finite (they were not saved)")
        dims, points = self.curriculum.at(step)
        trainer_state = {
            "step": step,
            "curriculum": {"dims": dims, "points": points},
            "seed": self.args.seed,
            "num_processes": self.accelerator.num_processes,
            "history": self.history,
        }
        try:
            self._last_good = self.write_checkpoint(step, rng_state, trainer_state)
        except CheckpointSaveError as err:
            raise self._save_failed(err) from None
        return self._last_good

    def write_checkpoint(self, step: int, rng_state: dict, trainer_state: dict) -> Path:
        """Write the checkpoint of ``step`` (weights checked finite by the caller); returns its folder."""
        return save_checkpoint(
            self.accelerator,
            self.output_dir,
            step,
            **self.checkpoint_state(trainer_state, rng_state),
            training_args=self.args.to_dict(),
            save_total_limit=self.args.save_total_limit,
        )

    def checkpoint_state(self, trainer_state: dict, rng_state: dict) -> dict:
        """What a checkpoint holds of this run: model, optimizer, scheduler, trainer state and random state."""
        return {
            "model": self.model,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "trainer_state": trainer_state,
            "rng_state": rng_state,
        }


def all_finite(tensors) -> bool:
    """Whether every tensor of ``tensors`` is finite (one device sync for all of them)."""
    flags = [torch.isfinite(t.detach()).all() for t in tensors]
    return bool(torch.stack(flags).all()) if flags else True


def train(args: ICLTrainingArguments) -> TrainingResult:
    """Build everything from ``args`` and train; returns the trained (unwrapped) model and metrics."""
    return ICLTrainer(args).train()
