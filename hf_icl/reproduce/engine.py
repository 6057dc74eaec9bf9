"""One way to run every reproduction: :func:`run_experiment` checks the options, picks the size, writes the report.

A paper package describes itself with a :class:`~.report.Paper` (``PAPER_SPEC``): its experiments, its CPU and full
sizes, how a run's size reads in the report and the experiment state its experiments run on. Everything else (the
options a user may pass, where results go, the report's header and ``results.md``) is the same for every paper, here.
"""

from __future__ import annotations

from pathlib import Path

from ..validation import check_bool, check_choice, check_int, check_writable_dir
from . import gd_icl, kernel_icl, linear_attention, sgpt
from .report import Paper, Report, RunOptions, log

#: paper name -> its description
PAPERS: dict[str, Paper] = {
    module.PAPER_SPEC.name: module.PAPER_SPEC for module in (sgpt, linear_attention, kernel_icl, gd_icl)
}
#: the papers whose studies train MLPs (``mlp_steps`` applies to them only)
MLP_PAPERS = tuple(name for name, paper in PAPERS.items() if paper.trains_mlps)


def experiments(paper: str) -> dict:
    """``{name: Experiment}`` of a paper."""
    check_choice("paper", paper, sorted(PAPERS))
    return PAPERS[paper].experiments


#: the options :func:`run_experiment` takes, and their defaults
OPTIONS = {
    "full": False,
    "output_dir": "outputs/reproduce",
    "seed": 0,
    "retrain": False,
    "steps": None,
    "mlp_steps": None,
    "command": "",
    "scale": None,
    "workers": None,
}


def run_experiment(paper: str, experiment: str, **options) -> Path:
    """Run ``experiment`` of ``paper`` and return the path of its ``results.md`` (``OUTPUT_DIR/PAPER/EXPERIMENT``).

    Options (:data:`OPTIONS`): ``full`` runs the document's sizes (default: CPU-sized); ``output_dir``; ``seed``
    shifts every seed; ``retrain`` ignores finished runs; ``steps`` replaces every model's training steps
    (``mlp_steps`` the MLPs', papers that train MLPs only); ``workers`` is the number of training processes (default
    one per core; 1 trains in this process); ``scale`` replaces the sizes altogether (tests); ``command`` is the
    command line the report shows. Every option is checked before any work starts. Worker processes are spawned, so a
    script that calls this with more than one worker must do so under ``if __name__ == "__main__":`` (the ``hf-icl``
    command does).
    """
    check_options(paper, experiment, options)
    given = {**OPTIONS, **options}
    spec = PAPERS[paper]
    run = RunOptions(**{name: given[name] for name in ("seed", "retrain", "steps", "mlp_steps", "workers", "full")})
    scale = given["scale"] or (spec.full if run.full else spec.cpu)
    root = Path(given["output_dir"]) / spec.name
    out = root / experiment
    size = spec.describe(scale, experiment, run)
    report = Report(spec.name, experiment, spec.experiments[experiment].title, size, given["command"], out)
    log(f"{spec.name} {experiment}: {report.title} — {size}")
    note = spec.cpu_note(scale) if spec.cpu_note is not None else None
    if note:
        log(note)
    spec.experiments[experiment].run(spec.start(scale, out, root / "runs", report, run))
    return report.write()


def check_options(paper: str, experiment: str, options: dict) -> None:
    """Refuse, before any work, what :func:`run_experiment` would only find out later: an unknown paper, experiment or
    option, an output directory that cannot be created or written, a bad seed, step count or worker count."""
    check_choice("experiment", experiment, sorted(experiments(paper)))
    for name in options:
        if name not in OPTIONS:
            raise ValueError(f"reproduce {paper}: unknown option {name!r}; the options are {list(OPTIONS)}")
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
            f"--mlp-steps: the {paper} study trains no MLPs (only {', '.join(MLP_PAPERS)} does), "
            f"got mlp_steps={options['mlp_steps']}"
        )
