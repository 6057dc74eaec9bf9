"""Story corpora for the language-modelling side of the functional-GD study (TinyStories-style text).

The GD document trains a functional-GD language model and a one-layer GPT-2 on TinyStories and grades
their stories. This module gives both models the same data and the same tokenizer:

* :func:`load_story_corpus` returns a ``datasets.DatasetDict`` (``train`` / ``validation``, one ``text``
  column) from TinyStories on the Hub, from local files, or from an offline template grammar
  (:func:`generate_template_stories`). Every split's ``info.description`` names where its text came from;
  results must report it, because a model trained on template stories is not comparable to the document's.
* :class:`StoryCorpus` / :class:`StoryCorpusConfig`: the same template or local-file corpora as a ``datasets``
  builder (written to the ``datasets`` cache; ``save_to_disk`` / ``push_to_hub``). TinyStories needs none:
  ``datasets.load_dataset("roneneldan/TinyStories")``.
* :func:`train_story_tokenizer`: a byte-level BPE trained on the corpus, with an end-of-text token.
* :func:`pack_stories`: stories → fixed-length blocks of token ids for causal-LM training.
* :func:`distinct_n` and :func:`repetition_rate`: repetition of generated stories (the document's typical
  failure mode of both models is repetitive generation).

Example::

    >>> corpus = load_story_corpus("template", n_stories=40, validation_fraction=0.1, seed=0)
    >>> corpus["train"].num_rows, corpus["validation"].num_rows
    (36, 4)
    >>> tokenizer = train_story_tokenizer(corpus["train"]["text"], vocab_size=400)
    >>> text = corpus["validation"]["text"][0]
    >>> tokenizer.decode(tokenizer(text)["input_ids"]) == text
    True
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import random
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ..validation import check_choice, check_float, check_int

if TYPE_CHECKING:  # datasets and transformers are imported where used, so importing this module stays light
    import datasets
    import torch
    from transformers import PreTrainedTokenizerFast

#: The separator of stories in TinyStories' own text files, and the tokenizer's end-of-text token.
END_OF_TEXT = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
TINYSTORIES_HUB_ID = "roneneldan/TinyStories"
#: Sources that are not paths.
NAMED_SOURCES = ("tinystories", "template")
DEFAULT_TEMPLATE_STORIES = 2000


# ----------------------------------------------------------------------------------------------------------
# The template grammar: the TinyStories recipe (one random verb, noun and adjective per story, words a
# 3-year-old knows) filled into a character → object → problem → resolution → ending plan.
# ----------------------------------------------------------------------------------------------------------


class Verb(NamedTuple):
    """A recipe verb with the forms the templates need and a phrase that makes it a complete activity."""

    base: str
    past: str
    ing: str
    activity: str

    @property
    def forms(self) -> tuple[str, str, str]:
        return (self.base, self.past, self.ing)


STORY_VERBS = (
    Verb("jump", "jumped", "jumping", "over the puddles"),
    Verb("dance", "danced", "dancing", "to happy songs"),
    Verb("sing", "sang", "singing", "songs with the birds"),
    Verb("paint", "painted", "painting", "bright pictures"),
    Verb("swim", "swam", "swimming", "in the pond"),
    Verb("climb", "climbed", "climbing", "up the little hill"),
    Verb("run", "ran", "running", "in the tall grass"),
    Verb("hop", "hopped", "hopping", "around the yard"),
    Verb("build", "built", "building", "towers with blocks"),
    Verb("draw", "drew", "drawing", "funny faces"),
    Verb("bake", "baked", "baking", "yummy cookies"),
    Verb("read", "read", "reading", "books about the stars"),
    Verb("explore", "explored", "exploring", "the woods"),
    Verb("skip", "skipped", "skipping", "down the path"),
    Verb("dig", "dug", "digging", "in the sand"),
    Verb("splash", "splashed", "splashing", "in the water"),
    Verb("roll", "rolled", "rolling", "down the grassy hill"),
    Verb("hide", "hid", "hiding", "behind the big tree"),
    Verb("clap", "clapped", "clapping", "along to music"),
    Verb("race", "raced", "racing", "with the wind"),
    Verb("decorate", "decorated", "decorating", "the house with flowers"),
    Verb("collect", "collected", "collecting", "pretty stones"),
    Verb("plant", "planted", "planting", "seeds in the garden"),
    Verb("whistle", "whistled", "whistling", "little tunes"),
    Verb("bounce", "bounced", "bouncing", "on the bed"),
    Verb("spin", "spun", "spinning", "round and round"),
    Verb("crawl", "crawled", "crawling", "under the table"),
    Verb("sail", "sailed", "sailing", "little paper boats"),
    Verb("count", "counted", "counting", "the stars"),
    Verb("fish", "fished", "fishing", "at the lake"),
    Verb("march", "marched", "marching", "like a soldier"),
    Verb("wave", "waved", "waving", "at the boats"),
)
#: Recipe nouns: small things a child can own, lose, get muddy or be asked to share.
STORY_NOUNS = (
    "ball", "kite", "hat", "scarf", "ribbon", "balloon", "feather", "book", "doll", "teddy", "truck", "boat",
    "train", "cup", "box", "basket", "bucket", "shoe", "sock", "mitten", "shell", "stone", "coin", "key", "ring",
    "bell", "drum", "whistle", "crayon", "map", "blanket", "pillow", "flag", "umbrella", "button", "necklace",
    "crown", "wand", "spoon", "robot",
)  # fmt: skip
#: Recipe adjectives: ones that describe such things.
STORY_ADJECTIVES = (
    "red", "blue", "green", "yellow", "pink", "purple", "orange", "big", "small", "tiny", "shiny", "soft",
    "fluffy", "round", "bright", "colorful", "sparkly", "pretty", "new", "old", "special", "smooth", "warm",
    "funny", "striped", "spotty", "golden", "silver", "fancy", "lovely",
)  # fmt: skip

_GIRL_NAMES = ("Lily", "Mia", "Sue", "Anna", "Lucy", "Zoe", "Amy", "Emma", "Ella", "Rose", "Kim", "Daisy")
_BOY_NAMES = ("Tom", "Ben", "Sam", "Max", "Tim", "Jack", "Leo", "Bob", "Joe", "Finn", "Jake", "Dan")
_ANIMAL_KINDS = ("bunny", "puppy", "kitten", "bird", "bear", "duck", "frog", "mouse", "fox", "pig")
_TRAITS = ("little", "kind", "happy", "curious", "brave", "shy", "silly", "sweet", "gentle")
_RELATIVES = ("mom", "dad", "grandma", "grandpa")
_NAUGHTY_ANIMALS = ("squirrel", "monkey", "crow", "goat", "raccoon")
_PLACES = (("park", "in the park"), ("garden", "in the garden"), ("beach", "at the beach"),
           ("forest", "in the forest"), ("farm", "on the farm"), ("meadow", "in the meadow"),
           ("playground", "at the playground"))  # fmt: skip

_OPENINGS = (
    "Once upon a time, there was a {trait} {kind} named {name}.",
    "Once upon a time, in a small town, there lived a {trait} {kind} called {name}.",
    "There was once a {trait} {kind} named {name} who lived near the {place}.",
    "{name} was a {trait} {kind} who lived in a little house near the {place}.",
    "One sunny morning, a {trait} {kind} named {name} woke up with a big smile.",
)
_LIKINGS = (  # every one uses the recipe verb
    "{she} loved to {verb} {activity}.",
    "Every day, {name} liked to {verb} {activity}.",
    "{her_} favorite thing to do was {verbing} {activity}.",
    "More than anything, {name} wanted to {verb} {activity} all day long.",
    "{name} was very good at {verbing} {activity}.",
)
_OBJECTS = (  # every one uses the recipe noun and adjective
    "{she} had {a_adjective} {adjective} {noun} that {she} loved very much.",
    "One day, {name} found {a_adjective} {adjective} {noun} {at_place}.",
    "For {her_} birthday, {her_} {relative} gave {her} {a_adjective} {adjective} {noun}.",
    "{name} had {a_adjective} {adjective} {noun}. It was {her_} most special thing.",
    "On the way to the {place}, {name} saw {a_adjective} {adjective} {noun} on the ground. {she} picked it up and "
    "smiled.",
)
_FRIENDS = (  # the friend is introduced before any later sentence names them
    "{name} had a good friend, a {friend_kind} named {friend}.",
    "{her_} best friend was {friend}, a {trait2} {friend_kind}.",
    "{name} often played with {friend}, a {friend_kind} who lived next door.",
)
_OUTINGS = (
    "One day, {name} took the {noun} to the {place}.",
    "The next morning, {name} went to play {at_place} with the {noun}.",
    "{name} and {friend} went to the {place} to play.",
)
# Each problem: how it starts, how it is solved, what the child learns.
_PROBLEMS = {
    "lost": (
        (
            "But when it was time to go home, the {noun} was gone!",
            "Then {name} put the {noun} down to {verb} {activity}. When {she} came back, the {noun} was gone!",
        ),
        (
            "{friend} came to help. They looked and looked. At last, {friend} found the {noun} under a pile of leaves.",
            "Then {name} heard a bark. A friendly dog ran up with the {noun} in its mouth.",
            "{her_} {relative} helped {her} look. The {noun} was behind a big rock.",
        ),
        ("{name} learned to always keep {her_} things close.", "After that, {name} was careful with {her_} {noun}."),
    ),
    "stuck": (
        (
            "Suddenly, a strong wind blew the {noun} high up into a tall tree.",
            "{name} threw the {noun} up in the air, and it got stuck in a tree.",
        ),
        (
            "{her_} {relative} got a long ladder and climbed up to get it.",
            "{friend} had an idea. {friend_she} shook the branch, and the {noun} fell down into {name}'s arms.",
        ),
        ("{name} learned that friends can help when things are hard.", "{name} said thank you with a big hug."),
    ),
    "muddy": (
        (
            "Then {name} tripped, and the {noun} fell into a big puddle of mud.",
            "It started to rain, and the {noun} fell in the mud.",
        ),
        (
            "{name} and {her_} {relative} washed the {noun} with warm water and soap until it looked as good as new.",
            "{friend} helped {her} clean the {noun} with a soft cloth.",
        ),
        ("{name} learned to be more careful.", "From then on, {name} kept the {noun} away from puddles."),
    ),
    "taken": (
        (
            "Just then, a naughty {animal} grabbed the {noun} and ran away!",
            "While {name} was not looking, a {animal} took the {noun} and hid it in a bush.",
        ),
        (
            '{name} ran after the {animal}. "Please give it back!" {she} said. The {animal} stopped and dropped the '
            "{noun}.",
            "{friend} helped {her} chase the {animal} until it let go of the {noun}.",
        ),
        ("{name} learned to be brave and to ask nicely.", "The {animal} never took the {noun} again."),
    ),
    "share": (
        (
            '{friend} saw the {noun} and wanted to play with it too. "Can I have it?" {friend} asked. {name} did not '
            "want to share.",
            '{friend} wanted the {noun} too. "It is mine!" said {name}, and the two friends began to fight.',
        ),
        (
            'Then {name} saw that {friend} was sad. "We can play with it together," {name} said. They took turns, '
            "and it was much more fun.",
            '{her_} {relative} said, "Sharing is kind." So {name} let {friend} play with the {noun} too.',
        ),
        ("{name} learned that sharing makes everyone happy.", "Now {name} and {friend} share everything."),
    ),
    "pond": (
        (
            "Oops! The {noun} fell into the pond and began to float away.",
            "{name} dropped the {noun}, and it rolled into the pond.",
        ),
        (
            "A kind duck swam over and pushed the {noun} back to the shore.",
            "{her_} {relative} used a long stick to pull the {noun} out of the water.",
        ),
        ("{name} learned to stay away from the edge of the pond.", "{name} hugged the {noun} and smiled."),
    ),
}
_FEELINGS = (
    "{name} felt very sad.",
    "{name} started to cry.",
    "{name} did not know what to do.",
    '"Oh no!" said {name}. "My {noun}!"',
    "{she} was very worried.",
)
_ENDINGS = (  # the recipe verb again, after the problem is solved
    "After that, {name} and {friend} {verbed} {activity} together until the sun went down.",
    "Then {name} went back to {verbing} {activity}, happier than ever.",
    "The next day, {name} took the {noun} along when {she} went to {verb} {activity}.",
)
_CLOSINGS = (
    "{name} was very happy.",
    "From that day on, {name} always took good care of {her_} {adjective} {noun}.",
    "And they all lived happily ever after.",
    "It was the best day ever.",
)


class TemplateStory(NamedTuple):
    """One template story and the recipe words it was written around (``verb`` is the base form)."""

    text: str
    verb: str
    noun: str
    adjective: str


def sample_story_words(rng: random.Random) -> tuple[Verb, str, str]:
    """The TinyStories recipe: one random verb, noun and adjective (from :data:`STORY_VERBS` etc.).

    >>> verb, noun, adjective = sample_story_words(random.Random(0))
    >>> verb in STORY_VERBS and noun in STORY_NOUNS and adjective in STORY_ADJECTIVES
    True
    """
    return rng.choice(STORY_VERBS), rng.choice(STORY_NOUNS), rng.choice(STORY_ADJECTIVES)


def generate_template_stories(n_stories: int, seed: int = 0) -> list[TemplateStory]:
    """``n_stories`` TinyStories-style stories from the template grammar, deterministic per ``seed``.

    Each story draws a verb, a noun and an adjective (:func:`sample_story_words`), a main character and a
    friend, a place, one of six problems with its resolution and lesson, and one template per sentence slot,
    so stories vary in wording and plot. Stories are two or three short paragraphs joined by single newlines
    (no blank lines, so they survive a blank-line-separated text file). The first ``k`` stories of a seed do
    not depend on ``n_stories``. This is synthetic text, not TinyStories: report it as "template stories".

    >>> story = generate_template_stories(1, seed=3)[0]
    >>> story.noun in story.text and story.adjective in story.text
    True
    """
    check_int("n_stories", n_stories, low=1)
    check_int("seed", seed, low=0)
    rng = random.Random(f"template-stories/{seed}")  # a str seed: the same stream in every process
    return [_template_story(rng) for _ in range(n_stories)]


def _character(rng: random.Random, avoid: str = "") -> dict[str, str]:
    girl = rng.random() < 0.5
    name = rng.choice([n for n in (_GIRL_NAMES if girl else _BOY_NAMES) if n != avoid])
    kind = rng.choice(_ANIMAL_KINDS) if rng.random() < 0.4 else ("girl" if girl else "boy")
    pronouns = ("she", "her", "her") if girl else ("he", "him", "his")
    return {"name": name, "kind": kind, "she": pronouns[0], "her": pronouns[1], "her_": pronouns[2]}


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _capitalize(sentence: str) -> str:
    """Upper-case the first letter (a sentence may open with a quote or a pronoun slot)."""
    for index, char in enumerate(sentence):
        if char.isalpha():
            return sentence[:index] + char.upper() + sentence[index + 1 :]
    return sentence


def _fill(template: str, slots: dict[str, str]) -> str:
    # Sentences inside one template (". She") are capitalised too.
    parts = re.split(r"(?<=[.!?]) (?=\S)", template.format(**slots))
    return " ".join(_capitalize(part) for part in parts)


def _template_story(rng: random.Random) -> TemplateStory:
    verb, noun, adjective = sample_story_words(rng)
    hero = _character(rng)
    friend = _character(rng, avoid=hero["name"])
    place, at_place = rng.choice(_PLACES)
    slots = {
        **hero,
        "friend": friend["name"],
        "friend_kind": friend["kind"],
        "friend_she": friend["she"],
        "trait": rng.choice(_TRAITS),
        "trait2": rng.choice(_TRAITS),
        "relative": rng.choice(_RELATIVES),
        "animal": rng.choice(_NAUGHTY_ANIMALS),
        "place": place,
        "at_place": at_place,
        "verb": verb.base,
        "verbed": verb.past,
        "verbing": verb.ing,
        "activity": verb.activity,
        "noun": noun,
        "adjective": adjective,
        "a_adjective": _article(adjective),
    }
    starts, fixes, lessons = _PROBLEMS[rng.choice(sorted(_PROBLEMS))]
    opening = [rng.choice(_OPENINGS), rng.choice(_LIKINGS), rng.choice(_OBJECTS)]
    if rng.random() < 0.5:
        opening.insert(1, opening.pop(2))  # the object before the liking, sometimes
    opening.insert(rng.randint(2, 3), rng.choice(_FRIENDS))
    middle = [rng.choice(_OUTINGS)] if rng.random() < 0.6 else []
    middle += [rng.choice(starts), rng.choice(_FEELINGS), rng.choice(fixes)]
    ending = [rng.choice(_ENDINGS), rng.choice(lessons)]
    if rng.random() < 0.5:
        ending.append(rng.choice(_CLOSINGS))
    paragraphs = [opening, middle, ending] if rng.random() < 0.5 else [opening, middle + ending]
    text = "\n".join(" ".join(_fill(sentence, slots) for sentence in paragraph) for paragraph in paragraphs)
    return TemplateStory(text=text, verb=verb.base, noun=noun, adjective=adjective)


# ----------------------------------------------------------------------------------------------------------
# Corpora: TinyStories, local files, the template grammar
# ----------------------------------------------------------------------------------------------------------


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
        description = f"template stories (hf_icl.data.stories template grammar, seed {seed}, {count} stories)"
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


# ----------------------------------------------------------------------------------------------------------
# The ``datasets`` builder: template stories or local files written to the datasets cache (Arrow), for
# ``save_to_disk`` / ``push_to_hub``. Its classes subclass ``datasets`` types, so they are defined on first
# access (module ``__getattr__``): importing this module must not import ``datasets``.
# ----------------------------------------------------------------------------------------------------------

#: The builder's sources: the template grammar, or local files (``data_files``).
BUILDER_SOURCES = ("template", "files")
#: Splits ``data_files`` may name; with ``train`` alone, validation is split off as :func:`load_story_corpus` does.
FILE_SPLITS = ("train", "validation", "test")
STORY_FILE_SUFFIXES = (".txt", ".jsonl")
_BUILDER_CLASSES = ("StoryCorpus", "StoryCorpusConfig")


def __getattr__(name: str):
    if name in _BUILDER_CLASSES:
        return _builder_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def builder_code_hash() -> str:
    """Digest of this module's source (the template grammar, the readers, the builder); part of the builder's
    cache key, so editing any of them invalidates cached corpora."""
    return hashlib.sha256(inspect.getsource(sys.modules[__name__]).encode()).hexdigest()[:16]


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


@functools.cache
def _builder_classes() -> dict[str, type]:
    import datasets

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
                raise ValueError(
                    f"data_files splits must include 'train' and be among {list(FILE_SPLITS)}, got {splits}"
                )
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
                return f"template stories (hf_icl.data.stories template grammar, seed {self.seed}, {count} stories)"
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
        builder writes them to the ``datasets`` cache (keyed by the config, the files' contents and this module's
        code), so ``as_dataset()`` memory-maps them and ``save_to_disk`` / ``push_to_hub`` publish them.
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

        VERSION = datasets.Version("1.0.0")
        BUILDER_CONFIG_CLASS = StoryCorpusConfig

        def __init__(self, *args, hash: str | None = None, data_files=None, **kwargs):
            kwargs.setdefault("dataset_name", "story_corpus")  # the cache folder (datasets names it by module)
            super().__init__(
                *args, hash=hash or builder_code_hash(), data_files=_expand_story_paths(data_files), **kwargs
            )

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

    classes = {"StoryCorpusConfig": StoryCorpusConfig, "StoryCorpus": StoryCorpus}
    for name, cls in classes.items():
        # Named after hf_icl.data.builders, which re-exports them (repr and pickling find them there): creating a
        # builder makes datasets patch its class's module for streaming (open, os.path, pathlib.Path become its
        # remote-aware versions), which would break this module's loaders (isinstance(source, Path)).
        cls.__module__, cls.__qualname__ = "hf_icl.data.builders", name
        globals()[name] = cls
    return classes


# ----------------------------------------------------------------------------------------------------------
# Tokenizer and packing
# ----------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------
# Repetition metrics
# ----------------------------------------------------------------------------------------------------------

_WORD = re.compile(r"\w+(?:'\w+)*|[^\w\s]")


def story_tokens(text: str) -> list[str]:
    """The tokens the repetition metrics count: lower-cased words (``don't`` is one) and punctuation marks.

    >>> story_tokens("Tom ran. Tom's dog didn't!")
    ['tom', 'ran', '.', "tom's", 'dog', "didn't", '!']
    """
    return _WORD.findall(text.lower())


def _ngrams(story: str | Sequence, n: int) -> list[tuple]:
    if isinstance(story, str):
        tokens = story_tokens(story)
    else:  # token ids; a tensor's elements would hash by identity, so compare its values
        tokens = story.tolist() if hasattr(story, "tolist") else list(story)
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def distinct_n(texts: Sequence[str | Sequence[int]], n: int) -> float:
    """distinct-n: the number of distinct n-grams divided by the number of n-grams, over all ``texts``.

    N-grams do not cross story boundaries. A story is a string (counted in :func:`story_tokens`) or a
    sequence of tokens (e.g. token ids, a list or a 1-D tensor). 1.0 means no n-gram occurs twice; repetitive
    generation drives it towards 0. NaN when the texts hold no n-gram at all (the ratio is undefined, not 0 or 1).

    >>> distinct_n(["the cat sat", "the cat ran"], 2)
    0.75
    """
    distinct, total = _ngram_counts(texts, n)
    return distinct / total if total else float("nan")


def _ngram_counts(texts, n: int) -> tuple[int, int]:
    check_int("n", n, low=1)
    if isinstance(texts, str):
        raise ValueError("texts must be a sequence of stories, got one string")
    grams = [gram for text in texts for gram in _ngrams(text, n)]
    return len(set(grams)), len(grams)


def repetition_rate(text: str | Sequence[int], n: int = 3) -> float:
    """The share of a story's n-grams that repeat an earlier n-gram of the same story: ``1 - distinct_n([text], n)``.

    0.0 for a story without repeats; a story stuck in a loop approaches 1. NaN for a story shorter than ``n``
    tokens.

    >>> repetition_rate("the dog ran and the dog ran", 3)
    0.2
    """
    distinct, total = _ngram_counts([text], n)
    return (total - distinct) / total if total else float("nan")
