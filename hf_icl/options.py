"""One spelling rule for every command line of the package: each long option is accepted both as
``--n-prompts`` and as ``--n_prompts``, as transformers' ``HfArgumentParser`` does for ``hf-icl train``."""

from __future__ import annotations

import argparse


def both_spellings(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` plus the other spelling of every long option (``--a-b`` ↔ ``--a_b``), without duplicates."""
    spelled = list(names)
    for name in names:
        if name.startswith("--"):
            body = name[2:]
            for other in (body.replace("-", "_"), body.replace("_", "-")):
                if f"--{other}" not in spelled:
                    spelled.append(f"--{other}")
    return tuple(spelled)


class OptionParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose long options take both spellings; its sub-command parsers do too.

    >>> parser = OptionParser(prog="demo")
    >>> _ = parser.add_argument("--n-prompts", type=int, default=1)
    >>> parser.parse_args(["--n_prompts", "3"]).n_prompts, parser.parse_args(["--n-prompts", "4"]).n_prompts
    (3, 4)
    """

    def add_argument(self, *names, **kwargs):
        return super().add_argument(*both_spellings(names), **kwargs)
