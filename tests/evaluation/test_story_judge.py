"""The story judge hook: rubric prompt, reply parser, judge_stories with fake judges, the aggregate, and
local_model_judge on a tiny random GPT-2 with a tokenizer trained here (nothing downloads)."""

from __future__ import annotations

import random
import re

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hf_icl.data.stories import generate_template_stories, train_story_tokenizer
from hf_icl.evaluation.story_judge import (
    CONTINUATION_MARK,
    CRITERIA,
    aggregate_scores,
    judge_prompt,
    judge_stories,
    local_model_callable,
    local_model_judge,
    parse_scores,
)

STORY = "Tom had a red ball. The wind blew it into a tree. His dad got a ladder, and Tom was happy."
NONE = dict.fromkeys(CRITERIA)


def scores(grammar=None, consistency=None, plot=None, creativity=None):
    return {"grammar": grammar, "consistency": consistency, "plot": plot, "creativity": creativity}


# ------------------------------------------------------------------ the prompt


def test_prompt_holds_the_story_and_the_rubric():
    prompt = judge_prompt(STORY)
    assert STORY in prompt
    lowered = prompt.lower()
    for criterion in CRITERIA:
        assert lowered.count(criterion) >= 2  # explained once, and asked for in the reply format
        assert f"{criterion.capitalize()}: <score>" in prompt
    assert "from 1" in prompt and "to 10" in prompt
    assert CONTINUATION_MARK not in prompt  # whole-story mode


def test_prompt_for_a_continuation_marks_the_boundary():
    prompt = judge_prompt("the ball into a tree. Tom was sad.", beginning="Tom threw")
    assert f"Tom threw {CONTINUATION_MARK} the ball into a tree. Tom was sad." in prompt
    assert f"only the part after {CONTINUATION_MARK}" in prompt
    assert "with the beginning" in prompt
    with pytest.raises(ValueError, match="story must be a string"):
        judge_prompt(None)
    with pytest.raises(ValueError, match="beginning must be a string"):
        judge_prompt(STORY, beginning=3)


# ------------------------------------------------------------------ the parser

WELL_FORMED = [
    ("Grammar: 8\nConsistency: 7\nPlot: 6\nCreativity: 5", scores(8, 7, 6, 5)),
    ("**Grammar**: 9/10\n**Consistency**: 8/10\n**Plot**: 7/10\n**Creativity**: 6/10", scores(9, 8, 7, 6)),
    ("grammar - 4 out of 10, consistency - 5 out of 10, plot - 6 out of 10, creativity - 3 out of 10",
     scores(4, 5, 6, 3)),
    ('{"grammar": 7, "consistency": "8", "plot": 9, "creativity": 10}', scores(7, 8, 9, 10)),
    ("| Criterion | Score |\n|---|---|\n| Grammar | 8 |\n| Consistency | 6 |\n| Plot | 5 |\n| Creativity | 4 |",
     scores(8, 6, 5, 4)),
    ("Sure! Here are my grades.\nGrammar score is 7.5\nConsistency: 6.5\nPlot: 1\nCreativity: 2\nHope it helps.",
     scores(7.5, 6.5, 1, 2)),
    ("Grammar (1-10): 3\nConsistency (1-10): 4\nPlot (1-10): 5\nCreativity (1-10): 6", scores(3, 4, 5, 6)),
    ("GRAMMAR = 10\nCONSISTENCY = 10\nPLOT = 9\nCREATIVITY = 8\nGrammar: 10", scores(10, 10, 9, 8)),  # same twice
]  # fmt: skip

MALFORMED = [
    ("", NONE),
    ("I really liked this story about a ball!", NONE),
    ("Grammar: <score>\nConsistency: <score>\nPlot: <score>\nCreativity: <score>", NONE),  # the format echoed
    ("Grammar: 1-10\nConsistency: 1-10\nPlot: 7-8\nCreativity: 5", scores(creativity=5)),  # ranges are no score
    ("Grammar: 0\nConsistency: 11\nPlot: 85\nCreativity: -3", NONE),  # outside 1-10
    ("Grammar: 4/5\nConsistency: 80/100\nPlot: 8/10\nCreativity: 3 out of 5", scores(plot=8)),  # other scales
    ("Grammar: 8\nConsistency: 7\nGrammar: 6", scores(grammar=None, consistency=7)),  # contradicts itself
    ("The plot has 2 characters and the grammar contains 3 errors.", NONE),  # numbers in prose are no scores
    ("Grammar: 8, Plot: 6", scores(grammar=8, plot=6)),  # partial
    ("Grammar: 7.5.3\nPlot: 12345\nCreativity: 07", NONE),
]


@pytest.mark.parametrize("reply, expected", WELL_FORMED + MALFORMED)
def test_parse_scores(reply, expected):
    assert parse_scores(reply) == {name: None if value is None else float(value) for name, value in expected.items()}


def test_parser_never_crashes_and_never_invents_a_score():
    """Random replies mixing criteria names, separators and numbers: every score is None or a number in 1–10
    that the reply writes right after its criterion's name."""
    rng = random.Random(0)
    pieces = [*CRITERIA, "Grammar", "PLOT", ":", "-", "/", "/10", " out of ", "|", "**", " is ", "score", "\n", " ",
              "1-10", "7", "10", "0", "3.5", "42", "-", "{", '"', ",", "(", ")", "<score>", "ü", "🙂"]  # fmt: skip
    for _ in range(3000):
        reply = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 25)))
        parsed = parse_scores(reply)
        assert set(parsed) == set(CRITERIA)
        for name, value in parsed.items():
            if value is None:
                continue
            assert 1 <= value <= 10
            number = f"{value:g}"
            pattern = rf"{name}[^0-9]{{0,30}}?(?<![0-9.]){re.escape(number)}(?:\.0)?(?![0-9]|\.[0-9])"
            assert re.search(pattern, reply, re.IGNORECASE), (reply, name, value)
    with pytest.raises(ValueError, match="reply must be a string"):
        parse_scores(None)


# ------------------------------------------------------------------ judge_stories with fake judges


def test_fake_judge_end_to_end():
    stories = [story.text for story in generate_template_stories(6, seed=2)]
    prompts = []

    def judge(prompt: str) -> str:
        prompts.append(prompt)
        index = len(prompts) - 1
        if index % 3 == 2:
            return "What a lovely story! I would give it a high grade."  # garbled: no scores
        return f"Grammar: {index + 1}\nConsistency: {10 - index}/10\nPlot: 5\nCreativity: {index % 4 + 1} out of 10"

    results = judge_stories(stories, judge)
    assert prompts == [judge_prompt(story) for story in stories]
    assert [result["story"] for result in results] == stories
    assert [result["prompt"] for result in results] == prompts
    for index, result in enumerate(results):
        if index % 3 == 2:
            assert result["parsed"] is False and result["reply"].startswith("What a lovely story")
            assert all(result[name] is None for name in CRITERIA)
        else:
            assert result["parsed"] is True
            assert (result["grammar"], result["consistency"], result["plot"], result["creativity"]) == (
                index + 1,
                10 - index,
                5,
                index % 4 + 1,
            )
    summary = aggregate_scores(results)
    parsed_indices = [0, 1, 3, 4]
    assert summary["n_stories"] == 6 and summary["n_parsed"] == 4
    assert summary["grammar"] == pytest.approx(sum(i + 1 for i in parsed_indices) / 4)
    assert summary["consistency"] == pytest.approx(sum(10 - i for i in parsed_indices) / 4)
    assert summary["plot"] == 5.0
    assert summary["creativity"] == pytest.approx(sum(i % 4 + 1 for i in parsed_indices) / 4)


def test_judge_with_beginnings_and_bad_arguments():
    seen = []
    results = judge_stories(["ran home.", "sang."], lambda p: seen.append(p) or "Plot: 4", beginnings=["Tom", "Sue"])
    assert seen == [judge_prompt("ran home.", "Tom"), judge_prompt("sang.", "Sue")]
    assert [r["plot"] for r in results] == [4.0, 4.0] and not any(r["parsed"] for r in results)
    with pytest.raises(ValueError, match="beginnings must hold one opening per story"):
        judge_stories(["a", "b"], lambda p: "", beginnings=["x"])
    with pytest.raises(ValueError, match="judge must be a callable"):
        judge_stories(["a"], "gpt-4o")
    with pytest.raises(ValueError, match="judge must return the reply as a string"):
        judge_stories(["a"], lambda p: None)
    with pytest.raises(ValueError, match="one string"):
        judge_stories("a story", lambda p: "")


def test_aggregate_without_parsed_stories():
    summary = aggregate_scores([{**scores(grammar=3), "parsed": False}])
    assert summary == {"n_stories": 1, "n_parsed": 0, **NONE}
    assert aggregate_scores([]) == {"n_stories": 0, "n_parsed": 0, **NONE}


# ------------------------------------------------------------------ a local model as the judge


@pytest.fixture(scope="module")
def tiny_lm():
    corpus = [story.text for story in generate_template_stories(200, seed=0)]
    corpus += ["Grammar: 8\nConsistency: 7\nPlot: 6\nCreativity: 5"] * 20
    tokenizer = train_story_tokenizer(corpus, vocab_size=500)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=1024, n_embd=32, n_layer=1, n_head=2)
    return GPT2LMHeadModel(config).eval(), tokenizer


def test_local_model_judge_runs_and_its_replies_are_parsed(tiny_lm):
    model, tokenizer = tiny_lm
    stories = [story.text for story in generate_template_stories(3, seed=9)]
    results = judge_stories(stories, local_model_judge(model, tokenizer, max_new_tokens=12))
    for story, result in zip(stories, results, strict=True):
        assert isinstance(result["reply"], str)
        assert {name: result[name] for name in CRITERIA} == parse_scores(result["reply"])
        assert all(result[name] is None or 1 <= result[name] <= 10 for name in CRITERIA)
        # the reply is only the new tokens: the same greedy generation done by hand, prompt cut off
        ids = tokenizer(judge_prompt(story), return_tensors="pt")["input_ids"]
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        assert result["reply"] == tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        assert len(tokenizer(result["reply"])["input_ids"]) <= 12


def test_local_model_uses_the_chat_template_and_checks_length(tiny_lm):
    model, tokenizer = tiny_lm
    chat_tokenizer = train_story_tokenizer(["Plot: 7 <user> </user> <bot>"] * 5, vocab_size=300)
    chat_tokenizer.chat_template = (
        "{% for m in messages %}<user>{{ m['content'] }}</user>{% endfor %}"
        "{% if add_generation_prompt %}<bot>{% endif %}"
    )
    seen = []

    class Spy:  # records what generate receives, answers "Plot: 7" after the prompt
        config = model.config
        device = torch.device("cpu")

        def generate(self, input_ids, attention_mask, max_new_tokens, **kwargs):
            seen.append(chat_tokenizer.decode(input_ids[0]))
            answer = chat_tokenizer("Plot: 7", return_tensors="pt")["input_ids"]
            return torch.cat([input_ids, answer], dim=1)

    reply = local_model_callable(Spy(), chat_tokenizer, max_new_tokens=4)("Grade this.")
    assert seen == ["<user>Grade this.</user><bot>"] and reply == "Plot: 7"
    prefilled = local_model_judge(Spy(), chat_tokenizer, max_new_tokens=4, reply_prefix="Grammar: 3 ")("Grade it.")
    assert seen[-1] == "<user>Grade it.</user><bot>Grammar: 3 " and prefilled == "Grammar: 3 Plot: 7"
    assert parse_scores(prefilled) == scores(grammar=3, plot=7)
    small = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=16, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match="exceeds the model's 64 positions"):
        local_model_judge(small, tokenizer, max_new_tokens=8)(judge_prompt(STORY))
    with pytest.raises(ValueError, match="max_new_tokens"):
        local_model_judge(small, tokenizer, max_new_tokens=0)
