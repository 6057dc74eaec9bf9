"""The story-corpus ``datasets`` builder: splits, determinism, local files in three formats, caching, bad configs.

Expected splits are recomputed here: the seeded shuffle written out (``random.Random("story-split/<seed>")``,
the first ``max(1, round(n * fraction))`` held out) over stories the tests generate or write to files themselves.
"""

from __future__ import annotations

import doctest
import inspect
import json
import pathlib
import random
import subprocess
import sys

import datasets
import pytest

from hf_icl.data import builders
from hf_icl.data import stories as stories_module
from hf_icl.data.stories import END_OF_TEXT, StoryCorpus, generate_template_stories, load_story_corpus
from hf_icl.data.stories import builder as builder_module
from hf_icl.data.stories import corpus as corpus_module

HAND_STORIES = [
    "Tom had a red ball. He loved it.",
    "A small dog ran to the park. It was fun!",
    "Mia and Ben built a tower. It fell down.",
    "The sun was warm. Sam played outside.",
    'Anna said, "Look at the moon!"',
    "A frog jumped into the pond. Splash!",
    "Max lost his hat. His friend found it.",
    "The cat slept on a soft pillow.",
]


def build(tmp_path, **config) -> datasets.DatasetDict:
    builder = StoryCorpus(cache_dir=str(tmp_path / "cache"), **config)
    builder.download_and_prepare()
    return builder.as_dataset()


def texts(split) -> list[str]:
    return list(split["text"])


def expected_split(pool: list[str], fraction: float, seed: int, keep: int | None = None) -> dict[str, list[str]]:
    """The split written out: shuffle the indices with the seed's generator, keep ``keep``, hold out the first."""
    order = list(range(len(pool)))
    random.Random(f"story-split/{seed}").shuffle(order)
    order = order[:keep] if keep is not None else order
    held_out = min(max(1, round(len(order) * fraction)), len(order) - 1)
    return {"train": [pool[i] for i in order[held_out:]], "validation": [pool[i] for i in order[:held_out]]}


def test_template_corpus_splits_the_generated_stories(tmp_path):
    corpus = build(tmp_path, n_stories=30, validation_fraction=0.2, seed=4)
    assert set(corpus) == {"train", "validation"}
    assert corpus["train"].features == datasets.Features({"text": datasets.Value("string")})
    pool = [story.text for story in generate_template_stories(30, seed=4)]
    expected = expected_split(pool, 0.2, seed=4)
    assert texts(corpus["train"]) == expected["train"] and texts(corpus["validation"]) == expected["validation"]
    assert corpus["train"].num_rows == 24 and corpus["validation"].num_rows == 6
    assert "template stories" in corpus["train"].info.description and "seed 4" in corpus["train"].info.description
    # ... and exactly what the in-memory loader returns
    loaded = load_story_corpus("template", n_stories=30, validation_fraction=0.2, seed=4)
    assert texts(corpus["train"]) == texts(loaded["train"])
    assert texts(corpus["validation"]) == texts(loaded["validation"])


def test_template_default_size_and_determinism(tmp_path):
    first = build(tmp_path / "a", n_stories=12, seed=2)
    again = build(tmp_path / "b", n_stories=12, seed=2)  # a separate cache: generated afresh
    other = build(tmp_path / "c", n_stories=12, seed=3)
    assert texts(first["train"]) == texts(again["train"]) and texts(first["validation"]) == texts(again["validation"])
    assert set(texts(first["train"])).isdisjoint(texts(other["train"]))
    assert first["validation"].num_rows == 1  # max(1, round(12 * 0.05)) with the default fraction
    builder = StoryCorpus(cache_dir=str(tmp_path / "d"))
    assert builder.config.source == "template" and builder.config.n_stories is None
    assert "2000 stories" in builder.info.description  # the default template size


def write_story_files(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "eot.txt").write_text(f"\n{END_OF_TEXT}\n".join(HAND_STORIES[:3]) + f"\n{END_OF_TEXT}\n")
    (folder / "blank.txt").write_text("\n\n".join(HAND_STORIES[3:5]) + "\n")
    (folder / "lines.jsonl").write_text("".join(json.dumps({"text": s}) + "\n" for s in HAND_STORIES[5:]))
    return folder


@pytest.mark.parametrize(
    "name, stories",
    [("eot.txt", HAND_STORIES[:3]), ("blank.txt", HAND_STORIES[3:5]), ("lines.jsonl", HAND_STORIES[5:])],
)
def test_one_local_file_is_split_like_the_loader(tmp_path, name, stories):
    path = write_story_files(tmp_path / "files") / name
    corpus = build(tmp_path, data_files=str(path), validation_fraction=0.3, seed=5)
    expected = expected_split(stories, 0.3, seed=5)
    assert texts(corpus["train"]) == expected["train"] and texts(corpus["validation"]) == expected["validation"]
    loaded = load_story_corpus(path, validation_fraction=0.3, seed=5)
    assert texts(corpus["train"]) == texts(loaded["train"])
    assert str(path) in corpus["train"].info.description


def test_directory_and_file_list_pool_their_stories(tmp_path):
    folder = write_story_files(tmp_path / "files")
    (folder / "nested").mkdir()
    (folder / "nested" / "more.txt").write_text("One more story.\n\nAnd the last one.")
    from_dir = build(tmp_path / "dir", data_files=str(folder), validation_fraction=0.25, seed=1)
    # the directory's .txt files, sorted by path (blank.txt, eot.txt, nested/more.txt); the .jsonl is not read
    pool = HAND_STORIES[3:5] + HAND_STORIES[:3] + ["One more story.", "And the last one."]
    expected = expected_split(pool, 0.25, seed=1)
    assert texts(from_dir["train"]) == expected["train"] and texts(from_dir["validation"]) == expected["validation"]
    assert texts(from_dir["train"]) == texts(load_story_corpus(folder, validation_fraction=0.25, seed=1)["train"])
    listed = build(
        tmp_path / "list", data_files=[folder / "lines.jsonl", folder / "eot.txt"], n_stories=4, validation_fraction=0.5
    )
    expected = expected_split(HAND_STORIES[5:] + HAND_STORIES[:3], 0.5, seed=0, keep=4)
    assert texts(listed["train"]) == expected["train"] and texts(listed["validation"]) == expected["validation"]


def test_explicit_splits_are_used_as_they_are(tmp_path):
    folder = write_story_files(tmp_path / "files")
    corpus = build(
        tmp_path,
        data_files={"train": [str(folder / "eot.txt"), str(folder / "lines.jsonl")], "test": str(folder / "blank.txt")},
    )
    assert set(corpus) == {"train", "test"}
    assert texts(corpus["train"]) == HAND_STORIES[:3] + HAND_STORIES[5:]  # file order, no shuffle
    assert texts(corpus["test"]) == HAND_STORIES[3:5]


def test_cache_is_keyed_by_config_file_contents_and_code(tmp_path):
    folder = write_story_files(tmp_path / "files")

    def cache_dir(**config):
        return StoryCorpus(cache_dir=str(tmp_path / "cache"), **config).cache_dir

    assert cache_dir(n_stories=10) == cache_dir(n_stories=10)
    assert cache_dir(n_stories=10) != cache_dir(n_stories=11)
    assert cache_dir(n_stories=10) != cache_dir(n_stories=10, seed=1)
    assert cache_dir(n_stories=10) != cache_dir(n_stories=10, validation_fraction=0.5)
    assert cache_dir(n_stories=10, hash="code-a") != cache_dir(n_stories=10, hash="code-b")
    path = folder / "blank.txt"
    before = cache_dir(data_files=str(path))
    corpus_before = build(tmp_path / "b", data_files=str(path))
    path.write_text("Changed story one.\n\nChanged story two.\n\nChanged story three.")  # same path, new stories
    assert cache_dir(data_files=str(path)) != before
    corpus_after = build(tmp_path / "b", data_files=str(path))  # the same cache_dir root: not the stale copy
    assert sorted(texts(corpus_after["train"]) + texts(corpus_after["validation"])) == [
        "Changed story one.",
        "Changed story three.",
        "Changed story two.",
    ]
    assert texts(corpus_before["train"]) != texts(corpus_after["train"])


def test_cache_key_hashes_only_the_code_that_generates_corpora(monkeypatch):
    # the modules hashed: the grammar, the readers and split, the builder; not the tokenizer, not the metrics
    assert corpus_module.CORPUS_CODE_MODULES == (
        "hf_icl.data.stories.grammar",
        "hf_icl.data.stories.corpus",
        "hf_icl.data.stories.builder",
    )
    from hf_icl.data.stories import grammar, tokenizer
    from hf_icl.evaluation import repetition

    key = corpus_module.builder_code_hash()
    assert StoryCorpus(cache_dir="unused").hash == key  # what the builder hands datasets by default
    getsource = inspect.getsource

    def key_after_editing(module) -> str:
        with monkeypatch.context() as patch:
            patch.setattr(inspect, "getsource", lambda obj: getsource(obj) + ("\n# edited" if obj is module else ""))
            return corpus_module.builder_code_hash()

    assert key_after_editing(repetition) == key and key_after_editing(tokenizer) == key  # cached corpora stay valid
    assert all(key_after_editing(module) != key for module in (grammar, corpus_module, builder_module))
    monkeypatch.setattr(corpus_module, "CORPUS_FORMAT_VERSION", "2.0.0")
    assert corpus_module.builder_code_hash() != key  # a new corpus format regenerates cached corpora too


def test_a_prepared_corpus_is_reused_without_generating(tmp_path, monkeypatch):
    first = build(tmp_path, n_stories=10, seed=6)

    def fail(self, texts):
        raise AssertionError("generated again")

    monkeypatch.setattr(StoryCorpus, "_generate_examples", fail)
    again = build(tmp_path, n_stories=10, seed=6)
    assert texts(again["train"]) == texts(first["train"])
    with pytest.raises(AssertionError, match="generated again"):  # a new config does generate (the patch is live)
        build(tmp_path, n_stories=10, seed=7)


def test_save_to_disk_round_trip(tmp_path):
    corpus = build(tmp_path, n_stories=9, seed=1)
    corpus.save_to_disk(str(tmp_path / "saved"))
    loaded = datasets.load_from_disk(str(tmp_path / "saved"))
    assert texts(loaded["train"]) == texts(corpus["train"])
    assert texts(loaded["validation"]) == texts(corpus["validation"])


@pytest.mark.parametrize(
    "config, match",
    [
        ({"source": "tinystories"}, "load_dataset\\('roneneldan/TinyStories'\\)"),
        ({"source": "hub"}, "source must be one of \\['template', 'files'\\]"),
        ({"source": "files"}, "source='files' needs data_files"),
        ({"n_stories": 1}, "n_stories"),
        ({"validation_fraction": 1.0}, "validation_fraction"),
        ({"validation_fraction": 0.0}, "validation_fraction"),
        ({"seed": -1}, "seed"),
        ({"data_files": "MISSING"}, "data_files: .* does not exist"),
        ({"data_files": "CSV"}, "data_files\\['train'\\] must be \\['.txt', '.jsonl'\\] files"),
        ({"data_files": "EMPTY_DIR"}, "holds no .txt files"),
        ({"data_files": {"dev": "EOT"}}, "splits must include 'train'"),
        ({"data_files": {"train": "EOT", "test": "EOT"}, "n_stories": 3}, "n_stories"),
        ({"data_files": "EOT", "source": "template"}, "source='template'"),
        ({"data_files": 3}, "data_files must be a path"),
    ],
)
def test_bad_configs_raise_before_any_work(tmp_path, config, match):
    folder = write_story_files(tmp_path / "files")
    (folder / "table.csv").write_text("text\nA story.\n")
    (folder / "empty").mkdir()
    paths = {"MISSING": str(folder / "nope.txt"), "CSV": str(folder / "table.csv"), "EOT": str(folder / "eot.txt")}
    paths["EMPTY_DIR"] = str(folder / "empty")

    def resolve(value):
        if isinstance(value, dict):
            return {split: resolve(v) for split, v in value.items()}
        return paths.get(value, value) if isinstance(value, str) else value

    if "data_files" in config:
        config = {**config, "data_files": resolve(config["data_files"])}
    with pytest.raises(ValueError, match=match):
        StoryCorpus(cache_dir=str(tmp_path / "cache"), **config)
    assert not any(p.suffix == ".arrow" for p in tmp_path.rglob("*"))


def test_too_few_stories_in_a_file(tmp_path):
    (tmp_path / "one.txt").write_text("Only one story.")
    builder = StoryCorpus(cache_dir=str(tmp_path / "cache"), data_files=str(tmp_path / "one.txt"))
    with pytest.raises(ValueError, match="holds 1 stories"):
        builder.download_and_prepare()


def test_builders_module_re_exports_it():
    assert builders.StoryCorpus is StoryCorpus
    assert builders.StoryCorpusConfig is stories_module.StoryCorpusConfig
    assert f"{StoryCorpus.__module__}.{StoryCorpus.__qualname__}" == "hf_icl.data.builders.StoryCorpus"


def test_creating_a_builder_leaves_the_loaders_alone(tmp_path):
    # datasets patches the module a builder class names (pathlib.Path, open) for streaming; the loaders here must
    # still take Path objects after a builder exists
    folder = write_story_files(tmp_path / "files")
    StoryCorpus(cache_dir=str(tmp_path / "cache"), data_files=str(folder / "eot.txt"))
    assert corpus_module.Path is pathlib.Path and builder_module.Path is pathlib.Path  # the modules that use Path
    corpus = load_story_corpus(folder / "eot.txt", validation_fraction=0.3)
    assert sorted(texts(corpus["train"]) + texts(corpus["validation"])) == sorted(HAND_STORIES[:3])
    assert "story_corpus" in StoryCorpus(cache_dir=str(tmp_path / "cache")).cache_dir


def test_stories_module_stays_light_until_the_builder_is_used():
    code = (
        "import sys\nimport hf_icl.data.stories as s\nprint('datasets' in sys.modules)\n"
        "s.StoryCorpus\nprint('datasets' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "True"]
    with pytest.raises(AttributeError, match="no attribute 'NoSuchBuilder'"):
        stories_module.NoSuchBuilder  # noqa: B018


def test_docstring_examples_run():
    assert doctest.testmod(stories_module, raise_on_error=True).attempted > 0
    runner = doctest.DocTestRunner()
    for test in doctest.DocTestFinder().find(StoryCorpus, "StoryCorpus", globs=vars(stories_module)):
        runner.run(test)
    assert runner.summarize(verbose=False) == (0, 6)  # the builder's six examples, all passing
