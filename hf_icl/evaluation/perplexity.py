"""Long-text perplexity under dense and CAB attention: ``hf-icl perplexity``.

Passkey retrieval asks whether a sparse selection keeps one needle; perplexity asks what it costs on every
token of ordinary text. :func:`long_text_perplexity` cuts a text into ``windows`` consecutive, non-overlapping
windows of ``length`` tokens and runs one teacher-forced forward per window and method (dense ``"sdpa"``, then
each CAB policy × sparsity, switched exactly as :func:`~hf_icl.evaluation.niah.run_niah` switches them, by
:func:`~hf_icl.evaluation.cab_methods.apply_method`). Each
window's first token is context only; the other ``length - 1`` are scored, so a record's ``nll`` is the mean
negative log-likelihood over ``windows × (length - 1)`` tokens and ``perplexity = exp(nll)``.

With ``windows > 1`` each record also carries the per-window NLLs (``window_nll``) and 95% intervals over
windows: for the perplexity, ``exp(mean ± t · se)`` of the window NLLs (Student's t with ``windows - 1`` degrees of
freedom); for the ratio to dense, the same over the *paired* per-window differences from dense's NLL (the ratio is
``exp(mean difference)``), which removes what the windows share (how hard each window's text is). Windows are
consecutive stretches of one text, so they are not independent draws of text: read the intervals as the spread
over this text's windows, not over all texts.

The texts. Nothing may be downloaded, so the built-in texts (:func:`builtin_texts`, :func:`load_builtin_text`)
are made from files every CPython install carries, read in a fixed order, so a text is fixed for a given Python
version (results record each text's SHA-256 so runs on different texts, or other Pythons, are not compared
unawares). Each is several hundred thousand characters, over 100k tokens under a GPT-2-like BPE:

* ``python-language-reference``: the Python Language Reference and library topics that ``pydoc`` shows for
  ``help("assert")`` and the like (``pydoc_data.topics``, generated from the official documentation): English
  technical prose with code examples, topics joined in sorted order;
* ``python-stdlib-docstrings``: the docstrings (module, class and function, in source order) of every public
  pure-Python standard-library module, read with :mod:`ast` from the files under
  ``sysconfig.get_paths()["stdlib"]`` in sorted path order, without importing them: English API prose with
  doctest examples. The packages that Linux distributions split off (``test``, ``idlelib``, ``tkinter``,
  ``turtle``, ``turtledemo``, ``lib2to3``, ``ensurepip``, ``distutils``), private modules (``_name``), generated
  ones and the modules of ``python-stdlib-source`` are left out, and the text stops after the docstring that
  brings it to 600,000 characters (from ``abc`` to about ``numbers``);
* ``python-stdlib-source``: Python code, the source files of a fixed list of standard-library modules
  (:data:`STDLIB_SOURCE_MODULES`, e.g. ``argparse``, ``ast``, ``dataclasses``), each after a ``# Lib/<path>``
  line, concatenated in that order.

The needle-in-a-haystack filler is no substitute: it cycles 30 short sentences, which a model copies from the
previous cycle instead of modelling language. Pass any other text (``--text FILE``) to measure on your own.

Example::

    text = load_builtin_text("python-stdlib-source")
    records = long_text_perplexity(model, tokenizer, text, length=4096, windows=4,
                                   methods=niah_methods(["streaming", "hybrid"], [0.5, 0.9]))
    print(perplexity_markdown(records))
"""

from __future__ import annotations

import ast
import functools
import hashlib
import math
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..attention.cab import CABParams
from ..validation import check_int, did_you_mean
from .cab_methods import (
    DENSE,
    NIAHMethod,
    SelectionCounter,
    apply_method,
    check_methods,
    model_device,
    observing,
    restoring_attention,
)
from .intervals import check_confidence, t_interval

__all__ = [
    "BUILTIN_TEXT",
    "STDLIB_SOURCE_MODULES",
    "builtin_text",
    "builtin_texts",
    "load_builtin_text",
    "long_text_perplexity",
    "perplexity_markdown",
    "text_digest",
    "text_windows",
]

#: The name of the default built-in text, :func:`builtin_text` (the Python Language Reference topics).
BUILTIN_TEXT = "python-language-reference"
#: The standard-library modules whose source files make up ``python-stdlib-source``, in order: pure-Python
#: modules present in every CPython from 3.10 on (a module that became a package is read from its ``__init__.py``).
STDLIB_SOURCE_MODULES = (
    "argparse",
    "ast",
    "contextlib",
    "dataclasses",
    "enum",
    "fractions",
    "functools",
    "heapq",
    "json.decoder",
    "json.encoder",
    "pprint",
    "shutil",
    "string",
    "textwrap",
    "tokenize",
)
#: Top-level standard-library entries left out of ``python-stdlib-docstrings``: packages that Linux distributions
#: ship apart from the standard library (or that hold test data), the pydoc topics (the first text) and site dirs.
_DOCSTRING_SKIP = frozenset(
    {
        "test",
        "idlelib",
        "tkinter",
        "turtle.py",
        "turtledemo",
        "lib2to3",
        "ensurepip",
        "distutils",
        "pydoc_data",
        "site-packages",
        "dist-packages",
        "lib-dynload",
    }
)
#: ``python-stdlib-docstrings`` stops after the first docstring that brings it to this many characters.
_DOCSTRING_CHARACTERS = 600_000
#: Rows of logits turned into log-probabilities at once (bounds the float32 copy of a long window's logits).
_CHUNK = 1024


def builtin_text() -> str:
    """Python's own reference topics (``pydoc_data.topics``), sorted by topic name and joined by blank lines."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name].strip() for name in sorted(topics))


def _stdlib() -> Path:
    """The standard library's directory (the base interpreter's, also inside a virtual environment)."""
    return Path(sysconfig.get_paths()["stdlib"])


def _module_file(root: Path, module: str) -> Path | None:
    """``root/a/b.py`` or ``root/a/b/__init__.py`` for the module ``a.b``; None when neither is there."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_name(base.name + ".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _stdlib_source() -> str:
    """``python-stdlib-source``: each module of :data:`STDLIB_SOURCE_MODULES` after a ``# Lib/<path>`` line."""
    root = _stdlib()
    parts = []
    for module in STDLIB_SOURCE_MODULES:
        path = _module_file(root, module)
        if path is not None:
            source = path.read_text(encoding="utf-8").strip("\n")
            parts.append(f"# Lib/{path.relative_to(root).as_posix()}\n{source}\n")
    if not parts:
        raise ValueError(f"no standard-library source found under {root}; pass a text file instead")
    return "\n\n".join(parts)


def _docstrings(tree: ast.AST) -> list[str]:
    """The docstrings of a module and of its classes and functions, in source order (cleaned like ``help``)."""
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                found.append(doc.strip())
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _stdlib_docstrings() -> str:
    """``python-stdlib-docstrings``: the docstrings of the public pure-Python standard library, file by file."""
    root = _stdlib()
    skip_files = {_module_file(root, module) for module in STDLIB_SOURCE_MODULES}
    parts, size = [], 0
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        if size >= _DOCSTRING_CHARACTERS:
            break
        relative = path.relative_to(root).parts
        if relative[0] in _DOCSTRING_SKIP or relative[0].startswith("config-") or path in skip_files:
            continue
        if any(part.startswith("_") and part != "__init__.py" for part in relative) or "tests" in relative:
            continue  # private modules (and __pycache__, _sysconfigdata), test packages
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for doc in _docstrings(tree):
            if size < _DOCSTRING_CHARACTERS:
                parts.append(doc)
                size += len(doc)
    if not parts:
        raise ValueError(f"no standard-library docstrings found under {root}; pass a text file instead")
    return "\n\n".join(parts)


#: built-in text name → the function that builds it
_BUILDERS: dict[str, Callable[[], str]] = {
    BUILTIN_TEXT: builtin_text,
    "python-stdlib-docstrings": _stdlib_docstrings,
    "python-stdlib-source": _stdlib_source,
}


def builtin_texts() -> tuple[str, ...]:
    """The names of the built-in texts (:func:`load_builtin_text`), the default :data:`BUILTIN_TEXT` first."""
    return tuple(_BUILDERS)


@functools.cache
def load_builtin_text(name: str) -> str:
    """The built-in text ``name`` (one of :func:`builtin_texts`), built from files Python ships; nothing is
    downloaded. An unknown name raises ``ValueError`` with the closest names."""
    if name not in _BUILDERS:
        hint = f" ({close})" if (close := did_you_mean(name, _BUILDERS)) else ""
        raise ValueError(f"unknown built-in text {name!r}{hint}; built-in texts: {', '.join(_BUILDERS)}")
    return _BUILDERS[name]()


def text_digest(text: str) -> str:
    """SHA-256 of the text (UTF-8), to tell runs on different texts apart."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def text_windows(tokenizer, text: str, length: int, windows: int) -> list[list[int]]:
    """``windows`` consecutive ``length``-token windows from the start of the text (no special tokens)."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a string, got {type(text).__name__}")
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    needed = length * windows
    if len(ids) < needed:
        raise ValueError(
            f"the text has {len(ids)} tokens, fewer than length × windows = {length} × {windows} = {needed}; "
            "pass a longer text, a smaller length or fewer windows"
        )
    return [ids[i * length : (i + 1) * length] for i in range(windows)]


def _window_nll(model, ids: list[int]) -> float:
    """Summed negative log-likelihood of ``ids[1:]`` given their prefixes: one forward, no cache."""
    input_ids = torch.tensor([ids], device=model_device(model))
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False).logits
    logits, targets = logits[0, :-1], input_ids[0, 1:]  # position t predicts token t + 1
    total = 0.0
    for start in range(0, len(targets), _CHUNK):  # float32 log-softmax a chunk of rows at a time
        rows = logits[start : start + _CHUNK].float()
        total += float(F.cross_entropy(rows, targets[start : start + _CHUNK], reduction="sum"))
    return total


def long_text_perplexity(
    model,
    tokenizer,
    text: str,
    *,
    length: int,
    methods: Sequence[NIAHMethod],
    windows: int = 1,
    block_size: int = 64,
    budget: str = "row",
    progress: bool = True,
    confidence: float = 0.95,
) -> list[dict[str, Any]]:
    """Perplexity of ``model`` on ``windows`` windows of ``length`` tokens of ``text``, for every method.

    Args:
        model: a causal LM whose attention goes through transformers' ``AttentionInterface``; its attention
            implementation, ``cab_*`` config fields and train/eval mode are restored afterwards.
        tokenizer: its tokenizer (the text is tokenised without special tokens).
        text: the text, e.g. :func:`load_builtin_text` or a file's contents; it must hold ``length × windows``
            tokens.
        length: tokens per window (at most the model's ``max_position_embeddings``).
        methods: e.g. :func:`~hf_icl.evaluation.cab_methods.niah_methods` (dense first gives every record its ratio).
        windows: consecutive non-overlapping windows from the start of the text.
        block_size, budget: CAB's block size and budget, shared by every policy; CAB's other hyperparameters
            are the model config's ``cab_*`` fields (``cab_min_seq_len`` is set to 0: every window is sparse).
        confidence: the level of the intervals over windows.

    Returns one record per method, in order: the method's fields (``method, policy, score, sparsity,
    kept_blocks``, see :meth:`~hf_icl.evaluation.cab_methods.NIAHMethod.record_fields`), ``length, windows, tokens``
    (the scored tokens, ``windows × (length - 1)``), ``nll`` (mean per scored token), ``perplexity``
    (``exp(nll)``), ``perplexity_low, perplexity_high`` (``exp`` of the t interval of the mean window NLL),
    ``ratio_to_dense`` (perplexity over the dense method's, ``exp`` of the mean paired window difference),
    ``ratio_low, ratio_high`` (``exp`` of the t interval of those differences), ``achieved_sparsity`` (share of
    causal query-token × key-block pairs CAB dropped, over every window, layer and head; 0 for dense) and
    ``window_nll`` (each window's mean NLL per scored token). The ratio and its interval are None without a
    dense method; the intervals are None for one window.
    """
    from ..progress import progress_bar

    check_int("length", length, low=2)
    check_int("windows", windows, low=1)
    methods = check_methods(methods)
    CABParams(block_size=block_size, budget=budget)  # validates both, naming them
    check_confidence(confidence)
    limit = getattr(model.config, "max_position_embeddings", None)
    if isinstance(limit, int) and length > limit:
        raise ValueError(f"length={length} is more than the model's max_position_embeddings={limit}")
    chunks = text_windows(tokenizer, text, length, windows)

    records: list[dict[str, Any]] = []
    bar = progress_bar(len(methods) * windows, "perplexity", progress)
    try:
        with restoring_attention(model):
            model.eval()
            for method in methods:
                apply_method(model, method, block_size, budget)
                counter = None if method.is_dense else SelectionCounter()
                sums = []
                for ids in chunks:
                    with observing(counter):
                        sums.append(_window_nll(model, ids))
                    bar.update(1)
                records.append(_record(method, length, sums, counter, confidence))
                bar.set_postfix(method=method.label, ppl=f"{records[-1]['perplexity']:.3f}", refresh=False)
    finally:
        bar.close()
    dense = next((r for r in records if r["method"] == DENSE), None)
    for record in records:
        if dense is not None:
            record["ratio_to_dense"] = record["perplexity"] / dense["perplexity"]
            differences = [a - b for a, b in zip(record["window_nll"], dense["window_nll"], strict=True)]
            record["ratio_low"], record["ratio_high"] = _exp_interval(differences, confidence)
    return records


def _exp_interval(values: list[float], confidence: float) -> tuple[float | None, float | None]:
    """``exp`` of the t interval of the mean of ``values``; ``(None, None)`` for one value."""
    interval = t_interval(values, confidence)
    return (None, None) if interval is None else (math.exp(interval[0]), math.exp(interval[1]))


def _record(method: NIAHMethod, length: int, sums: list[float], counter, confidence: float) -> dict[str, Any]:
    windows = len(sums)
    tokens = windows * (length - 1)
    nll = math.fsum(sums) / tokens
    window_nll = [total / (length - 1) for total in sums]
    low, high = _exp_interval(window_nll, confidence)
    return {
        **method.record_fields(),
        "length": length,
        "windows": windows,
        "tokens": tokens,
        "nll": nll,
        "perplexity": math.exp(nll),
        "perplexity_low": low,
        "perplexity_high": high,
        "ratio_to_dense": None,
        "ratio_low": None,
        "ratio_high": None,
        "achieved_sparsity": 0.0 if counter is None else counter.achieved_sparsity(),
        "window_nll": window_nll,
    }


def _bracket(value: float | None, low: float | None, high: float | None, spec: str) -> str:
    """``value [low, high]``, ``value`` without an interval, ``–`` without a value."""
    if value is None:
        return "–"
    if low is None or high is None:
        return format(value, spec)
    return f"{value:{spec}} [{low:{spec}}, {high:{spec}}]"


def perplexity_markdown(records: Sequence[dict[str, Any]], confidence: float = 0.95) -> str:
    """A markdown table: method, budget (sparsity or key blocks), achieved sparsity, perplexity and ratio to dense,
    each with its interval over windows when there is one (``confidence``: the level the records were made at, for
    the note)."""
    lines = [
        "| method | budget | achieved sparsity | perplexity [low, high] | ratio to dense [low, high] |",
        "|:---|---:|---:|---:|---:|",
    ]
    for r in records:
        ppl = _bracket(r["perplexity"], r.get("perplexity_low"), r.get("perplexity_high"), ".4f")
        ratio = _bracket(r["ratio_to_dense"], r.get("ratio_low"), r.get("ratio_high"), ".4f")
        budget = f"{r['kept_blocks']} blocks" if r.get("kept_blocks") is not None else f"{r['sparsity']:.2f}"
        lines.append(f"| {r['method']} | {budget} | {r['achieved_sparsity']:.3f} | {ppl} | {ratio} |")
    first = records[0] if records else {"windows": 0, "length": 0, "tokens": 0}
    note = (
        f"{first['windows']} window(s) of {first['length']} tokens, {first['tokens']} scored tokens per method; "
        "ratio to dense = perplexity / dense perplexity."
    )
    if first["windows"] > 1:
        note += (
            f" Intervals: {100 * confidence:g}% Student-t over the {first['windows']} windows of the mean window "
            "NLL (perplexity) and of its paired difference from dense (ratio), exponentiated."
        )
    return "\n".join(lines) + "\n\n" + note + "\n"
