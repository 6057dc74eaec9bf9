"""The per-kernel sections of ``hf-icl bench cab`` (:mod:`.cab`), each on random q/k/v: coarsening (``coarsen_max_l2``
vs its PyTorch path or a per-block loop), prefill attention per shape (dense SDPA, CAB total, the sparse kernel
alone, FlexAttention with the same block mask) with its roofline table, and the selection alone (PyTorch vs the
fused Triton kernel); and the measured functions they time."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from functools import partial

import torch
import torch.nn.functional as F

from hf_icl.attention.cab import CABParams, select_cab_blocks
from hf_icl.kernels.block_sparse_attention import block_sparse_attention_triton
from hf_icl.kernels.block_sparse_reference import selected_block_indices
from hf_icl.kernels.coarsen import coarsen_max_l2
from hf_icl.kernels.roofline import H100_SXM, block_sparse_floor, dense_causal_floor
from hf_icl.kernels.token_selection.rule import achieved_sparsity, select_token_blocks
from hf_icl.kernels.token_sparse import token_sparse_attention

from .timing import median_seconds

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


def compiled_flex(args):
    """FlexAttention as the prefill section times it: compiled on a GPU, eager on a CPU."""
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


def _ms(seconds) -> str:
    return "n/a" if seconds is None else f"{1e3 * seconds:.2f}"


def _ratio(numerator, denominator) -> str:
    return "n/a" if numerator is None or denominator is None else f"{numerator / denominator:.2f}×"
