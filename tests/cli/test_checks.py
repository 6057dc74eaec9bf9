"""hf_icl.cli.checks: refusals worded in the command line's spelling."""

import doctest

import hf_icl.cli.checks
from hf_icl.cli.checks import flag_spelling

FIELDS = ["overwrite_output_dir", "resume_from_checkpoint", "seeds", "learning_rate", "push_to_hub", "seed"]


def test_python_spellings_of_training_arguments_become_flags():
    message = "resume_from_checkpoint='/a b/step-1' holds NaN; seeds=3, learning_rate=0.001) push_to_hub=False"
    assert flag_spelling(message, FIELDS) == (
        "--resume_from_checkpoint '/a b/step-1' holds NaN; --seeds 3, --learning_rate 0.001) --push_to_hub False"
    )
    assert flag_spelling("overwrite_output_dir=True", FIELDS) == "--overwrite_output_dir"
    # only whole argument names: a longer name is not rewritten by its prefix, other words stay
    assert flag_spelling("random_seed=3 and seed=4 (n_dims=5)", FIELDS) == "random_seed=3 and --seed 4 (n_dims=5)"


def test_docstring_examples_run():
    assert doctest.testmod(hf_icl.cli.checks).failed == 0
