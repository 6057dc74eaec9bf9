"""The needle-in-a-haystack builder: exact lengths, exact spans, depth placement, determinism, caching.

Tokenizers are trained here on the fly (no downloads): a GPT-2-like byte-level BPE, a Llama-like
one (SentencePiece-style ``▁`` spaces written by the tokenizer itself, digits split one by one) and
a hand-made byte-level BPE that glues a digit to a following period, so a passkey followed by ``.``
is not a token span of its own. Expected values are recomputed from the decoded text, not taken
from the builder's internals.
"""

from __future__ import annotations

import random
import re
import uuid

import datasets
import pytest
from tiny_models import ESSAY, gpt2_like, llama_like
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hf_icl.data.builders import NeedleInAHaystack, NeedleInAHaystackConfig
from hf_icl.data.niah import (
    DEFAULT_NEEDLE,
    DEFAULT_QUESTION,
    FILLER_SENTENCES,
    KEY_VALUE_NEEDLE,
    MULTIKEY_QUESTION,
    MULTIVALUE_QUESTION,
    PASSKEY_SENTENCES,
    VALUE_KINDS,
    VARIANTS,
    WORDS,
    split_sentences,
)


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


# -- RULER-style variants ------------------------------------------------------------------------------

VARIANT_GRID = {"context_lengths": [400, 512], "depths": [0.0, 0.3, 0.77, 1.0], "samples_per_cell": 2}
NEEDLE_RE = re.compile(r"One of the special magic (\w+)s for (\w+) is: (\S+?) ?\.")
UUID4 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
# llama_like glues a letter to a following period ("e."): its needles space the period off
SPACED = "One of the special magic {kind}s for {key} is: {value} ."


def _question_text(variant: str, kind: str, key: str) -> str:
    template = MULTIKEY_QUESTION if variant == "multikey" else MULTIVALUE_QUESTION
    return template.replace("{kind}", kind).replace("{key}", key).strip()


def _check_value(kind: str, value: str) -> None:
    if kind == "number":
        assert len(value) == 5 and value.isdigit() and value[0] != "0"
    elif kind == "word":
        assert value in WORDS
    else:
        assert UUID4.fullmatch(value) and uuid.UUID(value).version == 4


@pytest.mark.parametrize("kind", VALUE_KINDS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", ["gpt2_like", "llama_like"])
def test_variant_rows_have_exact_lengths_spans_keys_and_values(tokenizers_, name, variant, kind):
    tokenizer = tokenizers_[name]
    spaced = name == "llama_like" and kind != "number"
    template = {"needle_template": SPACED if variant != "single" else "The pass key is {passkey} ."} if spaced else {}
    rows = list(_config(tokenizer, variant=variant, value_kind=kind, **template, **VARIANT_GRID).rows())
    assert len(rows) == 2 * 4 * 2
    for row in rows:
        ids = row["input_ids"]
        assert len(ids) == row["context_length"] and row["attention_mask"] == [1] * len(ids)
        assert (row["variant"], row["value_kind"]) == (variant, kind)
        spans = list(zip(row["value_starts"], row["value_ends"], strict=True))
        values = [tokenizer.decode(ids[lo:hi]).strip() for lo, hi in spans]  # every value is an exact span
        for value in values:
            _check_value(kind, value)
        assert (row["answer_start"], row["answer_end"]) == (spans[0][0], spans[-1][1])
        assert row["needle_start"] <= row["answer_start"] < row["answer_end"] <= row["needle_end"]
        assert tokenizer.decode(row["answer_ids"]).strip() == row["answer"]
        text = tokenizer.decode(ids)
        if variant == "single":
            assert row["key"] == "" and values == [row["answer"]]
            needle = tokenizer.decode(ids[row["needle_start"] : row["needle_end"]]).strip()
            assert needle == (template.get("needle_template") or DEFAULT_NEEDLE).replace("{passkey}", row["answer"])
            assert text.endswith(DEFAULT_QUESTION.strip())
            continue
        # every needle of the prompt, read off its text: (kind, key, value) in prompt order
        needles = NEEDLE_RE.findall(text)
        assert all(found_kind == kind for found_kind, _, _ in needles)
        answer_needles = NEEDLE_RE.findall(tokenizer.decode(ids[row["needle_start"] : row["needle_end"]]))
        keys = {key for _, key, _ in answer_needles}
        assert keys == {row["key"]}  # the answer's needles name the key the question asks for
        assert text.endswith(_question_text(variant, kind, row["key"]))
        assert [value for _, _, value in answer_needles] == values
        if kind == "word":  # keys are distinct from the values
            assert not {key for _, key, _ in needles} & {value for _, _, value in needles}
        assert len({value for _, _, value in needles}) == len(needles)  # no value twice
        if variant == "multikey":
            assert len(needles) == 4 and len({key for _, key, _ in needles}) == 4
            assert len(values) == 1 and row["answer"] == values[0]
            distractors = [value for _, key, value in needles if key != row["key"]]
            assert len(distractors) == 3 and row["answer"] not in distractors
        else:
            assert len(needles) == 4 and {key for _, key, _ in needles} == {row["key"]}
            assert row["answer"] == ", ".join(values) and len(values) == 4
            assert row["value_starts"] == sorted(row["value_starts"])
            assert [value for _, _, value in needles] == values  # the answer lists them in prompt order


@pytest.mark.parametrize("variant", ["multikey", "multivalue"])
def test_variant_needles_sit_at_their_depths(gpt2_tok, variant):
    """The answer's needle at the boundary nearest the depth (multivalue: value j nearest depth + j (1 - depth) / 4),
    counted in haystack tokens; depth 0 opens the prompt, depth 1 closes the haystack."""
    rows = list(_config(gpt2_tok, variant=variant, value_kind="word", **VARIANT_GRID).rows())
    longest = max(len(gpt2_tok(f" {s}")["input_ids"]) for s in FILLER_SENTENCES)

    def tokens(text: str) -> int:
        return len(gpt2_tok(text, add_special_tokens=False)["input_ids"])

    def needle_tokens(needles) -> int:
        return sum(tokens(f" One of the special magic {kind}s for {key} is: {value}.") for kind, key, value in needles)

    for row in rows:
        ids, depth = row["input_ids"], row["depth"]
        question = gpt2_tok(" " + _question_text(variant, "word", row["key"]), add_special_tokens=False)["input_ids"]
        assert ids[-len(question) :] == question
        haystack = len(ids) - len(question) - needle_tokens(NEEDLE_RE.findall(gpt2_tok.decode(ids)))
        for j, value_start in enumerate(row["value_starts"]):
            start = next(
                s for s in range(value_start, -1, -1) if gpt2_tok.decode(ids[s:value_start]).startswith(" One")
            )
            before = start - needle_tokens(NEEDLE_RE.findall(gpt2_tok.decode(ids[:start])))  # haystack tokens
            fraction = depth + j * (1 - depth) / 4
            assert abs(before - fraction * haystack) <= longest / 2 + 1, (row["depth"], j)
            # at a sentence boundary (or the haystack's end, after its last sentence cut short)
            assert before == haystack or gpt2_tok.decode(ids[:start]).strip()[-1:] in ("", ".")
        if depth == 0.0:
            assert row["needle_start"] == 0
        if depth == 1.0:
            assert row["needle_end"] == len(ids) - len(question)
            if variant == "multivalue":  # the four needles one after the other, right before the question
                needles = gpt2_tok.decode(ids[row["needle_start"] : row["needle_end"]]).strip()
                values = row["answer"].split(", ")
                assert needles == " ".join(f"One of the special magic words for {row['key']} is: {v}." for v in values)


@pytest.mark.parametrize(("variant", "kind"), [("single", "word"), ("multikey", "uuid"), ("multivalue", "number")])
def test_variant_rows_are_reproducible_and_differ_across_samples(gpt2_tok, variant, kind):
    config = {"variant": variant, "value_kind": kind, **VARIANT_GRID, "samples_per_cell": 4}
    rows = list(_config(gpt2_tok, seed=5, **config).rows())
    assert rows == list(_config(gpt2_tok, seed=5, **config).rows())
    cell = [row for row in rows if row["context_length"] == 400 and row["depth"] == 0.3]
    assert len({row["answer"] for row in cell}) == 4 and len({tuple(row["input_ids"]) for row in cell}) == 4
    other = list(_config(gpt2_tok, seed=6, **config).rows())
    assert sum(a["answer"] != b["answer"] for a, b in zip(rows, other, strict=True)) >= len(rows) - 2
    small = list(_config(gpt2_tok, seed=5, **{**config, "context_lengths": [512], "depths": [0.77]}).rows())
    assert small == [row for row in rows if row["context_length"] == 512 and row["depth"] == 0.77]


def _old_default_rows(tokenizer, context_lengths, depths, samples, seed):
    """The single-passkey rows as the builder made them before variants existed, rebuilt from the template text
    (gpt2_like: the joining space belongs to the next word, so pieces are tokenised with their leading space)."""

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    sentences = [ids(f" {s}") for s in FILLER_SENTENCES]
    question = ids(DEFAULT_QUESTION)
    for length in context_lengths:
        for depth in depths:
            for sample in range(samples):
                cell = f"{seed}/{length}/{depth!r}/{sample}"
                rng = random.Random(f"passkey/{cell}")
                passkey = str(rng.randint(1, 9)) + "".join(str(rng.randint(0, 9)) for _ in range(4))
                needle = ids(" " + DEFAULT_NEEDLE.replace("{passkey}", passkey))
                index, taken, budget = random.Random(f"haystack/{cell}").randrange(len(sentences)), [], 0
                while budget < length - len(needle) - len(question):
                    taken.append(sentences[index % len(sentences)][: length - len(needle) - len(question) - budget])
                    budget += len(taken[-1])
                    index += 1
                bounds = [sum(len(s) for s in taken[:k]) for k in range(len(taken) + 1)]
                at = min(range(len(bounds)), key=lambda k: abs(bounds[k] - depth * bounds[-1]))
                prompt = [t for s in taken[:at] for t in s] + needle + [t for s in taken[at:] for t in s] + question
                yield {
                    "input_ids": prompt,
                    "answer": passkey,
                    "answer_ids": ids(f" {passkey}"),
                    "needle_start": bounds[at],
                    "needle_end": bounds[at] + len(needle),
                    "context_length": length,
                    "depth": depth,
                    "sample": sample,
                }


def test_default_rows_are_those_of_before_the_variants(gpt2_tok):
    grid = {"context_lengths": [64, 97, 200], "depths": [0.0, 0.1, 0.5, 0.77, 1.0], "samples_per_cell": 3}
    default = list(NeedleInAHaystackConfig(tokenizer=gpt2_tok, seed=2, **grid).rows())
    explicit = NeedleInAHaystackConfig(
        tokenizer=gpt2_tok, seed=2, variant="single", value_kind="number", n_keys=4, n_values=4, **grid
    )
    assert list(explicit.rows()) == default
    expected = list(_old_default_rows(gpt2_tok, grid["context_lengths"], grid["depths"], 3, seed=2))
    assert len(default) == len(expected)
    for row, old in zip(default, expected, strict=True):
        assert {name: row[name] for name in old} == old
        answer = gpt2_tok.decode(row["input_ids"][row["answer_start"] : row["answer_end"]]).strip()
        assert answer == row["answer"] and row["needle_start"] < row["answer_start"]
        assert gpt2_tok.decode(row["input_ids"][row["needle_start"] : row["answer_start"]]).strip() == "The pass key is"
        assert (row["variant"], row["value_kind"], row["key"]) == ("single", "number", "")
        assert (row["value_starts"], row["value_ends"]) == ([row["answer_start"]], [row["answer_end"]])


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"variant": "multi"}, r"variant must be one of \['single', 'multikey', 'multivalue'\], got 'multi'"),
        ({"value_kind": "hex"}, r"value_kind must be one of \['number', 'word', 'uuid'\], got 'hex'"),
        ({"variant": "multikey", "n_keys": 1}, r"n_keys must be an integer in \[2, \+inf\), got 1"),
        ({"variant": "multivalue", "n_values": "3"}, r"n_values must be an integer, got '3'"),
        ({"n_keys": 3}, r"n_keys=3 applies only to variant 'multikey'.*'single'.*default 4"),
        ({"variant": "multikey", "n_values": 2}, r"n_values=2 applies only to variant 'multivalue'"),
        ({"value_kind": "word", "passkey_digits": 7}, r"passkey_digits=7 applies only to value_kind 'number'"),
        ({"variant": "multikey", "value_kind": "word", "n_keys": 200}, r"n_keys=200 is too many.*WORDS holds"),
        ({"variant": "multivalue", "passkey_digits": 1, "n_values": 10}, r"n_values=10 is too many.*9 numbers"),
        ({"variant": "multikey", "needle_template": DEFAULT_NEEDLE}, r"needle_template.*'\{key\}' and '\{value\}'"),
        ({"variant": "multivalue", "question": " What?"}, r"question must contain '\{key\}'"),
        ({"variant": "multikey", "context_lengths": [200]}, r"context_lengths\[0\]=200 is too short.*4 needles"),
        ({"variant": "multivalue", "context_lengths": [512, 120]}, r"context_lengths\[1\]=120 is too short"),
    ],
)
def test_bad_variant_configs_raise_naming_the_field(gpt2_tok, overrides, match):
    with pytest.raises(ValueError, match=match):
        _config(gpt2_tok, **{"context_lengths": [512], **overrides})


def test_counts_at_their_default_are_ignored_by_other_variants(gpt2_tok):
    rows = list(_config(gpt2_tok, n_keys=4, n_values=4, context_lengths=[64]).rows())
    assert rows == list(_config(gpt2_tok, context_lengths=[64]).rows())
    two = list(_config(gpt2_tok, variant="multikey", n_keys=2, context_lengths=[300]).rows())
    assert all(len(NEEDLE_RE.findall(gpt2_tok.decode(row["input_ids"]))) == 2 for row in two)


def test_a_value_glued_to_the_period_raises(tokenizers_):
    llama = tokenizers_["llama_like"]
    with pytest.raises(ValueError, match=r"needle_template .*: the value '.*' is not an exact token span"):
        _config(llama, variant="multikey", value_kind="word", context_lengths=[512])


def test_words_are_distinct_lowercase_and_not_in_the_haystacks_or_templates():
    assert len(WORDS) >= 300 and len(set(WORDS)) == len(WORDS)
    assert all(word.isalpha() and word.islower() and word.isascii() for word in WORDS)
    text = " ".join([*FILLER_SENTENCES, *PASSKEY_SENTENCES, DEFAULT_NEEDLE, DEFAULT_QUESTION, KEY_VALUE_NEEDLE])
    text += MULTIKEY_QUESTION + MULTIVALUE_QUESTION
    assert not set(WORDS) & set(re.findall(r"[a-z]+", re.sub(r"\{\w+\}", "", text).lower()))  # placeholders aside


def test_variant_builder_round_trip_and_cache_key(gpt2_tok, tmp_path):
    config = {"context_lengths": [400], "depths": [0.0, 0.5], "samples_per_cell": 2, "seed": 7}
    single = NeedleInAHaystack(cache_dir=str(tmp_path), tokenizer=gpt2_tok, **config)
    variant = {"variant": "multivalue", "value_kind": "uuid", "n_values": 3}
    builder = NeedleInAHaystack(cache_dir=str(tmp_path), tokenizer=gpt2_tok, **config, **variant)
    assert builder.cache_dir != single.cache_dir
    builder.download_and_prepare()
    ds = builder.as_dataset()["test"]
    assert ds.to_list() == list(NeedleInAHaystackConfig(tokenizer=gpt2_tok, **config, **variant).rows())
    assert len(ds[0]["value_starts"]) == 3 and ds[0]["variant"] == "multivalue"
    other = NeedleInAHaystack(cache_dir=str(tmp_path), tokenizer=gpt2_tok, **config, **{**variant, "n_values": 2})
    assert other.cache_dir != builder.cache_dir
