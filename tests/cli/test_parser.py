"""The command line keeps the HF stack's conventions: both option spellings everywhere, typed choices in
``--help``, a torch-free front door, and the training arguments' transformers names."""

import argparse
import json
import re
import subprocess
import sys
import warnings

import pytest
from transformers import HfArgumentParser

import hf_icl_cli
from hf_icl.cli import build_parser, main
from hf_icl.modeling import MODEL_CLASSES
from hf_icl.options import both_spellings
from hf_icl.training import ICLTrainingArguments

TRANSFORMERS_NAMES = (
    "max_steps",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "logging_steps",
    "eval_steps",
    "save_steps",
    "save_total_limit",
    "output_dir",
    "overwrite_output_dir",
    "report_to",
    "run_name",
    "seed",
    "bf16",
    "fp16",
    "push_to_hub",
    "hub_model_id",
    "resume_from_checkpoint",
)


def _sub_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_subcommand_option_takes_both_spellings():
    checked = 0
    for name, sub in _sub_parsers(build_parser()).items():
        for action in sub._actions:
            longs = [o for o in action.option_strings if o.startswith("--") and o not in ("--help", "--version")]
            for option in longs:
                if option.startswith("--no-") or option.startswith("--no_"):
                    continue  # BooleanOptionalAction's negations follow their option
                assert set(both_spellings((option,))) <= set(action.option_strings), (name, option)
                checked += 1
    assert checked > 50
    args = build_parser().parse_args(["compare", "--n_prompts", "7", "--n-points", "5"])
    assert (args.n_prompts, args.n_points) == (7, 5)


def test_train_accepts_both_spellings_and_lists_typed_choices(capsys):
    parser = HfArgumentParser(ICLTrainingArguments)
    snake = parser.parse_args_into_dataclasses(["--max_steps", "7", "--lr_scheduler_type", "cosine"])[0]
    kebab = parser.parse_args_into_dataclasses(["--max-steps", "7", "--lr-scheduler-type", "cosine"])[0]
    assert snake == kebab and snake.max_steps == 7 and snake.lr_scheduler_type == "cosine"
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for choices in (
        "{constant,constant_with_warmup,linear,cosine}",
        "{tensorboard,wandb,none}",
        "{tiny,small,standard,none}",
        "{" + ",".join(MODEL_CLASSES) + "}",  # every registered architecture, in registration order
    ):
        assert choices in text
    assert "(default: None)" not in text and "(default: 50)" in text  # logging_steps's default, stated once
    subcommands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, subparser in subcommands.items():  # a default is stated once, and "None" is not stated
        text = " ".join(subparser.format_help().split())
        assert "(default: None)" not in text and not re.search(r"\(default: [^)]*\) \(default:", text), name
    with pytest.raises(SystemExit):
        parser.parse_args_into_dataclasses(["--lr_scheduler_type", "step"])
    with pytest.raises(SystemExit):
        parser.parse_args_into_dataclasses(["--model_type", "gpt3"])
    with pytest.raises(ValueError, match="model_type must be one of"):
        ICLTrainingArguments(model_type="gpt3")  # the dataclass checks it too (YAML, Python callers)


def test_training_arguments_use_transformers_names():
    names = {f for f in ICLTrainingArguments.__dataclass_fields__}
    assert set(TRANSFORMERS_NAMES) <= names
    for old in ("train_steps", "batch_size", "lr_scheduler", "logging_every", "mixed_precision", "progress_bar"):
        assert old not in names
    assert ICLTrainingArguments(bf16=True).mixed_precision == "bf16"
    assert ICLTrainingArguments().mixed_precision == "no"
    with pytest.raises(ValueError, match="bf16=True and fp16=True"):
        ICLTrainingArguments(bf16=True, fp16=True)
    with pytest.raises(ValueError, match="hub_model_id='me/x' without push_to_hub"):
        ICLTrainingArguments(hub_model_id="me/x")


def test_old_names_in_files_are_renamed_with_a_warning(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("train_steps: 12\nbatch_size: 16\nlogging_every: 3\nmixed_precision: bf16\nprogress_bar: false\n")
    with pytest.warns(FutureWarning, match="'train_steps' is now called 'max_steps'"):
        args = ICLTrainingArguments.from_yaml(path)
    assert (args.max_steps, args.per_device_train_batch_size, args.logging_steps) == (12, 16, 3)
    assert args.bf16 and not args.fp16 and args.disable_tqdm
    with pytest.raises(ValueError, match="'train_steps' is the old name of 'max_steps'"):
        ICLTrainingArguments.from_dict({"train_steps": 1, "max_steps": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # today's names: no warning
        ICLTrainingArguments.from_dict({"max_steps": 5})


def test_front_door_answers_help_and_version_without_torch():
    code = (
        "import sys, hf_icl_cli\n"
        "for argv in (['--help'], ['--version']):\n"
        "    try:\n"
        "        hf_icl_cli.main(argv)\n"
        "    except SystemExit as done:\n"
        "        assert done.code == 0, done.code\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'hf_icl') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out
    for command in hf_icl_cli.COMMANDS:
        assert command in out
    assert f"hf-icl {hf_icl_cli.version()}" in out


def test_front_door_lists_exactly_the_commands_hf_icl_cli_runs():
    assert set(_sub_parsers(build_parser())) == set(hf_icl_cli.COMMANDS)


def test_front_door_hands_commands_on(capsys):
    assert hf_icl_cli.main(["tasks"]) == 0
    assert "linear_regression:" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        hf_icl_cli.main([])
    assert done.value.code == 2  # a command is required


def test_training_args_json_round_trips(tmp_path):
    args = ICLTrainingArguments(max_steps=9, run_name="r", bf16=True)
    again = ICLTrainingArguments.from_dict(json.loads(json.dumps(args.to_dict())))
    assert again == args


def test_import_hf_icl_leaves_the_heavy_optional_libraries_unimported():
    """What ``import hf_icl`` may cost beyond torch + transformers.modeling_utils is its own modules: plotting,
    tables, datasets and the classical-ML libraries load when first used (``hf-icl bench startup`` times it)."""
    heavy = ("matplotlib", "sklearn", "xgboost", "pandas", "datasets", "tensorboard")
    code = f"import sys, hf_icl\nprint(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_examples_in_the_new_modules_run():
    import doctest

    import hf_icl.data.saved_prompts
    import hf_icl.options

    for module in (hf_icl.options, hf_icl.data.saved_prompts):
        assert doctest.testmod(module, raise_on_error=True).attempted > 0


def test_every_command_help_is_served_without_torch_and_equals_the_live_parser():
    """``hf-icl COMMAND --help`` comes from hf_icl_cli/help_texts.json (no torch, no hf_icl import); the stored text
    must be what the parsers print (after changing a flag: python -m hf_icl.cli.help_texts)."""
    import json
    import subprocess
    import sys

    from hf_icl.benchmarks import BENCHMARKS
    from hf_icl.cli import argument_specs
    from hf_icl.cli.help_texts import HELP_FILE, render_all
    from hf_icl_cli.commands import COMMANDS

    stored = json.loads(HELP_FILE.read_text())
    assert set(stored) == set(COMMANDS) | {f"bench {name}" for name in BENCHMARKS}
    stale = [command for command, text in render_all().items() if stored[command] != text]
    assert not stale, f"help_texts.json is stale for {stale}: run python -m hf_icl.cli.help_texts"
    assert json.loads(argument_specs.ARGUMENTS_FILE.read_text()) == argument_specs.render_all(), (
        "arguments.json is stale: run python -m hf_icl.cli.help_texts"
    )
    # every command, every benchmark, and reproduce with its positionals (argparse prints reproduce's help there)
    asked = [[c, "--help"] for c in COMMANDS] + [["bench", n, "-h"] for n in BENCHMARKS] + [["reproduce", "sgpt", "-h"]]
    code = (
        "import sys, hf_icl_cli\n"
        f"for argv in {asked!r}:\n"
        "    assert hf_icl_cli.main(argv) == 0\n"
        "print(sorted(m for m in ('torch', 'transformers', 'hf_icl') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"
    for usage in ("hf-icl train", "hf-icl niah", "hf-icl bench cab", "hf-icl bench seeds", "hf-icl reproduce"):
        assert f"usage: {usage}" in result.stdout


def test_train_help_lists_kebab_case_first_like_every_other_command_and_takes_both():
    from hf_icl.cli.icl_commands import train_parser

    usage = train_parser().format_usage()
    assert "--max-steps MAX_STEPS" in usage and "--max_steps" not in usage
    parser = train_parser()
    for spelling in ("--max-steps", "--max_steps"):
        assert parser.parse_args_into_dataclasses([spelling, "7"])[0].max_steps == 7
