"""Training the study's groups: every seed of a group in lockstep as one
:class:`~hf_icl.training.seed_ensemble.SeedEnsemble` (the seed-stacked trainer, with its finiteness checks), the
groups in worker processes (one per core by default), checkpointed as it trains and resumed when it stopped
(:func:`train_group`), each finished group saved (:class:`GroupResult`, ``metrics.json``) and reused while its spec
is unchanged; the statistics of its curves; and :class:`ExperimentState`, which trains an experiment's
groups once."""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import as_completed
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...evaluation.runs import METRICS_FILE, write_metrics
from ...training.run_cache import read_run, write_run
from ...training.seed_checkpoints import resumable_checkpoint, resuming
from ...training.seed_ensemble import SeedEnsemble, build_seeded
from ..report import ExperimentStateBase, Subject, log, seed_interval, usable_cores
from ..workers import worker_pool
from .data import draw_batches, evaluation_sets, query_errors, study_task, training_prompts, trivial_errors
from .document import CONVERGED, DEPTHS, DOCUMENT_WIDTH, GPT2_VOCAB
from .specs import RECIPES, GroupSpec, Scale, ablation_specs, group_specs


# -- statistics of the curves and the final losses ------------------------------------------------------------------
def document_interval(residuals: Sequence[torch.Tensor]) -> float:
    """The document's rule (its appendix): concatenate the residuals of all seeds and take 1.96 · std (numpy's std,
    without the n − 1 correction). Here the residuals are the per-prompt query errors whose mean is the loss."""
    joined = torch.cat([torch.as_tensor(r, dtype=torch.float64).flatten() for r in residuals])
    return 1.96 * float(joined.std(correction=0))


def samples_to_converge(
    steps: Sequence[int], losses: Sequence[float], batch_size: int, fraction: float = CONVERGED
) -> int | None:
    """Samples seen (step × batch size) at the first evaluation whose loss closed ``fraction`` of the gap between the
    first (initial) and the last (final) loss; None when the loss never fell."""
    initial, final = float(losses[0]), float(losses[-1])
    if not final < initial:
        return None
    target = initial - fraction * (initial - final)
    for step, loss in zip(steps, losses, strict=True):
        if loss <= target:
            return int(step) * batch_size
    return None  # unreachable: the last loss meets the target


def plateaued(losses: Sequence[float], tail: float = 0.25, tolerance: float = 0.1) -> bool:
    """True when the loss fell by less than ``tolerance`` (relative) over the last ``tail`` of training: a model
    still improving at the end has no final loss or convergence point to compare yet."""
    losses = [float(v) for v in losses]
    start = losses[min(len(losses) - 1, math.floor((1 - tail) * (len(losses) - 1)))]
    return losses[-1] >= (1 - tolerance) * start


def separated(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """True when two (mean, half-width) intervals do not overlap."""
    return abs(a[0] - b[0]) > a[1] + b[1]


# -- training -------------------------------------------------------------------------------------------------------
@dataclass
class GroupResult:
    """What one group's training measured: test/train curves and every final per-prompt error."""

    spec: GroupSpec
    steps: list[int]
    test_curve: torch.Tensor  # (S, evaluations)
    train_curve: torch.Tensor  # (S, evaluations)
    errors: dict[str, torch.Tensor]  # evaluation set -> (S, prompts) query errors of the final models
    seconds: float

    def final(self, name: str) -> torch.Tensor:
        """``(S,)`` final loss of every seed on an evaluation set."""
        return self.errors[name].mean(1)

    def interval(self, name: str) -> tuple[float, float]:
        mean, half = seed_interval(self.final(name))
        return float(mean), float(half)

    def mean_curve(self) -> torch.Tensor:
        return self.test_curve.mean(0)

    def samples(self) -> list[int]:
        return [s * self.spec.batch_size for s in self.steps]

    def samples_to_90(self) -> int | None:
        """Table 3's number, on the mean of the seeds' test curves."""
        return samples_to_converge(self.steps, self.mean_curve().tolist(), self.spec.batch_size)

    def samples_to_90_per_seed(self) -> list[int | None]:
        return [samples_to_converge(self.steps, c.tolist(), self.spec.batch_size) for c in self.test_curve]

    def plateaued(self) -> bool:
        return plateaued(self.mean_curve().tolist())

    def trivial(self, name: str = "test") -> float:
        """The trivial (zero) predictor's loss on the same prompts as :meth:`final`."""
        return trivial_errors(self.spec)[name]

    def subject(self, name: str = "test") -> Subject:
        """This group (the mean over seeds of its final loss on evaluation set ``name``) for the testability rule."""
        label = self.spec.name if name == "test" else f"{self.spec.name} ({name})"
        return Subject(label, float(self.final(name).mean()), self.trivial(name))

    def save(self, run_dir: Path) -> None:
        record = {
            "steps": self.steps,
            "test_curve": self.test_curve.tolist(),
            "train_curve": self.train_curve.tolist(),
            "seconds": self.seconds,
        }
        write_run(run_dir, self.spec.to_dict(), record=record, tensors=self.errors)

    @classmethod
    def load(cls, run_dir: Path, spec: GroupSpec | None = None) -> GroupResult | None:
        """The finished group in ``run_dir`` (of ``spec``, when given); None when there is none."""
        run = read_run(run_dir, None if spec is None else spec.to_dict())
        if run is None:
            return None
        record = run.record
        return cls(
            GroupSpec.from_dict(run.spec),
            record["steps"],
            torch.tensor(record["test_curve"], dtype=torch.float64),
            torch.tensor(record["train_curve"], dtype=torch.float64),
            run.tensors,
            record["seconds"],
        )


def _score(ensemble: SeedEnsemble, prompts: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    xs, ys = prompts
    return query_errors(ensemble.predict(xs, ys), ys)


def group_ensemble(spec: GroupSpec) -> SeedEnsemble:
    """Every seed of ``spec`` as one stacked model with its optimizer, untrained."""
    recipe = RECIPES[spec.recipe]
    return SeedEnsemble(
        recipe.model_type,
        spec.group_model_config(),
        spec.seeds,
        spec.learning_rate,
        attn_implementation=recipe.attn_implementation,
    )


#: checkpoints a group keeps while it trains (the newest; removed once the group is finished)
KEEP_CHECKPOINTS = 2


@dataclass
class _Progress:
    """What a group measured so far (the checkpoints' ``extra``): the evaluated steps, each evaluation's ``(S,)``
    test and train losses, and the seconds spent training."""

    steps: list[int] = field(default_factory=list)
    test: list[torch.Tensor] = field(default_factory=list)
    train: list[torch.Tensor] = field(default_factory=list)
    seconds: float = 0.0

    def state(self) -> dict:
        return {"steps": self.steps, "test": self.test, "train": self.train, "seconds": self.seconds}


def default_checkpoint_every(spec: GroupSpec) -> int:
    """A checkpoint every tenth of the run (at least every step of a run shorter than ten)."""
    return max(1, spec.steps // 10)


def _start(ensemble: SeedEnsemble, spec: GroupSpec, run_dir: Path, resume: bool) -> _Progress:
    """The progress to go on from: the newest checkpoint of ``spec`` in ``run_dir`` (loaded into ``ensemble``) when
    ``resume``, else none; checkpoints not resumed (another spec, a retrain) are removed so none mixes in."""
    folder = resumable_checkpoint(run_dir, spec.to_dict()) if resume else None
    if folder is None:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        return _Progress()
    with resuming(spec.name, folder):  # TypeError: an extra of other fields
        progress = _Progress(**ensemble.load_checkpoint(folder, spec=spec.to_dict()))
    log(f"  {spec.name}: resumed from {folder} at step {ensemble.steps_done}")
    return progress


def write_group_metrics(result: GroupResult, run_dir: Path) -> Path:
    """``run_dir/metrics.json`` (:func:`~hf_icl.evaluation.runs.write_metrics`' format, no per-position evaluations:
    the study scores the last query only). It holds ``group``, ``seeds``, ``per_seed`` (seed -> evaluation set ->
    that seed's final loss: the mean query error over the set's prompts), ``curves`` (``steps`` and, per seed, the
    ``test`` and ``train`` losses at those steps) and ``scalars`` (the mean over seeds of every final loss, the steps
    and the training seconds)."""
    spec = result.spec
    finals = {name: result.final(name).tolist() for name in result.errors}
    per_seed = {str(seed): {name: values[i] for name, values in finals.items()} for i, seed in enumerate(spec.seeds)}
    curves = {"steps": result.steps, "test": result.test_curve.tolist(), "train": result.train_curve.tolist()}
    scalars = {f"final_{name}_loss": sum(values) / len(values) for name, values in finals.items()}
    return write_metrics(
        run_dir / METRICS_FILE,
        {},
        model=RECIPES[spec.recipe].model_type,
        task="linear_regression",
        scalars={**scalars, "steps": spec.steps, "seconds": result.seconds},
        group=spec.name,
        seeds=list(spec.seeds),
        per_seed=per_seed,
        curves=curves,
    )


def train_group(
    spec: GroupSpec,
    run_dir: Path,
    log_every: float = 30.0,
    *,
    checkpoint_every: int | None = None,
    resume: bool = True,
) -> GroupResult:
    """Train every seed of ``spec`` in lockstep, scoring the test and training prompts at step 0 and every
    ``eval_steps`` steps; save the result, ``metrics.json`` (:func:`write_group_metrics`) and one ``save_pretrained``
    model per seed (with its manifest) to ``run_dir``.

    Every ``checkpoint_every`` steps (default :func:`default_checkpoint_every`) a checkpoint of every seed, its
    optimizer and the curves so far goes to ``run_dir/checkpoints/step-N`` (the newest :data:`KEEP_CHECKPOINTS`
    kept). With ``resume`` a run of the same spec that stopped goes on from its newest checkpoint, and ends with the
    numbers and weights of a run never stopped (the batches are drawn by step); the checkpoints are removed once the
    group is finished."""
    recipe = RECIPES[spec.recipe]
    every = checkpoint_every or default_checkpoint_every(spec)
    ensemble = group_ensemble(spec)
    task, pool, sets = study_task(), training_prompts(spec), evaluation_sets(spec)

    def record(step: int) -> None:
        progress.steps.append(step)
        progress.test.append(_score(ensemble, sets["test"]).mean(1))
        progress.train.append(_score(ensemble, sets["train"]).mean(1))

    log(
        f"training {spec.name}: {recipe.model_type}, {len(spec.seeds)} seeds × {spec.steps} steps × "
        f"{spec.batch_size} prompts, width {spec.n_embd} (pid {os.getpid()}, {torch.get_num_threads()} threads)"
    )
    progress = _start(ensemble, spec, run_dir, resume)
    first = ensemble.steps_done
    resumed = last_log = time.perf_counter()
    started = resumed - progress.seconds  # the seconds of the run, however often it stopped
    if first == 0:
        record(0)
    for step in range(first, spec.steps):
        ensemble.step(*draw_batches(task, pool, spec.batch_size, spec.seeds, step))
        done = step + 1
        if done % spec.eval_steps == 0 or done == spec.steps:
            record(done)
            now = time.perf_counter()
            if now - last_log >= log_every and done < spec.steps:
                last_log = now
                rate = (done - first) / (now - resumed)
                log(
                    f"  {spec.name}: step {done}/{spec.steps} ({rate:.1f} steps/s, about "
                    f"{(spec.steps - done) / rate / 60:.1f} min left), test loss {float(progress.test[-1].mean()):.4f}"
                )
        if done % every == 0 and done < spec.steps:
            progress.seconds = time.perf_counter() - started
            ensemble.save_checkpoint(run_dir, progress.state(), spec=spec.to_dict(), keep=KEEP_CHECKPOINTS)
    result = GroupResult(
        spec,
        progress.steps,
        torch.stack(progress.test, 1),
        torch.stack(progress.train, 1),
        {name: _score(ensemble, prompts) for name, prompts in sets.items()},
        time.perf_counter() - started,
    )
    ensemble.save(run_dir)
    write_group_metrics(result, run_dir)
    result.save(run_dir)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # a finished run is reused, never resumed
    log(f"  {spec.name} done in {result.seconds / 60:.1f} min, test loss {float(result.final('test').mean()):.4f}")
    return result


def _finished(spec: GroupSpec, run_dir: Path) -> bool:
    return GroupResult.load(run_dir, spec) is not None


def _train_in_worker(spec: dict, run_dir: str, threads: int, resume: bool = True) -> str:
    """Entry point of a worker process (one per core by default)."""
    torch.set_num_threads(threads)
    train_group(GroupSpec.from_dict(spec), Path(run_dir), resume=resume)
    return spec["recipe"] + f"_L{spec['depth']}"


def run_groups(
    specs: Sequence[GroupSpec], runs_dir: Path, *, retrain: bool = False, workers: int | None = None
) -> dict[str, GroupResult]:
    """Train the groups not already finished with the same spec (``retrain``: all of them, from the start; else a
    group that stopped goes on from its newest checkpoint), longest first, in ``workers`` processes (default: one
    per core, each with one thread; 1: in this process); load every result."""
    todo = [s for s in specs if retrain or not _finished(s, runs_dir / s.name)]
    for spec in specs:
        if spec not in todo:
            log(f"reusing {runs_dir / spec.name} (trained with the same settings)")
    todo.sort(key=GroupSpec.cost, reverse=True)
    workers = min(workers or usable_cores(), len(todo))
    if todo:
        log(f"{len(todo)} group(s) to train: {', '.join(s.name for s in todo)}")
    if workers <= 1:
        for spec in todo:
            train_group(spec, runs_dir / spec.name, resume=not retrain)
    else:
        threads = max(1, usable_cores() // workers)
        log(f"{len(todo)} groups in {workers} processes × {threads} threads")
        with worker_pool(workers) as pool:
            jobs = [
                pool.submit(_train_in_worker, s.to_dict(), str(runs_dir / s.name), threads, not retrain) for s in todo
            ]
            for job in as_completed(jobs):
                job.result()  # re-raises a worker's error here
    return {spec.name: GroupResult.load(runs_dir / spec.name) for spec in specs}


def parameter_counts(n_embd: int = DOCUMENT_WIDTH) -> dict[str, dict[int, dict[str, int]]]:
    """Trainable parameters of our models, and the same models counted as the study's code counts them: its
    softmax model is transformers' ``GPT2Model`` with GPT-2's 50 257-token table (unused: prompts enter through the
    read-in, yet counted), its linear model has no final LayerNorm."""
    counts = {}
    for key, recipe in RECIPES.items():
        counts[key] = {}
        for depth in DEPTHS:
            model = build_seeded(recipe.model_type, recipe.model_config(n_embd, depth), 0)
            ours = sum(p.numel() for p in model.parameters() if p.requires_grad)
            study = ours + GPT2_VOCAB * n_embd if key == "softmax" else ours - 2 * n_embd
            counts[key][depth] = {"trainable": ours, "as_the_study_counts": study}
    return counts


# -- an experiment's state ------------------------------------------------------------------------------------------
@dataclass
class ExperimentState(ExperimentStateBase):
    """An experiment's state (:class:`~hf_icl.reproduce.report.ExperimentStateBase`) and the shared runs (trained
    once per call)."""

    scale: Scale
    _results: dict | None = field(default=None, repr=False)
    _ablation: dict | None = field(default=None, repr=False)

    def specs(self) -> list[GroupSpec]:
        return group_specs(self.scale, self.seed, self.steps)

    def ablation(self) -> dict[str, GroupResult]:
        """The feature-map ablation's groups by map name (:func:`ablation_specs`), trained once (or reused)."""
        if self._ablation is None:
            specs = ablation_specs(self.scale, self.seed, self.steps)
            loaded = run_groups(specs, self.runs_dir, retrain=self.retrain, workers=self.workers)
            self._ablation = {s.feature_map_name: loaded[s.name] for s in specs}
            self.report.numbers.setdefault("runs", {}).update(
                {r.spec.name: {"seconds": r.seconds, "spec": r.spec.to_dict()} for r in loaded.values()}
            )
        return self._ablation

    def results(self) -> dict[tuple[str, int], GroupResult]:
        """Every group's result, trained once (or reused) for all the experiments of this call."""
        if self._results is None:
            loaded = run_groups(self.specs(), self.runs_dir, retrain=self.retrain, workers=self.workers)
            self._results = {(r.spec.recipe, r.spec.depth): r for r in loaded.values()}
            self.report.numbers["runs"] = {
                r.spec.name: {"seconds": r.seconds, "spec": r.spec.to_dict()} for r in loaded.values()
            }
        return self._results

    def add_runs_note(self, runs: Sequence[GroupResult] | None = None) -> None:
        """Close the report with where the runs are and how long each took (default: the tables' runs)."""
        runs = list(self.results().values()) if runs is None else runs
        self.report.add(
            "Runs (each group trains all its seeds as one stacked model; a reused run keeps its first time): "
            + ", ".join(f"{r.spec.name} {r.seconds / 60:.1f} min" for r in runs)
            + f"; up to {self.workers or usable_cores()} training processes on {usable_cores()} cores. "
            f"Models: `{self.runs_dir}/GROUP/seedN` (save_pretrained)."
        )
