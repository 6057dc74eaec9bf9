"""The front door refuses bad command lines before torch is imported, and refuses exactly what the live parsers
refuse: each line below is run through both."""

import contextlib
import io
import subprocess
import sys

import pytest

from hf_icl.cli.argument_specs import command_parsers
from hf_icl_cli.early_checks import check_command_line

#: lines the live parsers accept (the README's spellings and the other one, switches, lists, JSON, choices)
GOOD = [
    ["train", "--max_steps", "5", "--n-dims", "3", "--bf16", "false", "--model_type", "sgpt"],
    ["train", "--config", "configs/quickstart.yaml", "--max-steps", "10", "--overwrite_output_dir"],
    ["train", "--disable-tqdm", "--lr_scheduler_type", "cosine", "--task_params", '{"noise_std": 0.1}'],
    ["evaluate", "--model", "runs/x", "--task-params", '{"a": 1}', "--estimators", "least_squares,knn", "--no-log-y"],
    ["compare", "--task", "linear_regression", "--n_points", "8", "--log-y"],
    ["niah", "--model", "m", "--lengths", "256,512", "--depths", "0,0.5", "--sparsities", "", "--kept-blocks", "16"],
    ["perplexity", "--model", "m", "--length", "4096,8192", "--policies", "magnitude,streaming", "--dtype", "float32"],
    ["reproduce", "sgpt", "fig1", "--steps", "3", "--retrain"],
    ["dataset", "--n-train", "10", "--save-to-disk", "out"],
    ["push", "folder", "user/name", "--private"],
    ["quickstart", "--max-steps", "3"],
    ["tasks"],
]
#: lines the live parsers refuse for a reason the front door can see
BAD = [
    (["train", "--max-steps", "ten"], "invalid int value: 'ten'"),
    (["train", "--max_stepz", "3"], "unrecognized arguments: --max_stepz"),
    (["train", "--model-type", "gpt3"], "invalid choice: 'gpt3'"),
    (["train", "--fp16", "maybe"], "Truthy value expected"),
    (["evaluate"], "required: --model"),
    (["evaluate", "--model", "m", "--task-params", "[1]"], "expected a JSON object"),
    (["compare", "--task", "linear_regresion"], "invalid choice: 'linear_regresion'"),
    (["niah", "--model", "m", "--lengths", "1,a"], "expected comma-separated integers"),
    (["perplexity", "--model", "m"], "required: --length"),
    (["reproduce", "nopaper", "fig1"], "invalid choice: 'nopaper'"),
    (["quickstart", "--steps", "3"], "unrecognized arguments: --steps 3"),
    (["push", "folder"], "required: repo_id"),
]


def _live_refusal(argv):
    """The live parser's message for ``argv``, or None when it accepts the line."""
    parser = command_parsers()[argv[0]]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            parser.parse_args(argv[1:])  # the parse alone (train's dataclass would check values too)
        except SystemExit as stop:
            assert stop.code == 2
            return err.getvalue()
    return None


@pytest.mark.parametrize("argv", GOOD, ids=lambda a: " ".join(a)[:40])
def test_lines_the_live_parser_accepts_pass_the_front_door(argv):
    assert _live_refusal(argv) is None, "the corpus line itself is wrong"
    check_command_line(argv)  # no SystemExit


@pytest.mark.parametrize(("argv", "words"), BAD, ids=lambda a: " ".join(a)[:40] if isinstance(a, list) else "")
def test_lines_the_live_parser_refuses_are_refused_at_the_door_with_the_same_words(argv, words, capsys):
    live = _live_refusal(argv)
    assert live is not None and words in live
    with pytest.raises(SystemExit) as stop:
        check_command_line(argv)
    assert stop.value.code == 2
    early = capsys.readouterr().err
    assert words in early
    assert early.splitlines()[-1] == live.splitlines()[-1]  # the same error line


def test_a_bad_line_is_refused_without_importing_torch_or_hf_icl():
    code = (
        "import sys, hf_icl_cli\n"
        "try:\n"
        "    hf_icl_cli.main(['train', '--max-steps', 'ten'])\n"
        "except SystemExit as stop:\n"
        "    print('exit', stop.code)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'hf_icl') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["exit", "2", "[]"]
    assert "hf-icl train: error: argument --max-steps/--max_steps: invalid int value: 'ten'" in result.stderr


#: integer flags below their minimum: refused at the door with the live command's own line
BELOW_MINIMUM = [
    ["quickstart", "--max-steps", "0"],
    ["compare", "--n_points", "0"],
    ["evaluate", "--model", "m", "--n-prompts", "-5"],
    ["dataset", "--n-train", "-1"],
    ["niah", "--model", "m", "--samples", "0"],
    ["niah", "--model", "m", "--variant", "multikey", "--keys", "1"],
    ["perplexity", "--model", "m", "--length", "4096,1"],
]


@pytest.mark.parametrize("argv", BELOW_MINIMUM, ids=lambda a: " ".join(a)[:40])
def test_a_flag_below_its_minimum_gets_the_live_commands_line_at_the_door(argv, capsys):
    from hf_icl.cli import main

    assert main(argv) == 2  # the live command: its one-line error, before any work
    live = capsys.readouterr().err.strip()
    assert "must be an integer in [" in live and len(live.splitlines()) == 1
    with pytest.raises(SystemExit) as stop:
        check_command_line(argv)
    assert stop.value.code == 2 and capsys.readouterr().err.strip() == live
