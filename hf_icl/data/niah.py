"""Needle-in-a-haystack retrieval prompts as a ``datasets`` builder, with RULER's needle variants.

Each prompt is a haystack of sentences with needle sentences inserted at sentence boundaries, then a
question that the needles answer. Prompts are assembled from token ids of separately tokenised pieces, so
every prompt has exactly the requested number of tokens and the needle and value token spans are exact.

Variants (``variant``; the key-value ones follow RULER's niah tasks, Hsieh et al. 2024, arXiv 2404.06654):

* ``"single"`` (default): the passkey test. One needle, ``"The pass key is {passkey}. Remember it. ..."``,
  at the cell's depth; the answer is the passkey.
* ``"multikey"``: ``n_keys`` needles ``"One of the special magic {kind}s for {key} is: {value}."``, each with
  its own key and value; the question asks for the first key's value, the other needles are distractors.
* ``"multivalue"``: ``n_values`` needles with the same key and different values; the question asks for all
  of them, and the answer is the values joined by ``", "`` in the order the needles appear.

Values (``value_kind``): ``"number"`` (``passkey_digits`` random digits, the default), ``"word"`` (a word of
:data:`WORDS`) or ``"uuid"`` (a UUID4-format string drawn from the cell's seeded generator). Keys are words
of :data:`WORDS`, distinct within a prompt and from its values. ``{kind}`` in a template is ``value_kind``.

Placement: the answer's needle sits at the sentence boundary nearest ``depth`` (as a fraction of the
haystack's tokens); multikey's distractors at seeded random other boundaries (distinct while there are
enough); multivalue's needles at the boundaries nearest ``depth + j * (1 - depth) / n_values`` for
``j = 0 .. n_values - 1``: the first value at ``depth``, the others evenly over the stretch after it to the
haystack's end (at depth 1 they all sit, in order, right before the question). Needles that share a
boundary follow each other. ``(seed, context_length, depth, sample)`` fixes every key, value and position.

The needles (variants, templates, keys and values) are in :mod:`~hf_icl.data.niah_variants`, the haystacks in
:mod:`~hf_icl.data.haystacks`, the tokenizer helpers in :mod:`~hf_icl.data.niah_tokens`; this module puts them
together (:class:`NeedleInAHaystackConfig`, :class:`NeedleInAHaystack`) and is where they are imported from.

Example::

    from hf_icl.data.builders import NeedleInAHaystack, NeedleInAHaystackConfig

    builder = NeedleInAHaystack(tokenizer="gpt2", context_lengths=[1024, 4096],
                                depths=[0.0, 0.5, 1.0], samples_per_cell=5)
    builder.download_and_prepare()
    ds = builder.as_dataset()["test"].with_format("torch")   # input_ids, answer_ids, spans, ...

    # RULER's multi-key task with word values: four needles, the question names one needle's key
    config = NeedleInAHaystackConfig(tokenizer="gpt2", context_lengths=[2048], depths=[0.5],
                                     variant="multikey", value_kind="word", n_keys=4)
    row = next(config.rows())   # row["answer"]: e.g. "lemon"; row["key"]: the word the question names
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, NamedTuple

import datasets

from ..validation import check_choice, check_float, check_int
from . import haystacks, niah_tokens, niah_variants
from .haystacks import BUILTIN_HAYSTACKS, FILLER_SENTENCES, PASSKEY_SENTENCES, load_haystack, split_sentences
from .niah_tokens import Needle, PieceEncoder, load_tokenizer, text_digest, tokenizer_fingerprint
from .niah_variants import (
    DEFAULT_NEEDLE,
    DEFAULT_QUESTION,
    KEY,
    KEY_VALUE_NEEDLE,
    KIND,
    MULTIKEY_QUESTION,
    MULTIVALUE_QUESTION,
    PASSKEY,
    VALUE,
    VALUE_KINDS,
    VARIANT_TEMPLATES,
    VARIANTS,
    WORDS,
    cell_rng,
    distinct_values,
    make_passkey,
    make_value,
)

__all__ = [
    "BUILTIN_HAYSTACKS",
    "DEFAULT_NEEDLE",
    "DEFAULT_QUESTION",
    "FILLER_SENTENCES",
    "KEY",
    "KEY_VALUE_NEEDLE",
    "KIND",
    "MULTIKEY_QUESTION",
    "MULTIVALUE_QUESTION",
    "PASSKEY",
    "PASSKEY_SENTENCES",
    "VALUE",
    "VALUE_KINDS",
    "VARIANTS",
    "VARIANT_TEMPLATES",
    "WORDS",
    "Needle",
    "NeedleInAHaystack",
    "NeedleInAHaystackConfig",
    "PieceEncoder",
    "cell_rng",
    "code_hash",
    "distinct_values",
    "load_haystack",
    "load_tokenizer",
    "make_passkey",
    "make_value",
    "split_sentences",
    "text_digest",
    "tokenizer_fingerprint",
]

_DEFAULT_COUNT = 4  # n_keys and n_values
_DEFAULT_DIGITS = 5  # passkey_digits

# Config fields that enter the fingerprint as they are (tokenizer and haystack enter by content).
_PLAIN_FIELDS = (
    "context_lengths",
    "depths",
    "samples_per_cell",
    "needle_template",
    "passkey_digits",
    "question",
    "seed",
    "variant",
    "value_kind",
    "n_keys",
    "n_values",
)

#: how a multi-value answer joins its values, in the needles' order ("50815, 24562, 42793, 49836")
ANSWER_SEPARATOR = ", "


def code_hash() -> str:
    """Digest of the source of this module and of the modules it assembles prompts from (needles, haystacks,
    tokenizer helpers); part of the cache key so edits to prompt construction invalidate caches."""
    digest = hashlib.sha256()
    for module in (sys.modules[__name__], niah_variants, haystacks, niah_tokens):
        digest.update(inspect.getsource(module).encode())
    return digest.hexdigest()[:16]


class _Draw(NamedTuple):
    """A prompt's random choices: the key the question names ("" for ``single``), the answer's values in needle
    order, the distractors' ``(key, value)`` (multikey) and the index of the first haystack sentence."""

    key: str
    values: list[str]
    distractors: list[tuple[str, str]]
    first: int


@dataclass
class NeedleInAHaystackConfig(datasets.BuilderConfig):
    """What to generate; validated (and the tokenizer loaded) on construction.

    Args:
        tokenizer: a name / local path for ``AutoTokenizer.from_pretrained``, or a fast tokenizer object.
        context_lengths: exact prompt lengths in tokens (question included).
        depths: needle positions as fractions of the haystack, in ``[0, 1]`` (0: first, 1: last).
        samples_per_cell: prompts per (context length, depth) cell, each with its own keys and values.
        needle_template: the needle sentence. ``single``: must contain ``{passkey}``; multikey and multivalue:
            must contain ``{key}`` and ``{value}``. ``{kind}`` becomes ``value_kind``. None: the variant's
            (:data:`VARIANT_TEMPLATES`).
        passkey_digits: digits of the random numbers (``value_kind="number"`` only).
        question: the prompt's suffix, which the answer completes; multikey and multivalue: must contain
            ``{key}``. None: the variant's.
        haystack: ``"filler"`` (built-in varied sentences), ``"passkey"`` (the passkey test's five sentences), a
            text file path or a ``datasets.Dataset``.
        haystack_column: the text column when ``haystack`` is a ``datasets.Dataset``.
        seed: fixes every key, value, needle position and haystack offset.
        variant: ``"single"``, ``"multikey"`` or ``"multivalue"`` (see the module docstring).
        value_kind: ``"number"``, ``"word"`` or ``"uuid"``.
        n_keys: needles of a multikey prompt (the answer's and ``n_keys - 1`` distractors), at least 2.
        n_values: needles (values) of a multivalue prompt, at least 2.

    ``n_keys``, ``n_values`` and ``passkey_digits`` apply to one variant / value kind each; set to anything but
    their default for another one, they raise.
    """

    tokenizer: Any = None
    context_lengths: list[int] = field(default_factory=lambda: [1024, 2048, 4096])
    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    samples_per_cell: int = 5
    needle_template: str | None = None
    passkey_digits: int = _DEFAULT_DIGITS
    question: str | None = None
    haystack: Any = "filler"
    haystack_column: str = "text"
    seed: int = 0
    variant: str = "single"
    value_kind: str = "number"
    n_keys: int = _DEFAULT_COUNT
    n_values: int = _DEFAULT_COUNT

    def __post_init__(self):
        super().__post_init__()
        self._check_fields()
        self._sentences = load_haystack(self.haystack, self.haystack_column)
        self._encoder = PieceEncoder(load_tokenizer(self.tokenizer), (self._sentences[0], self._sentences[-1]))
        self._sentence_ids = self._encoder.pieces([f" {s}" for s in self._sentences])
        self._needle_text = self.needle_template.replace(KIND, self.value_kind)
        self._question_text = self.question.replace(KIND, self.value_kind)
        self._questions: dict[str, list[int]] = {}
        self._question_ids = self.question_ids("")  # the single variant's question (no key)
        self._needles: dict[tuple[str, str], Needle] = {}
        for cell in self.cells():  # tokenises every needle now, so a bad config fails before any writing
            self._check_cell(*cell)

    @property
    def keyed(self) -> bool:
        """Whether the needles carry keys (multikey, multivalue)."""
        return self.variant != "single"

    def _check_fields(self) -> None:
        """Check (and normalise: depths become floats, None templates the variant's) what needs no tokenizer."""
        lengths = _as_list("context_lengths", self.context_lengths)
        self.context_lengths = _distinct(
            "context_lengths", [check_int(f"context_lengths[{i}]", n, low=1) for i, n in enumerate(lengths)]
        )
        depths = _as_list("depths", self.depths)
        self.depths = _distinct(
            "depths", [check_float(f"depths[{i}]", d, low=0.0, high=1.0) for i, d in enumerate(depths)]
        )
        check_int("samples_per_cell", self.samples_per_cell, low=1)
        check_int("passkey_digits", self.passkey_digits, low=1)
        check_int("seed", self.seed, low=0)
        check_choice("variant", self.variant, VARIANTS)
        check_choice("value_kind", self.value_kind, VALUE_KINDS)
        self._check_counts()
        needle, question = VARIANT_TEMPLATES[self.variant]
        self.needle_template = needle if self.needle_template is None else self.needle_template
        self.question = question if self.question is None else self.question
        markers = (KEY, VALUE) if self.keyed else (PASSKEY,)
        if not isinstance(self.needle_template, str) or any(m not in self.needle_template for m in markers):
            raise ValueError(
                f"needle_template must be a string containing {' and '.join(map(repr, markers))} for variant "
                f"{self.variant!r}, got {self.needle_template!r}"
            )
        if not isinstance(self.question, str) or not self.question.strip():
            raise ValueError(f"question must be a non-empty string, got {self.question!r}")
        if self.keyed and KEY not in self.question:
            raise ValueError(
                f"question must contain {KEY!r} (the key asked for) for variant {self.variant!r}, got {self.question!r}"
            )

    def _check_counts(self) -> None:
        """``n_keys`` / ``n_values`` / ``passkey_digits``: in range for their variant / value kind, else default;
        enough distinct keys and values to draw."""
        for name, variant in (("n_keys", "multikey"), ("n_values", "multivalue")):
            value = getattr(self, name)
            if self.variant == variant:
                check_int(name, value, low=2)
            elif value != _DEFAULT_COUNT:
                raise ValueError(
                    f"{name}={value!r} applies only to variant {variant!r}; with variant {self.variant!r} leave it "
                    f"at its default {_DEFAULT_COUNT}"
                )
        if self.value_kind != "number" and self.passkey_digits != _DEFAULT_DIGITS:
            raise ValueError(
                f"passkey_digits={self.passkey_digits!r} applies only to value_kind 'number'; with value_kind "
                f"{self.value_kind!r} leave it at its default {_DEFAULT_DIGITS}"
            )
        if self.variant == "single":
            return
        name, count = ("n_keys", self.n_keys) if self.variant == "multikey" else ("n_values", self.n_values)
        keys = count if self.variant == "multikey" else 1
        words = keys + count if self.value_kind == "word" else keys
        if words > len(WORDS):
            raise ValueError(
                f"{name}={count} is too many: the prompt's {words} keys and word values must be distinct words, "
                f"and WORDS holds {len(WORDS)}"
            )
        numbers = 9 * 10 ** (self.passkey_digits - 1)
        if self.value_kind == "number" and count > numbers:
            raise ValueError(
                f"{name}={count} is too many for passkey_digits={self.passkey_digits}: the values must be distinct, "
                f"and there are {numbers} numbers of {self.passkey_digits} digits"
            )

    def cells(self):
        """``(context_length, depth, sample)`` of every prompt, in row order."""
        for length in self.context_lengths:
            for depth in self.depths:
                for sample in range(self.samples_per_cell):
                    yield length, depth, sample

    def fingerprint(self) -> str:
        """Digest of everything that determines the rows (tokenizer and haystack by content)."""
        fields = {
            "tokenizer": tokenizer_fingerprint(self._encoder.tokenizer),
            "haystack": text_digest("\n".join(self._sentences)),
            **{name: getattr(self, name) for name in _PLAIN_FIELDS},
        }
        return text_digest(json.dumps(fields, sort_keys=True))

    def create_config_id(self, config_kwargs: dict, custom_features=None) -> str:
        """Cache id from :meth:`fingerprint`: tokenizer objects and datasets have no stable hash of their own."""
        return f"{self.name}-{self.fingerprint()}"

    def needle(self, value: str, key: str = "") -> Needle:
        """The needle holding ``value`` (and ``key``, for multikey / multivalue); raises if the value is not an
        exact token span of it."""
        if (key, value) not in self._needles:
            marker = VALUE if self.keyed else PASSKEY
            template = self._needle_text.replace(KEY, key) if self.keyed else self._needle_text
            start = 1 + template.index(marker)
            ids, lo, hi = self._encoder.span(" " + template.replace(marker, value), start, start + len(value))
            if self._encoder.decode(ids[lo:hi]).strip() != value:
                what = "value" if self.keyed else "passkey"
                raise ValueError(
                    f"needle_template {self.needle_template!r}: the {what} {value!r} is not an exact token span "
                    f"under this tokenizer (its tokens decode to {self._encoder.decode(ids[lo:hi])!r}); "
                    f"separate {marker} from neighbouring characters, e.g. with spaces"
                )
            self._needles[key, value] = Needle(ids, lo, hi)
        return self._needles[key, value]

    def question_ids(self, key: str = "") -> list[int]:
        """The question's ids, naming ``key`` (multikey, multivalue; ``""`` for single)."""
        if key not in self._questions:
            self._questions[key] = self._encoder.piece(
                self._question_text.replace(KEY, key) if self.keyed else self._question_text
            )
        return self._questions[key]

    def answer_ids(self, answer: str) -> list[int]:
        """The ids the model should generate after the question; they decode to ``answer``."""
        ids = self._encoder.piece(f" {answer}")
        if self._encoder.decode(ids).strip() != answer:
            what = "passkey" if self.variant == "single" and self.value_kind == "number" else "answer"
            raise ValueError(f"the {what} {answer!r} does not round-trip through the tokenizer: {ids}")
        return ids

    def _draw(self, length: int, depth: float, sample: int) -> _Draw:
        """The prompt's keys, values and first haystack sentence (the haystack cycles on from there)."""
        cell = (self.seed, length, depth, sample)
        first = cell_rng("haystack", *cell).randrange(len(self._sentences))
        if not self.keyed:  # the passkey's draw, as before the variants existed
            return _Draw("", [make_value(cell_rng("passkey", *cell), self.value_kind, self.passkey_digits)], [], first)
        rng = cell_rng("needles", *cell)
        keys = rng.sample(WORDS, self.n_keys if self.variant == "multikey" else 1)
        count = self.n_keys if self.variant == "multikey" else self.n_values
        values = distinct_values(rng, self.value_kind, self.passkey_digits, count, set(keys))
        if self.variant == "multikey":  # the first key is asked for, the others are distractors
            return _Draw(keys[0], values[:1], list(zip(keys[1:], values[1:], strict=True)), first)
        return _Draw(keys[0], values, [], first)

    def _draw_needles(self, draw: _Draw) -> tuple[list[Needle], list[Needle]]:
        """The answer's needles (in order) and the distractors'."""
        answers = [self.needle(value, draw.key) for value in draw.values]
        return answers, [self.needle(value, key) for key, value in draw.distractors]

    def _answer(self, draw: _Draw) -> str:
        return ANSWER_SEPARATOR.join(draw.values)  # single, multikey: the one value

    def _check_cell(self, length: int, depth: float, sample: int) -> None:
        """The cell's values must be locatable and its prompt hold needles, question and one whole sentence."""
        draw = self._draw(length, depth, sample)
        self.answer_ids(self._answer(draw))
        answers, distractors = self._draw_needles(draw)
        needles = answers + distractors
        parts = (
            sum(len(n.ids) for n in needles),
            len(self.question_ids(draw.key)),
            len(self._sentence_ids[draw.first]),
        )
        if length < sum(parts):
            index = self.context_lengths.index(length)
            needle = "needle" if len(needles) == 1 else f"{len(needles)} needles"
            raise ValueError(
                f"context_lengths[{index}]={length} is too short: the prompt at depth {depth}, sample {sample} needs "
                f"at least {sum(parts)} tokens ({needle} {parts[0]} + question {parts[1]} + one haystack sentence "
                f"{parts[2]})"
            )

    def _boundaries(self, bounds: list[int], length: int, depth: float, sample: int, n_distractors: int):
        """Boundary indices (into ``bounds``) of the answer's needles and of the distractors."""
        total = bounds[-1]

        def nearest(fraction: float) -> int:
            return min(range(len(bounds)), key=lambda k: abs(bounds[k] - fraction * total))

        if self.variant == "multivalue":
            answers = [nearest(depth + j * (1 - depth) / self.n_values) for j in range(self.n_values)]
        else:
            answers = [nearest(depth)]
        if not n_distractors:
            return answers, []
        rng = cell_rng("placement", self.seed, length, depth, sample)
        others = [k for k in range(len(bounds)) if k != answers[0]]  # never empty: the haystack has a sentence
        if len(others) >= n_distractors:
            return answers, rng.sample(others, n_distractors)
        return answers, [rng.choice(others) for _ in range(n_distractors)]

    def row(self, length: int, depth: float, sample: int) -> dict[str, Any]:
        """One prompt: haystack, needles at sentence boundaries (the answer's nearest ``depth``), question."""
        draw = self._draw(length, depth, sample)
        answers, distractors = self._draw_needles(draw)
        question = self.question_ids(draw.key)
        needles_length = sum(len(n.ids) for n in answers + distractors)
        sentences = _fill(self._sentence_ids, draw.first, length - needles_length - len(question))
        bounds = [0, *accumulate(len(ids) for ids in sentences)]  # the sentence boundaries, in tokens
        at, elsewhere = self._boundaries(bounds, length, depth, sample, len(distractors))
        # (boundary, order, needle): needles at one boundary follow each other, the answer's first, in order
        placed = sorted(
            [(k, i, n) for i, (k, n) in enumerate(zip(at + elsewhere, answers + distractors, strict=True))],
            key=lambda item: item[:2],
        )
        input_ids: list[int] = []
        starts = [0] * len(placed)
        waiting = iter(placed)
        upcoming = next(waiting, None)
        for k in range(len(bounds)):
            while upcoming is not None and upcoming[0] == k:
                starts[upcoming[1]] = len(input_ids)
                input_ids += upcoming[2].ids
                upcoming = next(waiting, None)
            if k < len(sentences):
                input_ids += sentences[k]
        input_ids += question
        value_starts = [starts[j] + needle.answer_start for j, needle in enumerate(answers)]
        value_ends = [starts[j] + needle.answer_end for j, needle in enumerate(answers)]
        answer = self._answer(draw)
        return {
            "input_ids": input_ids,
            "attention_mask": [1] * len(input_ids),
            "answer": answer,
            "answer_ids": self.answer_ids(answer),
            "needle_start": starts[0],
            "needle_end": starts[len(answers) - 1] + len(answers[-1].ids),
            "answer_start": value_starts[0],
            "answer_end": value_ends[-1],
            "context_length": length,
            "depth": depth,
            "sample": sample,
            "variant": self.variant,
            "value_kind": self.value_kind,
            "key": draw.key,
            "value_starts": value_starts,
            "value_ends": value_ends,
        }

    def rows(self):
        """Every prompt, in :meth:`cells` order (what the builder writes)."""
        for cell in self.cells():
            yield self.row(*cell)


def _as_list(name: str, value: Any) -> list:
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{name} must be a non-empty list, got {value!r}")
    return list(value)


def _distinct(name: str, values: list) -> list:
    if len(set(values)) != len(values):
        raise ValueError(f"{name} must not repeat values, got {values}")
    return values


def _fill(sentence_ids: list[list[int]], first: int, budget: int) -> list[list[int]]:
    """Sentences cycled from ``first`` until ``budget`` tokens; the last one is cut at token level to fit."""
    taken, total, index = [], 0, first
    while total < budget:
        ids = sentence_ids[index % len(sentence_ids)][: budget - total]
        taken.append(ids)
        total += len(ids)
        index += 1
    return taken


class NeedleInAHaystack(datasets.GeneratorBasedBuilder):
    """Needle retrieval prompts over context lengths × depths × samples; one ``test`` split.

    Prompts carry no special tokens (a model that wants a BOS gets it prepended, spans shifted by one).

    Features: ``input_ids`` / ``attention_mask`` (exactly ``context_length`` tokens), ``answer`` (the
    passkey or value; multivalue: the values joined by ``", "`` in needle order), ``answer_ids`` (the tokens
    to generate after the prompt), ``needle_start`` / ``needle_end`` and ``answer_start`` / ``answer_end``
    (token spans ``[start, end)`` in ``input_ids``: of the answer's needle and value; multivalue: from the
    first answer needle / value to the end of the last), ``context_length``, ``depth``, ``sample``,
    ``variant``, ``value_kind``, ``key`` (the key the question names; ``""`` for ``single``) and
    ``value_starts`` / ``value_ends`` (the token span of each of the answer's values, in needle order).
    """

    VERSION = datasets.Version("1.0.0")
    BUILDER_CONFIG_CLASS = NeedleInAHaystackConfig

    def __init__(self, *args, hash: str | None = None, **kwargs):
        super().__init__(*args, hash=hash or code_hash(), **kwargs)

    def _info(self) -> datasets.DatasetInfo:
        index = datasets.Value("int64")
        return datasets.DatasetInfo(
            description="Needle-in-a-haystack retrieval prompts (passkey and RULER's key-value needles)",
            features=datasets.Features(
                {
                    "input_ids": datasets.List(datasets.Value("int32")),
                    "attention_mask": datasets.List(datasets.Value("int8")),
                    "answer": datasets.Value("string"),
                    "answer_ids": datasets.List(datasets.Value("int32")),
                    "needle_start": index,
                    "needle_end": index,
                    "answer_start": index,
                    "answer_end": index,
                    "context_length": index,
                    "depth": datasets.Value("float64"),
                    "sample": index,
                    "variant": datasets.Value("string"),
                    "value_kind": datasets.Value("string"),
                    "key": datasets.Value("string"),
                    "value_starts": datasets.List(index),
                    "value_ends": datasets.List(index),
                }
            ),
        )

    def _split_generators(self, dl_manager):
        return [datasets.SplitGenerator(name=datasets.Split.TEST)]

    def _generate_examples(self):
        yield from enumerate(self.config.rows())
