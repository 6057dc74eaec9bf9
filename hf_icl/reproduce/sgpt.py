"""Reproductions of the context-scaling vs task-scaling study (seed ``001``): SGPT, ψ features, MLPs.

One function per figure. Each trains its models with the package's trainer, scores them on fresh
tasks, and reports the document's claims with a verdict at the size it ran:

* ``CPU`` (the default) shrinks d, widths, depths, steps and pools so each figure takes minutes on a
  laptop CPU; the output says so on every page.
* ``FULL`` (``--full``) uses the document's sizes (8 layers of width 256, MLPs of width 1024, d = 20 /
  8, millions of training prompts) and wants a GPU.

The models train on every prefix of prompts of the longest context (one MLP / one transformer for
all lengths, as the document does for its MLPs) and are read at the document's context lengths.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..data.tasks import make_task
from ..estimators import get_estimator
from ..evaluation import evaluate_context_scaling
from ..evaluation.baselines import estimator_for_task
from ..evaluation.tables import markdown_grid
from ..modeling.sgpt.feature_maps import feature_map as apply_feature_map
from ..modeling.sgpt.feature_maps import prompt_matrix
from .plots import plot_sweep
from .runs import Experiment, Report, comparable, improves, learned, log, model_fields, train_or_reuse

PAPER = "sgpt"


@dataclass(frozen=True)
class Scale:
    """The size of a reproduction: training budget and model shapes."""

    label: str
    steps: int
    batch_size: int
    eval_prompts: int
    n_embd: int
    n_layer: int
    n_head: int
    mlp_width: int
    learning_rate: float
    full: bool

    def dims(self, cpu: int, full: int) -> int:
        return full if self.full else cpu


CPU = Scale("CPU default", 1500, 64, 512, 64, 3, 2, 256, 1e-3, full=False)
FULL = Scale("full (the document's sizes)", 50_000, 64, 1280, 256, 8, 8, 1024, 1e-4, full=True)


@dataclass
class Context:
    """Where an experiment writes, at which scale, and its report."""

    scale: Scale
    output_dir: Path
    report: Report
    seed: int = 0
    retrain: bool = False
    steps: int | None = None  # overrides the scale's steps (quick checks)
    mlp_steps: int | None = None  # overrides the steps of the MLP runs only (they learn slowly and cost little)

    def train(
        self,
        name: str,
        model_type: str,
        fields: dict,
        task: str,
        task_params: dict,
        *,
        n_dims: int,
        n_points: int,
        n_tasks: int | None = None,
    ) -> torch.nn.Module:
        scale = self.scale
        steps = self.steps or scale.steps
        if model_type == "mlp_icl" and self.mlp_steps:
            steps = self.mlp_steps
        return train_or_reuse(
            self.output_dir / "runs" / name,
            retrain=self.retrain,
            task=task,
            task_params=json.dumps(task_params, sort_keys=True),
            n_dims=n_dims,
            n_points=n_points,
            n_tasks=n_tasks,
            model_type=model_type,
            model_size=None,
            model_overrides=model_fields(**fields),
            max_steps=steps,
            per_device_train_batch_size=scale.batch_size,
            learning_rate=scale.learning_rate,
            lr_scheduler_type="cosine",
            warmup_steps=min(500, steps // 10),
            seed=self.seed,
            eval_prompts=min(256, scale.eval_prompts),
        )

    def evaluate(
        self,
        predictors: dict,
        task: str,
        task_params: dict,
        *,
        n_dims: int,
        n_points: int,
        plot: str | None = None,
        title: str = "",
        normalize_by_trivial: bool = False,
    ):
        family = make_task({"name": task, "n_dims": n_dims, **task_params})
        normalizer = trivial_error(family) if normalize_by_trivial else None
        result = evaluate_context_scaling(
            predictors,
            family,
            n_prompts=self.scale.eval_prompts,
            seed=self.seed + 1,
            n_points=n_points,
            normalizer=normalizer,
            n_bootstrap=200,
        )
        if plot:
            path = self.report.plot_path(plot)
            result.plot(path, title=title)
            self.report.add_plot(path, title)
        return result

    def sweep(
        self, name: str, x: Sequence, curves: dict, *, caption: str, corner: str, table_rows=None, **plot
    ) -> None:
        """Plot ``curves`` over ``x`` (:func:`plot_sweep` keywords), add the plot with ``caption`` and the table
        (``table_rows``, default the curves) to the report."""
        self.report.add_plot(plot_sweep(self.report.plot_path(name), x, curves, **plot), caption)
        self.report.add(table(table_rows or curves, x, corner))

    # -- the models the document compares --------------------------------------------------------
    def gpt2(self, **extra) -> tuple[str, dict]:
        """GPT-2 reading the document's concatenated ``[x, y]`` rows (read-in/out initialised like GPT-2)."""
        s = self.scale
        fields = dict(n_embd=s.n_embd, n_layer=s.n_layer, n_head=s.n_head, prompt_format="concatenated", io_init="gpt2")
        return "gpt2_icl", {**fields, **extra}

    def sgpt(self, **extra) -> tuple[str, dict]:
        return "sgpt", {"n_embd": self.scale.n_embd, "n_layer": self.scale.n_layer, **extra}

    def mlp(self, mlp_input: str, feature_map: str = "hilbert", **extra) -> tuple[str, dict]:
        fields = {"hidden_size": self.scale.mlp_width, "mlp_input": mlp_input}
        if mlp_input != "vectorized":
            fields["feature_map"] = feature_map
        return "mlp_icl", {**fields, **extra}


def trivial_error(family, n: int = 20_000) -> float:
    """E[y²] of a family: the error of the zero predictor, the document's normaliser in Fig. 4."""
    _, ys = family.sample(n // 10, 10, seed=12345)
    return float(ys.float().square().mean())


def at(result, name: str, positions: Sequence[int]) -> list[float]:
    return [float(result.values[name][i]) for i in positions]


def table(rows: dict[str, list[float]], columns: Sequence, corner: str) -> str:
    """One line per curve, one column per swept value."""
    index = {str(column): i for i, column in enumerate(columns)}
    return markdown_grid(corner, list(index), rows, lambda name, column: f"{rows[name][index[column]]:.4g}")


def fmt(values: Sequence[float]) -> str:
    return " → ".join(f"{v:.3g}" for v in values)


# -- Fig. 1: GPT-2 vs the vectorised MLP, task-scaling and context-scaling --------------------------------
def fig1(ctx: Context) -> None:
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
    trivial = float(result.values["trivial"][pos])
    mlp_learned = learned(task_scaling["MLP (vectorised)"] + context_scaling["MLP (vectorised)"], trivial)
    untrained = "" if mlp_learned else f" (the MLP never beat 0.9× the zero predictor's {trivial:.3g})"
    ctx.report.claim(
        "both GPT-2 and the vectorised MLP task-scale",
        "Fig. 1A: both errors fall as T grows",
        "; ".join(f"{label}: {fmt(v)}" for label, v in task_scaling.items()) + untrained,
        (all(improves(v) for v in task_scaling.values())) if mlp_learned else None,
    )
    ctx.report.claim(
        "only GPT-2 context-scales; the vectorised MLP does not",
        "Fig. 1B: GPT-2's error falls with N, the MLP's stays flat or rises",
        "; ".join(f"{label}: {fmt(context_scaling[label])}" for label in models) + untrained,
        (improves(context_scaling["GPT-2"]) and not improves(context_scaling["MLP (vectorised)"]))
        if mlp_learned
        else None,
    )


# -- Fig. 2 / 3: linear regression with one and two noise levels -----------------------------------------
def _sgpt_vs_gpt2(ctx: Context, tag: str, task_params: dict, eval_params: list[dict], d: int, n_points: int):
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


def _close_to_ridge(ctx: Context, result, lengths: list[int], sigma) -> None:
    rows = {name: at(result, name, lengths) for name in ("SGPT", "GPT-2", "optimal ridge")}
    ctx.report.add(f"σ = {sigma}: squared error / d\n\n" + table(rows, lengths, "N →"))
    ctx.report.numbers[f"sigma={sigma}"] = {"lengths": lengths, **rows}

    def worst_ratio(a: str, b: str) -> float:  # the largest ratio of two curves over the reported lengths
        return max(max(x, y) / min(x, y) for x, y in zip(rows[a], rows[b], strict=True))

    ratio = worst_ratio("SGPT", "GPT-2")
    ctx.report.claim(
        f"SGPT ≈ GPT-2 (σ={sigma})",
        "SGPT matches GPT-2 at every context length",
        f"SGPT {fmt(rows['SGPT'])}; GPT-2 {fmt(rows['GPT-2'])}; largest ratio {ratio:.2f}×",
        bool(ratio <= 1.5),
    )
    to_ridge = {m: worst_ratio(m, "optimal ridge") for m in ("SGPT", "GPT-2")}
    ctx.report.claim(
        f"both near optimally tuned ridge (σ={sigma})",
        "both close to the Bayes-optimal ridge at every context length",
        "largest ratio to ridge: " + ", ".join(f"{m} {r:.2f}×" for m, r in to_ridge.items()),
        bool(all(r <= 1.5 for r in to_ridge.values())),
    )


def _ridge_sweep(ctx: Context, trained: dict, params: dict, d: int, position: int) -> None:
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


def fig2(ctx: Context) -> None:
    s = ctx.scale
    d = s.dims(5, 20)
    lengths = [5, 10, 15, 20] if not s.full else [10, 15, 20, 25, 30, 35, 40]
    params = {"weight_prior": "scaled", "noise_std": 0.5}
    trained, (result,) = _sgpt_vs_gpt2(ctx, "fig2", params, [params], d, lengths[-1] + 1)
    _close_to_ridge(ctx, result, lengths, 0.5)
    _ridge_sweep(ctx, trained, params, d, position=d)


def fig3(ctx: Context) -> None:
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


def fig4(ctx: Context) -> None:
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
        last = {name: values[-1] for name, values in rows.items()}
        ctx.report.claim(
            f"SGPT ≈ GPT-2 on {task}",
            "SGPT comparable to GPT-2",
            f"at N={lengths[-1]}: SGPT {last['SGPT']:.3g}, GPT-2 {last['GPT-2']:.3g}",
            bool(comparable(last["SGPT"], last["GPT-2"])),
        )
        reference = baselines[0]
        document = {
            "lasso": "close to lasso, far better than least squares",
            "xgboost": "SGPT beats XGBoost",
            "least_squares": "SGPT learns in context (error falls with N)",
        }[reference]
        if reference == "lasso":
            ok = comparable(last["SGPT"], last["lasso"], 2.0) and last["SGPT"] < last["least_squares"]
        elif reference == "xgboost":
            ok = last["SGPT"] < last["xgboost"]
        else:
            ok = improves(rows["SGPT"])
        ctx.report.claim(
            f"SGPT against {reference} on {task}",
            document,
            ", ".join(f"{name} {value:.3g}" for name, value in last.items()),
            ok,
        )


# -- Fig. 5: one-layer SGPT context-scales ---------------------------------------------------------------
FIG5_TASKS = {
    "linear_regression": {"weight_prior": "scaled"},
    "sparse_linear_regression": {"sparsity": 3},
    "relu_2nn_regression": {"hidden_size": 100},
    "decision_tree": {"depth": 4},
}


def fig5(ctx: Context) -> None:
    d = 8
    lengths = [10, 20, 30, 40, 50]
    curves = {}
    for task, params in FIG5_TASKS.items():
        model_type, fields = ctx.sgpt(n_layer=1)
        model = ctx.train(f"fig5_{task}", model_type, fields, task, params, n_dims=d, n_points=lengths[-1] + 1)
        result = ctx.evaluate(
            {"SGPT (1 layer)": model}, task, params, n_dims=d, n_points=lengths[-1] + 1, normalize_by_trivial=True
        )
        curves[task] = at(result, "SGPT (1 layer)", lengths)
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
            bool(improves(values, factor=0.95)),
        )


# -- Fig. 6 / 7: MLPs on ψ features -----------------------------------------------------------------------
FEATURE_MAP_NAMES = {"linear": "ψ_L", "hilbert": "ψ_H"}


def fig6(ctx: Context) -> None:
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
        row, scalar = rows[f"MLP on {psi}(A)_N,:"], rows[f"linear on {psi}(A)_N,d+1 (a fit per N)"]
        ctx.report.claim(
            f"the scalar {psi}(A)_N,d+1 is as good as the row {psi}(A)_N,: for context-scaling",
            "the scalar does as well as the row at every N",
            f"row {fmt(row)}; scalar {fmt(scalar)}",
            # "as good as": never more than 1.5x worse than the row (better is as good), and context-scaling
            bool(all(s <= 1.5 * r for r, s in zip(row, scalar, strict=True)) and improves(scalar)),
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


def fit_linear_on_estimate(ctx: Context, feature_map: str, task: str, params: dict, d: int, n_points: int, **kw):
    family = make_task({"name": task, "n_dims": d, **params})
    n_prompts = min((ctx.steps or ctx.scale.steps) * ctx.scale.batch_size, 20_000)
    xs, ys = family.sample(n_prompts, n_points, seed=ctx.seed)
    return LinearOnEstimate(feature_map, **kw).fit(xs, ys)


FIG7_TASKS = {
    "linear": ("noisy_linear_regression", {"weight_prior": "scaled", "noise_std": 0.22}, [5, 10, 20, 30, 40]),
    "2-layer NN": ("relu_2nn_regression", {"hidden_size": 100}, [10, 20, 30, 40, 50, 60, 70, 80]),
}


def fig7_inputs(ctx: Context) -> dict[str, tuple[str, dict]]:
    inputs = {"vectorised": ctx.mlp("vectorized")}
    for feature_map, psi in FEATURE_MAP_NAMES.items():
        inputs[f"{psi} features"] = ctx.mlp("features", feature_map)
        inputs[f"vectorised + {psi}"] = ctx.mlp("both", feature_map)
    return inputs


def fig7(ctx: Context) -> None:
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
        _fig7_claims(ctx, tag, task_scaling, context_scaling)


def _fig7_claims(ctx: Context, tag: str, task_scaling: dict, context_scaling: dict) -> None:
    def summary(kind_curves, labels):
        return "; ".join(f"{label}: {fmt(kind_curves[label])}" for label in labels)

    vec, feats, both = (
        ["vectorised"],
        [f"{p} features" for p in FEATURE_MAP_NAMES.values()],
        [f"vectorised + {p}" for p in FEATURE_MAP_NAMES.values()],
    )
    # errors are normalised by E[y²]: the zero predictor scores 1
    vec_learned = learned(task_scaling["vectorised"] + context_scaling["vectorised"], trivial=1.0)
    ctx.report.claim(
        f"{tag}: the vectorised MLP task-scales but fails to context-scale",
        "7A falls with T; 7B flat or rising with N",
        f"T: {summary(task_scaling, vec)}; N: {summary(context_scaling, vec)}"
        + ("" if vec_learned else " (never below 0.9× the zero predictor: it learned nothing at this budget)"),
        (improves(task_scaling["vectorised"]) and not improves(context_scaling["vectorised"])) if vec_learned else None,
    )
    ctx.report.claim(
        f"{tag}: ψ features context-scale but do not task-scale",
        "7A flat in T; 7B falls with N",
        f"T: {summary(task_scaling, feats)}; N: {summary(context_scaling, feats)}",
        bool(all(improves(context_scaling[f]) and not improves(task_scaling[f]) for f in feats)),
    )
    ctx.report.claim(
        f"{tag}: vectorised + ψ features do both",
        "7A falls with T and 7B falls with N",
        f"T: {summary(task_scaling, both)}; N: {summary(context_scaling, both)}",
        bool(all(improves(task_scaling[b]) and improves(context_scaling[b]) for b in both)),
    )


EXPERIMENTS = {
    "fig1": Experiment("GPT-2 vs the vectorised MLP: task-scaling and context-scaling", fig1),
    "fig2": Experiment("linear regression σ=0.5: SGPT vs GPT-2 vs optimally tuned ridge", fig2),
    "fig3": Experiment("linear regression with noise levels {0.1, 0.5}: algorithm selection", fig3),
    "fig4": Experiment("sparse linear, 2-layer ReLU NN, decision tree: SGPT vs GPT-2 vs baselines", fig4),
    "fig5": Experiment("one-layer SGPT context-scales (d=8, N=10..50)", fig5),
    "fig6": Experiment("MLP on ψ_K(A)_N,: vs a linear fit on the scalar ψ_K(A)_N,d+1", fig6),
    "fig7": Experiment("MLP inputs: vectorised, ψ features, both — task- and context-scaling", fig7),
}


def run(
    experiment: str,
    *,
    full: bool = False,
    output_dir: str | Path = "outputs/reproduce",
    seed: int = 0,
    retrain: bool = False,
    steps: int | None = None,
    mlp_steps: int | None = None,
    command: str = "",
    scale: Scale | None = None,
) -> Path:
    """Run one figure's experiment; returns the path of its ``results.md``. ``scale`` replaces the CPU/full
    sizes altogether (tests run a figure end to end at a toy scale)."""
    scale = scale or (FULL if full else CPU)
    out = Path(output_dir) / PAPER / experiment
    size = (
        f"{scale.label}: transformers n_embd={scale.n_embd}, n_layer={scale.n_layer}; MLP width {scale.mlp_width}; "
        f"{steps or scale.steps} steps × {scale.batch_size} prompts"
        + (f" ({mlp_steps} for the MLPs)" if mlp_steps else "")
        + f"; {scale.eval_prompts} evaluation prompts"
    )
    report = Report(PAPER, experiment, EXPERIMENTS[experiment].title, size, command, out)
    log(f"{PAPER} {experiment}: {report.title} — {size}")
    if not scale.full:
        log("CPU-sized run (smaller d, widths, steps and pools than the document); --full runs the document's sizes")
    context = Context(scale, out, report, seed=seed, retrain=retrain, steps=steps, mlp_steps=mlp_steps)
    EXPERIMENTS[experiment].run(context)
    return report.write()
