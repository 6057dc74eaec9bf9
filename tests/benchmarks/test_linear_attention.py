"""`hf-icl bench linear-attention` at tiny sizes: the table's structure, ratios and targets computed from the
measured numbers, sizes that do not fit or fail reported as rows, the CLI. No timing assertions."""

import json
import runpy
import sys

import pytest
import torch
from repo_paths import REPO

from hf_icl.benchmarks import linear_attention as bench
from hf_icl.cli import main as cli_main
from hf_icl.kernels import linear_attention as ops

SCRIPT = REPO / "scripts" / "bench_linear_attention.py"
LENGTHS = (32, 64)
TINY = [
    "--device",
    "cpu",
    "--lengths",
    "32,64",
    "--growth-lengths",
    "32,64",
    "--decode-lengths",
    "8,32",
    "--decode-layers",
    "1",
    "--decode-vocab",
    "32",
    "--decode-repeats",
    "3",
    "--repeats",
    "1",
    "--warmup",
    "1",
]
COLUMNS = ["T", "method", "fwd+bwd ms", "SDPA ms", "time / SDPA", "peak MiB", "peak / SDPA", "estimate MiB", "note"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny run shared by the structure tests: (markdown report, JSON result, the --output file's text)."""
    folder = tmp_path_factory.mktemp("bench")
    report = bench.main([*TINY, "--output", str(folder / "la.md"), "--json", str(folder / "la.json")])
    return report, json.loads((folder / "la.json").read_text()), (folder / "la.md").read_text()


def _table(report: str) -> list[dict[str, str]]:
    """The layer table's rows as {column: cell}."""
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| T | method |"))
    assert [cell.strip() for cell in lines[start].strip("|").split("|")] == COLUMNS
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(COLUMNS, (cell.strip() for cell in line.strip("|").split("|")), strict=True)))
    return rows


def test_every_method_has_a_row_at_every_length(tiny_run):
    report, result, written = tiny_run
    assert written.strip() == report.strip()
    rows = _table(report)
    assert [(int(row["T"]), row["method"]) for row in rows] == [(t, m) for t in LENGTHS for m in bench.METHODS]
    assert [(row["length"], row["method"]) for row in result["layer"]] == [(int(r["T"]), r["method"]) for r in rows]
    by_method = {(row["method"], row["length"]): row for row in result["layer"]}
    for length in LENGTHS:
        for method in ("sdpa", "parallel", "chunked-torch", "recurrent"):  # PyTorch methods run on every machine
            row = by_method[(method, length)]
            assert row["status"] == "ok" and row["seconds"] > 0
            assert row["peak_bytes"] > 0  # measured from the allocator's events, not left empty
        fla = by_method[("chunked-fla", length)]["status"]
        assert fla == "n/a (not installed)" or fla.startswith("n/a (CUDA only")
    assert "hf-icl bench linear-attention --device cpu --lengths 32,64" in report
    assert result["environment"]["torch"] == torch.__version__


def test_triton_row_is_interpreted_or_not_available(tiny_run):
    _, result, _ = tiny_run
    for row in (row for row in result["layer"] if row["method"] == "chunked-triton"):
        if bench._triton_interpreted():  # TRITON_INTERPRET=1: a smoke run, never a speed or a memory figure
            assert row["status"] == "ok" and row["note"] == bench.INTERPRETED_NOTE and row["peak_bytes"] is None
        else:
            assert row["status"].startswith("n/a") and row["seconds"] is None


def test_ratio_column_is_the_ratio_of_the_time_columns(tiny_run):
    report, result, _ = tiny_run
    sdpa = {row["length"]: row["seconds"] for row in result["layer"] if row["method"] == "sdpa"}
    for row in result["layer"]:
        if row["seconds"] is None:
            assert row["time_vs_sdpa"] is None
            continue
        assert row["sdpa_seconds"] == sdpa[row["length"]]
        assert row["time_vs_sdpa"] == pytest.approx(row["seconds"] / sdpa[row["length"]], rel=1e-12)
    for cells in _table(report):
        if cells["fwd+bwd ms"] == "—":
            assert cells["time / SDPA"] == "—" and cells["note"]
            continue
        ratio = float(cells["time / SDPA"].rstrip("×"))
        assert ratio == pytest.approx(float(cells["fwd+bwd ms"]) / float(cells["SDPA ms"]), rel=0.02, abs=0.01)
        if cells["method"] == "sdpa":
            assert cells["time / SDPA"] == "1.00×"


def test_targets_are_computed_from_the_measured_numbers(tiny_run):
    report, result, _ = tiny_run
    decode = {kind: {int(t): s for t, s in times.items()} for kind, times in result["decode"].items()}
    for kind in ("model", "layer"):
        target = result["targets"]["decode"][kind]
        ratio = decode[kind][32] / decode[kind][8]
        assert (target["short"], target["long"]) == (8, 32)
        assert target["ratio"] == pytest.approx(ratio) and target["met"] == (ratio <= bench.DECODE_TARGET)
    growth = {target["method"]: target for target in result["targets"]["growth"]}
    times = {row["length"]: row["seconds"] for row in result["layer"] if row["method"] == "chunked-torch"}
    ratio = times[64] / times[32]
    assert growth["chunked-torch"]["target"] == pytest.approx(bench.GROWTH_SLACK * 2)
    assert growth["chunked-torch"]["ratio"] == pytest.approx(ratio)
    assert growth["chunked-torch"]["met"] == (ratio <= bench.GROWTH_SLACK * 2)
    assert growth["chunked-fla"]["ratio"] is None and growth["chunked-fla"]["met"] is None
    if growth["chunked-triton"]["ratio"] is not None:  # interpreted: a number, but no verdict on it
        assert growth["chunked-triton"]["met"] is None
    verdict = "PASS" if growth["chunked-torch"]["met"] else "MISS"
    assert f"time(T=64) / time(T=32) = {ratio:.1f} (target ≤ 2.5; linear: 2): **{verdict}**" in report
    assert "| 8 |" in report and "| 32 |" in report  # the decode table


def test_target_verdicts_on_given_numbers():
    assert bench.decode_target({100: 1.0, 1000: 5.0, 10000: 1.2})["met"]
    missed = bench.decode_target({100: 1.0, 10000: 1.21})
    assert not missed["met"] and missed["ratio"] == pytest.approx(1.21)

    def rows(method, times, note=""):
        return [{"method": method, "length": t, "seconds": s, "status": "ok", "note": note} for t, s in times.items()]

    lengths = list(bench.GROWTH_LENGTHS)
    assert bench.growth_target(rows("chunked-torch", {1024: 1.0, 16384: 20.0}), "chunked-torch", lengths)["met"]
    assert (
        bench.growth_target(rows("chunked-torch", {1024: 1.0, 16384: 20.5}), "chunked-torch", lengths)["met"] is False
    )
    assert bench.growth_target(rows("chunked-torch", {1024: 1.0}), "chunked-torch", lengths)["ratio"] is None
    interpreted = rows("chunked-triton", {1024: 1.0, 16384: 2.0}, bench.INTERPRETED_NOTE)
    assert bench.growth_target(interpreted, "chunked-triton", lengths)["met"] is None


def test_a_size_over_the_budget_is_reported_as_not_fitting():
    """Between SDPA's estimate and the parallel form's at T = 2048: SDPA runs, the O(T²) form does not."""
    args = bench.parse_args(["--device", "cpu", "--lengths", "2048"])
    shape, itemsize = bench.SHAPES["default"], 4
    sdpa_bytes = bench.estimate_bytes("sdpa", shape, 2048, itemsize, 64) + bench._input_bytes(shape, 2048, itemsize)
    args.memory_budget_gb = 1.5 * sdpa_bytes / bench.GIB
    skipped, runnable = bench._plan(args, shape, 2048)
    assert "sdpa" in runnable
    assert skipped["parallel"]["status"].startswith("does not fit (≈ ")
    assert bench.estimate_bytes("parallel", shape, 2048, itemsize, 64) > 2 * 32 * 2048**2 * 4  # the T² scores


def test_nothing_fitting_still_reports_every_row():
    report = bench.main([*TINY, "--lengths", "64", "--memory-budget-gb", "0.000001"])
    rows = _table(report)
    assert len(rows) == len(bench.METHODS)
    for cells in rows:
        assert cells["fwd+bwd ms"] == "—" and cells["SDPA ms"] == "—"
        if cells["method"] in ("sdpa", "parallel", "chunked-torch", "recurrent"):
            assert cells["note"].startswith("does not fit")


def test_a_method_running_out_of_memory_is_a_row_not_a_crash(monkeypatch):
    forward = bench.method_forward

    def failing(method, chunk_size):
        if method != "parallel":
            return forward(method, chunk_size)

        def out_of_memory(q, k, v):
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")

        return out_of_memory

    monkeypatch.setattr(bench, "method_forward", failing)
    args = bench.parse_args([*TINY, "--lengths", "32"])
    rows = {row["method"]: row for row in bench.measure_length(args, 32)}
    assert rows["parallel"]["status"] == "out of memory" and rows["parallel"]["seconds"] is None
    assert rows["sdpa"]["status"] == rows["chunked-torch"]["status"] == "ok"


def test_auto_backend_stays_torch_on_cpu(monkeypatch):
    """Even under TRITON_INTERPRET=1, "auto" never sends a CPU tensor to the Triton or fla path."""
    assert ops._resolve_backend("auto", "cpu") == "torch"
    assert ops._resolve_backend("triton", "cpu") == "triton"

    def refuse(*args, **kwargs):
        raise AssertionError("backend='auto' took a kernel path on CPU")

    monkeypatch.setattr(ops, "_triton_chunked", refuse)
    monkeypatch.setattr(ops, "_fla_chunked", refuse)
    q, k, v = (torch.randn(1, 2, 40, 8) for _ in range(3))
    auto = ops.causal_linear_attention(q, k, v, backend="auto", chunk_size=16)
    torch.testing.assert_close(auto, ops.causal_linear_attention(q, k, v, backend="torch", chunk_size=16))


def test_cli_help_listing_and_script(monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["bench", "linear-attention", "--help"])
    assert exit_info.value.code == 0
    assert "usage: hf-icl bench linear-attention" in capsys.readouterr().out
    assert cli_main(["bench"]) == 0
    assert "  linear-attention  causal linear attention" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["bench_linear_attention.py", "--help"])
    with pytest.raises(SystemExit):
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert "usage: hf-icl bench linear-attention" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lengths", "0,64"], "expected positive integers"),
        (["--lengths", "1k"], "expected comma-separated integers"),
        (["--growth-lengths", "1024"], "--growth-lengths takes two increasing lengths"),
        (["--warmup", "-1"], "--warmup must be >= 0, got -1"),
        (["--repeats", "0"], "--repeats must be a positive integer, got 0"),
        (["--threads", "0"], "--threads must be a positive integer, got 0"),
        (["--memory-budget-gb", "0"], "--memory-budget-gb must be > 0"),
        (["--shape", "huge"], "invalid choice: 'huge'"),
        (["--chunk-size", "48"], "invalid choice: 48"),
    ],
)
def test_bad_flags_exit_with_a_clear_error(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["bench", "linear-attention", *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
