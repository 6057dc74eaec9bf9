"""The evaluate.Metric versions of the per-position metrics, and their lazy loading."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from hf_icl.evaluation import load_metric


def test_squared_error_matches_a_per_position_loop_over_batches():
    gen = torch.Generator().manual_seed(0)
    preds, ys = torch.randn(12, 7, generator=gen), torch.randn(12, 7, generator=gen)
    metric = load_metric("icl_squared_error")
    for start in range(0, 12, 5):
        metric.add_batch(predictions=preds[start : start + 5], references=ys[start : start + 5])
    out = metric.compute(normalizer=7.0)
    expected = torch.tensor([sum((preds[b, i] - ys[b, i]).item() ** 2 for b in range(12)) / 12 / 7 for i in range(7)])
    np.testing.assert_allclose(out["squared_error"], expected.numpy(), rtol=1e-6)
    assert out["mean"] == pytest.approx(float(expected.mean()), rel=1e-6)


def test_binary_accuracy_matches_a_numpy_reference():
    rng = np.random.default_rng(1)
    preds = rng.normal(size=(20, 6))
    preds[0, :3] = 0.0  # exactly zero is no label: wrong whatever the reference (Garg et al.'s sign rule)
    refs = np.where(rng.normal(size=(20, 6)) > 0, 1.0, -1.0)
    out = load_metric("icl_accuracy").compute(predictions=preds.tolist(), references=refs.tolist())
    expected = (np.sign(preds) == refs).mean(axis=0)
    np.testing.assert_allclose(out["accuracy"], expected)
    assert out["mean"] == pytest.approx(expected.mean())
    zero = load_metric("icl_accuracy").compute(predictions=[[0.0, 0.0]], references=[[1.0, -1.0]])
    assert zero["accuracy"] == [0.0, 0.0]


def test_categorical_accuracy_compares_class_ids():
    rng = np.random.default_rng(2)
    refs = rng.integers(0, 5, size=(15, 4))
    preds = np.where(rng.random(size=(15, 4)) < 0.6, refs, (refs + 1) % 5)
    out = load_metric("icl_accuracy").compute(
        predictions=preds.tolist(), references=refs.tolist(), target_kind="categorical"
    )
    np.testing.assert_allclose(out["accuracy"], (preds == refs).mean(axis=0))


def test_unknown_metric_and_ragged_prompts_are_refused():
    with pytest.raises(ValueError, match="unknown ICL metric 'mse'"):
        load_metric("mse")
    with pytest.raises(ValueError, match="same length N"):
        load_metric("icl_squared_error").compute(predictions=[[1.0, 2.0], [1.0]], references=[[1.0, 2.0], [0.0]])


def test_metrics_load_evaluate_only_on_first_use():
    code = (
        "import sys, hf_icl.evaluation as ev\n"
        "before = 'evaluate' in sys.modules or 'datasets' in sys.modules\n"
        "metric = ev.load_metric('icl_accuracy')\n"
        "print(before, 'evaluate' in sys.modules, type(metric).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "ICLAccuracy"]
