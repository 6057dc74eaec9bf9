"""CAB speed against dense attention, every number measured in the same run on the same inputs.

    hf-icl bench cab --device cuda --output docs/results/cab.md   # the GPU tables (bf16)
    hf-icl bench cab --device cpu --output docs/results/cab.md    # the CPU tables (fp32, PyTorch path)
    TRITON_INTERPRET=1 hf-icl bench cab --smoke                   # every section on tiny shapes

Sections, in the order they run (each written to ``--output`` as soon as it is measured):

0. **Pairs** (:mod:`.cab_pairs`, first: the numbers that decide): the registered ``"cab"`` call against SDPA on
   random and on captured q/k (``--qk``), with the selected pairs, the executed work, the selection's share and the
   peak extra memory; ``--pairs-only`` runs it alone. Then the end-to-end prefill (3), decode (4) and the selection
   alone, then the older per-kernel sections below (coarsening, and the block-level kernel over the tile unions of
   the per-token selection, kept for comparison with the pair execution).

1. **Coarsening**: ``coarsen_max_l2`` vs its PyTorch path (CUDA) or a per-block loop (CPU); on CUDA also the
   achieved bandwidth against the measured device-to-device copy bandwidth.
2. **Prefill attention** per shape (B, H, D), length T and sparsity: dense causal SDPA (flash backend on CUDA),
   CAB total (coarsen + score + select + sparse attention), the sparse kernel alone on a precomputed selection,
   FlexAttention compiled with the same block mask, and the selection's share of CAB's time; then a roofline table
   of the same runs: each time's floor (:mod:`hf_icl.kernels.roofline`, peaks from ``--peak-bandwidth`` /
   ``--peak-flops``, default H100 SXM) as a percentage of it.
   **Selection alone**: the per-token selection CAB runs, its PyTorch path vs the fused Triton kernel
   (``select_token_blocks(backend=...)``), and how many (token, block) entries the two disagree on. GPU only: on a CPU
   the kernel runs only under ``TRITON_INTERPRET=1`` (``--smoke`` exercises it there).
3. **End-to-end prefill** of a GPT-2-shaped model (12 layers, width 768, 12 heads, random weights, no LM head) with
   ``attn_implementation="cab"`` vs ``"sdpa"``.
4. **Decode**: latency per generated token of the same model vs cache length (one step on a prefilled cache, which
   is cropped back after every step so each repetition sees the same length): sdpa, CAB re-summarising the whole
   key cache every step (a plain ``DynamicCache``), and CAB selecting from the block summaries a ``CABCache`` keeps
   up to date (what ``generate`` uses after ``enable_cab``). On CPU at small sizes, e.g.
   ``hf-icl bench cab --device cpu --lengths 256 --shapes 1,2,64 --sparsities 0.9 --model-lengths
   --cache-lengths 1024 4096 --model-layers 2``.

Timings are medians over ``--repeats`` runs after ``--warmup`` runs, with CUDA events on a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys
import time
from dataclasses import replace
from functools import partial

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from hf_icl.attention.cab import CABParams, enable_cab, select_cab_blocks
from hf_icl.attention.cab_cache import CABCache
from hf_icl.kernels.block_sparse_attention import block_sparse_attention_triton, kernels_runnable
from hf_icl.kernels.block_sparse_reference import selected_block_indices
from hf_icl.kernels.coarsen import coarsen_max_l2
from hf_icl.kernels.roofline import H100_SXM, DevicePeaks, block_sparse_floor, dense_causal_floor
from hf_icl.kernels.token_selection.rule import achieved_sparsity, select_token_blocks
from hf_icl.kernels.token_sparse import token_sparse_attention

from . import cab_pairs
from .flags import BenchParser, bench_memory, check_flags
from .timing import emit_markdown, median_seconds

GPU_DEFAULTS = {
    "lengths": [4096, 8192, 16384, 32768, 65536],
    "shapes": ["1,12,64", "1,32,128"],
    "sparsities": [0.5, 0.75, 0.9, 0.95],
    "model_lengths": [8192, 16384, 32768],
    "cache_lengths": [4096, 8192, 16384, 32768],
    "dtype": "bfloat16",
}
CPU_DEFAULTS = {
    "lengths": [4096, 8192],
    "shapes": ["1,12,64"],
    "sparsities": [0.5, 0.9, 0.95],
    "model_lengths": [],
    "cache_lengths": [],
    "dtype": "float32",
}
SMOKE = {
    "lengths": [64, 96],
    "shapes": ["1,2,32"],
    "sparsities": [0.5, 0.9],
    "model_lengths": [64],
    "cache_lengths": [64],
    "dtype": "float32",
    "block_size": 16,
    "repeats": 1,
    "warmup": 0,
    "model_layers": 1,
}


# ----------------------------------------------------------------------------------------------------------------
# The measured functions
# ----------------------------------------------------------------------------------------------------------------


def naive_coarsen(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """One block at a time, as the research notebook's PyTorch baseline does."""
    blocks = []
    for start in range(0, x.shape[2], block_size):
        chunk = x[:, :, start : start + block_size]
        best = chunk.float().norm(dim=-1).argmax(dim=-1)
        blocks.append(chunk.gather(2, best[..., None, None].expand(-1, -1, 1, x.shape[-1])))
    return torch.cat(blocks, dim=2)


def naive_coarsen_qk(q, k, block_size):
    return naive_coarsen(q, block_size), naive_coarsen(k, block_size)


def dense_causal(q, k, v):
    """Dense causal SDPA; on CUDA restricted to the flash backend (FlashAttention-2)."""
    with _flash_only(q):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _flash_only(q):
    if not q.is_cuda:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.FLASH_ATTENTION)


def tile_unions(token_keep: torch.Tensor, block_size: int) -> torch.Tensor:
    """Per-token selection ``(B, H, N, Mk)`` → per query block ``(B, H, Mq, Mk)``: the blocks any of its tokens
    kept, i.e. what a block-granular kernel (or FlexAttention's block mask) has to visit."""
    pad = -token_keep.shape[2] % block_size
    return F.pad(token_keep, (0, 0, 0, pad)).unflatten(2, (-1, block_size)).any(3)


def sparse_attention(q, k, v, token_keep, block_size: int, scaling: float, use_kernel: bool):
    """The sparse attention CAB runs: the Triton kernel over the tile unions on CUDA (or under the interpreter;
    exact for block-uniform policies, an upper bound on the work otherwise), else the PyTorch path."""
    if not use_kernel:
        return token_sparse_attention(q, k, v, token_keep, block_size=block_size, scaling=scaling)
    indices, valid = selected_block_indices(tile_unions(token_keep, block_size))
    return block_sparse_attention_triton(
        q, k, v, indices, valid.sum(-1), block_size=block_size, scaling=scaling, validate=False
    )


def cab_prefill(q, k, v, params: CABParams, scaling: float, use_kernel: bool) -> torch.Tensor:
    keep = select_cab_blocks(q, k, params, scaling)
    return sparse_attention(q, k, v, keep, params.block_size, scaling, use_kernel)


def executed_sparsity(token_keep: torch.Tensor, block_size: int) -> float:
    """The fraction of causal (query block, key block) pairs the tile unions skip: the sparsity the work sees."""
    union = tile_unions(token_keep, block_size)
    m_q, m_k = union.shape[-2:]
    causal = torch.ones(m_q, m_k, dtype=torch.bool, device=union.device).tril()
    return 1.0 - float(union.sum()) / (float(causal.sum()) * union.shape[0] * union.shape[1])


def kernel_only(q, k, v, indices, counts, block_size: int, scaling: float):
    return block_sparse_attention_triton(
        q, k, v, indices, counts, block_size=block_size, scaling=scaling, validate=False
    )


def copy_bandwidth(x: torch.Tensor, repeats: int, warmup: int) -> float:
    """Bytes per second of a device-to-device copy of ``x`` (read + write)."""
    out = torch.empty_like(x)
    seconds = median_seconds(out.copy_, repeats, x.device, x, warmup=warmup)
    return 2 * x.numel() * x.element_size() / seconds


def flex_block_mask(keep: torch.Tensor, block_size: int, n: int):
    """FlexAttention's BlockMask for the same selection: the diagonal block partial, the other kept blocks full.

    The mask_mod states the whole rule (causal and kept), as flex requires of it; the kernel evaluates it only on
    the partial (diagonal) blocks and skips every block not listed.
    """
    from torch.nn.attention.flex_attention import BlockMask

    size = block_size
    m_q, m_k = keep.shape[-2:]
    diagonal = torch.eye(m_q, m_k, dtype=torch.bool, device=keep.device)

    def listed(mask):  # kept blocks first, ascending: (B, H, Mq, Mk) int32 ids and (B, H, Mq) counts
        order = torch.arange(m_k, device=keep.device) + m_k * (~mask).int()
        return mask.sum(-1).int(), order.argsort(-1).int()

    partial_counts, partial = listed(keep & diagonal)
    full_counts, full = listed(keep & ~diagonal)
    return BlockMask.from_kv_blocks(
        partial_counts,
        partial,
        full_counts,
        full,
        BLOCK_SIZE=block_size,
        mask_mod=lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & keep[b, h, q_idx // size, kv_idx // size],
        seq_lengths=(n, n),
    )


# ----------------------------------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------------------------------


def _inputs(shape: tuple[int, int, int], length: int, dtype, device):
    batch, heads, dim = shape
    g = torch.Generator(device=device).manual_seed(0)
    return tuple(torch.randn(batch, heads, length, dim, generator=g, device=device).to(dtype) for _ in range(3))


def coarsening_section(args, use_kernel: bool) -> list[str]:
    batch, heads, dim = args.shapes[0]
    baseline = "PyTorch" if use_kernel else "naive per-block loop"
    lines = [
        f"Coarsening (B={batch}, H={heads}, D={dim}, block {args.block_size}, Q and K in one call):",
        "",
        f"| T | {baseline} ms | coarsen_max_l2 ms | speed-up | GB/s | % of copy bandwidth |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for length in args.lengths:
        q, k, _ = _inputs(args.shapes[0], length, args.dtype, args.device)
        if use_kernel:
            pytorch, kernel = (partial(coarsen_max_l2, backend=b) for b in ("torch", "triton"))
            slow = median_seconds(pytorch, args.repeats, args.device, q, k, args.block_size, warmup=args.warmup)
            fast = median_seconds(kernel, args.repeats, args.device, q, k, args.block_size, warmup=args.warmup)
        else:
            slow = median_seconds(
                naive_coarsen_qk, args.repeats, args.device, q, k, args.block_size, warmup=args.warmup
            )
            fast = median_seconds(coarsen_max_l2, args.repeats, args.device, q, k, args.block_size, warmup=args.warmup)
        moved = (q.numel() + k.numel()) * q.element_size() * (1 + 1 / args.block_size)  # read all, write 1 row/block
        bandwidth = moved / fast
        share = f"{100 * bandwidth / copy_bandwidth(q, args.repeats, args.warmup):.0f}%" if q.is_cuda else "n/a"
        lines.append(
            f"| {length} | {1e3 * slow:.3f} | {1e3 * fast:.3f} | {slow / fast:.1f}× | {bandwidth / 1e9:.1f} | {share} |"
        )
    return lines


def attention_section(args, shape: tuple[int, int, int], use_kernel: bool, flex) -> list[str]:
    batch, heads, dim = shape
    scaling = dim**-0.5
    lines = [
        "",
        f"Prefill attention (B={batch}, H={heads}, D={dim}, block {args.block_size}, policy {args.policy}, "
        f"{args.dtype_name}); speed-ups are dense time / method time:",
        "",
        "| T | sparsity | achieved (tokens) | executed (tiles) | dense ms | CAB total ms | CAB speed-up | kernel ms "
        "| kernel speed-up | flex ms | kernel vs flex | selection % of CAB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    floors = roofline_header(args, shape)
    for length in args.lengths:
        q, k, v = _inputs(shape, length, args.dtype, args.device)
        dense = median_seconds(dense_causal, args.repeats, args.device, q, k, v, warmup=args.warmup)
        for sparsity in args.sparsities:
            params = CABParams(sparsity=sparsity, block_size=args.block_size, policy=args.policy, min_seq_len=0)
            total = median_seconds(
                cab_prefill, args.repeats, args.device, q, k, v, params, scaling, use_kernel, warmup=args.warmup
            )
            keep = select_cab_blocks(q, k, params, scaling)
            selection = median_seconds(
                select_cab_blocks, args.repeats, args.device, q, k, params, scaling, warmup=args.warmup
            )
            kernel = _kernel_time(args, q, k, v, keep, scaling, use_kernel)
            flex_time = _flex_time(args, flex, q, k, v, keep, scaling)
            achieved = float(achieved_sparsity(keep, args.block_size, length))
            lines.append(
                f"| {length} | {sparsity:.2f} | {achieved:.3f} | {executed_sparsity(keep, args.block_size):.3f} | "
                f"{1e3 * dense:.2f} | {1e3 * total:.2f} | {dense / total:.2f}× | "
                f"{_ms(kernel)} | {_ratio(dense, kernel)} | {_ms(flex_time)} | {_ratio(flex_time, kernel)} | "
                f"{100 * selection / total:.0f}% |"
            )
            measured = {"dense": dense, "CAB": total, "kernel": kernel, "flex": flex_time}
            floors.append(roofline_row(args, shape, length, sparsity, tile_unions(keep, args.block_size), measured))
        del q, k, v
    return lines + floors


def roofline_header(args, shape: tuple[int, int, int]) -> list[str]:
    """The roofline table's title and header (peaks from ``--peak-bandwidth`` / ``--peak-flops``)."""
    peaks = getattr(args, "peaks", H100_SXM)  # parse_args sets it from --peak-bandwidth / --peak-flops
    return [
        "",
        f"Roofline of the same runs (B, H, D = {shape}; peaks {peaks.bandwidth / 1e12:.2f} TB/s, "
        f"{peaks.flop_rate / 1e12:.0f} TFLOP/s): each time's floor as a % of it (100% = at the roofline). The sparse "
        "floor counts the executed block mask: q read and output written once, each kept K/V tile read once per "
        "query block and head, 4·D FLOPs per attended pair; 'compulsory' reads K/V once in all (perfect reuse).",
        "",
        "| T | sparsity | floor ms | bound | compulsory floor ms | dense floor ms | dense % | CAB % | kernel % "
        "| flex % |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]


def roofline_row(args, shape, length: int, sparsity: float, keep: torch.Tensor, measured: dict) -> str:
    """One roofline row: the floors of ``keep`` (the block mask the kernel and flex execute) and of dense causal
    attention, and each measured time (seconds or None) as a percentage of its floor."""
    batch, heads, dim = shape
    size = torch.empty((), dtype=args.dtype).element_size()
    peaks = getattr(args, "peaks", H100_SXM)  # parse_args sets it from --peak-bandwidth / --peak-flops
    sparse = block_sparse_floor(
        keep, block_size=args.block_size, n_q=length, n_k=length, head_dim=dim, element_size=size
    )
    dense = dense_causal_floor(batch=batch, heads=heads, n=length, head_dim=dim, element_size=size)

    def share(floor, seconds):
        return "n/a" if seconds is None else f"{100 * floor.fraction(seconds, peaks):.3g}%"

    return (
        f"| {length} | {sparsity:.2f} | {1e3 * sparse.seconds(peaks):.3g} | {sparse.bound(peaks)} | "
        f"{1e3 * sparse.seconds(peaks, compulsory=True):.3g} | {1e3 * dense.seconds(peaks):.3g} | "
        f"{share(dense, measured['dense'])} | {share(sparse, measured['CAB'])} | {share(sparse, measured['kernel'])} | "
        f"{share(sparse, measured['flex'])} |"
    )


def selection_section(args, shape: tuple[int, int, int], fused: bool) -> list[str]:
    """The selection alone, as CAB runs it at each (T, sparsity): the PyTorch path vs the fused Triton kernel."""
    batch, heads, dim = shape
    params = CABParams(block_size=args.block_size, policy=args.policy, min_seq_len=0)
    title = (
        f"Selection alone (B={batch}, H={heads}, D={dim}, block {args.block_size}, policy {args.policy}, "
        f"score {params.score}, {args.dtype_name}): PyTorch vs fused Triton kernel"
    )
    if not fused:
        return [
            "",
            f"{title}: skipped. On a CPU the fused kernel runs only under TRITON_INTERPRET=1, which times the "
            "interpreter, not the kernel; run `hf-icl bench cab --device cuda` (`--smoke` exercises it interpreted).",
        ]
    lines = [
        "",
        f"{title}; 'differ' counts the (token, block) entries where the two selections disagree (float32 scores "
        "summed in another order can swap candidates whose scores are within rounding):",
        "",
        "| T | sparsity | PyTorch ms | fused ms | speed-up | differ |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for length in args.lengths:
        q, k, _ = _inputs(shape, length, args.dtype, args.device)
        for sparsity in args.sparsities:
            rule = _selection_rule(replace(params, sparsity=sparsity), dim**-0.5)
            times, keeps = {}, {}
            for backend in ("torch", "triton"):
                select = partial(select_token_blocks, backend=backend, **rule)
                try:
                    times[backend] = median_seconds(select, args.repeats, args.device, q, k, warmup=args.warmup)
                    keeps[backend] = select(q, k)
                except (ValueError, torch.OutOfMemoryError) as error:  # unsupported policy or too long: say so
                    print(f"selection ({backend}) at T={length}: {type(error).__name__}: {error}")
                    times[backend] = keeps[backend] = None
                    if args.device.type == "cuda":
                        torch.cuda.empty_cache()
            differ = "n/a" if None in keeps.values() else str(int((keeps["torch"] != keeps["triton"]).sum()))
            lines.append(
                f"| {length} | {sparsity:.2f} | {_ms(times['torch'])} | {_ms(times['triton'])} | "
                f"{_ratio(times['torch'], times['triton'])} | {differ} |"
            )
            del keeps
        del q, k
    return lines


def _selection_rule(params: CABParams, scaling: float) -> dict:
    """``select_token_blocks``'s keyword arguments for CAB's selection under ``params`` (no padding)."""
    fields = ("block_size", "policy", "score", "budget", "sparsity", "topk", "sink_blocks", "local_blocks")
    rule = {name: getattr(params, name) for name in (*fields, "min_seq_len", "lam", "magnitude_fraction")}
    return {"scaling": scaling, **rule}


def _kernel_time(args, q, k, v, keep, scaling, use_kernel):
    if not use_kernel:
        return median_seconds(
            sparse_attention,
            args.repeats,
            args.device,
            q,
            k,
            v,
            keep,
            args.block_size,
            scaling,
            False,
            warmup=args.warmup,
        )
    indices, valid = selected_block_indices(tile_unions(keep, args.block_size))
    counts = valid.sum(-1)
    return median_seconds(
        kernel_only, args.repeats, args.device, q, k, v, indices, counts, args.block_size, scaling, warmup=args.warmup
    )


def _compiled_flex(args):
    from torch.nn.attention.flex_attention import flex_attention

    # compiled on a GPU (the eager path materialises scores); the smoke run on CPU checks the mask, eagerly
    return torch.compile(flex_attention, dynamic=False) if args.device.type == "cuda" else flex_attention


def _flex_time(args, flex, q, k, v, keep, scaling):
    if flex is None:
        return None
    try:
        block_mask = flex_block_mask(tile_unions(keep, args.block_size), args.block_size, q.shape[2])
        # flex's own tiles must divide the mask's blocks (its default 128-row tile rejects 64-token blocks)
        tiles = {"BLOCK_M": args.block_size, "BLOCK_N": args.block_size} if q.is_cuda else None
        return median_seconds(
            lambda: flex(q, k, v, block_mask=block_mask, scale=scaling, kernel_options=tiles),
            args.repeats,
            args.device,
            warmup=max(args.warmup, 1),
        )
    except Exception as error:  # noqa: BLE001 - report the failure in the table and keep measuring the rest
        print(f"FlexAttention failed at T={q.shape[2]}: {type(error).__name__}: {error}")
        return None


def _gpt2(args, length: int, implementation: str, sparsity: float):
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    small = args.smoke
    config = GPT2Config(
        n_layer=args.model_layers,
        n_embd=64 if small else 768,
        n_head=2 if small else 12,
        n_positions=length + 64,
        vocab_size=1000 if small else 50257,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2Model(config).to(device=args.device, dtype=args.dtype).eval()
    if implementation == "cab":
        return enable_cab(model, sparsity=sparsity, block_size=args.block_size, policy=args.policy, min_seq_len=0)
    model.set_attn_implementation(implementation)
    return model


def _ids(length: int, device, vocab: int) -> torch.Tensor:
    return torch.randint(vocab, (1, length), generator=torch.Generator().manual_seed(0)).to(device)


def _model_row(args, length: int, measured) -> str:
    """Time ``measured(model, ids)`` (a zero-argument callable it returns) on an sdpa and a cab GPT-2: one row."""
    times = {}
    for implementation in ("sdpa", "cab"):
        model = _gpt2(args, length, implementation, args.model_sparsity)
        ids = _ids(length + 1, args.device, model.config.vocab_size)
        with torch.no_grad():
            times[implementation] = median_seconds(measured(model, ids), args.repeats, args.device, warmup=args.warmup)
        del model
    sdpa, cab = times["sdpa"], times["cab"]
    return f"| {length} | {1e3 * sdpa:.2f} | {1e3 * cab:.2f} | {sdpa / cab:.2f}× |"


def _prefill(model, ids):
    return lambda: model(ids[:, :-1], use_cache=False)


def _decode_step(model, ids, cache=None):
    """One new token on a cache (``cache``, else the model's own ``DynamicCache``) prefilled with all but the last
    id; the cache is cropped back after each step (a ``CABCache`` drops a block summary the step completed)."""
    cache = model(ids[:, :-1], past_key_values=cache, use_cache=True).past_key_values

    def step():
        model(ids[:, -1:], past_key_values=cache, use_cache=True)
        cache.crop(-1)

    return step


def _decode_row(args, length: int) -> str:
    """ms per token at one cache length: sdpa, CAB recomputing its selection from the keys (plain
    ``DynamicCache``), CAB selecting from the block summaries a ``CABCache`` keeps; one table row."""
    times = {}
    for name, implementation in (("sdpa", "sdpa"), ("uncached", "cab"), ("cached", "cab")):
        model = _gpt2(args, length, implementation, args.model_sparsity)
        ids = _ids(length + 1, args.device, model.config.vocab_size)
        cache = CABCache(model.config) if name == "cached" else DynamicCache()
        with torch.no_grad():
            step = _decode_step(model, ids, cache)
            times[name] = median_seconds(step, args.repeats, args.device, warmup=args.warmup)
        del model, cache
    sdpa, uncached, cached = times["sdpa"], times["uncached"], times["cached"]
    return (
        f"| {length} | {1e3 * sdpa:.2f} | {1e3 * uncached:.2f} | {1e3 * cached:.2f} | {uncached / cached:.2f}× "
        f"| {sdpa / uncached:.2f}× | {sdpa / cached:.2f}× |"
    )


def model_prefill_section(args) -> list[str]:
    return [
        "",
        f"End-to-end prefill, GPT-2-shaped model ({args.model_layers} layers, no LM head, {args.dtype_name}), "
        f"CAB {args.policy} at sparsity {args.model_sparsity}:",
        "",
        "| T | sdpa ms | cab ms | speed-up |",
        "|---:|---:|---:|---:|",
        *(_model_row(args, length, _prefill) for length in args.model_lengths),
    ]


def decode_section(args) -> list[str]:
    return [
        "",
        f"Decode latency per token, GPT-2-shaped model ({args.model_layers} layers, {args.dtype_name}), one new token "
        f"on a prefilled cache; CAB {args.policy} at sparsity {args.model_sparsity}, uncached (every step "
        "re-summarises the key cache: a plain DynamicCache) and cached (block summaries kept by a CABCache); "
        "speed-ups are the first time / the second:",
        "",
        "| cache length | sdpa ms/token | CAB uncached ms/token | CAB cached ms/token | cached vs uncached "
        "| sdpa vs uncached | sdpa vs cached |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *(_decode_row(args, length) for length in args.cache_lengths),
    ]


def _ms(seconds) -> str:
    return "n/a" if seconds is None else f"{1e3 * seconds:.2f}"


def _ratio(numerator, denominator) -> str:
    return "n/a" if numerator is None or denominator is None else f"{numerator / denominator:.2f}×"


# ----------------------------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = BenchParser(
        prog="hf-icl bench cab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes through every section (CI / interpreter)")
    parser.add_argument("--lengths", type=int, nargs="+")
    parser.add_argument("--shapes", nargs="+", help="B,H,D triples, e.g. 1,12,64 1,32,128")
    parser.add_argument("--sparsities", type=float, nargs="+")
    parser.add_argument("--model-lengths", type=int, nargs="*", help="end-to-end prefill lengths ([] to skip)")
    parser.add_argument("--cache-lengths", type=int, nargs="*", help="decode cache lengths ([] to skip)")
    parser.add_argument("--model-layers", type=int, default=12)
    parser.add_argument("--model-sparsity", type=float, default=0.9)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--policy", default="magnitude")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-flex", dest="flex", action="store_false", help="skip FlexAttention")
    parser.add_argument(
        "--peak-bandwidth",
        type=float,
        default=H100_SXM.bandwidth,
        help="device memory bandwidth for the roofline, bytes/s (default: H100 SXM, 3.35e12)",
    )
    parser.add_argument(
        "--peak-flops",
        type=float,
        default=H100_SXM.flop_rate,
        help="device dense matrix FLOP/s for the roofline (default: H100 SXM bf16, 9.9e14)",
    )
    parser.add_argument("--output", default=None, help="append the markdown to this file")
    cab_pairs.add_options(parser)
    args = parser.parse_args(argv)
    defaults = dict(SMOKE if args.smoke else GPU_DEFAULTS if args.device == "cuda" else CPU_DEFAULTS)
    explicit = {name for name in defaults if any(a.startswith("--" + name.replace("_", "-")) for a in argv)}
    for name, value in defaults.items():
        if getattr(args, name) is None or (args.smoke and name not in explicit):
            setattr(args, name, value)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible")
    _check_sizes(parser, args)
    args.dtype_name, args.dtype, args.device = args.dtype, getattr(torch, args.dtype), torch.device(args.device)
    try:
        args.peaks = DevicePeaks(bandwidth=args.peak_bandwidth, flop_rate=args.peak_flops)
    except ValueError as error:
        parser.error(f"--peak-bandwidth / --peak-flops: {error}")
    if args.device.type == "cpu" and not args.smoke:
        args.flex = False  # compiled FlexAttention is a GPU baseline
    problem = cab_pairs.configure(args, argv)
    if problem:
        parser.error(problem)
    return args


def _check_sizes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every size and fraction flag in range (and ``--shapes`` parsed to ``(B, H, D)`` triples) before any work."""
    shapes = []
    for text in args.shapes:
        parts = text.split(",")
        if len(parts) != 3 or not all(part.strip().isdigit() and int(part) >= 1 for part in parts):
            parser.error(f"--shapes takes B,H,D triples of positive integers, e.g. 1,12,64, got {text!r}")
        shapes.append(tuple(int(part) for part in parts))
    args.shapes = shapes
    check_flags(
        parser,
        args,
        ints={
            "lengths": (1, None),
            "model_lengths": (1, None),
            "cache_lengths": (1, None),
            "model_layers": (1, None),
            "repeats": (1, None),
            "warmup": (0, None),
            "block_size": (16, 128),
        },
        floats={"sparsities": (None, None, True), "model_sparsity": (None, None, True)},  # finite
    )
    if args.block_size & (args.block_size - 1):
        parser.error(f"--block-size must be a power of two in [16, 128], got {args.block_size}")
    for name in ("sparsities", "model_sparsity"):
        values = getattr(args, name)
        if any(not 0 <= value < 1 for value in (values if isinstance(values, list) else [values])):
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag} must lie in [0, 1) (the fraction of blocks dropped), got {values}")
    longest, itemsize = max(args.lengths), getattr(torch, args.dtype).itemsize
    widest = max(shapes, key=lambda shape: shape[0] * shape[1] * shape[2])
    bench_memory(
        parser,
        f"--lengths {longest} --shapes {','.join(map(str, widest))}",
        3 * itemsize * longest * widest[0] * widest[1] * widest[2],
        args.device,
        "q, k and v",
    )


def main(argv: list[str] | None = None) -> str:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    use_kernel = kernels_runnable(args.device)
    hardware = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else platform.processor()
    header = [
        f"`hf-icl bench cab {' '.join(argv)}` · {hardware or platform.machine()}, "
        f"torch {torch.__version__}, {args.dtype_name}, sparse attention: "
        f"{'Triton kernel' if use_kernel else 'PyTorch path'}, {time.strftime('%Y-%m-%d')}",
        "",
    ]
    # each section is written as soon as it is measured, so a run cut short keeps what it finished
    report = [emit_markdown(header, args.output)]
    if args.pairs_only:
        report += [emit_markdown(lines, args.output) for lines in cab_pairs.pairs_sections(args)]
        return "\n".join(report)
    # the registered call against SDPA first (the numbers that decide), the older per-kernel sections last
    if args.pairs:
        report += [emit_markdown(lines, args.output) for lines in cab_pairs.pairs_sections(args)]
    if args.model_lengths:
        report.append(emit_markdown(model_prefill_section(args), args.output))
    if args.cache_lengths:
        report.append(emit_markdown(decode_section(args), args.output))
    fused_selection = args.device.type == "cuda" or (args.smoke and use_kernel)  # a CPU runs it interpreted only
    for shape in args.shapes:
        report.append(emit_markdown(selection_section(args, shape, fused_selection), args.output))
    report.append(
        emit_markdown(coarsening_section(args, use_kernel and (args.device.type == "cuda" or args.smoke)), args.output)
    )
    flex = _compiled_flex(args) if args.flex else None
    for shape in args.shapes:
        report.append(emit_markdown(attention_section(args, shape, use_kernel, flex), args.output))
    return "\n".join(report)  # as the file holds it: each section after a blank line


if __name__ == "__main__":
    main()
