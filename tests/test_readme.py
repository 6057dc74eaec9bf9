"""Every Python snippet of the README runs offline as written, from a fresh folder beside the repository's models/,
prints something, and writes only under outputs/ (or a temporary folder)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from repo_paths import REPO

SNIPPETS = re.findall(r"^```python\n(.*?)^```$", (REPO / "README.md").read_text(), re.S | re.M)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A user's folder: models/ beside it and the output of `make quickstart` (a short run of it) in outputs/."""
    root = tmp_path_factory.mktemp("readme")
    (root / "models").symlink_to(REPO / "models")
    env = environment(root)
    quickstart = [sys.executable, "-m", "hf_icl.cli", "quickstart", "--max-steps", "5", "--n-prompts", "32"]
    subprocess.run(quickstart, cwd=root, env=env, capture_output=True, check=False, timeout=600)
    assert (root / "outputs" / "quickstart" / "config.json").is_file()
    return root


def environment(root) -> dict:
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cache = {"HF_DATASETS_CACHE": str(root / ".cache"), "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    return {**os.environ, **offline, **cache, "PYTHONPATH": str(REPO)}


def test_the_readme_has_its_snippets():
    assert len(SNIPPETS) >= 10


@pytest.mark.parametrize("number", range(len(SNIPPETS)), ids=lambda n: f"snippet-{n + 1}")
def test_a_readme_snippet_runs_offline_prints_and_writes_only_outputs(number, workdir):
    before = {path.name for path in workdir.iterdir()}
    result = subprocess.run(
        [sys.executable, "-c", SNIPPETS[number]],
        cwd=workdir,
        env=environment(workdir),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip(), "the snippet prints nothing"
    new = {path.name for path in workdir.iterdir()} - before - {"outputs", ".cache"}
    assert not new, f"the snippet wrote {sorted(new)} outside outputs/"
