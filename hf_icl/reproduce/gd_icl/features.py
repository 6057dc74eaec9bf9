"""``hf-icl reproduce gd-icl features``: GD models with 1-3 blocks on digit features of held-out classes against
linear probing, and the claims."""

from __future__ import annotations

import math

from ...data.episodes import Episodes, digit_features, sample_episodes
from ...estimators.linear_probe import linear_probe
from ..report import Subject, log
from .metrics import interval_text, learned_values, mean_of, model_query_metrics, query_metrics, seed_stats
from .specs import EVAL_STREAM, ExperimentState, FeatureScale, Stream, feature_specs
from .training import train_models


def features(ctx: ExperimentState) -> None:
    scale, report = ctx.scale, ctx.report
    f = scale.features
    specs = feature_specs(scale, ctx.steps)
    stream = Stream("features")
    trained = train_models(scale, [(stream, spec) for spec in specs], ctx.runs_dir, ctx.retrain, ctx.workers)
    data, labels = digit_features(f.train_classes, f.n_components)
    accuracy = {spec.name: [] for spec in specs} | {"linear_probe": []}
    nll = {name: [] for name in accuracy}
    learned = {spec.name: [] for spec in specs}
    log(f"evaluating on {f.eval_episodes} test-class episodes (and linear probing on each)")
    episodes = feature_eval_episodes(f, scale.seeds[0])  # the same episodes for every seed and method
    xs, ys = episodes.prompts()
    for spec in specs:
        for model in trained[stream, spec]:
            a, n = model_query_metrics(model, xs, ys)
            accuracy[spec.name].append(a)
            nll[spec.name].append(n)
            learned[spec.name].append(learned_values(model))
    probabilities = linear_probe(episodes).reshape(-1, f.n_ways)  # no seed: one fit per episode, deterministic
    a, n = query_metrics(probabilities.clamp_min(1e-12).log(), episodes.query_y.reshape(-1))
    accuracy["linear_probe"].append(a)
    nll["linear_probe"].append(n)
    labels_of = {spec.name: spec.label for spec in specs} | {"linear_probe": "linear probing (per episode)"}
    rows = [
        f"| {labels_of[name]} | {interval_text(*seed_stats(accuracy[name]))} | "
        f"{interval_text(*seed_stats(nll[name]))} | "
        + (_learned_text(learned[name]) if name in learned else "a fit per episode")
        + " |"
        for name in accuracy
    ]
    report.add(
        f"## Features: {f.n_ways}-way {f.n_shots}-shot episodes of held-out digit classes {list(f.test_classes)}\n\n"
        f"Digits (scikit-learn's bundled 8×8 images) through PCA-{f.n_components} fitted on the training classes "
        f"{list(f.train_classes)} only; GD models trained on training-class episodes, then evaluated without any "
        f"fitting on {f.eval_episodes} test episodes × {f.n_queries} queries (the same for every seed and method); "
        "linear probing is a logistic regression fitted on each test episode's context (deterministic: one number). "
        "GD: mean over seeds ± 95 % t interval; the learned step size η and bandwidth h of each seed.\n\n"
        "| method | top-1 accuracy | NLL | learned |\n|---|---|---|---|\n" + "\n".join(rows)
    )
    report.numbers["features"] = {"accuracy": accuracy, "nll": nll, "learned": learned}
    from . import plots

    plots.add_feature_figure(report, accuracy, labels_of)
    _feature_claims(ctx, specs, accuracy, nll)


def feature_eval_episodes(f: FeatureScale, seed: int) -> Episodes:
    """The held-out-class episodes every method is scored on (drawn from the evaluation stream of ``seed``)."""
    data, labels = digit_features(f.train_classes, f.n_components)
    return sample_episodes(
        data, labels, f.eval_episodes, n_ways=f.n_ways, n_shots=f.n_shots, n_queries=f.n_queries,
        classes=f.test_classes, seed=EVAL_STREAM + seed,
    )  # fmt: skip


def _learned_text(values: list[dict[str, float]]) -> str:
    """``η 0.79 / 0.82; h 0.19 / 0.20`` over the seeds."""
    return "; ".join(
        f"{symbol} " + " / ".join(f"{v[key]:.3g}" for v in values)
        for symbol, key in (("η", "step_size"), ("h", "bandwidth"))
    )


def _feature_claims(ctx: ExperimentState, specs, accuracy, nll) -> None:
    def mean(name):
        return mean_of(accuracy[name])

    probe = mean("linear_probe")
    by_blocks = {spec.n_blocks: spec.name for spec in specs}
    chance = math.log(ctx.scale.features.n_ways)

    def subjects(*names):  # the GD models against chance's NLL; linear probing must beat chance itself
        models = [Subject(name, mean_of(nll[name]), chance) for name in names]
        return [*models, Subject("linear probing", mean_of(nll["linear_probe"]), chance, kind="baseline")]

    if 1 in by_blocks:
        one = mean(by_blocks[1])
        ctx.report.claim(
            "GD (1 block) is slightly below linear probing (below it by at most 0.05 accuracy)",
            "slightly lower than linear probing",
            f"{one:.3f} vs {probe:.3f}",
            bool(0 < probe - one <= 0.05),
            subjects(by_blocks[1]),
        )
    deeper = [b for b in (2, 3) if b in by_blocks]
    if deeper:
        gaps = {b: mean(by_blocks[b]) - probe for b in deeper}
        ctx.report.claim(
            "GD (2-3 blocks) almost equals linear probing (within 0.02 accuracy, or above it)",
            "almost identical to linear probing, without fine-tuning",
            "; ".join(f"{b} blocks {mean(by_blocks[b]):.3f}" for b in deeper) + f" vs {probe:.3f}",
            bool(all(g >= -0.02 for g in gaps.values())),
            subjects(*(by_blocks[b] for b in deeper)),
        )
