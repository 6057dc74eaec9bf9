"""``manifest.json``: the sha256 and size of the files of a checkpoint or a final model folder.

Two formats share one file name and one ``files`` table (``{"name": {"sha256": ..., "bytes": ...}}``):

- ``hf_icl-checkpoint`` (a training checkpoint): the format name and version, the step, the full training
  arguments and every other file of the directory (:func:`write_manifest`, :func:`verify_checkpoint`);
- ``hf_icl-model`` (a final model folder: the trainer's output directory, the zoo's ``models/*``): the model
  files only (config, weights, generation config, training arguments), written by
  :func:`hf_icl.modeling.model_folder.write_model_manifest`.

The manifest is an unkeyed list of sha256 digests. It guards against accidents (a truncated file, a disk
error, a partial copy, a file edited by mistake), which it turns into a one-line error naming the file; it
does not guard against a deliberate edit that rewrites the manifest too (nothing here is signed).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path, PurePosixPath
from typing import Any

from ..validation import one_line

MANIFEST_FILE = "manifest.json"
FORMAT_NAME = "hf_icl-checkpoint"
FORMAT_VERSION = 1
MODEL_FORMAT_NAME = "hf_icl-model"
MODEL_FORMAT_VERSION = 1
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20


class CheckpointError(ValueError):
    """A checkpoint that cannot be trusted or used: missing, incomplete, corrupted or incompatible."""


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_entry(path: str | Path) -> dict[str, Any]:
    """``{"sha256": ..., "bytes": ...}`` of one file, as a manifest lists it."""
    return {"sha256": sha256_file(path), "bytes": Path(path).stat().st_size}


def checkpoint_files(directory: str | Path) -> list[str]:
    """Every regular file under ``directory`` but the manifest, as sorted POSIX paths relative to it."""
    root = Path(directory)
    found = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    return sorted(name for name in found if name != MANIFEST_FILE)


def write_manifest(directory: str | Path, step: int, training_args: dict[str, Any]) -> dict[str, Any]:
    """Hash every file in ``directory`` and write ``manifest.json`` beside them (call it last)."""
    directory = Path(directory)
    files = {name: file_entry(directory / name) for name in checkpoint_files(directory)}
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "step": step,
        "training_args": training_args,
        "files": files,
    }
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, allow_nan=False) + "\n")
    return manifest


def load_manifest_json(directory: str | Path, where: str, error: type[ValueError] = CheckpointError) -> dict:
    """The JSON object in ``directory/manifest.json`` (``error`` naming ``where`` if it is not one)."""
    path = Path(directory) / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text(), parse_constant=reject_json_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as err:
        raise error(f"{where}: {MANIFEST_FILE} is not valid JSON ({one_line(err)})") from None
    if not isinstance(manifest, dict):
        raise error(f"{where}: {MANIFEST_FILE} must hold a JSON object")
    return manifest


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """Parse and check the structure of ``directory/manifest.json`` (the files are not hashed here)."""
    directory = Path(directory)
    path = directory / MANIFEST_FILE
    where = f"checkpoint {directory}"
    if not path.is_file():
        raise CheckpointError(
            f"{where}: {MANIFEST_FILE} is missing, so the checkpoint cannot be verified (folders written by "
            "older hf_icl with accelerate's pickled save_state are not loaded: unpickling can run code)"
        )
    manifest = load_manifest_json(directory, where)
    return check_checkpoint_manifest(manifest, where)


def check_checkpoint_manifest(
    manifest: dict[str, Any], where: str, error: type[ValueError] = CheckpointError
) -> dict[str, Any]:
    """Check the structure of a parsed ``hf_icl-checkpoint`` manifest; return it."""
    if manifest.get("format") != FORMAT_NAME:
        raise error(f"{where}: {MANIFEST_FILE} has format {manifest.get('format')!r}, not {FORMAT_NAME!r}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise error(
            f"{where}: {MANIFEST_FILE} has format_version {manifest.get('format_version')!r}; this hf_icl reads "
            f"version {FORMAT_VERSION}"
        )
    step = manifest.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise error(f"{where}: {MANIFEST_FILE} has step {step!r}, not a non-negative integer")
    if not isinstance(manifest.get("training_args"), dict):
        raise error(f"{where}: {MANIFEST_FILE} has no training_args object")
    check_manifest_files(manifest, where, error)
    return manifest


def check_manifest_files(manifest: dict[str, Any], where: str, error: type[ValueError] = CheckpointError) -> None:
    """Check the ``files`` table of a parsed manifest: inner paths, each with a sha256 and a byte count."""
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise error(f"{where}: {MANIFEST_FILE} has no files object")
    for name, entry in files.items():
        if not is_inner_path(name):
            raise error(f"{where}: {MANIFEST_FILE} lists {name!r}, not a path inside the folder")
        ok = (
            isinstance(entry, dict)
            and isinstance(entry.get("sha256"), str)
            and _SHA256.match(entry["sha256"])
            and isinstance(entry.get("bytes"), int)
            and not isinstance(entry.get("bytes"), bool)
            and entry["bytes"] >= 0
        )
        if not ok:
            raise error(f"{where}: {MANIFEST_FILE} has an invalid entry for {name}: {entry!r}")


def verify_listed_files(
    directory: str | Path, manifest: dict[str, Any], where: str, error: type[ValueError] = CheckpointError
) -> None:
    """Check every file ``manifest`` lists against its size and sha256; ``error`` names the first bad one."""
    directory = Path(directory)
    for name, entry in sorted(manifest["files"].items()):
        path = directory / name
        if not path.is_file():
            raise error(f"{where}: file {name} listed in {MANIFEST_FILE} is missing")
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise error(
                f"{where}: file {name} has {size} bytes, {MANIFEST_FILE} says {entry['bytes']} (truncated or altered)"
            )
        if sha256_file(path) != entry["sha256"]:
            raise error(f"{where}: file {name} is corrupted (its sha256 differs from {MANIFEST_FILE})")


def verify_checkpoint(directory: str | Path, required: tuple[str, ...] = ()) -> tuple[dict[str, Any], list[str]]:
    """Check every file the manifest lists against its size and sha256, and that ``required`` are listed.

    Returns the manifest and the files present but not listed (never read; the caller may warn).
    Raises :class:`CheckpointError` naming the first missing, truncated or altered file.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    where = f"checkpoint {directory}"
    files = manifest["files"]
    for name in required:
        if name not in files:
            present = "present but not listed in" if (directory / name).exists() else "missing, and not in"
            raise CheckpointError(f"{where}: required file {name} is {present} {MANIFEST_FILE}")
    verify_listed_files(directory, manifest, where)
    unlisted = [name for name in checkpoint_files(directory) if name not in files]
    return manifest, unlisted


def is_inner_path(name: Any) -> bool:
    if not isinstance(name, str) or not name or "\\" in name or name == MANIFEST_FILE:
        return False
    path = PurePosixPath(name)
    return not path.is_absolute() and all(part not in ("", ".", "..") for part in path.parts)


def reject_json_constant(token: str) -> float:
    # NaN / Infinity never appear in a manifest we write (allow_nan=False)
    if token in ("NaN", "Infinity", "-Infinity"):
        raise ValueError(f"{token} is not allowed")
    return math.nan  # pragma: no cover - json only passes the three tokens above
