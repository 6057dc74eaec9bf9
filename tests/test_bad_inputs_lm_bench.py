"""Bad inputs of the causal language models, the benchmarks' flags, devices and absurd sizes, table-driven as in
``test_bad_inputs.py``: each row is a call, the error it must raise and words its message must hold (the argument,
the value received, what is allowed). CLI rows run ``hf_icl.cli.main`` and must exit with status 2 and ONE line
``hf-icl <command>...: error: ...`` on stderr. Every row failed on the code before these checks (a raw torch error,
a usage block, or a message naming no flag); the good paths beside the changed behaviour are tested at the end.
"""

from __future__ import annotations

import resource
import shlex
from functools import cache

import pytest
import torch
from bad_input_rows import assert_rejects, row

from hf_icl.cli import main
from hf_icl.data.tasks import get_task
from hf_icl.estimators import get_estimator
from hf_icl.evaluation import ICLSquaredError
from hf_icl.evaluation.predictors import score_predictor
from hf_icl.modeling.gd_transformer import GDLanguageModelConfig, GDTransformerForCausalLM
from hf_icl.modeling.linear_gpt import LinearGPTConfig, LinearGPTForCausalLM

VOCAB, CONTEXT = 20, 16
HUGE = 10**12


@cache
def linear_lm() -> LinearGPTForCausalLM:
    torch.manual_seed(0)
    config = LinearGPTConfig(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=CONTEXT)
    return LinearGPTForCausalLM(config).eval()


@cache
def gd_lm() -> GDTransformerForCausalLM:
    torch.manual_seed(0)
    config = GDLanguageModelConfig(vocab_size=VOCAB, n_positions=CONTEXT, embed_dim=8, n_heads=2, n_blocks=2)
    return GDTransformerForCausalLM(config).eval()


def ids(batch: int = 2, length: int = 10) -> torch.Tensor:
    return torch.randint(VOCAB, (batch, length), generator=torch.Generator().manual_seed(0))


def generate(model, prompt: torch.Tensor, new: int, **kwargs) -> torch.Tensor:
    kwargs.setdefault("attention_mask", torch.ones_like(prompt))  # else generate reads token 0 as padding
    return model.generate(prompt, max_new_tokens=new, do_sample=False, pad_token_id=0, **kwargs)


# -- the causal language models ------------------------------------------------------------------------------------

LM_ROWS = [
    row("linear-ids-past-vocab", lambda: linear_lm()(torch.full((2, 5), VOCAB)), ["input_ids", "vocab_size=20", "20"]),
    row("linear-ids-negative", lambda: linear_lm()(torch.full((2, 5), -1)), ["input_ids", "[0, vocab_size=20)", "-1"]),
    row("linear-ids-float", lambda: linear_lm()(ids().float()), ["input_ids", "token ids", "float32"]),
    row("linear-ids-1d", lambda: linear_lm()(ids()[0]), ["input_ids", "(batch, tokens)", "(10,)"]),
    row("linear-ids-list", lambda: linear_lm()([[1, 2, 3]]), ["input_ids", "list"]),
    row(
        "linear-labels-past-vocab",
        lambda: linear_lm()(ids(), labels=torch.full((2, 10), VOCAB)),
        ["labels", "[0, vocab_size=20)", "-100", "got 20"],
    ),
    row(
        "linear-labels-negative",
        lambda: linear_lm()(ids(), labels=torch.full((2, 10), -3)),
        ["labels", "-100 (ignored)", "got -3"],
    ),
    row("linear-labels-float", lambda: linear_lm()(ids(), labels=ids().float()), ["labels", "integer", "float32"]),
    row(
        "linear-labels-with-embeds",
        lambda: linear_lm()(inputs_embeds=torch.randn(2, 10, 16), labels=torch.full((2, 10), 99)),
        ["labels", "vocab_size=20", "99"],
    ),
    row("gd-labels-past-vocab", lambda: gd_lm()(ids(), labels=torch.full((2, 10), VOCAB)), ["labels", "got 20"]),
    row("gd-labels-negative", lambda: gd_lm()(ids(), labels=torch.full((2, 10), -5)), ["labels", "-100", "got -5"]),
    row(
        "linear-generate-past-n-positions",
        lambda: generate(linear_lm(), ids(), 8),
        ["max_new_tokens=8", "10 tokens", "n_positions=16", "max_new_tokens <= 7"],
    ),
    row(
        "linear-position-ids-past-n-positions",
        lambda: linear_lm()(ids(), position_ids=torch.full((2, 10), 30)),
        ["position_ids", "30", "n_positions=16"],
    ),
    row(
        "linear-position-ids-negative",
        lambda: linear_lm()(ids(), position_ids=torch.full((2, 10), -1)),
        ["position_ids", "[0, n_positions=16)", "-1"],
    ),
    row(
        "linear-generate-mask-wrong-length",
        lambda: generate(linear_lm(), ids(), 2, attention_mask=torch.ones(2, 7)),
        ["attention_mask", "(2, 10)", "(2, 7)"],
    ),
    row(
        "linear-generate-mask-1d",
        lambda: generate(linear_lm(), ids(), 2, attention_mask=torch.ones(10)),
        ["attention_mask", "2-D", "(10,)"],
    ),
    row(
        "gd-generate-mask-1d",
        lambda: generate(gd_lm(), ids(), 2, attention_mask=torch.ones(10)),
        ["attention_mask", "2-D", "(10,)"],
    ),
    row(
        "linear-generate-ids-past-vocab",
        lambda: generate(linear_lm(), torch.full((2, 3), 25), 2),
        ["input_ids", "vocab_size=20", "25"],
    ),
    # devices: a public entry taking device= on a machine without that device
    row(
        "score-predictor-device",
        lambda: score_predictor(
            get_estimator("least_squares"),
            torch.randn(2, 5, 3),
            torch.randn(2, 5),
            ICLSquaredError(),
            name="ls",
            device="cuda:7",
        ),
        ["device", "cuda:7"],
    ),
]


@pytest.mark.parametrize("call, error, words", LM_ROWS)
def test_python_api_rejects(call, error, words):
    assert_rejects(call, error, words)


# -- the command line: every benchmark's numeric flags, devices, absurd sizes -------------------------------------


def cli(row_id: str, argv: str, words: list[str]):
    return pytest.param(argv, words, id=f"cli-{row_id}")


# the smallest valid run of each benchmark, so that a row's one bad flag is the only problem
SAMPLERS = "bench samplers --batch-size 2 --n-points 3 --n-dims 5 --repeats 1"
ESTIMATORS = "bench estimators --batch 2 --n-points 3 --n-dims 2 --repeats 1 --warmup 0 --budget 0.01"
SGPT = "bench sgpt --n-embd 8 --n-layer 1 --n-head 2 --n-dims 2 --n-points 3 --batch 2 --repeats 1 --warmup 0"
LINEAR = "bench linear-attention --lengths 16 --growth-lengths 16,32 --decode-lengths 4 --repeats 1 --warmup 0"
CAB = "bench cab --device cpu --smoke --no-pairs --no-flex"

BENCH_ROWS = [
    # samplers
    cli("samplers-n-dims", f"{SAMPLERS} --n-dims -3", ["--n-dims", "-3", "[1, +inf)"]),
    cli("samplers-batch-size", f"{SAMPLERS} --batch-size 0", ["--batch-size", "got 0", "[1, +inf)"]),
    cli("samplers-n-points", f"{SAMPLERS} --n-points 0", ["--n-points", "got 0", "[1, +inf)"]),
    cli("samplers-repeats", f"{SAMPLERS} --repeats 0", ["--repeats", "got 0", "[1, +inf)"]),
    cli("samplers-threads", f"{SAMPLERS} --threads -2", ["--threads", "-2", "[1, +inf)"]),
    cli("samplers-device-cuda", f"{SAMPLERS} --device cuda:7", ["--device", "cuda:7"]),
    cli("samplers-device-name", f"{SAMPLERS} --device tpu", ["--device", "'tpu'", "cpu"]),
    cli("samplers-huge", f"{SAMPLERS} --batch-size {HUGE}", ["--batch-size", str(HUGE), "needs at least", "TB"]),
    # estimators
    cli("estimators-n-dims", f"{ESTIMATORS} --n-dims -3", ["--n-dims", "-3", "[1, +inf)"]),
    cli("estimators-batch", f"{ESTIMATORS} --batch 0", ["--batch", "got 0", "[1, +inf)"]),
    cli("estimators-n-points", f"{ESTIMATORS} --n-points 0", ["--n-points", "got 0", "[1, +inf)"]),
    cli("estimators-repeats", f"{ESTIMATORS} --repeats 0", ["--repeats", "got 0", "[1, +inf)"]),
    cli("estimators-warmup", f"{ESTIMATORS} --warmup -1", ["--warmup", "-1", "[0, +inf)"]),
    cli("estimators-threads", f"{ESTIMATORS} --threads 0", ["--threads", "got 0", "[1, +inf)"]),
    cli("estimators-all-batch", f"{ESTIMATORS} --all --all-batch 0", ["--all-batch", "got 0", "[1, +inf)"]),
    cli("estimators-all-repeats", f"{ESTIMATORS} --all --all-repeats 0", ["--all-repeats", "got 0", "[1, +inf)"]),
    cli("estimators-device-cuda", f"{ESTIMATORS} --device cuda:7", ["--device", "cuda:7"]),
    cli("estimators-huge", f"{ESTIMATORS} --batch {HUGE}", ["--batch", str(HUGE), "needs at least", "TB"]),
    # sgpt (its checks existed, as a usage block; now one line)
    cli("sgpt-n-dims", f"{SGPT} --n-dims -3", ["--n-dims", "-3", "positive"]),
    cli("sgpt-n-embd", f"{SGPT} --n-embd 0", ["--n-embd", "got 0"]),
    cli("sgpt-batch", f"{SGPT} --batch 0", ["--batch", "got 0"]),
    cli("sgpt-warmup", f"{SGPT} --warmup -1", ["--warmup", "-1", ">= 0"]),
    cli("sgpt-threads", f"{SGPT} --threads 0", ["--threads", "got 0"]),
    cli(
        "sgpt-device-cuda",
        f"{SGPT} --device cuda" if not torch.cuda.is_available() else f"{SGPT} --device tpu",
        ["--device"],
    ),
    cli("sgpt-huge", f"{SGPT} --batch {HUGE}", ["--batch", str(HUGE), "needs at least"]),
    # linear-attention
    cli("linear-attention-warmup", f"{LINEAR} --warmup -1", ["--warmup", "-1", ">= 0"]),
    cli("linear-attention-repeats", f"{LINEAR} --repeats 0", ["--repeats", "got 0"]),
    cli("linear-attention-decode-layers", f"{LINEAR} --decode-layers 0", ["--decode-layers", "got 0"]),
    cli("linear-attention-decode-vocab", f"{LINEAR} --decode-vocab -4", ["--decode-vocab", "-4"]),
    cli("linear-attention-budget", f"{LINEAR} --memory-budget-gb 0", ["--memory-budget-gb", "> 0"]),
    cli("linear-attention-lengths", f"{LINEAR} --lengths 0,16", ["--lengths", "positive integers", "0,16"]),
    cli(
        "linear-attention-huge-decode",
        f"{LINEAR} --decode-lengths {HUGE}",
        ["--decode-lengths", str(HUGE), "needs at least"],
    ),
    cli(
        "linear-attention-huge-vocab",
        f"{LINEAR} --decode-vocab {HUGE}",
        ["--decode-vocab", str(HUGE), "needs at least"],
    ),
    # cab
    cli("cab-block-size", f"{CAB} --block-size 0", ["--block-size", "got 0", "[16, 128]"]),
    cli("cab-block-size-power", f"{CAB} --block-size 48", ["--block-size", "48", "power of two"]),
    cli("cab-lengths", f"{CAB} --lengths 0", ["--lengths", "got 0", "[1, +inf)"]),
    cli("cab-model-lengths", f"{CAB} --model-lengths -5", ["--model-lengths", "-5", "[1, +inf)"]),
    cli("cab-cache-lengths", f"{CAB} --cache-lengths 0", ["--cache-lengths", "got 0", "[1, +inf)"]),
    cli("cab-model-layers", f"{CAB} --model-layers 0", ["--model-layers", "got 0", "[1, +inf)"]),
    cli("cab-repeats", f"{CAB} --repeats 0", ["--repeats", "got 0", "[1, +inf)"]),
    cli("cab-warmup", f"{CAB} --warmup -1", ["--warmup", "-1", "[0, +inf)"]),
    cli("cab-sparsities", f"{CAB} --sparsities -0.1", ["--sparsities", "-0.1", "[0, 1)"]),
    cli("cab-model-sparsity", f"{CAB} --model-sparsity 1.5", ["--model-sparsity", "1.5", "[0, 1)"]),
    cli("cab-shapes", f"{CAB} --shapes 0,2,32", ["--shapes", "0,2,32", "positive integers"]),
    cli("cab-shapes-text", f"{CAB} --shapes 1,a,32", ["--shapes", "1,a,32", "B,H,D"]),
    cli("cab-huge", f"{CAB} --lengths {HUGE}", ["--lengths", str(HUGE), "needs at least"]),
    # startup
    cli("startup-repeats", "bench startup --repeats 0", ["--repeats", "got 0", "[1, +inf)"]),
]

SIZE_ROWS = [  # past every up-front estimate: torch's allocation failure, caught at the CLI boundary
    cli(
        "evaluate-huge-n-prompts",
        f"evaluate --model {{tmp}}/icl --task linear_regression --n-prompts {HUGE} --output-dir {{tmp}}/out",
        ["out of memory", "TB", f"--n-prompts {HUGE}"],
    ),
    cli("compare-huge-n-prompts", f"compare --n-prompts {HUGE}", ["out of memory", "TB", f"--n-prompts {HUGE}"]),
]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    from hf_icl import GPT2ForInContextRegression, GPT2ICLConfig

    root = tmp_path_factory.mktemp("lm_bench")
    torch.manual_seed(0)
    model = GPT2ForInContextRegression(GPT2ICLConfig(n_dims=3, n_points=6, n_embd=16, n_layer=1, n_head=2))
    model.save_pretrained(root / "icl")
    return root


@pytest.fixture
def memory_cap():
    """The process's address space capped 8 GB above its current size while the row runs: an absurd allocation
    fails at once instead of swapping, whatever the machine's overcommit policy."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as handle:
        current = int(handle.read().split()[0]) * resource.getpagesize()
    cap = current + 8 * 10**9
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    yield
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def run_cli(argv: str, root, capsys) -> tuple[int, list[str]]:
    args = [arg.replace("{tmp}", str(root)) for arg in shlex.split(argv)]
    try:
        code = main(args)
    except SystemExit as exit:  # a benchmark's parser exits itself
        code = exit.code
    return code, capsys.readouterr().err.strip().splitlines()


def assert_one_line_error(code, lines, command: str, words: list[str]) -> None:
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"hf-icl {command}") and ": error: " in lines[0], lines
    missing = [word for word in words if word not in lines[0]]
    assert not missing, f"{missing} not in: {lines[0]}"


@pytest.mark.parametrize("argv, words", BENCH_ROWS)
def test_bench_rejects(argv, words, monkeypatch, capsys, memory_cap, tmp_path):
    import hf_icl.benchmarks.timing as timing

    def forbidden(*args, **kwargs):
        raise AssertionError("a benchmark started timing before its flags were checked")

    timed = (
        "samplers",
        "estimators",
        "sgpt",
        "linear_attention",
        "cab_kernel_sections",
        "cab_model_sections",
        "cab_pairs",
    )
    for module in timed:
        monkeypatch.setattr(f"hf_icl.benchmarks.{module}.median_seconds", forbidden, raising=False)
    monkeypatch.setattr(timing, "median_seconds", forbidden)
    monkeypatch.setattr("hf_icl.benchmarks.startup.measure", forbidden)
    code, lines = run_cli(argv, tmp_path, capsys)
    assert_one_line_error(code, lines, "bench", words)


@pytest.mark.parametrize("argv, words", SIZE_ROWS)
def test_absurd_sizes_are_one_line(argv, words, model_folder, capsys, memory_cap):
    code, lines = run_cli(argv, model_folder, capsys)
    assert_one_line_error(code, [line for line in lines if "Loading weights" not in line], argv.split()[0], words)


# -- the good paths beside the changed behaviour -------------------------------------------------------------------


@pytest.mark.parametrize("model", [linear_lm, gd_lm], ids=["linear", "gd"])
def test_generate_reaches_exactly_the_longest_context(model):
    prompt = ids(2, 10)
    out = generate(model(), prompt, CONTEXT + 1 - 10)  # feeds the model exactly n_positions tokens
    assert out.shape == (2, CONTEXT + 1)
    torch.testing.assert_close(out[:, :10], prompt)
    # greedy decoding is the argmax of a plain forward over the generated sequence (an independent path)
    with torch.no_grad():
        logits = model()(out[:, :-1]).logits
    torch.testing.assert_close(out[:, 10:], logits[:, 9:].argmax(-1))


@pytest.mark.parametrize("model", [linear_lm, gd_lm], ids=["linear", "gd"])
def test_left_padded_generate_counts_real_tokens_only(model):
    prompt = ids(2, 10)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :3] = 0  # row 1 holds 7 real tokens: the longest row decides how many new tokens fit
    assert generate(model(), prompt, CONTEXT + 1 - 10, attention_mask=mask).shape == (2, CONTEXT + 1)
    with pytest.raises(ValueError, match="max_new_tokens <= 7"):
        generate(model(), prompt, CONTEXT + 2 - 10, attention_mask=mask)


def test_ignored_labels_and_valid_ids_give_the_reference_loss():
    prompt = ids(2, 10)
    labels = prompt.clone()
    labels[:, :4] = -100
    with torch.no_grad():
        out = linear_lm()(prompt, labels=labels)
    reference = torch.nn.functional.cross_entropy(
        out.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100
    )
    torch.testing.assert_close(out.loss, reference)


@pytest.mark.parametrize("model", [linear_lm, gd_lm], ids=["linear", "gd"])
def test_length_and_mask_checks_still_hold(model):
    with pytest.raises(ValueError, match=f"reach {CONTEXT + 1} tokens but the model has n_positions={CONTEXT}"):
        model()(ids(1, CONTEXT + 1))
    model()(ids(1, CONTEXT))  # the longest context fits
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(2, 10\)"):
        model()(ids(), attention_mask=torch.ones(2, 7))


def test_valid_bench_flags_still_run(capsys):
    report = main(["bench", *shlex.split(SAMPLERS)[1:]])
    assert report == 0
    out = capsys.readouterr().out
    assert f"| {get_task('linear_regression', n_dims=5).name} | 5 |" in out
