"""The haystacks of the needle-in-a-haystack prompts: the built-in sentence sets, and the sentences of a text file
or of a ``datasets.Dataset`` column."""

from __future__ import annotations

import os
import re

import datasets

from ..validation import check_choice

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
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_sentences(text: str) -> list[str]:
    """Split on ``.``, ``!`` or ``?`` followed by whitespace; whitespace inside a sentence becomes one space."""
    return [" ".join(part.split()) for part in _SENTENCE_END.split(text) if part.strip()]


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
