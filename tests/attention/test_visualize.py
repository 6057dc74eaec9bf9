"""CAB experiment pieces: the synthetic bridge study script and the attention visualisations."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from repo_paths import REPO

from hf_icl.attention.cab import CABParams
from hf_icl.attention.visualize import cab_attention_maps, plot_attention_comparison, plot_block_selection

ROOT = REPO


def _load_script():
    """Import ``scripts/cab_bridge_recovery.py`` as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("cab_bridge_recovery", ROOT / "scripts" / "cab_bridge_recovery.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bridge = _load_script()

WEIGHTS = (0.05, 0.1, 0.2, 0.5)
SPARSITIES = (0.4, 0.5, 0.7, 0.9)


@pytest.fixture(scope="module")
def small_rows() -> list[dict]:
    return bridge.run_bridge_study(cluster_size=10, bridge_weights=WEIGHTS, sparsities=SPARSITIES, n_trials=3, seed=7)


def _plain_graph(noise: np.ndarray, cluster_size: int, weight: float) -> tuple[np.ndarray, int, int]:
    """The two-cluster graph built entry by entry from a given noise draw (float64, plain loops)."""
    n = 2 * cluster_size
    adj = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if i != j and i // cluster_size == j // cluster_size:
                adj[i, j] = 1.0 + noise[i, j]
    adj = np.maximum((adj + adj.T) / 2, 0.0)
    src, dst = cluster_size - 1, cluster_size
    adj[src, dst] = adj[dst, src] = weight
    return adj / adj.max(), src, dst


def _plain_keep(rank: np.ndarray, k: int) -> np.ndarray:
    """Keep the k highest ``rank`` entries, ties to the lower flat index."""
    order = sorted(range(rank.size), key=lambda idx: (-rank.flat[idx], idx))
    keep = np.zeros(rank.size, dtype=bool)
    keep[order[:k]] = True
    return keep.reshape(rank.shape)


def test_study_rows_cover_the_grid(small_rows):
    keys = {(r["bridge_weight"], r["sparsity"], r["policy"]) for r in small_rows}
    assert keys == {(w, s, p) for w in WEIGHTS for s in SPARSITIES for p in bridge.POLICIES}
    assert len(small_rows) == len(keys)
    for row in small_rows:
        assert 0.0 <= row["recall"] <= 1.0
        assert row["k"] == max(1, int(20 * 20 * (1 - row["sparsity"])))


def test_study_matches_plain_recomputation(small_rows):
    # the study's noise draw: one generator seeded with `seed`, (trials, N, N) standard normals
    cluster_size, trials, lam = 10, 3, 0.5
    n = 2 * cluster_size
    noise = (torch.randn(trials, n, n, generator=torch.Generator().manual_seed(7)) * 0.01).double().numpy()
    by_key = {(r["bridge_weight"], r["sparsity"], r["policy"]): r["recall"] for r in small_rows}
    for weight in WEIGHTS:
        kept = {(s, p): 0 for s in SPARSITIES for p in ("magnitude", "frc_low")}
        for t in range(trials):
            a, src, dst = _plain_graph(noise[t], cluster_size, weight)
            frc = a - lam * (a @ a) / n
            for sparsity in SPARSITIES:
                k = max(1, int(n * n * (1 - sparsity)))
                masks = {"magnitude": _plain_keep(a, k), "frc_low": _plain_keep(-frc, k)}
                for name, mask in masks.items():
                    kept[(sparsity, name)] += bool(mask[src, dst])
                if t == 0:  # the full masks of the study's first graph agree too
                    adj, _, _ = bridge.two_cluster_graphs(1, cluster_size, weight, seed=7)
                    ours = bridge.policy_masks(bridge.normalise(adj), k, lam)
                    for name, mask in masks.items():
                        np.testing.assert_array_equal(
                            ours[name][0].numpy(), mask, err_msg=f"{name} w={weight} s={sparsity}"
                        )
        for (sparsity, name), count in kept.items():
            assert by_key[(weight, sparsity, name)] == pytest.approx(count / trials)


def test_document_properties_by_construction(small_rows):
    by_key = {(r["bridge_weight"], r["sparsity"], r["policy"]): r for r in small_rows}
    # at w = 0.05 and 90% sparsity the bridge is far below the ~1.0 cluster weights: magnitude never keeps it
    assert by_key[(0.05, 0.9, "magnitude")]["recall"] == 0.0
    # magnitude ranks the bridge right after the 2 * 10 * 9 within-cluster entries
    assert by_key[(0.05, 0.9, "magnitude")]["bridge_rank"] == 180
    # so once k > 180 (sparsity 0.5: k = 200) magnitude keeps it, while frc_low first spends the budget on
    # the 20 diagonal and ~200 cross-cluster entries (A = 0, FRC <= 0 < FRC(bridge) = w)
    assert by_key[(0.05, 0.5, "magnitude")]["recall"] == 1.0
    assert by_key[(0.05, 0.5, "frc_low")]["recall"] == 0.0
    assert by_key[(0.05, 0.4, "frc_low")]["recall"] == 1.0  # k = 240 reaches it


def test_study_is_deterministic_and_rejects_bad_sparsity():
    kwargs = dict(cluster_size=5, bridge_weights=(0.1,), sparsities=(0.5,), n_trials=2, seed=3)
    assert bridge.run_bridge_study(**kwargs) == bridge.run_bridge_study(**kwargs)
    with pytest.raises(ValueError, match="sparsity"):
        bridge.run_bridge_study(cluster_size=5, sparsities=(1.0,), n_trials=1)


def test_script_main_writes_table_and_plot(tmp_path, capsys):
    import matplotlib.image as mpimg

    plot, out = tmp_path / "bridge.png", tmp_path / "results.md"
    bridge.main(["--cluster-size", "6", "--trials", "2", "--plot", str(plot), "--output", str(out)])
    printed = capsys.readouterr().out
    assert "| bridge w | sparsity |" in printed and "frc_low recall" in printed
    assert "## Synthetic bridge recovery" in out.read_text()
    assert plot.stat().st_size > 5_000
    assert mpimg.imread(plot).shape[-1] >= 3


def _assert_png(path: Path) -> None:
    import matplotlib.image as mpimg

    assert path.exists() and path.stat().st_size > 5_000
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[-1] >= 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_plot_attention_comparison(tmp_path):
    torch.manual_seed(0)
    n = 48
    probs = torch.softmax(torch.randn(n, n).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -torch.inf), -1)
    keep = torch.ones(n, n, dtype=torch.bool).tril() & (torch.rand(n, n) < 0.5)
    path = plot_attention_comparison(probs[None, None], keep, tmp_path / "cmp.png", title="test")
    assert path == tmp_path / "cmp.png"
    _assert_png(path)


def test_plot_block_selection(tmp_path):
    torch.manual_seed(1)
    scores = torch.randn(8, 8).masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(), -torch.inf)
    block_keep = torch.eye(8, dtype=torch.bool)
    _assert_png(plot_block_selection(scores, block_keep, tmp_path / "blocks.png"))
    _assert_png(plot_block_selection(scores, block_keep, tmp_path / "sub" / "frc.png", frc=torch.rand(8, 8), title="t"))


def test_cab_attention_maps(tmp_path):
    torch.manual_seed(2)
    q, k = torch.randn(96, 32), torch.randn(96, 32)
    params = CABParams(block_size=16, sparsity=0.7, policy="frc")
    paths = cab_attention_maps(q, k, params, 32**-0.5, tmp_path / "head.png")
    assert [p.name for p in paths] == ["head_attention.png", "head_blocks.png"]
    for p in paths:
        _assert_png(p)
    # the 4-D single-head form works too
    _assert_png(cab_attention_maps(q[None, None], k[None, None], params, 32**-0.5, tmp_path / "h4")[0])


def test_visualisations_reject_bad_shapes(tmp_path):
    probs = torch.rand(8, 8)
    with pytest.raises(ValueError, match="square"):
        plot_attention_comparison(torch.rand(2, 8, 8), torch.ones(8, 8, dtype=torch.bool), tmp_path / "x.png")
    with pytest.raises(ValueError, match="shape"):
        plot_attention_comparison(probs, torch.ones(4, 4, dtype=torch.bool), tmp_path / "x.png")
    with pytest.raises(ValueError, match="bool"):
        plot_attention_comparison(probs, torch.ones(8, 8), tmp_path / "x.png")
    with pytest.raises(ValueError, match="square"):
        plot_block_selection(torch.rand(4, 5), torch.ones(4, 5, dtype=torch.bool), tmp_path / "x.png")
    with pytest.raises(ValueError, match="frc shape"):
        plot_block_selection(
            torch.rand(4, 4), torch.ones(4, 4, dtype=torch.bool), tmp_path / "x.png", frc=torch.rand(3, 3)
        )
    with pytest.raises(ValueError, match=r"\(N, D\)"):
        cab_attention_maps(torch.rand(2, 32, 8), torch.rand(2, 32, 8), CABParams(block_size=16), 1.0, tmp_path / "x")
    with pytest.raises(ValueError, match="key shape"):
        cab_attention_maps(torch.rand(32, 8), torch.rand(16, 8), CABParams(block_size=16), 1.0, tmp_path / "x")
    assert not list(tmp_path.iterdir())  # nothing written on error


def test_importing_attention_does_not_import_matplotlib():
    code = "import sys, hf_icl.attention, hf_icl.attention.visualize; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
