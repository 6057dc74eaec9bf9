"""Training the gd-icl study's models: GD models as the construction with only ``W_e``, η and h learned
(:class:`GDConstructionEnsemble`), models trained from scratch as stacked seeds
(:class:`~hf_icl.training.seed_ensemble.SeedEnsemble`), in lockstep per prompt stream, dealt to worker processes,
saved per seed (``save_pretrained`` and a model manifest, with ``metrics.json``) and reused while their spec
(:func:`~.specs.training_spec`) is unchanged (:func:`train_models`); checkpointed as they train and resumed, bit for
bit, when a stream's training stopped (:func:`_train_stream`). Both kinds step through
:func:`~hf_icl.training.seed_ensemble.stacked_optimizer_step`, which checks every seed's loss, gradient norm and
parameters finite (else :class:`~hf_icl.training.TrainingDivergedError` naming the seed and the step)."""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.func import functional_call, grad_and_value, vmap

from ...data.episodes import digit_features, sample_episodes
from ...evaluation.runs import METRICS_FILE, write_metrics
from ...modeling.gd_transformer import GDTransformerForInContextClassification, construction_parameters
from ...training.checkpoints import checkpoint_dir
from ...training.run_cache import read_run, write_run
from ...training.seed_checkpoints import common_resume_step, resuming
from ...training.seed_ensemble import SeedEnsemble, StackedSeeds
from ...validation import check_float, check_int
from ..report import log, usable_cores
from ..workers import worker_pool
from .specs import (
    BATCH_STREAM,
    ModelSpec,
    Scale,
    Stream,
    gd_transformer_fields,
    synthetic_task,
    synthetic_training_prompts,
    training_spec,
)


# -- the GD models: the construction with only its free numbers learned ------------------------------------------------
def initial_embeddings(embed_dim: int, n_classes: int, seed: int) -> torch.Tensor:
    """``W_e (d', C)`` drawn N(0, 1/d') from ``seed`` (the model's own initial scale)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(embed_dim, n_classes, generator=generator) / math.sqrt(embed_dim)


class GDConstructionEnsemble(StackedSeeds):
    """The seeds of one GD-constructed model, trained as one stacked model: only ``W_e``, η and h are learned.

    Each seed's model is ``from_gd_construction(n_blocks, η, kernel, W_e, bandwidth=h, **fields)``. Training calls
    the construction's own transformer (:func:`torch.func.functional_call`) with every weight at the construction's
    value except three: ``class_embedding.weight = W_e``, each block's head-1 output map ``η P`` (P: the
    construction's pattern for η = 1), and head 1's query and key maps scaled by ``a`` so that the kernel has bandwidth
    h (``a² = h₀/h`` for the softmax/linear kernels ``qᵀk/h₀``, ``a = h₀/h`` for the RBF kernel). The seeds are
    mapped with :func:`torch.func.vmap`; each keeps its own data, gradient clipping and Adam state (Adam is
    elementwise). Its step and save are :class:`~hf_icl.training.seed_ensemble.StackedSeeds`' (as
    :class:`~hf_icl.training.seed_ensemble.SeedEnsemble`'s): every step checks each seed's loss, gradient norm and
    parameters finite, and :meth:`save` writes manifested ``seed<seed>`` model folders.

    Args:
        n_blocks: K, the number of GD steps.
        kernel: ``"softmax"``, ``"rbf"`` or ``"linear"``.
        fields: the other :class:`~hf_icl.modeling.gd_transformer.GDTransformerConfig` fields (``n_dims``,
            ``n_points``, ``normalize_by_count``, …); ``embed_dim`` and ``n_classes`` are required (they shape W_e).
        n_context: train and predict on prompts of ``n_context`` context pairs followed by queries (the model's
            ``n_context=`` protocol); None: every position as its prefix's query.
        seeds: one model per seed; ``W_e`` starts at :func:`initial_embeddings` of the seed.
        learning_rate: Adam's step size.
        initial_step_size, initial_bandwidth: η and h at the start.
        max_grad_norm: per-seed gradient clipping (0: off).

    Example::

        >>> import torch
        >>> fields = dict(n_dims=2, n_points=6, embed_dim=4, n_classes=3, normalize_by_count=True)
        >>> ensemble = GDConstructionEnsemble(2, "rbf", fields, seeds=(0, 1), learning_rate=1e-2, n_context=5)
        >>> xs, ys = torch.rand(2, 8, 6, 2), torch.randint(3, (2, 8, 6))  # (seeds, batch, points, d)
        >>> ensemble.step(xs, ys).shape
        torch.Size([2])
        >>> [m.config.n_blocks for m in ensemble.models()]
        [2, 2]
    """

    def __init__(
        self,
        n_blocks: int,
        kernel: str,
        fields: dict,
        seeds: Sequence[int],
        learning_rate: float,
        *,
        initial_step_size: float = 1.0,
        initial_bandwidth: float = 1.0,
        max_grad_norm: float = 1.0,
        n_context: int | None = None,
    ):
        if not seeds:
            raise ValueError("seeds must name at least one seed, got an empty sequence")
        check_int("n_blocks", n_blocks, low=1)
        self.forward_kwargs = {"check_inputs": False, "n_context": n_context}
        check_float("learning_rate", learning_rate, low=0, low_inclusive=False)
        check_float("initial_step_size", initial_step_size)
        check_float("initial_bandwidth", initial_bandwidth, low=0, low_inclusive=False)
        self.max_grad_norm = check_float("max_grad_norm", max_grad_norm, low=0)
        missing = sorted({"embed_dim", "n_classes"} - set(fields))
        if missing:
            raise ValueError(f"fields must give embed_dim and n_classes (they shape W_e), missing {missing}")
        self.n_blocks, self.kernel, self.seeds = n_blocks, kernel, tuple(seeds)
        self.fields = {k: v for k, v in fields.items() if k not in ("embed_dim", "n_classes")}
        embeddings = [initial_embeddings(fields["embed_dim"], fields["n_classes"], seed) for seed in self.seeds]
        template = GDTransformerForInContextClassification.from_gd_construction(
            n_blocks, 1.0, kernel, embeddings[0], bandwidth=initial_bandwidth, **self.fields
        )
        self.patterns = construction_parameters(template.config, 1.0, embeddings[0])
        self.template = template.to("meta")  # stateless: every weight comes from _weights
        self.initial_bandwidth = initial_bandwidth
        # the query/key zoom a that moves the bandwidth from h0 to h: a = (h0/h)^power
        self.zoom_power = 1.0 if kernel == "rbf" else 0.5
        size = len(self.seeds)
        self.params = {
            "W_e": torch.stack(embeddings),
            # (S, 1), not (S,): per-seed clipping flattens every tensor from dim 1
            "step_size": torch.full((size, 1), float(initial_step_size)),
            "log_bandwidth": torch.full((size, 1), math.log(initial_bandwidth)),
        }
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=learning_rate, weight_decay=0.0)
        self.steps_done = 0  # optimizer steps taken (the step a divergence error names)
        self._grads = vmap(grad_and_value(self._loss))
        self._logits = vmap(self._forward_logits, in_dims=(0, None, None))

    def _weights(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        weights = dict(self.patterns)
        weights["class_embedding.weight"] = params["W_e"]
        zoom = torch.exp(self.zoom_power * (math.log(self.initial_bandwidth) - params["log_bandwidth"]))
        for b in range(self.n_blocks):
            head = f"blocks.{b}.self_attention."
            weights[head + "update_output.weight"] = params["step_size"] * self.patterns[head + "update_output.weight"]
            for name in ("update_query.weight", "update_key.weight"):
                weights[head + name] = zoom * self.patterns[head + name]
        return weights

    def _call(self, params, xs, ys):
        return functional_call(self.template, self._weights(params), (xs, ys), self.forward_kwargs)

    def _loss(self, params, xs, ys):
        return self._call(params, xs, ys).loss

    def _forward_logits(self, params, xs, ys):
        return self._call(params, xs, ys).logits

    def gradients(self, xs: torch.Tensor, ys: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Every seed's gradient of ``W_e``, η and log h and its ``(S,)`` training loss on its own batch."""
        return self._grads(self.params, xs, ys)

    @torch.no_grad()
    def logits(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        """Every seed's logits ``(S, B, N, C)`` on the same prompts, through the training path."""
        return self._logits(self.params, xs, ys)

    def learned(self) -> list[dict[str, float]]:
        """Each seed's learned η and h (and ‖W_e‖, the Frobenius norm of its class embeddings)."""
        return [
            {
                "step_size": float(self.params["step_size"][i]),
                "bandwidth": float(self.params["log_bandwidth"][i].exp()),
                "embedding_norm": float(self.params["W_e"][i].norm()),
            }
            for i in range(self.size)
        ]

    def models(self) -> list[GDTransformerForInContextClassification]:
        """One ordinary model per seed: the construction with the seed's learned ``W_e``, η and h."""
        return [
            GDTransformerForInContextClassification.from_gd_construction(
                self.n_blocks,
                values["step_size"],
                self.kernel,
                self.params["W_e"][i].clone(),
                bandwidth=values["bandwidth"],
                **self.fields,
            )  # fmt: skip
            for i, values in enumerate(self.learned())
        ]


def batch_generators(scale: Scale) -> list[torch.Generator]:
    """The generators of every seed's training batches, at the start of its stream."""
    return [torch.Generator().manual_seed(BATCH_STREAM + seed) for seed in scale.seeds]


def _batches(scale: Scale, stream: Stream, generators: Sequence[torch.Generator] | None = None):
    """An endless iterator of ``(xs (S, B, N, d), ys (S, B, N))``: one batch per seed, each seed its own stream,
    drawn from ``generators`` (default: :func:`batch_generators`; the caller may read and set their states between
    batches to checkpoint and resume the stream)."""
    generators = batch_generators(scale) if generators is None else list(generators)
    if stream.experiment == "synthetic":
        s = scale.synthetic
        if s.training_set == "task_pool":
            tasks = [synthetic_task(s, stream.n_tasks, pool_seed=seed) for seed in scale.seeds]

            def draw(task, generator):
                return task.sample(s.batch_size, s.n_context + 1, generator=generator)

        else:  # L prompts drawn once per seed; each batch picks B of them (with replacement)
            tasks = [synthetic_training_prompts(s, stream.n_tasks, seed) for seed in scale.seeds]

            def draw(prompts, generator):
                rows = torch.randint(len(prompts[0]), (s.batch_size,), generator=generator)
                return prompts[0][rows], prompts[1][rows]

        sources = list(zip(tasks, generators, strict=True))
    else:
        f = scale.features
        features, labels = digit_features(f.train_classes, f.n_components)

        def draw(_, generator):
            episodes = sample_episodes(
                features, labels, f.batch_size, n_ways=f.n_ways, n_shots=f.n_shots, n_queries=1,
                classes=f.train_classes, generator=generator,
            )  # fmt: skip
            return episodes.prompts()

        sources = [(None, g) for g in generators]
    while True:
        drawn = [draw(task, generator) for task, generator in sources]
        yield torch.stack([xs for xs, _ in drawn]), torch.stack([ys for _, ys in drawn])


def _trainer(scale: Scale, stream: Stream, spec: ModelSpec):
    """The document's training: prompts of N context pairs and one query, the cross-entropy at the query."""
    fields = gd_transformer_fields(scale, stream, spec)
    n_context = fields["n_points"] - 1
    if spec.kind == "gd":
        return GDConstructionEnsemble(
            spec.n_blocks, spec.kernel, fields, scale.seeds, spec.learning_rate, n_context=n_context
        )
    return SeedEnsemble(
        "gd_transformer", fields, scale.seeds, spec.learning_rate, loss_per_dim=False,
        forward_kwargs={"n_context": n_context},
    )  # fmt: skip


#: checkpoints each model keeps while it trains (the newest; removed once the model is finished)
KEEP_CHECKPOINTS = 2


def default_checkpoint_every(spec: ModelSpec) -> int:
    """A checkpoint every tenth of the model's steps (at least every step of a model trained for fewer than ten)."""
    return max(1, spec.steps // 10)


def _checkpoint_step(step: int, specs: Sequence[ModelSpec]) -> bool:
    """Whether the models of a stream still training at ``step`` write checkpoints there: at every tenth of each
    unfinished model's steps, all of them at once, so that they always share a step to resume at."""
    return any(step < spec.steps and step % default_checkpoint_every(spec) == 0 for spec in specs)


def write_model_metrics(
    run_dir: Path, scale: Scale, stream: Stream, spec: ModelSpec, trainer, losses: torch.Tensor
) -> Path:
    """``run_dir/metrics.json`` (:func:`~hf_icl.evaluation.runs.write_metrics`' format, no evaluations: the study
    scores the models itself): ``stream``, ``spec`` (the model), ``seeds``, ``per_seed`` (seed ->
    ``final_train_loss``, its mean training loss over the last tenth of the steps, and for a GD model its learned
    ``step_size``, ``bandwidth`` and ``embedding_norm``), ``curves`` (``train``: per seed, the loss of every step) and
    ``scalars`` (the mean over seeds of the final training loss, the steps). ``losses`` is ``(steps, S)``."""
    final = losses[-default_checkpoint_every(spec) :].mean(0).tolist()
    learned = trainer.learned() if isinstance(trainer, GDConstructionEnsemble) else [{} for _ in scale.seeds]
    per_seed = {
        str(seed): {"final_train_loss": loss, **values}
        for seed, loss, values in zip(scale.seeds, final, learned, strict=True)
    }
    return write_metrics(
        run_dir / METRICS_FILE,
        {},
        model="gd_transformer",
        task=stream.experiment,
        scalars={"final_train_loss": sum(final) / len(final), "steps": spec.steps},
        stream=stream.name,
        spec=spec.name,
        seeds=list(scale.seeds),
        per_seed=per_seed,
        curves={"window": 1, "train": losses.T.tolist()},
    )


def _resume(trainers, curves, generators, run_dirs, run_specs, names, resume: bool) -> int:
    """The step the stream goes on from: the newest one every model has a checkpoint of (loaded into ``trainers``,
    ``curves`` and the batch ``generators``) when ``resume``, else 0
    (:func:`~hf_icl.training.seed_checkpoints.common_resume_step` removes the checkpoints not resumed)."""
    step = common_resume_step(run_dirs, run_specs, resume=resume)
    if step is None:
        return 0
    states = None
    for i, (trainer, run_dir, run_spec, name) in enumerate(zip(trainers, run_dirs, run_specs, names, strict=True)):
        folder = checkpoint_dir(run_dir, step)
        with resuming(name, folder):
            extra = trainer.load_checkpoint(folder, spec=run_spec)
            losses, saved = extra["losses"], extra["generators"]
            if not isinstance(losses, torch.Tensor) or losses.shape != (step, len(trainer.seeds)):
                raise ValueError(f"its losses are not one per step and seed ({step}, {len(trainer.seeds)})")
            if states is not None and not all(torch.equal(a, b) for a, b in zip(states, saved, strict=True)):
                raise ValueError(f"its batch stream is not the other models' at step {step}")
            states = saved
        curves[i] = list(losses.unbind(0))
        log(f"  {name}: resumed from {folder} at step {step}")
    for generator, state in zip(generators, states, strict=True):
        generator.set_state(state)
    return step


def _train_stream(
    scale: Scale, stream: Stream, specs: Sequence[ModelSpec], runs_dir: Path, *, resume: bool = True
) -> None:
    """Train ``specs`` in lockstep on one stream's batches (each model for its own number of steps) and save each
    model once it is finished: its seeds (``runs_dir/STREAM/MODEL/seed<seed>``), ``metrics.json``
    (:func:`write_model_metrics`) and ``run.json`` with the loss of every step.

    At every tenth of each unfinished model's steps (:func:`_checkpoint_step`) every unfinished model writes a
    checkpoint (its seeds, optimizer, losses so far and the batch generators' states) into
    ``runs_dir/STREAM/MODEL/checkpoints`` (the newest :data:`KEEP_CHECKPOINTS` kept); with ``resume`` a stream that
    stopped goes on from the newest step every model has a checkpoint of, and ends with the losses and weights of a
    stream never stopped. A model's checkpoints are removed once it is saved."""
    trainers = [_trainer(scale, stream, spec) for spec in specs]
    run_dirs = [runs_dir / stream.name / spec.name for spec in specs]
    run_specs = [training_spec(scale, stream, spec) for spec in specs]
    names = [f"{stream.name}/{spec.name}" for spec in specs]
    generators = batch_generators(scale)
    curves: list[list[torch.Tensor]] = [[] for _ in specs]
    first = _resume(trainers, curves, generators, run_dirs, run_specs, names, resume)
    batches = _batches(scale, stream, generators)
    steps = max(spec.steps for spec in specs)
    clock = time.perf_counter()
    for step in range(first + 1, steps + 1):
        xs, ys = next(batches)
        for spec, trainer, curve in zip(specs, trainers, curves, strict=True):
            if step <= spec.steps:
                curve.append(trainer.step(xs, ys))
        if step % max(1, steps // 5) == 0:
            losses = ", ".join(
                f"{spec.name} {float(curve[-1].mean()):.3f}"
                for spec, curve in zip(specs, curves, strict=True)
                if step <= spec.steps
            )
            log(f"  {stream.name} step {step}/{steps} ({time.perf_counter() - clock:.0f} s): {losses}")
        checkpoint = _checkpoint_step(step, specs)
        states = [g.get_state() for g in generators] if checkpoint else None
        for spec, trainer, curve, run_dir, run_spec in zip(specs, trainers, curves, run_dirs, run_specs, strict=True):
            if checkpoint and step < spec.steps:
                extra = {"generators": states, "losses": torch.stack(curve)}
                trainer.save_checkpoint(run_dir, extra, spec=run_spec, keep=KEEP_CHECKPOINTS)
            elif step == spec.steps:  # finished: saved now, reused from here on, never resumed
                losses = torch.stack(curve)
                trainer.save(run_dir)
                write_model_metrics(run_dir, scale, stream, spec, trainer, losses)
                write_run(run_dir, run_spec, tensors={"losses": losses})
                shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)


def _load_run(scale: Scale, stream: Stream, spec: ModelSpec, runs_dir: Path):
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    run_dir = runs_dir / stream.name / spec.name
    if read_run(run_dir, training_spec(scale, stream, spec)) is None:
        return None
    hf_logging.disable_progress_bar()
    return [AutoModel.from_pretrained(run_dir / f"seed{seed}").eval() for seed in scale.seeds]


def _train_in_worker(
    scale: Scale, jobs: list[tuple[Stream, ModelSpec]], runs_dir: str, threads: int, resume: bool = True
) -> None:
    torch.set_num_threads(threads)
    _train_jobs(scale, jobs, Path(runs_dir), resume=resume)


def _train_jobs(scale: Scale, jobs: Sequence[tuple[Stream, ModelSpec]], runs_dir: Path, *, resume: bool = True) -> None:
    streams = list(dict.fromkeys(stream for stream, _ in jobs))
    for stream in streams:
        _train_stream(scale, stream, [spec for s, spec in jobs if s == stream], runs_dir, resume=resume)


def train_models(
    scale: Scale,
    jobs: Sequence[tuple[Stream, ModelSpec]],
    runs_dir: Path,
    retrain: bool = False,
    workers: int | None = None,
) -> dict[tuple[Stream, ModelSpec], list[torch.nn.Module]]:
    """Train every ``(stream, model)`` job for every seed, reusing finished runs with the same spec; returns the
    models per seed. Pending jobs are dealt to ``workers`` processes (default one per core) by their cost; a stream
    that stopped goes on from its checkpoints (:func:`_train_stream`), except with ``retrain``: then every job is
    trained from the start."""
    pending = [job for job in jobs if retrain or _load_run(scale, *job, runs_dir) is None]
    for job in jobs:
        if job not in pending:
            log(f"reusing {runs_dir / job[0].name / job[1].name} (trained with the same spec)")
    workers = min(workers or usable_cores(), len(pending))
    if pending:
        log(f"training {len(pending)} model(s) × {len(scale.seeds)} seeds in {max(workers, 1)} process(es)")
    if workers == 1:
        _train_jobs(scale, pending, runs_dir, resume=not retrain)
    elif workers > 1:
        shares: list[list] = [[] for _ in range(workers)]
        loads = [0.0] * workers
        for job in sorted(pending, key=lambda j: -j[1].cost):  # the dearest first, to the least loaded process
            i = loads.index(min(loads))
            shares[i].append(job)
            loads[i] += job[1].cost
        threads = max(1, usable_cores() // workers)
        with worker_pool(workers) as pool:
            futures = [
                pool.submit(_train_in_worker, scale, share, str(runs_dir), threads, not retrain) for share in shares
            ]
            for future in futures:
                future.result()
    return {job: _load_run(scale, *job, runs_dir) for job in jobs}
