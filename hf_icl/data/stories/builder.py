"""The story corpus as a ``datasets`` builder: :class:`StoryCorpus` and its :class:`StoryCorpusConfig`.

Template stories or local files written to the ``datasets`` cache (Arrow), for ``save_to_disk`` /
``push_to_hub``. This module imports ``datasets``; :mod:`hf_icl.data.stories` imports it on first access to
``StoryCorpus`` / ``StoryCorpusConfig``, so importing the stories package stays light.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import datasets

from ...validation import check_choice, check_float, check_int
from .corpus import (
    BUILDER_SOURCES,
    CORPUS_FORMAT_VERSION,
    DEFAULT_TEMPLATE_STORIES,
    FILE_SPLITS,
    STORY_FILE_SUFFIXES,
    TINYSTORIES_HUB_ID,
    builder_code_hash,
    read_story_files,
    split_indices,
    template_description,
)
from .grammar import generate_template_stories


def _expand_story_paths(data_files):
    """``data_files`` with every directory replaced by its ``.txt`` files (sorted, recursive, as
    :func:`read_story_files` reads a directory), paths as strings; a missing path is a ValueError here rather than
    ``datasets``' FileNotFoundError."""
    if data_files is None:
        return None
    if isinstance(data_files, dict):
        return {split: _expand_story_paths(files) for split, files in data_files.items()}
    if isinstance(data_files, (str, Path)):
        data_files = [data_files]
    if not isinstance(data_files, (list, tuple)) or not data_files:
        raise ValueError(
            f"data_files must be a path, a list of paths or a dict of split -> path(s), got {data_files!r}"
        )
    expanded = []
    for entry in data_files:
        if not isinstance(entry, (str, Path)):
            raise ValueError(f"data_files must hold paths (str or Path), got {entry!r} ({type(entry).__name__})")
        path = Path(entry).expanduser()
        if path.is_dir():
            files = sorted(str(p) for p in path.rglob("*.txt") if p.is_file())
            if not files:
                raise ValueError(f"data_files: the directory {str(path)!r} holds no .txt files")
            expanded += files
        elif path.is_file() or any(char in str(entry) for char in "*?["):  # datasets resolves glob patterns
            expanded.append(str(path))
        else:
            raise ValueError(f"data_files: {str(path)!r} does not exist (give .txt / .jsonl files or directories)")
    return expanded


@dataclass
class StoryCorpusConfig(datasets.BuilderConfig):
    """What :class:`StoryCorpus` writes; validated on construction.

    Args:
        source: ``"template"`` (:func:`generate_template_stories`) or ``"files"`` (``data_files``); default:
            ``"files"`` when ``data_files`` is given, else ``"template"``. TinyStories is not built here: it is
            a Hub dataset already, ``datasets.load_dataset("roneneldan/TinyStories")``.
        n_stories: template: how many stories to generate (default 2000); files with one split: keep this many
            after the shuffle (default all). Not allowed with explicit splits.
        validation_fraction: share held out for validation, in (0, 1) (template, and files with a ``train``
            split only), as in :func:`load_story_corpus`.
        seed: the template grammar's seed and the shuffle's.
        data_files: (the ``datasets`` field) local ``.txt`` (stories separated by ``<|endoftext|>``, else by
            blank lines) and ``.jsonl`` (a ``"text"`` field per line) files, directories of ``.txt`` files, or
            glob patterns; a path or a list (one pool, split like :func:`load_story_corpus` splits a path), or a
            dict over ``train`` / ``validation`` / ``test`` (used as they are, in file order).
    """

    source: str | None = None
    n_stories: int | None = None
    validation_fraction: float = 0.05
    seed: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.source == "tinystories":
            raise ValueError(
                "source='tinystories' is not built by StoryCorpus: TinyStories is a Hub dataset already; load it "
                f"with datasets.load_dataset({TINYSTORIES_HUB_ID!r}) or load_story_corpus('tinystories')"
            )
        if self.source is None:
            self.source = "files" if self.data_files else "template"
        check_choice("source", self.source, BUILDER_SOURCES)
        check_int("seed", self.seed, low=0)
        self.validation_fraction = check_float(
            "validation_fraction", self.validation_fraction, low=0.0, high=1.0, low_inclusive=False
        )
        if self.validation_fraction >= 1.0:
            raise ValueError(f"validation_fraction must be a number in (0, 1), got {self.validation_fraction}")
        if self.n_stories is not None:
            check_int("n_stories", self.n_stories, low=2)  # one story for each split at least
        if self.source == "template" and self.data_files:
            raise ValueError(
                f"data_files are read with source='files', got source='template' and data_files for "
                f"{sorted(self.data_files)}"
            )
        if self.source == "files":
            self._check_files()

    def _check_files(self) -> None:
        if not self.data_files:
            raise ValueError("source='files' needs data_files (local .txt / .jsonl files or directories)")
        splits = sorted(self.data_files)
        if "train" not in splits or not set(splits) <= set(FILE_SPLITS):
            raise ValueError(f"data_files splits must include 'train' and be among {list(FILE_SPLITS)}, got {splits}")
        if len(splits) > 1 and self.n_stories is not None:
            raise ValueError(
                f"n_stories caps a corpus that is split here; with explicit splits {splits} the files are used as "
                f"they are, got n_stories={self.n_stories}"
            )
        for split in splits:
            for file in self.data_files[split]:
                if not str(file).endswith(STORY_FILE_SUFFIXES):
                    raise ValueError(
                        f"data_files[{split!r}] must be {list(STORY_FILE_SUFFIXES)} files, got {str(file)!r}"
                    )

    def corpus_description(self) -> str:
        """Where the stories come from, for every report trained on them."""
        if self.source == "template":
            count = DEFAULT_TEMPLATE_STORIES if self.n_stories is None else self.n_stories
            return template_description(self.seed, count)
        files = {split: [str(f) for f in self.data_files[split]] for split in sorted(self.data_files)}
        return f"local stories from {files}"

    def split_texts(self) -> dict[str, list[str]]:
        """Every split's stories, in the order the builder writes them."""
        if self.source == "template":
            count = DEFAULT_TEMPLATE_STORIES if self.n_stories is None else self.n_stories
            pool = [story.text for story in generate_template_stories(count, self.seed)]
        else:
            read = {
                split: [story for file in self.data_files[split] for story in read_story_files(file)]
                for split in self.data_files
            }
            if len(read) > 1:
                return {split: read[split] for split in FILE_SPLITS if split in read}
            pool = read["train"]
        if len(pool) < 2:
            raise ValueError(
                f"{self.corpus_description()} holds {len(pool)} stories; a train/validation split needs >= 2"
            )
        indices = split_indices(len(pool), self.n_stories if self.source == "files" else None,
                                self.validation_fraction, self.seed)  # fmt: skip
        return {split: [pool[i] for i in order] for split, order in indices.items()}

    def fingerprint(self) -> str:
        """Digest of everything the stories depend on (files by content, not by modification time)."""
        fields = {
            "source": self.source,
            "n_stories": self.n_stories,
            "validation_fraction": self.validation_fraction,
            "seed": self.seed,
        }
        if self.source == "files":
            fields["files"] = {
                split: [[str(f), hashlib.sha256(Path(f).read_bytes()).hexdigest()] for f in self.data_files[split]]
                for split in sorted(self.data_files)
            }
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]

    def create_config_id(self, config_kwargs: dict, custom_features=None) -> str:
        # the cache id: file contents count, and the template's defaults need no kwargs to be told apart
        return f"{self.name}-{self.fingerprint()}"


class StoryCorpus(datasets.GeneratorBasedBuilder):
    """A story corpus as a ``datasets`` builder: ``train`` / ``validation`` (and ``test`` when ``data_files``
    names one) splits with one ``text`` column, from the template grammar or local files.

    The splits hold exactly what :func:`load_story_corpus` returns for the same source, seed and sizes; the
    builder writes them to the ``datasets`` cache (keyed by the config, the files' contents and the code that
    generates corpora, :func:`~hf_icl.data.stories.corpus.builder_code_hash`), so ``as_dataset()`` memory-maps
    them and ``save_to_disk`` / ``push_to_hub`` publish them.
    TinyStories needs no builder: ``datasets.load_dataset("roneneldan/TinyStories")``.

    >>> import tempfile
    >>> builder = StoryCorpus(cache_dir=tempfile.mkdtemp(), n_stories=20, validation_fraction=0.25, seed=1)
    >>> builder.download_and_prepare()
    >>> corpus = builder.as_dataset()
    >>> corpus["train"].num_rows, corpus["validation"].num_rows
    (15, 5)
    >>> list(corpus["train"]["text"]) == list(load_story_corpus("template", n_stories=20,
    ...                                        validation_fraction=0.25, seed=1)["train"]["text"])
    True
    """

    VERSION = datasets.Version(CORPUS_FORMAT_VERSION)
    BUILDER_CONFIG_CLASS = StoryCorpusConfig

    def __init__(self, *args, hash: str | None = None, data_files=None, **kwargs):
        kwargs.setdefault("dataset_name", "story_corpus")  # the cache folder (datasets names it by module)
        super().__init__(*args, hash=hash or builder_code_hash(), data_files=_expand_story_paths(data_files), **kwargs)

    def _info(self) -> datasets.DatasetInfo:
        return datasets.DatasetInfo(
            description=self.config.corpus_description(),
            features=datasets.Features({"text": datasets.Value("string")}),
        )

    def _split_generators(self, dl_manager):
        return [
            datasets.SplitGenerator(name=split, gen_kwargs={"texts": texts})
            for split, texts in self.config.split_texts().items()
        ]

    def _generate_examples(self, texts: list[str]):
        for index, text in enumerate(texts):
            yield index, {"text": text}


for _cls in (StoryCorpusConfig, StoryCorpus):
    # Named after hf_icl.data.builders, which re-exports them (repr and pickling find them there): creating a builder
    # makes datasets patch its class's module for streaming (open, os.path, pathlib.Path become its remote-aware
    # versions), which would break the path handling here (isinstance(entry, Path)) and in the loaders.
    _cls.__module__ = "hf_icl.data.builders"
