"""Bad inputs, table-driven: each row is a call, the error it must raise and words its message must hold.

The words name the argument, the value received and what is allowed, so a user can fix the call from the
message alone. Python rows call the API; CLI rows run ``hf_icl.cli.main`` and must exit with status 2 and
one ``hf-icl <command>: error: ...`` line on stderr, found before any training or model loading (a guard
makes that work fail the test). The good paths next to the changed behaviour are tested at the end.
"""

from __future__ import annotations

import json
import shlex
from functools import cache
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from bad_input_rows import assert_rejects, row

import hf_icl
from hf_icl import GPT2ForInContextRegression, GPT2ICLConfig, GPT2ICLModel
from hf_icl.attention import CABParams, block_sparse_attention
from hf_icl.cli import main
from hf_icl.data.builders import ICLTasks
from hf_icl.data.niah import NeedleInAHaystackConfig
from hf_icl.data.tasks import get_task, iterate_prompts
from hf_icl.estimators import get_estimator
from hf_icl.evaluation import evaluate_context_scaling, evaluate_task_scaling, ood_task
from hf_icl.kernels import (
    block_sparse_attention_forward,
    block_sparse_decode,
    block_sparse_flash_attention,
    coarsen_max_l2,
)
from hf_icl.modeling import build_model
from hf_icl.modeling.prompts import check_prompt
from hf_icl.modeling.sgpt import (
    MLPICLConfig,
    OneLayerFeatureMapConfig,
    SGPTConfig,
    SGPTForInContextRegression,
    per_prefix_predictions,
    psi_kernel,
    psi_linear,
)
from hf_icl.reproduce import reproduce
from hf_icl.training import ICLTrainingArguments

# -- tiny fixtures shared by the rows (built once, on first use) -------------------------------------------------


@cache
def model(kind: str = "regression"):
    torch.manual_seed(0)
    extra = {"n_classes": 3} if kind == "categorical" else {}
    config = GPT2ICLConfig(n_dims=3, n_points=5, n_embd=16, n_layer=1, n_head=2, target_kind=kind, **extra)
    return GPT2ForInContextRegression(config).eval()


@cache
def base_model():
    return GPT2ICLModel(GPT2ICLConfig(n_dims=3, n_points=5, n_embd=16, n_layer=1, n_head=2)).eval()


@cache
def lm():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=64))


def prompt(batch: int = 2, n_points: int = 5, n_dims: int = 3):
    generator = torch.Generator().manual_seed(0)
    return torch.randn(batch, n_points, n_dims, generator=generator), torch.randn(batch, n_points, generator=generator)


def with_entry(tensor: torch.Tensor, index: tuple, value) -> torch.Tensor:
    out = tensor.clone()
    out[index] = value
    return out


def labels(kind: str) -> torch.Tensor:
    if kind == "binary":
        return torch.tensor([[1.0, -1.0, 1.0, 1.0, -1.0], [-1.0, -1.0, 1.0, -1.0, 1.0]])
    return torch.tensor([[0, 1, 2, 1, 0], [2, 2, 0, 1, 1]])


def qkv(n: int = 32, dim: int = 32, heads: int = 2, dtype=torch.float32):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(1, heads, n, dim, generator=generator, dtype=dtype) for _ in range(3)]


def keep(n_q_blocks: int = 2, n_k_blocks: int = 2, heads: int = 2) -> torch.Tensor:
    return torch.ones(1, heads, n_q_blocks, n_k_blocks, dtype=torch.bool).tril()


def flash(scaling=0.2, block_size=16, **overrides):
    q, k, v = qkv()
    args = {"q": q, "k": k, "v": v, "keep": keep(), **overrides}
    return block_sparse_flash_attention(
        args["q"], args["k"], args["v"], args["keep"], block_size=block_size, scaling=scaling
    )


xs, ys = prompt()
LINEAR = get_task("linear_regression", n_dims=3)
LS = {"ls": get_estimator("least_squares")}

# -- the Python API ----------------------------------------------------------------------------------------------

MODEL_ROWS = [
    row(
        "forward-xs-nan",
        lambda: model()(with_entry(xs, (1, 3, 2), float("nan")), ys),
        ["xs", "finite", "nan", "xs[1, 3, 2]"],
    ),
    row("forward-xs-inf", lambda: model()(with_entry(xs, (0, 0, 0), float("inf")), ys), ["xs", "finite", "inf"]),
    row(
        "forward-ys-nan", lambda: model()(xs, with_entry(ys, (0, 4), float("nan"))), ["ys", "finite", "nan", "ys[0, 4]"]
    ),
    row(
        "forward-ys-inf",
        lambda: model()(xs, with_entry(ys, (1, 0), -float("inf"))),
        ["ys", "finite", "-inf", "regression"],
    ),
    row("forward-xs-int", lambda: model()(xs.long(), ys), ["xs", "floating-point", "torch.int64"]),
    row("forward-xs-complex", lambda: model()(xs.to(torch.complex64), ys), ["xs", "floating-point", "complex64"]),
    row("forward-xs-list", lambda: model()(xs.tolist(), ys), ["xs", "torch.Tensor", "list"]),
    row("forward-ys-bool", lambda: model()(xs, ys > 0), ["ys", "torch.bool", "real numbers"]),
    row("forward-ys-complex", lambda: model()(xs, ys.to(torch.complex64)), ["ys", "complex64"]),
    row("forward-empty-batch", lambda: model()(xs[:0], ys[:0]), ["xs", "(0, 5, 3)", "batch >= 1"]),
    row("forward-no-points", lambda: model()(xs[:, :0], ys[:, :0]), ["xs", "(2, 0, 3)", "n_points >= 1"]),
    row("forward-wrong-n-dims", lambda: model()(torch.randn(2, 5, 4), ys), ["xs", "(2, 5, 4)", "(batch, n_points, 3)"]),
    row("forward-xs-2d", lambda: model()(xs[0], ys[0]), ["xs", "(5, 3)", "(batch, n_points, 3)"]),
    row("forward-ys-shape", lambda: model()(xs, ys[:, :4]), ["ys", "(2, 4)", "(2, 5)"]),
    row("forward-too-long", lambda: model()(*prompt(n_points=7)), ["7 points", "n_points=5"]),
    row("forward-devices", lambda: model()(xs.to("meta"), ys), ["xs and ys", "meta", "cpu"]),
    row("forward-model-device", lambda: model()(xs.to("meta"), ys.to("meta")), ["model's device", "cpu", "meta"]),
    row(
        "forward-binary-zero",
        lambda: model("binary")(xs, with_entry(labels("binary"), (0, 3), 0.0)),
        ["ys", "±1", "got 0", "binary", "2 * ys - 1"],
    ),
    row(
        "forward-binary-half",
        lambda: model("binary")(xs, with_entry(labels("binary"), (1, 2), 0.5)),
        ["ys", "±1", "0.5", "ys[1, 2]"],
    ),
    row(
        "forward-binary-nan",
        lambda: model("binary")(xs, with_entry(labels("binary"), (0, 0), float("nan"))),
        ["ys", "±1", "nan"],
    ),
    row(
        "forward-categorical-fraction",
        lambda: model("categorical")(xs, with_entry(labels("c").float(), (0, 2), 1.7)),
        ["ys", "1.7", "[0, n_classes=3)", "categorical"],
    ),
    row(
        "forward-categorical-too-big",
        lambda: model("categorical")(xs, with_entry(labels("c"), (1, 1), 3)),
        ["ys", "got 3", "n_classes=3"],
    ),
    row(
        "forward-categorical-negative",
        lambda: model("categorical")(xs, with_entry(labels("c"), (1, 4), -1)),
        ["ys", "-1", "[0, n_classes=3)"],
    ),
    row(
        "forward-categorical-nan",
        lambda: model("categorical")(xs, with_entry(labels("c").float(), (0, 0), float("nan"))),
        ["ys", "nan", "class ids"],
    ),
    row(
        "forward-categorical-bool",
        lambda: model("categorical")(xs, labels("c") > 0),
        ["ys", "torch.bool", "integer class ids"],
    ),
    row(
        "forward-kwarg-typo",
        lambda: model()(xs, ys, loss_position=[1]),
        ["loss_position", "did you mean 'loss_positions'"],
    ),
    row("forward-kwarg-unknown", lambda: model()(xs, ys, labels=ys), ["labels", "unexpected keyword", "check_inputs"]),
    row(
        "forward-loss-positions-float",
        lambda: model()(xs, ys, loss_positions=[1.5]),
        ["loss_positions", "float32", "integer indices"],
    ),
    row("forward-loss-positions-range", lambda: model()(xs, ys, loss_positions=[7]), ["loss_positions", "[0, 4]", "7"]),
    row(
        "forward-loss-positions-mask",
        lambda: model()(xs, ys, loss_positions=torch.ones(4, dtype=torch.bool)),
        ["loss_positions", "(5,)", "(4,)"],
    ),
    row(
        "base-model-xs-nan", lambda: base_model()(with_entry(xs, (0, 1, 1), float("nan")), ys), ["xs", "finite", "nan"]
    ),
    row(
        "check-prompt-n-classes",
        lambda: check_prompt(xs, labels("c"), 3, target_kind="categorical"),
        ["n_classes", "categorical"],
    ),
    row(
        "check-prompt-target-kind",
        lambda: check_prompt(xs, ys, 3, target_kind="ordinal"),
        ["target_kind", "ordinal", "regression"],
    ),
]

CONFIG_ROWS = [
    row(
        "config-unknown-n-layers",
        lambda: GPT2ICLConfig(n_layers=2),
        ["GPT2ICLConfig", "unknown field 'n_layers'", "did you mean 'n_layer'"],
    ),
    row(
        "config-unknown-no-match",
        lambda: GPT2ICLConfig(zzz=1),
        ["unknown field 'zzz'", "its fields", "n_dims", "cab_sparsity"],
    ),
    row("config-cab-typo", lambda: GPT2ICLConfig(cab_sparsty=0.5), ["'cab_sparsty'", "did you mean 'cab_sparsity'"]),
    row("config-cab-sparsity", lambda: GPT2ICLConfig(cab_sparsity=1.5), ["cab_sparsity", "1.5", "[0, 1)"]),
    row("config-cab-block-size", lambda: GPT2ICLConfig(cab_block_size=24), ["cab_block_size", "24", "power of two"]),
    row("config-cab-policy", lambda: GPT2ICLConfig(cab_policy="random"), ["cab_policy", "random", "hybrid"]),
    row("config-model-type", lambda: GPT2ICLConfig(model_type="gpt2"), ["model_type='gpt2'", "'gpt2_icl'"]),
    row("config-n-positions", lambda: GPT2ICLConfig(n_positions=7), ["n_positions", "7", "n_points"]),
    row("config-n-dims", lambda: GPT2ICLConfig(n_dims=0), ["n_dims", "got 0", "[1, +inf)"]),
    row("config-n-dims-float", lambda: GPT2ICLConfig(n_dims=2.5), ["n_dims", "2.5", "integer"]),
    row(
        "config-target-kind",
        lambda: GPT2ICLConfig(target_kind="multiclass"),
        ["target_kind", "multiclass", "categorical"],
    ),
    row("config-n-classes", lambda: GPT2ICLConfig(n_classes=1), ["n_classes", "got 1", "[2, +inf)"]),
    row(
        "config-prompt-format",
        lambda: GPT2ICLConfig(prompt_format="stacked"),
        ["prompt_format", "stacked", "interleaved"],
    ),
    row("config-io-init", lambda: GPT2ICLConfig(io_init="torch"), ["io_init", "torch", "garg"]),
    row("config-heads-divide", lambda: GPT2ICLConfig(n_embd=30, n_head=4), ["n_embd (30)", "n_head (4)", "divisible"]),
    row("config-dropout", lambda: GPT2ICLConfig(resid_pdrop=1.5), ["resid_pdrop", "1.5", "[0, 1]"]),
    row(
        "config-activation",
        lambda: GPT2ICLConfig(activation_function="gelu2"),
        ["activation_function", "gelu2", "gelu_new"],
    ),
    row("config-layer-norm-eps", lambda: GPT2ICLConfig(layer_norm_epsilon=0.0), ["layer_norm_epsilon", "0.0", "(0"]),
    row("config-alias-checked", lambda: GPT2ICLConfig(hidden_size=30, n_head=4), ["n_embd (30)", "n_head (4)"]),
    row("preset-size", lambda: GPT2ICLConfig.from_preset("huge"), ["size", "huge", "tiny"]),
    row("preset-clash", lambda: GPT2ICLConfig.from_preset("tiny", num_hidden_layers=2), ["size='tiny'", "n_layer"]),
    row(
        "build-model-override-typo",
        lambda: build_model("gpt2_icl", "tiny", n_layers=1),
        ["n_layers", "did you mean 'n_layer'"],
    ),
    row("build-model-type", lambda: build_model("gpt3", "tiny"), ["model_type", "gpt3", "gpt2_icl"]),
    row("from-pretrained-typo", lambda f: GPT2ICLConfig.from_pretrained(f.typo_config), ["n_layerz", "n_layer"]),
    row(
        "auto-config-typo", lambda f: __import__("transformers").AutoConfig.from_pretrained(f.typo_config), ["n_layerz"]
    ),
]

CAB_ROWS = [
    row(
        "enable-cab-typo",
        lambda: hf_icl.enable_cab(lm(), sparsty=0.9),
        ["sparsty", "did you mean 'sparsity'", "allowed", "block_size", "magnitude_fraction"],
    ),
    row("enable-cab-prefixed", lambda: hf_icl.enable_cab(lm(), cab_sparsity=0.9), ["cab_sparsity", "'sparsity'"]),
    row("enable-cab-sparsity", lambda: hf_icl.enable_cab(lm(), sparsity=1.0), ["cab_sparsity", "1.0", "[0, 1)"]),
    row(
        "enable-cab-block-size",
        lambda: hf_icl.enable_cab(lm(), block_size=48),
        ["cab_block_size", "48", "power of two"],
    ),
    row("enable-cab-policy", lambda: hf_icl.enable_cab(lm(), policy="random"), ["cab_policy", "random", "frc"]),
    row("enable-cab-budget", lambda: hf_icl.enable_cab(lm(), budget="all"), ["cab_budget", "all", "row"]),
    row("enable-cab-backend", lambda: hf_icl.enable_cab(lm(), backend="cuda"), ["cab_backend", "cuda", "triton"]),
    row("enable-cab-lambda", lambda: hf_icl.enable_cab(lm(), lam=-1.0), ["cab_lambda", "-1.0", "[0"]),
    row("enable-cab-not-a-model", lambda: hf_icl.enable_cab(object()), ["model", "PreTrainedModel", "object"]),
    row(
        "cab-params-fraction",
        lambda: CABParams(magnitude_fraction=2.0),
        ["cab_magnitude_fraction", "2.0", "[0.0, 1.0]"],
    ),
    row(
        "cab-stray-config-field",
        lambda: CABParams.from_config(SimpleNamespace(cab_sparsty=0.5)),
        ["cab_sparsty", "did you mean 'cab_sparsity'"],
    ),
]

ESTIMATOR_ROWS = [
    row(
        "xgboost-n-estimators", lambda: get_estimator("xgboost", n_estimators=0), ["n_estimators", "got 0", "[1, +inf)"]
    ),
    row(
        "xgboost-name-typo",
        lambda: get_estimator("xgboost", n_estimator=5),
        ["n_estimator", "did you mean 'n_estimators'", "max_depth"],
    ),
    row(
        "xgboost-learning-rate",
        lambda: get_estimator("xgboost", learning_rate=0.0),
        ["learning_rate", "0.0", "(0.0, 1.0]"],
    ),
    row("xgboost-subsample", lambda: get_estimator("xgboost", subsample=1.5), ["subsample", "1.5", "(0.0, 1.0]"]),
    row("xgboost-max-depth", lambda: get_estimator("xgboost", max_depth=-1), ["max_depth", "-1", "[0, +inf)"]),
    row("xgboost-booster", lambda: get_estimator("xgboost", booster="gbforest"), ["booster", "gbforest", "gbtree"]),
    row("xgboost-n-jobs", lambda: get_estimator("xgboost", n_jobs=0), ["n_jobs", "0", ">= 1"]),
    row("xgboost-reg-lambda", lambda: get_estimator("xgboost", reg_lambda=-1.0), ["reg_lambda", "-1.0", "[0.0, +inf)"]),
    row("knn-k", lambda: get_estimator("knn", k=0), ["k", "got 0", "[1, +inf)"]),
    row("knn-k-float", lambda: get_estimator("knn", k=2.5), ["k", "2.5", "integer"]),
    row("ridge-lam", lambda: get_estimator("ridge", lam=0.0), ["lam", "0.0", "(0.0, +inf)"]),
    row("ridge-lam-nan", lambda: get_estimator("ridge", lam=float("nan")), ["lam", "nan", "finite"]),
    row("kernel-ridge-kernel", lambda: get_estimator("kernel_ridge", kernel="poly"), ["kernel", "poly", "rbf"]),
    row(
        "kernel-ridge-linear-bandwidth",
        lambda: get_estimator("kernel_ridge", kernel="linear", bandwidth=2.0),
        ["bandwidth", "2.0", "kernel='linear'"],
    ),
    row(
        "nw-hilbert-bandwidth",
        lambda: get_estimator("nadaraya_watson", kernel="hilbert", bandwidth=0.5),
        ["bandwidth", "0.5", "kernel='hilbert'"],
    ),
    row(
        "two-layer-nn-diverges",
        lambda: get_estimator("two_layer_nn", hidden=4, steps=30, lr=1e30)(*LINEAR.sample(2, 5, seed=0)),
        ["two_layer_nn diverged", "lr=1e+30", "smaller lr"],
    ),
    row(
        "kernel-ridge-bandwidth",
        lambda: get_estimator("kernel_ridge", bandwidth=-1.0),
        ["bandwidth", "-1.0", "(0.0, +inf)"],
    ),
    row(
        "nadaraya-watson-bandwidth",
        lambda: get_estimator("nadaraya_watson", bandwidth=0),
        ["bandwidth", "got 0", "(0.0"],
    ),
    row(
        "nadaraya-watson-kernel",
        lambda: get_estimator("nadaraya_watson", kernel="gauss"),
        ["kernel", "gauss", "hilbert"],
    ),
    row("two-layer-nn-hidden", lambda: get_estimator("two_layer_nn", hidden=0), ["hidden", "got 0", "[1, +inf)"]),
    row("two-layer-nn-steps", lambda: get_estimator("two_layer_nn", steps=-1), ["steps", "-1", "[0, +inf)"]),
    row("two-layer-nn-lr", lambda: get_estimator("two_layer_nn", lr=0.0), ["lr", "0.0", "(0.0, +inf)"]),
    row("two-layer-nn-seed", lambda: get_estimator("two_layer_nn", seed=-1), ["seed", "-1", "[0, +inf)"]),
    row(
        "decision-tree-depth", lambda: get_estimator("decision_tree", max_depth=0), ["max_depth", "got 0", "[1, +inf)"]
    ),
    row(
        "decision-tree-seed",
        lambda: get_estimator("decision_tree", random_state=-2),
        ["random_state", "-2", "[0, +inf)"],
    ),
    row(
        "optimal-ridge-noise",
        lambda: get_estimator("optimal_ridge", noise_std=0.0),
        ["noise_std[0]", "0.0", "(0.0, +inf)"],
    ),
    row(
        "optimal-ridge-noise-empty",
        lambda: get_estimator("optimal_ridge", noise_std=[]),
        ["noise_std", "[]", "non-empty"],
    ),
    row(
        "optimal-ridge-noise-string",
        lambda: get_estimator("optimal_ridge", noise_std="0.5"),
        ["noise_std", "'0.5'", "positive number"],
    ),
    row(
        "optimal-ridge-weight-var",
        lambda: get_estimator("optimal_ridge", noise_std=0.5, weight_var=-1.0),
        ["weight_var", "-1.0", "(0.0, +inf)"],
    ),
    row(
        "optimal-ridge-probs",
        lambda: get_estimator("optimal_ridge", noise_std=[0.1, 1.0], noise_probs=[0.5, 0.6]),
        ["noise_probs", "[0.5, 0.6]", "summing to 1"],
    ),
    row("one-step-gd-lr", lambda: get_estimator("one_step_gd", lr=0.0), ["lr", "0.0", "(0.0, +inf)"]),
    row("least-squares-rtol", lambda: get_estimator("least_squares", rtol=2.0), ["rtol", "2.0", "1.0]"]),
    row("estimator-unknown", lambda: get_estimator("ridgeless"), ["ridgeless", "least_squares", "xgboost"]),
    row("estimator-bad-keyword", lambda: get_estimator("knn", kk=3), ["knn", "kk", "(k: 'int' = 3)"]),
    row(
        "estimator-xs-nan",
        lambda: get_estimator("least_squares")(with_entry(xs, (0, 2, 1), float("nan")), ys),
        ["xs", "finite", "nan"],
    ),
    row("estimator-ys-int", lambda: get_estimator("averaging")(xs, ys.long()), ["ys", "floating-point", "torch.int64"]),
]

KERNEL_ROWS = [
    row("flash-scaling-nan", lambda: flash(scaling=float("nan")), ["scaling", "nan", "finite positive"]),
    row("flash-scaling-zero", lambda: flash(scaling=0.0), ["scaling", "0.0", "finite positive"]),
    row("flash-scaling-negative", lambda: flash(scaling=-0.1), ["scaling", "-0.1", "positive"]),
    row("flash-scaling-string", lambda: flash(scaling="0.1"), ["scaling", "'0.1'", "number"]),
    row("flash-block-size", lambda: flash(block_size=24), ["block_size", "24", "[16, 32, 64, 128]"]),
    row("flash-dtype-mismatch", lambda: flash(k=qkv()[1].half()), ["q.dtype", "k.dtype", "float16"]),
    row("flash-dtype-float64", lambda: flash(q=qkv()[0].double()), ["q.dtype", "float64", "bfloat16"]),
    row(
        "flash-head-dim",
        lambda: flash(**dict(zip("qkv", qkv(dim=48), strict=True))),
        ["head_dim", "48", "[32, 64, 128]"],
    ),
    row("flash-heads", lambda: flash(k=qkv(heads=3)[1]), ["k's heads", "divide", "(1, 3, 32, 32)"]),
    row("flash-keep-shape", lambda: flash(keep=keep(n_k_blocks=3)), ["keep", "(1, 2, 2, 2)", "(1, 2, 2, 3)"]),
    row("flash-keep-dtype", lambda: flash(keep=keep().to(torch.uint8)), ["keep.dtype", "torch.bool", "uint8"]),
    row(
        "forward-backend",
        lambda: block_sparse_attention_forward(*qkv(), keep(), block_size=16, scaling=0.2, backend="cuda"),
        ["backend", "cuda", "torch"],
    ),
    row(
        "forward-key-padding",
        lambda: block_sparse_attention_forward(
            *qkv(), keep(), block_size=16, scaling=0.2, key_padding_mask=torch.ones(1, 32)
        ),
        ["key_padding_mask", "torch.bool", "float32"],
    ),
    row(
        "forward-q-offset",
        lambda: block_sparse_attention_forward(*qkv(), keep(), block_size=16, scaling=0.2, q_offset=5),
        ["q_offset", "multiple of block_size=16", "5"],
    ),
    row(
        "decode-many-queries",
        lambda: block_sparse_decode(*qkv(), keep(), block_size=16, scaling=0.2, q_offset=31),
        ["q", "q.shape[2] == 1", "(1, 2, 32, 32)"],
    ),
    row(
        "decode-scaling-inf",
        lambda: block_sparse_decode(
            qkv()[0][:, :, :1], *qkv()[1:], keep(1, 2), block_size=16, scaling=float("inf"), q_offset=31
        ),
        ["scaling", "inf", "finite positive"],
    ),
    row("coarsen-block-size", lambda: coarsen_max_l2(*qkv()[:2], block_size=17), ["block_size", "17", "power of two"]),
    row("coarsen-rank", lambda: coarsen_max_l2(qkv()[0][0], qkv()[1], block_size=16), ["q", "4-D", "(2, 32, 32)"]),
    row(
        "coarsen-heads",
        lambda: coarsen_max_l2(qkv()[0], qkv(heads=1)[1], block_size=16),
        ["heads", "q.shape=(1, 2, 32, 32)", "k.shape=(1, 1, 32, 32)"],
    ),
    row(
        "attention-scaling",
        lambda: block_sparse_attention(*qkv(), keep(), block_size=16, scaling=0),
        ["scaling", "got 0", "finite positive"],
    ),
    row(
        "attention-keep-float",
        lambda: block_sparse_attention(*qkv(), keep().float(), block_size=16, scaling=0.2),
        ["keep", "bool", "torch.float32"],
    ),
    row(
        "attention-dropout",
        lambda: block_sparse_attention(*qkv(), keep(), block_size=16, scaling=0.2, dropout=1.0),
        ["dropout", "1.0", "[0, 1)"],
    ),
    row(
        "attention-block-size",
        lambda: block_sparse_attention(*qkv(), keep(), block_size=0, scaling=0.2),
        ["block_size", "got 0", "positive integer"],
    ),
    row(
        "attention-mask",
        lambda: block_sparse_attention(
            *qkv(), keep(), block_size=16, scaling=0.2, attention_mask=torch.ones(1, 1, 32, 32)
        ),
        ["attention_mask", "bool", "torch.float32"],
    ),
]

TASK_ROWS = [
    # a device this machine lacks: the argument named, not torch's "Torch not compiled with CUDA" assertion (issue 30)
    row("task-sample-device", lambda: LINEAR.sample(2, 3, seed=0, device="cuda:7"), ["device", "cuda:7"]),
    row(
        "task-iterate-device",
        lambda: next(iterate_prompts(LINEAR, 2, 3, seed=0, device="cuda:7")),
        ["device", "cuda:7"],
    ),
    row(
        "task-unknown",
        lambda: get_task("linear_regresion", n_dims=3),
        ["linear_regresion", "did you mean 'linear_regression'"],
    ),
    row("estimator-typo", lambda: get_estimator("least_square"), ["least_square", "did you mean 'least_squares'?"]),
    row("task-n-dims", lambda: get_task("linear_regression", n_dims=0), ["n_dims", "got 0", "[1, +inf)"]),
    row("task-n-dims-string", lambda: get_task("linear_regression", n_dims="3"), ["n_dims", "'3'", "integer"]),
    row(
        "task-noise",
        lambda: get_task("noisy_linear_regression", n_dims=3, noise_std=-1),
        ["noise_std", "-1", "[0, +inf)"],
    ),
    row(
        "task-sparsity", lambda: get_task("sparse_linear_regression", n_dims=3, sparsity=5), ["sparsity", "5", "[1, 3]"]
    ),
    row(
        "task-unknown-parameter",
        lambda: get_task("linear_regression", n_dims=3, noise_std=0.1),
        ["noise_std", "weight_prior"],
    ),
    row("task-inputs", lambda: get_task("linear_regression", n_dims=3, inputs="gausian"), ["gausian", "gaussian"]),
    row("task-n-classes", lambda: get_task("categorical", n_dims=3, n_classes=1), ["n_classes", "got 1", "[2, +inf)"]),
    row(
        "task-weight-prior",
        lambda: get_task("linear_regression", n_dims=3, weight_prior="flat"),
        ["weight_prior", "flat", "scaled"],
    ),
    row("task-sample-batch", lambda: LINEAR.sample(0, 4, seed=0), ["batch_size", "got 0", "[1, +inf)"]),
    row("task-sample-seed", lambda: LINEAR.sample(2, 3, seed=-1), ["seed", "-1", "[0, +inf)"]),
]

EVALUATION_ROWS = [
    row(
        "ecs-device-missing",
        lambda: evaluate_context_scaling(LS, LINEAR, n_prompts=5, n_points=4, device="cuda:7"),
        ["device", "cuda:7", "use cpu"],
    ),
    row(
        "ecs-device-name",
        lambda: evaluate_context_scaling(LS, LINEAR, n_prompts=5, n_points=4, device="banana"),
        ["device", "'banana'", "cpu, cuda"],
    ),
    row(
        "ecs-n-prompts",
        lambda: evaluate_context_scaling(LS, LINEAR, n_prompts=-5, n_points=4),
        ["n_prompts", "-5", "[1, +inf)"],
    ),
    row(
        "ecs-n-points",
        lambda: evaluate_context_scaling(LS, LINEAR, n_prompts=5, n_points=0),
        ["n_points", "got 0", "[1, +inf)"],
    ),
    row(
        "ecs-confidence-order",
        lambda: evaluate_context_scaling(LS, LINEAR, n_prompts=5, n_points=4, confidence=(0.9, 0.1)),
        ["confidence", "(0.9, 0.1)", "lower < upper"],
    ),
    row(
        "ecs-confidence-range",
        lambda: evaluate_context_scaling(LS, LINEAR, n_prompts=5, n_points=4, confidence=(0.05, 1.5)),
        ["confidence[1]", "1.5", "[0, 1]"],
    ),
    row(
        "ecs-normalizer",
        lambda: evaluate_context_scaling(LS, LINEAR, n_prompts=5, n_points=4, normalizer=0),
        ["normalizer", "got 0", "finite positive"],
    ),
    row(
        "ecs-normalizer-nan",
        lambda: evaluate_context_scaling(LS, LINEAR, n_prompts=5, n_points=4, normalizer=float("nan")),
        ["normalizer", "nan"],
    ),
    row(
        "ecs-n-bootstrap",
        lambda: evaluate_context_scaling(LS, LINEAR, n_prompts=5, n_points=4, n_bootstrap=0),
        ["n_bootstrap", "got 0", "[1, +inf)"],
    ),
    row(
        "ecs-batch-size",
        lambda: evaluate_context_scaling(LS, LINEAR, n_prompts=5, n_points=4, batch_size=0),
        ["batch_size", "got 0", "[1, +inf)"],
    ),
    row(
        "ecs-reserved-name",
        lambda: evaluate_context_scaling({"trivial": LS["ls"]}, LINEAR, n_prompts=5, n_points=4),
        ["'trivial'", "reserved"],
    ),
    row(
        "ecs-no-predictors",
        lambda: evaluate_context_scaling({}, LINEAR, n_prompts=5, n_points=4),
        ["non-empty mapping", "{}"],
    ),
    row(
        "ecs-no-n-points", lambda: evaluate_context_scaling(LS, LINEAR, n_prompts=5), ["n_points is required", "['ls']"]
    ),
    row(
        "ets-pool-size",
        lambda: evaluate_task_scaling({0: LS["ls"]}, LINEAR, n_points=4, n_prompts=4),
        ["pool size T", "got 0", "[1, +inf)"],
    ),
    row(
        "ets-position",
        lambda: evaluate_task_scaling({4: LS["ls"]}, LINEAR, positions=[9], n_points=4, n_prompts=4),
        ["position", "9", "[0, 3]"],
    ),
    row("ood-kind", lambda: ood_task(LINEAR, "sideways"), ["sideways", "scaled_x"]),
]

TRAINING_ROWS = [
    row(
        "args-task-params-n-dims",
        lambda: ICLTrainingArguments(task_params='{"n_dims": 3}'),
        ["task_params", "n_dims", "--n_dims"],
    ),
    row(
        "args-task-params-n-tasks",
        lambda: ICLTrainingArguments(task_params='{"n_tasks": 8}'),
        ["task_params", "n_tasks", "--n_tasks"],
    ),
    row(
        "args-task-params-pool-seed",
        lambda: ICLTrainingArguments(task_params='{"pool_seed": 1}'),
        ["pool_seed", "--pool_seed"],
    ),
    row(
        "args-task-params-unknown",
        lambda: ICLTrainingArguments(task="noisy_linear_regression", task_params='{"noise_stdd": 0.1}'),
        ["noise_stdd", "noise_std"],
    ),
    row(
        "args-task-params-json", lambda: ICLTrainingArguments(task_params="[1]"), ["task_params", "[1]", "JSON object"]
    ),
    row("args-task", lambda: ICLTrainingArguments(task="linear_regresion"), ["linear_regresion", "linear_regression"]),
    row(
        "args-model-overrides-typo",
        lambda: ICLTrainingArguments(model_overrides='{"n_layers": 1}'),
        ["n_layers", "did you mean 'n_layer'"],
    ),
    row(
        "args-model-overrides-n-points",
        lambda: ICLTrainingArguments(model_overrides='{"n_points": 3}'),
        ["model_overrides", "n_points", "--n_points"],
    ),
    row(
        "args-model-overrides-target-kind",
        lambda: ICLTrainingArguments(model_overrides='{"target_kind": "binary"}'),
        ["target_kind", "from the task"],
    ),
    row(
        "args-model-overrides-cab",
        lambda: ICLTrainingArguments(model_overrides='{"cab_sparsity": 2}'),
        ["cab_sparsity", "2", "[0, 1)"],
    ),
    row("args-model-type", lambda: ICLTrainingArguments(model_type="gpt3"), ["model_type", "gpt3", "gpt2_icl"]),
    row("args-model-size", lambda: ICLTrainingArguments(model_size="huge"), ["model_size", "huge", "tiny"]),
    row(
        "args-batch-size",
        lambda: ICLTrainingArguments(per_device_train_batch_size=0),
        ["per_device_train_batch_size", "got 0", "[1, +inf)"],
    ),
    row("args-learning-rate", lambda: ICLTrainingArguments(learning_rate=0.0), ["learning_rate", "0.0", "(0"]),
    row("args-mixed-precision", lambda: ICLTrainingArguments(bf16=True, fp16=True), ["bf16=True", "fp16=True"]),
    row("args-scheduler", lambda: ICLTrainingArguments(lr_scheduler_type="step"), ["lr_scheduler_type", "step"]),
]

DATA_ROWS = [
    row(
        "builder-family",
        lambda: ICLTasks(config_name="linear_regression", family="nope"),
        ["family", "nope", "linear_regression"],
    ),
    row(
        "builder-n-points",
        lambda: ICLTasks(config_name="linear_regression", n_points=0),
        ["n_points", "got 0", "[1, +inf)"],
    ),
    row(
        "builder-n-prompts",
        lambda: ICLTasks(config_name="linear_regression", n_prompts={"train": 0}),
        ["n_prompts['train']", "got 0", "[1, +inf)"],
    ),
    row(
        "builder-split",
        lambda: ICLTasks(config_name="linear_regression", n_prompts={"dev": 3}),
        ["n_prompts", "'dev'", "validation"],
    ),
    row(
        "builder-owned-param",
        lambda: ICLTasks(config_name="linear_regression", task_params={"n_dims": 3}),
        ["n_dims", "ICLTasksConfig itself"],
    ),
    row("builder-seed", lambda: ICLTasks(config_name="linear_regression", seed=-1), ["seed", "-1", "[0, +inf)"]),
    row(
        "builder-config-name",
        lambda: ICLTasks(config_name="linear_regresion"),
        ["linear_regresion", "linear_regression"],
    ),
    row("builder-unknown-field", lambda: ICLTasks(config_name="linear_regression", n_pointz=3), ["n_pointz"]),
    row(
        "niah-length",
        lambda: NeedleInAHaystackConfig(context_lengths=[0]),
        ["context_lengths[0]", "got 0", "[1, +inf)"],
    ),
    row(
        "niah-repeated-length",
        lambda: NeedleInAHaystackConfig(context_lengths=[64, 64]),
        ["context_lengths", "[64, 64]", "repeat"],
    ),
    row("niah-depth", lambda: NeedleInAHaystackConfig(depths=[1.5]), ["depths[0]", "1.5", "[0.0, 1.0]"]),
    row(
        "niah-samples", lambda: NeedleInAHaystackConfig(samples_per_cell=0), ["samples_per_cell", "got 0", "[1, +inf)"]
    ),
    row(
        "niah-template",
        lambda: NeedleInAHaystackConfig(needle_template="no key here"),
        ["needle_template", "no key here", "{passkey}"],
    ),
    row(
        "niah-haystack",
        lambda: NeedleInAHaystackConfig(haystack="/nonexistent/essays.txt"),
        ["haystack", "/nonexistent/essays.txt", "filler"],
    ),
    row(
        "niah-tokenizer",
        lambda: NeedleInAHaystackConfig(tokenizer=None),
        ["tokenizer", "None", "PreTrainedTokenizerBase"],
    ),
]


@cache
def sgpt_model():
    torch.manual_seed(0)
    return SGPTForInContextRegression(SGPTConfig(n_dims=3, n_points=5, n_embd=8, n_layer=1)).eval()


SGPT_ROWS = [
    # SGPT, the ψ feature maps and the document's MLPs (issue 12)
    row("sgpt-normalization", lambda: SGPTConfig(normalization="l2"), ["normalization", "l2", "softmax"]),
    row("sgpt-typo", lambda: SGPTConfig(normalisation="l1"), ["normalisation", "did you mean 'normalization'"]),
    row("sgpt-n-layer", lambda: SGPTConfig(n_layer=0), ["n_layer", "got 0", "[1, +inf)"]),
    row("sgpt-scale-flag", lambda: SGPTConfig(scale_attn_weights=1), ["scale_attn_weights", "True or False"]),
    row("sgpt-preset-clash", lambda: SGPTConfig.from_preset("tiny", n_embd=8), ["size='tiny'", "n_embd"]),
    row("sgpt-attn-impl", lambda: build_model("sgpt", "tiny", "sdpa"), ["attn_implementation", "'sdpa'", "sgpt"]),
    row("sgpt-too-long", lambda: sgpt_model()(torch.randn(1, 6, 3), torch.randn(1, 6)), ["6 points", "n_points=5"]),
    row("sgpt-nan", lambda: sgpt_model()(xs[:, :5], ys[:, :5].clone().fill_(float("nan"))), ["ys", "finite"]),
    row("sgpt-kwarg", lambda: sgpt_model()(xs[:, :5], ys[:, :5], loss_position=[1]), ["did you mean 'loss_positions'"]),
    row(
        "sgpt-per-prefix-interleaved",
        lambda: per_prefix_predictions(
            SGPTForInContextRegression(
                SGPTConfig(n_dims=3, n_points=5, n_embd=8, n_layer=1, prompt_format="interleaved")
            ),
            xs[:, :5],
            ys[:, :5],
        ),
        ["prompt_format='concatenated'", "'interleaved'"],
    ),
    row("psi-kernel-name", lambda: psi_kernel(torch.randn(2, 4, 3), "gaussian"), ["kernel", "gaussian", "hilbert"]),
    row("psi-bandwidth", lambda: psi_kernel(torch.randn(2, 4, 3), "hilbert", 0.5), ["bandwidth", "'hilbert'"]),
    row("psi-shape", lambda: psi_linear(torch.randn(4)), ["A must have shape", "(4,)"]),
    row("mlp-input", lambda: MLPICLConfig(mlp_input="tokens"), ["mlp_input", "tokens", "vectorized"]),
    row("mlp-one-layer-input", lambda: OneLayerFeatureMapConfig(mlp_input="both"), ["mlp_input", "both", "features"]),
    row("reproduce-experiment", lambda: reproduce("sgpt", "fig8"), ["experiment", "fig8", "fig1"]),
    row("reproduce-paper", lambda: reproduce("gpt", "fig1"), ["paper", "gpt", "sgpt"]),
]

API_ROWS = MODEL_ROWS + CONFIG_ROWS + CAB_ROWS + ESTIMATOR_ROWS + KERNEL_ROWS + TASK_ROWS + EVALUATION_ROWS
API_ROWS += TRAINING_ROWS + DATA_ROWS + SGPT_ROWS


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Paths the rows read: a file, an empty directory, YAML files, configs of an ICL model and a plain GPT-2."""
    from transformers import GPT2Config

    root = tmp_path_factory.mktemp("bad_inputs")
    (root / "a_file").write_text("not a directory\n")
    (root / "empty").mkdir()
    (root / "bad.yaml").write_text("n_dims: [1\n")
    (root / "list.yaml").write_text("- n_dims\n- 3\n")
    (root / "unknown.yaml").write_text("n_dimz: 3\n")
    (root / "binary.yaml").write_bytes(b"\xff\xfe\x00\x01")
    GPT2ICLConfig(n_dims=3, n_points=6, n_embd=16, n_layer=1, n_head=2).save_pretrained(root / "icl")
    GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32).save_pretrained(root / "gpt2")
    typo = root / "typo"
    GPT2ICLConfig(n_dims=3, n_points=6).save_pretrained(typo)
    saved = json.loads((typo / "config.json").read_text())
    (typo / "config.json").write_text(json.dumps({**saved, "n_layerz": 2}))
    return SimpleNamespace(root=root, typo_config=str(typo))


@pytest.mark.parametrize("call, error, words", API_ROWS)
def test_python_api_rejects(call, error, words, files):
    assert_rejects(lambda: call(files) if call.__code__.co_argcount else call(), error, words)


# -- the command line ----------------------------------------------------------------------------------------------


def cli(row_id: str, argv: str, words: list[str], *, usage: bool = False):
    """``argv`` with ``{tmp}`` for the files fixture's directory; ``usage``: argparse's own error (usage + one line)."""
    return pytest.param(argv, words, usage, id=f"cli-{row_id}")


CLI_ROWS = [
    # train: YAML configs, training arguments, paths
    cli(
        "train-flags-spelled-as-flags",
        "train --output_dir {tmp}/r --max_steps 3 --resume_from_checkpoint latest --overwrite_output_dir",
        ["--overwrite_output_dir with --resume_from_checkpoint latest"],
    ),
    cli("train-full-run-on-cpu", "train --output_dir {tmp}/full", ["--max_steps", "500,001", "--config", "GPU"]),
    cli("train-config-missing", "train --config {tmp}/missing.yaml", ["--config", "missing.yaml", "no such file"]),
    cli("train-config-directory", "train --config {tmp}/empty", ["--config", "must be a file", "empty"]),
    cli("train-config-syntax", "train --config {tmp}/bad.yaml", ["--config", "bad.yaml", "not valid YAML", "line 2"]),
    cli("train-config-not-mapping", "train --config {tmp}/list.yaml", ["list.yaml", "mapping", "got list"]),
    cli("train-config-unknown-key", "train --config {tmp}/unknown.yaml", ["n_dimz", "did you mean 'n_dims'"]),
    cli("train-config-binary", "train --config {tmp}/binary.yaml", ["--config", "binary.yaml"]),
    cli(
        "train-task-params-n-dims",
        "train --task_params '{\"n_dims\": 3}' --n_dims 4",
        ["task_params", "n_dims", "--n_dims"],
    ),
    cli("train-task-params-n-tasks", "train --task_params '{\"n_tasks\": 3}'", ["task_params", "n_tasks", "--n_tasks"]),
    cli(
        "train-model-overrides-typo",
        "train --model_overrides '{\"n_layers\": 1}'",
        ["n_layers", "did you mean 'n_layer'"],
    ),
    cli(
        "train-model-overrides-cab", "train --model_overrides '{\"cab_sparsty\": 0.5}'", ["cab_sparsty", "cab_sparsity"]
    ),
    cli("train-task", "train --task nope", ["task family", "nope", "linear_regression"]),
    cli("max-steps", "train --max_steps 0", ["max_steps", "got 0", "[1, +inf)"]),
    cli("train-output-dir-file", "train --output_dir {tmp}/a_file", ["--output_dir", "a_file", "must be a directory"]),
    cli("train-output-dir-below-file", "train --output_dir {tmp}/a_file/run", ["--output_dir", "a_file is a file"]),
    cli(
        "train-resume-missing",
        "train --resume_from_checkpoint {tmp}/nope --output_dir {tmp}/r",
        ["--resume_from_checkpoint", "does not exist", "'latest'"],
    ),
    cli("train-unknown-flag", "train --n_layers 3", ["--n_layers", "not used"]),
    cli("train-int-flag", "train --n_dims abc", ["--n_dims", "invalid int value", "abc"], usage=True),
    # evaluate: model paths, kinds, Hub, devices, options
    cli(
        "evaluate-model-missing", "evaluate --model {tmp}/nonexistent", ["--model", "nonexistent", "no such directory"]
    ),
    cli("evaluate-model-file", "evaluate --model {tmp}/a_file", ["--model", "a_file", "must be a directory"]),
    cli("evaluate-model-empty-dir", "evaluate --model {tmp}/empty", ["--model", "empty", "no config.json"]),
    cli(
        "evaluate-model-hub-offline",
        "evaluate --model someuser/somemodel",
        ["someuser/somemodel", "offline", "local path"],
    ),
    cli(
        "evaluate-model-plain-gpt2",
        "evaluate --model {tmp}/gpt2 --task linear_regression",
        ["'gpt2'", "GPT2Config", "hf_icl ICL model"],
    ),
    cli(
        "evaluate-device-cuda",
        "evaluate --model {tmp}/icl --task linear_regression --device cuda:7",
        ["--device", "cuda:7"],
    ),
    cli(
        "evaluate-device-name",
        "evaluate --model {tmp}/icl --task linear_regression --device banana",
        ["--device", "'banana'", "cpu, cuda"],
    ),
    cli(
        "evaluate-task-params-without-task",
        "evaluate --model {tmp}/icl --task-params '{\"noise_std\": 1}'",
        ["--task-params", "noise_std", "needs --task"],
    ),
    cli(
        "evaluate-task-params-n-dims",
        "evaluate --model {tmp}/icl --task linear_regression --task-params '{\"n_dims\": 2}'",
        ["--task-params", "n_dims", "config.n_dims"],
    ),
    cli("evaluate-no-task", "evaluate --model {tmp}/icl", ["--task is required", "training_args.json"]),
    cli(
        "evaluate-n-prompts",
        "evaluate --model {tmp}/icl --task linear_regression --n-prompts -5",
        ["--n-prompts", "-5", "[1, +inf)"],
    ),
    cli(
        "evaluate-seed", "evaluate --model {tmp}/icl --task linear_regression --seed -1", ["--seed", "-1", "[0, +inf)"]
    ),
    cli("evaluate-task", "evaluate --model {tmp}/icl --task nope", ["nope", "linear_regression"]),
    cli("evaluate-ood", "evaluate --model {tmp}/icl --task linear_regression --ood sideways", ["sideways", "scaled_x"]),
    cli(
        "evaluate-estimator",
        "evaluate --model {tmp}/icl --task linear_regression --estimators ridgeless",
        ["ridgeless", "least_squares"],
    ),
    cli(
        "evaluate-plot-below-file",
        "evaluate --model {tmp}/icl --task linear_regression --plot {tmp}/a_file/c.png",
        ["--plot", "a_file is a file"],
    ),
    cli("evaluate-model-required", "evaluate", ["--model", "required"], usage=True),
    # quickstart
    cli("quickstart-steps-zero", "quickstart --max-steps 0", ["--max-steps", "got 0", "[1, +inf)"]),
    cli("quickstart-steps-negative", "quickstart --max-steps -3", ["--max-steps", "-3", "[1, +inf)"]),
    cli("quickstart-n-prompts", "quickstart --n-prompts 0", ["--n-prompts", "got 0"]),
    cli(
        "quickstart-output-dir-file",
        "quickstart --output-dir {tmp}/a_file",
        ["--output-dir", "a_file", "must be a directory"],
    ),
    # compare
    cli("compare-n-prompts", "compare --n-prompts -5", ["--n-prompts", "-5", "[1, +inf)"]),
    cli("compare-n-points", "compare --n-points 0", ["--n-points", "got 0", "[1, +inf)"]),
    cli("compare-n-dims", "compare --n-dims 0", ["--n-dims", "got 0", "[1, +inf)"]),
    cli("compare-seed", "compare --seed -1", ["--seed", "-1", "[0, +inf)"]),
    cli(
        "compare-task-params-n-dims", "compare --task-params '{\"n_dims\": 3}'", ["--task-params", "n_dims", "--n-dims"]
    ),
    cli("compare-task-params-unknown", "compare --task-params '{\"noise\": 3}'", ["noise", "noise_std"]),
    cli("compare-estimators-repeated", "compare --estimators knn,knn", ["--estimators", "'knn' twice"]),
    cli("compare-estimators-empty", "compare --estimators knn,", ["--estimators", "'knn,'", "empty"]),
    cli("compare-estimator-unknown", "compare --estimators ridgeless", ["ridgeless", "least_squares"]),
    cli("compare-task-params-json", "compare --task-params '[1]'", ["--task-params", "JSON object", "[1]"], usage=True),
    cli("compare-task-params-syntax", "compare --task-params '{bad'", ["--task-params", "not valid JSON"], usage=True),
    cli("compare-task-choice", "compare --task nope", ["--task", "invalid choice", "nope"], usage=True),
    cli("compare-int", "compare --n-prompts many", ["--n-prompts", "invalid int value", "many"], usage=True),
    # reproduce / bench sgpt
    cli("reproduce-experiment", "reproduce sgpt fig9", ["experiment", "fig9", "fig7"]),
    cli("reproduce-steps", "reproduce sgpt fig1 --mlp-steps 0", ["--mlp-steps", "got 0", "[1, +inf)"]),
    cli("reproduce-paper", "reproduce kernel fig1", ["invalid choice", "'kernel'"], usage=True),
    # niah
    cli("niah-model-missing", "niah --model {tmp}/nonexistent", ["--model", "no such directory"]),
    cli("niah-model-file", "niah --model {tmp}/a_file", ["--model", "a_file", "must be a directory"]),
    cli("niah-model-hub-offline", "niah --model someuser/somemodel", ["someuser/somemodel", "offline"]),
    cli("niah-model-not-causal", "niah --model {tmp}/icl", ["'gpt2_icl'", "causal language model"]),
    cli("niah-device-cuda", "niah --model {tmp}/gpt2 --device cuda:7", ["--device", "cuda:7"]),
    cli("niah-samples", "niah --model {tmp}/gpt2 --samples -1", ["--samples", "-1", "[1, +inf)"]),
    cli("niah-block-size", "niah --model {tmp}/gpt2 --block-size 24", ["--block-size", "24", "power of two"]),
    cli(
        "niah-haystack",
        "niah --model {tmp}/gpt2 --haystack {tmp}/essays.txt",
        ["--haystack", "essays.txt", "no such file"],
    ),
    cli(
        "niah-output-dir-file",
        "niah --model {tmp}/gpt2 --output-dir {tmp}/a_file",
        ["--output-dir", "must be a directory"],
    ),
    cli("niah-policy", "niah --model {tmp}/gpt2 --policies frc,nope", ["policies[1]", "nope", "hybrid"]),
    cli("niah-sparsity", "niah --model {tmp}/gpt2 --sparsities 1.0", ["sparsities[0]", "1.0", "[0, 1)"]),
    cli("niah-lam", "niah --model {tmp}/gpt2 --lam -1", ["cab_lambda", "-1"]),
    cli("niah-budget", "niah --model {tmp}/gpt2 --budget all", ["--budget", "invalid choice", "all"], usage=True),
    # dataset
    cli("dataset-family", "dataset --family nope", ["family", "nope", "linear_regression"]),
    cli("dataset-n-dims", "dataset --n-dims -1", ["--n-dims", "-1", "[1, +inf)"]),
    cli("dataset-n-train", "dataset --n-train -1", ["--n-train", "-1", "[0, +inf)"]),
    cli("dataset-no-split", "dataset --n-train 0 --n-validation 0 --n-test 0", ["--n-train", "--n-test", "all 0"]),
    cli("dataset-save-to-file", "dataset --save-to-disk {tmp}/a_file", ["--save-to-disk", "must be a directory"]),
    cli("dataset-push-offline", "dataset --push-to-hub someone/data", ["--push-to-hub", "offline", "--save-to-disk"]),
    cli("dataset-config", "dataset --config linear_regresion", ["linear_regresion", "linear_regression"]),
    # anything else
    cli("unknown-command", "frobnicate", ["invalid choice", "frobnicate"], usage=True),
]


@pytest.fixture
def no_heavy_work(monkeypatch):
    """Training, model loading, evaluation and dataset generation fail the test if a CLI row reaches them."""
    import transformers

    import hf_icl.quickstart
    import hf_icl.training

    def forbidden(*args, **kwargs):
        raise AssertionError("heavy work started before the arguments were validated")

    monkeypatch.setattr(hf_icl.training, "train", forbidden)
    monkeypatch.setattr(hf_icl.quickstart, "run_quickstart", forbidden)
    monkeypatch.setattr(hf_icl.evaluation, "evaluate_context_scaling", forbidden)
    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", forbidden)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", forbidden)
    monkeypatch.setattr(ICLTasks, "download_and_prepare", forbidden)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # never the network


@pytest.mark.parametrize("argv, words, usage", CLI_ROWS)
def test_cli_rejects(argv, words, usage, files, no_heavy_work, capsys):
    args = [arg.replace("{tmp}", str(files.root)) for arg in shlex.split(argv)]
    try:
        code = main(args)
    except SystemExit as exit:  # argparse's own usage errors
        code = exit.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    lines = err.splitlines()
    command = args[0] if args[0] in {"train", "evaluate", "quickstart", "compare", "niah", "dataset"} else ""
    assert lines[-1].startswith(f"hf-icl {command}".rstrip()) and ": error: " in lines[-1], err
    assert len(lines) == 1 or (usage and lines[0].startswith("usage:")), err
    missing = [word for word in words if word not in lines[-1]]
    assert not missing, f"{missing} not in: {lines[-1]}"


def test_at_least_120_rows():
    assert len(API_ROWS) + len(CLI_ROWS) >= 120


# -- the good paths beside the changed behaviour ----------------------------------------------------------------------


def test_integral_float_class_ids_are_read_as_ids():
    ids = labels("categorical")
    net = model("categorical")
    with torch.no_grad():
        as_long, as_float = net(xs, ids), net(xs, ids.float())
    torch.testing.assert_close(as_float.logits, as_long.logits)
    torch.testing.assert_close(as_float.loss, as_long.loss)


def test_binary_labels_and_check_inputs_false():
    net = model("binary")
    with torch.no_grad():
        assert torch.isfinite(net(xs, labels("binary")).loss)
        # without the value check a bad label goes through (what the trainer's own prompts skip)
        zero = with_entry(labels("binary"), (0, 3), 0.0)
        assert torch.isfinite(net(xs, zero, check_inputs=False).loss)


def test_shape_checks_read_no_values_and_the_value_check_does():
    """Meta tensors hold no data: the shape checks pass on them, the value check (a device sync) cannot."""
    meta_xs, meta_ys = torch.empty(2, 5, 3, device="meta"), torch.empty(2, 5, device="meta")
    check_prompt(meta_xs, meta_ys, 3, 5, check_values=False)
    with pytest.raises(NotImplementedError):
        check_prompt(meta_xs, meta_ys, 3, 5)


def test_check_inputs_false_still_checks_shapes():
    with pytest.raises(ValueError, match="n_points >= 1"):
        model()(xs[:, :0], ys[:, :0], check_inputs=False)


def test_cab_config_round_trips(tmp_path):
    from transformers import AutoConfig, AutoModel

    net = GPT2ForInContextRegression(GPT2ICLConfig.from_preset("tiny", n_dims=3, n_points=5))
    hf_icl.enable_cab(net, sparsity=0.5, block_size=16, policy="frc", lam=0.25)
    net.save_pretrained(tmp_path / "cab")
    for config in (
        GPT2ICLConfig.from_pretrained(tmp_path / "cab"),
        AutoConfig.from_pretrained(tmp_path / "cab"),
        GPT2ICLConfig.from_dict(net.config.to_dict()),
        GPT2ICLConfig(**net.config.to_dict()),
    ):
        assert CABParams.from_config(config) == CABParams.from_config(net.config)
        assert (config.n_dims, config.n_layer) == (3, 3)
    reloaded = AutoModel.from_pretrained(tmp_path / "cab", dtype=torch.bfloat16)
    assert reloaded.config.cab_policy == "frc" and reloaded.dtype == torch.bfloat16
    reloaded.save_pretrained(tmp_path / "bf16")
    again = AutoModel.from_pretrained(tmp_path / "bf16")
    assert again.config.cab_sparsity == 0.5 and again.dtype == torch.bfloat16
    eager = GPT2ForInContextRegression.from_pretrained(tmp_path / "cab", attn_implementation="eager")
    with torch.no_grad():
        torch.testing.assert_close(eager(xs, ys).predictions, net.eval()(xs, ys).predictions)


def test_config_aliases_and_transformers_keys_are_accepted():
    config = GPT2ICLConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, n_points=7)
    assert (config.n_embd, config.n_head, config.n_layer, config.n_positions) == (32, 4, 1, 14)
    GPT2ICLConfig(torch_dtype="float32", name_or_path="x", max_length=20, num_labels=2, output_attentions=True)


def test_valid_xgboost_parameters_still_fit():
    small_xs, small_ys = prompt(batch=1, n_points=4)
    estimator = get_estimator("xgboost", n_estimators=3, max_depth=2, learning_rate=0.3, subsample=1.0)
    assert estimator(small_xs, small_ys).shape == (1, 4)


def test_kernels_accept_numpy_scaling():
    q, k, v = qkv()
    out = block_sparse_flash_attention(q, k, v, keep(), block_size=16, scaling=np.float32(0.2), backend="torch")
    torch.testing.assert_close(out, block_sparse_flash_attention(q, k, v, keep(), block_size=16, scaling=0.2))


def test_evaluate_runs_the_model_on_device(tmp_path, capsys):
    net = GPT2ForInContextRegression(GPT2ICLConfig(n_dims=3, n_points=5, n_embd=16, n_layer=1, n_head=2))
    net.save_pretrained(tmp_path / "m")
    argv = ["evaluate", "--model", str(tmp_path / "m"), "--task", "linear_regression", "--device", "cpu"]
    assert main([*argv, "--n-prompts", "8", "--estimators", "least_squares"]) == 0
    assert "gpt2_icl" in capsys.readouterr().out
