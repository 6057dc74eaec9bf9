"""The ICL commands: ``hf-icl quickstart``, ``train``, ``evaluate``, ``push``, ``compare``, ``tasks``, ``dataset``
and ``reproduce`` (each ``run_*`` takes the parsed arguments; ``run_train`` its own argv)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from ..data.tasks import TASK_REGISTRY, get_task
from ..evaluation.baselines import default_baselines, estimator_for_task
from .checks import (
    CLIError,
    DefaultsFormatter,
    check_estimator_names,
    existing_file,
    hub_offline,
    load_config,
    model_source,
    one_line,
    parse_device,
    writable,
)

DEFAULT_N_DIMS = 5  # compare's input dimension for families that have no default of their own


def run_quickstart(args) -> int:
    from ..quickstart import format_report, run_quickstart

    writable("--output-dir", args.output_dir, directory=True)
    overrides = {"max_steps": args.max_steps} if args.max_steps is not None else {}
    report = run_quickstart(args.output_dir, seed=args.seed, eval_prompts=args.n_prompts, **overrides)
    print(format_report(report))
    return 0 if report.passed else 1


def _refuse_unasked_full_run(args, config: str | None, flags: list[str]) -> None:
    """Garg et al.'s standard run (the defaults: 500,001 steps of a standard-size GPT-2) is a GPU job: on a machine
    without one it starts only when asked for, by a --config or an explicit --max_steps."""
    import torch

    from ..training.arguments import ICLTrainingArguments

    default_steps = ICLTrainingArguments.__dataclass_fields__["max_steps"].default
    given = any(flag.split("=")[0] in ("--max_steps", "--max-steps") for flag in flags)
    if config is None and not given and args.max_steps == default_steps and not torch.cuda.is_available():
        raise CLIError(
            f"--max_steps is {default_steps:,} by default: Garg et al.'s full run of a {args.model_size}-size model, "
            "a job of days for a GPU; this machine has none, so pass --max_steps (e.g. --max_steps 5000) or a "
            "--config to run that long here on purpose (make quickstart trains a small model in minutes)"
        )


def train_parser() -> argparse.ArgumentParser:
    """``hf-icl train``'s parser: every :class:`ICLTrainingArguments` field a flag (transformers' ``HfArgumentParser``),
    listed kebab-case first like every other command's (``--max-steps``; ``--max_steps`` is accepted as well)."""
    from transformers import HfArgumentParser

    from ..training import ICLTrainingArguments

    parser = HfArgumentParser(ICLTrainingArguments, prog="hf-icl train", formatter_class=DefaultsFormatter)
    parser.add_argument("--config", default=None, help="YAML file of training arguments; flags override it")
    for action in parser._actions:  # usage and help show an option's first spelling
        action.option_strings.sort(key=lambda flag: "_" in flag)
    return parser


def run_train(argv: list[str]) -> int:
    from ..training import train

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    known, rest = pre.parse_known_args(argv)
    parser = train_parser()
    if known.config is not None:
        parser.set_defaults(**_training_yaml(known.config).to_dict())
    args = parser.parse_args_into_dataclasses(rest)[0]  # [1]: the namespace holding --config
    # ICLTrainingArguments has validated every field, the task and the model config; now the paths
    writable("--output_dir", args.output_dir, directory=True)
    resume = args.resume_from_checkpoint
    if resume not in (None, "latest") and not Path(resume).expanduser().is_dir():
        what = "is a file, not a checkpoint directory" if Path(resume).expanduser().exists() else "does not exist"
        raise CLIError(f"--resume_from_checkpoint {resume} {what} (pass a checkpoint directory or 'latest')")
    _refuse_unasked_full_run(args, known.config, rest)
    result = train(args)
    from accelerate import PartialState

    if PartialState().is_main_process:  # under accelerate launch, one report, not one per rank
        print(json.dumps(result.final_metrics, indent=2))
        print(f"saved to {result.output_dir}")
        if result.hub_url:
            print(f"pushed to the Hub: {result.hub_url}")
    return 0


def _training_yaml(path: str):
    """``ICLTrainingArguments.from_yaml(path)`` with a missing, unreadable or malformed file as one clear line."""
    import yaml

    from ..training import ICLTrainingArguments

    existing_file("--config", path)
    try:
        return ICLTrainingArguments.from_yaml(path)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or one_line(err)
        raise CLIError(f"--config {path}: not valid YAML ({problem}{where})") from None
    except UnicodeDecodeError:
        raise CLIError(f"--config {path}: not a text (UTF-8) YAML file") from None


def run_evaluate(args) -> int:
    from transformers import AutoModel

    from ..data.tasks import make_task
    from ..evaluation import evaluate_context_scaling, ood_task
    from ..evaluation.runs import METRICS_FILE, evaluated_model, record_evaluated_model
    from ..modeling import MODEL_CLASSES
    from ..modeling.model_folder import verify_model_folder
    from ..training import ICLTrainingArguments
    from ..training.run_files import TRAINING_ARGS_FILE
    from ..training.trainer import build_task

    # every check runs before the model's weights load
    if args.task_params and not args.task:
        raise CLIError(
            f"--task-params {json.dumps(args.task_params)} needs --task (without --task the model's training task "
            "is used with the parameters it was trained with)"
        )
    if "n_dims" in args.task_params:
        raise CLIError("--task-params must not set n_dims: the model's input dimension (config.n_dims) is used")
    check_estimator_names(args.estimators)
    if args.plot:
        writable("--plot", args.plot, directory=False)
    if args.suite and (args.ood or args.plot):
        flag = "--ood" if args.ood else "--plot"
        raise CLIError(f"--suite {args.suite} runs every shift and writes one plot per shift: drop {flag}")
    output_dir = Path(args.output_dir or Path("outputs/evaluate") / Path(args.model.rstrip("/")).name)
    writable("--output-dir", str(output_dir), directory=True)
    device = parse_device("--device", args.device)
    source = model_source("--model", args.model)
    config = load_config("--model", args.model, source)
    if config.model_type not in MODEL_CLASSES:
        raise CLIError(
            f"--model {args.model} holds a {config.model_type!r} model ({type(config).__name__}); hf-icl evaluate "
            f"needs an hf_icl ICL model (model_type one of {sorted(MODEL_CLASSES)}), e.g. the output of hf-icl train"
        )
    if args.task:
        family = get_task(args.task, n_dims=config.n_dims, **args.task_params)
    else:
        saved = Path(source) / TRAINING_ARGS_FILE
        if not saved.is_file():
            raise CLIError(f"--task is required: {saved} (written by hf-icl train) is missing")
        try:
            trained = ICLTrainingArguments.from_dict(json.loads(saved.read_text()), source=str(saved))
        except ValueError as err:  # a field this version does not have
            raise CLIError(f"{saved} cannot be read by this version of hf_icl ({err}); pass --task") from None
        family = make_task({**build_task(trained).to_dict(), "n_tasks": None})  # fresh tasks from the prior
    if args.suite:
        evaluated = evaluated_model(source)  # which folder and which weights: read_runs ties evaluation and run
        _run_suite(args, source, family, output_dir, device)
        record_evaluated_model(output_dir / METRICS_FILE, evaluated)  # cached shifts count as this model's too
        return 0
    if args.ood:
        family = ood_task(family, args.ood)
    predictors = _estimators(args.estimators, family)
    local = Path(source).is_dir()
    if local:  # after the argument checks, before the weights are used: manifest, headers, config vs weights, finite
        verify_model_folder(source, config)
    # which folder and which weights (taken before they load): read_runs ties the evaluation to its training run
    evaluated = evaluated_model(source)
    model = AutoModel.from_pretrained(source, verify=not local)  # a local folder was just verified
    if device is not None:
        model.to(device)  # --device runs the model (and the estimators) there
    predictors = {model.config.model_type: model, **predictors}
    result = evaluate_context_scaling(predictors, family, n_prompts=args.n_prompts, seed=args.seed, device=device)
    _print_context_scaling(result, family, args)
    _save_evaluation(result, args, output_dir, model.config.model_type, family)
    record_evaluated_model(output_dir / METRICS_FILE, evaluated, [args.ood or "standard"])
    return 0


def _save_evaluation(result, args, output_dir: Path, model_name: str, family) -> None:
    """Add this evaluation to OUTPUT_DIR/metrics.json (other evaluations there stay) and write its CSV."""
    from ..evaluation.runs import METRICS_FILE, evaluation_entry, read_metrics, write_curve_csv, write_metrics

    name = args.ood or "standard"
    path = output_dir / METRICS_FILE
    document = read_metrics(path) if path.exists() else {"model": model_name, "task": family.name}
    evaluations = {**document.get("evaluations", {}), name: evaluation_entry(result, seed=args.seed)}
    kept = {k: v for k, v in document.items() if k not in ("format", "evaluations")}
    write_metrics(path, evaluations, **kept)
    curve = write_curve_csv(output_dir / f"context_scaling_{name}.csv", result)
    print(f"metrics: {path} (evaluation {name!r}), curve: {curve}")


def _run_suite(args, source: str, family, output_dir: Path, device) -> int:
    """``--suite garg``: every evaluation of Garg et al.'s build_evals, cached in OUTPUT_DIR/metrics.json."""
    from transformers import AutoModel

    from ..evaluation.garg_suite import SUMMARY_FILE, run_garg_suite, summary_markdown
    from ..modeling.model_folder import verify_model_folder

    local = Path(source).is_dir()
    if local:  # before the weights are used: manifest, safetensors headers, config against weights, finite weights
        verify_model_folder(source)
    model = AutoModel.from_pretrained(source, verify=not local)  # a local folder was just verified
    if device is not None:
        model.to(device)
    document = run_garg_suite(
        model,
        family,
        output_dir,
        n_prompts=args.n_prompts,
        seed=args.seed,
        device=device,
        estimators=args.estimators,
        model_name=model.config.model_type,
    )
    print(summary_markdown(document))
    print(f"metrics: {output_dir / 'metrics.json'}, summary: {output_dir / SUMMARY_FILE}")
    print(f"plots: {output_dir}/garg_*.png")
    return 0


def run_push(args) -> int:
    """Upload a trained model folder; access is checked before anything is read or sent."""
    from ..modeling.model_folder import verify_model_folder
    from ..training.hub import check_hub_access, check_model_folder, push_model_folder

    folder = Path(args.folder).expanduser()
    if not folder.is_dir():
        raise CLIError(f"FOLDER {args.folder}: no such directory (pass a folder written by hf-icl train)")
    check_model_folder(folder)
    verify_model_folder(folder)  # a damaged model is never published (checked before the Hub is asked)
    user = check_hub_access(args.repo_id)
    print(f"pushing {folder} to {args.repo_id} as {user}", file=sys.stderr)
    url = push_model_folder(
        folder, args.repo_id, private=args.private, commit_message=args.commit_message, verify=False
    )
    print(url)
    return 0


def run_compare(args) -> int:
    from ..evaluation import evaluate_context_scaling

    check_estimator_names(args.estimators)
    if args.plot:
        writable("--plot", args.plot, directory=False)
    params = dict(args.task_params)
    if "n_dims" in params:  # it was silently replaced by --n-dims or the default d
        raise CLIError(f"--task-params must not set n_dims (got {json.dumps(args.task_params)}): use --n-dims")
    if args.n_dims is not None:
        params["n_dims"] = args.n_dims
    elif _requires_n_dims(args.task):
        params["n_dims"] = DEFAULT_N_DIMS
    family = get_task(args.task, **params)
    predictors = _estimators(args.estimators, family)
    result = evaluate_context_scaling(
        predictors, family, n_prompts=args.n_prompts, n_points=args.n_points, seed=args.seed
    )
    _print_context_scaling(result, family, args)
    return 0


def _requires_n_dims(task: str) -> bool:
    """Whether the family ``task`` has no default input dimension of its own."""
    field = next(f for f in dataclasses.fields(TASK_REGISTRY[task]) if f.name == "n_dims")
    return field.default is dataclasses.MISSING


def _estimators(names: list[str] | None, family) -> dict:
    """The named estimators configured for ``family``; its default baselines when ``names`` is None."""
    if names is None:
        return default_baselines(family)  # every family has some (categorical: per-prefix logistic regression)
    return {name: estimator_for_task(name, family) for name in names}


def _print_context_scaling(result, family, args) -> None:
    """The table (mean and bootstrap band per position) under a line saying what it measures."""
    from ..evaluation.plotting import band_label

    print(
        f"{result.metric.axis_label}, {band_label(result.confidence)}, on {result.n_prompts} prompts of "
        f"{family.name} (d={family.n_dims}, seed={args.seed})"
    )
    print(result.to_markdown())
    if args.plot:
        print(f"plot: {result.plot(args.plot, log_y=args.log_y)}")


def run_tasks(args) -> int:
    for name in sorted(TASK_REGISTRY):
        cls = TASK_REGISTRY[name]
        params = []
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            if f.default is not dataclasses.MISSING:
                params.append(f"{f.name}={f.default!r}")
            elif f.default_factory is not dataclasses.MISSING:
                params.append(f"{f.name}={f.default_factory()!r}")
            else:
                params.append(f"{f.name} (required)")
        summary = " ".join(cls.__doc__.strip().split("\n\n")[0].split())
        print(f"{name}: {summary}")
        print("    " + ", ".join(params))
    return 0


def run_dataset(args) -> int:
    from ..data.builders import ICLTasks

    if not (args.n_train or args.n_validation or args.n_test):
        raise CLIError("--n-train, --n-validation and --n-test are all 0: at least one split must hold prompts")
    if args.cache_dir:
        writable("--cache-dir", args.cache_dir, directory=True)
    if args.save_to_disk:
        writable("--save-to-disk", args.save_to_disk, directory=True)
    if args.push_to_hub and hub_offline():
        raise CLIError(
            f"--push-to-hub {args.push_to_hub}: the Hugging Face Hub cannot be reached in offline mode "
            "(HF_HUB_OFFLINE=1); use --save-to-disk"
        )
    overrides = {
        key: value
        for key, value in {
            "family": args.family,
            "task_params": args.task_params,
            "n_dims": args.n_dims,
            "n_points": args.n_points,
            "n_tasks": args.n_tasks,
            "seed": args.seed,
        }.items()
        if value is not None
    }
    counts = {"train": args.n_train, "validation": args.n_validation, "test": args.n_test}
    overrides["n_prompts"] = {split: n for split, n in counts.items() if n}
    builder = ICLTasks(config_name=args.config, cache_dir=args.cache_dir, **overrides)
    builder.download_and_prepare()
    dataset = builder.as_dataset()
    print(dataset)
    if args.save_to_disk:
        dataset.save_to_disk(args.save_to_disk)
        print(f"saved to {args.save_to_disk}")
    if args.push_to_hub:
        dataset.push_to_hub(args.push_to_hub, config_name=builder.config.name)
        print(f"pushed to https://huggingface.co/datasets/{args.push_to_hub}")
    return 0


def run_reproduce(args) -> int:
    from ..reproduce import reproduce
    from ..validation import check_int

    for flag, value in (("--steps", args.steps), ("--mlp-steps", args.mlp_steps)):
        if value is not None:
            check_int(flag, value, low=1)
    check_int("--seed", args.seed, low=0)
    writable("--output-dir", args.output_dir, directory=True)
    command = (
        "hf-icl " + " ".join(sys.argv[1:])
        if sys.argv[1:2] == ["reproduce"]
        else f"hf-icl reproduce {args.paper} {args.experiment}"
    )
    flags = ("full", "output_dir", "seed", "retrain", "steps", "mlp_steps")  # the run options the command exposes
    path = reproduce(args.paper, args.experiment, command=command, **{name: getattr(args, name) for name in flags})
    print(path.read_text())
    return 0
