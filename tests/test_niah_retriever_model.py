"""The shipped passkey retriever (models/niah-retriever) really retrieves: fresh passkeys, greedy decoding."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_icl.data.niah import NeedleInAHaystackConfig

MODEL = Path(__file__).resolve().parent.parent / "models" / "niah-retriever"


@pytest.fixture(scope="module")
def retriever():
    return AutoModelForCausalLM.from_pretrained(MODEL).eval(), AutoTokenizer.from_pretrained(MODEL)


def test_retriever_finds_fresh_passkeys_at_every_depth_up_to_1024_tokens(retriever):
    model, tokenizer = retriever
    prompts = NeedleInAHaystackConfig(
        tokenizer=tokenizer, context_lengths=[256, 1024], depths=[0.0, 0.5, 1.0], samples_per_cell=2, seed=12345
    )
    hits = []
    with torch.no_grad():
        for row in prompts.rows():
            ids = torch.tensor([row["input_ids"]])
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=len(row["answer_ids"]),
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
            hits.append(tokenizer.decode(out[0, ids.shape[1] :]).strip() == row["answer"])
    assert len(hits) == 12 and sum(hits) >= 11, hits  # 100% on its 300-prompt held-out set


def test_retriever_does_not_answer_without_the_needle(retriever):
    """Control: with the passkey sentence cut out, the same prompts must not yield the passkey."""
    model, tokenizer = retriever
    prompts = NeedleInAHaystackConfig(
        tokenizer=tokenizer, context_lengths=[256], depths=[0.5], samples_per_cell=4, seed=7
    )
    with torch.no_grad():
        for row in prompts.rows():
            start, end = row["needle_start"], row["needle_end"]
            ids = torch.tensor([row["input_ids"][:start] + row["input_ids"][end:]])
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=len(row["answer_ids"]),
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
            assert tokenizer.decode(out[0, ids.shape[1] :]).strip() != row["answer"]
