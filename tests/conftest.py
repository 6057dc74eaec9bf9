"""The tests' shared fixtures, from the one set of tiny models and tokenizers in :mod:`tiny_models` (a test that
needs another size or seed calls the factory there with its own arguments)."""

from __future__ import annotations

import pytest
from tiny_models import gpt2_like, tiny_gpt2


@pytest.fixture
def gpt2_lm():
    """A fresh :func:`tiny_models.tiny_gpt2` (vocabulary 101, seed 0)."""
    return tiny_gpt2()


@pytest.fixture(scope="module")
def tokenizer():
    """The GPT-2-like byte-level BPE trained on NIAH text (:func:`tiny_models.gpt2_like`), built once per module."""
    return gpt2_like()


@pytest.fixture(autouse=True)
def no_hub_probe(monkeypatch):
    """No test opens a connection to the Hub: the reachability probe behind "not logged in" says it is reachable
    (a test of the unreachable message patches it again)."""
    monkeypatch.setattr("hf_icl.training.hub.hub_unreachable", lambda timeout=3.0: None)


@pytest.fixture
def kept_figures(monkeypatch):
    """``keep(module)`` → a dict that fills, by file name, with every figure ``module.save_figure`` saves (still
    saved, and kept open for the test to look at)."""

    def keep(module) -> dict:
        figures, save = {}, module.save_figure

        def keeping(fig, path, **kwargs):
            figures[path.name] = fig
            return save(fig, path, **kwargs)

        monkeypatch.setattr(module, "save_figure", keeping)
        return figures

    return keep
