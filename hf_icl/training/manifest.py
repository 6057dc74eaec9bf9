"""``manifest.json``: what a checkpoint holds, and the check that it still holds exactly that.

Every checkpoint directory carries a manifest with the format name and version, the step, the
full training arguments and the sha256 and size of every other file in the directory. Resuming
verifies the manifest before anything is read, and a missing, truncated or altered file is a
one-line :class:`CheckpointError` that names it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path, PurePosixPath
from typing import Any

MANIFEST_FILE = "manifest.json"
FORMAT_NAME = "hf_icl-checkpoint"
FORMAT_VERSION = 1
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


def checkpoint_files(directory: str | Path) -> list[str]:
    """Every regular file under ``directory`` but the manifest, as sorted POSIX paths relative to it."""
    root = Path(directory)
    found = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    return sorted(name for name in found if name != MANIFEST_FILE)


def write_manifest(directory: str | Path, step: int, training_args: dict[str, Any]) -> dict[str, Any]:
    """Hash every file in ``directory`` and write ``manifest.json`` beside them (call it last)."""
    directory = Path(directory)
    files = {
        name: {"sha256": sha256_file(directory / name), "bytes": (directory / name).stat().st_size}
        for name in checkpoint_files(directory)
    }
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "step": step,
        "training_args": training_args,
        "files": files,
    }
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, allow_nan=False) + "\n")
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
    try:
        manifest = json.loads(path.read_text(), parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as err:
        raise CheckpointError(f"{where}: {MANIFEST_FILE} is not valid JSON ({err})") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{where}: {MANIFEST_FILE} must hold a JSON object")
    if manifest.get("format") != FORMAT_NAME:
        raise CheckpointError(f"{where}: {MANIFEST_FILE} has format {manifest.get('format')!r}, not {FORMAT_NAME!r}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{where}: {MANIFEST_FILE} has format_version {manifest.get('format_version')!r}; this hf_icl reads "
            f"version {FORMAT_VERSION}"
        )
    step = manifest.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"{where}: {MANIFEST_FILE} has step {step!r}, not a non-negative integer")
    if not isinstance(manifest.get("training_args"), dict):
        raise CheckpointError(f"{where}: {MANIFEST_FILE} has no training_args object")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise CheckpointError(f"{where}: {MANIFEST_FILE} has no files object")
    for name, entry in files.items():
        if not _is_inner_path(name):
            raise CheckpointError(f"{where}: {MANIFEST_FILE} lists {name!r}, not a path inside the checkpoint")
        ok = (
            isinstance(entry, dict)
            and isinstance(entry.get("sha256"), str)
            and _SHA256.match(entry["sha256"])
            and isinstance(entry.get("bytes"), int)
            and not isinstance(entry.get("bytes"), bool)
            and entry["bytes"] >= 0
        )
        if not ok:
            raise CheckpointError(f"{where}: {MANIFEST_FILE} has an invalid entry for {name}: {entry!r}")
    return manifest


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
    for name, entry in sorted(files.items()):
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"{where}: file {name} listed in {MANIFEST_FILE} is missing")
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise CheckpointError(
                f"{where}: file {name} has {size} bytes, {MANIFEST_FILE} says {entry['bytes']} (truncated or altered)"
            )
        if sha256_file(path) != entry["sha256"]:
            raise CheckpointError(f"{where}: file {name} is corrupted (its sha256 differs from {MANIFEST_FILE})")
    unlisted = [name for name in checkpoint_files(directory) if name not in files]
    return manifest, unlisted


def _is_inner_path(name: Any) -> bool:
    if not isinstance(name, str) or not name or "\\" in name or name == MANIFEST_FILE:
        return False
    path = PurePosixPath(name)
    return not path.is_absolute() and all(part not in ("", ".", "..") for part in path.parts)


def _reject_constant(token: str) -> float:
    # NaN / Infinity never appear in a manifest we write (allow_nan=False)
    if token in ("NaN", "Infinity", "-Infinity"):
        raise ValueError(f"{token} is not allowed")
    return math.nan  # pragma: no cover - json only passes the three tokens above
