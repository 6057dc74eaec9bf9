"""Checkpoints that never unpickle anything and are never half-written.

A checkpoint ``OUTPUT_DIR/checkpoints/step-NNNNNNNN`` holds

- ``config.json`` + ``model.safetensors``: the model's ``save_pretrained`` (so
  ``AutoModel.from_pretrained(checkpoint)`` loads it, after ``import hf_icl``);
- ``optimizer.safetensors`` + ``optimizer.json``: the optimizer's tensors, and its structure
  (param groups, step counters, references to the tensors) as JSON;
- ``scheduler.json`` and, under fp16, ``scaler.json`` (the gradient scaler);
- ``trainer_state.json``: the step, the curriculum stage, the seed, the number of processes and
  the log history;
- ``rng_state_R.safetensors`` + ``rng_state_R.json`` for every process R: torch's CPU (and CUDA)
  generator states as uint8 tensors, Python's ``random`` and NumPy's states as JSON;
- ``manifest.json`` (:mod:`.manifest`): the sha256 of every other file, the step, the full training
  arguments and the format version; resuming verifies it before reading anything.

Everything is written into ``step-N.tmp`` and renamed when complete; a write that fails (disk full,
permission) removes ``step-N.tmp`` and raises :class:`CheckpointSaveError`, and no earlier checkpoint
is touched (older ones are rotated out only after the new one is complete). Nothing here calls
``torch.load`` or ``pickle``: safetensors and JSON only.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..files import apply_umask
from ..modeling.model_folder import first_non_finite_weight
from .manifest import CheckpointError, write_manifest
from .run_files import SEED_DIR_PREFIX

CHECKPOINT_PATTERN = re.compile(r"^step-(\d+)$")
SEED_PART = re.compile(rf"^{SEED_DIR_PREFIX}(\d+)$")  # one seed's state in a checkpoint of several seeds
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
TRAINER_STATE_FILE = "trainer_state.json"
OPTIMIZER = "optimizer"  # optimizer.json + optimizer.safetensors
SCHEDULER = "scheduler"  # scheduler.json
SCALER = "scaler"  # scaler.json (fp16 only)
#: files every checkpoint must list in its manifest (the weights are checked separately: one file or shards)
REQUIRED_FILES = (CONFIG_FILE, f"{OPTIMIZER}.json", f"{SCHEDULER}.json", TRAINER_STATE_FILE)

_TENSOR, _TUPLE, _DICT, _NDARRAY = "__tensor__", "__tuple__", "__dict__", "__ndarray__"


class CheckpointSaveError(OSError):
    """Writing a checkpoint failed (disk full, permission, ...). The partial ``step-N.tmp`` was removed and
    every earlier checkpoint is intact. ``step``: the checkpoint's step; ``cause``: the underlying error
    (an ``OSError``; its ``errno`` is this error's too)."""

    def __init__(self, message: str, *, step: int, cause: BaseException):
        super().__init__(message)
        self.message = message
        self.step = step
        self.cause = cause
        self.errno = getattr(cause, "errno", None)
        self.strerror = getattr(cause, "strerror", None)

    def __str__(self) -> str:  # OSError's would print "[Errno N] strerror" instead of the message
        return self.message


class TrainingProgress:
    """The optimizer steps taken so far."""

    def __init__(self, step: int = 0):
        self.step = step


def rng_state_name(process_index: int) -> str:
    return f"rng_state_{process_index}"


# -- where checkpoints live ----------------------------------------------------------------------------
def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step-{step:08d}"


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every complete checkpoint under ``output_dir/checkpoints``, oldest first
    (``step-N.tmp`` folders, left by a save that never finished, are not checkpoints)."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_PATTERN.match(p.name)) and p.is_dir()]
    return sorted(found)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The checkpoint with the highest step under ``output_dir/checkpoints`` (None if there is none)."""
    found = list_checkpoints(output_dir)
    return found[-1][1] if found else None


def rotate_checkpoints(output_dir: str | Path, keep: int, protect: Path | None = None) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (never ``protect``); returns the deleted folders."""
    found = [path for _, path in list_checkpoints(output_dir)]
    doomed = [path for path in found[: max(0, len(found) - keep)] if protect is None or path != protect]
    for path in doomed:
        shutil.rmtree(path)
    return doomed


# -- finite weights ----------------------------------------------------------------------------------------
def non_finite_weight(directory: str | Path) -> str | None:
    """``"file:key"`` of the first weight holding a NaN or an infinity in the folder's safetensors files, read from
    disk; None if every weight is finite. A folder whose weights cannot be read (missing, truncated, a crafted
    header) raises :class:`CheckpointError`. A checkpoint of several seeds (``seed-S`` folders, no weights of its
    own) is checked seed by seed: ``"seed-S/file:key"``."""
    parts = seed_parts(directory)
    if parts:
        for part in parts:
            found = non_finite_weight(part)
            if found is not None:
                return f"{part.name}/{found}"
        return None
    found = first_non_finite_weight(directory)
    return None if found is None else f"{found[0]}:{found[1]}"


def seed_parts(directory: str | Path) -> list[Path]:
    """The ``seed-S`` folders of a checkpoint of several seeds, in seed order; empty for a checkpoint of one model."""
    directory = Path(directory)
    if (directory / CONFIG_FILE).exists():
        return []
    found = [(int(m.group(1)), p) for p in directory.glob("seed-*") if (m := SEED_PART.match(p.name)) and p.is_dir()]
    return [path for _, path in sorted(found)]


def newest_finite_checkpoint(
    output_dir: str | Path, *, before: int | None = None, extra: tuple[tuple[int, Path], ...] = ()
) -> Path | None:
    """The newest complete checkpoint under ``output_dir/checkpoints`` (and the ``(step, folder)`` of ``extra``) whose
    weights are all finite, checked by reading them; only steps ``<= before`` if given. None if there is none."""
    found = {path.resolve(): (step, path) for step, path in list_checkpoints(output_dir)}
    for step, path in extra:
        if Path(path).is_dir():
            found.setdefault(Path(path).resolve(), (step, Path(path)))
    for step, path in sorted(found.values(), key=lambda item: -item[0]):
        if before is not None and step > before:
            continue
        try:
            if non_finite_weight(path) is None:
                return path
        except CheckpointError:  # unreadable: not one to resume from
            continue
    return None


# -- a pickle-free codec: nested Python state <-> JSON + a flat dict of tensors ---------------------------
def encode_state(obj: Any, tensors: dict[str, torch.Tensor], path: str = "") -> Any:
    """JSON-ready form of ``obj``; its tensors go into ``tensors`` under unique keys."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        key = path or "tensor"
        while key in tensors:
            key += "'"
        tensors[key] = obj.detach().to("cpu", copy=True).contiguous()
        return {_TENSOR: key}
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf":
            raise TypeError(f"cannot store a NumPy array of dtype {obj.dtype} at {path!r} in a checkpoint")
        return {_NDARRAY: obj.tolist(), "dtype": obj.dtype.str}
    if isinstance(obj, np.generic):
        return encode_state(obj.item(), tensors, path)
    if isinstance(obj, list):
        return [encode_state(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {_TUPLE: [encode_state(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: encode_state(v, tensors, f"{path}.{k}" if path else k) for k, v in obj.items()}
        return {
            _DICT: [
                [encode_state(k, tensors, f"{path}.key"), encode_state(v, tensors, f"{path}.{k}" if path else str(k))]
                for k, v in obj.items()
            ]
        }
    raise TypeError(f"cannot store a {type(obj).__name__} at {path!r} in a checkpoint (tensors and JSON only)")


def decode_state(data: Any, tensors: dict[str, torch.Tensor], where: str = "state") -> Any:
    """Inverse of :func:`encode_state`; raises :class:`CheckpointError` on anything it did not write."""
    if isinstance(data, list):
        return [decode_state(v, tensors, where) for v in data]
    if not isinstance(data, dict):
        return data
    if _TENSOR in data:
        key = data[_TENSOR]
        if len(data) != 1 or not isinstance(key, str) or key not in tensors:
            raise CheckpointError(f"{where} refers to a tensor {key!r} that its .safetensors file does not hold")
        return tensors[key]
    if _TUPLE in data:
        if len(data) != 1 or not isinstance(data[_TUPLE], list):
            raise CheckpointError(f"{where} holds a malformed tuple")
        return tuple(decode_state(v, tensors, where) for v in data[_TUPLE])
    if _DICT in data:
        items = data[_DICT]
        if len(data) != 1 or not isinstance(items, list) or not all(isinstance(i, list) and len(i) == 2 for i in items):
            raise CheckpointError(f"{where} holds a malformed mapping")
        try:
            return {decode_state(k, tensors, where): decode_state(v, tensors, where) for k, v in items}
        except TypeError as err:  # an unhashable key
            raise CheckpointError(f"{where} holds a mapping with an invalid key ({err})") from None
    if _NDARRAY in data:
        dtype = data.get("dtype")
        if set(data) != {_NDARRAY, "dtype"} or not isinstance(dtype, str):
            raise CheckpointError(f"{where} holds a malformed array")
        try:
            array = np.asarray(data[_NDARRAY], dtype=np.dtype(dtype))
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"{where} holds an invalid array ({err})") from None
        if array.dtype.kind not in "biuf":
            raise CheckpointError(f"{where} holds an array of dtype {array.dtype}; only numbers are allowed")
        return array
    unknown = [k for k in data if isinstance(k, str) and k.startswith("__")]
    if unknown:
        raise CheckpointError(f"{where} holds unknown entries {unknown}")
    return {k: decode_state(v, tensors, where) for k, v in data.items()}


def write_state(directory: Path, name: str, state: Any) -> None:
    """``name.json`` (the structure) and, if ``state`` holds tensors, ``name.safetensors``."""
    tensors: dict[str, torch.Tensor] = {}
    encoded = encode_state(state, tensors)
    if tensors:
        save_file(tensors, str(directory / f"{name}.safetensors"), metadata={"format": "pt"})
        apply_umask(directory / f"{name}.safetensors")  # safetensors writes a private (0600) file
    (directory / f"{name}.json").write_text(json.dumps(encoded))


def read_state(directory: Path, name: str, listed: dict[str, Any]) -> Any:
    """Read what :func:`write_state` wrote; only files listed in the (verified) manifest are opened."""
    if f"{name}.json" not in listed:
        raise CheckpointError(f"checkpoint {directory}: required file {name}.json is not in manifest.json")
    where = f"checkpoint {directory}: {name}.json"
    try:
        encoded = json.loads((directory / f"{name}.json").read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{where} is not valid JSON ({err})") from None
    tensors = _load_tensors(directory, f"{name}.safetensors") if f"{name}.safetensors" in listed else {}
    return decode_state(encoded, tensors, where)


def _load_tensors(directory: Path, name: str) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(directory / name))
    except Exception as err:  # safetensors' own error type: the file does not parse
        raise CheckpointError(f"checkpoint {directory}: {name} is not a valid safetensors file ({err})") from None


def read_json(directory: Path, name: str, listed: dict[str, Any]) -> dict[str, Any]:
    if name not in listed:
        raise CheckpointError(f"checkpoint {directory}: required file {name} is not in manifest.json")
    try:
        value = json.loads((directory / name).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"checkpoint {directory}: {name} is not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"checkpoint {directory}: {name} must hold a JSON object")
    return value


# -- random number generators ----------------------------------------------------------------------------
def capture_rng_state(device: torch.device) -> dict[str, Any]:
    """This process's generator states: Python, NumPy, torch CPU and (on a GPU) the device's CUDA generator."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(legacy=False),
        "torch_cpu": torch.get_rng_state(),
    }
    if device.type == "cuda":
        state["torch_cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng_state(state: dict[str, Any], device: torch.device, where: str) -> None:
    try:
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch_cpu"])
        if device.type == "cuda" and "torch_cuda" in state:
            torch.cuda.set_rng_state(state["torch_cuda"], device)
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{where} holds an invalid random state ({type(err).__name__}: {err})") from None


# -- model weights ---------------------------------------------------------------------------------------
@contextmanager
def quiet_progress():
    """No transformers progress bar inside the block (saving or loading many small models would print one each)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _load_weights(model: torch.nn.Module, directory: Path, listed: dict[str, Any]) -> None:
    """The checkpoint's safetensors weights into ``model`` (unwrapped), checked key by key."""
    where = f"checkpoint {directory}"
    if WEIGHTS_FILE in listed:
        shards = [WEIGHTS_FILE]
    elif WEIGHTS_INDEX_FILE in listed:
        index = read_json(directory, WEIGHTS_INDEX_FILE, listed)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{where}: {WEIGHTS_INDEX_FILE} has no valid weight_map")
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if s not in listed]
        if missing:
            raise CheckpointError(f"{where}: weight shard {missing[0]} is not in manifest.json")
    else:
        raise CheckpointError(f"{where}: required file {WEIGHTS_FILE} is missing from manifest.json")
    loaded: dict[str, torch.Tensor] = {}
    for shard in shards:
        loaded.update(_load_tensors(directory, shard))
    own = model.state_dict()
    unexpected = sorted(set(loaded) - set(own))
    if unexpected:
        raise CheckpointError(f"{where}: {shards[0]} holds weights this model does not have: {unexpected[:5]}")
    for key, tensor in loaded.items():
        if tensor.shape != own[key].shape or tensor.dtype != own[key].dtype:
            raise CheckpointError(
                f"{where}: weight {key} is {tuple(tensor.shape)} {tensor.dtype}, the model's is "
                f"{tuple(own[key].shape)} {own[key].dtype}"
            )
    # save_pretrained drops tied copies: a key may be absent only if it shares storage with a saved one
    saved_storage = {(own[k].data_ptr(), own[k].shape) for k in loaded}
    absent = [k for k in own if k not in loaded and (own[k].data_ptr(), own[k].shape) not in saved_storage]
    if absent:
        raise CheckpointError(f"{where}: {shards[0]} lacks weights of this model: {absent[:5]}")
    model.load_state_dict(loaded, strict=False)


# -- save and load -----------------------------------------------------------------------------------------
def save_checkpoint(
    accelerator,
    output_dir: str | Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer,
    scheduler,
    trainer_state: dict[str, Any],
    rng_state: dict[str, Any],
    training_args: dict[str, Any],
    save_total_limit: int | None = None,
) -> Path:
    """Write a checkpoint into ``step-N.tmp``, then rename it to ``step-N``. Every process must call
    this: the main process writes the shared files and the manifest, each process its RNG state.

    A write that fails on any process (``OSError``: disk full, permission, ...) removes ``step-N.tmp`` and
    raises :class:`CheckpointSaveError` on every process; earlier checkpoints are never touched before the
    new one is complete (``save_total_limit`` rotates them out afterwards)."""
    staging = staging_dir(output_dir, step)
    write_checkpoint_part(
        accelerator,
        staging,
        step,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        trainer_state=trainer_state,
        rng_state=rng_state,
    )
    return complete_checkpoint(accelerator, output_dir, step, training_args, save_total_limit)


def staging_dir(output_dir: str | Path, step: int) -> Path:
    """``step-N.tmp``: where the checkpoint of ``step`` is written before it is renamed to ``step-N``."""
    final = checkpoint_dir(output_dir, step)
    return final.with_name(final.name + ".tmp")


def write_checkpoint_part(
    accelerator,
    folder: Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer,
    scheduler,
    trainer_state: dict[str, Any],
    rng_state: dict[str, Any],
    staging: Path | None = None,
) -> None:
    """Write one model's state into ``folder``: the staging folder of the checkpoint of ``step`` (a leftover one is
    replaced), or one seed's folder inside it (``staging``; a checkpoint of several seeds). Every process must call
    this; a failed write removes the staging folder and raises :class:`CheckpointSaveError` on every process."""
    staging = folder if staging is None else staging
    state_dict = accelerator.get_state_dict(model)

    def shared_files() -> None:
        if folder.exists():
            shutil.rmtree(folder)  # left over from a run that died while saving
        folder.mkdir(parents=True)
        with quiet_progress():
            accelerator.unwrap_model(model).save_pretrained(folder, state_dict=state_dict)
        apply_umask(folder)
        write_state(folder, OPTIMIZER, optimizer.state_dict())
        write_state(folder, SCHEDULER, scheduler.state_dict())
        if accelerator.scaler is not None:
            write_state(folder, SCALER, accelerator.scaler.state_dict())
        (folder / TRAINER_STATE_FILE).write_text(json.dumps(trainer_state, indent=2))

    _write_or_fail(accelerator, staging, step, shared_files if accelerator.is_main_process else None)
    _write_or_fail(
        accelerator, staging, step, lambda: write_state(folder, rng_state_name(accelerator.process_index), rng_state)
    )


def complete_checkpoint(
    accelerator, output_dir: str | Path, step: int, training_args: dict[str, Any], save_total_limit: int | None = None
) -> Path:
    """Hash the written staging folder of ``step`` into its manifest and rename it to ``step-N`` (then rotate out the
    checkpoints beyond ``save_total_limit``); returns the checkpoint's folder."""
    final, staging = checkpoint_dir(output_dir, step), staging_dir(output_dir, step)
    main = accelerator.is_main_process

    def complete() -> None:
        write_manifest(staging, step, training_args)
        replace_dir(staging, final)

    _write_or_fail(accelerator, staging, step, complete if main else None)
    if main and save_total_limit is not None:
        try:
            rotate_checkpoints(output_dir, save_total_limit, protect=final)
        except OSError as err:  # the new checkpoint is complete: a leftover old one is no reason to stop
            warnings.warn(
                f"save_total_limit={save_total_limit}: could not remove an old checkpoint ({err})", stacklevel=4
            )
    accelerator.wait_for_everyone()
    return final


def as_os_error(err: BaseException) -> OSError:
    """An ``OSError`` for a failed write: itself, or the one a ``SafetensorError`` describes (safetensors reports
    the IO error of its Rust writer as text: ``IoError(Os { code: 28, ... })``)."""
    if isinstance(err, OSError):
        return err
    match = re.search(r"code:\s*(\d+)", str(err))
    if match:
        code = int(match.group(1))
        return OSError(code, os.strerror(code))
    return OSError(errno.EIO, f"{type(err).__name__}: {err}")


def _write_or_fail(accelerator, staging: Path, step: int, action) -> None:
    """Run ``action`` (None: nothing on this process), then agree across processes on whether any write failed;
    if one did, remove ``staging`` and raise :class:`CheckpointSaveError` on every process."""
    failure: OSError | None = None
    if action is not None:
        try:
            action()
        except (OSError, SafetensorError) as err:
            failure = as_os_error(err)
    failed = failure is not None
    if accelerator.num_processes > 1:
        flag = torch.tensor([float(failed)], device=accelerator.device)
        failed = bool(accelerator.reduce(flag, reduction="sum").item() > 0)
    if not failed:
        return
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
    accelerator.wait_for_everyone()
    if failure is None:
        failure = OSError(errno.EIO, "another process could not write its part of the checkpoint")
    what = failure.strerror or str(failure)
    where = f", writing {Path(failure.filename).name}" if failure.filename else ""
    raise CheckpointSaveError(
        f"could not write the checkpoint of step {step} ({staging}{where}): {what}"
        + (f" [errno {failure.errno}: {errno.errorcode.get(failure.errno, '?')}]" if failure.errno else ""),
        step=step,
        cause=failure,
    )


def replace_dir(staging: Path, final: Path) -> None:
    """Rename the complete ``staging`` folder to ``final``; a ``final`` already there is removed only once
    ``staging`` has taken its place (moved aside first, moved back if the rename fails)."""
    if not final.exists():
        os.replace(staging, final)
        return
    aside = final.with_name(final.name + ".replaced")
    if aside.exists():
        shutil.rmtree(aside)
    os.replace(final, aside)
    try:
        os.replace(staging, final)
    except OSError:
        os.replace(aside, final)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def load_checkpoint(
    directory: str | Path, manifest: dict[str, Any], accelerator, *, model: torch.nn.Module, optimizer, scheduler
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Load a verified checkpoint into the (prepared) model, optimizer and scheduler.

    Returns the trainer state and this process's RNG state (None if the checkpoint has none for
    this process index: it was written by fewer processes).
    """
    directory = Path(directory)
    listed = manifest["files"]
    _load_weights(accelerator.unwrap_model(model), directory, listed)
    try:
        optimizer.load_state_dict(read_state(directory, OPTIMIZER, listed))
        scheduler.load_state_dict(read_state(directory, SCHEDULER, listed))
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as err:
        if isinstance(err, CheckpointError):
            raise
        raise CheckpointError(
            f"checkpoint {directory}: the optimizer or scheduler state does not fit this run ({err})"
        ) from None
    if accelerator.scaler is not None:
        accelerator.scaler.load_state_dict(read_state(directory, SCALER, listed))
    trainer_state = read_json(directory, TRAINER_STATE_FILE, listed)
    name = rng_state_name(accelerator.process_index)
    rng_state = read_state(directory, name, listed) if f"{name}.json" in listed else None
    if rng_state is not None and not isinstance(rng_state, dict):
        raise CheckpointError(f"checkpoint {directory}: {name}.json must hold a mapping")
    return trainer_state, rng_state
