"""The story tokenizer and packing: one byte-level BPE for both models of the GD study, and stories cut into
fixed-length blocks of token ids for causal-LM training."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ...validation import check_int
from .corpus import END_OF_TEXT

if TYPE_CHECKING:  # tokenizers, transformers and torch are imported where used
    import torch
    from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"


def train_story_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 4096,
    *,
    min_frequency: int = 2,
    model_max_length: int | None = None,
) -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2's pre-tokenisation) trained offline on ``texts``, for both models of the study.

    Special tokens: ``<|endoftext|>`` (id 0; eos and bos, as in GPT-2) and ``<|pad|>`` (id 1; a pad of its own,
    so masking padding out of the labels never masks the end of a story). Byte-level means every string
    encodes and decodes back exactly (``decode(encode(text)) == text``). Save and load it with
    ``save_pretrained`` / ``AutoTokenizer.from_pretrained``.

    Args:
        texts: the training stories.
        vocab_size: the size of the vocabulary, >= 258 (256 bytes + 2 special tokens).
        min_frequency: merges of pairs seen fewer times are not learned.
        model_max_length: the context size the tokenizer reports (``None``: no limit).

    >>> tokenizer = train_story_tokenizer(["The cat sat on the mat."] * 10, vocab_size=300)
    >>> tokenizer.decode(tokenizer("The cat sat.")["input_ids"])
    'The cat sat.'
    >>> tokenizer.eos_token, tokenizer.eos_token_id
    ('<|endoftext|>', 0)
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    check_int("vocab_size", vocab_size, low=258)
    check_int("min_frequency", min_frequency, low=1)
    if model_max_length is not None:
        check_int("model_max_length", model_max_length, low=1)
    if isinstance(texts, str):
        raise ValueError("texts must be an iterable of stories (strings), got one string")
    texts = list(texts)
    if not texts or not all(isinstance(text, str) for text in texts):
        raise ValueError(f"texts must be a non-empty iterable of strings, got {len(texts)} items of other types")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # no space invented at the start
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[END_OF_TEXT, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, so any text is encodable
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    extra = {} if model_max_length is None else {"model_max_length": model_max_length}
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=END_OF_TEXT,
        bos_token=END_OF_TEXT,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,  # cleanup would change " ." and break the exact round trip
        **extra,
    )


def pack_stories(texts: Sequence[str], tokenizer, block_size: int) -> torch.Tensor:
    """Stories → ``(n_blocks, block_size)`` token ids for causal-LM training.

    Every story is encoded and followed by the tokenizer's eos token, the stream of all stories is cut into
    consecutive blocks of ``block_size``, and the incomplete last block is dropped (GPT-2 style packing: a
    block may span a story boundary, the eos token marks it).

    >>> tokenizer = train_story_tokenizer(["ab ab ab"] * 5, vocab_size=260)
    >>> pack_stories(["ab", "ab ab"], tokenizer, block_size=2).shape[1]
    2
    """
    import torch

    check_int("block_size", block_size, low=1)
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer must have an eos token to mark the end of each story, got eos_token_id=None")
    stream: list[int] = []
    for text in texts:
        stream += tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    n_blocks = len(stream) // block_size
    if n_blocks == 0:
        raise ValueError(f"block_size must be at most the {len(stream)} tokens of all stories, got {block_size}")
    return torch.tensor(stream[: n_blocks * block_size], dtype=torch.long).view(n_blocks, block_size)
