"""``hf-icl reproduce gd-icl synthetic``: GD models and models trained from scratch on the categorical RKHS task
against the number of training tasks L; the tables, the figures, the distance to the construction, the construction's
stationarity (:mod:`.stationary`) and the claims."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict

import torch

from ...modeling.gd_transformer import distance_to_construction
from ...training.seed_ensemble import build_seeded
from ..report import Subject, log
from .document import ACCURACY_TOLERANCE, ALIGNED
from .metrics import interval_text, learned_values, mean_of, query_logits, query_metrics, seed_stats
from .specs import (
    EVAL_STREAM,
    STATIONARITY_STREAM,
    ExperimentState,
    ModelSpec,
    Stream,
    SyntheticScale,
    gd_transformer_fields,
    synthetic_specs,
    synthetic_task,
)
from .stationary import CONTROL_STEP_FACTOR, STATIONARY_RATIO, loss_gradient, with_step_size_scaled
from .training import train_models


def synthetic_eval_set(s: SyntheticScale, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(xs, ys, query logits of the true task)``: fresh tasks from the evaluation stream of ``seed`` (a run uses
    its first seed's for every seed)."""
    xs, ys, params = synthetic_task(s).sample(
        s.eval_prompts, s.n_context + 1, seed=EVAL_STREAM + seed, return_params=True
    )
    return xs, ys, params["signal"][:, -1]


def relevant_groups(n_blocks: int) -> list[str]:
    """The head groups of :func:`distance_to_construction` that change the logits in the construction: head 1 of
    every block; head 2 (erase) of every block but the first (the first block's scratch slot is still 0); the
    cross-attention of every block but the last (the last expectation is never read), and so also no erase head in
    the last block (what it clears would only be overwritten by an expectation nobody reads)."""
    groups = [f"blocks.{b}.update.{part}" for b in range(n_blocks) for part in ("qk", "ov")]
    groups += [f"blocks.{b}.erase.{part}" for b in range(1, n_blocks - 1) for part in ("qk", "ov")]
    groups += [f"blocks.{b}.expect.{part}" for b in range(n_blocks - 1) for part in ("qk", "ov")]
    return groups


def synthetic(ctx: ExperimentState) -> None:
    scale, report = ctx.scale, ctx.report
    s = scale.synthetic
    specs = synthetic_specs(scale, ctx.steps)
    streams = [Stream("synthetic", n) for n in s.task_counts]
    trained = train_models(scale, [(st, sp) for st in streams for sp in specs], ctx.runs_dir, ctx.retrain, ctx.workers)
    # one evaluation set for every seed and model: the seeds' intervals measure training, and comparisons are paired
    eval_sets = [synthetic_eval_set(s, scale.seeds[0])] * len(scale.seeds)
    # metrics[name]["accuracy"|"nll"][L index][seed]
    metrics = {spec.name: {"accuracy": [], "nll": []} for spec in specs}
    distances = {spec.name: [] for spec in specs if spec.kind == "trained"}
    # agreement[name][L index][seed]: how often a trained model's top-1 class is its GD counterpart's
    agreement = {spec.name: [] for spec in specs if spec.kind == "trained" and _counterpart(specs, spec)}
    gd_learned = {spec.name: [] for spec in specs if spec.kind == "gd"}  # [L index][seed] learned η and h
    log(f"evaluating on {s.eval_prompts} fresh tasks")
    for stream in streams:
        logits = {}
        for spec in specs:
            models = trained[stream, spec]
            logits[spec.name] = [query_logits(m, xs, ys) for m, (xs, ys, _) in zip(models, eval_sets, strict=True)]
            scores = [query_metrics(lg, ys[:, -1]) for lg, (_, ys, _) in zip(logits[spec.name], eval_sets, strict=True)]
            metrics[spec.name]["accuracy"].append([a for a, _ in scores])
            metrics[spec.name]["nll"].append([n for _, n in scores])
            if spec.kind == "trained":
                distances[spec.name].append([distance_to_construction(m) for m in models])
            else:
                gd_learned[spec.name].append([learned_values(m) for m in models])
        for name in agreement:
            reference = logits[_counterpart(specs, next(sp for sp in specs if sp.name == name)).name]
            agreement[name].append(
                [mean_of(a.argmax(-1) == b.argmax(-1)) for a, b in zip(logits[name], reference, strict=True)]
            )
    references = {
        "oracle accuracy": query_metrics(eval_sets[0][2], eval_sets[0][1][:, -1])[0],
        "oracle NLL": query_metrics(eval_sets[0][2], eval_sets[0][1][:, -1])[1],
        "chance accuracy": 1 / s.n_classes,
        "chance NLL": math.log(s.n_classes),
    }
    init_distances = {
        spec.name: [
            distance_to_construction(
                build_seeded("gd_transformer", gd_transformer_fields(scale, streams[0], spec), seed)
            )
            for seed in scale.seeds
        ]
        for spec in specs
        if spec.kind == "trained"
    }
    ctx.synthetic = {"specs": specs, "metrics": metrics, "references": references}
    report.numbers["synthetic"] = {
        "task_counts": list(s.task_counts),
        "metrics": metrics,
        "references": references,
        "distances": distances,
        "init_distances": init_distances,
        "agreement_with_gd": agreement,
        "gd_learned": gd_learned,
    }
    _synthetic_tables(ctx, specs, metrics, references)
    _learned_table(ctx, specs, gd_learned)
    _distance_table(ctx, specs, distances, init_distances, agreement)
    from . import plots

    plots.add_synthetic_figures(report, s.task_counts, specs, metrics, references)
    _synthetic_claims(ctx, specs, metrics, distances, init_distances, agreement)
    _stationarity_claim(ctx, specs, metrics, trained, streams[-1])


def _counterpart(specs: Sequence[ModelSpec], spec: ModelSpec) -> ModelSpec | None:
    """The GD model with a trained model's kernel and depth, if the study has one."""
    return next((s for s in specs if s.kind == "gd" and (s.kernel, s.n_blocks) == (spec.kernel, spec.n_blocks)), None)


def _synthetic_tables(ctx: ExperimentState, specs, metrics, references) -> None:
    s = ctx.scale.synthetic
    header = "| model | " + " | ".join(f"L = {n}" for n in s.task_counts) + " |\n|---|" + "---|" * len(s.task_counts)
    for metric, title in (("accuracy", "Top-1 accuracy"), ("nll", "NLL")):
        rows = [
            f"| {spec.label} | " + " | ".join(interval_text(*seed_stats(v)) for v in metrics[spec.name][metric]) + " |"
            for spec in specs
        ]
        reference = "oracle accuracy" if metric == "accuracy" else "oracle NLL"
        chance = "chance accuracy" if metric == "accuracy" else "chance NLL"
        ctx.report.add(
            f"## Synthetic: {title.lower()} at the query (position N = {s.n_context}) vs the number of training tasks "
            f"L\n\nMean over seeds ± 95 % t interval on the same {s.eval_prompts} fresh tasks. The task's own "
            f"logits (oracle) reach {references[reference]:.3f}; chance is {references[chance]:.3f}.\n\n"
            f"{header}\n" + "\n".join(rows)
        )


def _learned_table(ctx: ExperimentState, specs, gd_learned) -> None:
    s = ctx.scale.synthetic
    header = "| model | " + " | ".join(f"L = {n}" for n in s.task_counts) + " |\n|---|" + "---|" * len(s.task_counts)
    rows = []
    for spec in specs:
        if spec.kind != "gd":
            continue
        cells = [
            f"η {interval_text(*seed_stats([v['step_size'] for v in per_seed]), digits=2)}, "
            f"h {interval_text(*seed_stats([v['bandwidth'] for v in per_seed]), digits=2)}"
            for per_seed in gd_learned[spec.name]
        ]
        rows.append(f"| {spec.label} | " + " | ".join(cells) + " |")
    ctx.report.add(
        "## Synthetic: what the GD models learned\n\nA GD model is the construction with three things learned from "
        "the training prompts: the class embeddings W_e (d' × C), the step size η (shared by every block) and the "
        "kernel bandwidth h (initial η = 1, h = 1, W_e ~ N(0, 1/d')). Mean over seeds ± 95 % t interval.\n\n"
        f"{header}\n" + "\n".join(rows)
    )


def _mean_relevant(result: dict[str, float], n_blocks: int, head: str) -> float:
    values = [result[g] for g in relevant_groups(n_blocks) if f".{head}." in g]
    return sum(values) / len(values) if values else math.nan


HEAD_GROUPS = ("update", "erase", "expect")


def _relevant_distance(result: dict[str, float], n_blocks: int) -> float:
    """The mean distance over the groups that matter (:func:`relevant_groups`)."""
    groups = relevant_groups(n_blocks)
    return sum(result[g] for g in groups) / len(groups)


def _distance_table(ctx: ExperimentState, specs, distances, init_distances, agreement) -> None:
    s = ctx.scale.synthetic
    rows = []
    for spec in specs:
        if spec.kind != "trained":
            continue
        per_l = [("init", init_distances[spec.name])]
        per_l += list(zip((f"L = {n}" for n in s.task_counts), distances[spec.name], strict=True))
        agreed = [None, *agreement[spec.name]] if spec.name in agreement else [None] * len(per_l)
        for (where, results), same in zip(per_l, agreed, strict=True):
            cells = []
            for head in HEAD_GROUPS:
                values = [_mean_relevant(r, spec.n_blocks, head) for r in results]
                cells.append("—" if math.isnan(values[0]) else interval_text(*seed_stats(values), digits=2))
            cells.append("—" if same is None else interval_text(*seed_stats(same), digits=2))
            rows.append(f"| {spec.label} | {where} | " + " | ".join(cells) + " |")
    ctx.report.add(
        "## Synthetic: distance of the trained parameters from the GD construction\n\n"
        "`distance_to_construction`: for each head, the fraction of its score form (qk) and value-output map (ov) "
        "that the construction's pattern, at the best positive scale, does not explain (0: the construction, 1: "
        "nothing of it). Averaged over qk and ov and over the blocks where the head changes the logits in the "
        "construction (head 1 everywhere; the erase head in every block but the first and the last; the "
        "cross-attention in every block but the last); mean over seeds ± 95 % t interval. 'init' is the random "
        "initialisation. Every number per block is in results.json. "
        "The distance does not remove every symmetry: a model that maps the label embedding "
        "through any M with the same W_eᵀ M W_e computes the same function and looks far; so the last column "
        "compares functions instead, the share of fresh tasks on which the trained model's top-1 class is that of "
        "the GD model with its kernel and depth (same L, same seed).\n\n"
        "| model | when | head 1 (update) | head 2 (erase) | cross-attention (expect) | top-1 agreement with GD |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(rows)
    )


def _converged_at_smallest(accuracy: list[list[float]]) -> tuple[bool, float, float]:
    """Whether the mean accuracy at the first L is within max(tolerance, the best L's interval) of the best L's."""
    stats = [seed_stats(v) for v in accuracy]
    means = [float(m) for m, _ in stats]
    best = max(range(len(means)), key=means.__getitem__)
    slack = max(ACCURACY_TOLERANCE, float(torch.nan_to_num(stats[best][1])))
    return means[0] >= means[best] - slack, means[0], means[best]


def _subjects(ctx: ExperimentState, metrics, *specs: ModelSpec) -> list[Subject]:
    """The testability subjects of a claim: each model's NLL at its best L (mean over seeds) against chance's
    ``log C`` (the uniform prediction, the trivial predictor of a categorical query)."""
    chance = math.log(ctx.scale.synthetic.n_classes)
    return [Subject(spec.label, min(mean_of(v) for v in metrics[spec.name]["nll"]), chance) for spec in specs]


def _synthetic_claims(ctx: ExperimentState, specs, metrics, distances, init_distances, agreement) -> None:
    s, report = ctx.scale.synthetic, ctx.report
    counts = list(s.task_counts)
    by = {(spec.kind, spec.kernel, spec.n_blocks): spec for spec in specs}
    chance = 1 / s.n_classes

    def acc(kind, kernel, blocks):
        return metrics[by[kind, kernel, blocks].name]["accuracy"]

    def models(*keys):
        return _subjects(ctx, metrics, *(by[key] for key in keys if key in by))

    small = counts[0] < 5000 and counts[-1] >= 5000
    # 1. GD 1 layer converges with L < 5000
    parts, ok = [], True
    for kernel in ("rbf", "softmax"):
        if ("gd", kernel, 1) not in by:
            continue
        converged, first, best = _converged_at_smallest(acc("gd", kernel, 1))
        ok &= converged and best > chance + 0.02
        parts.append(f"{kernel}: {first:.3f} at L = {counts[0]} vs best {best:.3f}")
    report.claim(
        f"GD (1 block) converges with L < 5000 (accuracy at the smallest L within {ACCURACY_TOLERANCE} or the "
        "interval of its best)",
        "converges with L < 5000 (RBF and softmax)",
        "; ".join(parts),
        ok if small and bool(parts) else None,
        models(("gd", "rbf", 1), ("gd", "softmax", 1)),
    )
    # 2 and 4: trained needs L > threshold to match GD
    for blocks, threshold, kernels in ((1, 10000, ("rbf", "softmax")), (2, 25000, ("softmax",))):
        needs_more_tasks_claim(ctx, by, metrics, blocks, threshold, kernels)
    # 3. GD 2 layers converges with L < 5000 and beats 1 layer
    if {("gd", "softmax", 1), ("gd", "softmax", 2)} <= set(by):
        converged, first, best = _converged_at_smallest(acc("gd", "softmax", 2))
        two, one = acc("gd", "softmax", 2)[-1], acc("gd", "softmax", 1)[-1]
        wins = sum(a > b for a, b in zip(two, one, strict=True))
        report.claim(
            "GD (2 blocks, softmax) converges with L < 5000 and beats 1 block (at the largest L, in every seed)",
            "converges with L < 5000, outperforming 1 layer",
            f"{first:.3f} at L = {counts[0]} vs best {best:.3f}; 2 vs 1 block at L = {counts[-1]}: "
            f"{mean_of(two):.3f} vs {mean_of(one):.3f}, better in {wins}/{len(two)} seeds",
            (converged and wins == len(two)) if small else None,
            models(("gd", "softmax", 1), ("gd", "softmax", 2)),
        )
    # 5. 2 -> 6 blocks improve GD
    parts, ok, tested = [], True, False
    for kernel in ("rbf", "softmax"):
        if not {("gd", kernel, 2), ("gd", kernel, 6)} <= set(by):
            continue
        tested = True
        a2, a6 = acc("gd", kernel, 2)[-1], acc("gd", kernel, 6)[-1]
        n2 = metrics[by["gd", kernel, 2].name]["nll"][-1]
        n6 = metrics[by["gd", kernel, 6].name]["nll"][-1]
        better_acc = sum(x > y for x, y in zip(a6, a2, strict=True))
        better_nll = sum(x < y for x, y in zip(n6, n2, strict=True))
        ok &= better_acc == len(a2) and better_nll == len(a2)
        parts.append(
            f"{kernel}: accuracy {mean_of(a2):.3f} → {mean_of(a6):.3f} (better in {better_acc}/{len(a2)} seeds), NLL "
            f"{mean_of(n2):.3f} → {mean_of(n6):.3f} (better in {better_nll}/{len(a2)})"
        )
    report.claim(
        f"GD: 6 blocks improve on 2 blocks in accuracy and NLL (at L = {counts[-1]}, in every seed)",
        "2 → 6 blocks consistently improve top-1 accuracy and NLL",
        "; ".join(parts),
        ok if tested else None,
        models(*(("gd", kernel, blocks) for kernel in ("rbf", "softmax") for blocks in (2, 6))),
    )
    _alignment_claim(ctx, by, metrics, distances, init_distances, agreement)


def needs_more_tasks_claim(ctx: ExperimentState, by, metrics, blocks: int, threshold: int, kernels) -> None:
    counts = list(ctx.scale.synthetic.task_counts)
    parts, outcomes = [], []
    for kernel in kernels:
        if ("trained", kernel, blocks) not in by or ("gd", kernel, blocks) not in by:
            continue
        trained = metrics[by["trained", kernel, blocks].name]["accuracy"]
        gd = metrics[by["gd", kernel, blocks].name]["accuracy"]
        means = [(mean_of(t), mean_of(g)) for t, g in zip(trained, gd, strict=True)]
        matched = [n for n, (t, g) in zip(counts, means, strict=True) if t >= g - ACCURACY_TOLERANCE]
        first = matched[0] if matched else None
        outcomes.append(first)
        gaps = ", ".join(f"L={n}: {t:.3f} vs {g:.3f}" for n, (t, g) in zip(counts, means, strict=True))
        parts.append(f"{kernel}: first matches GD at L = {first if first else 'none'} ({gaps})")
    if not outcomes:
        return
    testable_grid = counts[0] <= threshold < counts[-1]
    early = any(first is not None and first <= threshold for first in outcomes)
    late = all(first is not None and first > threshold for first in outcomes)
    ctx.report.claim(
        f"Trained ({blocks} block{'s' if blocks > 1 else ''}) needs L > {threshold} to match GD (within "
        f"{ACCURACY_TOLERANCE} accuracy); not testable when it never matches in the grid (too few tasks or too few "
        "steps)",
        f"requires L > {threshold} to match GD",
        "; ".join(parts),
        late if testable_grid and (early or late) else None,
        _subjects(
            ctx,
            metrics,
            *(by[kind, k, blocks] for k in kernels for kind in ("gd", "trained") if (kind, k, blocks) in by),
        ),
    )


def _alignment_claim(ctx: ExperimentState, by, metrics, distances, init_distances, agreement) -> None:
    counts, chance = ctx.scale.synthetic.task_counts, 1 / ctx.scale.synthetic.n_classes
    parts, ok, learned_all = [], True, True
    for (kind, kernel, blocks), spec in by.items():
        if kind != "trained":
            continue
        gd = by.get(("gd", kernel, blocks))
        accuracy = mean_of(metrics[spec.name]["accuracy"][-1])
        reference = mean_of(metrics[gd.name]["accuracy"][-1]) if gd else accuracy
        learned = accuracy - chance >= 0.5 * (reference - chance) and accuracy > chance + 0.02
        learned_all &= learned
        final_mean = mean_of([_relevant_distance(r, blocks) for r in distances[spec.name][-1]])
        start_mean = mean_of([_relevant_distance(r, blocks) for r in init_distances[spec.name]])
        ok &= final_mean <= ALIGNED and final_mean < start_mean
        same = f", top-1 agreement with GD {mean_of(agreement[spec.name][-1]):.2f}" if spec.name in agreement else ""
        parts.append(f"{spec.label}: {start_mean:.2f} at init → {final_mean:.2f} at L = {counts[-1]}{same}")
    if not parts:
        return
    ctx.report.claim(
        f"Trained parameters align with the GD construction (mean distance of the heads that matter ≤ {ALIGNED} and "
        "below the initialisation's, at the largest L; testable once every trained model learned at least half of "
        "GD's gain over chance)",
        "trained parameters highly align with the GD stationary point",
        "; ".join(parts),
        ok if learned_all else None,
        _subjects(ctx, metrics, *(spec for (kind, _, _), spec in by.items() if kind == "trained")),
    )


def _stationarity_claim(ctx: ExperimentState, specs, metrics, trained, stream: Stream) -> None:
    """The theorem's row: the loss gradient at each GD model of the largest L (every seed) against its noise floor,
    and at the control (every step size × 1.5) that shows whether the prompts suffice (:mod:`.stationary`),
    on ``stationarity_prompts`` fresh prompts."""
    s = ctx.scale.synthetic
    xs, ys = synthetic_task(s).sample(s.stationarity_prompts, s.n_context + 1, seed=STATIONARITY_STREAM)
    log(f"stationarity: loss gradients on {len(xs)} fresh prompts")
    gd_specs = [spec for spec in specs if spec.kind == "gd"]
    if not gd_specs:
        return
    rows, results = [], {}
    for spec in gd_specs:
        models = trained[stream, spec]
        at_gd = [loss_gradient(model, xs, ys, s.n_context) for model in models]
        shifted = [with_step_size_scaled(model, CONTROL_STEP_FACTOR) for model in models]
        at_control = [loss_gradient(model, xs, ys, s.n_context) for model in shifted]
        results[spec.name] = {"gd": [asdict(r) for r in at_gd], "control": [asdict(r) for r in at_control]}
        cells = [
            interval_text(*seed_stats([r.gradient_norm for r in at_gd]), digits=4),
            interval_text(*seed_stats([r.noise_floor for r in at_gd]), digits=4),
            interval_text(*seed_stats([r.ratio for r in at_gd]), digits=1),
            interval_text(*seed_stats([r.gradient_norm for r in at_control]), digits=4),
            interval_text(*seed_stats([r.ratio for r in at_control]), digits=1),
        ]
        rows.append(f"| {spec.label} | " + " | ".join(cells) + " |")
    ctx.report.numbers["synthetic"]["stationarity"] = results
    ctx.report.add(
        f"## Synthetic: is the GD construction a stationary point of the loss? (L = {stream.n_tasks})\n\n"
        f"The gradient of the query cross-entropy with respect to every attention parameter (all but W_e), estimated "
        f"on {len(xs)} fresh prompts in 20 chunks: the norm of the mean chunk gradient, the norm of its "
        "standard error (the noise floor: a zero gradient's estimate has about this norm) and their ratio (≤ "
        f"{STATIONARY_RATIO:g}: indistinguishable from zero at this many prompts), at the trained GD models (the "
        "construction with W_e, η and h learned) and at the control, the same models with every step size × "
        f"{CONTROL_STEP_FACTOR:g} (a ratio above {STATIONARY_RATIO:g} there shows the prompts are enough to see a "
        "gradient). Mean over seeds ± 95 % t interval. The theorem assumes rotationally invariant inputs; this task's "
        "are uniform on a cube.\n\n| model | ‖gradient‖ at GD | noise floor | ratio | ‖gradient‖ at the control | "
        "ratio at the control |\n|---|---|---|---|---|---|\n" + "\n".join(rows)
    )

    def mean_ratio(name: str, where: str) -> float:
        return mean_of([r["gradient_norm"] / r["noise_floor"] for r in results[name][where]])

    stationary = all(
        r["gradient_norm"] <= STATIONARY_RATIO * r["noise_floor"] for v in results.values() for r in v["gd"]
    )
    powered = all(
        r["gradient_norm"] > STATIONARY_RATIO * r["noise_floor"] for v in results.values() for r in v["control"]
    )
    ctx.report.claim(
        f"The GD construction is a stationary point of the attention model's loss (the gradient at the trained GD "
        f"models within {STATIONARY_RATIO:g}× its noise floor in every seed, while the control's, every η × "
        f"{CONTROL_STEP_FACTOR:g}, is above it; not testable when the control's is not)",
        "Theorems 1-2: the GD parameter configuration is a stationary point (rotationally invariant inputs)",
        "‖gradient‖ / noise floor at GD vs at the control: "
        + ", ".join(
            f"{spec.label} {mean_ratio(spec.name, 'gd'):.1f} vs {mean_ratio(spec.name, 'control'):.1f}"
            for spec in gd_specs
        )  # fmt: skip
        + " (uniform inputs: the theorem's rotational invariance does not hold here)",
        stationary if powered else None,
        _subjects(ctx, metrics, *gd_specs),
    )
