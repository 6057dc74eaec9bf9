"""Flag checks shared by the benchmarks: every numeric flag is checked before any work, and a bad one ends the run
with ONE line ``hf-icl bench NAME: error: ...`` (exit status 2) naming the flag, the value and what is allowed."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from ..options import OptionParser, RawDescriptionDefaultsFormatter
from ..validation import check_device, check_float, check_int, check_memory


class BenchParser(OptionParser):
    """A benchmark's parser: its description as written, every option's default in its help, errors on one line (no
    usage block), exit status 2."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, formatter_class=RawDescriptionDefaultsFormatter, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_flags(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    ints: Mapping[str, tuple[int | None, int | None]] | None = None,
    floats: Mapping[str, tuple[float | None, float | None, bool]] | None = None,
) -> None:
    """Check ``args``: ``ints`` maps an attribute to its inclusive ``(low, high)``, ``floats`` to ``(low, high,
    low_inclusive)`` (None: unbounded); unset (None) flags pass, and a list flag is checked element by element."""
    try:
        for name, (low, high) in (ints or {}).items():
            for flag, value in _values(name, getattr(args, name)):
                check_int(flag, value, low=low, high=high)
        for name, (low, high, low_inclusive) in (floats or {}).items():
            for flag, value in _values(name, getattr(args, name)):
                check_float(flag, value, low=low, high=high, low_inclusive=low_inclusive)
    except ValueError as err:
        parser.error(str(err))


def _values(name: str, value):
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [(f"{_flag(name)}[{i}]", item) for i, item in enumerate(value)]
    return [(_flag(name), value)]


def bench_device(parser: argparse.ArgumentParser, value, flag: str = "--device"):
    """``value`` as a ``torch.device`` that exists on this machine, else a one-line error naming ``flag``."""
    try:
        return check_device(flag, value)
    except ValueError as err:
        parser.error(str(err))


def bench_memory(parser: argparse.ArgumentParser, flags: str, nbytes: float, device=None, what: str = "its tensors"):
    """A one-line error naming ``flags`` when ``nbytes`` (a lower bound of what the run allocates) exceeds the
    memory of ``device``."""
    try:
        check_memory(flags, nbytes, device, what=what)
    except ValueError as err:
        parser.error(str(err))
