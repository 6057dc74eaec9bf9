"""Every benchmark's --help: its own usage line, its description as written, and each option's default."""

import contextlib
import io

import pytest

from hf_icl.benchmarks import BENCHMARKS
from hf_icl.cli import main


def _help(name: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        main(["bench", name, "--help"])
    assert stop.value.code == 0
    return out.getvalue()


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_bench_help_names_the_command_and_every_default(name, monkeypatch):
    from hf_icl.benchmarks.flags import BenchParser

    built = []
    original = BenchParser.__init__

    def recording_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(BenchParser, "__init__", recording_init)
    text = _help(name)
    assert text.startswith(f"usage: hf-icl bench {name} ")
    (parser,) = built  # the parser the benchmark built for this --help
    for action in parser._actions:
        has_default = action.default not in (None, False) and action.option_strings and action.dest != "help"
        if has_default and "default" not in (action.help or ""):
            assert f"(default: {action.default})" in " ".join(text.split()), (name, action.dest)
