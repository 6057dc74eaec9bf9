"""Training a causal language model on packed token blocks: :func:`train_causal_lm`.

The reproductions that train language models (the gd-icl stories study) train through this loop instead of
``transformers.Trainer``, so that they keep the package trainer's guarantees, with its code:

- **recipe**: AdamW (weight decay on every parameter, as :class:`~hf_icl.training.ICLTrainer`), the learning rate
  warmed up linearly for ``warmup_steps`` and then decayed along a half cosine to 0 at ``steps``: transformers'
  :func:`~transformers.get_cosine_schedule_with_warmup`, stepped once per optimizer step; the global gradient norm
  clipped to ``max_grad_norm`` (0: off). The loss is the model's own next-token loss (``labels = input_ids``).
- **batches**: every epoch visits the training blocks in a random order, a ``torch.randperm`` drawn from a
  ``torch.Generator`` seeded with ``step_seed(seed, 0, epoch)`` (:func:`~hf_icl.training.trainer.step_seed`); the
  epochs' orders are laid end to end and cut into batches of ``batch_size`` (a batch may span two epochs). The
  order is a function of ``(seed, step)`` alone, so a resumed run draws the batches an uninterrupted one would, with
  no sampler state to save (:func:`batch_indices`).
- **finiteness**: every step checks its loss and gradient norm (before the update) and the parameters (after it)
  finite, else :class:`~hf_icl.training.TrainingDivergedError` naming the step, what was not finite and the newest
  checkpoint whose saved weights are finite (read back from disk).
- **checkpoints** (:mod:`.checkpoints`): every ``checkpoint_every`` steps ``OUTPUT_DIR/checkpoints/step-N`` holds the
  weights, the optimizer, the scheduler, the random state (Python, NumPy, torch: dropout), the step and the curves
  so far, in safetensors and JSON with a manifest, written into ``step-N.tmp`` and renamed when complete; the oldest
  are rotated out beyond ``save_total_limit``. ``resume=True`` continues from the newest checkpoint, verified against
  its manifest, and ends bit-identical to a run that never stopped. The settings that shape the numbers (recipe,
  seed, data, cadence of the curves) must equal the checkpoint's; ``checkpoint_every``, ``save_total_limit``,
  ``log_every`` and ``log`` may change. A run that does not resume removes the checkpoints a previous run left in
  ``OUTPUT_DIR`` (they are not its own).
- **final folder**: ``OUTPUT_DIR`` gets the model (``save_pretrained``), its manifest
  (:func:`~hf_icl.modeling.model_folder.write_model_manifest`) and ``metrics.json``
  (:func:`~hf_icl.evaluation.runs.write_metrics`: no per-position evaluation, ``task`` ``"causal_lm"``, the final
  train and validation loss and the step count as scalars, the curves as a ``curves`` field). ``OUTPUT_DIR/train.lock``
  is held meanwhile (:class:`~hf_icl.training.run_lock.RunLock`).

The curve (what :func:`train_causal_lm` returns beside the model): ``{"train": [[step, loss]], "validation":
[[step, loss]]}``: the mean training loss of the steps since the previous point, every ``log_every`` steps and at the
last step; the mean validation loss over every validation block, every ``eval_every`` steps and at the last step.
One progress line per tenth of training goes to ``log``.

Example (a tiny GPT-2 learning a repeated sequence)::

    >>> import tempfile, torch
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> _ = torch.manual_seed(0)
    >>> config = GPT2Config(vocab_size=11, n_positions=16, n_embd=8, n_layer=1, n_head=2, bos_token_id=None,
    ...                     eos_token_id=None)
    >>> model = GPT2LMHeadModel(config)
    >>> blocks = torch.arange(16).remainder(11).repeat(8, 1)
    >>> model, curve = train_causal_lm(model, blocks, blocks[:2], steps=20, batch_size=4, learning_rate=3e-2,
    ...                                output_dir=tempfile.mkdtemp(), eval_every=10, log_every=5, log=None)
    >>> [step for step, _ in curve["train"]], [step for step, _ in curve["validation"]]
    ([5, 10, 15, 20], [10, 20])
    >>> curve["train"][-1][1] < curve["train"][0][1]
    True
"""

from __future__ import annotations

import hashlib
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..evaluation.runs import METRICS_FILE, write_metrics
from ..files import apply_umask
from ..modeling.model_folder import write_model_manifest
from ..validation import check_float, check_int
from . import console
from .checkpoints import (
    REQUIRED_FILES,
    CheckpointSaveError,
    capture_rng_state,
    latest_checkpoint,
    load_checkpoint,
    newest_finite_checkpoint,
    non_finite_weight,
    quiet_progress,
    restore_rng_state,
    save_checkpoint,
)
from .manifest import CheckpointError, verify_checkpoint
from .resume import TrainingDivergedError
from .run_lock import CHECKPOINTS, RunLock
from .trainer import all_finite, step_seed

__all__ = ["CAUSAL_LM_TASK", "RESUMABLE_SETTINGS", "CannotResumeError", "batch_indices", "train_causal_lm"]

#: the ``task`` of the ``metrics.json`` this loop writes
CAUSAL_LM_TASK = "causal_lm"
#: settings of a run that may differ from its checkpoint's on resume (they do not change the numbers)
RESUMABLE_SETTINGS = ("checkpoint_every", "save_total_limit", "log_every")


class CannotResumeError(ValueError):
    """``resume=True`` found no checkpoint in the output directory, or one of other settings (nothing was loaded)."""


class _OneProcess:
    """What :func:`~hf_icl.training.checkpoints.save_checkpoint` and ``load_checkpoint`` ask of an
    ``accelerate.Accelerator``, for one process and an unwrapped model in full precision (no gradient scaler)."""

    is_main_process = is_local_main_process = True
    process_index, num_processes = 0, 1
    scaler = None

    def __init__(self, device: torch.device):
        self.device = device

    def get_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return model.state_dict()

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def wait_for_everyone(self) -> None:
        pass


def batch_indices(n_blocks: int, batch_size: int, seed: int, step: int) -> torch.Tensor:
    """The indices of the training blocks of ``step``'s batch: positions ``step * batch_size`` onwards of the epochs'
    orders laid end to end, epoch ``e``'s order a ``torch.randperm(n_blocks)`` from a generator seeded with
    ``step_seed(seed, 0, e)``.

    >>> epochs = torch.cat([_epoch_order(5, seed=0, epoch=0), _epoch_order(5, seed=0, epoch=1)])
    >>> batches = [batch_indices(5, 3, seed=0, step=step) for step in range(3)]  # step 1 spans both epochs
    >>> torch.equal(torch.cat(batches), epochs[:9])
    True
    """
    start = step * batch_size
    first, last = start // n_blocks, (start + batch_size - 1) // n_blocks
    orders = torch.cat([_epoch_order(n_blocks, seed, epoch) for epoch in range(first, last + 1)])
    offset = start - first * n_blocks
    return orders[offset : offset + batch_size]


def _epoch_order(n_blocks: int, seed: int, epoch: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(step_seed(seed, 0, epoch))
    return torch.randperm(n_blocks, generator=generator)


def _fingerprint(blocks: torch.Tensor) -> str:
    """The sha256 (16 hex digits) of a ``(N, T)`` block tensor's shape and tokens."""
    digest = hashlib.sha256(str(tuple(blocks.shape)).encode())
    digest.update(blocks.detach().to("cpu", torch.int64).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def _config_fingerprint(model: torch.nn.Module) -> str:
    """The sha256 (16 hex digits) of the model's config (its class name if it has none): a checkpoint loads only
    into a model of the same config, even where another config has the same weight shapes."""
    config = getattr(model, "config", None)
    text = config.to_json_string(use_diff=True) if hasattr(config, "to_json_string") else type(model).__qualname__
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _check_blocks(name: str, blocks) -> torch.Tensor:
    if not isinstance(blocks, torch.Tensor) or blocks.dim() != 2 or blocks.dtype != torch.int64 or not blocks.numel():
        shown = f"{tuple(blocks.shape)} {blocks.dtype}" if isinstance(blocks, torch.Tensor) else type(blocks).__name__
        raise ValueError(f"{name} must be a non-empty (N, T) int64 tensor of token ids, got {shown}")
    return blocks


def train_causal_lm(
    model: torch.nn.Module,
    train_blocks: torch.Tensor,
    validation_blocks: torch.Tensor,
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    output_dir: str | Path,
    warmup_steps: int = 0,
    weight_decay: float = 0.0,
    seed: int = 0,
    eval_every: int | None = None,
    log_every: int | None = None,
    checkpoint_every: int = 0,
    save_total_limit: int | None = 2,
    max_grad_norm: float = 1.0,
    resume: bool = False,
    log: Callable[[str], None] | None = console.say,
) -> tuple[torch.nn.Module, dict[str, list[list[float]]]]:
    """Train ``model`` (a transformers causal LM: ``model(input_ids=..., labels=...).loss``, on the device it is on) for
    ``steps`` optimizer steps of ``batch_size`` blocks of ``train_blocks`` (``(N, T)`` int64 token ids); see the module
    docstring for the recipe, the batches, the checks, the checkpoints and the files written to ``output_dir``.

    Args:
        validation_blocks: ``(M, T')`` int64 token ids, scored in batches of ``batch_size`` every ``eval_every`` steps.
        eval_every / log_every: the cadence of the validation and training curves (default: ``steps // 10``, ≥ 1).
        checkpoint_every: write a checkpoint every this many steps (0: none); ``save_total_limit`` keep only the
            newest this many (None: all).
        resume: continue from the newest checkpoint in ``output_dir/checkpoints`` (there must be one, of the same
            settings, see :data:`RESUMABLE_SETTINGS`, else :class:`CannotResumeError`; a damaged one is a
            :class:`~hf_icl.training.CheckpointError`).
        log: receives one progress line per tenth of training (None: silent).

    Returns the trained model (in eval mode) and its curve ``{"train": [[step, loss]], "validation": [[step, loss]]}``.
    """
    check_int("steps", steps, low=1)
    check_int("batch_size", batch_size, low=1)
    check_int("warmup_steps", warmup_steps, low=0)
    check_int("seed", seed, low=0)
    check_int("checkpoint_every", checkpoint_every, low=0)
    if save_total_limit is not None:
        check_int("save_total_limit", save_total_limit, low=1)
    check_float("learning_rate", learning_rate, low=0.0, low_inclusive=False)
    check_float("weight_decay", weight_decay, low=0.0)
    check_float("max_grad_norm", max_grad_norm, low=0.0)
    train_blocks = _check_blocks("train_blocks", train_blocks)
    validation_blocks = _check_blocks("validation_blocks", validation_blocks)
    default_every = max(1, steps // 10)
    eval_every = check_int("eval_every", default_every if eval_every is None else eval_every, low=1)
    log_every = check_int("log_every", default_every if log_every is None else log_every, low=1)
    settings = {
        "model_type": getattr(getattr(model, "config", None), "model_type", type(model).__name__),
        "model_config": _config_fingerprint(model),
        "steps": steps,
        "batch_size": batch_size,
        "learning_rate": learning_rate,
        "warmup_steps": warmup_steps,
        "weight_decay": weight_decay,
        "max_grad_norm": max_grad_norm,
        "seed": seed,
        "eval_every": eval_every,
        "log_every": log_every,
        "checkpoint_every": checkpoint_every,
        "save_total_limit": save_total_limit,
        "train_blocks": _fingerprint(train_blocks),
        "validation_blocks": _fingerprint(validation_blocks),
    }
    run = _CausalLMRun(model, train_blocks, validation_blocks, settings, Path(output_dir), log)
    with RunLock(run.output_dir):
        if resume:
            run.resume()
        else:
            run.remove_stale_checkpoints()
        run.train()
        run.write_final_folder()
    return run.model.eval(), run.curve()


class _CausalLMRun:
    """The state of one :func:`train_causal_lm` run: model, optimizer, schedule, step, losses and curves."""

    def __init__(self, model, train_blocks, validation_blocks, settings: dict, output_dir: Path, log):
        from transformers import get_cosine_schedule_with_warmup

        self.model, self.settings, self.output_dir, self.log = model, settings, output_dir, log
        self.device = next(model.parameters()).device
        self.process = _OneProcess(self.device)
        self.train_blocks = train_blocks.to(self.device)
        self.validation_blocks = validation_blocks.to(self.device)
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=settings["learning_rate"], weight_decay=settings["weight_decay"], fused=True
        )
        steps = settings["steps"]
        self.scheduler = get_cosine_schedule_with_warmup(
            self.optimizer, num_warmup_steps=min(settings["warmup_steps"], steps), num_training_steps=steps
        )
        self.step = 0  # optimizer steps taken
        self.losses: list[float] = []  # every step's training loss
        self.validation: list[list[float]] = []  # [step, validation loss]
        self.start_step = 0  # where this call started (or resumed): no checkpoint is written there again
        self.resumed_from: Path | None = None

    # -- resume ----------------------------------------------------------------------------------------------------
    def remove_stale_checkpoints(self) -> None:
        stale = self.output_dir / CHECKPOINTS
        if stale.is_dir():
            shutil.rmtree(stale)
            self._say(f"removed the checkpoints of a previous run in {stale} (resume=False)")

    def resume(self) -> None:
        path = latest_checkpoint(self.output_dir)
        if path is None:
            raise CannotResumeError(
                f"resume=True: no checkpoint in {self.output_dir / CHECKPOINTS} (looked for step-*)"
            )
        bad = non_finite_weight(path)
        if bad is not None:
            raise CheckpointError(f"checkpoint {path} holds non-finite weights ({bad}): {self._advice(before=None)}")
        manifest, _ = verify_checkpoint(path, REQUIRED_FILES)
        saved, current = manifest["training_args"], self.settings
        differing = [
            f"{name} {saved.get(name)!r} → {current.get(name)!r}"
            for name in sorted(set(saved) | set(current))
            if name not in RESUMABLE_SETTINGS and saved.get(name) != current.get(name)
        ]
        if differing:
            raise CannotResumeError(
                f"cannot resume from {path}: these settings differ from the checkpoint's: {', '.join(differing)}; set "
                f"them back, or train afresh (resume=False removes the checkpoints)"
            )
        state, rng_state = load_checkpoint(
            path, manifest, self.process, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler
        )
        if state.get("step") != manifest["step"]:
            found = state.get("step")
            raise CheckpointError(
                f"checkpoint {path}: trainer_state.json has step {found!r}, manifest {manifest['step']}"
            )
        if rng_state is None:
            raise CheckpointError(f"checkpoint {path} holds no random state")
        restore_rng_state(rng_state, self.device, f"checkpoint {path}")
        self.step = self.start_step = manifest["step"]
        self.losses = [float(loss) for loss in state["losses"]]
        self.validation = [[int(step), float(loss)] for step, loss in state["validation"]]
        self.resumed_from = path
        self._say(f"resumed from {path} at step {self.step}")

    # -- the loop --------------------------------------------------------------------------------------------------
    def train(self) -> None:
        steps, tenth = self.settings["steps"], max(1, self.settings["steps"] // 10)
        started, shown = time.perf_counter(), self.step
        self.model.train()
        while self.step < steps:
            self.losses.append(self._optimizer_step())
            self.step += 1
            if self.step % self.settings["eval_every"] == 0 or self.step == steps:
                self.validation.append([self.step, self.validation_loss()])
            every = self.settings["checkpoint_every"]
            if every and self.step % every == 0:
                self._save_checkpoint()
            if self.step % tenth == 0 or self.step == steps:
                window = self.losses[shown : self.step]
                elapsed = time.perf_counter() - started
                self._say(f"step {self.step}/{steps} ({elapsed:.0f} s): train loss {sum(window) / len(window):.3f}")
                shown = self.step

    def _optimizer_step(self) -> float:
        """One checked update: loss and gradient norm finite before it, the parameters after it."""
        settings, step = self.settings, self.step
        rows = batch_indices(len(self.train_blocks), settings["batch_size"], settings["seed"], step)
        batch = self.train_blocks[rows.to(self.device)]
        loss = self.model(input_ids=batch, labels=batch).loss
        loss.backward()
        parameters = [p for p in self.model.parameters() if p.grad is not None]
        if settings["max_grad_norm"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(parameters, settings["max_grad_norm"])
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
        value, grad_norm = torch.stack((loss.detach().float(), norm.float())).tolist()  # one device sync
        if not math.isfinite(value):
            raise self._diverged(step, f"the loss is {value} (no update was applied)")
        if not math.isfinite(grad_norm):
            raise self._diverged(step, f"the gradient norm is {grad_norm} (the update was not applied)")
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if not all_finite(self.model.parameters()):
            names = [name for name, p in self.model.named_parameters() if not torch.isfinite(p).all()]
            raise self._diverged(step, f"the update made non-finite parameters ({', '.join(names[:5])})")
        return value

    @torch.no_grad()
    def validation_loss(self) -> float:
        """The mean next-token loss over every validation block (blocks of equal length: the mean over tokens)."""
        self.model.eval()
        total, size = 0.0, self.settings["batch_size"]
        for start in range(0, len(self.validation_blocks), size):
            batch = self.validation_blocks[start : start + size]
            total += self.model(input_ids=batch, labels=batch).loss.item() * len(batch)
        self.model.train()
        return total / len(self.validation_blocks)

    def curve(self) -> dict[str, list[list[float]]]:
        """The training curve (mean loss of each ``log_every`` window, and of the last, partial one) and the
        validation curve."""
        every, train = self.settings["log_every"], []
        for end in [*range(every, len(self.losses) + 1, every), len(self.losses)]:
            if end and (not train or train[-1][0] != end):
                window = self.losses[end - (end - 1) % every - 1 : end]
                train.append([end, sum(window) / len(window)])
        return {"train": train, "validation": [list(point) for point in self.validation]}

    # -- checkpoints and the final folder ------------------------------------------------------------------------
    def _save_checkpoint(self) -> None:
        if self.step == self.start_step:
            return
        state = {"step": self.step, "num_processes": 1, "losses": self.losses, "validation": self.validation}
        try:
            save_checkpoint(
                self.process,
                self.output_dir,
                self.step,
                model=self.model,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                trainer_state=state,
                rng_state=capture_rng_state(self.device),  # the state the next step starts in
                training_args=self.settings,
                save_total_limit=self.settings["save_total_limit"],
            )
        except CheckpointSaveError as err:
            raise CheckpointSaveError(
                f"{err} (the partial checkpoint was removed). {self._advice(before=err.step - 1)}",
                step=err.step,
                cause=err,
            ) from None

    def write_final_folder(self) -> None:
        """``save_pretrained``, the model manifest and ``metrics.json`` into ``output_dir``."""
        with quiet_progress():
            self.model.save_pretrained(self.output_dir)
        apply_umask(self.output_dir)  # transformers writes the weights through a private (0600) temporary file
        write_model_manifest(self.output_dir)
        curve = self.curve()
        scalars = {
            "steps": self.step,
            "train_loss": curve["train"][-1][1],
            "validation_loss": curve["validation"][-1][1],
        }
        write_metrics(
            self.output_dir / METRICS_FILE,
            {},
            model=self.settings["model_type"],
            task=CAUSAL_LM_TASK,
            scalars=scalars,
            curves=curve,
            settings=self.settings,
        )

    # -- messages --------------------------------------------------------------------------------------------------
    def _diverged(self, step: int, problem: str) -> TrainingDivergedError:
        return TrainingDivergedError(
            f"training diverged at step {step}: {problem}. {self._advice(before=step)} A lower learning_rate "
            f"(now {self.settings['learning_rate']:g}) or max_grad_norm (now {self.settings['max_grad_norm']:g}; 0 is "
            "off) avoids a divergence the settings caused (a resumed run repeats the same steps)."
        )

    def _advice(self, before: int | None) -> str:
        extra = ((self.start_step, self.resumed_from),) if self.resumed_from is not None else ()
        good = newest_finite_checkpoint(self.output_dir, before=before, extra=extra)
        if good is None:
            return "No checkpoint of this run has finite weights: start again (resume=False)."
        return (
            f"The newest checkpoint whose saved weights are finite (read back from disk) is {good}: resume from it "
            "(resume=True continues from the newest checkpoint in output_dir)."
        )

    def _say(self, line: str) -> None:
        if self.log is not None:
            self.log(line)
