"""Train several seeds of one model in one process: ``hf-icl train --seeds N`` (:class:`SeedStackTrainer`).

Seed copy ``i`` (``0 <= i < seeds``) is seed ``S = args.seed + i``, trained exactly as a separate run with
``--seed S --output_dir OUTPUT_DIR/seed-S`` would train it: its own initial weights (``set_seed(S)``, then the model
is built), its own prompts (the step generator seeded by ``(S, rank, step)``), its own AdamW state, scheduler,
gradient clipping and finiteness checks. Its final model folder ``OUTPUT_DIR/seed-S`` holds the files that separate
run writes (``config.json``, ``model.safetensors``, ``manifest.json``, ``training_args.json`` with ``seed: S``,
``metrics.json``, the curves, plot and model card), bit for bit the same weights and metrics
(``tests/training/test_seed_stack.py``).

How the seeds are stacked: each seed is an :class:`~hf_icl.training.ICLTrainer` of its own, and every optimizer step
runs the seeds' steps one after the other, each with its own global random state swapped in (so a model with dropout
sees the random numbers its separate run would). Batching the seeds into one model (``torch.func.stack_module_state``
+ ``functional_call`` + ``vmap``, what ``hf_icl.training.seed_ensemble`` does) is not bit-exact: a batched matrix
product sums in another order than the per-seed one (on a 1-thread CPU, tiny ``gpt2_icl`` and ``linear_gpt`` gave
gradients that differ in the last bits), and it was not faster there either (``docs/results/seeds.md``). What the
stack saves against N separate runs is the per-run start (interpreter, imports, building the task and evaluation set),
and it keeps the seeds in lockstep: one checkpoint per step for all of them.

Checkpoints: ``OUTPUT_DIR/checkpoints/step-N`` holds ``seed-S/`` for every seed (the files of a one-seed checkpoint:
weights, optimizer, scheduler, trainer state, random state) and one ``manifest.json`` over all of them, with the
stack's training arguments. The whole folder is written as ``step-N.tmp`` and renamed when every seed's part is
complete, so a checkpoint always holds every seed at the same step. ``resume_from_checkpoint`` resumes all seeds
from it, bit-identically. A seed whose loss, gradient norm or weights stop being finite stops the run with
:class:`~hf_icl.training.TrainingDivergedError` naming that seed.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .arguments import ICLTrainingArguments
from .checkpoints import (
    CheckpointSaveError,
    TrainingProgress,
    capture_rng_state,
    checkpoint_dir,
    complete_checkpoint,
    restore_rng_state,
    staging_dir,
    write_checkpoint_part,
)
from .resume import ResumeRules
from .run_files import seed_dir
from .trainer import ICLTrainer, TrainingResult, check_environment


def seed_arguments(args: ICLTrainingArguments, index: int) -> ICLTrainingArguments:
    """The arguments of seed copy ``index`` of a run of ``args.seeds`` seeds: the separate one-seed run it equals
    (``seed + index``, ``output_dir/seed-S``; a ``run_name`` gets ``-seed-S``)."""
    seed = args.seed + index
    return dataclasses.replace(
        args,
        seed=seed,
        seeds=1,
        output_dir=str(seed_dir(args.output_dir, seed)),
        run_name=None if args.run_name is None else f"{args.run_name}-seed-{seed}",
        resume_from_checkpoint=None,  # the stack resumes every seed from its own checkpoint
        overwrite_output_dir=False,  # the stack clears OUTPUT_DIR (its seed folders included)
    )


class SeedTrainer(ICLTrainer):
    """One seed of a :class:`SeedStackTrainer`: an :class:`ICLTrainer` that runs with its own global random state
    (:meth:`own_generators`), writes its checkpoints into the stack's, and names its seed in errors."""

    def __init__(self, stack_args: ICLTrainingArguments, index: int):
        super().__init__(seed_arguments(stack_args, index))
        self.index = index
        self.run_args = stack_args  # errors advise the command of the whole run
        self.checkpoint_root = Path(stack_args.output_dir)
        self.seed_note = f" (seed {self.args.seed})"
        self.generator = torch.Generator(device=self.accelerator.device)
        self.rng = capture_rng_state(self.accelerator.device)  # its generators as its separate run starts training
        self.part_written: int | None = None  # the step of the last checkpoint part this seed wrote

    @contextmanager
    def own_generators(self) -> Iterator[None]:
        """Run the block with this seed's Python, NumPy and torch generators (saved again afterwards)."""
        device = self.accelerator.device
        restore_rng_state(self.rng, device, f"the random state of seed {self.args.seed}")
        try:
            yield
        finally:
            self.rng = capture_rng_state(device)

    def write_checkpoint(self, step: int, rng_state: dict, trainer_state: dict) -> Path:
        """This seed's part of the stack's checkpoint of ``step`` (``step-N.tmp/seed-S``); the stack completes it."""
        root = self.checkpoint_root
        staging = staging_dir(root, step)
        if self.index == 0 and self.accelerator.is_main_process and staging.exists():
            shutil.rmtree(staging)  # left over from a run that died while saving
        write_checkpoint_part(
            self.accelerator,
            seed_dir(staging, self.args.seed),
            step,
            **self.checkpoint_state(trainer_state, rng_state),
            staging=staging,
        )
        self.part_written = step
        return checkpoint_dir(root, step)


@dataclass
class SeedStackResult:
    """What :meth:`SeedStackTrainer.train` returns: one :class:`TrainingResult` per seed, in seed order."""

    output_dir: Path
    step: int
    results: list[TrainingResult]

    @property
    def seeds(self) -> list[int]:
        return [int(result.output_dir.name.removeprefix("seed-")) for result in self.results]

    @property
    def final_metrics(self) -> dict[str, dict[str, float]]:
        """Every seed's final evaluation, keyed by its folder name (``seed-S``)."""
        return {result.output_dir.name: result.final_metrics for result in self.results}

    @property
    def hub_url(self) -> None:  # a run of several seeds is not pushed (see ICLTrainingArguments.seeds)
        return None


class SeedStackTrainer(ResumeRules):
    """Train ``args.seeds`` seeds of ``args.model_type`` in lockstep in one process (see the module docstring)."""

    def __init__(self, args: ICLTrainingArguments):
        args.validate()
        if args.seeds < 2:
            raise ValueError(f"SeedStackTrainer trains several seeds, got seeds={args.seeds}: use ICLTrainer")
        check_environment(args)
        self.args = self.run_args = args
        self.output_dir = self.checkpoint_root = Path(args.output_dir)
        self.seed_note = ""
        self.trainers = [SeedTrainer(args, index) for index in range(args.seeds)]
        self.accelerator = self.trainers[0].accelerator
        self.progress = TrainingProgress()
        self._start_step = 0
        self._last_good: Path | None = None
        self._resumed_from: tuple[int, Path] | None = None

    def train(self) -> SeedStackResult:
        """Train every seed to ``args.max_steps`` (resuming all of them first if asked), holding
        ``OUTPUT_DIR/train.lock``; the output directory rules are :meth:`ICLTrainer.train`'s."""
        return self.run_locked(self._train, self.trainers)

    def _train(self) -> SeedStackResult:
        args = self.args
        self._maybe_resume()
        for trainer in self.trainers:
            trainer.start_tracking()
        show = not args.disable_tqdm and self.accelerator.is_local_main_process and sys.stderr.isatty()
        bar = tqdm(
            total=args.max_steps,
            initial=self.progress.step,
            disable=not show,
            desc=f"training {args.seeds} seeds",
            dynamic_ncols=True,
        )
        while self.progress.step < args.max_steps:
            step = self.progress.step
            losses = self._each_seed(step, lambda trainer: trainer.train_step(trainer.generator))
            self.progress.step = step + 1
            bar.update(1)
            bar.set_postfix(loss=f"{sum(losses) / len(losses):.4f}", refresh=False)
        bar.close()
        final_metrics = self._each_seed(self.progress.step, lambda trainer: trainer.final_evaluation())
        results = self._each_seed(None, lambda trainer: trainer.write_final_folder(final_metrics[trainer.index]))
        return SeedStackResult(self.output_dir, self.progress.step, results)

    def _each_seed(self, step: int | None, action) -> list:
        """``action(trainer)`` for every seed with its own generators; then, if the seeds wrote their parts of the
        checkpoint of ``step``, complete it. A failure removes the incomplete checkpoint."""
        try:
            out = []
            for trainer in self.trainers:
                with trainer.own_generators():
                    out.append(action(trainer))
        except BaseException:
            if step is not None and self.accelerator.is_main_process:
                shutil.rmtree(staging_dir(self.output_dir, step), ignore_errors=True)
            raise
        if step is not None and all(trainer.part_written == step for trainer in self.trainers):
            self._complete_checkpoint(step)
        return out

    def _complete_checkpoint(self, step: int) -> None:
        try:
            path = complete_checkpoint(
                self.accelerator, self.output_dir, step, self.args.to_dict(), self.args.save_total_limit
            )
        except CheckpointSaveError as err:
            raise self._save_failed(err) from None
        self._last_good = path
        for trainer in self.trainers:
            trainer.part_written = None

    # -- resume (ResumeRules' hooks) ------------------------------------------------------------------
    def required_files(self) -> tuple[str, ...]:
        return tuple(
            f"{seed_dir('', trainer.args.seed).name}/{name}"
            for trainer in self.trainers
            for name in trainer.required_files()
        )

    def restore_checkpoint(self, path: Path, files: dict, step: int, changes: dict[str, tuple]) -> None:
        """Every seed from its ``seed-S`` folder of the stack's checkpoint ``path``."""
        for trainer in self.trainers:
            prefix = f"{seed_dir('', trainer.args.seed).name}/"
            own = {name.removeprefix(prefix): entry for name, entry in files.items() if name.startswith(prefix)}
            with trainer.own_generators():  # the checkpoint's random state becomes this seed's
                trainer.restore_checkpoint(seed_dir(path, trainer.args.seed), own, step, changes)
            trainer.resumed_at(step, path)  # the stack's checkpoint is each seed's recovery point
        self.resumed_at(step, path)


def train(args: ICLTrainingArguments) -> TrainingResult | SeedStackResult:
    """Build everything from ``args`` and train: one seed with :class:`ICLTrainer` (a :class:`TrainingResult`),
    ``seeds > 1`` with :class:`SeedStackTrainer` (a :class:`SeedStackResult`)."""
    if args.seeds == 1:
        return ICLTrainer(args).train()
    return SeedStackTrainer(args).train()
