"""The Accelerate training loop for ICL models.

Every step draws fresh prompts on the training device (or picks tasks from a finite pool)
from a generator seeded by ``(seed, rank, step)``: ranks see different prompts, and a resumed
run sees exactly the prompts the uninterrupted run would have seen, with no sampler state to
save. Launch on one device with ``python`` / ``hf-icl train``, on many with ``accelerate launch``.
"""

from __future__ import annotations

import json
import math
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from tqdm.auto import tqdm
from transformers import get_scheduler

from ..data.tasks import TaskFamily, make_task
from ..evaluation import ContextScalingResult, evaluate_context_scaling
from ..evaluation.baselines import default_baselines
from ..evaluation.metrics import metric_for_task
from ..evaluation.predictors import evaluation_mode, output_tensor
from ..modeling import build_model
from .arguments import ICLTrainingArguments
from .checkpoints import TrainingProgress, latest_checkpoint, save_checkpoint
from .curriculum import Curriculum
from .model_card import write_model_card

TRAINING_ARGS_FILE = "training_args.json"  # lets `hf-icl evaluate` rebuild the training task
PLOT_FILE = "context_scaling.png"
EVAL_SEED_OFFSET = 7_919  # keeps the evaluation prompts apart from every training step's prompts


class TrainingDivergedError(RuntimeError):
    """The loss became NaN or infinite; checkpoints written before stay intact."""


@dataclass
class TrainingResult:
    model: torch.nn.Module
    output_dir: Path
    step: int
    history: list[dict] = field(default_factory=list)
    final_metrics: dict[str, float] = field(default_factory=dict)
    #: the final model against the default baselines (main process only; None on other ranks)
    context_scaling: ContextScalingResult | None = None


def step_seed(seed: int, rank: int, step: int) -> int:
    """Seed of the prompts one rank draws at one step (distinct for every triple)."""
    return ((seed * 1_000_003 + rank) * 1_000_000_007 + step) % (2**63 - 1)


def build_task(args: ICLTrainingArguments) -> TaskFamily:
    return make_task(
        {
            "name": args.task,
            **args.task_kwargs(),
            "n_dims": args.n_dims,
            "n_tasks": args.n_tasks,
            "pool_seed": args.pool_seed,
        }
    )


def build_icl_model(args: ICLTrainingArguments, task: TaskFamily) -> torch.nn.Module:
    fields = {
        "n_dims": args.n_dims,
        "n_points": args.n_points,
        "target_kind": task.target_kind,
        **args.model_kwargs(),
    }
    if task.target_kind == "categorical":
        fields.setdefault("n_classes", task.n_classes)
    return build_model(args.model_type, args.model_size, args.attn_implementation, **fields)


class ICLTrainer:
    """Train ``args.model_type`` on ``args.task``; see :class:`ICLTrainingArguments` for every knob."""

    def __init__(self, args: ICLTrainingArguments, model: torch.nn.Module | None = None):
        args.validate()
        self.args = args
        self.output_dir = Path(args.output_dir)
        self.accelerator = Accelerator(
            mixed_precision=args.mixed_precision,
            log_with=None if args.report_to == "none" else args.report_to,
            project_dir=str(self.output_dir),
        )
        set_seed(args.seed)  # the same initial weights on every rank
        self.task = build_task(args)
        self.curriculum = Curriculum.from_args(args)
        model = model if model is not None else build_icl_model(args, self.task)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
        scheduler = get_scheduler(
            args.lr_scheduler, optimizer, num_warmup_steps=args.warmup_steps, num_training_steps=args.train_steps
        )
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(model, optimizer, scheduler)
        self.progress = TrainingProgress()
        self.accelerator.register_for_checkpointing(self.progress)
        self.history: list[dict] = []
        self._eval_set = None

    # -- data ------------------------------------------------------------------------------------
    def draw_batch(self, step: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        dims, points = self.curriculum.at(step)
        return self.task.sample(
            self.args.batch_size,
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
        args, accelerator = self.args, self.accelerator
        self._maybe_resume()
        if args.report_to != "none":
            accelerator.init_trackers("hf_icl", config=args.to_dict())
        bar = tqdm(
            total=args.train_steps,
            initial=self.progress.step,
            disable=not (args.progress_bar and accelerator.is_local_main_process),
            desc="training",
            dynamic_ncols=True,
        )
        generator = torch.Generator(device=accelerator.device)
        self.model.train()
        while self.progress.step < args.train_steps:
            step = self.progress.step
            loss = self._optimizer_step(step, generator)
            self.progress.step = step + 1
            dims, points = self.curriculum.at(step)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", dims=dims, points=points, refresh=False)
            if self.progress.step % args.logging_every == 0:
                self._log(
                    {
                        "train/loss": loss,
                        "train/lr": self.scheduler.get_last_lr()[0],
                        "curriculum/dims": dims,
                        "curriculum/points": points,
                    }
                )
            if args.eval_every and self.progress.step % args.eval_every == 0:
                self._log(self.evaluate())
            if args.save_every and self.progress.step % args.save_every == 0:
                save_checkpoint(accelerator, self.output_dir, self.progress.step)
        bar.close()
        final_metrics = self.evaluate()
        self._log(final_metrics)
        if not args.save_every or self.progress.step % args.save_every:
            save_checkpoint(accelerator, self.output_dir, self.progress.step)
        model = accelerator.unwrap_model(self.model)
        scaling = None
        if accelerator.is_main_process:
            model.save_pretrained(self.output_dir)
            (self.output_dir / TRAINING_ARGS_FILE).write_text(json.dumps(args.to_dict(), indent=2))
            scaling = self.context_scaling()
            scaling.plot(self.output_dir / PLOT_FILE)
            table = f"## {scaling.metric.axis_label} by number of in-context examples\n\n{scaling.to_markdown()}"
            write_model_card(self.output_dir, args.to_dict(), final_metrics, plot_file=PLOT_FILE, results_table=table)
        accelerator.wait_for_everyone()
        accelerator.end_training()
        return TrainingResult(model, self.output_dir, self.progress.step, self.history, final_metrics, scaling)

    def _optimizer_step(self, step: int, generator: torch.Generator) -> float:
        args, accelerator = self.args, self.accelerator
        generator.manual_seed(step_seed(args.seed, accelerator.process_index, step))
        total = torch.zeros((), device=accelerator.device)
        for micro in range(args.gradient_accumulation_steps):
            xs, ys = self.draw_batch(step, generator)
            last = micro == args.gradient_accumulation_steps - 1
            sync = accelerator.no_sync(self.model) if not last else nullcontext()
            with sync, accelerator.autocast():
                loss = self.model(xs, ys).loss / args.gradient_accumulation_steps
            accelerator.backward(loss)
            total += loss.detach()
        mean_loss = accelerator.reduce(total, reduction="mean").item()
        if not math.isfinite(mean_loss):
            last_good = latest_checkpoint(self.output_dir)
            raise TrainingDivergedError(
                f"loss became {mean_loss} at step {step}; stopping. The last good checkpoint "
                f"({last_good or 'none written yet'}) is untouched: resume from it with a lower learning_rate "
                f"or max_grad_norm, or mixed_precision='no'."
            )
        if args.max_grad_norm > 0:
            accelerator.clip_grad_norm_(self.model.parameters(), args.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return mean_loss

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

    def _maybe_resume(self) -> None:
        target = self.args.resume_from_checkpoint
        if target is None:
            return
        path = latest_checkpoint(self.output_dir) if target == "latest" else Path(target)
        if path is None or not path.is_dir():
            raise ValueError(f"resume_from_checkpoint={target!r}: no checkpoint found (looked for {path})")
        self.accelerator.load_state(str(path))


def train(args: ICLTrainingArguments) -> TrainingResult:
    """Build everything from ``args`` and train; returns the trained (unwrapped) model and metrics."""
    return ICLTrainer(args).train()
