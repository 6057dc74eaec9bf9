"""Synthetic bridge recovery: does a sparse selection policy keep one weak edge between two dense clusters?

    python scripts/cab_bridge_recovery.py                                    # the document's grid
    python scripts/cab_bridge_recovery.py --output docs/results/cab.md       # also append the table

The graph has two dense clusters of ``cluster_size`` nodes (within-cluster weight 1.0 plus N(0, noise²),
zero diagonal, symmetrised, clamped at 0) joined by ONE bridge edge ``(cluster_size - 1, cluster_size)`` of
weight ``w``. With ``A = adjacency / max`` each policy keeps ``k = max(1, int(N * N * (1 - sparsity)))``
entries of the whole (non-causal) ``N x N`` matrix:

* ``magnitude``: the k largest entries of ``A`` (H2O-style);
* ``frc``: the k highest FRC entries, ``FRC = A - lam * (A @ A) / N`` (the curvature proxy CAB's FRC policies use);
* ``frc_low``: the k lowest FRC entries (the document's "bridge-preserving" variant).

Recall is the fraction of trials in which the entry ``A[src, dst]`` is kept. Exactly k entries are kept, ties
broken towards the lower flat index (as CAB's selection breaks them); the document kept every entry ``>=`` the
k-th value instead, which keeps more than k on ties (every symmetric pair is a tie).

FRC comes from :func:`frc_scores`: it min-max normalises the scores, which is the identity here (``A`` has min 0
on its zero diagonal and max 1), then subtracts the two-hop term ``A @ A`` divided by N, so it is exactly the
document's ``A - lam * (A @ A) / N``. (It is the non-causal, whole-matrix form of the per-block FRC that CAB
once selected with; CAB now scores per query token, :func:`hf_icl.kernels.token_selection.token_frc_scores`.)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

POLICIES = ("magnitude", "frc", "frc_low")
BRIDGE_WEIGHTS = (0.05, 0.1, 0.2, 0.5)
SPARSITIES = (0.7, 0.8, 0.9)


def two_cluster_graphs(
    n_trials: int, cluster_size: int, bridge_weight: float, *, noise_level: float = 0.01, seed: int = 0
) -> tuple[torch.Tensor, int, int]:
    """``n_trials`` stacked two-cluster adjacencies ``(n_trials, N, N)`` float32 and the bridge ``(src, dst)``.

    The noise depends only on ``seed`` (not on ``bridge_weight``), so every bridge weight sees the same graphs.
    """
    if n_trials < 1 or cluster_size < 2:
        raise ValueError(
            f"need n_trials >= 1 and cluster_size >= 2; got n_trials={n_trials}, cluster_size={cluster_size}"
        )
    n = 2 * cluster_size
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(n_trials, n, n, generator=generator) * noise_level
    cluster = torch.arange(n) // cluster_size
    within = (cluster[:, None] == cluster[None, :]) & ~torch.eye(n, dtype=torch.bool)
    adjacency = torch.where(within, 1.0 + noise, torch.zeros(()))
    adjacency = ((adjacency + adjacency.transpose(-1, -2)) / 2).clamp_min(0.0)
    src, dst = cluster_size - 1, cluster_size
    adjacency[:, src, dst] = bridge_weight
    adjacency[:, dst, src] = bridge_weight
    return adjacency, src, dst


def normalise(adjacency: torch.Tensor) -> torch.Tensor:
    """``A = adjacency / max`` per graph (the document's normalisation)."""
    peak = adjacency.amax(dim=(-2, -1), keepdim=True)
    return adjacency / peak.clamp_min(torch.finfo(adjacency.dtype).tiny)


def top_k_mask(rank: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the ``k`` highest-``rank`` entries of each ``(N, N)`` matrix; ties go to the lower flat index."""
    flat = rank.flatten(-2)
    order = torch.argsort(flat, dim=-1, descending=True, stable=True)
    keep = torch.zeros_like(flat, dtype=torch.bool).scatter_(-1, order[..., :k], True)
    return keep.view_as(rank)


def bridge_position(rank: torch.Tensor, flat_index: int) -> torch.Tensor:
    """``(T,)`` long: where entry ``flat_index`` falls in each matrix's order of :func:`top_k_mask` (0 = first kept)."""
    order = torch.argsort(rank.flatten(-2), dim=-1, descending=True, stable=True)
    return (order == flat_index).int().argmax(-1)


def frc_scores(scores: torch.Tensor, lam: float = 0.5) -> torch.Tensor:
    """FRC ``A - lam * (A @ A) / N`` of square ``(..., N, N)`` scores, ``A`` the scores min-max normalised to
    ``[0, 1]`` per matrix (``A = 1`` where every score is equal), float32."""
    s = scores.float()
    lo = s.amin(dim=(-2, -1), keepdim=True)
    span = s.amax(dim=(-2, -1), keepdim=True) - lo
    a = torch.where(span > 0, (s - lo) / span.clamp_min(torch.finfo(torch.float32).tiny), torch.ones_like(s))
    return a - lam * torch.matmul(a, a) / max(s.shape[-1], 1)


def policy_ranks(a: torch.Tensor, lam: float) -> dict[str, torch.Tensor]:
    """The ranking (higher = kept first) each policy applies to the normalised graphs ``a``."""
    frc = frc_scores(a, lam)
    return {"magnitude": a, "frc": frc, "frc_low": -frc}


def policy_masks(a: torch.Tensor, k: int, lam: float = 0.5) -> dict[str, torch.Tensor]:
    """Keep masks ``(T, N, N)`` of every policy at budget ``k``."""
    return {name: top_k_mask(rank, k) for name, rank in policy_ranks(a, lam).items()}


def run_bridge_study(
    *,
    cluster_size: int = 50,
    bridge_weights: tuple[float, ...] = BRIDGE_WEIGHTS,
    sparsities: tuple[float, ...] = SPARSITIES,
    n_trials: int = 10,
    lam: float = 0.5,
    noise_level: float = 0.01,
    seed: int = 0,
) -> list[dict]:
    """One row per (bridge weight, sparsity, policy): ``recall`` of the bridge over the trials.

    Rows also carry ``k`` (entries kept) and ``bridge_rank`` (mean 0-based position of the bridge entry in the
    policy's ordering; the bridge is kept iff it is ``< k``), which shows how far from the cut a missed bridge is.
    """
    for s in sparsities:
        if not 0.0 <= s < 1.0:
            raise ValueError(f"sparsity={s!r} is invalid; allowed: a number in [0, 1)")
    rows = []
    n = 2 * cluster_size
    for weight in bridge_weights:
        adjacency, src, dst = two_cluster_graphs(n_trials, cluster_size, weight, noise_level=noise_level, seed=seed)
        a = normalise(adjacency)
        # 0-based position of the bridge in each policy's stable descending order, per trial; kept iff < k
        positions = {name: bridge_position(rank, src * n + dst) for name, rank in policy_ranks(a, lam).items()}
        for sparsity in sparsities:
            k = max(1, int(n * n * (1 - sparsity)))
            for name in POLICIES:
                rows.append(
                    {
                        "bridge_weight": weight,
                        "sparsity": sparsity,
                        "policy": name,
                        "recall": (positions[name] < k).float().mean().item(),
                        "k": k,
                        "bridge_rank": positions[name].float().mean().item(),
                    }
                )
    return rows


def markdown_table(rows: list[dict]) -> str:
    """Rows: bridge weight x sparsity; columns: each policy's recall (and the bridge's mean rank)."""
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    by_key = {(r["bridge_weight"], r["sparsity"], r["policy"]): r for r in rows}
    settings = list(dict.fromkeys((r["bridge_weight"], r["sparsity"]) for r in rows))
    header = "| bridge w | sparsity | k | " + " | ".join(f"{p} recall (rank)" for p in policies) + " |"
    lines = [header, "|" + "---:|" * (3 + len(policies))]
    for weight, sparsity in settings:
        cells = [
            f"{by_key[(weight, sparsity, p)]['recall']:.2f} ({by_key[(weight, sparsity, p)]['bridge_rank']:.0f})"
            for p in policies
        ]
        k = by_key[(weight, sparsity, policies[0])]["k"]
        lines.append(f"| {weight:g} | {sparsity:g} | {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_recall(rows: list[dict], path: str | Path) -> Path:
    """Recall vs bridge weight, one line per policy, one panel per sparsity (Agg, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    sparsities = list(dict.fromkeys(r["sparsity"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fig = Figure(figsize=(4.2 * len(sparsities), 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(sparsities), sharey=True, squeeze=False)[0]
    # distinct markers, sizes and dashes so overlapping lines (e.g. all at 0) stay readable
    styles = dict(zip(POLICIES, (("o", 9, "-"), ("s", 6, "--"), ("^", 4, ":")), strict=True))
    weights = sorted({r["bridge_weight"] for r in rows})
    for ax, sparsity in zip(axes, sparsities, strict=True):
        for policy in policies:
            pts = sorted(
                (r["bridge_weight"], r["recall"]) for r in rows if r["sparsity"] == sparsity and r["policy"] == policy
            )
            marker, size, dash = styles.get(policy, ("x", 5, "-"))
            ax.plot(
                [p[0] for p in pts], [p[1] for p in pts], marker=marker, markersize=size, linestyle=dash, label=policy
            )
        ax.set_xscale("log")
        ax.set_xticks(weights, [f"{w:g}" for w in weights])
        ax.minorticks_off()
        ax.set_title(f"sparsity {sparsity:g}")
        ax.set_xlabel("bridge weight")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("bridge recall")
    axes[-1].legend(loc="best")
    fig.suptitle("Synthetic bridge recovery (two clusters, one bridge)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster-size", type=int, default=50)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--bridge-weights", type=float, nargs="+", default=list(BRIDGE_WEIGHTS))
    parser.add_argument("--sparsities", type=float, nargs="+", default=list(SPARSITIES))
    parser.add_argument("--lam", type=float, default=0.5)
    parser.add_argument("--noise", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default="docs/results/cab_bridge_recovery.png")
    parser.add_argument("--output", default=None, help="markdown file to append the table to")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    rows = run_bridge_study(
        cluster_size=args.cluster_size,
        bridge_weights=tuple(args.bridge_weights),
        sparsities=tuple(args.sparsities),
        n_trials=args.trials,
        lam=args.lam,
        noise_level=args.noise,
        seed=args.seed,
    )
    elapsed = time.perf_counter() - start
    table = markdown_table(rows)
    caption = (
        f"Bridge recall over {args.trials} seeded trials (seed {args.seed}), N = {2 * args.cluster_size}, "
        f"lam = {args.lam:g}, noise = {args.noise:g}; rank = mean position of the bridge in the policy's order "
        f"(kept iff rank < k). {elapsed:.2f} s."
    )
    print(table)
    print()
    print(caption)
    plot = plot_recall(rows, args.plot)
    print(f"plot: {plot}")
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a", encoding="utf-8") as handle:
            handle.write(f"\n## Synthetic bridge recovery\n\n{table}\n\n{caption}\n")
        print(f"appended to {out}")


if __name__ == "__main__":
    main()
