"""PNG figures of CAB attention: full vs block-sparse attention, and which blocks a policy selects.

Every function writes a file with a non-interactive Agg :class:`matplotlib.figure.Figure` (no pyplot state)
and returns the written path(s). matplotlib is imported inside the functions, so importing
:mod:`hf_icl.attention` never imports it.

    >>> from hf_icl.attention.cab import CABParams
    >>> q, k = torch.randn(256, 64), torch.randn(256, 64)
    >>> cab_attention_maps(q, k, CABParams(block_size=16, sparsity=0.8), 64**-0.5, "head0.png")  # doctest: +SKIP
    (PosixPath('head0_attention.png'), PosixPath('head0_blocks.png'))
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..kernels.block_sparse_reference import token_keep_mask
from .cab import CABParams, select_cab_blocks
from .preservation import attention_preservation

__all__ = ["cab_attention_maps", "plot_attention_comparison", "plot_block_selection"]


def _square(name: str, x: torch.Tensor) -> torch.Tensor:
    """``x`` as one ``(N, N)`` matrix: leading singleton dims are dropped; anything else is a ValueError."""
    if not torch.is_tensor(x):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    while x.dim() > 2 and x.shape[0] == 1:
        x = x[0]
    if x.dim() != 2 or x.shape[0] != x.shape[1] or x.shape[0] == 0:
        raise ValueError(f"{name} must be one non-empty square (N, N) matrix (one head); got shape {tuple(x.shape)}")
    return x.detach().cpu()


def _head(name: str, x: torch.Tensor) -> torch.Tensor:
    """``(N, D)`` or ``(1, 1, N, D)`` → ``(1, 1, N, D)``; other shapes are a ValueError."""
    if not torch.is_tensor(x):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 2:
        x = x[None, None]
    if x.dim() != 4 or x.shape[0] != 1 or x.shape[1] != 1 or x.shape[2] == 0:
        raise ValueError(f"{name} must have shape (N, D) or (1, 1, N, D) (one head); got {tuple(x.shape)}")
    return x


def _values_and_mask(
    values_name: str, values: torch.Tensor, mask_name: str, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One head's float ``values`` and the bool ``mask`` of the same shape over them, checked."""
    values = _square(values_name, values).float()
    mask = _square(mask_name, mask)
    if mask.dtype != torch.bool:
        raise ValueError(f"{mask_name} must be a bool tensor, got dtype {mask.dtype}")
    if mask.shape != values.shape:
        raise ValueError(f"{mask_name} shape {tuple(mask.shape)} != {values_name} shape {tuple(values.shape)}")
    return values, mask


def _new_figure(n_panels: int, title: str | None):
    """An Agg figure with ``n_panels`` side-by-side axes (lazy matplotlib import)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.2 * n_panels, 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, n_panels, squeeze=False)[0]
    if title:
        fig.suptitle(title)
    return fig, axes


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def plot_attention_comparison(
    full_probs: torch.Tensor, keep_token_mask: torch.Tensor, path: str | Path, *, title: str | None = None
) -> Path:
    """Full attention heatmap beside the same attention under the sparse mask, rows renormalised.

    Args:
        full_probs: ``(N, N)`` attention probabilities of one head (leading singleton dims allowed).
        keep_token_mask: ``(N, N)`` bool, True where the sparse pattern lets the query attend the key.
        path: PNG to write. Both panels share one colour scale.

    A row whose kept keys carry no mass is shown as zeros in the sparse panel.
    """
    full, keep = _values_and_mask("full_probs", full_probs, "keep_token_mask", keep_token_mask)
    kept = full * keep
    row_mass = kept.sum(-1, keepdim=True)
    sparse = torch.where(row_mass > 0, kept / row_mass.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
    preserved = kept.sum() / full.sum().clamp_min(torch.finfo(torch.float32).tiny)

    fig, axes = _new_figure(2, title)
    vmax = float(torch.maximum(full.max(), sparse.max()))
    panels = (("full attention", full), (f"sparse, renormalised ({preserved:.1%} of mass kept)", sparse))
    for ax, (label, data) in zip(axes, panels, strict=True):
        image = ax.imshow(data.numpy(), cmap="viridis", vmin=0.0, vmax=vmax, interpolation="nearest")
        ax.set_title(label)
        ax.set_xlabel("key token")
        ax.set_ylabel("query token")
        fig.colorbar(image, ax=ax, shrink=0.85)
    return _save(fig, path)


def plot_block_selection(
    block_scores: torch.Tensor,
    block_keep: torch.Tensor,
    path: str | Path,
    *,
    frc: torch.Tensor | None = None,
    title: str | None = None,
) -> Path:
    """Block-score heatmap, optionally the FRC heatmap, and the map of selected blocks, side by side.

    Args:
        block_scores: ``(M, M)`` block logits of one head; ``-inf`` (future blocks) is drawn blank.
        block_keep: ``(M, M)`` bool selection per query block (e.g. the union of a per-token selection over each
            query block's tokens).
        frc: optional ``(M, M)`` FRC scores.
    """
    scores, mask = _values_and_mask("block_scores", block_scores, "block_keep", block_keep)
    panels = [("block scores", torch.where(torch.isfinite(scores), scores, float("nan")), "magma")]
    if frc is not None:
        frc = _square("frc", frc).float()
        if frc.shape != scores.shape:
            raise ValueError(f"frc shape {tuple(frc.shape)} != block_scores shape {tuple(scores.shape)}")
        # future blocks have FRC 0 by convention; blank them like the scores
        panels.append(("FRC", torch.where(torch.isfinite(scores), frc, float("nan")), "coolwarm"))
    kept = int(mask.sum())
    panels.append((f"selected blocks ({kept}/{mask.numel()})", mask.float(), "Greys"))

    fig, axes = _new_figure(len(panels), title)
    for ax, (label, data, cmap) in zip(axes, panels, strict=True):
        image = ax.imshow(data.numpy(), cmap=cmap, interpolation="nearest")
        ax.set_title(label)
        ax.set_xlabel("key block")
        ax.set_ylabel("query block")
        fig.colorbar(image, ax=ax, shrink=0.85)
    return _save(fig, path)


def _tokens_per_block(n: int, block_size: int) -> torch.Tensor:
    counts = torch.full((-(-n // block_size),), float(block_size))
    counts[-1] = n - block_size * (counts.numel() - 1)
    return counts[:, None]


def cab_attention_maps(
    query: torch.Tensor, key: torch.Tensor, params: CABParams, scaling: float, path: str | Path
) -> tuple[Path, Path]:
    """Both figures for one head under CAB: ``<stem>_attention.png`` and ``<stem>_blocks.png``.

    From ``query``/``key`` of shape ``(N, D)`` or ``(1, 1, N, D)`` (prefill, keys from position 0) it computes
    the causal full attention, CAB's per-token selection (:func:`~hf_icl.attention.cab.select_cab_blocks`), the
    token-level keep mask (selected blocks and causal), and the preserved attention mass
    (:func:`~hf_icl.attention.preservation.attention_preservation`), which goes into both titles. The block figure
    shows, per (query block, key block), the share of the query block's tokens that selected the key block.

    ``path``: ``stem.png`` or ``stem``; the two files are written next to it. Returns their paths.
    """
    q, k = _head("query", query), _head("key", key)
    if q.shape != k.shape:
        raise ValueError(f"query shape {tuple(q.shape)} != key shape {tuple(k.shape)} (prefill of one head)")
    n = q.shape[2]
    with torch.no_grad():
        logits = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scaling
        causal_tokens = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        probs = torch.softmax(logits.masked_fill(~causal_tokens, float("-inf")), dim=-1)
        token_keep = select_cab_blocks(q, k, params, scaling)  # (1, 1, N, M): each query's own blocks
        token_mask = token_keep_mask(token_keep, params.block_size, n)[0, 0]
        preserved = float(attention_preservation(probs, token_mask)[0, 0])
        # the block figure: per (query block, key block), the share of the query block's tokens that kept it
        per_block = torch.nn.functional.pad(token_keep[0, 0].float(), (0, 0, 0, -n % params.block_size))
        share = per_block.unflatten(0, (-1, params.block_size)).sum(1) / _tokens_per_block(n, params.block_size)
        union = share > 0

    path = Path(path)
    stem = path.with_suffix("") if path.suffix == ".png" else path
    label = (
        f"CAB {params.policy}, sparsity {params.sparsity:g}, block {params.block_size}: "
        f"{preserved:.1%} of attention preserved"
    )
    attention_png = plot_attention_comparison(
        probs[0, 0], token_mask, stem.parent / f"{stem.name}_attention.png", title=label
    )
    blocks_png = plot_block_selection(share, union, stem.parent / f"{stem.name}_blocks.png", title=label)
    return attention_png, blocks_png
