"""Story corpora for the language-modelling side of the functional-GD study (TinyStories-style text).

The GD document trains a functional-GD language model and a one-layer GPT-2 on TinyStories and grades
their stories. This package gives both models the same data and the same tokenizer:

* :mod:`.grammar`: :func:`generate_template_stories`, an offline template grammar (synthetic, not TinyStories).
* :mod:`.corpus`: :func:`load_story_corpus` returns a ``datasets.DatasetDict`` (``train`` / ``validation``, one
  ``text`` column) from TinyStories on the Hub, from local files, or from the template grammar. Every split's
  ``info.description`` names where its text came from; results must report it, because a model trained on
  template stories is not comparable to the document's. :func:`builder_code_hash` is the builder's cache key.
* :mod:`.builder` (imported on first access, it needs ``datasets``): :class:`StoryCorpus` /
  :class:`StoryCorpusConfig`, the same template or local-file corpora as a ``datasets`` builder (written to the
  ``datasets`` cache; ``save_to_disk`` / ``push_to_hub``). TinyStories needs none:
  ``datasets.load_dataset("roneneldan/TinyStories")``.
* :mod:`.tokenizer`: :func:`train_story_tokenizer`, a byte-level BPE trained on the corpus with an end-of-text
  token, and :func:`pack_stories`: stories → fixed-length blocks of token ids for causal-LM training.

The repetition metrics (``distinct_n``, ``repetition_rate``, ``story_tokens``) live in
:mod:`hf_icl.evaluation.repetition`; their old names here still work, with a ``DeprecationWarning``.

Example::

    >>> corpus = load_story_corpus("template", n_stories=40, validation_fraction=0.1, seed=0)
    >>> corpus["train"].num_rows, corpus["validation"].num_rows
    (36, 4)
    >>> tokenizer = train_story_tokenizer(corpus["train"]["text"], vocab_size=400)
    >>> text = corpus["validation"]["text"][0]
    >>> tokenizer.decode(tokenizer(text)["input_ids"]) == text
    True
"""

from ...deprecation import moved
from .corpus import (
    BUILDER_SOURCES,
    CORPUS_CODE_MODULES,
    CORPUS_FORMAT_VERSION,
    DEFAULT_TEMPLATE_STORIES,
    END_OF_TEXT,
    FILE_SPLITS,
    NAMED_SOURCES,
    STORY_FILE_SUFFIXES,
    TINYSTORIES_HUB_ID,
    builder_code_hash,
    load_story_corpus,
    read_story_files,
    split_indices,
    split_story_text,
    template_description,
    validation_size,
)
from .grammar import (
    STORY_ADJECTIVES,
    STORY_NOUNS,
    STORY_VERBS,
    TemplateStory,
    Verb,
    generate_template_stories,
    sample_story_words,
)
from .tokenizer import PAD_TOKEN, pack_stories, train_story_tokenizer

#: Served by :mod:`.builder`, imported on first access: it subclasses ``datasets`` types.
_BUILDER_CLASSES = ("StoryCorpus", "StoryCorpusConfig")
#: Old names of the repetition metrics, now in :mod:`hf_icl.evaluation.repetition` (deprecated here; data sits
#: below evaluation, so they are imported only when asked for).
MOVED_TO_EVALUATION = dict.fromkeys(("distinct_n", "repetition_rate", "story_tokens"), "hf_icl.evaluation.repetition")


def _builder_class(name: str):
    if name in _BUILDER_CLASSES:
        from . import builder

        globals().update({cls: getattr(builder, cls) for cls in _BUILDER_CLASSES})  # served directly from now on
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__getattr__ = moved(__name__, MOVED_TO_EVALUATION, fallback=_builder_class)


__all__ = [
    "BUILDER_SOURCES",
    "CORPUS_CODE_MODULES",
    "CORPUS_FORMAT_VERSION",
    "DEFAULT_TEMPLATE_STORIES",
    "END_OF_TEXT",
    "FILE_SPLITS",
    "NAMED_SOURCES",
    "PAD_TOKEN",
    "STORY_ADJECTIVES",
    "STORY_FILE_SUFFIXES",
    "STORY_NOUNS",
    "STORY_VERBS",
    "TINYSTORIES_HUB_ID",
    "StoryCorpus",
    "StoryCorpusConfig",
    "TemplateStory",
    "Verb",
    "builder_code_hash",
    "generate_template_stories",
    "load_story_corpus",
    "pack_stories",
    "read_story_files",
    "sample_story_words",
    "split_indices",
    "split_story_text",
    "template_description",
    "train_story_tokenizer",
    "validation_size",
]
