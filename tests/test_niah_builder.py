"""The needle-in-a-haystack builder: exact lengths, exact spans, depth placement, determinism, caching.

Tokenizers are trained here on the fly (no downloads): a GPT-2-like byte-level BPE, a Llama-like
one (SentencePiece-style ``▁`` spaces written by the tokenizer itself, digits split one by one) and
a hand-made byte-level BPE that glues a digit to a following period, so a passkey followed by ``.``
is not a token span of its own. Expected values are recomputed from the decoded text, not taken
from the builder's internals.
"""

from __future__ import annotations

import random

import datasets
import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from hf_icl.data.builders import NeedleInAHaystack, NeedleInAHaystackConfig
from hf_icl.data.niah import DEFAULT_NEEDLE, DEFAULT_QUESTION, FILLER_SENTENCES, split_sentences

ESSAY = (
    "Startups grow fast or they die. Why is that so?\nBecause growth is what investors buy!  "
    "A founder who\nunderstands this plans for it. Most do not. The rest learn it the hard way."
)


def _corpus() -> list[str]:
    rng = random.Random(0)
    needles = [DEFAULT_NEEDLE.replace("{passkey}", str(rng.randint(10**4, 10**6))) for _ in range(100)]
    return [*FILLER_SENTENCES, *split_sentences(ESSAY), *needles, DEFAULT_QUESTION]


def _train(tokenizer: Tokenizer, vocab_size: int, unk_token: str | None = None) -> PreTrainedTokenizerFast:
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[unk_token] if unk_token else [],
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token=unk_token)


def gpt2_like() -> PreTrainedTokenizerFast:
    """Byte-level BPE; the joining space belongs to the next word (``Ġword``), digit runs are merged."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return _train(tokenizer, 700)


def llama_like() -> PreTrainedTokenizerFast:
    """Legacy-Llama style: the normaliser prepends ``▁`` itself, one token per digit."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("▁", behavior="merged_with_next"), pre_tokenizers.Digits(individual_digits=True)]
    )
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return _train(tokenizer, 600, unk_token="<unk>")


def digit_period_glue() -> PreTrainedTokenizerFast:
    """Bytes plus the merges ``d.`` for every digit, over the whole text (no pre-tokenizer split)."""
    vocab = {char: i for i, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges = [(digit, ".") for digit in "0123456789"]
    vocab.update({a + b: len(vocab) + i for i, (a, b) in enumerate(merges)})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


@pytest.fixture(scope="module")
def tokenizers_():
    return {"gpt2_like": gpt2_like(), "llama_like": llama_like(), "glue": digit_period_glue()}


@pytest.fixture(scope="module")
def gpt2_tok(tokenizers_):
    return tokenizers_["gpt2_like"]


def _config(tokenizer, **overrides) -> NeedleInAHaystackConfig:
    kwargs = {"context_lengths": [64, 97, 200], "depths": [0.0, 0.1, 0.5, 0.77, 1.0], "samples_per_cell": 3}
    return NeedleInAHaystackConfig(tokenizer=tokenizer, **{**kwargs, **overrides})


def _question_length(tokenizer, rows) -> int:
    """Question tokens, read off a depth-1 row: everything after its needle."""
    row = next(r for r in rows if r["depth"] == 1.0)
    assert tokenizer.decode(row["input_ids"][row["needle_end"] :]).strip() == DEFAULT_QUESTION.strip()
    return row["context_length"] - row["needle_end"]


def _haystack_text(tokenizer, row, n_question: int) -> str:
    ids = row["input_ids"]
    return tokenizer.decode(ids[: row["needle_start"]] + ids[row["needle_end"] : len(ids) - n_question])


@pytest.mark.parametrize("name", ["gpt2_like", "llama_like"])
def test_rows_have_exact_lengths_spans_and_answers(tokenizers_, name):
    tokenizer = tokenizers_[name]
    rows = list(_config(tokenizer).rows())
    assert len(rows) == 3 * 5 * 3
    n_question = _question_length(tokenizer, rows)
    question_ids = rows[0]["input_ids"][-n_question:]
    for row in rows:
        ids, passkey = row["input_ids"], row["answer"]
        assert len(ids) == row["context_length"] and row["attention_mask"] == [1] * len(ids)
        assert len(passkey) == 5 and passkey.isdigit() and passkey[0] != "0"
        assert row["needle_start"] <= row["answer_start"] < row["answer_end"] <= row["needle_end"]
        assert tokenizer.decode(ids[row["answer_start"] : row["answer_end"]]).strip() == passkey
        needle = tokenizer.decode(ids[row["needle_start"] : row["needle_end"]]).strip()
        assert needle == DEFAULT_NEEDLE.replace("{passkey}", passkey)
        assert tokenizer.decode(row["answer_ids"]).strip() == passkey
        assert ids[-n_question:] == question_ids  # the question closes every prompt, tokenised the same way
        # The model's continuation is the passkey: prompt + answer_ids reads "... The pass key is <passkey>".
        assert tokenizer.decode(ids + row["answer_ids"]).endswith(f"{DEFAULT_QUESTION.strip()} {passkey}")
        if row["depth"] == 1.0:  # needle + question tokenised piece by piece, as their joined text would be
            tail = ids[row["needle_start"] :]
            assert tokenizer(tokenizer.decode(tail), add_special_tokens=False)["input_ids"] == tail


@pytest.mark.parametrize("name", ["gpt2_like", "llama_like"])
def test_needle_sits_at_the_sentence_boundary_nearest_the_depth(tokenizers_, name):
    tokenizer = tokenizers_[name]
    rows = list(_config(tokenizer, depths=[0.0, 0.2, 0.35, 0.5, 0.9, 1.0]).rows())
    n_question = _question_length(tokenizer, rows)
    longest = max(len(tokenizer(f" {s}", add_special_tokens=False)["input_ids"]) for s in FILLER_SENTENCES)
    for row in rows:
        haystack = row["context_length"] - (row["needle_end"] - row["needle_start"]) - n_question
        start = row["needle_start"]
        assert abs(start - row["depth"] * haystack) <= longest
        before = tokenizer.decode(row["input_ids"][:start]).strip()
        assert start in (0, haystack) or before[-1] in ".!?"  # a sentence boundary (or the haystack's ends)
        if row["depth"] == 0.0:
            assert start == 0
        if row["depth"] == 1.0:
            assert start == haystack  # right before the question
        # The haystack reads as filler sentences in order, only the last one cut short.
        sentences = split_sentences(_haystack_text(tokenizer, row, n_question))
        assert set(sentences[:-1]) <= set(FILLER_SENTENCES)
        first = FILLER_SENTENCES.index(sentences[0])
        expected = [FILLER_SENTENCES[(first + i) % len(FILLER_SENTENCES)] for i in range(len(sentences))]
        assert sentences[:-1] == expected[:-1] and expected[-1].startswith(sentences[-1])


def test_same_seed_same_rows_other_seed_other_passkeys(gpt2_tok):
    rows = list(_config(gpt2_tok, seed=3).rows())
    assert rows == list(_config(gpt2_tok, seed=3).rows())
    other = list(_config(gpt2_tok, seed=4).rows())
    assert sum(a["answer"] != b["answer"] for a, b in zip(rows, other, strict=True)) >= len(rows) - 2
    assert len({row["answer"] for row in rows}) >= len(rows) - 2  # samples of a cell differ too


def test_cells_do_not_depend_on_the_other_cells(gpt2_tok):
    small = list(_config(gpt2_tok, context_lengths=[97], depths=[0.5]).rows())
    big = [r for r in _config(gpt2_tok).rows() if r["context_length"] == 97 and r["depth"] == 0.5]
    assert small == big


@pytest.mark.parametrize("digits", [1, 12])
def test_passkey_digits(gpt2_tok, digits):
    for row in _config(gpt2_tok, passkey_digits=digits, context_lengths=[64]).rows():
        assert len(row["answer"]) == digits and row["answer"][0] != "0"
        assert gpt2_tok.decode(row["input_ids"][row["answer_start"] : row["answer_end"]]).strip() == row["answer"]


def test_split_sentences():
    assert split_sentences("Hi there!  How are\nyou? Pi is 3.14 today. Done") == [
        "Hi there!",
        "How are you?",
        "Pi is 3.14 today.",
        "Done",
    ]


def _haystack_sentences(tokenizer, config) -> set[str]:
    rows = list(config.rows())
    n_question = _question_length(tokenizer, rows)
    return {s for row in rows for s in split_sentences(_haystack_text(tokenizer, row, n_question))[:-1]}


def test_text_file_haystack(gpt2_tok, tmp_path):
    path = tmp_path / "essay.txt"
    path.write_text(ESSAY, encoding="utf-8")
    used = _haystack_sentences(gpt2_tok, _config(gpt2_tok, haystack=str(path)))
    assert used and used <= set(split_sentences(ESSAY))
    assert "Because growth is what investors buy!" in used


def test_dataset_column_haystack(gpt2_tok):
    essays = datasets.Dataset.from_dict({"id": [0, 1], "body": ESSAY.split("Most do not.")})
    used = _haystack_sentences(gpt2_tok, _config(gpt2_tok, haystack=essays, haystack_column="body"))
    assert used and used <= set(split_sentences(ESSAY)) - {"Most do not."}
    with pytest.raises(ValueError, match="haystack_column"):
        _config(gpt2_tok, haystack=essays)  # default column "text" is not there


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"depths": [0.5, 1.5]}, r"depths\[1\].*1.5"),
        ({"depths": [0.5, 0.5]}, "depths must not repeat"),
        ({"context_lengths": [200, 20]}, r"context_lengths\[1\]=20 is too short"),
        ({"context_lengths": []}, "context_lengths must be a non-empty list"),
        ({"needle_template": "The pass key is hidden."}, "needle_template.*{passkey}"),
        ({"passkey_digits": 0}, "passkey_digits.*0"),
        ({"samples_per_cell": 0}, "samples_per_cell"),
        ({"haystack": "/no/such/essays.txt"}, "haystack.*/no/such/essays.txt"),
        ({"question": "  "}, "question"),
        ({"tokenizer": None}, "tokenizer"),
    ],
)
def test_bad_configs_raise_naming_the_field(gpt2_tok, overrides, match):
    with pytest.raises(ValueError, match=match):
        _config(overrides.pop("tokenizer", gpt2_tok), **overrides)


def test_passkey_glued_to_its_neighbour_raises(tokenizers_):
    glue = tokenizers_["glue"]
    assert glue.convert_ids_to_tokens(glue("is 12.")["input_ids"])[-1] == "2."  # "2." is one token
    with pytest.raises(ValueError, match="needle_template.*not an exact token span"):
        _config(glue)
    # Spacing the period off makes the passkey a span of its own.
    template = "The pass key is {passkey} . Remember it."
    for row in _config(glue, needle_template=template, context_lengths=[200], depths=[0.5]).rows():
        assert glue.decode(row["input_ids"][row["answer_start"] : row["answer_end"]]).strip() == row["answer"]


def test_tokenizer_from_a_local_path_matches_the_object(gpt2_tok, tmp_path):
    gpt2_tok.save_pretrained(tmp_path / "tok")
    by_path = _config(str(tmp_path / "tok"), context_lengths=[64])
    by_object = _config(gpt2_tok, context_lengths=[64])
    assert by_path.fingerprint() == by_object.fingerprint()
    assert list(by_path.rows()) == list(by_object.rows())


def test_builder_round_trip_and_cache_key(gpt2_tok, tmp_path):
    config = {"context_lengths": [64, 128], "depths": [0.0, 0.5, 1.0], "samples_per_cell": 2, "seed": 7}
    builder = NeedleInAHaystack(cache_dir=str(tmp_path), tokenizer=gpt2_tok, **config)
    builder.download_and_prepare()
    ds = builder.as_dataset()["test"]
    assert ds.to_list() == list(NeedleInAHaystackConfig(tokenizer=gpt2_tok, **config).rows())
    assert ds.features["input_ids"].feature.dtype == "int32"
    torch_row = ds.with_format("torch")[0]
    assert torch_row["input_ids"].shape == (64,) and torch_row["attention_mask"].sum() == 64
    # Same content, same cache; any change, another one.
    same = NeedleInAHaystack(cache_dir=str(tmp_path), tokenizer=gpt2_tok, **config)
    assert same.cache_dir == builder.cache_dir
    other = NeedleInAHaystack(cache_dir=str(tmp_path), tokenizer=gpt2_tok, **{**config, "seed": 8})
    assert other.cache_dir != builder.cache_dir


def test_passkey_haystack_is_the_five_sentences_of_the_passkey_test():
    from hf_icl.data.niah import PASSKEY_SENTENCES, load_haystack

    assert load_haystack("passkey", None) == list(PASSKEY_SENTENCES)
    config = NeedleInAHaystackConfig(tokenizer=gpt2_like(), context_lengths=[96], depths=[0.5], haystack="passkey")
    row = next(iter(config.rows()))
    text = gpt2_like().decode(row["input_ids"])
    assert text.count("The grass is green.") >= 2 and "clouds" not in text
