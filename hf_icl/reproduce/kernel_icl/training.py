"""Training the kernel-ICL study's models (seed 000): every architecture of a table, every seed, one loop over steps
on shared batches per process; finished groups are reloaded from the run cache instead of retrained."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch

from ...data.tasks import get_task
from ...training.checkpoints import quiet_progress
from ...training.run_cache import read_run, write_run
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


def _train_loop(scale: Scale, groups: Sequence[Group], training: Training, runs_dir: Path) -> None:
    """Train ``groups`` step by step on shared batches (one per seed) and save each group's models and loss curve."""
    task = get_task(**training.task)
    generators = [torch.Generator().manual_seed(1000 + seed) for seed in scale.seeds]
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
    curves = [[] for _ in groups]
    running = torch.zeros(len(groups), len(scale.seeds))
    clock, window = time.perf_counter(), 0
    for step in range(1, training.steps + 1):
        batches = [
            context_query_batch(task, scale.batch_size, training.n_context, training.n_queries, g) for g in generators
        ]
        xs, ys = torch.stack([b[0] for b in batches]), torch.stack([b[1] for b in batches])
        for i, ensemble in enumerate(ensembles):
            running[i] += ensemble.step(xs, ys)
        window += 1
        if window == scale.curve_every or step == training.steps:  # the curve: mean loss of each window of steps
            for curve, total in zip(curves, running, strict=True):
                curve.append(total / window)
            running.zero_()
            window = 0
        if step % max(1, training.steps // 10) == 0:
            losses = ", ".join(f"{g.name} {float(c[-1].mean()):.4f}" for g, c in zip(groups, curves, strict=True) if c)
            log(f"  step {step}/{training.steps} ({time.perf_counter() - clock:.0f} s): {losses}")
    for group, ensemble, curve in zip(groups, ensembles, curves, strict=True):
        run_dir = runs_dir / group.name
        ensemble.save(run_dir)
        write_run(run_dir, training.spec(scale, group), tensors={"losses": torch.stack(curve)})


def _train_in_worker(scale: Scale, groups: list[Group], training: Training, runs_dir: str, threads: int) -> None:
    torch.set_num_threads(threads)
    _train_loop(scale, groups, training, Path(runs_dir))


def train_groups(
    scale: Scale,
    groups: Sequence[Group],
    training: Training,
    runs_dir: Path,
    retrain: bool = False,
    workers: int | None = None,
) -> dict[str, tuple[list[torch.nn.Module], torch.Tensor]]:
    """Train every group's seeds with the document's recipe; returns ``{name: (models per seed, loss curve
    (windows, seeds))}``. Finished groups with the same spec are loaded instead of retrained. The groups to train are
    dealt to ``workers`` processes (default one per core, each running one loop over its groups)."""
    pending = [g for g in groups if retrain or _load_group(runs_dir / g.name, training.spec(scale, g)) is None]
    for group in groups:
        if group not in pending:
            log(f"reusing {runs_dir / group.name} (trained with the same spec)")
    workers = min(workers or usable_cores(), len(pending))
    if pending:
        names = ", ".join(g.name for g in pending)
        log(f"training {names}: {len(scale.seeds)} seeds, {training.steps} steps, in {max(workers, 1)} process(es)")
    if workers == 1:
        _train_loop(scale, pending, training, runs_dir)
    elif workers > 1:
        shares = [pending[i::workers] for i in range(workers)]
        threads = max(1, usable_cores() // workers)
        with worker_pool(workers) as pool:
            jobs = [pool.submit(_train_in_worker, scale, share, training, str(runs_dir), threads) for share in shares]
            for job in jobs:
                job.result()
    return {g.name: _load_group(runs_dir / g.name, training.spec(scale, g)) for g in groups}
