"""Checkpoints of a seed-stacked model (:class:`~hf_icl.training.seed_ensemble.StackedSeeds`): the package trainer's
format (:mod:`.checkpoints`: safetensors and JSON, nothing pickled, a manifest verified before anything is read,
written into ``step-N.tmp`` and renamed when complete), holding every seed at once.

A checkpoint ``OUTPUT_DIR/checkpoints/step-NNNNNNNN`` holds

- ``model.safetensors`` + ``model.json``: the stacked tensors, seed on dim 0: ``params`` (trained), and where the
  model has them ``frozen`` (untrained parameters) and ``buffers`` (keys ``params.NAME``, ``frozen.NAME``, ...);
- ``optimizer.safetensors`` + ``optimizer.json``: the optimizer's state (one optimizer over the stacked tensors);
- ``extra.safetensors`` + ``extra.json`` (if the caller passed ``extra``): the caller's own state: generator states
  as uint8 tensors, the curves so far, ... (tensors, numbers, strings, lists, tuples and dicts);
- ``trainer_state.json``: ``{"format": "hf_icl-seed-stack", "kind": class name, "seeds": [...], "steps_done": N}``;
- ``manifest.json``: the sha256 of every other file, the step, and as ``training_args`` the caller's ``spec`` (what
  the run depends on: a checkpoint is resumed only by a run of the same spec).

Loading verifies the manifest, the spec, the kind and seeds, every tensor's name, shape and dtype, and that every
weight is finite, before it changes anything; a checkpoint that fails is a one-line
:class:`~hf_icl.training.manifest.CheckpointError` naming its folder. Since the weights file is ``model.safetensors``,
:func:`~hf_icl.training.checkpoints.newest_finite_checkpoint` reads these checkpoints as it reads the trainer's.

Several stacks trained in one loop on shared batches (the kernel-icl and gd-icl studies) resume together at one step:
:func:`common_resume_step` finds the newest step every one of them has a checkpoint of and removes the checkpoints
that will not be resumed.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from ..validation import one_line
from .checkpoints import (
    OPTIMIZER,
    TRAINER_STATE_FILE,
    CheckpointSaveError,
    as_os_error,
    checkpoint_dir,
    list_checkpoints,
    read_json,
    read_state,
    replace_dir,
    rotate_checkpoints,
    staging_dir,
    write_state,
)
from .manifest import CheckpointError, read_manifest, verify_checkpoint, write_manifest

STACK_FORMAT = "hf_icl-seed-stack"
WEIGHTS = "model"  # model.json + model.safetensors
EXTRA = "extra"  # extra.json + extra.safetensors
REQUIRED = (TRAINER_STATE_FILE, f"{WEIGHTS}.json", f"{OPTIMIZER}.json")


# -- save --------------------------------------------------------------------------------------------------------------
def save_stacked_checkpoint(
    stack, output_dir: str | Path, *, spec: dict | None = None, extra: Any = None, keep: int | None = None
) -> Path:
    """Write the checkpoint of ``stack`` at its ``steps_done`` into ``output_dir/checkpoints/step-N`` (see the module
    docstring), then keep only the newest ``keep`` checkpoints (None: all); returns the folder. A failed write
    removes ``step-N.tmp`` and raises :class:`~hf_icl.training.checkpoints.CheckpointSaveError`; no earlier
    checkpoint is touched."""
    step = stack.steps_done
    staging, final = staging_dir(output_dir, step), checkpoint_dir(output_dir, step)
    try:
        _write_parts(stack, staging, extra)
        write_manifest(staging, step, spec or {})
        replace_dir(staging, final)
    except (OSError, SafetensorError) as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise _save_error(staging, step, as_os_error(err)) from None
    if keep is not None:
        rotate_checkpoints(output_dir, keep, protect=final)
    return final


def _write_parts(stack, folder: Path, extra: Any) -> None:
    if folder.exists():
        shutil.rmtree(folder)  # left over from a run that died while saving
    folder.mkdir(parents=True)
    write_state(folder, WEIGHTS, stack.stacked_tensors())
    write_state(folder, OPTIMIZER, stack.optimizer.state_dict())
    if extra is not None:
        write_state(folder, EXTRA, extra)
    state = {"format": STACK_FORMAT, "kind": type(stack).__name__, "seeds": list(stack.seeds)}
    (folder / TRAINER_STATE_FILE).write_text(json.dumps({**state, "steps_done": stack.steps_done}, indent=2))


def _save_error(staging: Path, step: int, cause: OSError) -> CheckpointSaveError:
    where = f", writing {Path(cause.filename).name}" if cause.filename else ""
    message = f"could not write the checkpoint of step {step} ({staging}{where}): {cause.strerror or cause}"
    return CheckpointSaveError(message, step=step, cause=cause)


# -- find ------------------------------------------------------------------------------------------------------------
def checkpoint_spec(directory: str | Path) -> dict:
    """The spec a checkpoint was written for (its manifest's ``training_args``; the files are not hashed here)."""
    return read_manifest(directory)["training_args"]


def checkpoints_of(output_dir: str | Path, spec: dict) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every checkpoint under ``output_dir/checkpoints`` written for ``spec``, oldest first
    (checkpoints of another spec, or whose manifest cannot be read, are not this run's)."""
    return [(step, path) for step, path in list_checkpoints(output_dir) if _spec_or_none(path) == spec]


def resumable_checkpoint(output_dir: str | Path, spec: dict) -> Path | None:
    """The newest checkpoint under ``output_dir/checkpoints`` written for ``spec``; None if there is none."""
    found = checkpoints_of(output_dir, spec)
    return found[-1][1] if found else None


def common_resume_step(output_dirs: Sequence[str | Path], specs: Sequence[dict], *, resume: bool = True) -> int | None:
    """The step a loop training several stacks in lockstep resumes at: the newest step at which every
    ``output_dirs[i]`` has a checkpoint written for ``specs[i]``; None when there is none (or an empty loop), or when
    not ``resume``. Every checkpoint that will not be resumed is removed (with None every ``checkpoints`` folder, else
    the checkpoints of every other step), so none of another spec, a retrained run or a step one stack never reached
    mixes in later; load each stack from ``checkpoint_dir(output_dirs[i], step)``."""
    if len(output_dirs) != len(specs):
        raise ValueError(f"one spec per output folder: got {len(output_dirs)} folders and {len(specs)} specs")
    steps = [{step for step, _ in checkpoints_of(d, spec)} for d, spec in zip(output_dirs, specs, strict=True)]
    common = set.intersection(*steps) if resume and steps else set()
    step = max(common) if common else None
    for output_dir in output_dirs:
        if step is None:
            shutil.rmtree(Path(output_dir) / "checkpoints", ignore_errors=True)
            continue
        for other, path in list_checkpoints(output_dir):
            if other != step:
                shutil.rmtree(path, ignore_errors=True)
    return step


@contextmanager
def resuming(name: str, folder: str | Path) -> Iterator[None]:
    """Resume run ``name`` from checkpoint ``folder`` inside the block: a checkpoint that cannot be read back or does
    not fit the run (its extra state of other fields or shapes) is one :class:`CheckpointError` naming the run, the
    folder and the way out (delete it, or ``--retrain``)."""
    try:
        yield
    except (KeyError, TypeError, ValueError) as err:  # CheckpointError is a ValueError
        raise CheckpointError(
            f"cannot resume {name}: {one_line(err)}; delete {folder} or rerun with --retrain"
        ) from None


def _spec_or_none(directory: Path) -> dict | None:
    try:
        return checkpoint_spec(directory)
    except CheckpointError:
        return None


# -- load --------------------------------------------------------------------------------------------------------------
def load_stacked_checkpoint(stack, directory: str | Path, *, spec: dict | None = None) -> Any:
    """Restore ``stack`` (tensors, optimizer, ``steps_done``) from the checkpoint folder ``directory`` and return its
    ``extra`` (None if it has none). Everything is checked before anything changes: the manifest (every file's size
    and sha256), the spec (when given), the kind and the seeds, every tensor's name, shape and dtype, finite
    weights; a failed check raises :class:`~hf_icl.training.manifest.CheckpointError` naming the folder."""
    directory = Path(directory)
    where = f"checkpoint {directory}"
    manifest, _ = verify_checkpoint(directory, REQUIRED)
    listed = manifest["files"]
    saved_spec = manifest["training_args"]
    if spec is not None and saved_spec != spec:
        changed = sorted(k for k in {*spec, *saved_spec} if spec.get(k) != saved_spec.get(k))
        raise CheckpointError(f"{where} was written by a run of another spec (differs in {changed})")
    _check_trainer_state(stack, read_json(directory, TRAINER_STATE_FILE, listed), manifest["step"], where)
    tensors = read_state(directory, WEIGHTS, listed)
    _check_tensors(stack.stacked_tensors(), tensors, where)
    try:
        stack.optimizer.load_state_dict(read_state(directory, OPTIMIZER, listed))
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as err:
        raise CheckpointError(f"{where}: the optimizer state does not fit this model ({err})") from None
    _copy_into(stack.stacked_tensors(), tensors)
    stack.steps_done = manifest["step"]
    return read_state(directory, EXTRA, listed) if f"{EXTRA}.json" in listed else None


def _check_trainer_state(stack, state: dict, step: int, where: str) -> None:
    expected = {"format": STACK_FORMAT, "kind": type(stack).__name__, "seeds": list(stack.seeds), "steps_done": step}
    for key, value in expected.items():
        if state.get(key) != value:
            raise CheckpointError(
                f"{where}: {TRAINER_STATE_FILE} has {key} {state.get(key)!r}, this run needs {value!r}"
            )


def _check_tensors(own: dict, saved: Any, where: str) -> None:
    """``saved`` has exactly ``own``'s groups and names, each tensor of the same shape and dtype, all finite."""
    names = {group: sorted(tensors) for group, tensors in own.items()}
    found = {group: sorted(tensors) for group, tensors in saved.items()} if isinstance(saved, dict) else saved
    if found != names:
        raise CheckpointError(f"{where}: {WEIGHTS}.safetensors does not hold this model's tensors")
    for group, tensors in own.items():
        for name, tensor in tensors.items():
            other = saved[group][name]
            if not isinstance(other, torch.Tensor) or other.shape != tensor.shape or other.dtype != tensor.dtype:
                raise CheckpointError(
                    f"{where}: {group}.{name} is {_describe(other)}, this model's is {_describe(tensor)} "
                    "(another model or other seeds)"
                )
            if other.is_floating_point() and not torch.isfinite(other).all():
                raise CheckpointError(f"{where}: {group}.{name} holds non-finite values (NaN or infinity)")


def _describe(value: Any) -> str:
    return f"{tuple(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__


@torch.no_grad()
def _copy_into(own: dict, saved: dict) -> None:
    # in place: the optimizer holds these very tensors
    for group, tensors in own.items():
        for name, tensor in tensors.items():
            tensor.copy_(saved[group][name])
