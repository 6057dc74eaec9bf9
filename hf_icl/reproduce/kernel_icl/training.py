"""Training the kernel-ICL study's models (seed 000): every architecture of a table, every seed, one loop over steps
on shared batches per process, checkpointed as it trains and resumed when it stopped; finished groups (models,
``run.json``, ``metrics.json``) are reloaded from the run cache instead of retrained."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ...data.tasks import get_task
from ...evaluation.runs import METRICS_FILE, write_metrics
from ...training.checkpoints import checkpoint_dir, quiet_progress
from ...training.run_cache import read_run, write_run
from ...training.seed_checkpoints import common_resume_step, resuming
from ...training.seed_ensemble import SeedEnsemble
from ..report import log, usable_cores
from ..workers import worker_pool
from .data import context_query_batch
from .specs import Group, Scale, Training


def _load_group(run_dir: Path, spec: dict) -> tuple[list[torch.nn.Module], torch.Tensor] | None:
    from transformers import AutoModel

    run = read_run(run_dir, spec)
    if run is None:
        return None
    with quiet_progress():
        models = [AutoModel.from_pretrained(run_dir / f"seed{seed}").eval() for seed in spec["seeds"]]
    return models, run.tensors["losses"]


#: checkpoints each group keeps while it trains (the newest; removed once the group is finished)
KEEP_CHECKPOINTS = 2


@dataclass
class _LoopState:
    """Where a loop over groups stands after ``step`` steps (each group's checkpoint ``extra`` holds its part):
    the per-seed data generators, every group's curve so far (one ``(S,)`` mean loss per finished window), the
    running loss sums of the open window and its length."""

    generators: list[torch.Generator]
    curves: list[list[torch.Tensor]]
    running: torch.Tensor  # (groups, S)
    window: int = 0
    step: int = 0

    def extra(self, i: int) -> dict:
        """Group ``i``'s part, with the generator states (as uint8 tensors) every group shares."""
        return {
            "generators": [g.get_state() for g in self.generators],
            "curve": self.curves[i],
            "running": self.running[i],
            "window": self.window,
        }

    def restore(self, i: int, extra: dict) -> None:
        for generator, state in zip(self.generators, extra["generators"], strict=True):
            generator.set_state(state)
        self.curves[i] = list(extra["curve"])
        self.running[i] = extra["running"]
        self.window = extra["window"]


def _resume(state: _LoopState, ensembles, groups, specs, runs_dir: Path, resume: bool) -> None:
    """Load every group's checkpoint of the newest step all groups share into ``ensembles`` and ``state`` when
    ``resume`` (:func:`~hf_icl.training.seed_checkpoints.common_resume_step`, which removes the checkpoints not
    resumed, so none of another spec or a retrained run mixes in)."""
    step = common_resume_step([runs_dir / g.name for g in groups], specs, resume=resume)
    if step is None:
        return
    for i, (group, ensemble, spec) in enumerate(zip(groups, ensembles, specs, strict=True)):
        folder = checkpoint_dir(runs_dir / group.name, step)
        with resuming(group.name, folder):
            state.restore(i, ensemble.load_checkpoint(folder, spec=spec))
        log(f"  {group.name}: resumed from {folder} at step {step}")
    state.step = step


def write_group_metrics(run_dir: Path, seeds: Sequence[int], curve: torch.Tensor, curve_every: int) -> Path:
    """``run_dir/metrics.json`` (:func:`~hf_icl.evaluation.runs.write_metrics`' format, no per-position evaluations):
    ``seeds``, ``per_seed`` (seed -> ``final_train_loss``: its mean training loss over the last window of steps),
    ``curves`` (``window`` steps per point and ``train``: per seed, the mean loss of each window) and ``scalars``
    (the mean over seeds of the final training loss)."""
    last = curve[-1].tolist()
    return write_metrics(
        run_dir / METRICS_FILE,
        {},
        model="kernel_icl",
        task=None,
        scalars={"final_train_loss": sum(last) / len(last)},
        seeds=list(seeds),
        per_seed={str(seed): {"final_train_loss": loss} for seed, loss in zip(seeds, last, strict=True)},
        curves={"window": curve_every, "train": curve.T.tolist()},
    )


def _train_loop(
    scale: Scale,
    groups: Sequence[Group],
    training: Training,
    runs_dir: Path,
    *,
    resume: bool = True,
    checkpoint_every: int | None = None,
) -> None:
    """Train ``groups`` step by step on shared batches (one per seed) and save each group's models, loss curve and
    ``metrics.json`` (:func:`write_group_metrics`). Every ``checkpoint_every`` steps (default: a tenth of the run)
    each group writes a checkpoint (its seeds, optimizer, curve so far and the shared generators) into
    ``runs_dir/GROUP/checkpoints``; with ``resume`` a loop that stopped goes on from the newest step every group has
    a checkpoint of, and ends with the numbers of a loop never stopped. Checkpoints are removed once saved."""
    task = get_task(**training.task)
    specs = [training.spec(scale, group) for group in groups]
    every = checkpoint_every or max(1, training.steps // 10)
    ensembles = [
        SeedEnsemble(
            "kernel_icl",
            group.fields,
            scale.seeds,
            scale.learning_rate,
            max_grad_norm=0.0,  # the document does not clip
            loss_per_dim=False,
            forward_kwargs={"n_context": training.n_context},
        )
        for group in groups
    ]
    state = _LoopState(
        [torch.Generator().manual_seed(1000 + seed) for seed in scale.seeds],
        [[] for _ in groups],
        torch.zeros(len(groups), len(scale.seeds)),
    )
    _resume(state, ensembles, groups, specs, runs_dir, resume)
    curves, running = state.curves, state.running
    clock = time.perf_counter()
    for step in range(state.step + 1, training.steps + 1):
        batches = [
            context_query_batch(task, scale.batch_size, training.n_context, training.n_queries, g)
            for g in state.generators
        ]
        xs, ys = torch.stack([b[0] for b in batches]), torch.stack([b[1] for b in batches])
        for i, ensemble in enumerate(ensembles):
            running[i] += ensemble.step(xs, ys)
        state.window += 1
        if state.window == scale.curve_every or step == training.steps:  # the curve: mean loss of each window of steps
            for curve, total in zip(curves, running, strict=True):
                curve.append(total / state.window)
            running.zero_()
            state.window = 0
        if step % max(1, training.steps // 10) == 0:
            losses = ", ".join(f"{g.name} {float(c[-1].mean()):.4f}" for g, c in zip(groups, curves, strict=True) if c)
            log(f"  step {step}/{training.steps} ({time.perf_counter() - clock:.0f} s): {losses}")
        if step % every == 0 and step < training.steps:
            for i, (group, ensemble, spec) in enumerate(zip(groups, ensembles, specs, strict=True)):
                ensemble.save_checkpoint(runs_dir / group.name, state.extra(i), spec=spec, keep=KEEP_CHECKPOINTS)
    for group, ensemble, curve, spec in zip(groups, ensembles, curves, specs, strict=True):
        run_dir = runs_dir / group.name
        ensemble.save(run_dir)
        write_group_metrics(run_dir, scale.seeds, torch.stack(curve), scale.curve_every)
        write_run(run_dir, spec, tensors={"losses": torch.stack(curve)})
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # a finished group is reused, never resumed


def _train_in_worker(
    scale: Scale, groups: list[Group], training: Training, runs_dir: str, threads: int, resume: bool = True
) -> None:
    torch.set_num_threads(threads)
    _train_loop(scale, groups, training, Path(runs_dir), resume=resume)


def train_groups(
    scale: Scale,
    groups: Sequence[Group],
    training: Training,
    runs_dir: Path,
    retrain: bool = False,
    workers: int | None = None,
) -> dict[str, tuple[list[torch.nn.Module], torch.Tensor]]:
    """Train every group's seeds with the document's recipe; returns ``{name: (models per seed, loss curve
    (windows, seeds))}``. Finished groups with the same spec are loaded instead of retrained (``retrain``: all are
    trained, from the start; else a loop that stopped goes on from its checkpoints). The groups to train are dealt to
    ``workers`` processes (default one per core, each running one loop over its groups)."""
    pending = [g for g in groups if retrain or _load_group(runs_dir / g.name, training.spec(scale, g)) is None]
    for group in groups:
        if group not in pending:
            log(f"reusing {runs_dir / group.name} (trained with the same spec)")
    workers = min(workers or usable_cores(), len(pending))
    if pending:
        names = ", ".join(g.name for g in pending)
        log(f"training {names}: {len(scale.seeds)} seeds, {training.steps} steps, in {max(workers, 1)} process(es)")
    if workers == 1:
        _train_loop(scale, pending, training, runs_dir, resume=not retrain)
    elif workers > 1:
        shares = [pending[i::workers] for i in range(workers)]
        threads = max(1, usable_cores() // workers)
        with worker_pool(workers) as pool:
            jobs = [
                pool.submit(_train_in_worker, scale, share, training, str(runs_dir), threads, not retrain)
                for share in shares
            ]
            for job in jobs:
                job.result()
    return {g.name: _load_group(runs_dir / g.name, training.spec(scale, g)) for g in groups}
