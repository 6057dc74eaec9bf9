"""Core imports stay light: no datasets / evaluate / sklearn / xgboost at import time."""

import subprocess
import sys

from repo_paths import REPO

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
    # kernels, similarity → attention → modeling → training / evaluation → reproduce → cli: none imports a layer above

    root = REPO / "hf_icl"
    above = {
        "kernels": {"attention", "modeling", "training", "evaluation", "reproduce", "cli", "quickstart"},
        "similarity": {"attention", "modeling", "training", "evaluation", "reproduce", "cli", "quickstart"},
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


# -- the import graph: every import statement (module level and inside functions) between hf_icl's modules ------------
def import_graph() -> dict[str, list[tuple[str, list[str]]]]:
    """``{module: [(imported module, [imported names]), ...]}`` over ``hf_icl`` and ``hf_icl_cli``; ``from PKG import
    sub`` counts as an import of ``PKG.sub`` when that is a module, else of ``PKG`` (its ``__init__``)."""
    import ast

    root = REPO
    modules = {}
    for top in ("hf_icl", "hf_icl_cli"):
        for path in (root / top).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    graph = {}
    for name, (path, is_package) in modules.items():
        edges = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges += [(alias.name, []) for alias in node.names if alias.name.split(".")[0] in modules]
            elif isinstance(node, ast.ImportFrom):
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1] if node.level else []
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                if target.split(".")[0] not in ("hf_icl", "hf_icl_cli"):
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    edges.append((sub, []) if sub in modules else (target, [alias.name]))
        graph[name] = [(target, names) for target, names in edges if target in modules]
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The components of more than one module (each one holds an import cycle), by Tarjan's algorithm."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_strongly_connected_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    """Not even through an import inside a function: a cycle means two modules that cannot be read one at a time."""
    graph = {name: {target for target, _ in edges} for name, edges in import_graph().items()}
    assert graph["hf_icl.training.trainer"], "the walk sees the real imports"
    assert strongly_connected(graph) == []


def test_no_private_name_is_imported_from_another_module():
    offences = [
        f"{name} imports {hidden} from {target}"
        for name, edges in import_graph().items()
        for target, names in edges
        for hidden in names
        if hidden.startswith("_") and not hidden.startswith("__")
    ]
    assert not offences, offences
