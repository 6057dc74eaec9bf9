"""One spelling rule for every command line of the package: each long option is accepted both as
``--n-prompts`` and as ``--n_prompts``, as transformers' ``HfArgumentParser`` does for ``hf-icl train``."""

from __future__ import annotations

import argparse
import copy

from hf_icl_cli.argument_types import below_minimum


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

    def add_argument(self, *names, minimum: int | None = None, **kwargs):
        """``minimum``: the least an integer flag (each element of a list flag) may be, checked right after parsing
        (and written down for the torch-free front door, :mod:`hf_icl_cli.early_checks`)."""
        action = super().add_argument(*both_spellings(names), **kwargs)
        action.minimum = minimum
        return action

    def parse_known_args(self, args=None, namespace=None):
        namespace, rest = super().parse_known_args(args, namespace)
        for action in self._actions:
            refusal = below_minimum(
                action.option_strings[0] if action.option_strings else action.dest,
                getattr(namespace, action.dest, None),
                getattr(action, "minimum", None),
            )
            if refusal is not None:
                raise ValueError(refusal)  # the command's one-line error, as every other value check
        return namespace, rest


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" unless the help already says what the default is or there is none (None)."""

    def _get_help_string(self, action):
        if action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)

    def _format_action(self, action):
        if not action.help and action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            action = copy.copy(action)  # an option without help still says its default
            action.help = "(default: %(default)s)"
        return super()._format_action(action)


class RawDescriptionDefaultsFormatter(argparse.RawDescriptionHelpFormatter, DefaultsFormatter):
    """A description printed as written (a module docstring with its examples) and every option's default."""
