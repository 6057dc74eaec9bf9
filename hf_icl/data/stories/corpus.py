"""Story corpora: TinyStories from the Hub, local story files, or the offline template grammar, split into
``train`` / ``validation``; and the cache key of the corpus builder.

:func:`load_story_corpus` returns a ``datasets.DatasetDict`` (one ``text`` column) whose every split names where
its text came from in ``info.description``. :func:`split_indices` is the one train/validation split that both it
and :class:`~hf_icl.data.stories.StoryCorpus` use. :func:`builder_code_hash` digests only the code that generates
a corpus (:data:`CORPUS_CODE_MODULES` and :data:`CORPUS_FORMAT_VERSION`), so editing the tokenizer or the
repetition metrics leaves cached corpora valid.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import random
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ...validation import check_float, check_int
from .grammar import generate_template_stories

if TYPE_CHECKING:  # datasets is imported where used, so importing this module stays light
    import datasets

#: The separator of stories in TinyStories' own text files, and the tokenizer's end-of-text token.
END_OF_TEXT = "<|endoftext|>"
TINYSTORIES_HUB_ID = "roneneldan/TinyStories"
#: Sources that are not paths.
NAMED_SOURCES = ("tinystories", "template")
DEFAULT_TEMPLATE_STORIES = 2000
#: The builder's sources: the template grammar, or local files (``data_files``).
BUILDER_SOURCES = ("template", "files")
#: Splits ``data_files`` may name; with ``train`` alone, validation is split off as :func:`load_story_corpus` does.
FILE_SPLITS = ("train", "validation", "test")
STORY_FILE_SUFFIXES = (".txt", ".jsonl")

#: The version of the written corpus (the builder's ``VERSION``); bump it when the stored format changes.
CORPUS_FORMAT_VERSION = "1.0.0"
#: The modules whose source generates a corpus: the grammar, the readers and split here, the builder. The
#: tokenizer and the repetition metrics are not among them, so editing those keeps cached corpora.
CORPUS_CODE_MODULES = ("hf_icl.data.stories.grammar", "hf_icl.data.stories.corpus", "hf_icl.data.stories.builder")


def builder_code_hash(modules: tuple[str, ...] = CORPUS_CODE_MODULES) -> str:
    """Digest of the corpus format version and the source of ``modules`` (default :data:`CORPUS_CODE_MODULES`);
    part of the builder's cache key, so editing the code that generates a corpus invalidates cached corpora and
    editing anything else does not."""
    digest = hashlib.sha256(CORPUS_FORMAT_VERSION.encode())
    for name in modules:
        digest.update(inspect.getsource(importlib.import_module(name)).encode())
    return digest.hexdigest()[:16]


def template_description(seed: int, n_stories: int) -> str:
    """How a template corpus is reported: synthetic stories of this grammar, with the seed and the count."""
    return f"template stories (hf_icl.data.stories template grammar, seed {seed}, {n_stories} stories)"


def split_story_text(content: str) -> list[str]:
    """Stories of one text file: separated by ``<|endoftext|>`` if the file has one, else by blank lines.

    TinyStories' own ``.txt`` files use ``<|endoftext|>`` (its stories contain blank lines); a plain file of
    short stories uses blank lines. Stories are stripped; empty ones are dropped.

    >>> split_story_text("One.\\n\\nTwo.\\n")
    ['One.', 'Two.']
    >>> split_story_text("A.\\n\\nstill A.\\n<|endoftext|>\\nB.")
    ['A.\\n\\nstill A.', 'B.']
    """
    pieces = content.split(END_OF_TEXT) if END_OF_TEXT in content else re.split(r"\n[ \t]*\n", content)
    return [piece.strip() for piece in pieces if piece.strip()]


def read_story_files(path: str | Path) -> list[str]:
    """The stories at ``path``: a ``.txt`` file (:func:`split_story_text`), a ``.jsonl`` file with a
    ``"text"`` field per line, or a directory whose ``.txt`` files (sorted by name, searched recursively) are
    each read as a text file.

    >>> import tempfile, os
    >>> folder = tempfile.mkdtemp()
    >>> with open(os.path.join(folder, "stories.jsonl"), "w") as f:
    ...     _ = f.write('{"text": "A cat sat."}\\n{"text": "A dog ran."}\\n')
    >>> read_story_files(os.path.join(folder, "stories.jsonl"))
    ['A cat sat.', 'A dog ran.']
    """
    path = Path(path).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise ValueError(f"source {str(path)!r} is a directory without .txt files; put one story file per .txt")
        return [story for file in files for story in split_story_text(file.read_text(encoding="utf-8"))]
    if not path.is_file():
        raise ValueError(
            f"source must be one of {list(NAMED_SOURCES)} or an existing .txt / .jsonl file or directory of .txt "
            f"files, got {str(path)!r}"
        )
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    if path.suffix == ".txt":
        return split_story_text(path.read_text(encoding="utf-8"))
    raise ValueError(f"source file must end in .txt or .jsonl, got {str(path)!r}")


def _read_jsonl(path: Path) -> list[str]:
    stories = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"source {str(path)!r} line {number} is not valid JSON: {error.msg}") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise ValueError(f"source {str(path)!r} line {number} must be an object with a string 'text' field")
        if record["text"].strip():
            stories.append(record["text"].strip())
    return stories


def load_story_corpus(
    source: str | Path,
    *,
    n_stories: int | None = None,
    validation_fraction: float = 0.05,
    seed: int = 0,
) -> datasets.DatasetDict:
    """A story corpus as ``DatasetDict(train=..., validation=...)`` with one ``"text"`` column.

    Args:
        source: where the stories come from, and what results trained on them must report:

            * ``"tinystories"``: ``datasets.load_dataset("roneneldan/TinyStories")`` (needs the Hub; its own
              train / validation splits). Report "TinyStories". Offline this raises ``ConnectionError``.
            * ``"template"``: :func:`generate_template_stories` (offline, synthetic). Report "template stories,
              seed S, N stories": they are not TinyStories and scores on them do not compare with the document's.
            * a path: a ``.txt`` file (stories separated by ``<|endoftext|>``, else by blank lines), a directory of
              ``.txt`` files, or a ``.jsonl`` file with a ``"text"`` field. Report the file and how it was made
              (e.g. ``scripts/make_story_corpus.py --generator smollm2``).
        n_stories: template: how many to generate (default 2000). Path: keep this many after the shuffle
            (default all). TinyStories: keep the first ``n_stories`` training stories and the first
            ``max(1, round(n_stories * validation_fraction))`` validation stories (default all).
        validation_fraction: share of the stories held out for validation (template and paths), in (0, 1);
            ``max(1, round(n * validation_fraction))`` stories, and at least one stays for training.
        seed: the template grammar's seed, and the seed of the shuffle before the split (template and paths).

    Every split's ``info.description`` says where its text came from.

    >>> corpus = load_story_corpus("template", n_stories=20, validation_fraction=0.25, seed=1)
    >>> corpus["train"].num_rows, corpus["validation"].num_rows
    (15, 5)
    >>> corpus["train"].info.description.startswith("template stories")
    True
    """
    validation_fraction = check_float(
        "validation_fraction", validation_fraction, low=0.0, high=1.0, low_inclusive=False
    )
    if validation_fraction >= 1.0:
        raise ValueError(f"validation_fraction must be a number in (0, 1), got {validation_fraction}")
    check_int("seed", seed, low=0)
    if n_stories is not None:
        check_int("n_stories", n_stories, low=2)  # one story for each split at least
    if isinstance(source, str) and source == "tinystories":
        return _load_tinystories(n_stories, validation_fraction)
    if isinstance(source, str) and source == "template":
        count = DEFAULT_TEMPLATE_STORIES if n_stories is None else n_stories
        stories = [story.text for story in generate_template_stories(count, seed)]
        description = template_description(seed, count)
    elif isinstance(source, (str, Path)):
        stories = read_story_files(source)
        description = f"local stories from {str(Path(source).expanduser())!r}"
    else:
        raise ValueError(
            f"source must be one of {list(NAMED_SOURCES)} or a path, got {source!r} ({type(source).__name__})"
        )
    return _split_stories(stories, n_stories, validation_fraction, seed, description)


def validation_size(n_stories: int, validation_fraction: float) -> int:
    """How many of ``n_stories`` go to validation: ``max(1, round(n * fraction))``, leaving one for training."""
    return min(max(1, round(n_stories * validation_fraction)), n_stories - 1)


def split_indices(n_total: int, n_stories: int | None, validation_fraction: float, seed: int) -> dict[str, list[int]]:
    """Which of ``n_total`` stories go to ``train`` and ``validation``: a seeded shuffle (files are often sorted;
    the split should not be), the first ``n_stories`` of it kept, the first :func:`validation_size` of those held
    out. :func:`load_story_corpus` and :class:`StoryCorpus` split the same way.

    >>> split_indices(5, None, 0.4, seed=0)["validation"]
    [4, 3]
    """
    order = list(range(n_total))
    random.Random(f"story-split/{seed}").shuffle(order)
    if n_stories is not None:
        order = order[:n_stories]
    held_out = validation_size(len(order), validation_fraction)
    return {"train": order[held_out:], "validation": order[:held_out]}


def _split_stories(
    stories: list[str], n_stories: int | None, validation_fraction: float, seed: int, description: str
) -> datasets.DatasetDict:
    import datasets

    if len(stories) < 2:
        raise ValueError(f"source holds {len(stories)} stories ({description}); a train/validation split needs >= 2")
    splits = split_indices(len(stories), n_stories, validation_fraction, seed)
    return datasets.DatasetDict(
        {
            name: datasets.Dataset.from_dict(
                {"text": [stories[i] for i in indices]},
                info=datasets.DatasetInfo(description=f"{description}; {name} split"),
            )
            for name, indices in splits.items()
        }
    )


def _load_tinystories(n_stories: int | None, validation_fraction: float) -> datasets.DatasetDict:
    import datasets

    try:
        corpus = datasets.load_dataset(TINYSTORIES_HUB_ID)
    except OSError as error:  # ConnectionError, offline mode, a missing cache: all OSErrors in datasets 5.x
        raise ConnectionError(
            f"source='tinystories' needs {TINYSTORIES_HUB_ID} from the Hugging Face Hub, which could not be "
            f"reached ({type(error).__name__}); pass a local path (TinyStories-train.txt, a .jsonl or a directory "
            "of .txt files) or source='template'"
        ) from error
    splits = {}
    for name in ("train", "validation"):
        split = corpus[name].select_columns(["text"])
        if n_stories is not None:
            keep = n_stories if name == "train" else max(1, round(n_stories * validation_fraction))
            split = split.select(range(min(keep, split.num_rows)))
        split.info.description = f"TinyStories ({TINYSTORIES_HUB_ID}); {name} split"
        splits[name] = split
    return datasets.DatasetDict(splits)
