"""The SGPT study's figures (seed ``001``), one function per figure, each with the document's claims: GPT-2 vs the
vectorised MLP (Fig. 1), SGPT vs GPT-2 vs ridge (Fig. 2, 3), other task families (Fig. 4), one-layer SGPT (Fig. 5),
MLPs on ψ features (Fig. 6, 7)."""

from __future__ import annotations

import torch

from ...data.tasks import make_task
from ...estimators import get_estimator
from ...evaluation.baselines import estimator_for_task
from ...modeling.sgpt.feature_maps import feature_map as apply_feature_map
from ...modeling.sgpt.feature_maps import prompt_matrix
from ..report import comparable, improves
from .common import ExperimentState, at, best_of, fmt, in_context_subject, subject, table


# -- Fig. 1: GPT-2 vs the vectorised MLP, task-scaling and context-scaling --------------------------------
def fig1(ctx: ExperimentState) -> None:
    s = ctx.scale
    d = s.dims(4, 8)
    lengths = [5, 10, 20] if not s.full else [5, 10, 20, 30, 40]
    n_points = lengths[-1] + 1
    pools = [16, 256, 4096, 65536] if not s.full else [2**6, 2**10, 2**14, 10**5, 10**6]
    task, params = "linear_regression", {"weight_prior": "scaled"}
    models = {"GPT-2": ctx.gpt2(), "MLP (vectorised)": ctx.mlp("vectorized")}
    trained = {}
    for label, (model_type, fields) in models.items():
        for pool in pools:
            run = f"fig1_{model_type}_{fields.get('mlp_input', 'tf')}_T{pool}"
            trained[f"{label} T={pool}"] = ctx.train(
                run, model_type, fields, task, params, n_dims=d, n_points=n_points, n_tasks=pool
            )
    result = ctx.evaluate(
        {**trained, "least_squares": get_estimator("least_squares")}, task, params, n_dims=d, n_points=n_points
    )
    pos = 10
    task_scaling = {label: [float(result.values[f"{label} T={t}"][pos]) for t in pools] for label in models}
    ctx.report.numbers["task_scaling_at_10"] = {"pools": pools, **task_scaling}
    ctx.sweep(
        "task_scaling",
        pools,
        task_scaling,
        caption="Fig. 1A: error at 10 in-context examples against the number of pre-training tasks",
        corner="T →",
        xlabel="pre-training tasks T",
        ylabel="squared error / d (fresh tasks)",
        title=f"Fig. 1A: task-scaling at {pos} examples (d={d})",
        log_x=True,
        references={"least squares": float(result.values["least_squares"][pos])},
    )
    big = pools[-1]
    context_scaling = {label: at(result, f"{label} T={big}", lengths) for label in models}
    context_scaling["least squares"] = at(result, "least_squares", lengths)
    ctx.report.numbers["context_scaling"] = {"T": big, "lengths": lengths, **context_scaling}
    ctx.sweep(
        "context_scaling",
        lengths,
        context_scaling,
        caption=f"Fig. 1B: error against context length, models pre-trained on T={big} tasks",
        corner="N →",
        xlabel="in-context examples N",
        ylabel="squared error / d",
        title=f"Fig. 1B: context-scaling, T={big}",
    )
    # every run of a model is one subject: the model learned something if any of its runs beat 0.9 × trivial
    trivial = result.values["trivial"]
    task_subjects = [
        best_of(label, [(result.values[f"{label} T={t}"][pos], trivial[pos]) for t in pools]) for label in models
    ]
    ctx.report.claim(
        "both GPT-2 and the vectorised MLP task-scale",
        "Fig. 1A: both errors fall as T grows",
        "; ".join(f"{label}: {fmt(v)}" for label, v in task_scaling.items()),
        all(improves(v) for v in task_scaling.values()),
        task_subjects,
    )
    ctx.report.claim(
        "only GPT-2 context-scales; the vectorised MLP does not",
        "Fig. 1B: GPT-2's error falls with N, the MLP's stays flat or rises",
        "; ".join(f"{label}: {fmt(context_scaling[label])}" for label in models),
        improves(context_scaling["GPT-2"]) and not improves(context_scaling["MLP (vectorised)"]),
        [subject(result, f"{label} T={big}", lengths, label=label) for label in models],
    )


# -- Fig. 2 / 3: linear regression with one and two noise levels -----------------------------------------
def _sgpt_vs_gpt2(ctx: ExperimentState, tag: str, task_params: dict, eval_params: list[dict], d: int, n_points: int):
    task = "noisy_linear_regression"
    trained = {}
    for label, (model_type, fields) in {"SGPT": ctx.sgpt(), "GPT-2": ctx.gpt2()}.items():
        trained[label] = ctx.train(
            f"{tag}_{model_type}", model_type, fields, task, task_params, n_dims=d, n_points=n_points
        )
    results = []
    for params in eval_params:
        family = make_task({"name": task, "n_dims": d, **params})
        sigma = params["noise_std"]
        results.append(
            ctx.evaluate(
                {**trained, "optimal ridge": estimator_for_task("optimal_ridge", family)},
                task,
                params,
                n_dims=d,
                n_points=n_points,
                plot=f"sigma{sigma}",
                title=f"{tag}: linear regression, σ={sigma}, d={d}",
            )
        )
    return trained, results


def _close_to_ridge(ctx: ExperimentState, result, lengths: list[int], sigma) -> None:
    rows = {name: at(result, name, lengths) for name in ("SGPT", "GPT-2", "optimal ridge")}
    ctx.report.add(f"σ = {sigma}: squared error / d\n\n" + table(rows, lengths, "N →"))
    ctx.report.numbers[f"sigma={sigma}"] = {"lengths": lengths, **rows}

    def worst_ratio(a: str, b: str) -> float:  # the largest ratio of two curves over the reported lengths
        return max(max(x, y) / min(x, y) for x, y in zip(rows[a], rows[b], strict=True))

    models = [subject(result, name, lengths) for name in ("SGPT", "GPT-2")]
    ratio = worst_ratio("SGPT", "GPT-2")
    ctx.report.claim(
        f"SGPT ≈ GPT-2 (σ={sigma})",
        "SGPT matches GPT-2 at every context length",
        f"SGPT {fmt(rows['SGPT'])}; GPT-2 {fmt(rows['GPT-2'])}; largest ratio {ratio:.2f}×",
        bool(ratio <= 1.5),
        models,
    )
    to_ridge = {m: worst_ratio(m, "optimal ridge") for m in ("SGPT", "GPT-2")}
    ctx.report.claim(
        f"both near optimally tuned ridge (σ={sigma})",
        "both close to the Bayes-optimal ridge at every context length",
        "largest ratio to ridge: " + ", ".join(f"{m} {r:.2f}×" for m, r in to_ridge.items()),
        bool(all(r <= 1.5 for r in to_ridge.values())),
        [*models, subject(result, "optimal ridge", lengths, kind="baseline")],
    )


def _ridge_sweep(ctx: ExperimentState, trained: dict, params: dict, d: int, position: int) -> None:
    """Right panels of Fig. 2/3: ridge's error against λ at one context length, the models as lines."""
    lambdas = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0]
    ridges = {f"ridge λ={lam:g}": get_estimator("ridge", lam=lam) for lam in lambdas}
    result = ctx.evaluate({**trained, **ridges}, "noisy_linear_regression", params, n_dims=d, n_points=position + 1)
    curve = [float(result.values[name][position]) for name in ridges]
    references = {name: float(result.values[name][position]) for name in trained}
    ctx.sweep(
        f"ridge_sweep_sigma{params['noise_std']}",
        lambdas,
        {"ridge": curve},
        caption=f"Right panel: ridge's error against λ at N={position}; dashed: the trained models",
        corner="λ →",
        table_rows={"ridge": curve, **{k: [v] * len(lambdas) for k, v in references.items()}},
        xlabel="ridge penalty λ",
        ylabel="squared error / d",
        title=f"ridge vs λ at N={position}, σ={params['noise_std']}",
        log_x=True,
        references=references,
    )


def fig2(ctx: ExperimentState) -> None:
    s = ctx.scale
    d = s.dims(5, 20)
    lengths = [5, 10, 15, 20] if not s.full else [10, 15, 20, 25, 30, 35, 40]
    params = {"weight_prior": "scaled", "noise_std": 0.5}
    trained, (result,) = _sgpt_vs_gpt2(ctx, "fig2", params, [params], d, lengths[-1] + 1)
    _close_to_ridge(ctx, result, lengths, 0.5)
    _ridge_sweep(ctx, trained, params, d, position=d)


def fig3(ctx: ExperimentState) -> None:
    s = ctx.scale
    d = s.dims(5, 20)
    lengths = [1, 5, 10, 15, 20] if not s.full else [1, 5, 10, 20, 30, 40]
    params = {"weight_prior": "scaled", "noise_std": [0.1, 0.5]}
    per_level = [{"weight_prior": "scaled", "noise_std": sigma} for sigma in (0.1, 0.5)]
    trained, results = _sgpt_vs_gpt2(ctx, "fig3", params, per_level, d, lengths[-1] + 1)
    for sigma, result in zip((0.1, 0.5), results, strict=True):
        _close_to_ridge(ctx, result, lengths, sigma)
    _ridge_sweep(ctx, trained, per_level[1], d, position=d)


# -- Fig. 4: sparse linear, 2-layer ReLU networks, decision trees ----------------------------------------
FIG4_TASKS = {
    "sparse_linear_regression": ({"sparsity": 3}, ("lasso", "least_squares")),
    "relu_2nn_regression": ({"hidden_size": 100}, ("least_squares", "knn")),
    "decision_tree": ({"depth": 4}, ("xgboost", "least_squares")),
}


def fig4(ctx: ExperimentState) -> None:
    s = ctx.scale
    d = s.dims(8, 20)
    n_points = 21 if not s.full else 41
    lengths = list(range(0, n_points, 5))[1:] + ([n_points - 1] if (n_points - 1) % 5 else [])
    for task, (params, baselines) in FIG4_TASKS.items():
        trained = {
            label: ctx.train(f"fig4_{task}_{model_type}", model_type, fields, task, params, n_dims=d, n_points=n_points)
            for label, (model_type, fields) in {"SGPT": ctx.sgpt(), "GPT-2": ctx.gpt2()}.items()
        }
        estimators = {name: get_estimator(name) for name in baselines}
        result = ctx.evaluate(
            {**trained, **estimators},
            task,
            params,
            n_dims=d,
            n_points=n_points,
            plot=task,
            title=f"Fig. 4: {task} (d={d}), error / E[y²]",
            normalize_by_trivial=True,
        )
        rows = {name: at(result, name, lengths) for name in (*trained, *baselines)}
        ctx.report.add(f"{task}: squared error / E[y²] (the zero predictor scores 1)\n\n" + table(rows, lengths, "N →"))
        ctx.report.numbers[task] = {"lengths": lengths, **rows}
        _fig4_claims(ctx, task, result, rows, lengths)


def _fig4_claims(ctx: ExperimentState, task: str, result, rows: dict[str, list[float]], lengths: list[int]) -> None:
    """The document's claims on one Fig. 4 family; the models are judged on the curve as in-context learners (against
    their own error with no examples too: :func:`in_context_subject`), the baselines at the longest context, where
    they are compared."""
    last = {name: values[-1] for name, values in rows.items()}
    models = {name: in_context_subject(result, name, lengths) for name in ("SGPT", "GPT-2")}
    at_last = ", ".join(f"{name} {value:.3g}" for name, value in last.items())

    def baseline(name):
        return subject(result, name, lengths[-1:], kind="baseline")

    ctx.report.claim(
        f"SGPT ≈ GPT-2 on {task}",
        "SGPT comparable to GPT-2",
        f"at N={lengths[-1]}: SGPT {last['SGPT']:.3g}, GPT-2 {last['GPT-2']:.3g}",
        comparable(last["SGPT"], last["GPT-2"]),
        list(models.values()),
    )
    if task == "sparse_linear_regression":
        ctx.report.claim(
            f"SGPT close to lasso, far better than least squares on {task}",
            "Fig. 4C: close to lasso, significantly outperforming OLS",
            at_last,
            comparable(last["SGPT"], last["lasso"], 2.0) and last["SGPT"] < last["least_squares"],
            [models["SGPT"], baseline("lasso"), baseline("least_squares")],
        )
        return
    # the document: SGPT matches GPT-2 on ReLU networks (4B) and "is also capable of ICL" on trees (4A)
    ctx.report.claim(
        f"SGPT learns {task} in context",
        "its error falls as N grows",
        f"SGPT {fmt(rows['SGPT'])} (N = {lengths[0]} → {lengths[-1]})",
        improves(rows["SGPT"]),
        [models["SGPT"]],
    )
    if task == "decision_tree":
        ctx.report.claim(
            f"SGPT beats XGBoost on {task}",
            "Fig. 4A: SGPT, like GPT-2, outperforms XGBoost",
            at_last,
            last["SGPT"] < last["xgboost"],
            [models["SGPT"], baseline("xgboost")],
        )


# -- Fig. 5: one-layer SGPT context-scales ---------------------------------------------------------------
FIG5_TASKS = {
    "linear_regression": {"weight_prior": "scaled"},
    "sparse_linear_regression": {"sparsity": 3},
    "relu_2nn_regression": {"hidden_size": 100},
    "decision_tree": {"depth": 4},
}


def fig5(ctx: ExperimentState) -> None:
    d = 8
    lengths = [10, 20, 30, 40, 50]
    curves, subjects = {}, {}
    for task, params in FIG5_TASKS.items():
        model_type, fields = ctx.sgpt(n_layer=1)
        model = ctx.train(f"fig5_{task}", model_type, fields, task, params, n_dims=d, n_points=lengths[-1] + 1)
        result = ctx.evaluate(
            {"SGPT (1 layer)": model}, task, params, n_dims=d, n_points=lengths[-1] + 1, normalize_by_trivial=True
        )
        curves[task] = at(result, "SGPT (1 layer)", lengths)
        subjects[task] = subject(result, "SGPT (1 layer)", lengths)
    ctx.report.numbers["one_layer_sgpt"] = {"lengths": lengths, **curves}
    ctx.sweep(
        "one_layer",
        lengths,
        curves,
        caption="Fig. 5: one-layer SGPT, error against context length, four task families",
        corner="N →",
        xlabel="context length N (trained and tested)",
        ylabel="squared error / E[y²]",
        title=f"Fig. 5: one-layer SGPT, d={d}",
    )
    for task, values in curves.items():
        ctx.report.claim(
            f"one-layer SGPT context-scales on {task}",
            "error falls as N grows",
            fmt(values),
            improves(values, factor=0.95),
            [subjects[task]],
        )


# -- Fig. 6 / 7: MLPs on ψ features -----------------------------------------------------------------------
FEATURE_MAP_NAMES = {"linear": "ψ_L", "hilbert": "ψ_H"}


def fig6(ctx: ExperimentState) -> None:
    d, lengths = 8, [5, 10, 20, 30, 40]
    task, params = "noisy_linear_regression", {"weight_prior": "scaled", "noise_std": 0.22}
    trained = {}
    for feature_map, psi in FEATURE_MAP_NAMES.items():
        model_type, fields = ctx.mlp("features", feature_map)
        trained[f"MLP on {psi}(A)_N,:"] = ctx.train(
            f"fig6_row_{feature_map}", model_type, fields, task, params, n_dims=d, n_points=41
        )
        for per_position, how in ((False, "one fit"), (True, "a fit per N")):
            trained[f"linear on {psi}(A)_N,d+1 ({how})"] = fit_linear_on_estimate(
                ctx, feature_map, task, params, d, 41, per_position=per_position
            )
    result = ctx.evaluate(
        trained, task, params, n_dims=d, n_points=41, plot="curves", title="Fig. 6: row of ψ vs its last entry"
    )
    rows = {name: at(result, name, lengths) for name in trained}
    ctx.report.add(table(rows, lengths, "N →"))
    ctx.report.numbers["curves"] = {"lengths": lengths, **rows}
    for psi in FEATURE_MAP_NAMES.values():
        per_n = "(a fit per N)"
        row, scalar = rows[f"MLP on {psi}(A)_N,:"], rows[f"linear on {psi}(A)_N,d+1 {per_n}"]
        ctx.report.claim(
            f"the scalar {psi}(A)_N,d+1 is as good as the row {psi}(A)_N,: for context-scaling",
            "the scalar does as well as the row at every N",
            f"row {fmt(row)}; scalar {fmt(scalar)}",
            # "as good as": never more than 1.5x worse than the row (better is as good), and context-scaling
            all(s <= 1.5 * r for r, s in zip(row, scalar, strict=True)) and improves(scalar),
            [subject(result, name, lengths) for name in (f"MLP on {psi}(A)_N,:", f"linear on {psi}(A)_N,d+1 {per_n}")],
        )


class LinearOnEstimate:
    """The document's "linear regression on the scalar ψ_K(A)_N,d+1": ``ŷ_i = a_i · s_i + b_i`` with ``s_i`` the
    label entry of ψ_K at position i, (a, b) fitted by least squares (closed form, float64) on training
    prompts, either one pair for every context length (``per_position=False``) or one per length."""

    def __init__(self, feature_map: str, per_position: bool):
        self.feature_map, self.per_position = feature_map, per_position
        self.slope = self.intercept = None

    def estimates(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        return apply_feature_map(prompt_matrix(xs.double(), ys.double()), self.feature_map)[..., -1]

    def fit(self, xs: torch.Tensor, ys: torch.Tensor) -> LinearOnEstimate:
        s, y = self.estimates(xs, ys), ys.double()
        if not self.per_position:
            s, y = s.reshape(-1, 1), y.reshape(-1, 1)
        # simple regression in closed form, per column; a constant estimate (position 0 has none) gets
        # slope 0 and the mean label
        s_centred, y_centred = s - s.mean(0), y - y.mean(0)
        variance = s_centred.square().sum(0)
        self.slope = torch.where(variance > 0, (s_centred * y_centred).sum(0) / variance.clamp_min(1e-300), 0.0)
        self.intercept = y.mean(0) - self.slope * s.mean(0)
        return self

    def __call__(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        return (self.slope * self.estimates(xs, ys) + self.intercept).to(xs.dtype)


def fit_linear_on_estimate(
    ctx: ExperimentState, feature_map: str, task: str, params: dict, d: int, n_points: int, **kw
):
    family = make_task({"name": task, "n_dims": d, **params})
    n_prompts = min((ctx.steps or ctx.scale.steps) * ctx.scale.batch_size, 20_000)
    xs, ys = family.sample(n_prompts, n_points, seed=ctx.seed)
    return LinearOnEstimate(feature_map, **kw).fit(xs, ys)


FIG7_TASKS = {
    "linear": ("noisy_linear_regression", {"weight_prior": "scaled", "noise_std": 0.22}, [5, 10, 20, 30, 40]),
    "2-layer NN": ("relu_2nn_regression", {"hidden_size": 100}, [10, 20, 30, 40, 50, 60, 70, 80]),
}


def fig7_inputs(ctx: ExperimentState) -> dict[str, tuple[str, dict]]:
    inputs = {"vectorised": ctx.mlp("vectorized")}
    for feature_map, psi in FEATURE_MAP_NAMES.items():
        inputs[f"{psi} features"] = ctx.mlp("features", feature_map)
        inputs[f"vectorised + {psi}"] = ctx.mlp("both", feature_map)
    return inputs


def fig7(ctx: ExperimentState) -> None:
    s = ctx.scale
    d = 8
    pools = [64, 1024, 16384] if not s.full else [2**6, 2**10, 2**14, 2**17, 2**20]
    for tag, (task, params, lengths) in FIG7_TASKS.items():
        n_points = lengths[-1] + 1
        trained = {}
        for label, (model_type, fields) in fig7_inputs(ctx).items():
            for pool in pools:
                run = f"fig7_{task}_{fields['mlp_input']}_{fields.get('feature_map', '')}_T{pool}"
                trained[f"{label} T={pool}"] = ctx.train(
                    run, model_type, fields, task, params, n_dims=d, n_points=n_points, n_tasks=pool
                )
        result = ctx.evaluate(trained, task, params, n_dims=d, n_points=n_points, normalize_by_trivial=True)
        labels = list(fig7_inputs(ctx))
        position = lengths[len(lengths) // 2]
        task_scaling = {label: [float(result.values[f"{label} T={t}"][position]) for t in pools] for label in labels}
        context_scaling = {label: at(result, f"{label} T={pools[-1]}", lengths) for label in labels}
        ctx.report.numbers[tag] = {
            "pools": pools,
            "task_scaling_position": position,
            "task_scaling": task_scaling,
            "lengths": lengths,
            "context_scaling": context_scaling,
        }
        for kind, x, curves, xlabel, log_x in (
            ("task", pools, task_scaling, "pre-training tasks T", True),
            ("context", lengths, context_scaling, "in-context examples N", False),
        ):
            ctx.sweep(
                f"{tag.replace(' ', '_').replace('-', '')}_{kind}_scaling",
                x,
                curves,
                caption=f"Fig. 7 ({tag}): {kind}-scaling of the MLP inputs",
                corner="T →" if kind == "task" else "N →",
                xlabel=xlabel,
                ylabel="squared error / E[y²]",
                title=f"Fig. 7{'A' if kind == 'task' else 'B'}: {tag}, {kind}-scaling"
                + (f" at N={position}" if kind == "task" else f", T={pools[-1]}"),
                log_x=log_x,
            )
        trivial = result.values["trivial"]
        # each input is one subject over its runs: every pool at one length, every length at the largest pool
        subjects = {
            label: best_of(
                f"the MLP on {label} inputs",
                [(result.values[f"{label} T={t}"][position], trivial[position]) for t in pools]
                + [(result.values[f"{label} T={pools[-1]}"][i], trivial[i]) for i in lengths],
            )
            for label in labels
        }
        _fig7_claims(ctx, tag, task_scaling, context_scaling, subjects)


def _fig7_claims(ctx: ExperimentState, tag: str, task_scaling: dict, context_scaling: dict, subjects: dict) -> None:
    def summary(kind_curves, labels):
        return "; ".join(f"{label}: {fmt(kind_curves[label])}" for label in labels)

    vec, feats, both = (
        ["vectorised"],
        [f"{p} features" for p in FEATURE_MAP_NAMES.values()],
        [f"vectorised + {p}" for p in FEATURE_MAP_NAMES.values()],
    )
    ctx.report.claim(
        f"{tag}: the vectorised MLP task-scales but fails to context-scale",
        "7A falls with T; 7B flat or rising with N",
        f"T: {summary(task_scaling, vec)}; N: {summary(context_scaling, vec)}",
        improves(task_scaling["vectorised"]) and not improves(context_scaling["vectorised"]),
        [subjects[label] for label in vec],
    )
    ctx.report.claim(
        f"{tag}: ψ features context-scale but do not task-scale",
        "7A flat in T; 7B falls with N",
        f"T: {summary(task_scaling, feats)}; N: {summary(context_scaling, feats)}",
        all(improves(context_scaling[f]) and not improves(task_scaling[f]) for f in feats),
        [subjects[label] for label in feats],
    )
    ctx.report.claim(
        f"{tag}: vectorised + ψ features do both",
        "7A falls with T and 7B falls with N",
        f"T: {summary(task_scaling, both)}; N: {summary(context_scaling, both)}",
        all(improves(task_scaling[b]) and improves(context_scaling[b]) for b in both),
        [subjects[label] for label in both],
    )
