"""The ICL forward docstring written once (hf_icl.modeling.forward_docs): every model that uses it shows the whole
text through inspect.getdoc, with its own phrases and the shared Args entries, wrapped to the package's width."""

from __future__ import annotations

import inspect

import pytest

from hf_icl import GPT2ForInContextRegression, LinearGPTForInContextRegression, SGPTForInContextRegression
from hf_icl.modeling.forward_docs import (
    LOSS_POSITIONS,
    SUMMARY,
    WIDTH,
    add_forward_docstring,
    icl_forward_docstring,
)


@pytest.mark.parametrize(
    "model_class", [GPT2ForInContextRegression, SGPTForInContextRegression, LinearGPTForInContextRegression]
)
def test_each_model_shows_the_shared_text_with_its_own_phrases(model_class):
    doc = inspect.getdoc(model_class.forward)
    assert doc.startswith(SUMMARY) and "\nArgs:\n" in doc
    joined = " ".join(line.strip() for line in doc.splitlines())
    assert f"loss_positions: {LOSS_POSITIONS}" in joined
    assert "check_inputs: check the prompt's *values*" in joined
    assert all(len(line) <= WIDTH for line in doc.splitlines())


def test_the_docstring_lists_entries_in_order_and_the_decorator_sets_it():
    text = icl_forward_docstring(nan_cause="a reason", output_hidden_states="also return the states.")
    names = [line.split(":")[0].strip() for line in text.splitlines() if line.startswith("    ") and ":" in line]
    assert names[:3] == ["loss_positions", "output_hidden_states", "check_inputs"]
    assert "(a reason)" in " ".join(text.split())

    @add_forward_docstring(text)
    def forward(xs, ys):
        return xs

    assert inspect.getdoc(forward) == inspect.cleandoc(text) and forward(1, 2) == 1
