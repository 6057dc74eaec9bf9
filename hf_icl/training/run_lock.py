"""One run per output directory: a lock file against concurrent runs, and a guard against reuse.

``OUTPUT_DIR/train.lock`` holds the PID and host of the run that writes the directory. A second
run finds it and stops with a one-line error; a lock whose PID is no longer alive on this host
(the run was killed) is stale and taken over with a warning. Only the main process takes it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
import uuid
import warnings
from pathlib import Path

from .run_files import SEED_DIR_PREFIX

LOCK_FILE = "train.lock"
CHECKPOINTS = "checkpoints"
_CHECKPOINT_ENTRY = re.compile(r"^step-\d+(\.tmp)?$")
#: files a training run writes into its output directory; any of them (or a checkpoint) marks a run
RUN_FILES = ("training_args.json", "config.json", "model.safetensors", "model.safetensors.index.json")
#: what ``overwrite_output_dir`` also removes: the plot, the metrics and curve files, a generation config, weight shards
RUN_OUTPUTS = ("context_scaling.png", "metrics.json", "context_scaling.csv", "generation_config.json", "manifest.json")
TRACKER_DIR = "hf_icl"  # accelerate's tensorboard logs: OUTPUT_DIR/<project name>
MODEL_CARD = "README.md"


class OutputDirError(ValueError):
    """The output directory is in use by another run, or holds one."""


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    except OSError:
        return False
    return True


class RunLock:
    """``with RunLock(output_dir):`` holds ``output_dir/train.lock`` for the duration of a run."""

    def __init__(self, output_dir: str | Path):
        self.path = Path(output_dir) / LOCK_FILE
        self.token = uuid.uuid4().hex
        self.held = False

    def _content(self) -> str:
        return json.dumps(
            {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "token": self.token}
        )

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            if self._create():
                self.held = True
                return self
            holder = self._read()
            if holder is None:  # vanished between our attempt and the read: try again
                continue
            pid, host = holder.get("pid"), holder.get("host")
            stale = host == socket.gethostname() and isinstance(pid, int) and not pid_alive(pid)
            if not stale:
                raise OutputDirError(self._held_message(holder))
            warnings.warn(
                f"output_dir {self.path.parent}: taking over the stale lock {self.path} of PID {pid} on {host}, "
                "which is no longer running",
                stacklevel=3,
            )
            temporary = self.path.with_name(f"{LOCK_FILE}.{self.token}")
            temporary.write_text(self._content())
            os.replace(temporary, self.path)
            if self._read_token() == self.token:
                self.held = True
                return self
        holder = self._read() or {}
        raise OutputDirError(self._held_message(holder))

    def release(self) -> None:
        if self.held and self._read_token() == self.token:
            self.path.unlink(missing_ok=True)
        self.held = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    # -- internals --------------------------------------------------------------------------------------
    def _create(self) -> bool:
        """Atomically create the lock with our content; False if it exists."""
        temporary = self.path.with_name(f"{LOCK_FILE}.{self.token}")
        temporary.write_text(self._content())
        try:
            os.link(temporary, self.path)  # fails if the lock exists; the lock appears complete
            return True
        except FileExistsError:
            return False
        except OSError:  # a filesystem without hard links
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as handle:
                handle.write(self._content())
            return True
        finally:
            temporary.unlink(missing_ok=True)

    def _read(self) -> dict | None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        try:
            holder = json.loads(text)
        except json.JSONDecodeError:
            holder = None
        return holder if isinstance(holder, dict) else {"unreadable": text[:80]}

    def _read_token(self) -> str | None:
        holder = self._read()
        return holder.get("token") if holder else None

    def _held_message(self, holder: dict) -> str:
        who = f"PID {holder.get('pid')!r} on host {holder.get('host')!r}" if "pid" in holder else "an unknown process"
        return (
            f"output_dir {str(self.path.parent)!r} is in use by another training run ({who}, lock file {self.path}); "
            "wait for it to finish, choose another output_dir, or delete the lock file if that run is gone"
        )


def _checkpoint_entries(output_dir: Path) -> list[Path]:
    root = output_dir / CHECKPOINTS
    return [p for p in root.iterdir() if _CHECKPOINT_ENTRY.match(p.name)] if root.is_dir() else []


def existing_run(output_dir: str | Path) -> list[str]:
    """The files and folders in ``output_dir`` that show another run wrote it (empty if none): a run of several
    seeds shows as its ``seed-S`` folders."""
    output_dir = Path(output_dir)
    found = [CHECKPOINTS] if _checkpoint_entries(output_dir) else []
    found += [folder.name for folder in _seed_runs(output_dir)]
    return found + [name for name in RUN_FILES if (output_dir / name).exists()]


def _seed_runs(output_dir: Path) -> list[Path]:
    """The ``seed-S`` folders of ``output_dir`` that hold a run (the final model folders of a run of several seeds)."""
    if not output_dir.is_dir():
        return []
    folders = sorted(p for p in output_dir.glob(f"{SEED_DIR_PREFIX}*") if p.is_dir() and not p.is_symlink())
    return [folder for folder in folders if existing_run(folder)]


def remove_run(output_dir: str | Path) -> list[str]:
    """Delete what a previous run wrote into ``output_dir``: its checkpoints, weights, arguments, plot,
    tensorboard logs and model card. Only what hf_icl writes is touched (the model card and the log
    folder only if they are hf_icl's); other files stay. Returns the names removed."""
    output_dir = Path(output_dir)
    removed = []
    for folder in _seed_runs(output_dir):  # a run of several seeds: every seed's final model folder
        remove_run(folder)
        if not any(folder.iterdir()):
            folder.rmdir()
        removed.append(folder.name)
    entries = _checkpoint_entries(output_dir)
    for entry in entries:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    if entries:
        removed.append(CHECKPOINTS)
        if not any((output_dir / CHECKPOINTS).iterdir()):
            (output_dir / CHECKPOINTS).rmdir()
    shards = sorted(p.name for p in output_dir.glob("model-*-of-*.safetensors"))
    for name in [*RUN_FILES, *RUN_OUTPUTS, *shards]:
        path = output_dir / name
        if path.is_file() or path.is_symlink():
            path.unlink()
            removed.append(name)
    logs = output_dir / TRACKER_DIR
    if logs.is_dir() and all(p.is_dir() or _is_tensorboard_file(p.name) for p in logs.rglob("*")):
        shutil.rmtree(logs)
        removed.append(TRACKER_DIR)
    card = output_dir / MODEL_CARD
    if card.is_file() and "library_name: hf_icl" in card.read_text(errors="replace"):
        card.unlink()
        removed.append(MODEL_CARD)
    return removed


def _is_tensorboard_file(name: str) -> bool:
    return name.startswith("events.out.tfevents.") or name in ("hparams.yml", "projector_config.pbtxt")
