"""hf_icl.validation: the argument checks and the one "did you mean" every unknown-name message uses."""

import doctest

import hf_icl.validation
from hf_icl.validation import did_you_mean


def test_did_you_mean_names_the_close_candidates_only():
    assert did_you_mean("least_square", ["least_squares", "ridge", "lasso"]) == "did you mean 'least_squares'?"
    assert did_you_mean("rige", ["ridge", "rigid", "lasso"]) == "did you mean 'ridge' or 'rigid'?"
    assert did_you_mean("n_layerz", ["n_layer", "n_head"], n=1) == "did you mean 'n_layer'?"
    assert did_you_mean("completely_else", ["ridge", "lasso"]) == ""


def test_docstring_examples_run():
    assert doctest.testmod(hf_icl.validation).failed == 0
