"""Tokenizer helpers of the needle-in-a-haystack builder: loading a fast tokenizer, fingerprinting it, and
tokenising prompt pieces (needles with their value's token span, haystack sentences, questions) so that pieces
concatenate exactly as the joined text would tokenise."""

from __future__ import annotations

import hashlib
import os
from typing import NamedTuple


def text_digest(text: str) -> str:
    """The first 16 hex digits of the text's SHA-256: the fingerprints' digest."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tokenizer_fingerprint(tokenizer) -> str:
    """Digest of the tokenizer's full serialised state: equal fingerprints tokenise identically."""
    return text_digest(type(tokenizer).__name__ + tokenizer.backend_tokenizer.to_str())


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


class Needle(NamedTuple):
    """A needle's token ids and its passkey's / value's token span ``[start, end)`` within them."""

    ids: list[int]
    answer_start: int
    answer_end: int


class PieceEncoder:
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
