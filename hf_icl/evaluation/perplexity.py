"""Long-text perplexity under dense and CAB attention: ``hf-icl perplexity``.

Passkey retrieval asks whether a sparse selection keeps one needle; perplexity asks what it costs on every
token of ordinary text. :func:`long_text_perplexity` cuts a text into ``windows`` consecutive, non-overlapping
windows of ``length`` tokens and runs one teacher-forced forward per window and method (dense ``"sdpa"``, then
each CAB policy × sparsity, switched exactly as :func:`~hf_icl.evaluation.niah.run_niah` switches them). Each
window's first token is context only; the other ``length - 1`` are scored, so a record's ``nll`` is the mean
negative log-likelihood over ``windows × (length - 1)`` tokens and ``perplexity = exp(nll)``.

The text. Nothing may be downloaded, so the built-in text (:func:`builtin_text`) is one every Python carries:
the Python Language Reference and library topics that ``pydoc`` shows for ``help("assert")`` and the like
(``pydoc_data.topics``: about 460k characters of English technical prose with code examples, generated from
the official documentation). Topics are joined in sorted order, so the text is fixed for a given Python
version; results record its SHA-256 so runs on other texts (or other Pythons) are not compared unawares. The
needle-in-a-haystack filler is no substitute: it cycles 30 short sentences, which a model copies from the
previous cycle instead of modelling language. Pass any other text (``--text FILE``) to measure on your own.

Example::

    records = long_text_perplexity(model, tokenizer, builtin_text(), length=4096, windows=2,
                                   methods=niah_methods(["streaming", "hybrid"], [0.5, 0.9]))
    print(perplexity_markdown(records))
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..attention.cab import CABParams
from ..validation import check_int
from .niah import NIAHMethod, _check_methods, _model_device, _probing, _restoring, _SparsityCounter, _use_method

__all__ = ["BUILTIN_TEXT", "builtin_text", "long_text_perplexity", "perplexity_markdown", "text_digest", "text_windows"]

#: The name of the built-in text in results (``--text`` unset).
BUILTIN_TEXT = "python-language-reference"
#: Rows of logits turned into log-probabilities at once (bounds the float32 copy of a long window's logits).
_CHUNK = 1024


def builtin_text() -> str:
    """Python's own reference topics (``pydoc_data.topics``), sorted by topic name and joined by blank lines."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name].strip() for name in sorted(topics))


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
    input_ids = torch.tensor([ids], device=_model_device(model))
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
) -> list[dict[str, Any]]:
    """Perplexity of ``model`` on ``windows`` windows of ``length`` tokens of ``text``, for every method.

    Args:
        model: a causal LM whose attention goes through transformers' ``AttentionInterface``; its attention
            implementation, ``cab_*`` config fields and train/eval mode are restored afterwards.
        tokenizer: its tokenizer (the text is tokenised without special tokens).
        text: the text, e.g. :func:`builtin_text` or a file's contents; it must hold ``length × windows`` tokens.
        length: tokens per window (at most the model's ``max_position_embeddings``).
        methods: e.g. :func:`~hf_icl.evaluation.niah.niah_methods` (dense first gives every record its ratio).
        windows: consecutive non-overlapping windows from the start of the text.
        block_size, budget: CAB's block size and budget, shared by every policy; CAB's other hyperparameters
            are the model config's ``cab_*`` fields (``cab_min_seq_len`` is set to 0: every window is sparse).

    Returns one record per method, in order: ``method, policy, sparsity, length, windows, tokens`` (the scored
    tokens, ``windows × (length - 1)``), ``nll`` (mean per scored token), ``perplexity`` (``exp(nll)``),
    ``ratio_to_dense`` (perplexity over the dense method's; None without a dense method) and
    ``achieved_sparsity`` (share of causal query-token × key-block pairs CAB dropped, over every window, layer
    and head; 0 for dense).
    """
    from tqdm.auto import tqdm

    check_int("length", length, low=2)
    check_int("windows", windows, low=1)
    methods = _check_methods(methods)
    CABParams(block_size=block_size, budget=budget)  # validates both, naming them
    limit = getattr(model.config, "max_position_embeddings", None)
    if isinstance(limit, int) and length > limit:
        raise ValueError(f"length={length} is more than the model's max_position_embeddings={limit}")
    chunks = text_windows(tokenizer, text, length, windows)

    records: list[dict[str, Any]] = []
    bar = tqdm(total=len(methods) * windows, desc="perplexity", disable=not progress, dynamic_ncols=True)
    try:
        with _restoring(model):
            model.eval()
            for method in methods:
                _use_method(model, method, block_size, budget)
                counter = None if method.is_dense else _SparsityCounter()
                nll = 0.0
                for ids in chunks:
                    with _probing(counter):
                        nll += _window_nll(model, ids)
                    bar.update(1)
                records.append(_record(method, length, windows, nll, counter))
                bar.set_postfix(method=method.label, ppl=f"{records[-1]['perplexity']:.3f}", refresh=False)
    finally:
        bar.close()
    dense = next((r["perplexity"] for r in records if r["method"] == "sdpa"), None)
    for record in records:
        record["ratio_to_dense"] = None if dense is None else record["perplexity"] / dense
    return records


def _record(method: NIAHMethod, length: int, windows: int, nll_sum: float, counter) -> dict[str, Any]:
    tokens = windows * (length - 1)
    nll = nll_sum / tokens
    return {
        **method.record_fields(),
        "length": length,
        "windows": windows,
        "tokens": tokens,
        "nll": nll,
        "perplexity": math.exp(nll),
        "ratio_to_dense": None,
        "achieved_sparsity": 0.0 if counter is None else counter.achieved_sparsity(),
    }


def perplexity_markdown(records: Sequence[dict[str, Any]]) -> str:
    """A markdown table: method, sparsity (requested and achieved), perplexity, ratio to dense."""
    lines = [
        "| method | budget | achieved sparsity | perplexity | ratio to dense |",
        "|:---|---:|---:|---:|---:|",
    ]
    for r in records:
        ratio = "–" if r["ratio_to_dense"] is None else f"{r['ratio_to_dense']:.4f}"
        budget = f"{r['kept_blocks']} blocks" if r.get("kept_blocks") is not None else f"{r['sparsity']:.2f}"
        lines.append(
            f"| {r['method']} | {budget} | {r['achieved_sparsity']:.3f} | {r['perplexity']:.4f} | {ratio} |"
        )
    first = records[0] if records else {"windows": 0, "length": 0, "tokens": 0}
    note = (
        f"{first['windows']} window(s) of {first['length']} tokens, {first['tokens']} scored tokens per method; "
        "ratio to dense = perplexity / dense perplexity."
    )
    return "\n".join(lines) + "\n\n" + note + "\n"
