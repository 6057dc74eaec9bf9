"""Grading generated stories with a judge model: grammar, consistency, plot and creativity, each 1–10.

The GD document grades the stories of its functional-GD language model and of a one-layer GPT-2 with GPT-4o,
as TinyStories did with GPT-4. This module is that hook, with the grader left open:

* :func:`judge_prompt`: the rubric prompt (written for this package; the same four criteria and the 1–10 scale).
* :func:`judge_stories`: send each story to ``judge``, any callable ``prompt -> reply`` (a GPT-4o API wrapper
  for numbers comparable with the document's, or :func:`local_model_judge` around a local causal LM).
* :func:`parse_scores`: the four scores from a free-text reply; anything it cannot read with certainty is
  ``None`` (never a guessed score), and the raw reply is kept.
* :func:`aggregate_scores`: means over the stories whose four scores all parsed, and how many did.

A local model such as SmolLM2-135M-Instruct is a *stand-in* judge: it runs offline, but it is not GPT-4o, its
scores are noisy and do not compare with the document's; report which judge produced every number.

Example::

    >>> def judge(prompt):  # a stand-in grader that always gives the same reply
    ...     return "Grammar: 8\\nConsistency: 7\\nPlot: 6/10\\nCreativity: 5 out of 10"
    >>> results = judge_stories(["Tom had a red ball. He lost it. He found it."], judge)
    >>> results[0]["grammar"], results[0]["plot"], results[0]["parsed"]
    (8.0, 6.0, True)
    >>> aggregate_scores(results)["creativity"]
    5.0
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from ..validation import check_int

#: The rubric's criteria, in the order of the reply format.
CRITERIA = ("grammar", "consistency", "plot", "creativity")
SCORE_RANGE = (1, 10)
#: Marks where a given story beginning ends and the graded continuation starts (as in TinyStories' grading).
CONTINUATION_MARK = "***"

_RUBRIC = """\
You are a teacher grading a short story for young children. The story was written by a small language \
model (the student). {task}

{story_block}

Score the {part} from 1 (very poor) to 10 (excellent) on each of these:
- Grammar: are the sentences grammatical, with words used correctly?
- Consistency: do the characters, objects and events stay the same from sentence to sentence{consistency_extra}?
- Plot: does the story make sense, with a beginning, a problem or event, and an ending?
- Creativity: is the story original and interesting, not generic and not repeating itself?

Answer with exactly these four lines and nothing else:
Grammar: <score>
Consistency: <score>
Plot: <score>
Creativity: <score>"""

_WHOLE_STORY = {
    "task": "Read the whole story.",
    "part": "story",
    "consistency_extra": "",
}
_CONTINUATION = {
    "task": (
        f"The student was given the beginning of the story and wrote the rest; the mark {CONTINUATION_MARK} "
        f"separates them. Grade only the part after {CONTINUATION_MARK}, and check that it goes on from the "
        "beginning, including finishing a sentence that the mark cuts in two."
    ),
    "part": "student's part",
    "consistency_extra": ", and with the beginning",
}


def judge_prompt(story: str, beginning: str | None = None) -> str:
    """The rubric prompt for one story: grammar, consistency, plot and creativity, each scored 1–10.

    With ``beginning`` (a story opening the model was given), the prompt shows ``beginning *** story`` and
    asks to grade only the continuation, as TinyStories' evaluation does; otherwise the whole story is graded.

    >>> prompt = judge_prompt("Tom had a red ball.")
    >>> "Tom had a red ball." in prompt and "Creativity: <score>" in prompt
    True
    """
    if not isinstance(story, str):
        raise ValueError(f"story must be a string, got {type(story).__name__}")
    if beginning is None:
        return _RUBRIC.format(story_block=f"Story:\n{story.strip()}", **_WHOLE_STORY)
    if not isinstance(beginning, str):
        raise ValueError(f"beginning must be a string or None, got {type(beginning).__name__}")
    block = f"Story:\n{beginning.rstrip()} {CONTINUATION_MARK} {story.lstrip()}".rstrip()
    return _RUBRIC.format(story_block=block, **_CONTINUATION)


# A criterion's name, then a separator (":", "=", "-", "|", "is"; markdown and quotes around it allowed), then
# a number without leading zeros, optionally "/10" or "out of 10". "1-10" right after the separator is the scale
# echoed, not a score.
_SCORE = re.compile(
    r"\b(?P<name>grammar|consistency|plot|creativity)\b"
    r"[\s*_\"'`]*(?:\(\s*1\s*[-–]\s*10\s*\))?[\s*_\"'`]*(?:score)?[\s*_\"'`]*"
    r"(?:[:=|\-–]|\bis\b)[\s*_\"'`]*"
    r"(?P<value>(?:0|[1-9]\d*)(?:\.\d+)?)(?![\d.]*\d)"
    r"(?P<range>\s*[-–]\s*\d)?"
    r"(?:\s*(?:/|out\s+of)\s*(?P<scale>\d+(?:\.\d+)?))?",
    re.IGNORECASE,
)


def parse_scores(reply: str) -> dict[str, float | None]:
    """The four scores in a judge's reply; a criterion is ``None`` unless the reply gives it unambiguously.

    Read: ``Grammar: 8``, ``**Plot**: 7/10``, ``Creativity - 6 out of 10``, ``"consistency": 9`` (JSON),
    ``| Grammar | 8 |`` (a table row), ``Grammar score is 7.5``. ``None`` when the criterion is missing, its
    number is outside 1–10, its scale is not 10 (``4/5`` is not rescaled), it is the echoed range ``1-10``, or
    the reply gives it twice with different values. Never raises on any string.

    >>> parse_scores("Grammar: 8\\nConsistency: 11\\nPlot: 4/5")
    {'grammar': 8.0, 'consistency': None, 'plot': None, 'creativity': None}
    """
    if not isinstance(reply, str):
        raise ValueError(f"reply must be a string, got {type(reply).__name__}")
    found: dict[str, set[float | None]] = {name: set() for name in CRITERIA}
    for match in _SCORE.finditer(reply):
        if match["range"]:
            continue  # "Grammar: 1-10" restates the scale
        found[match["name"].lower()].add(_checked_score(match["value"], match["scale"]))
    return {name: (values.pop() if len(values) == 1 else None) for name, values in found.items()}


def _checked_score(value: str, scale: str | None) -> float | None:
    score = float(value)
    if scale is not None and float(scale) != SCORE_RANGE[1]:
        return None
    low, high = SCORE_RANGE
    return score if low <= score <= high and math.isfinite(score) else None


def judge_stories(
    stories: Sequence[str],
    judge: Callable[[str], str],
    *,
    beginnings: Sequence[str] | None = None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Grade every story with ``judge`` and parse the replies.

    Args:
        stories: the generated stories (or continuations, with ``beginnings``).
        judge: a callable ``prompt -> reply``: an API client of a strong grader (GPT-4o in the document), or
            :func:`local_model_judge` around a local causal LM (a stand-in judge, e.g. SmolLM2-135M-Instruct).
        beginnings: the story openings the model continued, one per story (``None``: grade whole stories).
        progress: show progress (a bar at a terminal, plain lines in a log file).

    Returns one dict per story: ``story``, ``prompt``, ``reply`` (raw, always kept), the four scores
    (float or ``None``, see :func:`parse_scores`) and ``parsed`` (all four present).

    >>> judge_stories(["A story."], lambda prompt: "I liked it.")[0]["parsed"]
    False
    """
    if isinstance(stories, str):
        raise ValueError("stories must be a sequence of stories, got one string")
    if not callable(judge):
        raise ValueError(f"judge must be a callable prompt -> reply, got {type(judge).__name__}")
    if beginnings is not None and len(beginnings) != len(stories):
        raise ValueError(f"beginnings must hold one opening per story ({len(stories)}), got {len(beginnings)}")
    from ..progress import progress_bar

    results = []
    bar = progress_bar(len(stories), "judge", progress)
    for index, story in enumerate(stories):
        prompt = judge_prompt(story, None if beginnings is None else beginnings[index])
        reply = judge(prompt)
        if not isinstance(reply, str):
            raise ValueError(f"judge must return the reply as a string, got {type(reply).__name__} for story {index}")
        scores = parse_scores(reply)
        parsed = all(score is not None for score in scores.values())
        results.append({"story": story, "prompt": prompt, "reply": reply, **scores, "parsed": parsed})
        bar.update(1)
    bar.close()
    return results


def aggregate_scores(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean of each criterion over the stories whose four scores all parsed, and the counts.

    Only fully parsed stories count, so the four means are over the same stories. Returns ``n_stories``,
    ``n_parsed`` and one mean per criterion (``None`` when no story parsed).

    >>> aggregate_scores([{"grammar": 8.0, "consistency": 6.0, "plot": 4.0, "creativity": 2.0},
    ...                   {"grammar": 9.0, "consistency": None, "plot": 4.0, "creativity": 2.0}])
    {'n_stories': 2, 'n_parsed': 1, 'grammar': 8.0, 'consistency': 6.0, 'plot': 4.0, 'creativity': 2.0}
    """
    complete = [result for result in results if all(result.get(name) is not None for name in CRITERIA)]
    summary: dict[str, Any] = {"n_stories": len(results), "n_parsed": len(complete)}
    for name in CRITERIA:
        summary[name] = sum(result[name] for result in complete) / len(complete) if complete else None
    return summary


def local_model_callable(
    model, tokenizer, *, max_new_tokens: int = 64, reply_prefix: str = "", **generate_kwargs
) -> Callable[[str], str]:
    """``prompt -> reply`` from a local causal LM: the prompt through the tokenizer's chat template when it has
    one (instruction-tuned models such as SmolLM2-135M-Instruct), ``model.generate``, the new tokens decoded.

    ``reply_prefix`` is written as the start of the model's answer (prefilled, e.g. ``"Grammar:"`` to start the
    score format) and is returned as the start of the reply, so the parser reads what the model continued.
    ``generate_kwargs`` go to ``generate`` (e.g. ``do_sample=True, temperature=0.8``); greedy by default.
    """
    import torch

    check_int("max_new_tokens", max_new_tokens, low=1)
    if not isinstance(reply_prefix, str):
        raise ValueError(f"reply_prefix must be a string, got {type(reply_prefix).__name__}")
    limit = getattr(model.config, "max_position_embeddings", None)
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    generate_kwargs = {"do_sample": False, "pad_token_id": pad_token_id, **generate_kwargs}

    def reply(prompt: str) -> str:
        if getattr(tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": prompt}]
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt += reply_prefix
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"].to(model.device)
        if limit is not None and ids.shape[1] + max_new_tokens > limit:
            raise ValueError(
                f"prompt of {ids.shape[1]} tokens + max_new_tokens={max_new_tokens} exceeds the model's "
                f"{limit} positions; use a shorter story or fewer new tokens"
            )
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, **generate_kwargs
            )
        return reply_prefix + tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    return reply


def local_model_judge(model, tokenizer, max_new_tokens: int = 48, *, reply_prefix: str = "") -> Callable[[str], str]:
    """A stand-in judge from a local causal LM and its tokenizer, greedy, for :func:`judge_stories`.

    Meant for an offline run with e.g. SmolLM2-135M-Instruct (``AutoModelForCausalLM.from_pretrained(DIR,
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")``). It is NOT GPT-4o, and a 135M model is a poor grader: on
    six stories here it answered the rubric in prose every time (nothing parsed); with
    ``reply_prefix="Grammar:"`` it gave the four score lines for one of six others (1/1/1/1, for a well-formed
    template story).
    Report its numbers as "SmolLM2-135M stand-in judge" with the parsed count, never as GPT-4o scores.
    The four-line answer needs about 20 tokens; ``max_new_tokens`` leaves room for chatter around it.

    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> from hf_icl.data.stories import train_story_tokenizer
    >>> tokenizer = train_story_tokenizer(["Grammar: 8. Plot: 7."] * 20, vocab_size=300)
    >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=16, n_layer=1, n_head=2))
    >>> reply = local_model_judge(model, tokenizer, max_new_tokens=5)("Tom ran.")
    >>> isinstance(reply, str)
    True
    """
    return local_model_callable(model, tokenizer, max_new_tokens=max_new_tokens, reply_prefix=reply_prefix)
