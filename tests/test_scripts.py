"""The benchmark scripts run end to end on tiny sizes and print their tables."""

import importlib.util
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def load(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_bench_cab_reports_every_length_and_sparsity(tmp_path):
    out = tmp_path / "cab.md"
    argv = ["--lengths", "128", "192", "--heads", "2", "--head-dim", "32", "--block-size", "16"]
    table = load("bench_cab").main([*argv, "--sparsities", "0.5", "0.9", "--repeats", "1", "--output", str(out)])
    assert table.count("dense SDPA") == 2 and table.count("CAB hybrid @ 0.90") == 2
    assert out.read_text().strip() == table.strip()


def test_bench_samplers_reports_every_family():
    from hf_icl.data.tasks import available_tasks

    table = load("bench_samplers").main(["--batch-size", "4", "--n-points", "5", "--n-dims", "3", "--repeats", "1"])
    assert all(f"| {name} |" in table for name in available_tasks())
