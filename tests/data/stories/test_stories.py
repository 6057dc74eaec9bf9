"""Story corpora, the story tokenizer, packing, repetition metrics and the corpus script (no downloads).

Expected values are counted by hand or recomputed from the text itself (regexes over the stories, the files
the tests write), not read from the module's internals.
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
import re
import sys
from pathlib import Path

import datasets
import pytest
import torch
from repo_paths import REPO
from transformers import AutoTokenizer

from hf_icl.data import stories as stories_module
from hf_icl.data.stories import (
    END_OF_TEXT,
    STORY_ADJECTIVES,
    STORY_NOUNS,
    STORY_VERBS,
    generate_template_stories,
    load_story_corpus,
    pack_stories,
    split_story_text,
    train_story_tokenizer,
)
from hf_icl.evaluation.repetition import distinct_n, repetition_rate

SCRIPTS = REPO / "scripts"
HAND_STORIES = [
    "Tom had a red ball. He loved it.",
    "Lily saw a bird.\n\nThe bird sang a song.",  # a blank line inside: only <|endoftext|> files keep it whole
    "A small dog ran to the park. It was fun!",
    "Mia and Ben built a tower. It fell down. They laughed.",
    "The sun was warm. Sam played outside all day.",
    'Anna said, "Look at the moon!" Her dad smiled.',
    "A frog jumped into the pond. Splash!",
    "Max lost his hat. His friend found it under a tree.",
    "The cat slept on a soft pillow.",
    "Zoe painted a picture of a big yellow sun.",
]


def texts(split) -> list[str]:
    """A split's stories as a plain list (datasets 5 returns a lazy Column)."""
    return list(split["text"])


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def template_texts() -> list[str]:
    return [story.text for story in generate_template_stories(600, seed=0)]


@pytest.fixture(scope="module")
def story_tokenizer(template_texts):
    return train_story_tokenizer(template_texts, vocab_size=600)


# ------------------------------------------------------------------ template grammar


def test_template_stories_are_deterministic_per_seed():
    first = generate_template_stories(40, seed=3)
    assert first == generate_template_stories(40, seed=3)
    assert generate_template_stories(15, seed=3) == first[:15]  # a prefix does not depend on n_stories
    other = generate_template_stories(40, seed=4)
    assert sum(a.text == b.text for a, b in zip(first, other, strict=True)) == 0


def test_template_stories_use_their_recipe_words():
    forms = {verb.base: (verb.base, verb.past, verb.ing) for verb in STORY_VERBS}
    stories = generate_template_stories(1000, seed=1)
    for story in stories:
        words = set(_words(story.text))
        assert story.noun in words and story.adjective in words
        assert f"{story.adjective} {story.noun}" in story.text  # the adjective describes the noun
        assert words & set(forms[story.verb]), (story.verb, story.text)
    # the recipe draws from the whole word lists
    assert {story.verb for story in stories} == set(forms)
    assert {story.noun for story in stories} == set(STORY_NOUNS)
    assert {story.adjective for story in stories} == set(STORY_ADJECTIVES)


def test_template_stories_vary(template_texts):
    assert len(set(template_texts)) == len(template_texts)
    openings = {" ".join(text.split()[:3]) for text in template_texts}
    assert len(openings) >= 15  # several opening templates x names
    sentence_counts = [len(re.findall(r"[.!?](?:\s|$)", text)) for text in template_texts]
    assert max(sentence_counts) - min(sentence_counts) >= 3
    paragraph_counts = {text.count("\n") + 1 for text in template_texts}
    assert paragraph_counts == {2, 3}
    assert all("\n\n" not in text for text in template_texts)  # survives a blank-line separated file
    # many distinct problems: each of these problem words occurs in some stories and not in others
    for cue in ("gone", "tree", "mud", "pond", "share", "grabbed"):
        hits = sum(cue in text for text in template_texts)
        assert 0 < hits < len(template_texts), cue


def test_template_vocabulary_is_small_and_simple(template_texts):
    words = [word for text in template_texts for word in _words(text)]
    vocabulary = set(words)
    assert 200 <= len(vocabulary) <= 1500  # TinyStories: about 1500 basic words
    assert max(len(word) for word in vocabulary) <= 10
    assert sum(map(len, words)) / len(words) < 4.5
    lengths = [len(text.split()) for text in template_texts]
    assert 50 <= sum(lengths) / len(lengths) <= 200


def test_template_corpus_splits_the_generated_stories():
    corpus = load_story_corpus("template", n_stories=60, validation_fraction=0.2, seed=5)
    assert set(corpus) == {"train", "validation"}
    assert corpus["train"].column_names == ["text"]
    assert (corpus["train"].num_rows, corpus["validation"].num_rows) == (48, 12)
    expected = sorted(story.text for story in generate_template_stories(60, seed=5))
    assert sorted(texts(corpus["train"]) + texts(corpus["validation"])) == expected
    assert "template stories" in corpus["train"].info.description and "seed 5" in corpus["train"].info.description
    again = load_story_corpus("template", n_stories=60, validation_fraction=0.2, seed=5)
    assert texts(again["validation"]) == texts(corpus["validation"])


# ------------------------------------------------------------------ local files


def _check_hand_corpus(corpus, expected_stories, n_validation):
    assert corpus["train"].column_names == ["text"] == corpus["validation"].column_names
    assert corpus["validation"].num_rows == n_validation
    assert corpus["train"].num_rows == len(expected_stories) - n_validation
    assert sorted(texts(corpus["train"]) + texts(corpus["validation"])) == sorted(expected_stories)


def test_text_file_with_end_of_text_separators(tmp_path):
    path = tmp_path / "stories.txt"
    path.write_text(f"\n{END_OF_TEXT}\n".join(HAND_STORIES) + f"\n{END_OF_TEXT}\n\n", encoding="utf-8")
    corpus = load_story_corpus(path, validation_fraction=0.2)
    _check_hand_corpus(corpus, HAND_STORIES, 2)  # round(10 * 0.2)
    assert HAND_STORIES[1] in texts(corpus["train"]) + texts(corpus["validation"])  # blank line kept inside
    assert str(path) in corpus["validation"].info.description


def test_text_file_with_blank_lines(tmp_path):
    single_paragraph = [story.replace("\n\n", " ") for story in HAND_STORIES]
    path = tmp_path / "stories.txt"
    path.write_text("\n\n".join(single_paragraph[:5]) + "\n  \n\n" + "\n\n\n".join(single_paragraph[5:]) + "\n")
    corpus = load_story_corpus(str(path), validation_fraction=0.3)
    _check_hand_corpus(corpus, single_paragraph, 3)


def test_directory_of_text_files(tmp_path):
    (tmp_path / "nested").mkdir()
    (tmp_path / "a.txt").write_text("\n\n".join(story.replace("\n\n", " ") for story in HAND_STORIES[:4]))
    (tmp_path / "b.txt").write_text(HAND_STORIES[4])
    (tmp_path / "nested" / "c.txt").write_text(f"\n{END_OF_TEXT}\n".join(HAND_STORIES[5:]))
    (tmp_path / "notes.md").write_text("not a story file")
    expected = [story.replace("\n\n", " ") for story in HAND_STORIES[:4]] + HAND_STORIES[4:]
    corpus = load_story_corpus(tmp_path, validation_fraction=0.5)
    _check_hand_corpus(corpus, expected, 5)


def test_jsonl_file_and_n_stories(tmp_path):
    path = tmp_path / "stories.jsonl"
    lines = [json.dumps({"text": story, "source": "hand"}) for story in HAND_STORIES]
    path.write_text("\n".join(lines[:3]) + "\n\n" + "\n".join(lines[3:]) + "\n")
    corpus = load_story_corpus(path, validation_fraction=0.1, seed=2)
    _check_hand_corpus(corpus, HAND_STORIES, 1)
    capped = load_story_corpus(path, n_stories=7, validation_fraction=0.25, seed=2)
    assert (capped["train"].num_rows, capped["validation"].num_rows) == (5, 2)
    kept = texts(capped["train"]) + texts(capped["validation"])
    assert len(set(kept)) == 7 and set(kept) <= set(HAND_STORIES)
    other_seed = load_story_corpus(path, validation_fraction=0.5, seed=3)
    assert (
        texts(other_seed["validation"])
        != load_story_corpus(path, validation_fraction=0.5, seed=2)["validation"]["text"]
    )


def test_split_story_text_by_hand():
    assert split_story_text("One.\n\n\nTwo.\n \nThree.") == ["One.", "Two.", "Three."]
    assert split_story_text(f"A.\n\nB.\n{END_OF_TEXT}\nC.\n{END_OF_TEXT}\n") == ["A.\n\nB.", "C."]
    assert split_story_text("  \n\n ") == []


def test_bad_sources_and_arguments(tmp_path):
    with pytest.raises(ValueError, match="source must be one of"):
        load_story_corpus(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="source must be one of"):
        load_story_corpus(42)
    (tmp_path / "stories.csv").write_text("a,b")
    with pytest.raises(ValueError, match=r"\.txt or \.jsonl"):
        load_story_corpus(tmp_path / "stories.csv")
    (tmp_path / "one.txt").write_text("Only one story.")
    with pytest.raises(ValueError, match="holds 1 stories"):
        load_story_corpus(tmp_path / "one.txt")
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"story": "no text field"}\n')
    with pytest.raises(ValueError, match="line 2"):
        load_story_corpus(tmp_path / "bad.jsonl")
    (tmp_path / "broken.jsonl").write_text('{"text": "fine"}\n{not json\n')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        load_story_corpus(tmp_path / "broken.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="without .txt files"):
        load_story_corpus(tmp_path / "empty")
    for fraction in (0.0, 1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="validation_fraction"):
            load_story_corpus("template", n_stories=10, validation_fraction=fraction)
    for count in (0, 1, 2.5):
        with pytest.raises(ValueError, match="n_stories must be an integer"):
            load_story_corpus("template", n_stories=count)


# ------------------------------------------------------------------ TinyStories (mocked: nothing downloads)


def test_tinystories_offline_raises_a_clear_error(monkeypatch):
    calls = []

    def offline(name, *args, **kwargs):
        calls.append(name)
        raise ConnectionError("Couldn't reach 'roneneldan/TinyStories' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ConnectionError, match="roneneldan/TinyStories.*source='template'") as error:
        load_story_corpus("tinystories")
    assert "\n" not in str(error.value)
    assert calls == ["roneneldan/TinyStories"]


def test_tinystories_keeps_its_splits_and_caps_them(monkeypatch):
    fake = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": [f"train {i}" for i in range(50)], "extra": list(range(50))}),
            "validation": datasets.Dataset.from_dict({"text": [f"valid {i}" for i in range(20)], "extra": [0] * 20}),
        }
    )
    monkeypatch.setattr(datasets, "load_dataset", lambda name, *args, **kwargs: fake)
    full = load_story_corpus("tinystories")
    assert texts(full["train"]) == texts(fake["train"]) and texts(full["validation"]) == texts(fake["validation"])
    assert full["train"].column_names == ["text"]
    assert full["train"].info.description.startswith("TinyStories")
    capped = load_story_corpus("tinystories", n_stories=30, validation_fraction=0.1)
    assert texts(capped["train"]) == [f"train {i}" for i in range(30)]
    assert texts(capped["validation"]) == [f"valid {i}" for i in range(3)]


# ------------------------------------------------------------------ tokenizer and packing

ROUND_TRIP_TEXTS = [
    "Once upon a time, there was a little girl named Lily.",
    "  Two leading spaces, a tab\there, and trailing spaces   ",
    'She said, "Don\'t go!" , and then... ?! (a gap before the comma)',
    "Line one.\n\nLine two after a blank line.\r\nWindows line end.",
    "Unicode: café, naïve, 東京, emoji 🐸🎈, and a zero-width\u200bspace.",
    f"An end-of-text token inside: {END_OF_TEXT} and after it.",
    "",
]


def test_tokenizer_round_trip_and_special_tokens(story_tokenizer, template_texts):
    assert story_tokenizer.eos_token == END_OF_TEXT and story_tokenizer.convert_tokens_to_ids(END_OF_TEXT) == 0
    assert story_tokenizer.pad_token_id == 1 and story_tokenizer.pad_token_id != story_tokenizer.eos_token_id
    assert len(story_tokenizer) == 600
    for text in ROUND_TRIP_TEXTS + template_texts[:50]:
        ids = story_tokenizer(text)["input_ids"]
        assert story_tokenizer.decode(ids) == text
    assert story_tokenizer(f"a{END_OF_TEXT}b")["input_ids"].count(0) == 1  # the literal is the special token
    # trained on the corpus: frequent words are single tokens, and stories compress well below one token a byte
    assert len(story_tokenizer.tokenize(" the")) == 1 and len(story_tokenizer.tokenize(" upon")) == 1
    sample = template_texts[0]
    assert len(story_tokenizer(sample)["input_ids"]) < len(sample.encode()) / 2.5


def test_tokenizer_save_and_load(story_tokenizer, tmp_path):
    story_tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in ROUND_TRIP_TEXTS:
        ids = loaded(text)["input_ids"]
        assert ids == story_tokenizer(text)["input_ids"]
        assert loaded.decode(ids) == text
    assert (loaded.eos_token_id, loaded.pad_token_id, loaded.bos_token_id) == (0, 1, 0)
    assert len(loaded) == len(story_tokenizer)


def test_tokenizer_arguments():
    with pytest.raises(ValueError, match="vocab_size"):
        train_story_tokenizer(["a b c"], vocab_size=100)
    with pytest.raises(ValueError, match="texts must be an iterable"):
        train_story_tokenizer("one long string")
    with pytest.raises(ValueError, match="texts must be a non-empty"):
        train_story_tokenizer([])
    limited = train_story_tokenizer(["a b c"] * 3, vocab_size=300, model_max_length=128)
    assert limited.model_max_length == 128


def test_pack_stories(story_tokenizer, template_texts):
    texts = template_texts[:7]
    blocks = pack_stories(texts, story_tokenizer, block_size=32)
    assert blocks.dtype == torch.long and blocks.shape[1] == 32
    # the same stream another way: the joined text, where the tokenizer splits at each end-of-text literal
    stream = story_tokenizer("".join(text + END_OF_TEXT for text in texts))["input_ids"]
    assert stream.count(0) == len(texts)
    assert blocks.shape[0] == len(stream) // 32
    assert blocks.flatten().tolist() == stream[: blocks.numel()]
    with pytest.raises(ValueError, match="block_size"):
        pack_stories(["short"], story_tokenizer, block_size=10_000)


# ------------------------------------------------------------------ repetition metrics


def test_distinct_n_by_hand():
    texts = ["The cat sat.", "the cat ran"]  # tokens: the cat sat . | the cat ran
    assert distinct_n(texts, 1) == pytest.approx(5 / 7)
    assert distinct_n(texts, 2) == pytest.approx(4 / 5)  # the-cat twice
    assert distinct_n(texts, 3) == 1.0
    assert distinct_n(texts, 4) == 1.0  # only "the cat sat ."
    assert math.isnan(distinct_n(texts, 5))
    assert math.isnan(distinct_n(["a", "a"], 2))  # n-grams never cross story boundaries
    assert distinct_n([[1, 2, 1, 2], [1, 2]], 2) == pytest.approx(2 / 4)  # token ids: (1,2) (2,1) (1,2) | (1,2)
    assert distinct_n([torch.tensor([1, 2, 1, 2]), torch.tensor([1, 2])], 2) == pytest.approx(2 / 4)
    assert distinct_n(["Don't stop, don't!"], 1) == pytest.approx(4 / 5)  # don't stop , don't !


def test_distinct_n_against_a_counting_loop():
    rng = random.Random(0)
    for _ in range(20):
        stories = [[rng.randrange(4) for _ in range(rng.randrange(0, 12))] for _ in range(rng.randrange(1, 5))]
        n = rng.randrange(1, 4)
        seen, total = [], 0
        for story in stories:
            for start in range(len(story) - n + 1):
                total += 1
                gram = story[start : start + n]
                if gram not in seen:
                    seen.append(gram)
        value = distinct_n(stories, n)
        if total == 0:
            assert math.isnan(value)
        else:
            assert value == pytest.approx(len(seen) / total)


def test_repetition_rate_by_hand():
    assert repetition_rate("the dog ran and the dog ran", 3) == pytest.approx(1 / 5)
    assert repetition_rate("a b a b a b", 2) == pytest.approx(3 / 5)  # ab ba ab ba ab: 3 repeats
    assert repetition_rate("every word here is new", 2) == 0.0
    assert math.isnan(repetition_rate("too short", 3))
    with pytest.raises(ValueError, match="n must be an integer"):
        distinct_n(["a b"], 0)
    with pytest.raises(ValueError, match="one string"):
        distinct_n("a b c", 1)


# ------------------------------------------------------------------ the corpus script


def test_script_prompt_builder():
    script = _load_script("make_story_corpus")
    prompt = script.build_story_prompt("jump", "kite", "shiny", "The story should have a sad ending.")
    for expected in ('"jump"', '"kite"', '"shiny"', "3-year-old", "simple words", "sad ending"):
        assert expected in prompt
    prompts = script.sample_story_prompts(200, seed=1)
    assert prompts == script.sample_story_prompts(200, seed=1)
    assert len(set(prompts)) > 150
    with_feature = sum(any(feature in prompt for feature in script.STORY_FEATURES) for prompt in prompts)
    assert 60 < with_feature < 140  # about half ask for a feature
    nouns = {re.search(r'the noun "(\w+)"', prompt).group(1) for prompt in prompts}
    assert nouns <= set(STORY_NOUNS) and len(nouns) > 20
    with pytest.raises(ValueError, match="noun"):
        script.build_story_prompt("jump", "", "shiny")


def test_script_writes_generated_stories_that_load_back(tmp_path):
    script = _load_script("make_story_corpus")
    seen_prompts = []

    def fake_generate(prompt: str) -> str:  # a stand-in for SmolLM2: echoes the recipe words
        seen_prompts.append(prompt)
        if len(seen_prompts) == 2:
            return "   "  # an empty reply is skipped, not written
        words = re.findall(r'"(\w+)"', prompt)
        title = "Title: A Story\n" if len(seen_prompts) == 3 else ""
        cut_off = " Then she ran to" if len(seen_prompts) == 4 else ""  # ran out of new tokens mid-sentence
        story = f"Once upon a time a child used {words[0]}, {words[1]} and {words[2]}.\n\nThe end."
        return f"{title}{story}{cut_off} {END_OF_TEXT}"

    stories = script.generate_stories(fake_generate, 6, seed=0, progress=False)
    assert len(stories) == 6 and len(seen_prompts) == 7
    assert seen_prompts == script.sample_story_prompts(7, seed=0)
    assert all(story.startswith("Once upon a time") and story.endswith("\n\nThe end.") for story in stories)
    for suffix in (".txt", ".jsonl"):
        path = script.write_corpus(stories, tmp_path / f"smol{suffix}")
        corpus = load_story_corpus(path, validation_fraction=0.34)
        assert sorted(texts(corpus["train"]) + texts(corpus["validation"])) == sorted(stories)
        assert corpus["validation"].num_rows == 2
    with pytest.raises(RuntimeError, match="empty replies"):
        script.generate_stories(lambda prompt: "", 3, progress=False)
    with pytest.raises(ValueError, match="output"):
        script.write_corpus(stories, tmp_path / "smol.csv")


def test_script_template_generator_end_to_end(tmp_path, capsys):
    script = _load_script("make_story_corpus")
    path = script.main(["--n-stories", "30", "--output", str(tmp_path / "template.txt"), "--seed", "2"])
    assert "wrote 30 stories" in capsys.readouterr().err
    written = split_story_text(path.read_text())
    assert written == [story.text for story in generate_template_stories(30, seed=2)]
    with pytest.raises(SystemExit):
        script.main(["--generator", "smollm2", "--output", str(tmp_path / "x.txt")])  # needs --gguf-file
    assert "--gguf-file" in capsys.readouterr().err
    with pytest.raises(ValueError, match="gguf-file"):
        script.smollm2_generator(tmp_path / "missing.gguf", seed=0, max_new_tokens=8, temperature=1.0, top_p=1.0)


def test_module_imports_without_datasets_at_import_time():
    source = Path(stories_module.__file__).read_text()
    top_level_imports = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert not any("datasets" in line or "transformers" in line for line in top_level_imports)


@pytest.mark.parametrize("name", ["distinct_n", "repetition_rate", "story_tokens"])
def test_repetition_metrics_keep_their_old_names_with_a_deprecation_warning(name):
    import hf_icl.data
    from hf_icl.evaluation import repetition

    with pytest.warns(DeprecationWarning, match=f"{name} moved to hf_icl.evaluation.repetition"):
        assert getattr(stories_module, name) is getattr(repetition, name)
    if name != "story_tokens":  # hf_icl.data exported these two
        with pytest.warns(DeprecationWarning, match="hf_icl.evaluation.repetition"):
            assert getattr(hf_icl.data, name) is getattr(repetition, name)


def test_docstring_examples_of_every_stories_module_run():
    import doctest

    from hf_icl.data.stories import corpus, grammar, tokenizer
    from hf_icl.evaluation import repetition

    for module in (grammar, corpus, tokenizer, repetition):
        assert doctest.testmod(module, raise_on_error=True).attempted > 0, module.__name__
