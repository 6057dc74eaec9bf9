"""Files the package writes get the permissions the user's umask gives new files (0644 under the usual 022), also
where a library wrote them through a private temporary file (0600); a file replaced in one step
(:func:`write_atomically`) is never seen half written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def umask_mode() -> int:
    """``0o666`` less the process's umask (read by setting it and putting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def apply_umask(*paths: str | Path) -> None:
    """Give every regular file among ``paths`` (files, or folders: every file directly in them) the umask's mode."""
    mode = umask_mode()
    for path in map(Path, paths):
        for file in path.iterdir() if path.is_dir() else [path]:
            if file.is_file() and not file.is_symlink():
                os.chmod(file, mode)


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` in one step: a temporary file beside it, then ``os.replace``."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        apply_umask(temporary)  # mkstemp's file is private (0600); the result is an ordinary file of the user's
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
