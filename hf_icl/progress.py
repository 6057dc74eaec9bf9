"""Progress for long loops: a tqdm bar at a terminal, plain lines in a log file (a bar redraws with carriage returns:
right at a terminal, megabytes of noise in a file), nothing when switched off."""

from __future__ import annotations

import sys
from contextlib import contextmanager


class PlainProgress:
    """tqdm's ``update`` / ``set_postfix`` / ``close`` as one line per tenth of the work (and the last), no ``\\r``."""

    def __init__(self, total: int, desc: str, stream=None):
        self.total, self.desc, self.done, self.postfix = max(int(total), 0), desc, 0, {}
        self.stream = sys.stderr if stream is None else stream
        self.next_report = self._step()

    def _step(self) -> int:
        return self.done + max(1, -(-self.total // 10))

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.done >= self.next_report or self.done == self.total:
            shown = "".join(f", {key} {value}" for key, value in self.postfix.items())
            print(f"{self.desc}: {self.done}/{self.total}{shown}", file=self.stream, flush=True)
            self.next_report = self._step()

    def set_postfix(self, refresh: bool = True, **values) -> None:
        self.postfix = values

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, enabled: bool = True):
    """A tqdm bar when stderr is a terminal, :class:`PlainProgress` lines when it is not, silence when not
    ``enabled``."""
    from tqdm.auto import tqdm

    if enabled and not sys.stderr.isatty():
        return PlainProgress(total, desc)
    return tqdm(total=total, desc=desc, disable=not enabled, dynamic_ncols=True)


@contextmanager
def quiet_library_bars():
    """No tqdm bar inside the block when stderr is not a terminal, whoever draws it: transformers (weights, GGUF
    de-quantisation), datasets (splits, saving), huggingface_hub. Their bars redraw with carriage returns, which a log
    file keeps as one long line of noise; at a terminal they stay. (The package's own long loops print
    :class:`PlainProgress` lines instead, so a log still shows progress.)"""
    if sys.stderr.isatty():
        yield
        return
    from tqdm import std

    original = vars(std.tqdm)["__init__"]  # as stored (tqdm wraps it in a partialmethod that reads TQDM_* variables)
    start = std.tqdm.__init__

    def silent_init(self, *args, **kwargs):
        kwargs["disable"] = True
        start(self, *args, **kwargs)

    std.tqdm.__init__ = silent_init  # every tqdm class (auto, asyncio, the libraries' subclasses) starts here
    try:
        yield
    finally:
        std.tqdm.__init__ = original
