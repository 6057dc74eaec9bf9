"""Core imports stay light: no datasets / evaluate / sklearn / xgboost at import time."""

import subprocess
import sys

HEAVY = ("datasets", "evaluate", "sklearn", "xgboost")


def test_core_imports_do_not_pull_heavy_dependencies():
    code = (
        "import sys, hf_icl, hf_icl.data, hf_icl.data.tasks, hf_icl.estimators, hf_icl.evaluation, hf_icl.cli\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "", f"imported at import time: {result.stdout.strip()}"
