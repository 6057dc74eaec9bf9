"""The one set of tiny models, tokens and tokenizers the tests build (no downloads): a GPT-2 and a Llama causal LM
(seeded, random weights, dropout off) and two tokenizers trained here on the fly on NIAH-like text, a GPT-2-like
byte-level BPE and a legacy-Llama-like one. ``conftest.py`` offers the defaults as fixtures."""

from __future__ import annotations

import random

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from hf_icl.data.niah import DEFAULT_NEEDLE, DEFAULT_QUESTION, FILLER_SENTENCES, split_sentences

#: the vocabulary of the tiny models when no tokenizer decides it
VOCAB_SIZE = 101


def tiny_gpt2(vocab_size: int = VOCAB_SIZE, seed: int = 0, *, dropout: float = 0.0, **fields) -> GPT2LMHeadModel:
    """GPT-2: 2 layers, width 64, 2 heads, 256 positions, no dropout (``fields`` override any of them), in eval
    mode."""
    torch.manual_seed(seed)
    shape = {"n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 256, **fields}
    config = GPT2Config(
        **shape,
        vocab_size=vocab_size,
        bos_token_id=None,
        eos_token_id=None,
        attn_pdrop=dropout,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
    )
    return GPT2LMHeadModel(config).eval()


def tiny_llama(
    vocab_size: int = VOCAB_SIZE,
    seed: int = 0,
    *,
    hidden_size: int = 48,
    intermediate_size: int = 96,
    heads: int = 3,
    head_dim: int = 16,
    max_positions: int = 512,
) -> LlamaForCausalLM:
    """Llama with grouped-query attention: 2 layers, ``heads`` query heads and 1 key-value head of ``head_dim``."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=1,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
    )
    return LlamaForCausalLM(config).eval()


#: the attention tests' Llama: 2 query heads of 32, one key-value head, 256 positions
CAB_LLAMA = {"hidden_size": 64, "intermediate_size": 128, "heads": 2, "head_dim": 32, "max_positions": 256}


def cab_llama(seed: int = 0) -> LlamaForCausalLM:
    """:func:`tiny_llama` with :data:`CAB_LLAMA`'s sizes."""
    return tiny_llama(seed=seed, **CAB_LLAMA)


def tokens(batch: int, length: int, seed: int = 0, vocab_size: int = VOCAB_SIZE) -> torch.Tensor:
    """``(batch, length)`` random token ids."""
    return torch.randint(vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


ESSAY = (
    "Startups grow fast or they die. Why is that so?\nBecause growth is what investors buy!  "
    "A founder who\nunderstands this plans for it. Most do not. The rest learn it the hard way."
)


def tokenizer_corpus() -> list[str]:
    """What the tokenizers are trained on: the filler, an essay, passkey needles and the question."""
    rng = random.Random(0)
    needles = [DEFAULT_NEEDLE.replace("{passkey}", str(rng.randint(10**4, 10**6))) for _ in range(100)]
    return [*FILLER_SENTENCES, *split_sentences(ESSAY), *needles, DEFAULT_QUESTION]


def train_bpe(tokenizer: Tokenizer, vocab_size: int, unk_token: str | None = None) -> PreTrainedTokenizerFast:
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[unk_token] if unk_token else [],
        show_progress=False,
    )
    tokenizer.train_from_iterator(tokenizer_corpus(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token=unk_token)


def gpt2_like() -> PreTrainedTokenizerFast:
    """Byte-level BPE; the joining space belongs to the next word (``Ġword``), digit runs are merged."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return train_bpe(tokenizer, 700)


def llama_like() -> PreTrainedTokenizerFast:
    """Legacy-Llama style: the normaliser prepends ``▁`` itself, one token per digit."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("▁", behavior="merged_with_next"), pre_tokenizers.Digits(individual_digits=True)]
    )
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return train_bpe(tokenizer, 600, unk_token="<unk>")
