"""The "pairs" section of ``hf-icl bench cab``: CAB's per-token work, time and memory against dense SDPA.

CAB lets every query token keep its own key blocks, so its work is counted in (query token, key block) *pairs*.
For each input kind, length ``T`` and sparsity this section reports, all measured in the same process on the same
tensors:

* **selected pairs / dense causal pairs**: the pairs CAB's selection keeps over the pairs dense causal attention
  visits (:func:`hf_icl.kernels.roofline.dense_causal_pairs`), i.e. ``1 - achieved sparsity``;
* **executed GFLOP and MB**: the work of the key-block-major execution of that selection
  (:func:`hf_icl.kernels.roofline.token_sparse_work`: ``4·D`` FLOPs per visible (query, key) pair of each selected
  block; per pair a query row read and a float32 partial output + log-sum-exp written and read back; each
  (KV head, key block) with a pair reads its K and V tile once);
* **SDPA ms, CAB ms, speed-up**: ``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)``
  against ``hf_icl.attention.cab.cab_attention_forward`` (the function transformers calls for
  ``attn_implementation="cab"``, with a stand-in module whose ``config`` holds the ``cab_*`` fields), timed
  *interleaved*: each round calls SDPA, CAB and CAB's selection alone once, in that order, and each column is the
  median over ``--repeats`` rounds after ``--warmup`` rounds, under ``torch.no_grad()``, with CUDA events on a GPU
  (:func:`hf_icl.benchmarks.timing.median_seconds` times every call). On a CPU the rounds also stop once the timed
  calls of a row have used ``--pairs-budget`` seconds (at least one round runs). With grouped-query attention SDPA
  gets ``enable_gqa=True`` on CUDA, and on a CPU K and V expanded to the query heads *before* the call (not timed,
  and held, so not counted in its extra memory);
* **selection ms and its % of CAB**: the per-token selection alone, range by range as the call runs it on its route
  (:func:`hf_icl.attention.cab.run_selection_only`); the pairs are counted from ``select_cab_block_indices``;
* **peak extra MiB**, SDPA and CAB, and their ratio: the peak memory during one call minus the memory held before
  it (q, k and v allocated). On CUDA: ``torch.cuda.reset_peak_memory_stats`` before the call,
  ``max_memory_allocated`` after it, minus ``memory_allocated`` before it (the output counts: it is held when the
  call returns). On a CPU each measurement runs in a fresh Python process (``python -c``) that builds the same
  inputs, runs one tiny call of the same function (so library and allocator start-up are not counted), returns
  freed heap pages to the system (glibc ``malloc_trim``) and resets the process's peak-RSS mark
  (``/proc/self/clear_refs``), then reads the peak RSS (``VmHWM``; ``resource.getrusage(RUSAGE_SELF).ru_maxrss``
  where ``/proc`` is missing) before and after one call: the difference is the extra peak resident memory.
  Page-granular and allocator-dependent, so small values (a few MiB) are noise.

Inputs: random Gaussian q, k, v (``B, H, D`` from the first ``--shapes`` entry, default 1, 12, 64); and q / k
captured from a real model (``--qk FILE``, written by ``scripts/capture_cab_qk.py``: tensors ``layer{i}.query``
``(1, H, T, D)`` and ``layer{i}.key`` ``(1, Hk, T, D)`` of each captured layer, with their own head counts; v is
random of the key's shape). Lengths above the captured length are skipped with a note; shorter ones take the first
``T`` tokens (a causal prefix: exactly what the model's attention receives for that prefix).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from transformers import PretrainedConfig

from hf_icl.attention.cab import CABParams, cab_attention_forward, run_selection_only, select_cab_block_indices
from hf_icl.kernels.roofline import dense_causal_pairs, token_sparse_work

from .report import hardware_name, machine_line
from .timing import median_seconds

#: where ``scripts/capture_cab_qk.py`` writes by default; the section uses it when ``--qk`` is not given
DEFAULT_CAPTURE = Path("~/.cache/hf_icl/smollm2_qk_16k.safetensors")
CPU_LENGTHS = [2048, 8192, 16384]
CUDA_LENGTHS = [2048, 8192, 16384, 32768]
SPARSITIES = [0.9, 0.95]
SMOKE_LENGTHS = [64, 96]
SMOKE_SPARSITIES = [0.9]
#: seconds of timed calls per row on a CPU before the rounds stop (at least one round runs)
CPU_BUDGET_S = 60.0
MIB = 2**20


# ----------------------------------------------------------------------------------------------------------------
# The measured calls
# ----------------------------------------------------------------------------------------------------------------


def stand_in_module(params: CABParams) -> SimpleNamespace:
    """What ``cab_attention_forward`` needs of the attention module: a ``config`` holding the ``cab_*`` fields and
    ``training`` (False)."""
    return SimpleNamespace(config=PretrainedConfig(**params.to_config_fields()), training=False)


def sdpa_call(query, key, value, scaling: float, gqa: bool) -> torch.Tensor:
    """Dense causal SDPA (K / V already expanded to the query heads unless ``gqa``)."""
    extra = {"enable_gqa": True} if gqa else {}
    return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, **extra)


def cab_call(module, query, key, value, scaling: float) -> torch.Tensor:
    """CAB as transformers calls it: ``(B, H, T, D)`` in, ``(B, T, H, D)`` out."""
    return cab_attention_forward(module, query, key, value, None, scaling=scaling)[0]


def _sdpa_operands(query, key, value) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """K and V for SDPA: as they are with ``enable_gqa`` on CUDA, expanded to the query heads elsewhere (the CPU
    kernels would otherwise fall back to unfused attention)."""
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads == kv_heads:
        return key, value, False
    if query.is_cuda:
        return key, value, True
    group = heads // kv_heads
    return key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1), False


# ----------------------------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputSpec:
    """One input set, described so that a fresh process can rebuild the same tensors (``kind`` "random" or
    "captured")."""

    kind: str
    length: int
    dim: int
    heads: int
    kv_heads: int
    dtype: str
    seed: int = 0
    path: str | None = None
    layer: int | None = None


@dataclass
class Capture:
    """A file of captured q / k: per layer ``(query (1, H, T, D), key (1, Hk, T, D))`` (as stored) and its
    metadata."""

    path: str
    layers: dict[int, tuple[torch.Size, torch.Size]]
    length: int
    info: dict = field(default_factory=dict)


def load_capture(path: str | os.PathLike) -> Capture:
    """Read a capture's names, shapes and metadata (tensors are loaded per row, sliced to ``T``), validating them.

    Raises ``ValueError`` naming the file and what is wrong.
    """
    from safetensors import safe_open

    path = str(Path(path).expanduser())
    if not os.path.isfile(path):
        raise ValueError(f"--qk: no such file: {path}")
    try:
        with safe_open(path, framework="pt") as handle:
            names = list(handle.keys())
            metadata = handle.metadata() or {}
            shapes = {name: torch.Size(handle.get_slice(name).get_shape()) for name in names}
    except Exception as error:  # safetensors raises its own error types for a file it cannot read
        raise ValueError(f"--qk: {path} is not a safetensors file: {error}") from error
    layers = {}
    for name in names:
        stem, _, part = name.partition(".")
        if not stem.startswith("layer") or not stem[5:].isdigit() or part not in ("query", "key"):
            raise ValueError(f"--qk: {path} holds {name!r}; expected only layer{{i}}.query and layer{{i}}.key tensors")
        layers.setdefault(int(stem[5:]), {})[part] = shapes[name]
    if not layers:
        raise ValueError(f"--qk: {path} holds no layer{{i}}.query / layer{{i}}.key tensors")
    pairs, lengths = {}, set()
    for layer, parts in sorted(layers.items()):
        if set(parts) != {"query", "key"}:
            raise ValueError(f"--qk: {path} has layer{layer}.{next(iter(parts))} without its partner")
        query, key = parts["query"], parts["key"]
        if len(query) != 4 or len(key) != 4 or query[0] != 1 or key[0] != 1:
            raise ValueError(f"--qk: layer{layer} must be (1, H, T, D) tensors, got {tuple(query)} and {tuple(key)}")
        if query[2:] != key[2:] or query[1] % key[1]:
            raise ValueError(
                f"--qk: layer{layer} query {tuple(query)} and key {tuple(key)} must share T and D, with the key heads "
                "dividing the query heads"
            )
        pairs[layer] = (query, key)
        lengths.add(query[2])
    if len(lengths) != 1:
        raise ValueError(f"--qk: {path} holds layers of different lengths {sorted(lengths)}")
    try:
        info = json.loads(metadata.get("capture", "{}"))
    except json.JSONDecodeError:
        info = {}
    return Capture(path=path, layers=pairs, length=lengths.pop(), info=info)


def build_inputs(spec: InputSpec, device: torch.device | str):
    """``q (1, H, T, D)``, ``k, v (1, Hk, T, D)`` for ``spec`` on ``device`` (the same in every process)."""
    dtype = getattr(torch, spec.dtype)
    g = torch.Generator(device=device).manual_seed(spec.seed)
    kv_shape = (1, spec.kv_heads, spec.length, spec.dim)

    def gaussian(shape):
        return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)

    if spec.kind == "random":
        query = gaussian((1, spec.heads, spec.length, spec.dim))
        return query, gaussian(kv_shape), gaussian(kv_shape)
    from safetensors import safe_open

    with safe_open(spec.path, framework="pt") as handle:  # only the first T tokens are read
        query, key = (
            handle.get_slice(f"layer{spec.layer}.{part}")[:, :, : spec.length].to(device=device, dtype=dtype)
            for part in ("query", "key")
        )
    return query.contiguous(), key.contiguous(), gaussian(kv_shape)


# ----------------------------------------------------------------------------------------------------------------
# Timing and memory
# ----------------------------------------------------------------------------------------------------------------


def interleaved_medians(calls: dict, repeats: int, warmup: int, device, budget_s: float = float("inf")) -> dict:
    """Median seconds of each of ``calls`` (name → no-argument callable), run in alternation: each round calls every
    one once, in order. ``warmup`` untimed rounds first; the timed rounds stop after ``repeats``, or once their
    calls have used ``budget_s`` seconds (at least one round)."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    samples = {name: [] for name in calls}
    spent = 0.0
    for _ in range(repeats):
        for name, call in calls.items():
            seconds = median_seconds(call, 1, device, warmup=0)
            samples[name].append(seconds)
            spent += seconds
        if spent >= budget_s:
            break
    return {name: statistics.median(times) for name, times in samples.items()}


def _calls(which: str, spec: InputSpec, params: CABParams, device):
    """Inputs for ``spec`` and the one call ``which`` ("sdpa" / "cab") on them, as a no-argument callable."""
    query, key, value = build_inputs(spec, device)
    scaling = spec.dim**-0.5
    if which == "sdpa":
        key, value, gqa = _sdpa_operands(query, key, value)
        return lambda q=query, k=key, v=value: sdpa_call(q, k, v, scaling, gqa)
    module = stand_in_module(params)
    return lambda q=query, k=key, v=value: cab_call(module, q, k, v, scaling)


def _reset_peak_rss() -> bool:
    """Return freed heap memory to the system (glibc ``malloc_trim``, so that resident memory is what live objects
    hold), then restart the process's peak-RSS mark at its current RSS (Linux ``clear_refs``); False where the mark
    cannot be reset."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes() -> int:
    """The process's peak resident memory: ``VmHWM`` (what ``clear_refs`` resets) where Linux reports it, else
    ``getrusage(RUSAGE_SELF).ru_maxrss`` (which also keeps the peaks of exited threads)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def memory_child(payload: str) -> None:
    """Run in a fresh process: build the inputs, warm up on a tiny call, then print the extra peak RSS of one call
    as JSON (``{"extra_bytes": ...}``)."""
    request = json.loads(payload)
    torch.set_num_threads(request["threads"])
    spec, params = InputSpec(**request["spec"]), CABParams(**request["params"])
    with torch.no_grad():
        tiny = InputSpec(**{**request["spec"], "length": min(spec.length, 2 * params.block_size)})
        _calls(request["which"], tiny, params, "cpu")()  # library and allocator start-up, not counted
        call = _calls(request["which"], spec, params, "cpu")
        _reset_peak_rss()
        before = _peak_rss_bytes()
        out = call()
        after = _peak_rss_bytes()
    del out
    print(json.dumps({"extra_bytes": max(after - before, 0)}))


def peak_extra_bytes(which: str, spec: InputSpec, params: CABParams, device: torch.device) -> float | None:
    """Peak memory of one ``which`` call ("sdpa" / "cab") beyond what its inputs hold (see the module docstring);
    None if the measurement failed (the reason is printed to stderr)."""
    if device.type == "cuda":
        call = _calls(which, spec, params, device)
        with torch.no_grad():
            call()  # warm-up: lazy initialisation, compiled kernels
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            out = call()
            torch.cuda.synchronize(device)
            extra = torch.cuda.max_memory_allocated(device) - before
        del out, call
        torch.cuda.empty_cache()
        return float(extra)
    request = {
        "which": which,
        "spec": spec.__dict__,
        "params": params.__dict__,
        "threads": torch.get_num_threads(),
    }
    code = f"from hf_icl.benchmarks.cab_pairs import memory_child; memory_child({json.dumps(json.dumps(request))})"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    try:
        return float(json.loads(result.stdout.strip().splitlines()[-1])["extra_bytes"])
    except (IndexError, KeyError, ValueError):
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"pairs: memory of {which} at T={spec.length} failed: {tail}", file=sys.stderr)
        return None


# ----------------------------------------------------------------------------------------------------------------
# The section
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class PairsRow:
    """One measured (input, T, sparsity): the numbers of one table row."""

    length: int
    sparsity: float
    policy: str
    pairs_ratio: float
    gflop: float
    megabytes: float
    sdpa_s: float
    cab_s: float
    selection_s: float
    sdpa_mib: float | None = None
    cab_mib: float | None = None


def measure_row(spec: InputSpec, sparsity: float, args, sdpa_mib: float | None) -> PairsRow:
    """Select, count the executed work, time SDPA / CAB / selection interleaved, and (with ``--memory``) measure
    CAB's peak extra memory, for one input set and sparsity."""
    device = args.device
    params = CABParams(sparsity=sparsity, block_size=args.block_size, policy=args.policy, min_seq_len=0)
    query, key, value = build_inputs(spec, device)
    sdpa_key, sdpa_value, gqa = _sdpa_operands(query, key, value)
    scaling = spec.dim**-0.5
    module = stand_in_module(params)
    with torch.no_grad():
        indices, counts = select_cab_block_indices(query, key, params, scaling)
        dense_pairs = spec.heads * dense_causal_pairs(spec.length, spec.length, args.block_size)
        work = token_sparse_work(
            counts,
            args.block_size,
            spec.dim,
            query.element_size(),
            spec.length,
            kv_heads=spec.kv_heads,
            heads=spec.heads,
            indices=indices,
        )
        del indices, counts
        calls = {
            "sdpa": partial(sdpa_call, query, sdpa_key, sdpa_value, scaling, gqa),
            "cab": partial(cab_call, module, query, key, value, scaling),
            "selection": partial(run_selection_only, query, key, params, scaling),
        }
        budget = args.pairs_budget if device.type == "cpu" else float("inf")
        times = interleaved_medians(calls, args.repeats, args.warmup, device, budget)
    del calls, query, key, value, sdpa_key, sdpa_value
    cab_mib = None
    if args.memory:
        extra = peak_extra_bytes("cab", spec, params, device)
        cab_mib = None if extra is None else extra / MIB
    return PairsRow(
        length=spec.length,
        sparsity=sparsity,
        policy=args.policy,
        pairs_ratio=work.pairs / dense_pairs,
        gflop=work.flops / 1e9,
        megabytes=work.bytes / 1e6,
        sdpa_s=times["sdpa"],
        cab_s=times["cab"],
        selection_s=times["selection"],
        sdpa_mib=sdpa_mib,
        cab_mib=cab_mib,
    )


COLUMNS = (
    "| T | sparsity | policy | selected pairs / dense causal pairs | executed GFLOP | executed MB | SDPA ms | CAB ms "
    "| CAB speed-up | selection ms | selection % of CAB | SDPA peak extra MiB | CAB peak extra MiB "
    "| CAB / SDPA memory |"
)
ALIGN = "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"


def format_row(row: PairsRow, prefix: str = "") -> str:
    def mib(value):
        return "n/a" if value is None else f"{value:.1f}"

    memory = (
        "n/a"
        if row.sdpa_mib is None or row.cab_mib is None or row.sdpa_mib <= 0
        else (f"{row.cab_mib / row.sdpa_mib:.2f}×")
    )
    return (
        f"{prefix}| {row.length} | {row.sparsity:.2f} | {row.policy} | {row.pairs_ratio:.4f} | {row.gflop:.3g} | "
        f"{row.megabytes:.4g} | {1e3 * row.sdpa_s:.2f} | {1e3 * row.cab_s:.2f} | {row.sdpa_s / row.cab_s:.2f}× | "
        f"{1e3 * row.selection_s:.2f} | {100 * row.selection_s / row.cab_s:.0f}% | {mib(row.sdpa_mib)} | "
        f"{mib(row.cab_mib)} | {memory} |"
    )


def _progress(message: str) -> None:
    print(f"pairs: {message}", file=sys.stderr, flush=True)


def _rows(spec_for, lengths, args, label: str, prefix: str):
    """Table rows for one input set over ``lengths`` × ``--pairs-sparsities``."""
    lines = []
    for length in lengths:
        spec = spec_for(length)
        sdpa_mib = None
        if args.memory:
            _progress(f"{label} T={length}: SDPA peak memory")
            extra = peak_extra_bytes("sdpa", spec, CABParams(block_size=args.block_size, min_seq_len=0), args.device)
            sdpa_mib = None if extra is None else extra / MIB
        for sparsity in args.pairs_sparsities:
            _progress(
                f"{label} T={length} sparsity={sparsity}: selection, timing" + (", memory" if args.memory else "")
            )
            row = measure_row(spec, sparsity, args, sdpa_mib)
            lines.append(format_row(row, prefix))
            _progress(
                f"{label} T={length} sparsity={sparsity}: pairs {row.pairs_ratio:.4f}, SDPA {1e3 * row.sdpa_s:.2f} ms, "
                f"CAB {1e3 * row.cab_s:.2f} ms"
            )
    return lines


def _title(args, what: str) -> str:
    threads = [] if args.device.type == "cuda" else [f"{torch.get_num_threads()} threads"]
    command = f"hf-icl bench cab {' '.join(args.argv)}"
    machine = machine_line(command, hardware_name(args.device), *threads, f"torch {torch.__version__}", args.dtype_name)
    return (
        f"Pairs, {what} ({machine}): CAB = `cab_attention_forward` "
        f"(block {args.block_size}, policy {args.policy}, `cab_min_seq_len` 0) vs causal SDPA, interleaved, median of "
        f"{args.repeats} after {args.warmup} warm-up rounds"
        + (f" (CPU: at most {args.pairs_budget:g} s of timed calls per row)" if args.device.type == "cpu" else "")
        + "; executed work of the key-block-major schedule (roofline.token_sparse_work); peak extra memory "
        + (
            "measured per call (CUDA allocator peak)."
            if args.device.type == "cuda"
            else "per call in a fresh process (peak RSS)."
        )
        + ("" if args.memory else " Memory not measured (`--no-memory`).")
    )


def random_table(args) -> list[str]:
    batch, heads, dim = args.shapes[0]
    if batch != 1:
        _progress(f"random inputs use B=1 (the first --shapes entry asks for B={batch})")
    lines = [_title(args, f"random Gaussian q, k, v (B=1, H={heads}, D={dim})"), "", COLUMNS, ALIGN]
    dtype = args.dtype_name

    def spec_for(length):
        return InputSpec("random", length, dim, heads, heads, dtype)

    return lines + _rows(spec_for, args.pairs_lengths, args, "random", "")


def captured_table(args) -> list[str]:
    if args.qk is None:
        return [
            "Pairs, captured q/k: skipped (no capture; write one with `python scripts/capture_cab_qk.py --model DIR "
            f"--gguf-file SmolLM2-135M-Instruct.Q4_1.gguf --length 16384 --output {DEFAULT_CAPTURE}`, then pass "
            "`--qk FILE`)."
        ]
    capture = load_capture(args.qk)
    info = capture.info
    source = (
        ", ".join(f"{name} {info[name]}" for name in ("model", "prompt", "dtype", "date") if name in info)
        or "no metadata"
    )
    lines = [
        _title(
            args,
            f"q/k captured from a real model ({Path(capture.path).name}: {source}; {capture.length} tokens; "
            "v random of the key's shape)",
        ),
        "",
        "| layer | H / Hk " + COLUMNS,
        "|---:|---" + ALIGN,
    ]
    lengths = [length for length in args.pairs_lengths if length <= capture.length]
    skipped = [length for length in args.pairs_lengths if length > capture.length]
    for layer, (query, key) in sorted(capture.layers.items()):
        heads, kv_heads, dim = query[1], key[1], query[3]

        def spec_for(length, layer=layer, heads=heads, kv_heads=kv_heads, dim=dim):
            return InputSpec("captured", length, dim, heads, kv_heads, args.dtype_name, path=capture.path, layer=layer)

        lines += _rows(spec_for, lengths, args, f"layer {layer}", f"| {layer} | {heads} / {kv_heads} ")
    if skipped:
        lines += [
            "",
            f"Skipped T = {', '.join(map(str, skipped))}: above the captured length ({capture.length} tokens).",
        ]
    if info.get("rope_extrapolated"):
        lines += ["", f"Note: {info['rope_extrapolated']}"]
    return lines


def pairs_sections(args) -> list[list[str]]:
    """The section's tables (random, then captured), each a list of markdown lines; a generator, so that the caller
    writes each table as soon as it is measured."""
    yield [""] + random_table(args)
    yield [""] + captured_table(args)


def configure(args, argv: list[str]) -> str | None:
    """Fill the section's defaults on ``args`` (lengths, sparsities, budget, memory, capture path) after parsing;
    returns an error message for a bad option, else None."""
    args.argv = list(argv)
    cuda = args.device.type == "cuda"
    if args.pairs_lengths is None:
        args.pairs_lengths = SMOKE_LENGTHS if args.smoke else CUDA_LENGTHS if cuda else CPU_LENGTHS
    if args.pairs_sparsities is None:
        args.pairs_sparsities = SMOKE_SPARSITIES if args.smoke else SPARSITIES
    if args.memory is None:
        args.memory = not args.smoke  # a fresh process per measurement: seconds each, too slow for the smoke run
    if args.pairs_budget is None:
        args.pairs_budget = CPU_BUDGET_S
    if any(length < 1 for length in args.pairs_lengths):
        return f"--pairs-lengths must be positive token counts, got {args.pairs_lengths}"
    if any(not 0 <= s < 1 for s in args.pairs_sparsities):
        return f"--pairs-sparsities must lie in [0, 1), got {args.pairs_sparsities}"
    if not args.pairs_budget > 0:  # NaN too
        return f"--pairs-budget must be positive seconds, got {args.pairs_budget}"
    if args.qk is None and not args.smoke and DEFAULT_CAPTURE.expanduser().is_file():
        args.qk = str(DEFAULT_CAPTURE.expanduser())
    if args.qk is not None:
        try:
            load_capture(args.qk)
        except ValueError as error:
            return str(error)
    return None


def add_options(parser) -> None:
    """The section's options on ``hf-icl bench cab``'s parser."""
    import argparse

    parser.add_argument(
        "--pairs", action=argparse.BooleanOptionalAction, default=True, help="the pairs section (default: on)"
    )
    parser.add_argument("--pairs-only", action="store_true", help="run the pairs section alone")
    parser.add_argument(
        "--qk", default=None, help=f"captured q/k (scripts/capture_cab_qk.py; default {DEFAULT_CAPTURE} if present)"
    )
    parser.add_argument(
        "--pairs-lengths", type=int, nargs="+", help="T of the pairs section (default 2048 8192 16384, + 32768 on CUDA)"
    )
    parser.add_argument("--pairs-sparsities", type=float, nargs="+", help="default 0.9 0.95")
    parser.add_argument(
        "--memory",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="peak extra memory of SDPA and CAB (default: on, off under --smoke)",
    )
    parser.add_argument(
        "--pairs-budget",
        type=float,
        default=None,
        help=f"CPU: seconds of timed calls per row (default {CPU_BUDGET_S:g})",
    )
