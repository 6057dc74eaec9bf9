"""Resuming a run from a checkpoint, and the one recovery command of every failure (a diverged step, a checkpoint
or final folder that could not be written): the resume rules of :class:`~hf_icl.training.ICLTrainer` and of the
seed stack (:mod:`.seed_stack`), which both mix in :class:`ResumeRules`.

A resumed run verifies the checkpoint's manifest before reading anything, refuses a checkpoint whose saved weights
are not finite (naming the newest one that is), refuses changed training arguments unless every change is one of
:data:`~hf_icl.training.arguments.RESUMABLE_CHANGES`, and applies a new ``learning_rate`` or ``max_steps`` to the
schedule from the resumed step on.
"""

from __future__ import annotations

import errno
import warnings
from pathlib import Path
from typing import Any

from accelerate.utils import broadcast_object_list
from safetensors import SafetensorError

from .arguments import RESUMABLE_CHANGES, upgrade_names
from .checkpoints import (
    REQUIRED_FILES,
    SCALER,
    CheckpointSaveError,
    as_os_error,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    newest_finite_checkpoint,
    non_finite_weight,
    restore_rng_state,
    rng_state_name,
)
from .manifest import CheckpointError, verify_checkpoint
from .run_lock import OutputDirError, RunLock, existing_run, remove_run


class TrainingDivergedError(RuntimeError):
    """The loss, the gradient norm or the parameters became NaN or infinite. The non-finite update
    is not applied to any checkpoint, and the error names the newest checkpoint whose saved weights are
    finite (read back from disk), or says to start again if there is none. In a run of several seeds it
    names the seed that diverged."""


class ResumeRules:
    """Resume and recovery for a trainer. The host class provides ``args`` (its training arguments), ``run_args``
    (the arguments whose command line restarts the whole run: ``args``, or the seed stack's), ``output_dir``,
    ``checkpoint_root`` (the output directory whose ``checkpoints/`` the run writes), ``seed_note`` (``""``, or
    `` (seed S)`` for one seed of a stack), ``accelerator``, ``progress``, ``history`` and
    :meth:`required_files` / :meth:`restore_checkpoint`."""

    # -- recovery advice ---------------------------------------------------------------------------
    def _recovery_checkpoint(self, before: int) -> Path | None:
        """The newest checkpoint (under output_dir, or the one this run resumed from) of a step ``<= before``
        whose weights on disk are all finite; None if there is none."""
        extra = (self._resumed_from,) if self._resumed_from is not None else ()
        return newest_finite_checkpoint(self.checkpoint_root, before=before, extra=extra)

    def _save_failed(self, err: CheckpointSaveError) -> CheckpointSaveError:
        """One error, one recovery command: the newest good checkpoint to resume from, or start again."""
        advice = self._recovery_advice(
            err.step - 1,
            err.errno,
            "No earlier checkpoint exists",
            "Earlier checkpoints are intact",
            "resume from the newest one",
        )
        return CheckpointSaveError(f"{err} (the partial checkpoint was removed). {advice}", step=err.step, cause=err)

    def _recovery_advice(self, before: int, error_number: int | None, none: str, intact: str, action: str) -> str:
        """The one recovery command after a failed write: resume from the newest finite checkpoint at or before
        ``before``, or start again."""
        good = self._recovery_checkpoint(before=before)
        fix = self._write_fix(error_number)
        if good is None:
            return f"{none}; {fix}, start again: {self.run_args.command_line()}"
        return f"{intact}; {fix}, {action}: {self.run_args.command_line(resume_from_checkpoint=str(good))}"

    def _final_write_failed(self, err: BaseException) -> CheckpointSaveError:
        """Writing the final model folder failed after the last checkpoint was saved: resume from that checkpoint
        (the run is finished there; resuming only writes the final model and results)."""
        cause, step = as_os_error(err), self.progress.step
        what = f"could not write the final model of step {step} to {self.output_dir}: {cause.strerror or cause}"
        what += f" [errno {cause.errno}: {errno.errorcode.get(cause.errno, '?')}]" if cause.errno else ""
        advice = self._recovery_advice(
            step,
            cause.errno,
            "No checkpoint of this run exists",
            "Its last checkpoint is complete",
            "finish the run from it",
        )
        return CheckpointSaveError(f"{what}. {advice}", step=step, cause=cause)

    def _start_again(self, how: str = "start again") -> str:
        """How to start again: in an output_dir that holds (unusable) checkpoints, only with overwrite_output_dir."""
        if list_checkpoints(self.checkpoint_root):
            return f"{how} (overwrite_output_dir=True: it removes the unusable checkpoints in output_dir)"
        return how

    def _write_fix(self, code: int | None) -> str:
        if code in (errno.ENOSPC, errno.EDQUOT):
            return "after freeing space"
        if code in (errno.EACCES, errno.EPERM, errno.EROFS):
            return f"after making {self.output_dir} writable"
        return "after fixing the cause"

    def _diverged(self, step: int, problem: str) -> TrainingDivergedError:
        args = self.args
        good = self._recovery_checkpoint(before=step)
        if good is None:
            advice = f"No checkpoint of this run has finite weights: {self._start_again()}"
        else:
            advice = (
                f"The newest checkpoint whose saved weights are finite (read back from disk) is {good}: "
                f"resume from it (resume_from_checkpoint={str(good)!r})"
            )
        remedies = f"a lower learning_rate (now {args.learning_rate:g}) or max_grad_norm (now {args.max_grad_norm:g}"
        remedies += "; 0 is off)" if args.max_grad_norm else ", off)"
        if args.mixed_precision != "no":
            remedies += f", or {args.mixed_precision}=False"
        return TrainingDivergedError(
            f"training diverged at step {step}{self.seed_note}: {problem}. {advice} with {remedies}."
        )

    # -- output directory --------------------------------------------------------------------------
    def run_locked(self, body, trainers: list) -> Any:
        """``body()`` while the main process holds ``OUTPUT_DIR/train.lock``, after refusing an output directory
        that holds another run (unless ``overwrite_output_dir`` or ``resume_from_checkpoint``). An ``OSError`` while
        one of ``trainers`` writes its final model folder becomes that trainer's error with its recovery command."""
        lock = RunLock(self.output_dir)
        try:
            self._on_main(lock.acquire)
            self._on_main(self._prepare_output_dir)
            return body()
        except (OSError, SafetensorError) as err:
            failed = next((f for f in (t.final_write_error(err) for t in trainers) if f is not None), None)
            if failed is None:
                raise
            raise failed from None
        finally:
            lock.release()

    def _on_main(self, action) -> None:
        """Run ``action`` on the main process only; an error there stops every process."""
        accelerator, error = self.accelerator, None
        if accelerator.is_main_process:
            try:
                action()
            except Exception as err:  # re-raised below, after the other processes have heard of it
                error = err
        if accelerator.num_processes > 1:
            message = [None if error is None else f"{error}"]
            broadcast_object_list(message, from_process=0)
            if error is None and message[0] is not None:
                raise OutputDirError(f"stopped by the main process: {message[0]}")
        if error is not None:
            raise error

    def _prepare_output_dir(self) -> None:
        """Refuse an output directory that holds another run, unless overwriting (remove it) or resuming."""
        args = self.args
        if args.overwrite_output_dir:
            if args.resume_from_checkpoint is not None:
                target, root = Path(args.resume_from_checkpoint).resolve(), self.output_dir.resolve()
                if target == root or root in target.parents:
                    raise OutputDirError(
                        f"overwrite_output_dir=True would delete resume_from_checkpoint={args.resume_from_checkpoint!r}"
                        f", which lies inside output_dir {str(self.output_dir)!r}; pass one of the two"
                    )
            removed = remove_run(self.output_dir)
            if removed:
                warnings.warn(
                    f"overwrite_output_dir: removed the previous run's {removed} from {self.output_dir}", stacklevel=2
                )
            return
        found = existing_run(self.output_dir)
        if found and args.resume_from_checkpoint is None:
            raise OutputDirError(
                f"output_dir {str(self.output_dir)!r} holds another run ({', '.join(found)}); pass "
                "overwrite_output_dir=True to replace it, resume_from_checkpoint='latest' to continue it, "
                "or choose another output_dir"
            )

    # -- resume ------------------------------------------------------------------------------------
    def required_files(self) -> tuple[str, ...]:
        """The files a checkpoint of this run must list in its manifest."""
        return (*REQUIRED_FILES, f"{SCALER}.json") if self.accelerator.scaler is not None else REQUIRED_FILES

    def _maybe_resume(self) -> None:
        target = self.args.resume_from_checkpoint
        if target is None:
            return
        path = latest_checkpoint(self.checkpoint_root) if target == "latest" else Path(target)
        if path is None or not path.is_dir():
            looked = path if path is not None else self.checkpoint_root / "checkpoints" / "step-*"
            raise ValueError(f"resume_from_checkpoint={target!r}: no checkpoint found (looked for {looked})")
        self._refuse_non_finite(path, target)
        manifest, unlisted = verify_checkpoint(path, self.required_files())
        if unlisted and self.accelerator.is_main_process:
            warnings.warn(
                f"checkpoint {path}: ignoring files that manifest.json does not list: {unlisted}", stacklevel=2
            )
        changes = self._resume_changes(path, manifest["training_args"])
        step = manifest["step"]
        if step > self.args.max_steps:
            raise ValueError(
                f"max_steps must be at least the step of resume_from_checkpoint={str(path)!r} ({step}), "
                f"got {self.args.max_steps}"
            )
        self.restore_checkpoint(path, manifest["files"], step, changes)
        if changes and self.accelerator.is_main_process:
            listed = ", ".join(f"{name} {old!r} → {new!r}" for name, (old, new) in changes.items())
            warnings.warn(f"resuming {path} at step {step} with changed arguments (applied): {listed}", stacklevel=2)

    def restore_checkpoint(self, path: Path, files: dict, step: int, changes: dict[str, tuple]) -> None:
        """Load the verified checkpoint ``path`` (``files``: its manifest's entries) of ``step`` into the model,
        optimizer, scheduler, random generators and history, and apply the resumable ``changes``."""
        accelerator, main = self.accelerator, self.accelerator.is_main_process
        trainer_state, rng_state = load_checkpoint(
            path, {"files": files}, accelerator, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler
        )
        if trainer_state.get("step") != step:
            raise CheckpointError(
                f"checkpoint {path}: trainer_state.json has step {trainer_state.get('step')!r}, manifest.json {step}"
            )
        if rng_state is not None:
            restore_rng_state(
                rng_state, accelerator.device, f"checkpoint {path}: {rng_state_name(accelerator.process_index)}"
            )
        elif main:
            warnings.warn(
                f"checkpoint {path} has no random state for process {accelerator.process_index} (it was written by "
                f"{trainer_state.get('num_processes')} processes): this process keeps its freshly seeded generators",
                stacklevel=3,
            )
        history = trainer_state.get("history", [])
        self.history = [dict(record) for record in history if isinstance(record, dict)]
        self.resumed_at(step, path)
        self._apply_resume_changes(changes)

    def resumed_at(self, step: int, path: Path) -> None:
        """Continue from the checkpoint ``path`` of ``step``: no checkpoint is written there again, and it is a
        recovery point of this run."""
        self.progress.step = self._start_step = step
        self._last_good = path
        self._resumed_from = (step, path)

    def _refuse_non_finite(self, path: Path, target: str) -> None:
        """Refuse a checkpoint whose weights hold NaN or infinity (read from disk), naming the newest one that
        does not (or saying to start again). Weights that cannot be read are left to the manifest check."""
        try:
            bad = non_finite_weight(path)
        except CheckpointError:
            return
        if bad is None:
            return
        good = newest_finite_checkpoint(self.checkpoint_root)
        if good is None:
            again = self._start_again("start again without resume_from_checkpoint")
            advice = f"no checkpoint under output_dir has finite weights: {again}"
        else:
            advice = (
                f"the newest checkpoint with finite weights is {good}: resume from it "
                f"(resume_from_checkpoint={str(good)!r})"
            )
        raise CheckpointError(
            f"resume_from_checkpoint={target!r}: checkpoint {path} holds non-finite weights (NaN or infinity in "
            f"{bad}), training from it would diverge at once; {advice}"
        )

    def _resume_changes(self, path: Path, saved: dict) -> dict[str, tuple]:
        """The arguments that differ from the checkpoint's: refuse (one ValueError listing them all) unless
        every one may change on resume; return the changes (``name: (old, new)``) otherwise."""
        saved = upgrade_names(saved, f"checkpoint {path}")  # a checkpoint of an earlier version
        current, absent = self.args.to_dict(), "<absent>"
        differing = {
            name: (saved.get(name, absent), current.get(name, absent))
            for name in sorted(set(saved) | set(current))
            if saved.get(name, absent) != current.get(name, absent)
        }
        refused = {name: change for name, change in differing.items() if name not in RESUMABLE_CHANGES}
        if refused:
            listed = ", ".join(f"{name} {old!r} → {new!r}" for name, (old, new) in refused.items())
            raise ValueError(
                f"cannot resume from {path}: these training arguments differ from the checkpoint's: {listed}. "
                f"Only {', '.join(RESUMABLE_CHANGES)} may change on resume; set the others back, or start a new run "
                "in another output_dir"
            )
        return {name: change for name, change in differing.items() if name != "resume_from_checkpoint"}

    def _apply_resume_changes(self, changes: dict[str, tuple]) -> None:
        """A new learning_rate becomes the schedule's base; a new max_steps reshapes the schedule
        (built for it in __init__) from the resumed step on; max_grad_norm and cadences are read live."""
        if "learning_rate" not in changes and "max_steps" not in changes:
            return
        scheduler = self.scheduler
        if "learning_rate" in changes:
            scheduler.base_lrs = [self.args.learning_rate for _ in scheduler.base_lrs]
            for group in self.optimizer.param_groups:
                group["initial_lr"] = self.args.learning_rate
        lrs = [
            base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
        ]
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        scheduler._last_lr = lrs
