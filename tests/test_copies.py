"""Repetition kept on purpose, guarded. A comment above a method's (or a module-level function's) ``def``::

    # Copied from GPT2ForInContextRegression.forward
    #   (signature: xs, ys, loss_positions; Args: loss_positions)

(above the method's decorators, if any) says that the listed parameters (name, kind, default, annotation) and the
listed ``Args:`` entries of its docstring (as :func:`inspect.getdoc` gives it, so one that a decorator sets counts)
are those of ``hf_icl.modeling.GPT2ForInContextRegression.forward``, word for word: transformers' "Copied from"
habit, for the parts of the ICL models' ``forward`` that each model file repeats so that it reads on its own."""

from __future__ import annotations

import ast
import inspect
import re

import pytest
from repo_paths import REPO

import hf_icl.modeling

ROOT = REPO / "hf_icl"
MARKER = re.compile(r"^\s*# Copied from (?P<target>[\w.]+)\s*$")


def args_entries(function) -> dict[str, str]:
    """The ``Args:`` entries of a Google-style docstring, each joined into one line."""
    doc = inspect.getdoc(function) or ""
    section = re.search(r"^Args:\n((?:[ \t]+.*\n?|\n)*)", doc, re.M)
    entries: dict[str, str] = {}
    current = None
    for line in (section.group(1) if section else "").splitlines():
        start = re.match(r"^    (\w+): (.*)$", line)
        if start:
            current = start.group(1)
            entries[current] = start.group(2).strip()
        elif current and line.strip():
            entries[current] += " " + line.strip()
    return entries


def parameters(function) -> dict[str, tuple]:
    signature = inspect.signature(function)
    return {name: (p.kind, p.default, str(p.annotation)) for name, p in signature.parameters.items()}


def differences(copy, original, spec: str) -> list[str]:
    """What ``copy`` does not share with ``original`` of what ``spec`` (``signature: ...; Args: ...``) lists."""
    found = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        kind, _, listed = part.partition(":")
        names = [n.strip() for n in listed.split(",") if n.strip()]
        if kind.strip() == "signature":
            ours, theirs = parameters(copy), parameters(original)
        elif kind.strip() == "Args":
            ours, theirs = args_entries(copy), args_entries(original)
        else:
            found.append(f"unknown part {part!r} (signature: or Args:)")
            continue
        found += [
            f"{kind.strip()} {n}: {ours.get(n)!r} vs {theirs.get(n)!r}" for n in names if ours.get(n) != theirs.get(n)
        ]
    return found


def markers() -> list[tuple[str, str, str, str]]:
    """``(file:line, Class.method or function marked, target, spec)`` of every marker in the package: the target on
    the marker's line, the spec in parentheses on the comment lines between it and the method (its decorators, then
    ``def``)."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        # first line of each method or module-level function (its first decorator's, if any) -> Class.method / name
        methods = {first_line(item): item.name for item in tree.body if hasattr(item, "args")}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                methods.update(
                    {first_line(item): f"{node.name}.{item.name}" for item in node.body if hasattr(item, "args")}
                )
        for number, line in enumerate(lines, start=1):
            match = MARKER.match(line)
            if not match:
                continue
            following = number
            while lines[following].strip().startswith("#"):
                following += 1
            spec = " ".join(lines[i].strip().lstrip("#").strip() for i in range(number, following))
            where = f"{path.relative_to(ROOT.parent)}:{number}"
            found.append((where, methods.get(following + 1, ""), match.group("target"), spec.strip("()")))
    return found


def first_line(function: ast.FunctionDef) -> int:
    return min([function.lineno, *(decorator.lineno for decorator in function.decorator_list)])


def resolve(qualified: str):
    """``Class.method`` or a function's name, from :mod:`hf_icl.modeling`."""
    owner, _, name = qualified.rpartition(".")
    return getattr(getattr(hf_icl.modeling, owner) if owner else hf_icl.modeling, name)


def test_the_models_mark_their_shared_forward_parts():
    marked = {owner for _, owner, _, _ in markers()}
    assert {"SGPTForInContextRegression.forward", "LinearGPTForInContextRegression.forward"} <= marked
    assert len(marked) >= 5


@pytest.mark.parametrize(("where", "owner", "target", "spec"), markers(), ids=lambda v: str(v).split("/")[-1])
def test_copies_agree(where, owner, target, spec):
    assert owner, f"{where}: the marker must stand right above a method's (or a function's) def or decorators"
    assert spec, f"{where}: the marker lists nothing to compare"
    assert not differences(resolve(owner), resolve(target), spec), where


def test_the_check_sees_a_difference():
    def original(xs, ys, loss_positions=None, check_inputs=True):
        """Predict.

        Args:
            loss_positions: the positions in the loss.
            check_inputs: check the values.
        """

    def copy(xs, ys, loss_positions=(), check_inputs=True):
        """Predict.

        Args:
            loss_positions: the positions in the
                loss.
            check_inputs: check the values, twice.
        """

    assert differences(copy, original, "Args: loss_positions") == []  # a line break is not a difference
    assert differences(copy, original, "signature: xs, ys, check_inputs") == []
    assert len(differences(copy, original, "signature: loss_positions; Args: check_inputs")) == 2
