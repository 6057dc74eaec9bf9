"""The needles of the needle-in-a-haystack prompts: RULER's variants, their templates, and the seeded draws of
keys and values (see :mod:`hf_icl.data.niah` for how a prompt is put together).

Templates hold markers: ``{passkey}`` (``single``), ``{key}`` and ``{value}`` (multikey, multivalue) and ``{kind}``
(the value kind's name). Values are :data:`VALUE_KINDS`: random digits, a word of :data:`WORDS` or a UUID4-format
string; every draw comes from :func:`cell_rng`, one generator per prompt cell and purpose.
"""

from __future__ import annotations

import random
import uuid

from ..validation import check_choice

PASSKEY = "{passkey}"
DEFAULT_NEEDLE = "The pass key is {passkey}. Remember it. {passkey} is the pass key."
DEFAULT_QUESTION = " What is the pass key? The pass key is"
KEY = "{key}"
VALUE = "{value}"
KIND = "{kind}"
#: RULER's needle for the key-value variants (multikey, multivalue)
KEY_VALUE_NEEDLE = "One of the special magic {kind}s for {key} is: {value}."
# the questions end with the needle's colon: greedy exact match then starts at the value (RULER's own questions end
# in "is" and score by substring, which a model answering ": 60191" passes; exact match would not)
MULTIKEY_QUESTION = (
    " What is the special magic {kind} for {key} mentioned in the provided text?"
    " The special magic {kind} for {key} mentioned in the provided text is:"
)
MULTIVALUE_QUESTION = (
    " What are all the special magic {kind}s for {key} mentioned in the provided text?"
    " The special magic {kind}s for {key} mentioned in the provided text are:"
)
#: needle variants: one passkey, several keys (one asked for), several values of one key (all asked for)
VARIANTS = ("single", "multikey", "multivalue")
#: what a needle's value is: random digits, a word of WORDS, a UUID4-format string
VALUE_KINDS = ("number", "word", "uuid")
#: the variants' needle and question templates, used where ``needle_template`` / ``question`` are None
VARIANT_TEMPLATES = {
    "single": (DEFAULT_NEEDLE, DEFAULT_QUESTION),
    "multikey": (KEY_VALUE_NEEDLE, MULTIKEY_QUESTION),
    "multivalue": (KEY_VALUE_NEEDLE, MULTIVALUE_QUESTION),
}
#: Keys and word values: common lowercase nouns and adjectives, none of them a word of the built-in haystacks
#: or the templates.
WORDS = tuple(
    """
    apple arm army baby bag ball band bank bar base basket bath bear bed bee belt bench bike blade blanket board
    body bone book boot bottle bowl box brain branch brick bucket butter button cabin cake camera camp candle
    candy cap car card carpet castle cat cave chain chair chalk cheese cherry chest chicken circle city cloth coat
    coffee coin collar copper corn cotton cow crown desk diamond dinner dish doctor door dragon drawer dress drum
    duck eagle egg elbow engine eye face farm feather fence finger fire fish flag floor flute fork fox frog fruit
    game ghost gift glass glove goat gold grape guitar hammer hand harbor hat heart helmet honey hook horse hotel
    house ice island jacket jar jelly jewel judge kettle king kitchen kite knife ladder lamp lemon letter library
    lion lock map marble market mask meadow medal metal milk mirror money monkey motor mouse mouth nail nest net
    nose notebook ocean office onion orange owl oven paint palace pan paper parrot peach pear pen pencil pepper
    piano pie pig pillow pilot pipe planet plate pocket potato prince puzzle queen rabbit radio ribbon ring robot
    rocket rope rose salt saw scarf shark sheep shell ship shirt shoe silver singer sink skirt sock soap soup
    spoon square station statue stick storm sugar suit sword tail teacher tent thread tiger toast tooth towel
    tower toy train truck tunnel turtle umbrella vase violin wagon wallet watch wheel whistle window wing wolf
    yarn zebra angry bold brave bright broad busy cheap clean clever cold cool crazy curly dark deep dirty dry
    eager empty fair famous fancy fast fat flat fluffy free friendly funny gentle giant glad grand happy hard
    heavy honest huge hungry icy kind large lazy loud lucky mighty narrow neat nervous noisy odd pink plain polite
    poor proud purple rapid rare red rich rough round rude sad safe sharp shiny short shy silly simple slim slow
    smart smooth soft solid sour spicy steep sticky strange strong sweet swift thick thin tiny tough ugly wet wide
    wild wise wooden young
    """.split()
)


def cell_rng(purpose: str, seed: int, context_length: int, depth: float, sample: int) -> random.Random:
    """A generator of its own for every cell and purpose, so cells are independent and reproducible."""
    return random.Random(f"{purpose}/{seed}/{context_length}/{depth!r}/{sample}")  # str seeds: same in every process


def make_passkey(rng: random.Random, digits: int) -> str:
    """``digits`` random digits, the first nonzero (so the passkey has exactly that many digits)."""
    return str(rng.randint(1, 9)) + "".join(str(rng.randint(0, 9)) for _ in range(digits - 1))


def make_value(rng: random.Random, value_kind: str, digits: int) -> str:
    """A random value of ``value_kind``: :func:`make_passkey`'s digits, a word of :data:`WORDS` or a UUID4-format
    string (its 122 random bits from ``rng``, so seeded, unlike ``uuid.uuid4()``)."""
    if value_kind == "number":
        return make_passkey(rng, digits)
    if value_kind == "word":
        return rng.choice(WORDS)
    check_choice("value_kind", value_kind, VALUE_KINDS)
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def distinct_values(rng: random.Random, value_kind: str, digits: int, count: int, taken: set[str]) -> list[str]:
    """``count`` values of :func:`make_value`, distinct from each other and from ``taken``."""
    values: list[str] = []
    while len(values) < count:
        value = make_value(rng, value_kind, digits)
        if value not in taken and value not in values:
            values.append(value)
    return values
