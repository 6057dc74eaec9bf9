"""Repetition of generated stories: distinct-n and the repetition rate (the GD document's typical failure mode of
both its models is repetitive generation).

A story is a string (counted in :func:`story_tokens`: lower-cased words and punctuation marks) or a sequence of
tokens (token ids, a list or a 1-D tensor). These were ``hf_icl.data.stories.distinct_n`` etc. before; those names
still work, with a ``DeprecationWarning``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..validation import check_int

_WORD = re.compile(r"\w+(?:'\w+)*|[^\w\s]")


def story_tokens(text: str) -> list[str]:
    """The tokens the repetition metrics count: lower-cased words (``don't`` is one) and punctuation marks.

    >>> story_tokens("Tom ran. Tom's dog didn't!")
    ['tom', 'ran', '.', "tom's", 'dog', "didn't", '!']
    """
    return _WORD.findall(text.lower())


def _ngrams(story: str | Sequence, n: int) -> list[tuple]:
    if isinstance(story, str):
        tokens = story_tokens(story)
    else:  # token ids; a tensor's elements would hash by identity, so compare its values
        tokens = story.tolist() if hasattr(story, "tolist") else list(story)
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def distinct_n(texts: Sequence[str | Sequence[int]], n: int) -> float:
    """distinct-n: the number of distinct n-grams divided by the number of n-grams, over all ``texts``.

    N-grams do not cross story boundaries. A story is a string (counted in :func:`story_tokens`) or a
    sequence of tokens (e.g. token ids, a list or a 1-D tensor). 1.0 means no n-gram occurs twice; repetitive
    generation drives it towards 0. NaN when the texts hold no n-gram at all (the ratio is undefined, not 0 or 1).

    >>> distinct_n(["the cat sat", "the cat ran"], 2)
    0.75
    """
    distinct, total = _ngram_counts(texts, n)
    return distinct / total if total else float("nan")


def _ngram_counts(texts, n: int) -> tuple[int, int]:
    check_int("n", n, low=1)
    if isinstance(texts, str):
        raise ValueError("texts must be a sequence of stories, got one string")
    grams = [gram for text in texts for gram in _ngrams(text, n)]
    return len(set(grams)), len(grams)


def repetition_rate(text: str | Sequence[int], n: int = 3) -> float:
    """The share of a story's n-grams that repeat an earlier n-gram of the same story: ``1 - distinct_n([text], n)``.

    0.0 for a story without repeats; a story stuck in a loop approaches 1. NaN for a story shorter than ``n``
    tokens.

    >>> repetition_rate("the dog ran and the dog ran", 3)
    0.2
    """
    distinct, total = _ngram_counts([text], n)
    return (total - distinct) / total if total else float("nan")
