"""The offline template grammar of story corpora: TinyStories-style stories without a download.

The TinyStories recipe (one random verb, noun and adjective per story, words a 3-year-old knows) filled into a
character → object → problem → resolution → ending plan. :func:`generate_template_stories` is what the template
corpora of :mod:`hf_icl.data.stories` hold; this module's source is part of the corpus builder's cache key
(:func:`~hf_icl.data.stories.corpus.builder_code_hash`), so editing the grammar regenerates cached corpora.
"""

from __future__ import annotations

import random
import re
from typing import NamedTuple

from ...validation import check_int


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
