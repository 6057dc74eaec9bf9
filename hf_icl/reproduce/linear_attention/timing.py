"""``hf-icl reproduce linear-attention engines``: how fast each way of training the seeds runs on this machine's
cores: the package trainer (one model per seed) against the stacked
:class:`~hf_icl.training.seed_ensemble.SeedEnsemble`, in one process or one per core, with one thread or all. It
chose the way :mod:`.training` trains the groups."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from ..report import log, usable_cores
from ..workers import worker_pool
from .claims import markdown_table
from .data import draw_batches, study_task
from .document import N_DIMS, N_POINTS, SEEDS
from .specs import CPU, RECIPES, GroupSpec, group_specs
from .training import ExperimentState, group_ensemble

# -- the ways to spend the cores ------------------------------------------------------------------------------------
#: the ways ``engines`` times: (name, engine, processes, threads per process); None: one per core
WAYS = (
    ("package trainer, 1 process × 1 thread", "trainer", 1, 1),
    ("seed ensemble, 1 process × 1 thread", "ensemble", 1, 1),
    ("package trainer, 1 process × all threads", "trainer", 1, None),
    ("seed ensemble, 1 process × all threads", "ensemble", 1, None),
    ("package trainer, one process per core × 1 thread", "trainer", None, 1),
    ("seed ensemble, one process per core × 1 thread", "ensemble", None, 1),
)


def _trainer_steppers(spec: GroupSpec, output_dir: Path) -> list[Callable[[int], None]]:
    """One ``ICLTrainer`` per seed (its own model, optimizer and batches), stepped by its optimizer step."""
    from ...training import ICLTrainer, ICLTrainingArguments

    recipe, steppers = RECIPES[spec.recipe], []
    for seed in spec.seeds:
        overrides = {
            k: v for k, v in spec.group_model_config().items() if k not in ("n_dims", "n_points", "target_kind")
        }
        args = ICLTrainingArguments(
            output_dir=str(output_dir / f"seed{seed}"),
            n_dims=N_DIMS,
            n_points=N_POINTS,
            model_type=recipe.model_type,
            model_size=None,
            model_overrides=json.dumps(overrides),
            per_device_train_batch_size=spec.batch_size,
            learning_rate=spec.learning_rate,
            max_grad_norm=float(N_DIMS),  # MSE clipped at d = the study's MSE/d clipped at 1
            seed=seed,
            report_to="none",
            disable_tqdm=True,
        )
        trainer, generator = ICLTrainer(args), torch.Generator()
        # the trainer's own step (the part train() repeats), without its evaluation and saving around it
        steppers.append(lambda step, t=trainer, g=generator: t._optimizer_step(step, g))
    return steppers


def _time_worker(engine: str, spec: dict, steps: int, warmup: int, threads: int, scratch: str) -> tuple:
    """Time ``steps`` steps of ``engine`` on the seeds of ``spec``; returns (start, end, seed-steps)."""
    torch.set_num_threads(threads)
    spec = GroupSpec.from_dict(spec)
    task = study_task()
    if engine == "trainer":
        steppers = _trainer_steppers(spec, Path(scratch))
    else:
        ensemble = group_ensemble(spec)
        steppers = [lambda step: ensemble.step(*draw_batches(task, None, spec.batch_size, spec.seeds, step))]
    for step in range(warmup):
        for stepper in steppers:
            stepper(step)
    start = time.time()
    for step in range(warmup, warmup + steps):
        for stepper in steppers:
            stepper(step)
    return start, time.time(), steps * len(spec.seeds)


def time_way(
    spec: GroupSpec, engine: str, processes: int, threads: int, *, steps: int, warmup: int, scratch: Path
) -> float:
    """Seed-steps per second of ``engine`` on ``spec``'s seeds split over ``processes`` fresh processes of
    ``threads`` threads each, all timed over one wall-clock window (from the first start to the last end)."""
    shares = [spec.seeds[i::processes] for i in range(processes)]
    with worker_pool(processes) as pool:
        jobs = [
            pool.submit(
                _time_worker,
                engine,
                replace(spec, seeds=share).to_dict(),
                steps,
                warmup,
                threads,
                str(scratch / str(i)),
            )
            for i, share in enumerate(shares)
        ]
        spans = [job.result() for job in jobs]
    wall = max(end for _, end, _ in spans) - min(start for start, _, _ in spans)
    return sum(n for _, _, n in spans) / wall


def engines(ctx: ExperimentState) -> None:
    """Seed-steps per second of each way in :data:`WAYS` to train the document's five seeds of a 3-layer group, at
    the CPU default's shapes (the scale's, for a custom scale)."""
    import tempfile

    cores, steps, warmup = usable_cores(), ctx.steps or 20, 3
    shapes = CPU if ctx.scale.full else ctx.scale  # a small setting even under --full
    seeds = tuple(s + ctx.seed for s in SEEDS)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    rows, numbers = [], {"cores": cores, "load_average_before": load}
    for key, recipe in RECIPES.items():
        spec = next(s for s in group_specs(shapes, ctx.seed) if s.recipe == key and s.depth == 3)
        spec = replace(spec, seeds=seeds)
        rates = {}
        for name, engine, processes, threads in WAYS:
            n = processes or min(cores, len(seeds))
            with tempfile.TemporaryDirectory() as scratch:
                rates[name] = time_way(
                    spec, engine, n, threads or cores, steps=steps, warmup=warmup, scratch=Path(scratch)
                )
            log(f"engines: {recipe.label}, {name}: {rates[name]:.1f} seed-steps/s")
        base = rates[WAYS[0][0]]
        rows += [(recipe.label, name, f"{rate:.1f}", f"{rate / base:.2f}×") for name, rate in rates.items()]
        numbers[key] = rates
    ctx.report.numbers["seed_steps_per_second"] = numbers
    busy = "" if load is None else f" The 1-minute load average before the measurement was {load[0]:.2f}."
    ctx.report.add(
        f"Seed-steps per second (higher is faster) on {cores} cores: {len(seeds)} seeds of the 3-layer models at "
        f"width {shapes.n_embd}, batches of 32 (softmax) and 64 (linear), {steps} timed steps after {warmup} warm-up "
        "steps, each way in fresh processes; the seeds are split between the processes. The trainer runs its own "
        f"optimizer step (softmax attention through SDPA), the ensemble the stacked step (eager attention).{busy}\n\n"
        + markdown_table(("model", "way", "seed-steps / s", "vs the first row"), rows)
    )
