"""Causal linear attention against softmax SDPA: speed and memory of one layer, decode, growth with length.

    hf-icl bench linear-attention --device cuda --lengths 1024,4096,16384,65536     # an H100: every method
    hf-icl bench linear-attention --lengths 1024,4096,16384 --repeats 2             # CPU, torch methods only
    TRITON_INTERPRET=1 hf-icl bench linear-attention --lengths 64 --decode-lengths 8,32 --decode-layers 1 \\
        --decode-vocab 64 --repeats 1                                                # a smoke run

Sections:

1. **Forward + backward of one attention layer** (``--shape default``: B = 2, H = 16, D = 64; ``gpt2-small``:
   B = 1, H = 12, D = 64) at every ``--lengths`` T, one row per method:

   * ``sdpa``: ``F.scaled_dot_product_attention(is_causal=True)``, softmax attention: the baseline;
   * ``parallel``: ``causal_linear_attention(mode="parallel")``, the O(T²) masked quadratic form;
   * ``chunked-torch``: ``mode="chunked", backend="torch"``;
   * ``chunked-triton``: ``backend="triton"`` (CUDA; on CPU only under ``TRITON_INTERPRET=1`` at smoke sizes);
   * ``chunked-fla``: ``backend="fla"`` (flash-linear-attention, CUDA only);
   * ``recurrent``: ``mode="recurrent"``, one Python step per token (up to ``--recurrent-max-length``).

   Linear attention uses the library defaults (``squared_relu`` features, normalised) at ``--chunk-size``.
   Reported: the median fwd+bwd time, its ratio to SDPA's at the same T (measured in the same run, methods
   timed round-robin so a load change on a shared machine hits all alike), and the peak memory allocated during
   one fwd+bwd above what the inputs hold: ``torch.cuda.max_memory_allocated`` on CUDA, and on CPU the peak of
   the allocation and free events the PyTorch profiler records from the CPU allocator (tensors and ATen
   workspaces on the calling thread; not the Triton interpreter's numpy arrays, so "n/a" there). A method whose
   estimated memory (inputs + the estimate in the table) exceeds ``--memory-budget-gb`` is not run: "does not fit".
2. **Decode**: time per generated token vs prompt length (``--decode-lengths``): ``linear_attention_step`` of one
   layer on a state prefilled by ``linear_attention_state``, and one token of a ``LinearGPTForCausalLM``
   (width H·D, ``--decode-layers`` layers, random weights) on a prefilled ``LinearAttentionCache``, which is
   restored after each step so every repetition sees the same prompt length.
3. **Targets**, computed from the numbers above (reported, never asserted): decode time/token at the longest
   prompt ≤ 1.2× that at the shortest (10,000 vs 100 by default); chunked growth time(T₂)/time(T₁) ≤ 1.25·T₂/T₁
   for ``--growth-lengths`` T₁,T₂ (1024,16384 by default: ≤ 20, with 16 the linear ideal).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from hf_icl.kernels.linear_attention import causal_linear_attention, linear_attention_state, linear_attention_step
from hf_icl.kernels.linear_attention_triton import CHUNK_SIZES

# this module: the command line and the measurements; the targets and markdown tables: linear_attention_report
from .flags import BenchParser, bench_memory
from .linear_attention_report import (  # noqa: F401 - the report's names, importable from here as before
    DECODE_TARGET,
    GROWTH_SLACK,
    INTERPRETED_NOTE,
    MIB,
    decode_table,
    decode_target,
    growth_target,
    header_lines,
    layer_table,
    ratio_or_none,
    targets_lines,
)
from .memory import out_of_memory, peak_bytes
from .report import environment, load_average, load_text, write_json
from .timing import emit_markdown, round_robin_medians

BASELINE = "sdpa"
METHODS = ("sdpa", "parallel", "chunked-torch", "chunked-triton", "chunked-fla", "recurrent")
CHUNKED = ("chunked-torch", "chunked-triton", "chunked-fla")
#: (B, H, D) of ``--shape``
SHAPES = {"default": (2, 16, 64), "gpt2-small": (1, 12, 64)}
GPU_LENGTHS = (1024, 4096, 16384, 65536)
CPU_LENGTHS = (1024, 4096)
DECODE_LENGTHS = (100, 1000, 10000)
GROWTH_LENGTHS = (1024, 16384)
#: the Triton interpreter runs a kernel program by program in Python: only B·H·T up to this is attempted on CPU
INTERPRET_MAX_TOKEN_HEADS = 4096
GPT2_VOCAB = 50257
GIB = 2**30


# ----------------------------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = BenchParser(prog="hf-icl bench linear-attention", description=__doc__)
    cuda = torch.cuda.is_available()
    parser.add_argument("--device", default="cuda" if cuda else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--lengths", type=_int_list, default=None, help="T values, e.g. 1024,4096 (default: by device)")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"], help="CUDA: bfloat16")
    parser.add_argument("--repeats", type=int, default=5, help="timed round-robin rounds; medians are reported")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each method (the last measures memory)")
    parser.add_argument("--shape", default="default", choices=sorted(SHAPES), help="default: B=2,H=16,D=64")
    parser.add_argument("--memory-budget-gb", type=float, default=None, help="default: 80%% of the GPU, 50%% of RAM")
    parser.add_argument("--chunk-size", type=int, default=64, choices=CHUNK_SIZES, help="tokens per chunk")
    parser.add_argument("--recurrent-max-length", type=int, default=1024, help="longest T the recurrent mode runs")
    parser.add_argument("--growth-lengths", type=_int_list, default=list(GROWTH_LENGTHS), help="T1,T2 of the target")
    parser.add_argument("--decode-lengths", type=_int_list, default=list(DECODE_LENGTHS), help="prompt lengths")
    parser.add_argument("--decode-layers", type=int, default=None, help="decode model depth (CUDA: 12, CPU: 2)")
    parser.add_argument("--decode-vocab", type=int, default=GPT2_VOCAB, help="decode model vocabulary (GPT-2's)")
    parser.add_argument("--decode-repeats", type=int, default=30, help="timed decode rounds")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="append the markdown report to this file")
    parser.add_argument("--json", default=None, help="write the measurements as JSON to this file")
    args = parser.parse_args(argv)
    _check_args(parser, args)
    return _fill_defaults(parser, args)


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("repeats", "recurrent_max_length", "decode_layers", "decode_vocab", "decode_repeats", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if args.warmup < 0:
        parser.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.memory_budget_gb is not None and not args.memory_budget_gb > 0:
        parser.error(f"--memory-budget-gb must be > 0, got {args.memory_budget_gb}")
    if len(args.growth_lengths) != 2 or args.growth_lengths[0] >= args.growth_lengths[1]:
        parser.error(f"--growth-lengths takes two increasing lengths T1,T2, got {args.growth_lengths}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available on this machine; use --device cpu")


def _fill_defaults(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    cuda = args.device == "cuda"
    args.lengths = args.lengths or list(GPU_LENGTHS if cuda else CPU_LENGTHS)
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    args.decode_layers = args.decode_layers or (12 if cuda else 2)
    if args.memory_budget_gb is None:
        args.memory_budget_gb = _default_budget_bytes(args.device) / GIB
    args.torch_device, args.dtype_t = torch.device(args.device), getattr(torch, args.dtype)
    batch, heads, dim = SHAPES[args.shape]
    width, size = heads * dim, args.dtype_t.itemsize
    bench_memory(  # the decode model's token and position tables, and its prefilled hidden states
        parser,
        f"--decode-vocab {args.decode_vocab} --decode-lengths {max(args.decode_lengths)}",
        size * width * (args.decode_vocab + max(args.decode_lengths) + 1 + batch * max(args.decode_lengths)),
        args.torch_device,
        "the decode model's weights and prefill",
    )
    return args


def _default_budget_bytes(device: str) -> float:
    if device == "cuda":
        return 0.8 * torch.cuda.get_device_properties(0).total_memory
    try:
        return 0.5 * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # no sysconf (not POSIX): a conservative 8 GiB
        return 8.0 * GIB


# ----------------------------------------------------------------------------------------------------------------
# Methods, their availability and their memory estimates
# ----------------------------------------------------------------------------------------------------------------


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def method_forward(method: str, chunk_size: int) -> Callable:
    """The forward of ``method``: ``(q, k, v) → out``."""
    if method == BASELINE:
        return sdpa
    if method in CHUNKED:
        backend = method.removeprefix("chunked-")
        return partial(causal_linear_attention, mode="chunked", backend=backend, chunk_size=chunk_size)
    return partial(causal_linear_attention, mode=method, backend="torch")


def forward_backward(forward: Callable, q, k, v, grad) -> None:
    """One training-style pass: the forward, then the gradients of q, k and v (freed on return)."""
    out = forward(q, k, v)
    torch.autograd.grad(out, (q, k, v), grad)


def _triton_interpreted() -> bool | None:
    """None without triton, else whether the linear-attention kernel runs in Triton's CPU interpreter."""
    from hf_icl.kernels import linear_attention_triton
    from hf_icl.kernels._common import is_interpreted

    kernel = linear_attention_triton._chunked_linear_attention_kernel
    return None if kernel is None else is_interpreted(kernel)


def unavailable(method: str, args: argparse.Namespace, length: int) -> str | None:
    """Why ``method`` is not run at ``length`` on this machine (None: it can run), memory aside."""
    batch, heads, _ = SHAPES[args.shape]
    cuda = args.device == "cuda"
    if method == "chunked-triton":
        interpreted = _triton_interpreted()
        if interpreted is None:
            return "n/a (triton not installed)"
        if not cuda and not interpreted:
            return "n/a (CUDA only; on CPU under TRITON_INTERPRET=1 at smoke sizes)"
        if not cuda and batch * heads * length > INTERPRET_MAX_TOKEN_HEADS:
            return f"skipped (Triton interpreter: smoke sizes only, B·H·T ≤ {INTERPRET_MAX_TOKEN_HEADS})"
    if method == "chunked-fla":
        if importlib.util.find_spec("fla") is None:
            return "n/a (not installed)"
        if not cuda:
            return "n/a (CUDA only)"
    if method == "recurrent" and length > args.recurrent_max_length:
        return f"skipped (recurrent only up to T = {args.recurrent_max_length})"
    return None


def estimate_bytes(method: str, shape: tuple[int, int, int], length: int, itemsize: int, chunk_size: int) -> float:
    """Memory one fwd+bwd allocates above its inputs: a deliberate over-estimate from the shapes, used to skip
    what cannot fit (the measured peak is reported next to it)."""
    batch, heads, dim = shape
    token_heads = batch * heads * length
    outputs = 4 * token_heads * dim * itemsize  # out, dq, dk, dv
    if method == BASELINE:
        return outputs + 4 * token_heads * dim * itemsize  # fused kernels: a few O(T·D) buffers (logsumexp, casts)
    fp32 = 4  # linear attention works in float32 whatever the inputs
    width, columns = dim, dim + 1  # squared_relu keeps D features; v gains the normaliser's ones column
    work = 6 * token_heads * (width + columns) * fp32  # φ(q), φ(k), their pre-activations, v, out, and gradients
    if method == "parallel":
        return outputs + work + 2 * batch * heads * length**2 * fp32  # masked scores and their gradient
    if method == "recurrent":
        return outputs + work + 1.25 * token_heads * width * columns * fp32  # S_t saved at every t
    if method == "chunked-torch":
        chunk = min(chunk_size, length)
        chunks = math.ceil(length / chunk)
        within = 2 * batch * heads * chunks * chunk * chunk * fp32  # per-chunk masked scores and their gradient
        states = 3 * batch * heads * chunks * width * columns * fp32  # contributions, prefix sums, gradients
        return outputs + work + within + states
    return outputs + work  # Triton / fla: states stay in registers, nothing per chunk is stored


def _input_bytes(shape: tuple[int, int, int], length: int, itemsize: int) -> int:
    batch, heads, dim = shape
    return 4 * batch * heads * length * dim * itemsize  # q, k, v and the gradient of the output


# ----------------------------------------------------------------------------------------------------------------
# Section 1: forward + backward of one layer
# ----------------------------------------------------------------------------------------------------------------


def _warm_up(fn: Callable[[], None], args: argparse.Namespace, measure_memory: bool) -> int | None:
    """``args.warmup`` untimed runs (at least one, even with ``--warmup 0``), the last measuring peak memory:
    after the first, one-off allocations (cuBLAS workspace, Triton compilation) are already made."""
    for _ in range(args.warmup - 1):
        fn()
    if measure_memory:
        return peak_bytes(fn, args.torch_device)
    fn()
    return None


def _layer_inputs(shape: tuple[int, int, int], length: int, args: argparse.Namespace):
    batch, heads, dim = shape
    generator = torch.Generator(device=args.torch_device).manual_seed(args.seed)

    def draw():
        return torch.randn(batch, heads, length, dim, generator=generator, device=args.torch_device).to(args.dtype_t)

    q, k, v = (draw().requires_grad_() for _ in range(3))
    return q, k, v, draw()


def _row(method: str, length: int, status: str, estimate: float, seconds=None, peak=None, note: str = "") -> dict:
    """One table row; ``status`` is "ok" for a measured method, else why it was not measured."""
    return {
        "method": method,
        "length": length,
        "status": status,
        "seconds": seconds,
        "peak_bytes": peak,
        "estimate_bytes": estimate,
        "note": note if status == "ok" else status,
    }


def _plan(args: argparse.Namespace, shape, length: int) -> tuple[dict[str, dict], list[str]]:
    """Rows for the methods that will not run (and why), and the names of those that will."""
    itemsize = torch.empty(0, dtype=args.dtype_t).element_size()
    budget = args.memory_budget_gb * GIB
    skipped, runnable = {}, []
    for method in METHODS:
        estimate = estimate_bytes(method, shape, length, itemsize, args.chunk_size)
        reason = unavailable(method, args, length)
        needed = estimate + _input_bytes(shape, length, itemsize)
        if reason is None and needed > budget:
            reason = f"does not fit (≈ {needed / GIB:.1f} GiB with the inputs > budget {budget / GIB:.1f} GiB)"
        if reason is None:
            runnable.append(method)
        else:
            skipped[method] = _row(method, length, reason, estimate)
    return skipped, runnable


def measure_length(args: argparse.Namespace, length: int) -> list[dict]:
    """Every method's row at one T: skipped ones with their reason, the others timed round-robin."""
    shape = SHAPES[args.shape]
    itemsize = torch.empty(0, dtype=args.dtype_t).element_size()
    rows, runnable = _plan(args, shape, length)
    if not runnable:  # nothing fits: do not even allocate the inputs
        return [rows[method] for method in METHODS]
    q, k, v, grad = _layer_inputs(shape, length, args)
    steps, peaks = {}, {}
    for method in runnable:
        step = partial(forward_backward, method_forward(method, args.chunk_size), q, k, v, grad)
        estimate = estimate_bytes(method, shape, length, itemsize, args.chunk_size)
        try:
            peaks[method] = _warm_up(step, args, not _interpreted(method, args))
            steps[method] = step
        except Exception as error:  # noqa: BLE001 - one failing method is a row, not the end of the benchmark
            rows[method] = _row(method, length, _failure(error, method, length), estimate)
            _release(args)
    medians = round_robin_medians(steps, args.repeats, args.torch_device)
    for method, seconds in medians.items():
        estimate = estimate_bytes(method, shape, length, itemsize, args.chunk_size)
        note = INTERPRETED_NOTE if _interpreted(method, args) else ""
        rows[method] = _row(method, length, "ok", estimate, seconds, peaks[method], note)
    return [rows[method] for method in METHODS]


def _interpreted(method: str, args: argparse.Namespace) -> bool:
    """The Triton kernel on CPU runs in the interpreter: not a speed, and its numpy arrays are not the allocator's
    (so no honest peak either)."""
    return method == "chunked-triton" and args.device == "cpu"


def _failure(error: BaseException, method: str, length: int) -> str:
    print(f"{method} at T={length} failed: {type(error).__name__}: {error}", file=sys.stderr)
    return "out of memory" if out_of_memory(error) else f"failed ({type(error).__name__})"


def _release(args: argparse.Namespace) -> None:
    if args.device == "cuda":
        torch.cuda.empty_cache()


def add_ratios(rows: list[dict]) -> list[dict]:
    """Each row's time and peak relative to SDPA's at the same T (None where either is missing)."""
    baseline = {row["length"]: row for row in rows if row["method"] == BASELINE}
    for row in rows:
        base = baseline.get(row["length"])
        row["sdpa_seconds"] = None if base is None else base["seconds"]
        row["time_vs_sdpa"] = ratio_or_none(row["seconds"], row["sdpa_seconds"])
        row["peak_vs_sdpa"] = ratio_or_none(row["peak_bytes"], None if base is None else base["peak_bytes"])
    return rows


# ----------------------------------------------------------------------------------------------------------------
# Section 2: decode
# ----------------------------------------------------------------------------------------------------------------


def _layer_step(args: argparse.Namespace, length: int) -> Callable[[], None]:
    """One ``linear_attention_step`` of B sequences on the state of a random ``length``-token prompt."""
    batch, heads, dim = SHAPES[args.shape]
    generator = torch.Generator(device=args.torch_device).manual_seed(args.seed)

    def draw(tokens):
        return torch.randn(batch, heads, tokens, dim, generator=generator, device=args.torch_device).to(args.dtype_t)

    state = linear_attention_state(draw(length), draw(length))
    q, k, v = draw(1), draw(1), draw(1)

    @torch.no_grad()
    def step():
        linear_attention_step(q, k, v, state)

    return step


def decode_model(args: argparse.Namespace):
    from hf_icl.modeling.linear_gpt import LinearGPTConfig, LinearGPTForCausalLM

    _, heads, dim = SHAPES[args.shape]
    torch.manual_seed(args.seed)
    config = LinearGPTConfig(
        vocab_size=args.decode_vocab,
        n_embd=heads * dim,
        n_head=heads,
        n_layer=args.decode_layers,
        n_positions=max(args.decode_lengths) + 1,
        linear_attention_chunk_size=args.chunk_size,
    )
    return LinearGPTForCausalLM(config).to(device=args.torch_device, dtype=args.dtype_t).eval()


def _model_step(model, args: argparse.Namespace, length: int) -> Callable[[], None]:
    """One new token per sequence on a cache prefilled with ``length`` tokens, restored after every step (a
    linear-attention cache cannot be cropped) so each repetition decodes at the same length."""
    batch = SHAPES[args.shape][0]
    generator = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(args.decode_vocab, (batch, length + 1), generator=generator).to(args.torch_device)
    with torch.no_grad():
        cache = model(ids[:, :-1], use_cache=True, logits_to_keep=1).past_key_values
    states = [layer.state for layer in cache.layers]
    seen, positions = cache.seen_tokens, cache.positions

    @torch.no_grad()
    def step():
        model(ids[:, -1:], past_key_values=cache, use_cache=True, logits_to_keep=1)
        for layer, state in zip(cache.layers, states, strict=True):
            layer.state = state  # the step replaced it with a new tuple; the prefilled one is untouched
        cache.seen_tokens, cache.positions = seen, positions

    return step


def measure_decode(args: argparse.Namespace) -> dict:
    """Seconds per decode step at every prompt length, for one layer's step and for the model."""
    model = decode_model(args)
    steps = {}
    for length in args.decode_lengths:
        steps[("layer", length)] = _layer_step(args, length)
        steps[("model", length)] = _model_step(model, args, length)
    for step in steps.values():
        for _ in range(max(args.warmup, 1)):
            step()
    medians = round_robin_medians(steps, args.decode_repeats, args.torch_device)
    return {kind: {length: medians[(kind, length)] for length in args.decode_lengths} for kind in ("layer", "model")}


# ----------------------------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------------------------


def _environment(args: argparse.Namespace) -> dict:
    memory = "torch.cuda.max_memory_allocated" if args.device == "cuda" else "CPU allocator events, torch.profiler"
    start = load_text(load_average())
    return environment(args.device, architecture=True) | {"load_average_start": start, "memory_method": memory}


def _config(args: argparse.Namespace) -> dict:
    names = ("device", "dtype", "lengths", "repeats", "warmup", "chunk_size", "memory_budget_gb", "growth_lengths")
    names += ("decode_lengths", "decode_layers", "decode_vocab", "decode_repeats", "recurrent_max_length")
    return {name: getattr(args, name) for name in names} | {"shape_name": args.shape, "shape": SHAPES[args.shape]}


def main(argv: list[str] | None = None) -> str:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.threads is not None:  # on a shared CPU, fewer threads than cores avoids waiting on a preempted one
        torch.set_num_threads(args.threads)
    result = {"config": _config(args), "environment": _environment(args)}
    # each section is written as soon as it is measured, so a run cut short keeps what it finished
    report = [emit_markdown(header_lines(result, argv), args.output)]
    result["layer"] = add_ratios([row for length in args.lengths for row in measure_length(args, length)])
    report.append(emit_markdown(layer_table(result), args.output))
    result["decode"] = measure_decode(args)
    report.append(emit_markdown(decode_table(result), args.output))
    result["targets"] = {
        "decode": {kind: decode_target(result["decode"][kind]) for kind in ("model", "layer")},
        "growth": [growth_target(result["layer"], method, args.growth_lengths) for method in CHUNKED],
    }
    result["environment"]["load_average_end"] = end = load_text(load_average())
    report.append(emit_markdown([*targets_lines(result), "", f"1-min load average at the end: {end}."], args.output))
    if args.json:
        write_json(args.json, result)
    return "\n".join(report)


if __name__ == "__main__":
    main()
