"""The kernel-ICL study's experiments (seed 000): Table 1, Table 2, the seven key insights, the figures, and the claims
each makes.

Every claim about a model or a baseline is judged by the package's testability rule (:func:`~hf_icl.reproduce.report.
judge`) against the trivial predictor on the same evaluation data: the zero predictor (always 0, the package's
convention, :meth:`~hf_icl.evaluation.metrics.PositionMetric.trivial_per_prompt`), scored against the same clean
targets as the methods. The context-mean predictor (the mean of the prompt's context labels) is reported beside it for
reference only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from ...estimators import KernelRidge, NadarayaWatson, RandomFourierFeatures, Ridge
from ..report import Experiment, ExperimentStateBase, Paper, Report, RunOptions, Subject, seed_interval
from .data import sine_prompt, table1_references, table2_eval_batch, table2_references
from .document import KERNEL_NAMES, ROW_KERNELS, TABLE1, TABLE2, TABLE2_KRR, grid_label, grid_name
from .specs import CPU, FULL, PAPER, TABLE1_MODELS, TRIVIAL_LABEL, Group, Scale, Training, group_model_config
from .training import train_groups


# -- Table 1 -------------------------------------------------------------------------------------------------------
def table1_predictions(scale: Scale, seed: int, head: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict]:
    """Every Table-1 method's predictions ``(100,)`` on the seed's sin(x) prompt, and the prompt."""
    data = sine_prompt(scale, seed)
    cx, cy, qx = data["context_x"], data["context_y"], data["query_x"]
    rff = RandomFourierFeatures(n_dims=1, n_frequencies=scale.rff_frequencies, scale=scale.rff_scale, seed=seed)
    on_features = (rff(cx), cy, rff(qx))
    predictions = {
        "ridge": Ridge(lam=1.0, form="primal").predict_queries(cx, cy, qx),
        "raw_attention": NadarayaWatson("softmax", bandwidth=1.0).predict_queries(cx, cy, qx),
        "nadaraya_watson": NadarayaWatson("rbf", bandwidth=0.5).predict_queries(cx, cy, qx),
        "ga": NadarayaWatson("ga", bandwidth=1.0, beta1=4.0, beta2=1.0, wedge_mode="penalty").predict_queries(
            *on_features
        ),
        "cayley": NadarayaWatson("cayley", bandwidth=0.1).predict_queries(*on_features),
        "kernel_ridge": KernelRidge(lam=0.01, kernel="rbf", bandwidth=0.5).predict_queries(cx, cy, qx),
        "cosine": NadarayaWatson("cosine", bandwidth=0.1).predict_queries(*on_features),
    }
    with torch.no_grad():
        xs = torch.cat([cx, qx], dim=1).float()
        ys = torch.cat([cy, torch.zeros_like(data["query_y"])], dim=1).float()
        predictions["pretrained"] = head(xs, ys, n_context=scale.context_points).predictions.double()
    predictions["dual_ridge"] = Ridge(lam=1.0, form="dual").predict_queries(cx, cy, qx)
    return {k: v[0] for k, v in predictions.items()}, data


def train_heads(ctx: ExperimentState) -> tuple[list[torch.nn.Module], torch.Tensor]:
    """The pre-trained attention head (1-D softmax row kernel, no column attention), one per seed."""
    scale = ctx.scale
    n_points = scale.context_points + scale.query_points
    group = Group("head_1d", group_model_config(scale, 1, "softmax", False, n_points))
    training = Training(
        {"name": "sinusoid", "n_dims": 1}, ctx.steps or scale.head_steps, scale.head_context, scale.head_queries
    )
    return train_groups(scale, [group], training, ctx.runs_dir, ctx.retrain, ctx.workers)[group.name]


def table1(ctx: ExperimentState) -> None:
    scale, report = ctx.scale, ctx.report
    heads, _ = train_heads(ctx)
    per_seed = {name: [] for name in (*TABLE1, "dual_ridge")}
    for seed, head in zip(scale.seeds, heads, strict=True):
        predictions, data = table1_predictions(scale, seed, head)
        if ctx.example is None:
            ctx.example = (predictions, data, head)
        for name, prediction in predictions.items():
            per_seed[name].append(float((prediction - data["query_y"][0]).square().mean()))
    ctx.table1 = {k: torch.tensor(v, dtype=torch.float64) for k, v in per_seed.items()}
    references = table1_references(scale)
    _set_trivial(ctx, "table1", references["zero"], references["context_mean"])
    rows = []
    for name, (label, kernel, document) in TABLE1.items():
        mean, half = seed_interval(ctx.table1[name])
        rows.append(f"| {label} | {kernel} | {document:.4f} | {_pm(mean, half)} | {_seed_values(ctx.table1[name])} |")
    for label, kernel, values in (
        (f"*{TRIVIAL_LABEL}*", "predicts 0", references["zero"]),
        ("*context mean (reference)*", "predicts the mean context label", references["context_mean"]),
    ):
        rows.append(f"| {label} | {kernel} | — | {_pm(*seed_interval(values))} | {_seed_values(values)} |")
    report.add(
        "## Table 1: 1-D sin(x), 200 noisy context points, 100 queries (MSE against the clean sine)\n\n"
        "Ours: mean over seeds ± the 95 % t interval; each seed draws its own label noise, random Fourier "
        "frequencies and pre-trained head (seed 42's frequencies are the document's). The trivial predictor of the "
        "testability rule is the zero predictor on the same queries and clean targets (the same every seed: the "
        "queries and sin(x) do not depend on it); the context mean is shown for reference only.\n\n"
        "| method | kernel | document | ours | per seed |\n|---|---|---|---|---|\n" + "\n".join(rows)
    )
    report.numbers["table1"] = {k: v.tolist() for k, v in ctx.table1.items()}
    _ranking_claim(ctx)


def _ranking_claim(ctx: ExperimentState) -> None:
    ours = {name: float(ctx.table1[name].mean()) for name in TABLE1}
    document_order = list(TABLE1)  # the document lists the methods from worst to best
    our_order = sorted(ours, key=ours.get, reverse=True)
    rho = _spearman([document_order.index(n) for n in TABLE1], [our_order.index(n) for n in TABLE1])
    ctx.report.claim(
        "Table 1 orders the methods as the document does (Spearman ρ ≥ 0.8 between the two rankings)",
        " > ".join(TABLE1[n][0] for n in document_order),
        f"{' > '.join(TABLE1[n][0] for n in our_order)} (ρ = {rho:.2f})",
        bool(rho >= 0.8),
        subjects(ctx, *TABLE1),
    )


# -- Table 2 -------------------------------------------------------------------------------------------------------
def train_grid(ctx: ExperimentState) -> dict[tuple[str, bool], tuple[list[torch.nn.Module], torch.Tensor]]:
    scale = ctx.scale
    n_points = max(scale.grid_context + scale.grid_queries, scale.eval_context + scale.eval_queries)
    groups = [
        Group(grid_name(k, c), group_model_config(scale, scale.n_dims, k, c, n_points))
        for c in (False, True)
        for k in ROW_KERNELS
    ]
    training = Training(
        {"name": "latent_group_sinusoid", "n_dims": scale.n_dims},
        ctx.steps or scale.grid_steps,
        scale.grid_context,
        scale.grid_queries,
    )
    trained = train_groups(scale, groups, training, ctx.runs_dir, ctx.retrain, ctx.workers)
    return {(k, c): trained[grid_name(k, c)] for c in (False, True) for k in ROW_KERNELS}


def evaluate_grid(ctx: ExperimentState, grid) -> dict[str, torch.Tensor]:
    """Per-task MSE ``(seeds, tasks)`` of every grid model and of KRR on each seed's held-out tasks."""
    scale = ctx.scale
    errors = {grid_name(k, c): [] for (k, c) in grid} | {"krr": []}
    krr = KernelRidge(lam=scale.krr_lam, kernel="rbf", bandwidth=scale.krr_bandwidth)
    n = scale.eval_context
    for i, seed in enumerate(scale.seeds):
        xs, ys = table2_eval_batch(scale, seed)
        targets = ys[:, n:].double()
        krr_predictions = krr.predict_queries(xs[:, :n].double(), ys[:, :n].double(), xs[:, n:].double())
        errors["krr"].append((krr_predictions - targets).square().mean(1))
        with torch.no_grad():
            for (kernel, column), (models, _) in grid.items():
                predictions = models[i](xs, ys, n_context=n).predictions.double()
                errors[grid_name(kernel, column)].append((predictions - targets).square().mean(1))
    return {k: torch.stack(v) for k, v in errors.items()}


def table2(ctx: ExperimentState) -> None:
    scale, report = ctx.scale, ctx.report
    grid = ctx.grid = train_grid(ctx)
    errors = ctx.table2 = evaluate_grid(ctx, grid)
    means = {k: v.mean(1) for k, v in errors.items()}  # (seeds,) per method
    rows = []
    for kernel in ROW_KERNELS:
        row, col = means[grid_name(kernel, False)], means[grid_name(kernel, True)]
        gain = (row - col) / row
        doc_row, doc_col = TABLE2[kernel, False], TABLE2[kernel, True]
        rows.append(
            f"| {KERNEL_NAMES[kernel]} | {doc_row:.4f} | {_pm(*seed_interval(row))} | {doc_col:.4f} | "
            f"{_pm(*seed_interval(col))} | {100 * (doc_row - doc_col) / doc_row:+.1f} % | "
            f"{_pm(*(100 * v for v in seed_interval(gain)), digits=1, signed=True)} % |"
        )
    references = {k: v.mean(1) for k, v in table2_references(scale).items()}  # (seeds,) per predictor
    _set_trivial(ctx, "table2", references["zero"], references["context_mean"])
    rows.append(
        f"| *KRR (RBF, σ = {scale.krr_bandwidth:g})* | {TABLE2_KRR:.4f} | {_pm(*seed_interval(means['krr']))} "
        "| — | — | — | — |"
    )
    rows.append(f"| *{TRIVIAL_LABEL}* | — | {_pm(*seed_interval(references['zero']))} | — | — | — | — |")
    rows.append(
        f"| *context mean (reference)* | — | {_pm(*seed_interval(references['context_mean']))} | — | — | — | — |"
    )
    report.add(
        f"## Table 2: d = {scale.n_dims}, 3 features share a latent, y = a·sin(bz + φ)\n\n"
        f"Mean MSE over {scale.eval_tasks} held-out tasks ({scale.eval_context} context + {scale.eval_queries} "
        "query points, clean query targets) per seed; ours: mean over seeds ± 95 % t interval. Improvement: "
        "(row − col+row) / row, per seed. The trivial predictor of the testability rule is the zero predictor on the "
        "same tasks and clean query targets; the context mean is shown for reference only.\n\n"
        "| row kernel | row only (doc) | row only (ours) | col+row (doc) | col+row (ours) | improvement (doc) | "
        "improvement (ours) |\n|---|---|---|---|---|---|---|\n" + "\n".join(rows)
    )
    report.numbers["table2"] = {k: v.tolist() for k, v in means.items()}
    report.numbers["learned_column_parameters"] = _column_parameters(grid)


def _column_parameters(grid) -> dict[str, list[dict[str, float]]]:
    out = {}
    for (kernel, column), (models, _) in grid.items():
        if column:
            out[grid_name(kernel, column)] = [
                {name: float(p.detach()) for name, p in m.column_attention.named_parameters()} for m in models
            ]
    return out


# -- the seven key insights ----------------------------------------------------------------------------------------
def insights(ctx: ExperimentState) -> None:
    t1, report, seeds = ctx.table1, ctx.report, len(ctx.scale.seeds)
    gap = float((t1["ridge"] - t1["dual_ridge"]).abs().max())
    report.claim(
        "1. Ridge → dual → kernel: the primal and dual ridge predictions agree",
        "max |primal − dual| ≈ 0",
        f"largest gap of the two Table-1 MSEs over seeds {gap:.1e} (the predictions agree to float64 rounding; "
        "tests/estimators/test_base_predict_queries.py checks them pointwise)",
        bool(gap < 1e-10),
    )
    report.claim(
        "2. Kernel regression = ICL: a softmax attention head over the context is Nadaraya–Watson with the "
        "exponential kernel",
        "structural identity",
        "an identity of the formulas: `NadarayaWatson('softmax')` is the document's `attention_icl` "
        "(tests/estimators/test_base_predict_queries.py compares them on its data)",
        True,
    )
    cosine_beats_krr = int((t1["cosine"] < t1["kernel_ridge"]).sum())
    close_to_head = float(t1["cosine"].mean() / t1["pretrained"].mean())
    report.claim(
        "3. The kernel matters: in 1-D cosine ICL matches the learned kernel (within 1.5×) and beats KRR",
        "cosine 0.0038, pre-trained 0.0039, KRR 0.0042",
        f"cosine below KRR in {cosine_beats_krr}/{seeds} seeds; cosine / pre-trained = {close_to_head:.2f}",
        bool(cosine_beats_krr == seeds and 1 / 1.5 <= close_to_head <= 1.5),
        subjects(ctx, "cosine", "pretrained", "kernel_ridge"),
    )
    head_wins = int((t1["pretrained"] < t1["raw_attention"]).sum())
    report.claim(
        "4. Pretraining learns the kernel: the pre-trained head beats raw attention",
        "0.0039 vs 0.0806",
        f"in {head_wins}/{seeds} seeds ({_pm(*seed_interval(t1['pretrained']))} vs "
        f"{_pm(*seed_interval(t1['raw_attention']))})",
        bool(head_wins == seeds),
        subjects(ctx, "pretrained", "raw_attention"),
    )
    means = {k: v.mean(1) for k, v in ctx.table2.items()}
    softmax_row = means["row_softmax"]
    wins = {k: int((means[f"row_{k}"] < softmax_row).sum()) for k in ("cosine", "cayley", "ga")}
    report.claim(
        "5. In 10-D the geometric row kernels (cosine, Cayley, GA) beat softmax, row-only",
        "0.0864 / 0.0861 / 0.0862 vs 0.0997",
        ", ".join(f"{k} beats softmax in {n}/{seeds} seeds" for k, n in wins.items()),
        bool(all(n == seeds for n in wins.values())),
        subjects(ctx, *(grid_name(k, False) for k in ROW_KERNELS)),
    )
    gains = {k: (means[f"row_{k}"] - means[f"col_{k}"]) / means[f"row_{k}"] for k in ROW_KERNELS}
    helped = {k: int((g > 0).sum()) for k, g in gains.items()}
    report.claim(
        "6. Column attention improves every row kernel (the document: by 16–22 %)",
        "+21.8 / +16.9 / +16.6 / +16.4 %",
        "; ".join(
            f"{k} {100 * float(g.mean()):+.1f} % (better in {helped[k]}/{seeds} seeds)" for k, g in gains.items()
        ),
        bool(all(n == seeds for n in helped.values())),
        subjects(ctx, *(grid_name(k, c) for c in (False, True) for k in ROW_KERNELS)),
    )
    best = min(means, key=lambda k: float(means[k].mean()))
    beats_krr = all(bool((means[f"col_{k}"] < means["krr"]).all()) for k in ("cosine", "cayley"))
    report.claim(
        "7. Column attention + GA kernels is best overall: Col+Cosine and Col+Cayley beat every other method, KRR "
        "included",
        "Col+Cosine 0.0718, Col+Cayley 0.0718, KRR 0.1165",
        f"lowest mean: {best} ({float(means[best].mean()):.4f}); Col+Cosine and Col+Cayley below KRR in every seed: "
        f"{beats_krr}",
        bool(best in ("col_cosine", "col_cayley") and beats_krr),
        subjects(ctx, *(grid_name(k, c) for c in (False, True) for k in ROW_KERNELS), "krr"),
    )


# -- testability -----------------------------------------------------------------------------------------------------
def _set_trivial(ctx: ExperimentState, table: str, zero: torch.Tensor, context_mean: torch.Tensor) -> None:
    """Keep a table's trivial (zero) and context-mean errors per seed on the context and in ``results.json``."""
    ctx.trivial[table] = zero
    numbers = ctx.report.numbers
    numbers.setdefault("trivial", {"predictor": "zero"})[table] = zero.tolist()
    numbers.setdefault("context_mean", {})[table] = context_mean.tolist()


def subjects(ctx: ExperimentState, *names: str) -> list[Subject]:
    """The testability subjects of a claim about ``names``: each method's MSE (mean over seeds, and over held-out
    tasks in Table 2) against the zero predictor's on the same data. Trained models (the pre-trained head, the Table-2
    grid) are ``"model"``; the classical estimators (ridge, KRR, Nadaraya–Watson with any kernel) ``"baseline"``."""
    out = []
    for name in names:
        if name in TABLE1:
            error, table, label = ctx.table1[name], "table1", TABLE1[name][0]
            kind = "model" if name in TABLE1_MODELS else "baseline"
        elif name == "krr":
            error, table, label, kind = ctx.table2[name], "table2", "KRR (Table 2)", "baseline"
        else:
            kernel, column = name.split("_", 1)[1], name.startswith("col_")
            error, table, label, kind = ctx.table2[name], "table2", grid_label(kernel, column), "model"
        out.append(Subject(label, float(error.mean()), float(ctx.trivial[table].mean()), kind=kind))
    return out


# -- helpers ---------------------------------------------------------------------------------------------------------
def _pm(mean, half, digits: int = 4, signed: bool = False) -> str:
    mean, half = float(mean), float(half)
    value = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    return value if math.isnan(half) else f"{value} ± {half:.{digits}f}"


def _seed_values(values: torch.Tensor) -> str:
    return ", ".join(f"{v:.4f}" for v in values.tolist())


def _spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's ρ of two rankings without ties."""
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(a, b, strict=True)) / (n * (n * n - 1))


# -- experiments -----------------------------------------------------------------------------------------------------
@dataclass
class ExperimentState(ExperimentStateBase):
    """An experiment's state (:class:`~hf_icl.reproduce.report.ExperimentStateBase`; the seeds are already shifted in
    ``scale``) and the tables as they are measured (the claims and figures read them)."""

    scale: Scale
    table1: dict | None = None
    table2: dict | None = None
    grid: dict | None = None
    #: the trivial (zero) predictor's MSE per seed, ``{"table1": (seeds,), "table2": (seeds,)}``
    trivial: dict = field(default_factory=dict)
    #: the first seed's Table-1 predictions and prompt, and its pre-trained head (for the figures)
    example: tuple | None = None


def _figures(ctx: ExperimentState) -> None:
    from . import plots

    if ctx.table1 is None:
        table1(ctx)
    if ctx.table2 is None:
        table2(ctx)
    plots.add_figures(ctx)


def _all(ctx: ExperimentState) -> None:
    table1(ctx)
    table2(ctx)
    insights(ctx)
    _figures(ctx)


def _table2_with_claims(ctx: ExperimentState) -> None:
    table1(ctx)  # the insights need both tables; Table 1 costs a minute
    table2(ctx)
    insights(ctx)


EXPERIMENTS = {
    "table1": Experiment("1-D sin(x): ridge, kernels, the pre-trained head, angular kernels", table1),
    "table2": Experiment(
        "10-D latent groups: row kernels × GA column attention, and the seven insights", _table2_with_claims
    ),
    "figures": Experiment("the document's figures (predictions, kernel weights, curves, box plots, bars)", _figures),
    "all": Experiment("both tables, the seven insights and the figures", _all),
}


def shifted(scale: Scale, seed: int) -> Scale:
    """``scale`` with every seed shifted by ``seed``."""
    return replace(scale, seeds=tuple(s + seed for s in scale.seeds)) if seed else scale


def describe(scale: Scale, experiment: str, options: RunOptions) -> str:
    steps = options.steps
    return shifted(scale, options.seed).describe() + (f"; every model trained {steps} steps" if steps else "")


def start(scale: Scale, output_dir: Path, runs_dir: Path, report: Report, options: RunOptions) -> ExperimentState:
    scale = shifted(scale, options.seed)
    report.numbers["scale"] = asdict(scale)
    return ExperimentState.begin(scale, output_dir, runs_dir, report, options)


PAPER_SPEC = Paper(PAPER, EXPERIMENTS, CPU, FULL, describe, start)
