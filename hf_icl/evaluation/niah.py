"""Needle-in-a-haystack evaluation of dense and CAB attention: ``hf-icl niah``.

For every method (dense ``"sdpa"`` once, then every CAB policy × sparsity) and every prompt of
:class:`~hf_icl.data.niah.NeedleInAHaystackConfig` (passkey, or a RULER-style variant), :func:`run_niah` records

* ``answer_logprob``: the summed log-probability of ``answer_ids`` after the prompt, from one teacher-forced
  forward over prompt + answer;
* ``exact_match``: greedy generation of ``len(answer_ids)`` tokens, decoded and stripped, equals the answer
  (the passkey, or a variant's value(s): see :mod:`hf_icl.data.niah`).
  When the teacher-forced argmax already equals the answer at every answer position, greedy generation would
  produce exactly those tokens (attention is causal, so teacher-forced logits are those of step-by-step
  decoding), so the record takes them without running ``generate``; otherwise ``generate`` runs for the text;
* ``preservation``: the attention-preservation score of the CAB selection on the needle. In every layer and
  head, the dense attention mass that the last ``preservation_queries`` queries of the prompt (default: the
  question's tokens and what the chat template puts after them) put on the needle's tokens
  ``[needle_start, needle_end)``, and the share of it that the selection keeps
  (:func:`~hf_icl.attention.preservation.attention_preservation`), averaged over layers and heads. It is measured
  on the model's own queries and keys and on the selection CAB itself computed during the teacher-forced forward
  (:class:`~hf_icl.evaluation.cab_methods.PreservationProbe`, an observer of
  :func:`~hf_icl.attention.cab.observe_cab_selection`: nothing selects twice) and needs ``O(rows × N)`` memory
  per head. Dense attention preserves everything: 1.0;
* ``achieved_sparsity``: the fraction of causal (query token, key block) pairs the selection dropped in that
  forward, over every query token, head and layer (a key block is causal for a query when it is not after the
  query's own block). Dense: 0.0.

Chat models (``chat_template=True``): each prompt becomes the user message of the tokenizer's chat template,
as ids ``prefix + prompt + suffix`` (the template's text around the message, tokenised on its own), so the
needle span stays exact; the answer follows the template's generation prompt.

Results go to a JSON-lines file, one record per (method, context length, depth, sample), appended and
flushed one at a time; a rerun skips the records already there, so an interrupted run resumes. The
file's first line holds the configuration (model, tokenizer fingerprint, seed, block size, ...); a run
with another configuration refuses the file instead of mixing results.

Example::

    >>> from hf_icl.evaluation.niah import niah_methods
    >>> [m.label for m in niah_methods(["frc", "streaming"], [0.5, 0.9])]
    ['sdpa', 'cab-frc@0.50', 'cab-frc@0.90', 'cab-streaming@0.50', 'cab-streaming@0.90']

    records = run_niah(model, tokenizer, context_lengths=[1024, 2048], depths=[0.0, 0.5, 1.0],
                       samples_per_cell=5, methods=niah_methods(), results_file="niah/results.jsonl")
    write_niah_report(records, "niah")   # summary.csv, summary.md, heatmap_<label>.png, accuracy_vs_sparsity.png

(:func:`~hf_icl.evaluation.niah_report.write_niah_report` and ``summarize_niah`` live in ``niah_report``; the
method grid, the switching between methods and the probes in :mod:`~hf_icl.evaluation.cab_methods`, re-exported
here.)
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..attention.cab import CABParams
from ..validation import check_int
from .cab_methods import (  # noqa: F401  (re-exported: niah's public names from before cab_methods existed)
    DEFAULT_POLICIES,
    DEFAULT_SPARSITIES,
    DENSE,
    METHOD_NAMES,
    SCORED_METHODS,
    NIAHMethod,
    PreservationProbe,
    apply_method,
    check_methods,
    model_device,
    needle_preservation,
    niah_methods,
    observing,
    other_cab_fields,
    restoring_attention,
)

__all__ = [
    "DEFAULT_POLICIES",
    "DEFAULT_SPARSITIES",
    "DENSE",
    "METHOD_NAMES",
    "RECORD_FIELDS",
    "SCORED_METHODS",
    "NIAHMethod",
    "greedy_answer",
    "load_niah_results",
    "needle_preservation",
    "niah_methods",
    "run_niah",
]

#: Every record's fields, in order.
RECORD_FIELDS = (
    "method",
    "policy",
    "score",
    "sparsity",
    "kept_blocks",
    "context_length",
    "depth",
    "sample",
    "answer",
    "generated",
    "exact_match",
    "answer_logprob",
    "preservation",
    "achieved_sparsity",
    "needle_start",
    "needle_end",
    "variant",
    "value_kind",
)
_HEADER = "niah_header"
_FORMAT = 2  # 2: teacher-forced first, achieved_sparsity, chat template and GGUF file in the header
#: Stands for the user message when the chat template is rendered; the text around it wraps every prompt.
_SENTINEL = "HFICLUSERMESSAGESENTINEL"


def _pad_token_id(model, tokenizer) -> int:
    generation = getattr(model, "generation_config", None)
    for candidate in (
        getattr(generation, "pad_token_id", None),
        tokenizer.pad_token_id,
        getattr(generation, "eos_token_id", None),
        tokenizer.eos_token_id,
    ):
        if isinstance(candidate, (list, tuple)):
            candidate = candidate[0] if candidate else None
        if candidate is not None:
            return int(candidate)
    return 0


def _bos_prefix(tokenizer) -> list[int]:
    """``[bos]`` when the tokenizer starts every text with its BOS token (Llama, Mistral, ...), else ``[]``.

    The builder's prompts carry no special tokens; such models get the BOS they were trained with.
    """
    bos = tokenizer.bos_token_id
    if bos is None:
        return []
    return [bos] if tokenizer("a")["input_ids"][:1] == [bos] else []


@dataclass(frozen=True)
class _PromptWrap:
    """Token ids put around every builder prompt: a BOS, or a chat template's text around the user message."""

    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()

    def __call__(self, ids) -> list[int]:
        return [*self.prefix, *ids, *self.suffix]


def _chat_wrap(tokenizer) -> _PromptWrap:
    """The chat template's ids before and after one user message (generation prompt included).

    The template is rendered around a sentinel message and the text on each side tokenised on its own (the
    template writes its own special tokens, so none are added), so the prompt's ids go in unchanged.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "chat_template=True needs a tokenizer with a chat_template, and this one has none; "
            "pass chat_template=False (hf-icl niah --chat-template off)"
        )
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _SENTINEL}], add_generation_prompt=True, tokenize=False
    )
    if not isinstance(text, str) or text.count(_SENTINEL) != 1:
        raise ValueError(
            "the tokenizer's chat_template does not write the user message verbatim exactly once, so prompts cannot "
            "be wrapped in it without re-tokenising them; pass chat_template=False"
        )
    before, after = text.split(_SENTINEL)

    def ids(part: str) -> tuple[int, ...]:
        return tuple(tokenizer(part, add_special_tokens=False)["input_ids"]) if part else ()

    return _PromptWrap(ids(before), ids(after))


def _prompt_wrap(tokenizer, chat_template: bool, answer_prefix: str | None = None) -> _PromptWrap:
    wrap = _chat_wrap(tokenizer) if chat_template else _PromptWrap(tuple(_bos_prefix(tokenizer)))
    if not answer_prefix:
        return wrap
    # the assistant's turn opens with this text, so the passkey is its continuation (chat models otherwise
    # answer in their own words first, and the first answer token is not the passkey's)
    opening = tuple(tokenizer(answer_prefix, add_special_tokens=False)["input_ids"])
    return _PromptWrap(wrap.prefix, wrap.suffix + opening)


def _answer_logits(model, prompt_ids: list[int], answer_ids: list[int]) -> torch.Tensor:
    """``(len(answer_ids), V)`` float32 logits predicting each answer token: one teacher-forced forward."""
    ids = torch.tensor([prompt_ids + answer_ids], device=model_device(model))
    keep = len(answer_ids) + 1
    extra = {"logits_to_keep": keep} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **extra).logits
    return logits[0, -keep:-1].float()


def _answer_logprob(logits: torch.Tensor, answer_ids: list[int]) -> float:
    """Sum of ``log p(answer_ids[t] | prompt, answer_ids[:t])`` from :func:`_answer_logits`."""
    target = torch.tensor(answer_ids, device=logits.device)
    return float(logits.log_softmax(-1).gather(-1, target[:, None]).sum())


def _greedy_is_answer(logits: torch.Tensor, answer_ids: list[int]) -> bool:
    """Whether the teacher-forced argmax is the answer at every position: then greedy decoding yields it."""
    return logits.argmax(-1).tolist() == list(answer_ids)


def greedy_answer(model, tokenizer, prompt_ids: list[int], n_tokens: int, pad_token_id: int) -> str:
    """Greedy-decode ``n_tokens`` after ``prompt_ids`` (one unpadded prompt) and return them as stripped text."""
    ids = torch.tensor([prompt_ids], device=model_device(model))
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n_tokens,
            do_sample=False,
            num_beams=1,
            pad_token_id=pad_token_id,
        )
    return _decoded(tokenizer, out[0, len(prompt_ids) :].tolist())


def _decoded(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True).strip()


def _evaluate_row(
    model, tokenizer, row: dict, method: NIAHMethod, last_rows: int, pad_id: int, wrap: _PromptWrap
) -> dict[str, Any]:
    prompt, answer_ids = wrap(row["input_ids"]), list(row["answer_ids"])
    shift = len(wrap.prefix)
    probe = (
        None
        if method.is_dense
        else PreservationProbe(row["needle_start"] + shift, row["needle_end"] + shift, last_rows, len(prompt))
    )
    with observing(probe):  # the teacher-forced forward is the CAB forward the probe scores
        logits = _answer_logits(model, prompt, answer_ids)
    if _greedy_is_answer(logits, answer_ids):
        generated = _decoded(tokenizer, answer_ids)
    else:
        generated = greedy_answer(model, tokenizer, prompt, len(answer_ids), pad_id)
    return {
        **method.record_fields(),
        "context_length": int(row["context_length"]),
        "depth": float(row["depth"]),
        "sample": int(row["sample"]),
        "answer": row["answer"],
        "generated": generated,
        "exact_match": generated == row["answer"],
        "answer_logprob": _answer_logprob(logits, answer_ids),
        "preservation": 1.0 if probe is None else probe.value(),
        "achieved_sparsity": 0.0 if probe is None else probe.achieved_sparsity(),
        "needle_start": int(row["needle_start"]),
        "needle_end": int(row["needle_end"]),
        "variant": row["variant"],
        "value_kind": row["value_kind"],
    }


# -- the results file ------------------------------------------------------------------------------


def _key(record: dict) -> tuple:
    return record["method"], int(record["context_length"]), float(record["depth"]), int(record["sample"])


def _read_results(path: Path) -> tuple[dict | None, list[dict]]:
    """The header and records of a results file; a last line cut short by a crash is dropped from the file."""
    if not path.exists() or path.stat().st_size == 0:
        return None, []
    data = path.read_bytes()
    if not data.endswith(b"\n"):  # an interrupted write: drop the partial record so appends start on a new line
        data = data[: data.rfind(b"\n") + 1]
        with open(path, "r+b") as handle:
            handle.truncate(len(data))
    lines = [line for line in data.decode("utf-8").splitlines() if line.strip()]
    if not lines:
        return None, []
    parsed = []
    for number, line in enumerate(lines, 1):
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path}: line {number} is not valid JSON ({err}); the results file is corrupted"
            ) from None
    header = parsed[0].get(_HEADER) if isinstance(parsed[0], dict) else None
    if header is None:
        raise ValueError(f"{path} is not an hf-icl niah results file: its first line has no {_HEADER!r} record")
    return header, [_with_prompt_defaults(record) for record in parsed[1:]]


#: the prompt settings a results file written before needle variants existed ran with
_PROMPT_DEFAULTS = {"variant": "single", "value_kind": "number"}


def _with_prompt_defaults(record):
    """A record of a file written before needle variants existed gets their defaults (appended, in order)."""
    if not isinstance(record, dict) or all(name in record for name in _PROMPT_DEFAULTS):
        return record
    return {**record, **{name: value for name, value in _PROMPT_DEFAULTS.items() if name not in record}}


def load_niah_results(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a results file written by :func:`run_niah` (one per key; the header left out)."""
    _, records = _read_results(Path(path))
    return list({_key(record): record for record in records}.values())


def _check_header(path: Path, found: dict, expected: dict) -> None:
    if isinstance(found.get("cab"), dict):
        # a file written before CAB gained a field ran with that field's default
        defaults = other_cab_fields(None)
        found = {**found, "cab": {**{k: v for k, v in defaults.items() if k not in found["cab"]}, **found["cab"]}}
    found = {**_PROMPT_DEFAULTS, **found}  # a file written before needle variants existed: single, number
    if found == expected:
        return
    differences = ", ".join(
        f"{name}: file {found.get(name)!r} vs run {expected.get(name)!r}"
        for name in sorted(set(found) | set(expected))
        if found.get(name) != expected.get(name)
    )
    raise ValueError(
        f"results_file {str(path)!r} holds results of another configuration ({differences}); "
        "use another results file (or output directory) or delete it"
    )


def _haystack_id(haystack) -> str:
    if isinstance(haystack, (str, os.PathLike)):
        return str(haystack)
    return f"{type(haystack).__name__}:{getattr(haystack, '_fingerprint', id(haystack))}"


# -- the run -------------------------------------------------------------------------------------


def run_niah(
    model,
    tokenizer,
    *,
    context_lengths: Sequence[int],
    depths: Sequence[float],
    samples_per_cell: int,
    methods: Sequence[NIAHMethod],
    block_size: int = 16,
    budget: str = "row",
    seed: int = 0,
    results_file: str | os.PathLike | None = None,
    haystack: Any = "filler",
    progress: bool = True,
    preservation_queries: int | None = None,
    chat_template: bool = False,
    gguf_file: str | None = None,
    answer_prefix: str | None = None,
    variant: str = "single",
    value_kind: str = "number",
    n_keys: int = 4,
    n_values: int = 4,
) -> list[dict[str, Any]]:
    """Evaluate ``model`` on needle retrieval under every method; one record per (method, prompt).

    Args:
        model: a causal LM whose attention goes through transformers' ``AttentionInterface`` (GPT-2,
            Llama, ...); its attention implementation, ``cab_*`` config fields and train/eval mode are
            restored afterwards.
        tokenizer: the model's (fast) tokenizer, or its name / local path.
        context_lengths, depths, samples_per_cell, seed, haystack, variant, value_kind, n_keys, n_values: the
            prompts, as in :class:`~hf_icl.data.niah.NeedleInAHaystackConfig` (``variant``: ``"single"`` passkey,
            RULER's ``"multikey"`` or ``"multivalue"``; ``value_kind``: ``"number"``, ``"word"`` or ``"uuid"``).
        methods: what to evaluate, e.g. :func:`niah_methods`.
        block_size, budget: CAB's block size and budget (one of :data:`hf_icl.attention.cab.BUDGETS`), shared
            by every policy.
        results_file: JSON-lines file; records already there are loaded and not recomputed, new ones are
            appended and flushed one by one. It must have been written with the same model name (and
            ``gguf_file``), tokenizer, seed, block size, budget, haystack, variant, value kind (and ``n_keys`` /
            ``n_values`` for their variant), dtype, ``preservation_queries``,
            ``chat_template`` and CAB's other hyperparameters (every other ``cab_*`` field of the model config,
            e.g. ``cab_lambda``, ``cab_sink_blocks``, ``cab_magnitude_fraction``).
        progress: show progress over (method, prompt) pairs with the running accuracy (a bar at a terminal, plain
            lines in a log file).
        preservation_queries: how many final prompt tokens score the preservation (default: the question's
            tokens plus the chat template's after them).
        chat_template: make each prompt the user message of the tokenizer's chat template (see the module
            docstring); the tokenizer must have one. Off: the prompt follows the tokenizer's BOS when it adds
            one to every text.
        answer_prefix: text put after the prompt (after the chat template's generation prompt), which the answer
            continues, e.g. ``"The pass key is"`` for a chat model; it counts among the preservation queries.
        gguf_file: the GGUF file the model was loaded from, if any (``from_pretrained(..., gguf_file=...)``);
            recorded in the results file's header so runs of two files in one directory do not mix.

    Record spans stay those of the builder's rows (the wrap's prefix is not counted). Returns the records of
    this grid (loaded or computed), method by method in prompt order; each has the fields of
    :data:`RECORD_FIELDS`.
    """
    from ..data.niah import NeedleInAHaystackConfig, load_tokenizer, tokenizer_fingerprint
    from ..progress import progress_bar

    methods = check_methods(methods)
    CABParams(block_size=block_size, budget=budget)  # validates both, naming them
    if preservation_queries is not None:
        check_int("preservation_queries", preservation_queries, low=1)
    tokenizer = load_tokenizer(tokenizer)
    config = NeedleInAHaystackConfig(
        tokenizer=tokenizer,
        context_lengths=list(context_lengths),
        depths=list(depths),
        samples_per_cell=samples_per_cell,
        haystack=haystack,
        seed=seed,
        variant=variant,
        value_kind=value_kind,
        n_keys=n_keys,
        n_values=n_values,
    )
    rows = list(config.rows())
    if answer_prefix is not None and (not isinstance(answer_prefix, str) or not answer_prefix.strip()):
        raise ValueError(f"answer_prefix must be a non-empty string or None, got {answer_prefix!r}")
    wrap = _prompt_wrap(tokenizer, bool(chat_template), answer_prefix)

    def last_rows(row) -> int:
        # the question (and the template's suffix) close every prompt: the queries that must find the needle
        # (multikey / multivalue: each question names its own key, so its length varies from row to row)
        return preservation_queries or len(config.question_ids(row["key"])) + len(wrap.suffix)

    longest = max(len(wrap(row["input_ids"])) + len(row["answer_ids"]) for row in rows)
    limit = getattr(model.config, "max_position_embeddings", None)
    if isinstance(limit, int) and longest > limit:
        raise ValueError(
            f"context_lengths: the longest prompt plus its answer has {longest} tokens, more than the model's "
            f"max_position_embeddings={limit}"
        )

    header = {
        "format": _FORMAT,
        "model": str(getattr(model.config, "name_or_path", "") or ""),
        "model_class": type(model).__name__,
        "dtype": str(next(model.parameters()).dtype),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "seed": seed,
        "block_size": block_size,
        "budget": budget,
        "haystack": _haystack_id(haystack),
        "variant": variant,
        "value_kind": value_kind,
        "preservation_queries": preservation_queries,
        "chat_template": bool(chat_template),
        "gguf_file": None if gguf_file is None else os.path.basename(str(gguf_file)),
        "cab": other_cab_fields(model.config),
    }
    if answer_prefix is not None:  # absent otherwise, so results files written before the option still resume
        header["answer_prefix"] = answer_prefix
    if variant == "multikey":
        header["n_keys"] = n_keys
    if variant == "multivalue":
        header["n_values"] = n_values
    done: dict[tuple, dict] = {}
    handle = None
    if results_file is not None:
        path = Path(results_file)
        found, loaded = _read_results(path)
        if found is not None:
            _check_header(path, found, header)
        done = {_key(record): record for record in loaded}
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a", encoding="utf-8")  # closed in the finally below
        if found is None:
            handle.write(json.dumps({_HEADER: header}) + "\n")
            handle.flush()

    pad_id = _pad_token_id(model, tokenizer)
    records: list[dict[str, Any]] = []
    bar = progress_bar(len(methods) * len(rows), "niah", progress)
    try:
        with restoring_attention(model):
            model.eval()
            for method in methods:
                hits = total = 0
                switched = False
                for row in rows:
                    key = (method.label, int(row["context_length"]), float(row["depth"]), int(row["sample"]))
                    record = done.get(key)
                    if record is None:
                        if not switched:
                            apply_method(model, method, block_size, budget)
                            switched = True
                        record = _evaluate_row(model, tokenizer, row, method, last_rows(row), pad_id, wrap)
                        if handle is not None:
                            handle.write(json.dumps(record) + "\n")
                            handle.flush()
                        done[key] = record
                    records.append(record)
                    hits += bool(record["exact_match"])
                    total += 1
                    bar.set_postfix(method=method.label, acc=f"{hits / total:.3f}", refresh=False)
                    bar.update(1)
    finally:
        bar.close()
        if handle is not None:
            handle.close()
    return records
