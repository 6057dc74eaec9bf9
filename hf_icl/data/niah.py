"""Needle-in-a-haystack passkey prompts as a ``datasets`` builder.

Each prompt is a haystack of sentences with a needle sentence (holding a random passkey) inserted
at a requested depth, then a question that the passkey answers. Prompts are assembled from token
ids of separately tokenised pieces, so every prompt has exactly the requested number of tokens and
the needle and passkey token spans are exact.

Example::

    from hf_icl.data.builders import NeedleInAHaystack

    builder = NeedleInAHaystack(tokenizer="gpt2", context_lengths=[1024, 4096],
                                depths=[0.0, 0.5, 1.0], samples_per_cell=5)
    builder.download_and_prepare()
    ds = builder.as_dataset()["test"].with_format("torch")   # input_ids, answer_ids, spans, ...
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import random
import re
import sys
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, NamedTuple

import datasets

from ..validation import check_choice, check_float, check_int

PASSKEY = "{passkey}"
DEFAULT_NEEDLE = "The pass key is {passkey}. Remember it. {passkey} is the pass key."
DEFAULT_QUESTION = " What is the pass key? The pass key is"

#: The passkey test's own haystack (Mohtashami & Jaggi, Landmark Attention): five sentences, repeated. Small
#: pretrained models (SmolLM2-135M) retrieve from it densely; varied filler prose distracts them.
PASSKEY_SENTENCES = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
)
#: haystacks built in, by name
BUILTIN_HAYSTACKS = ("filler", "passkey")

# Neutral sentences with nothing to remember, in the spirit of the passkey test's "The grass is green."
FILLER_SENTENCES = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
    "The clouds drift slowly across the sky.",
    "A light wind moves through the trees.",
    "The river flows past the old stone bridge.",
    "Birds sing in the early morning.",
    "The hills are quiet in the evening.",
    "Rain falls softly on the roof.",
    "The road winds through the valley.",
    "Leaves turn brown in the autumn.",
    "The lake is calm and still.",
    "Snow covers the mountain tops in winter.",
    "The field is full of tall grass.",
    "A small boat rests on the shore.",
    "The stars come out at night.",
    "The moon rises over the forest.",
    "Flowers open when the sun is warm.",
    "The path leads down to the sea.",
    "Waves roll gently onto the sand.",
    "The air smells of fresh bread.",
    "A dog sleeps in the shade of a tree.",
    "The garden gate is painted white.",
    "Children play in the park after school.",
    "The clock on the wall ticks quietly.",
    "A cup of tea cools on the table.",
    "The wind carries the sound of bells.",
    "The day ends with a golden sunset.",
)

# Config fields that enter the fingerprint as they are (tokenizer and haystack enter by content).
_PLAIN_FIELDS = (
    "context_lengths",
    "depths",
    "samples_per_cell",
    "needle_template",
    "passkey_digits",
    "question",
    "seed",
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def code_hash() -> str:
    """Digest of this module's source; part of the cache key so edits to prompt construction invalidate caches."""
    return hashlib.sha256(inspect.getsource(sys.modules[__name__]).encode()).hexdigest()[:16]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def split_sentences(text: str) -> list[str]:
    """Split on ``.``, ``!`` or ``?`` followed by whitespace; whitespace inside a sentence becomes one space."""
    return [" ".join(part.split()) for part in _SENTENCE_END.split(text) if part.strip()]


def cell_rng(purpose: str, seed: int, context_length: int, depth: float, sample: int) -> random.Random:
    """A generator of its own for every cell and purpose, so cells are independent and reproducible."""
    return random.Random(f"{purpose}/{seed}/{context_length}/{depth!r}/{sample}")  # str seeds: same in every process


def make_passkey(rng: random.Random, digits: int) -> str:
    """``digits`` random digits, the first nonzero (so the passkey has exactly that many digits)."""
    return str(rng.randint(1, 9)) + "".join(str(rng.randint(0, 9)) for _ in range(digits - 1))


def tokenizer_fingerprint(tokenizer) -> str:
    """Digest of the tokenizer's full serialised state: equal fingerprints tokenise identically."""
    return _digest(type(tokenizer).__name__ + tokenizer.backend_tokenizer.to_str())


def load_tokenizer(tokenizer):
    """The tokenizer object for a name / local path (loaded here, on first use) or the object itself."""
    from transformers import AutoTokenizer, PreTrainedTokenizerBase

    if isinstance(tokenizer, (str, os.PathLike)) and str(tokenizer):
        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    elif not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise ValueError(f"tokenizer must be a name, a local path or a PreTrainedTokenizerBase, got {tokenizer!r}")
    if not getattr(tokenizer, "is_fast", False):
        # Offsets locate the passkey inside the needle; only tokenizers-backed tokenizers give them.
        raise ValueError(f"tokenizer must be a fast (tokenizers-backed) tokenizer, got {type(tokenizer).__name__}")
    return tokenizer


def load_haystack(haystack, column: str | None) -> list[str]:
    """The haystack's sentences, from ``"filler"``, a text file or a text column of a ``datasets.Dataset``."""
    if isinstance(haystack, datasets.Dataset):
        check_choice("haystack_column", column, haystack.column_names)
        texts = haystack[column]
        bad = next((text for text in texts if not isinstance(text, str)), None)
        if bad is not None:
            raise ValueError(f"haystack_column {column!r} must hold strings, got {bad!r}")
    elif haystack == "filler":
        texts = list(FILLER_SENTENCES)
    elif haystack == "passkey":
        texts = list(PASSKEY_SENTENCES)
    elif isinstance(haystack, (str, os.PathLike)) and os.path.isfile(haystack):
        with open(haystack, encoding="utf-8") as handle:
            texts = [handle.read()]
    else:
        raise ValueError(
            f"haystack must be 'filler', 'passkey', the path of an existing text file or a datasets.Dataset, "
            f"got {haystack!r}"
        )
    sentences = [sentence for text in texts for sentence in split_sentences(text)]
    if not sentences:
        raise ValueError(f"haystack {haystack!r} holds no sentences")
    return sentences


class Needle(NamedTuple):
    """A needle's token ids and the passkey's token span ``[start, end)`` within them."""

    ids: list[int]
    answer_start: int
    answer_end: int


class _Encoder:
    """Tokenises prompt pieces the same way everywhere: no special tokens, one rule for the joining space.

    Pieces are written with the space that joins them to the previous text (``" The sky is blue."``).
    Tokenizers that write that space themselves (SentencePiece's ``▁`` prefix) get the piece without it,
    so that piece by piece concatenation matches how the joined text tokenises.
    """

    def __init__(self, tokenizer, probe: tuple[str, str]):
        self.tokenizer = tokenizer
        first, second = probe
        head, joined = self._ids(first), self._ids(f"{first} {second}")
        self.implicit_space = joined != head + self._ids(f" {second}") and joined == head + self._ids(second)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _text(self, piece: str) -> str:
        return piece[1:] if self.implicit_space and piece.startswith(" ") else piece

    def pieces(self, pieces: list[str]) -> list[list[int]]:
        return self.tokenizer([self._text(p) for p in pieces], add_special_tokens=False)["input_ids"]

    def piece(self, piece: str) -> list[int]:
        return self._ids(self._text(piece))

    def span(self, piece: str, char_start: int, char_end: int) -> tuple[list[int], int, int]:
        """The piece's ids and the token span that covers its characters ``[char_start, char_end)``."""
        shift = len(piece) - len(self._text(piece))
        encoded = self.tokenizer(self._text(piece), add_special_tokens=False, return_offsets_mapping=True)
        hits = [
            i
            for i, (lo, hi) in enumerate(encoded["offset_mapping"])
            if lo < hi and hi > char_start - shift and lo < char_end - shift
        ]
        return encoded["input_ids"], (hits[0] if hits else 0), (hits[-1] + 1 if hits else 0)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


@dataclass
class NeedleInAHaystackConfig(datasets.BuilderConfig):
    """What to generate; validated (and the tokenizer loaded) on construction.

    Args:
        tokenizer: a name / local path for ``AutoTokenizer.from_pretrained``, or a fast tokenizer object.
        context_lengths: exact prompt lengths in tokens (question included).
        depths: needle positions as fractions of the haystack, in ``[0, 1]`` (0: first, 1: last).
        samples_per_cell: prompts per (context length, depth) cell, each with its own passkey.
        needle_template: the needle sentence; must contain ``{passkey}``.
        passkey_digits: digits of the random passkey.
        question: the prompt's suffix, which the passkey completes.
        haystack: ``"filler"`` (built-in varied sentences), ``"passkey"`` (the passkey test's five sentences), a
            text file path or a ``datasets.Dataset``.
        haystack_column: the text column when ``haystack`` is a ``datasets.Dataset``.
        seed: fixes every passkey and haystack offset.
    """

    tokenizer: Any = None
    context_lengths: list[int] = field(default_factory=lambda: [1024, 2048, 4096])
    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    samples_per_cell: int = 5
    needle_template: str = DEFAULT_NEEDLE
    passkey_digits: int = 5
    question: str = DEFAULT_QUESTION
    haystack: Any = "filler"
    haystack_column: str = "text"
    seed: int = 0

    def __post_init__(self):
        super().__post_init__()
        self._check_fields()
        self._sentences = load_haystack(self.haystack, self.haystack_column)
        self._encoder = _Encoder(load_tokenizer(self.tokenizer), (self._sentences[0], self._sentences[-1]))
        self._sentence_ids = self._encoder.pieces([f" {s}" for s in self._sentences])
        self._question_ids = self._encoder.piece(self.question)
        self._needles: dict[str, Needle] = {}
        for cell in self.cells():  # tokenises every needle now, so a bad config fails before any writing
            self._check_cell(*cell)

    def _check_fields(self) -> None:
        """Check (and normalise: depths become floats) everything that needs no tokenizer."""
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
        if not isinstance(self.needle_template, str) or PASSKEY not in self.needle_template:
            raise ValueError(f"needle_template must be a string containing {PASSKEY!r}, got {self.needle_template!r}")
        if not isinstance(self.question, str) or not self.question.strip():
            raise ValueError(f"question must be a non-empty string, got {self.question!r}")

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
            "haystack": _digest("\n".join(self._sentences)),
            **{name: getattr(self, name) for name in _PLAIN_FIELDS},
        }
        return _digest(json.dumps(fields, sort_keys=True))

    def create_config_id(self, config_kwargs: dict, custom_features=None) -> str:
        """Cache id from :meth:`fingerprint`: tokenizer objects and datasets have no stable hash of their own."""
        return f"{self.name}-{self.fingerprint()}"

    def needle(self, passkey: str) -> Needle:
        """The needle holding ``passkey``; raises if the passkey is not an exact token span of it."""
        if passkey not in self._needles:
            text = " " + self.needle_template.replace(PASSKEY, passkey)
            start = 1 + self.needle_template.index(PASSKEY)
            ids, lo, hi = self._encoder.span(text, start, start + len(passkey))
            if self._encoder.decode(ids[lo:hi]).strip() != passkey:
                raise ValueError(
                    f"needle_template {self.needle_template!r}: the passkey {passkey!r} is not an exact token span "
                    f"under this tokenizer (its tokens decode to {self._encoder.decode(ids[lo:hi])!r}); "
                    "separate {passkey} from neighbouring characters, e.g. with spaces"
                )
            self._needles[passkey] = Needle(ids, lo, hi)
        return self._needles[passkey]

    def answer_ids(self, passkey: str) -> list[int]:
        """The ids the model should generate after the question; they decode to the passkey."""
        ids = self._encoder.piece(f" {passkey}")
        if self._encoder.decode(ids).strip() != passkey:
            raise ValueError(f"the passkey {passkey!r} does not round-trip through the tokenizer: {ids}")
        return ids

    def _draw(self, length: int, depth: float, sample: int) -> tuple[str, int]:
        """The prompt's passkey and the index of its first haystack sentence (the haystack cycles on from there)."""
        cell = (self.seed, length, depth, sample)
        passkey = make_passkey(cell_rng("passkey", *cell), self.passkey_digits)
        return passkey, cell_rng("haystack", *cell).randrange(len(self._sentences))

    def _check_cell(self, length: int, depth: float, sample: int) -> None:
        """The cell's passkey must be locatable and its prompt hold needle, question and one whole sentence."""
        passkey, first = self._draw(length, depth, sample)
        self.answer_ids(passkey)
        parts = (len(self.needle(passkey).ids), len(self._question_ids), len(self._sentence_ids[first]))
        if length < sum(parts):
            index = self.context_lengths.index(length)
            raise ValueError(
                f"context_lengths[{index}]={length} is too short: the prompt at depth {depth}, sample {sample} needs "
                f"at least {sum(parts)} tokens (needle {parts[0]} + question {parts[1]} + one haystack sentence "
                f"{parts[2]})"
            )

    def row(self, length: int, depth: float, sample: int) -> dict[str, Any]:
        """One prompt: haystack, needle at the sentence boundary nearest ``depth``, question."""
        passkey, first = self._draw(length, depth, sample)
        needle = self.needle(passkey)
        sentences = _fill(self._sentence_ids, first, length - len(needle.ids) - len(self._question_ids))
        bounds = [0, *accumulate(len(ids) for ids in sentences)]  # the sentence boundaries, in tokens
        at = min(range(len(bounds)), key=lambda k: abs(bounds[k] - depth * bounds[-1]))
        before = [t for ids in sentences[:at] for t in ids]
        after = [t for ids in sentences[at:] for t in ids]
        input_ids = before + needle.ids + after + self._question_ids
        start = bounds[at]
        return {
            "input_ids": input_ids,
            "attention_mask": [1] * len(input_ids),
            "answer": passkey,
            "answer_ids": self.answer_ids(passkey),
            "needle_start": start,
            "needle_end": start + len(needle.ids),
            "answer_start": start + needle.answer_start,
            "answer_end": start + needle.answer_end,
            "context_length": length,
            "depth": depth,
            "sample": sample,
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
    """Passkey retrieval prompts over context lengths × depths × samples; one ``test`` split.

    Prompts carry no special tokens (a model that wants a BOS gets it prepended, spans shifted by one).

    Features: ``input_ids`` / ``attention_mask`` (exactly ``context_length`` tokens), ``answer`` (the
    passkey), ``answer_ids`` (the tokens to generate after the prompt), ``needle_start`` /
    ``needle_end`` and ``answer_start`` / ``answer_end`` (token spans ``[start, end)`` in
    ``input_ids``), ``context_length``, ``depth`` and ``sample``.
    """

    VERSION = datasets.Version("1.0.0")
    BUILDER_CONFIG_CLASS = NeedleInAHaystackConfig

    def __init__(self, *args, hash: str | None = None, **kwargs):
        super().__init__(*args, hash=hash or code_hash(), **kwargs)

    def _info(self) -> datasets.DatasetInfo:
        index = datasets.Value("int64")
        return datasets.DatasetInfo(
            description="Needle-in-a-haystack passkey retrieval prompts",
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
                }
            ),
        )

    def _split_generators(self, dl_manager):
        return [datasets.SplitGenerator(name=datasets.Split.TEST)]

    def _generate_examples(self):
        yield from enumerate(self.config.rows())
