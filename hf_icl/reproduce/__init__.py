"""``hf-icl reproduce PAPER EXPERIMENT``: one module per seed document, one function per figure.

Each experiment trains with the package's trainer, evaluates on fresh tasks and writes
``OUTPUT_DIR/PAPER/EXPERIMENT/results.md`` (plots, tables and a verdict for every claim of the
document: holds, does not hold, or not testable at this size) plus ``results.json``.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from ..validation import check_bool, check_choice, check_int, check_writable_dir
from . import gd_icl, kernel_icl, linear_attention, sgpt

#: paper name -> its module (``EXPERIMENTS`` and ``run``)
PAPERS = {"sgpt": sgpt, "linear-attention": linear_attention, "kernel-icl": kernel_icl, "gd-icl": gd_icl}
#: the papers whose studies train MLPs (``mlp_steps`` applies to them only)
MLP_PAPERS = ("sgpt",)


def experiments(paper: str) -> dict:
    """``{name: Experiment}`` of a paper."""
    check_choice("paper", paper, sorted(PAPERS))
    return PAPERS[paper].EXPERIMENTS


def check_options(paper: str, experiment: str, options: dict) -> None:
    """Refuse, before any work, what :func:`reproduce` would only find out later: an unknown paper, experiment or
    option, an output directory that cannot be created or written, a bad seed, step count or worker count."""
    check_choice("experiment", experiment, sorted(experiments(paper)))
    parameters = inspect.signature(PAPERS[paper].run).parameters
    known = [name for name in parameters if name != "experiment"]
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    for name in options:
        if name not in known and not open_ended:
            raise ValueError(f"reproduce {paper}: unknown option {name!r}; the options are {known}")
    if "output_dir" in options:
        check_writable_dir("output_dir", options["output_dir"])
    if "seed" in options:
        check_int("seed", options["seed"], low=0)
    for name in ("steps", "mlp_steps", "workers"):
        if options.get(name) is not None:
            check_int(name, options[name], low=1)
    for name in ("full", "retrain"):
        if name in options:
            check_bool(name, options[name])
    if "command" in options and not isinstance(options["command"], str):
        raise ValueError(f"command must be a string (the command line shown in results.md), got {options['command']!r}")
    if options.get("mlp_steps") is not None and paper not in MLP_PAPERS:
        raise ValueError(
            f"mlp_steps: the {paper} study trains no MLPs (only {', '.join(MLP_PAPERS)} does), "
            f"got mlp_steps={options['mlp_steps']}"
        )


def reproduce(paper: str, experiment: str, **options) -> Path:
    """Run ``experiment`` of ``paper``; ``options`` as in the paper module's ``run`` (``full``,
    ``output_dir``, ``seed``, ``retrain``, ``steps``). Returns the path of ``results.md``.
    Every argument is checked (:func:`check_options`) before any work starts."""
    check_options(paper, experiment, options)
    return PAPERS[paper].run(experiment, **options)
