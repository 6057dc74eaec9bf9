"""Sparse attention judged on in-context learning (hf_icl.evaluation.sparse_icl, scripts/sparse_icl.py)."""

import importlib.util
import json

import pytest
import torch
from repo_paths import REPO

from hf_icl import GPT2ForInContextRegression, GPT2ICLConfig, LinearGPTConfig, LinearGPTForInContextRegression
from hf_icl.attention.cab import CABParams, enable_cab
from hf_icl.data.tasks import get_task
from hf_icl.evaluation import sparse_icl
from hf_icl.evaluation.context_scaling import ContextScalingResult
from hf_icl.evaluation.metrics import PositionMetric
from hf_icl.evaluation.sparse_icl import (
    DENSE,
    LEAST_SQUARES,
    Departure,
    SparseICLMethod,
    SparseICLResult,
    causal_pairs_kept,
    find_departure,
    sparse_icl_curves,
)
from hf_icl.kernels.token_selection.rule import select_token_blocks

SCRIPT = REPO / "scripts" / "sparse_icl.py"
N_DIMS, N_POINTS, BLOCK = 3, 24, 16  # 48 tokens: 3 blocks of 16 (8 examples each)
CAB_FIELDS = tuple(CABParams().to_config_fields())


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = GPT2ICLConfig(n_dims=N_DIMS, n_points=N_POINTS, n_embd=32, n_layer=2, n_head=2)
    return GPT2ForInContextRegression(config).eval()


@pytest.fixture(scope="module")
def task():
    return get_task("linear_regression", n_dims=N_DIMS)


def run(model, task, **overrides):
    kwargs = dict(
        budgets=[1, 2], policies=["streaming"], block_size=BLOCK, n_prompts=16, seed=0, n_bootstrap=10, batch_size=8
    )
    return sparse_icl_curves(model, task, **{**kwargs, **overrides})


def cab_state(model):
    config = model.config
    return config._attn_implementation, {f: getattr(config, f, "absent") for f in CAB_FIELDS}, model.training


# -- achieved sparsity ---------------------------------------------------------------------------------------------


def brute_force_sparsity(model, task, method: SparseICLMethod, n_prompts: int, **cab) -> float:
    """Each layer's real q/k under ``method`` (hooked from GPT-2's c_attn), the rule's per-token selection, and the
    kept causal (query token, key) pairs counted one by one."""
    xs, ys = task.sample(16, N_POINTS, seed=0)
    xs, ys = xs[:n_prompts], ys[:n_prompts]
    heads = model.config.n_head
    captured = []

    def hook(module, inputs, output):
        q, k, _ = output.split(model.config.n_embd, dim=-1)
        split = lambda x: x.unflatten(-1, (heads, -1)).transpose(1, 2)  # noqa: E731
        captured.append((split(q), split(k)))

    params = method.cab_hyperparameters(**cab)
    handles = [block.attn.c_attn.register_forward_hook(hook) for block in model.model.backbone.h]
    saved = cab_state(model)
    try:
        enable_cab(model, **params)
        with torch.no_grad():
            model(xs, ys)
    finally:
        for handle in handles:
            handle.remove()
        model.set_attn_implementation(saved[0])
        for field, value in saved[1].items():
            if value == "absent":
                delattr(model.config, field)
    rule = {k: params[k] for k in ("block_size", "policy", "sink_blocks", "local_blocks", "min_seq_len", "budget")}
    rule.update(sparsity=params.get("sparsity", 0.9), topk=params.get("topk", 8))
    kept = causal = 0
    for q, k in captured:
        keep = select_token_blocks(
            q, k, scaling=q.shape[-1] ** -0.5, score=params["score"], backend="torch", **rule
        ).tolist()
        n = q.shape[2]
        for b in range(q.shape[0]):
            for h in range(heads):
                for t in range(n):
                    for key in range(t + 1):
                        causal += 1
                        kept += keep[b][h][t][key // BLOCK]
    return 1 - kept / causal


@pytest.mark.parametrize(
    "method",
    [
        SparseICLMethod("streaming", kept_blocks=2),
        SparseICLMethod("magnitude", kept_blocks=2),
        SparseICLMethod("oracle", kept_blocks=1),
        SparseICLMethod("quest", sparsity=0.5),
        SparseICLMethod("frc", sparsity=0.6),
    ],
    ids=lambda m: m.label,
)
def test_achieved_sparsity_is_the_brute_force_count_of_the_selection(model, task, method):
    kw = (
        {"budgets": [method.kept_blocks]}
        if method.kept_blocks
        else {"budgets": [], "row_sparsities": [method.sparsity]}
    )
    result = run(model, task, policies=[method.name], n_sparsity_prompts=3, **kw)
    expected = brute_force_sparsity(
        model, task, method, 3, block_size=BLOCK, score="mean", sink_blocks=1, local_blocks=1
    )
    assert expected > 0
    assert result.achieved_sparsity[method.label] == pytest.approx(expected, abs=1e-12)
    assert result.achieved_sparsity[DENSE] == 0.0
    assert result.settings["n_tokens"] == 2 * N_POINTS and result.settings["tokens_per_example"] == 2


def test_causal_pairs_kept_counts_partial_and_future_blocks():
    keep = torch.zeros(1, 1, 20, 2, dtype=torch.bool)
    keep[..., 1] = True  # block 1 (keys 16..19) for every token: tokens < 16 see none of it
    assert causal_pairs_kept(keep, block_size=16, n_keys=20) == (1 + 2 + 3 + 4, 20 * 21 // 2)
    last = torch.ones(2, 3, 4, 2, dtype=torch.bool)  # the last 4 of 20 queries keep everything
    assert causal_pairs_kept(last, block_size=16, n_keys=20) == (6 * (17 + 18 + 19 + 20),) * 2
    with pytest.raises(ValueError, match="key blocks"):
        causal_pairs_kept(torch.ones(1, 1, 4, 3, dtype=torch.bool), block_size=16, n_keys=20)
    with pytest.raises(ValueError, match="token_keep"):
        causal_pairs_kept(torch.ones(1, 4, 2), block_size=16, n_keys=20)


# -- dense equivalence and state -----------------------------------------------------------------------------------


def test_a_budget_covering_every_block_is_the_dense_curve(model, task):
    result = run(model, task, budgets=[3, 5], policies=["magnitude", "oracle", "streaming"], row_sparsities=[])
    dense = result.curves.values[DENSE]
    for method in result.methods[1:]:
        assert result.achieved_sparsity[method.label] == 0.0
        torch.testing.assert_close(result.curves.values[method.label], dense, rtol=1e-5, atol=1e-7)
        assert result.ratio_to_dense(method.label) == pytest.approx(1.0, abs=1e-5)
    for departure in result.departures().values():
        assert departure.departs is None
    # and a binding budget does change the curve
    sparse = run(model, task, budgets=[1], policies=["streaming"])
    assert sparse.achieved_sparsity["cab-streaming@1blocks"] > 0.2
    assert not torch.allclose(sparse.curves.values["cab-streaming@1blocks"], dense)
    assert set(sparse.curves.predictors) == {DENSE, "cab-streaming@1blocks", LEAST_SQUARES, "trivial"}


def test_the_model_is_put_back_after_the_call(model, task):
    enable_cab(model, sparsity=0.3, block_size=32, policy="frc")  # the caller's own CAB settings
    model.set_attn_implementation("eager")
    model.train()
    before = cab_state(model)
    try:
        result = run(model, task, policies=["magnitude"], budgets=[1])
        assert cab_state(model) == before
        assert result.settings["dense_implementation"] == "eager"
    finally:
        for field in CAB_FIELDS:
            delattr(model.config, field)
        model.set_attn_implementation("sdpa")
        model.eval()
    plain = cab_state(model)
    run(model, task)
    assert cab_state(model) == plain
    assert not any(hasattr(model.config, field) for field in CAB_FIELDS)


def test_the_model_is_put_back_when_the_call_raises(model, task, monkeypatch):
    plain = cab_state(model)

    def broken(xs, ys):
        raise RuntimeError("estimator broke")

    with pytest.raises(RuntimeError, match="estimator broke"):
        run(model, task, extra_predictors={"broken": broken})
    assert cab_state(model) == plain

    def fail(self, *args):  # raises inside CAB's attention call, with the probe implementation active
        raise RuntimeError("selection broke")

    monkeypatch.setattr(sparse_icl._PairCounter, "observe", fail)
    with pytest.raises(RuntimeError, match="selection broke"):
        run(model, task)
    assert cab_state(model) == plain


def test_extra_predictors_share_the_prompts_and_the_table_and_figure(model, task, tmp_path):
    linear = LinearGPTForInContextRegression(
        LinearGPTConfig(n_dims=N_DIMS, n_points=N_POINTS, n_embd=32, n_layer=1, n_head=2)
    ).eval()
    result = run(model, task, policies=["streaming", "quest"], budgets=[1, 2], extra_predictors={"linear": linear})
    assert result.baselines == [LEAST_SQUARES, "linear", "trivial"]
    table = result.to_markdown(examples=[8, 23])
    assert "| cab-quest@1blocks | quest | 1 block (16 tokens = 8 examples) |" in table
    assert "| linear | linear | — | — |" in table and "- streaming:" in table and "- quest:" in table
    document = json.loads(json.dumps(result.to_dict()))
    assert document["late_positions"] == [18, 23]
    assert {m["label"] for m in document["methods"]} == {m.label for m in result.methods}
    assert document["methods"][2]["score"] is None and document["methods"][3]["score"] == "bound"
    path = result.plot(tmp_path / "figure.png")
    assert path.stat().st_size > 10_000


# -- departure -----------------------------------------------------------------------------------------------------


def synthetic_result(late: dict[int, float], achieved: dict[int, float], n: int = 8) -> SparseICLResult:
    """Magnitude at ``kept_blocks`` k: curves at 5.0 before the late window (the last two positions) and ``late[k]``
    in it (dense: 1.0), with achieved sparsity ``achieved[k]``."""
    methods = [SparseICLMethod()] + [SparseICLMethod("magnitude", kept_blocks=k) for k in late]
    levels = {DENSE: 1.0, **{f"cab-magnitude@{k}blocks": value for k, value in late.items()}}
    values = {}
    for label, level in levels.items():
        values[label] = torch.full((n,), 5.0, dtype=torch.float64)
        values[label][n - 2 :] = level
    values["trivial"] = torch.full((n,), 9.0, dtype=torch.float64)
    curves = ContextScalingResult(PositionMetric("regression"), values, dict(values), dict(values), n_prompts=1)
    shares = {DENSE: 0.0, **{f"cab-magnitude@{k}blocks": share for k, share in achieved.items()}}
    settings = {"block_size": 16, "score": "mean", "tokens_per_example": 2}
    return SparseICLResult(curves, methods, shares, late_start=n - 2, settings=settings)


def test_departure_on_synthetic_curves():
    result = synthetic_result({8: 1.04, 4: 1.09, 2: 1.5, 1: 1.05}, {8: 0.4, 4: 0.7, 2: 0.85, 1: 0.93})
    assert result.late_error("cab-magnitude@2blocks") == pytest.approx(1.5)
    assert result.ratio_to_dense("cab-magnitude@4blocks") == pytest.approx(1.09)
    assert result.departures() == {"magnitude": Departure("cab-magnitude@2blocks", "cab-magnitude@4blocks", 0.10)}
    assert result.departures(threshold=0.6) == {"magnitude": Departure(None, "cab-magnitude@1blocks", 0.6)}
    assert result.departures(threshold=0.05) == {
        "magnitude": Departure("cab-magnitude@4blocks", "cab-magnitude@8blocks", 0.05)
    }
    table = result.to_markdown(examples=[0, 7])
    assert "within 10% of dense down to cab-magnitude@4blocks (70.0% sparse)" in table
    assert "departs at cab-magnitude@2blocks (85.0% sparse)" in table


def test_find_departure_orders_by_sparsity_and_is_symmetric():
    assert find_departure([("b", 0.8, 1.5), ("a", 0.2, 1.0)]) == Departure("b", "a", 0.1)
    assert find_departure([("a", 0.2, 0.85), ("b", 0.8, 1.0)]) == Departure("a", None, 0.1)  # better by 15% departs too
    assert find_departure([("a", 0.2, 1.1), ("b", 0.5, 0.95)]) == Departure(None, "b", 0.1)  # exactly 10%: within
    assert find_departure([]) == Departure(None, None, 0.1)
    with pytest.raises(ValueError, match="threshold"):
        find_departure([("a", 0.2, 1.0)], threshold=0)
    with pytest.raises(ValueError, match=r"entries\[0\]"):
        find_departure([("a", 0.2)])
    with pytest.raises(ValueError, match=r"entries\[1\] achieved_sparsity"):
        find_departure([("a", 0.2, 1.0), ("b", 1.5, 1.0)])


# -- validation ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"policies": ["nope"]}, r"policies\[0\]"),
        ({"policies": []}, "policies must name"),
        ({"policies": "streaming"}, "policies must be a sequence"),
        ({"budgets": [0]}, r"budgets\[0\]"),
        ({"budgets": [2, 2]}, "budgets must not repeat"),
        ({"budgets": [], "row_sparsities": []}, "budgets and row_sparsities"),
        ({"row_sparsities": [1.0]}, r"row_sparsities\[0\]"),
        ({"block_size": 24}, "block_size must be a power of two"),
        ({"block_size": 8}, "block_size"),
        ({"score": "best"}, "score"),
        ({"sink_blocks": -1}, "sink_blocks"),
        ({"local_blocks": 0}, "local_blocks"),
        ({"n_prompts": 0}, "n_prompts"),
        ({"n_points": 0}, "n_points"),
        ({"batch_size": 0}, "batch_size"),
        ({"n_sparsity_prompts": 0}, "n_sparsity_prompts"),
        ({"late_fraction": 0.0}, "late_fraction"),
        ({"extra_predictors": {LEAST_SQUARES: lambda xs, ys: ys}}, "extra_predictors may not use"),
        ({"extra_predictors": {"x": 3}}, "predictor 'x'"),
    ],
)
def test_arguments_are_validated(model, task, overrides, match):
    with pytest.raises(ValueError, match=match):
        run(model, task, **overrides)


def test_model_and_task_are_validated(model):
    with pytest.raises(ValueError, match="model must be"):
        sparse_icl_curves(lambda xs, ys: ys, "linear_regression", budgets=[1], policies=["streaming"])
    with pytest.raises(ValueError, match="task must be a regression task"):
        sparse_icl_curves(model, get_task("linear_classification", n_dims=N_DIMS), budgets=[1])
    with pytest.raises(ValueError, match="exactly one of kept_blocks or sparsity"):
        SparseICLMethod("streaming")
    with pytest.raises(ValueError, match="dense method takes no budget"):
        SparseICLMethod(DENSE, kept_blocks=2)


# -- the script ----------------------------------------------------------------------------------------------------


def load_script():
    spec = importlib.util.spec_from_file_location("sparse_icl_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_script().main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--model", "--linear-model", "--budgets", "--policies", "--block-size", "--n-prompts", "--output-dir"):
        assert flag in out


def test_script_end_to_end(model, tmp_path, capsys):
    model.save_pretrained(tmp_path / "gpt2")
    torch.manual_seed(1)
    LinearGPTForInContextRegression(
        LinearGPTConfig(n_dims=N_DIMS, n_points=N_POINTS, n_embd=32, n_layer=1, n_head=2)
    ).save_pretrained(tmp_path / "linear")
    out = tmp_path / "out"
    argv = [
        "--model",
        str(tmp_path / "gpt2"),
        "--linear-model",
        str(tmp_path / "linear"),
        "--task",
        "linear_regression",
        "--budgets",
        "1,2",
        "--row-sparsities",
        "0.5",
        "--policies",
        "streaming,magnitude",
        "--n-prompts",
        "16",
        "--n-bootstrap",
        "10",
        "--batch-size",
        "8",
        "--output-dir",
        str(out),
    ]
    assert load_script().main(argv) == 0
    document = json.loads((out / "results.json").read_text())
    assert document["command"].startswith("python scripts/sparse_icl.py --model")
    assert document["settings"]["n_tokens"] == 48 and document["settings"]["n_blocks"] == 3
    labels = {m["label"] for m in document["methods"]}
    assert labels == {
        DENSE,
        "cab-streaming@2blocks",
        "cab-streaming@1blocks",
        "cab-streaming@row0.50",
        "cab-magnitude@2blocks",
        "cab-magnitude@1blocks",
        "cab-magnitude@row0.50",
    }
    assert "linear_gpt (linear attention)" in document["curves"]
    assert set(document["departures"]) == {"streaming", "magnitude"}
    assert "ratio to dense" in (out / "results.md").read_text()
    assert (out / "sparse_icl.png").stat().st_size > 10_000
    with pytest.raises(SystemExit) as exit_info:
        load_script().main([*argv[:-2], "--output-dir", str(tmp_path / "bad"), "--budgets", "0"])
    assert exit_info.value.code == 2
    assert "budgets[0]" in capsys.readouterr().err
