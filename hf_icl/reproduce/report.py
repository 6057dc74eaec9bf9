"""What every reproduction shares: training a model for one curve, scoring it, judging a claim, reporting.

A reproduction trains its models with the package's training stack (the trainer, or its seed-stacked variant for
many small seeds at once), evaluates them with :func:`~hf_icl.evaluation.evaluate_context_scaling`
on fresh tasks, and writes ``results.md`` (tables, plots, one verdict per claim of the document) and
``results.json`` (every number) to its output directory. Every finished run is cached in one format
(:mod:`hf_icl.training.run_cache`: ``run.json`` beside the models) and reused when its spec is unchanged, so
re-running an experiment to redraw its report costs only the evaluation.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import torch

from ..training import ICLTrainingArguments, train
from ..training.run_cache import DamagedRunError as DamagedRunError  # where reproductions raised it before
from ..training.run_cache import read_run, write_run

#: the three verdicts a results doc may give a claim
VERDICTS = ("holds", "does not hold", "not testable at this size")
#: arguments that do not change what a training run learns (a run differing only in these is reused)
_BOOKKEEPING = ("output_dir", "overwrite_output_dir", "disable_tqdm", "report_to", "run_name", "resume_from_checkpoint")


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def train_or_reuse(run_dir: Path, *, retrain: bool = False, **arguments) -> torch.nn.Module:
    """Train a model with :class:`ICLTrainingArguments` ``arguments`` into ``run_dir``, or load the model
    already there if it was trained with the same arguments (``retrain`` forces a fresh run)."""
    args = ICLTrainingArguments(
        output_dir=str(run_dir),
        overwrite_output_dir=True,
        report_to="none",
        disable_tqdm=not sys.stderr.isatty(),  # a bar for a person at a terminal, clean logs otherwise
        eval_steps=0,
        save_steps=0,
        eval_prompts=arguments.pop("eval_prompts", 256),
        **arguments,
    )
    spec = _run_spec(args.to_dict())
    if not retrain and read_run(run_dir, spec) is not None:
        from transformers import AutoModel

        log(f"reusing {run_dir} (trained with the same arguments)")
        return AutoModel.from_pretrained(run_dir).eval()
    started = time.perf_counter()
    batch = args.per_device_train_batch_size
    log(f"training {run_dir.name}: {args.model_type}, {args.max_steps} steps × {batch} prompts")
    result = train(args)
    final = result.final_metrics.get("eval/loss", float("nan"))
    seconds = time.perf_counter() - started
    write_run(run_dir, spec, record={"seconds": seconds})  # the trainer wrote the model folder; this marks it reusable
    log(f"  done in {seconds:.0f} s, final eval loss {final:.4f}")
    return result.model.eval()


def _run_spec(arguments: dict) -> dict:
    """What a training run learns from: its arguments less the bookkeeping ones."""
    return {k: v for k, v in arguments.items() if k not in _BOOKKEEPING}


def model_fields(**fields) -> str:
    """``model_overrides`` for the trainer, from keyword fields."""
    return json.dumps(fields, sort_keys=True)


# -- claims -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Experiment:
    """A reproducible figure or table: its title and the function that runs it on its paper's experiment state."""

    title: str
    run: Callable[[Any], None]


@dataclass(kw_only=True)
class RunOptions:
    """What a user may change of a paper's run (``hf-icl reproduce`` flags): seeds shifted by ``seed``, finished runs
    retrained, every model's ``steps`` (the MLPs' ``mlp_steps``), the number of training processes, the full sizes.
    Keyword-only, so an experiment state that extends it keeps its own positional fields first."""

    seed: int = 0
    retrain: bool = False
    steps: int | None = None
    mlp_steps: int | None = None
    workers: int | None = None
    full: bool = False


@dataclass
class ExperimentStateBase(RunOptions):
    """What every experiment of every paper runs on: its sizes, where it writes (``output_dir``; finished runs under
    ``runs_dir``), its report, and the user's :class:`RunOptions`. A paper's ``ExperimentState`` adds what its
    experiments share (measured tables, runs trained once per call)."""

    scale: Any
    output_dir: Path
    runs_dir: Path
    report: Report

    @classmethod
    def begin(cls, scale: Any, output_dir: Path, runs_dir: Path, report: Report, options: RunOptions):
        """The state a :class:`Paper`'s ``start`` returns: the sizes and paths as given, every option copied."""
        return cls(scale, output_dir, runs_dir, report, **asdict(options))


@dataclass(frozen=True)
class Paper:
    """What :func:`~hf_icl.reproduce.engine.run_experiment` needs of a seed document: its name, experiments and two
    sizes (CPU, the document's), the line that describes a run's size, the experiment state it starts (``start(scale,
    output_dir, runs_dir, report, options)``) and, for a CPU-sized run, a note on what is smaller than the document."""

    name: str
    experiments: dict[str, Experiment]
    cpu: Any
    full: Any
    describe: Callable[[Any, str, RunOptions], str]
    start: Callable[[Any, Path, Path, Report, RunOptions], Any]
    cpu_note: Callable[[Any], str] | None = None
    trains_mlps: bool = False


@dataclass
class Claim:
    """One claim of the document, our measurement and the verdict at the size run."""

    claim: str
    document: str
    measured: str
    verdict: str

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")


#: a model learned something when its error went below this fraction of the trivial predictor's
LEARNED_FACTOR = 0.9


@dataclass(frozen=True)
class Subject:
    """A model or baseline a claim is about, with its error and the trivial predictor's on the same prompts.

    Errors are lower-is-better (squared error, NLL, 1 − accuracy); ``trivial`` is what the predictor that ignores
    the context gets (zero / the mean label, the uniform distribution, the majority class). A ``"model"`` is
    testable when it learned something: its error went below :data:`LEARNED_FACTOR` × trivial. A ``"baseline"``
    is testable when it beats the trivial predictor at all (a claim of beating a baseline worse than predicting
    zero says nothing).

    >>> Subject("SGPT", error=0.95, trivial=1.0).testable  # not below 0.9 × trivial
    False
    >>> Subject("XGBoost", error=1.3, trivial=1.0, kind="baseline").reason
    'XGBoost is worse than the trivial predictor (1.3 vs 1)'
    """

    name: str
    error: float
    trivial: float
    kind: str = "model"

    def __post_init__(self):
        if self.kind not in ("model", "baseline"):
            raise ValueError(f"kind must be 'model' or 'baseline', got {self.kind!r}")
        for name in ("error", "trivial"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
        if not self.trivial > 0:
            raise ValueError(f"trivial must be a positive error, got {self.trivial!r}")

    @property
    def testable(self) -> bool:
        if not math.isfinite(self.error):
            return False
        bound = LEARNED_FACTOR * self.trivial if self.kind == "model" else self.trivial
        return self.error < bound

    @property
    def reason(self) -> str:
        """Why a claim about it cannot be judged ("" when it can)."""
        if self.testable:
            return ""
        if self.kind == "model":
            return f"{self.name} learned nothing ({self.error:.3g} vs the trivial predictor's {self.trivial:.3g})"
        return f"{self.name} is worse than the trivial predictor ({self.error:.3g} vs {self.trivial:.3g})"


def judge(holds: bool | None, subjects: Sequence[Subject] = ()) -> tuple[str, str]:
    """The testability rule, applied before any verdict: ``(verdict, reason)``.

    "not testable at this size" when ``holds`` is None (the measurement cannot decide) or any subject is not
    testable (:class:`Subject`), whatever the direction of the comparison; else "holds" / "does not hold".
    """
    reasons = [subject.reason for subject in subjects if not subject.testable]
    if holds is None or reasons:
        return VERDICTS[2], "; ".join(reasons)
    if not isinstance(holds, bool):
        raise ValueError(f"holds must be True, False or None, got {holds!r} ({type(holds).__name__})")
    return (VERDICTS[0] if holds else VERDICTS[1]), ""


def improves(errors: list[float], factor: float = 0.8) -> bool:
    """True when the last error is below ``factor`` times the first (a curve that scales)."""
    return errors[-1] < factor * errors[0]


def seed_interval(values: torch.Tensor, confidence: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over seeds (dim 0) and the half-width of its t interval, ``t_{(1+c)/2, n-1} · s / √n`` (s with n − 1);
    the half-width is NaN for a single seed."""
    from scipy.stats import t  # scipy comes with scikit-learn

    values = torch.as_tensor(values, dtype=torch.float64)
    n = values.shape[0]
    mean = values.mean(0)
    if n < 2:
        return mean, torch.full_like(mean, math.nan)
    quantile = float(t.ppf((1 + confidence) / 2, n - 1))
    return mean, quantile * values.std(0, correction=1) / math.sqrt(n)


def comparable(a: float, b: float, factor: float = 1.5) -> bool:
    """True when two errors are within ``factor`` of each other."""
    return max(a, b) <= factor * min(a, b)


# -- the report ---------------------------------------------------------------------------------------
@dataclass
class Report:
    """The results of one experiment: sections of markdown, plots, claims and raw numbers."""

    paper: str
    experiment: str
    title: str
    size: str
    command: str
    output_dir: Path
    sections: list[str] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    def add(self, markdown: str) -> None:
        self.sections.append(markdown.strip())

    def plot_path(self, name: str) -> Path:
        return self.output_dir / f"{self.paper}_{self.experiment}_{name}.png"

    def add_plot(self, path: Path, caption: str) -> None:
        self.add(f"![{caption}]({path.name})\n\n*{caption}*")

    def claim(
        self, claim: str, document: str, measured: str, holds: bool | None, subjects: Sequence[Subject] = ()
    ) -> Claim:
        """Judge a claim by the testability rule (:func:`judge`) and record it.

        Args:
            claim, document, measured: the claim, what the document reports, what we measured.
            holds: whether our measurement agrees with the claim; None when it cannot decide.
            subjects: every model and baseline the claim is about, with its error and the trivial predictor's;
                one that learned nothing (or a baseline worse than trivial) makes the claim "not testable at this
                size", and the reason is appended to ``measured``.
        """
        verdict_, reason = judge(holds, subjects)
        if reason:
            measured = f"{measured} — {reason}"
        self.claims.append(Claim(claim, document, measured, verdict_))
        log(f"claim: {claim} — {verdict_} ({measured})")
        return self.claims[-1]

    def write(self) -> Path:
        minutes = (time.perf_counter() - self.started) / 60
        device = (
            torch.cuda.get_device_name()
            if torch.cuda.is_available()
            else f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
        )
        lines = [
            f"# {self.paper} {self.experiment}: {self.title}",
            "",
            f"- command: `{self.command}`",
            f"- size: {self.size}",
            f"- hardware: {device}; torch {torch.__version__}",
            f"- date: {date.today().isoformat()}; wall time {minutes:.1f} min",
            "",
            "| claim | document | ours | verdict |",
            "|---|---|---|---|",
            *(f"| {c.claim} | {c.document} | {c.measured} | **{c.verdict}** |" for c in self.claims),
            "",
            *(section + "\n" for section in self.sections),
        ]
        self.output_dir.mkdir(parents=True, exist_ok=True)
        path = self.output_dir / "results.md"
        path.write_text("\n".join(lines))
        summary = {
            "paper": self.paper,
            "experiment": self.experiment,
            "size": self.size,
            "command": self.command,
            "claims": [c.__dict__ for c in self.claims],
            "numbers": self.numbers,
        }
        (self.output_dir / "results.json").write_text(json.dumps(summary, indent=2, default=float))
        log(f"wrote {path}")
        return path
