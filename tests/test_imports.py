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


def imported_hf_icl_modules(path, package_root) -> list[str]:
    """Absolute names of the hf_icl modules a source file imports (relative imports resolved)."""
    import ast

    package = ("hf_icl", *path.relative_to(package_root).parts[:-1])
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            names.append(".".join((*base, *(node.module or "").split("."))).strip("."))
    return [name for name in names if name.startswith("hf_icl.")]


def test_layers_import_only_downward():
    # kernels → attention → modeling → training / evaluation → reproduce → cli: no layer imports one above it
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "hf_icl"
    above = {
        "kernels": {"attention", "modeling", "training", "evaluation", "reproduce", "cli", "quickstart"},
        "attention": {"modeling", "training", "evaluation", "reproduce", "cli", "quickstart"},
        "modeling": {"training", "evaluation", "reproduce", "cli", "quickstart"},
        "training": {"reproduce", "cli", "quickstart"},
        "evaluation": {"reproduce", "cli", "quickstart"},
        "reproduce": {"cli", "quickstart"},
    }
    assert all(any((root / layer).rglob("*.py")) for layer in above)  # the walk sees the real package
    offences = [
        f"{path.relative_to(root)} imports {name}"
        for layer, forbidden in above.items()
        for path in (root / layer).rglob("*.py")
        for name in imported_hf_icl_modules(path, root)
        if name.split(".")[1] in forbidden
    ]
    assert not offences, offences
