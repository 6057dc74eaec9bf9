"""One format for a finished run that is reused instead of trained again (every reproduction's run cache).

A run folder holds its models (``save_pretrained`` folders with their manifests: the folder itself for one model,
``seed<S>/`` for a seed-stacked group), optionally ``tensors.safetensors`` (curves, per-prompt errors: safetensors, so
nothing is unpickled) and, written last, ``run.json``::

    {"format": "hf_icl-run", "spec": {...}, "record": {...}, "tensors": ["losses", ...]}

``spec`` is everything the run depends on (a run is reused only when it equals the spec asked for), ``record`` what
the run measured that is not a tensor (JSON numbers and lists), ``tensors`` the names stored beside it. A folder
without ``run.json``, or with a ``run.json`` of another format (a cache written before this one), is trained again;
one that cannot be read back is a :class:`DamagedRunError` that says to rerun with ``--retrain``.

    >>> import tempfile, torch
    >>> folder = tempfile.mkdtemp()
    >>> write_run(folder, {"steps": 3}, record={"seconds": 1.5}, tensors={"losses": torch.ones(3)})
    >>> run = read_run(folder, {"steps": 3})
    >>> run.record["seconds"], run.tensors["losses"].tolist()
    (1.5, [1.0, 1.0, 1.0])
    >>> read_run(folder, {"steps": 4}) is None  # another spec: not this run
    True
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..files import apply_umask, write_atomically
from ..validation import one_line

__all__ = ["RUN_FILE", "RUN_FORMAT", "TENSORS_FILE", "DamagedRunError", "FinishedRun", "read_run", "write_run"]

RUN_FILE = "run.json"
TENSORS_FILE = "tensors.safetensors"
RUN_FORMAT = "hf_icl-run"


class DamagedRunError(ValueError):
    """A cached run folder that cannot be read back (a truncated or edited file): rerun with ``--retrain``."""


@dataclass
class FinishedRun:
    """A run read back: its folder, spec, record and tensors."""

    directory: Path
    spec: dict
    record: dict = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def write_run(
    directory: str | Path,
    spec: dict,
    *,
    record: dict | None = None,
    tensors: dict[str, torch.Tensor] | None = None,
) -> None:
    """Mark ``directory`` (its models already saved) a finished run of ``spec``: the tensors first, ``run.json``
    last and atomically, so a run cut short is never taken for a finished one."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = tensors or {}
    if tensors:
        from safetensors.torch import save_file

        save_file({name: t.detach().cpu().contiguous() for name, t in tensors.items()}, directory / TENSORS_FILE)
        apply_umask(directory / TENSORS_FILE)
    content = {"format": RUN_FORMAT, "spec": spec, "record": record or {}, "tensors": sorted(tensors)}
    write_atomically(directory / RUN_FILE, json.dumps(content, indent=1))


def read_run(directory: str | Path, spec: dict | None = None) -> FinishedRun | None:
    """The finished run in ``directory`` if there is one (of ``spec``, when given); None when the folder holds no
    finished run, one of another spec or of an older cache format."""
    path = Path(directory) / RUN_FILE
    if not path.is_file():
        return None
    try:
        content = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise DamagedRunError(f"cached run file {path} cannot be read ({err}); rerun with --retrain") from None
    if not isinstance(content, dict) or content.get("format") != RUN_FORMAT:
        return None  # a cache from before this format: trained again, never guessed at
    if spec is not None and content.get("spec") != spec:
        return None
    names = content.get("tensors", [])
    tensors = _read_tensors(Path(directory) / TENSORS_FILE) if names else {}
    if sorted(tensors) != sorted(names):
        raise DamagedRunError(
            f"cached run {directory}: {TENSORS_FILE} holds {sorted(tensors)}, run.json lists {sorted(names)}; "
            "rerun with --retrain"
        )
    return FinishedRun(Path(directory), content["spec"], content.get("record", {}), tensors)


def _read_tensors(path: Path) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (OSError, SafetensorError, ValueError) as err:
        raise DamagedRunError(
            f"cached run file {path} cannot be read ({one_line(err)}); rerun with --retrain"
        ) from None
