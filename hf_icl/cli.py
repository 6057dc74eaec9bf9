"""The ``hf-icl`` commands (``hf_icl_cli`` answers ``hf-icl --help`` before this module is imported).

Every long option takes both spellings, ``--n-prompts`` or ``--n_prompts``. Multi-GPU training:
``accelerate launch -m hf_icl.cli train --config configs/garg_linear_regression.yaml``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from hf_icl_cli import COMMANDS, DESCRIPTION

from . import __version__
from .data.tasks import TASK_REGISTRY, get_task
from .evaluation.baselines import default_baselines, estimator_for_task
from .options import OptionParser
from .validation import check_int

DEFAULT_N_DIMS = 5  # compare's input dimension for families that have no default of their own


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" unless the help already says what the default is or there is none (None)."""

    def _get_help_string(self, action):
        if action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _formatter(prog):
    return _DefaultsFormatter(prog, max_help_position=36)


def _json_dict(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


# -- checks made before any work: each failure is one line on stderr and exit status 2 ------------


class CLIError(ValueError):
    """An expected failure of a command: printed as ``hf-icl <command>: error: ...``, exit status 2."""


def _at_least(flag: str, value, low: int) -> None:
    """An integer option that must be >= ``low``, named as the user typed it (``--n-prompts``)."""
    if value is not None:
        check_int(flag, value, low=low)


def _existing_file(flag: str, path: str) -> Path:
    """A file to read: it must exist, be a file and be readable."""
    target = Path(path).expanduser()
    if not target.exists():
        raise CLIError(f"{flag} {path}: no such file")
    if not target.is_file():
        raise CLIError(f"{flag} must be a file, got the directory {path}")
    if not os.access(target, os.R_OK):
        raise CLIError(f"{flag} {path}: the file is not readable (permission denied)")
    return target


def _writable(flag: str, path: str, *, directory: bool) -> None:
    """A directory (``directory``) or a file to write: what exists of it must be of that kind, and the
    deepest existing ancestor a writable directory (missing directories are created)."""
    target = Path(path).expanduser()
    kind = "a directory (created if missing)" if directory else "a file path"
    if target.exists() and target.is_dir() != directory:
        got = "an existing file" if directory else "an existing directory"
        raise CLIError(f"{flag} must be {kind}, got {got}: {path}")
    for ancestor in target.parents:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise CLIError(f"{flag} {path}: {ancestor} is a file, so nothing can be created below it")
            if not os.access(ancestor, os.W_OK):
                raise CLIError(f"{flag} {path}: {ancestor} is not writable (permission denied)")
            break


def _device(flag: str, name: str | None):
    """``name`` as a ``torch.device`` that exists on this machine (None stays None)."""
    from .validation import check_device

    try:
        return check_device(flag, name)
    except ValueError as err:
        raise CLIError(str(err)) from None


def _hub_offline() -> bool:
    """Whether Hugging Face Hub access is switched off (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)."""
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return True
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _model_source(flag: str, name: str, *, needs: str | None = "config.json") -> str:
    """A local model directory (resolved), or a Hub id that can be reached (or is cached); else a ``CLIError``.

    ``needs``: a file a local directory must hold (``None``: any directory, e.g. a tokenizer's).
    """
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise CLIError(f"{flag} must be a directory written by save_pretrained (or a Hub id), got the file {name}")
        if needs and not (path / needs).is_file():
            raise CLIError(f"{flag} {name}: the directory has no {needs}, so it holds no saved model")
        return str(path.resolve())
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        raise CLIError(f"{flag} {name}: no such directory (nor a Hub id like 'user/model')") from None
    if _hub_offline() and not isinstance(try_to_load_from_cache(name, needs or "config.json"), str):
        raise CLIError(
            f"{flag} {name!r} is not a local directory, and the Hugging Face Hub cannot be reached in offline "
            "mode (HF_HUB_OFFLINE=1) nor is it cached; pass the local path of a saved model"
        )
    return name


def _load_config(flag: str, name: str, source: str, **kwargs):
    """``AutoConfig.from_pretrained(source, **kwargs)``; a Hub that cannot be reached becomes a ``CLIError``."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, **kwargs)
    except OSError as err:
        if Path(source).exists():
            raise
        raise CLIError(
            f"{flag} {name!r}: could not load it from the Hugging Face Hub ({_one_line(err)}); "
            "if you are offline, pass the local path of a saved model"
        ) from None


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__


def _check_estimator_names(names: list[str] | None) -> None:
    if names is None:
        return
    for name in names:
        if not name:
            raise CLIError(f"--estimators must be comma-separated names without empty entries, got {','.join(names)!r}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise CLIError(f"--estimators must not repeat a name (one curve each), got {repeated[0]!r} twice")


def _names(text: str) -> list[str]:
    """argparse type of --estimators: comma-separated names, stripped."""
    return [item.strip() for item in text.split(",")]


# -- subcommands ---------------------------------------------------------------------------------


def run_quickstart(args) -> int:
    from .quickstart import format_report, run_quickstart

    _at_least("--max-steps", args.max_steps, 1)  # 0 was silently the default run length
    _at_least("--n-prompts", args.n_prompts, 1)
    _at_least("--seed", args.seed, 0)
    _writable("--output-dir", args.output_dir, directory=True)
    overrides = {"max_steps": args.max_steps} if args.max_steps is not None else {}
    report = run_quickstart(args.output_dir, seed=args.seed, eval_prompts=args.n_prompts, **overrides)
    print(format_report(report))
    return 0 if report.passed else 1


def run_train(argv: list[str]) -> int:
    from transformers import HfArgumentParser

    from .training import ICLTrainingArguments, train

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    known, rest = pre.parse_known_args(argv)
    parser = HfArgumentParser(ICLTrainingArguments, prog="hf-icl train", formatter_class=_DefaultsFormatter)
    parser.add_argument("--config", default=None, help="YAML file of training arguments; flags override it")
    if known.config is not None:
        parser.set_defaults(**_training_yaml(known.config).to_dict())
    args = parser.parse_args_into_dataclasses(rest)[0]  # [1]: the namespace holding --config
    # ICLTrainingArguments has validated every field, the task and the model config; now the paths
    _writable("--output_dir", args.output_dir, directory=True)
    resume = args.resume_from_checkpoint
    if resume not in (None, "latest") and not Path(resume).expanduser().is_dir():
        what = "is a file, not a checkpoint directory" if Path(resume).expanduser().exists() else "does not exist"
        raise CLIError(f"--resume_from_checkpoint {resume} {what} (pass a checkpoint directory or 'latest')")
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

    from .training import ICLTrainingArguments

    _existing_file("--config", path)
    try:
        return ICLTrainingArguments.from_yaml(path)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or _one_line(err)
        raise CLIError(f"--config {path}: not valid YAML ({problem}{where})") from None
    except UnicodeDecodeError:
        raise CLIError(f"--config {path}: not a text (UTF-8) YAML file") from None


def run_evaluate(args) -> int:
    from transformers import AutoModel

    from .data.tasks import make_task
    from .evaluation import evaluate_context_scaling, ood_task
    from .modeling import MODEL_CLASSES
    from .modeling.model_folder import verify_model_folder
    from .training import ICLTrainingArguments
    from .training.trainer import TRAINING_ARGS_FILE, build_task

    # every check runs before the model's weights load
    _at_least("--n-prompts", args.n_prompts, 1)
    _at_least("--seed", args.seed, 0)
    if args.task_params and not args.task:
        raise CLIError(
            f"--task-params {json.dumps(args.task_params)} needs --task (without --task the model's training task "
            "is used with the parameters it was trained with)"
        )
    if "n_dims" in args.task_params:
        raise CLIError("--task-params must not set n_dims: the model's input dimension (config.n_dims) is used")
    _check_estimator_names(args.estimators)
    if args.plot:
        _writable("--plot", args.plot, directory=False)
    if args.suite and (args.ood or args.plot):
        flag = "--ood" if args.ood else "--plot"
        raise CLIError(f"--suite {args.suite} runs every shift and writes one plot per shift: drop {flag}")
    output_dir = Path(args.output_dir or Path("outputs/evaluate") / Path(args.model.rstrip("/")).name)
    _writable("--output-dir", str(output_dir), directory=True)
    device = _device("--device", args.device)
    source = _model_source("--model", args.model)
    config = _load_config("--model", args.model, source)
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
        return _run_suite(args, source, family, output_dir, device)
    if args.ood:
        family = ood_task(family, args.ood)
    predictors = _estimators(args.estimators, family)
    local = Path(source).is_dir()
    if local:  # after the argument checks, before the weights are used: manifest, headers, config vs weights, finite
        verify_model_folder(source, config)
    model = AutoModel.from_pretrained(source, verify=not local)  # a local folder was just verified
    if device is not None:
        model.to(device)  # --device runs the model (and the estimators) there
    predictors = {model.config.model_type: model, **predictors}
    result = evaluate_context_scaling(predictors, family, n_prompts=args.n_prompts, seed=args.seed, device=device)
    _print_context_scaling(result, family, args)
    _save_evaluation(result, args, output_dir, model.config.model_type, family)
    return 0


def _save_evaluation(result, args, output_dir: Path, model_name: str, family) -> None:
    """Add this evaluation to OUTPUT_DIR/metrics.json (other evaluations there stay) and write its CSV."""
    from .evaluation.runs import METRICS_FILE, evaluation_entry, read_metrics, write_curve_csv, write_metrics

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

    from .evaluation.garg_suite import SUMMARY_FILE, run_garg_suite, summary_markdown
    from .modeling.model_folder import verify_model_folder

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
    from .modeling.model_folder import verify_model_folder
    from .training.hub import check_hub_access, check_model_folder, push_model_folder

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
    from .evaluation import evaluate_context_scaling

    _at_least("--n-prompts", args.n_prompts, 1)
    _at_least("--n-points", args.n_points, 1)
    _at_least("--n-dims", args.n_dims, 1)
    _at_least("--seed", args.seed, 0)
    _check_estimator_names(args.estimators)
    if args.plot:
        _writable("--plot", args.plot, directory=False)
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
    from .evaluation.plotting import band_label

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
    from .data.builders import ICLTasks

    for flag, value in (("--n-train", args.n_train), ("--n-validation", args.n_validation), ("--n-test", args.n_test)):
        _at_least(flag, value, 0)
    if not (args.n_train or args.n_validation or args.n_test):
        raise CLIError("--n-train, --n-validation and --n-test are all 0: at least one split must hold prompts")
    for flag, value in (("--n-dims", args.n_dims), ("--n-points", args.n_points), ("--n-tasks", args.n_tasks)):
        _at_least(flag, value, 1)
    _at_least("--seed", args.seed, 0)
    if args.cache_dir:
        _writable("--cache-dir", args.cache_dir, directory=True)
    if args.save_to_disk:
        _writable("--save-to-disk", args.save_to_disk, directory=True)
    if args.push_to_hub and _hub_offline():
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


def _csv(kind, name: str):
    """argparse type: a comma-separated list of ``kind`` values."""

    def parse(text: str) -> list:
        items = [item.strip() for item in text.split(",") if item.strip()]
        try:
            return [kind(item) for item in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {name}, got {text!r}") from None

    return parse


def _gguf_available() -> bool:
    """Whether the ``gguf`` package (transformers' GGUF reader) is installed."""
    import importlib.util

    return importlib.util.find_spec("gguf") is not None


def _causal_lm_source(args) -> tuple[str, dict, object]:
    """``--model`` (with ``--gguf-file``) checked: the model's path, the keyword arguments that load it, its config.

    The keywords are ``{"gguf_file": FILE}`` for a GGUF checkpoint (model, config and tokenizer all read it),
    else ``{}``. The config is loaded to check that the model is a causal LM before any weights load.
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    gguf = {}
    if args.gguf_file is None:
        if str(args.model).endswith(".gguf") and Path(args.model).expanduser().is_file():
            raise CLIError(
                f"--model {args.model} is a GGUF file: pass its directory as --model and its name as --gguf-file"
            )
        source = _model_source("--model", args.model)
    else:
        directory = Path(args.model).expanduser()
        if directory.is_dir() and not (directory / args.gguf_file).is_file():
            raise CLIError(f"--gguf-file {args.gguf_file}: no such file in the --model directory {args.model}")
        if not _gguf_available():
            raise CLIError(
                f"--gguf-file {args.gguf_file}: reading GGUF checkpoints needs the gguf package, which is not "
                "installed: pip install 'hf_icl[llm]'"
            )
        source = _model_source("--model", args.model, needs=args.gguf_file)
        gguf = {"gguf_file": args.gguf_file}
    config = _load_config("--model", args.model, source, **gguf)
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise CLIError(
            f"--model {args.model} holds a {config.model_type!r} model ({type(config).__name__}), which is no causal "
            f"language model; hf-icl {args.command} needs one that AutoModelForCausalLM loads (e.g. GPT-2, Llama)"
        )
    return source, gguf, config


def _causal_lm_tokenizer(args, source: str, gguf: dict):
    """``--tokenizer`` if given, else the model's own (from its GGUF file when it has one); a fast tokenizer."""
    from .data.niah import load_tokenizer

    if args.tokenizer is not None:
        return load_tokenizer(_model_source("--tokenizer", args.tokenizer, needs=None))
    if gguf:
        from transformers import AutoTokenizer

        return load_tokenizer(AutoTokenizer.from_pretrained(source, **gguf))
    return load_tokenizer(source)


def _load_causal_lm(source: str, gguf: dict, dtype: str, device):
    """The model, in eval mode on ``device`` (None: cuda if available, else cpu), with SDPA attention."""
    import torch
    from transformers import AutoModelForCausalLM

    from .modeling.model_folder import verify_model_folder

    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not gguf and Path(source).is_dir():  # a GGUF file is transformers' to parse; a folder is checked first
        verify_model_folder(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, attn_implementation="sdpa", **gguf)
    return model.to(device).eval()


#: CAB hyperparameters with a flag of their own: CABParams field → flag (set on the model config when given)
_CAB_KNOBS = {
    "lam": "--lam",
    "sink_blocks": "--sink-blocks",
    "local_blocks": "--local-blocks",
    "magnitude_fraction": "--magnitude-fraction",
    "topk": "--topk",
    "score": "--score",
}


def _cab_knobs(args) -> dict:
    """The CAB knobs given on the command line, validated (the errors name the ``cab_*`` field)."""
    from .attention.cab import CABParams

    knobs = {name: getattr(args, name) for name in _CAB_KNOBS if getattr(args, name) is not None}
    CABParams(**knobs)
    return knobs


def _set_cab_knobs(model, knobs: dict) -> None:
    """Store the knobs on the config as ``cab_*`` fields, as enable_cab does, so they survive and are recorded."""
    from .attention.cab import config_field

    for name, value in knobs.items():
        setattr(model.config, config_field(name), value)


def _check_block_size(block_size: int) -> None:
    check_int("--block-size", block_size, low=16, high=128)
    if block_size & (block_size - 1):
        raise CLIError(f"--block-size must be a power of two in [16, 128], got {block_size}")


def _use_chat_template(choice: str, tokenizer) -> bool:
    """``--chat-template``: on, off, or auto (on when the tokenizer has a chat template)."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if choice == "on" and not has_template:
        raise CLIError("--chat-template on: the tokenizer has no chat_template; use --chat-template off (or auto)")
    return has_template if choice == "auto" else choice == "on"


def run_niah_command(args) -> int:
    from .data.niah import BUILTIN_HAYSTACKS, NeedleInAHaystackConfig
    from .evaluation.niah import niah_methods, run_niah
    from .evaluation.niah_report import write_niah_report

    methods = niah_methods(args.policies, args.sparsities, args.kept_blocks)  # every check runs before the model loads
    knobs = _cab_knobs(args)
    _check_block_size(args.block_size)
    _at_least("--samples", args.samples, 1)
    _at_least("--seed", args.seed, 0)
    _at_least("--preservation-queries", args.preservation_queries, 1)
    for flag, value, variant in (("--keys", args.keys, "multikey"), ("--values", args.values, "multivalue")):
        _at_least(flag, value, 2)
        if value is not None and args.variant != variant:
            raise CLIError(f"{flag} applies only to --variant {variant}, got --variant {args.variant}")
    if args.haystack not in BUILTIN_HAYSTACKS:
        _existing_file("--haystack", args.haystack)
    _writable("--output-dir", args.output_dir, directory=True)
    device = _device("--device", args.device)
    source, gguf, config = _causal_lm_source(args)
    tokenizer = _causal_lm_tokenizer(args, source, gguf)
    chat_template = _use_chat_template(args.chat_template, tokenizer)
    grid = {
        "context_lengths": args.lengths,
        "depths": args.depths,
        "samples_per_cell": args.samples,
        "haystack": args.haystack,
        "seed": args.seed,
        "variant": args.variant,
        "value_kind": args.value_kind,
    }
    if args.keys is not None:  # given only with their variant (checked above); absent: the config's default
        grid["n_keys"] = args.keys
    if args.values is not None:
        grid["n_values"] = args.values
    NeedleInAHaystackConfig(tokenizer=tokenizer, **grid)  # validates the grid (lengths, depths, ...)
    model = _load_causal_lm(source, gguf, args.dtype, device)
    _set_cab_knobs(model, knobs)
    out = Path(args.output_dir)
    records = run_niah(
        model,
        tokenizer,
        methods=methods,
        block_size=args.block_size,
        budget=args.budget,
        results_file=out / "results.jsonl",
        progress=not args.no_progress,
        preservation_queries=args.preservation_queries,
        chat_template=chat_template,
        gguf_file=args.gguf_file,
        answer_prefix=args.answer_prefix,
        **grid,
    )
    written = write_niah_report(records, out)
    print(written["summary.md"].read_text(encoding="utf-8"))
    print(f"results: {out / 'results.jsonl'} ({len(records)} records); report: {out}")
    return 0


def run_perplexity_command(args) -> int:
    from .evaluation.niah import _other_cab_fields, niah_methods
    from .evaluation.perplexity import long_text_perplexity, perplexity_markdown, text_digest, text_windows

    methods = niah_methods(args.policies, args.sparsities, args.kept_blocks)  # every check runs before the model loads
    knobs = _cab_knobs(args)
    _check_block_size(args.block_size)
    if not args.length:
        raise CLIError("--length must name at least one window length, e.g. 4096 or 4096,8192")
    for length in args.length:
        _at_least("--length", length, 2)
    if len(set(args.length)) < len(args.length):
        raise CLIError(f"--length must not repeat a length, got {','.join(map(str, args.length))}")
    _at_least("--windows", args.windows, 1)
    texts = _perplexity_texts(args.text)
    _writable("--output-dir", args.output_dir, directory=True)
    device = _device("--device", args.device)
    source, gguf, config = _causal_lm_source(args)
    tokenizer = _causal_lm_tokenizer(args, source, gguf)
    limit = getattr(config, "max_position_embeddings", None)
    for length in args.length:
        if isinstance(limit, int) and length > limit:
            raise CLIError(f"--length {length} is more than the model's max_position_embeddings={limit}")
    for name, text in texts.items():  # every text is long enough for the longest window: checked before weights load
        try:
            text_windows(tokenizer, text, max(args.length), args.windows)
        except ValueError as err:
            raise CLIError(f"--text {name}: {err}") from None
    model = _load_causal_lm(source, gguf, args.dtype, device)
    _set_cab_knobs(model, knobs)
    records, tables = [], []
    for name, text in texts.items():
        for length in args.length:
            found = long_text_perplexity(
                model,
                tokenizer,
                text,
                length=length,
                windows=args.windows,
                methods=methods,
                block_size=args.block_size,
                budget=args.budget,
                progress=not args.no_progress,
            )
            records += [{"text": name, **record} for record in found]
            tables.append(
                f"### {name} (sha256 {text_digest(text)[:12]}), windows of {length} tokens\n\n"
                + perplexity_markdown(found)
            )
    header = {
        "model": args.model,
        "gguf_file": args.gguf_file,
        "dtype": str(next(model.parameters()).dtype),
        "device": str(next(model.parameters()).device),
        "texts": [{"name": name, "sha256": text_digest(text), "characters": len(text)} for name, text in texts.items()],
        "lengths": list(args.length),
        "windows": args.windows,
        "block_size": args.block_size,
        "budget": args.budget,
        "cab": _other_cab_fields(model.config),
    }
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"header": header, "records": records}, indent=2) + "\n")
    report = "\n".join(tables)
    (out / "results.md").write_text(report, encoding="utf-8")
    print(report)
    print(f"results: {out / 'results.json'}, {out / 'results.md'}")
    return 0


def _perplexity_texts(spec: str | None) -> dict[str, str]:
    """``--text``: comma-separated built-in text names and UTF-8 file paths (a built-in name wins over a file of
    that name; write ``./NAME`` for the file); None: every built-in text. Returns ``{name or path: text}``."""
    import difflib

    from .evaluation.perplexity import builtin_texts, load_builtin_text

    names = list(builtin_texts()) if spec is None else [item.strip() for item in spec.split(",") if item.strip()]
    if not names:
        raise CLIError(f"--text must name at least one built-in text ({', '.join(builtin_texts())}) or file")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise CLIError(f"--text must not repeat a text, got {repeated[0]!r} twice")
    texts = {}
    for name in names:
        if name in builtin_texts():
            texts[name] = load_builtin_text(name)
            continue
        if not Path(name).expanduser().exists():
            close = difflib.get_close_matches(name, builtin_texts(), n=2, cutoff=0.6)
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            raise CLIError(
                f"--text {name}: no such file, nor a built-in text{hint}; built-in texts: {', '.join(builtin_texts())}"
            )
        texts[name] = _read_text("--text", name)
    return texts


def _read_text(flag: str, path: str) -> str:
    """A UTF-8 text file's contents, with a missing, unreadable or binary file as one clear line."""
    target = _existing_file(flag, path)
    try:
        return target.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise CLIError(f"{flag} {path}: not a UTF-8 text file") from None


def run_bench(argv: list[str]) -> int:
    from .benchmarks import BENCHMARKS, run_benchmark

    if not argv or argv[0] in ("-h", "--help"):
        print("usage: hf-icl bench NAME [benchmark flags]   (hf-icl bench NAME --help for its flags)\n")
        width = max(map(len, BENCHMARKS)) + 2  # every description starts in the same column
        print("\n".join(f"  {name:<{width}}{what}" for name, what in BENCHMARKS.items()))
        return 0
    try:
        run_benchmark(argv[0], argv[1:])
    except (RuntimeError, MemoryError) as err:  # a size past the up-front estimates: torch's allocation failure
        raise _allocation_error(err, argv) from None
    return 0


def _allocation_error(err: BaseException, argv: list[str]) -> BaseException:
    """A ``CLIError`` naming the numeric flags given in ``argv`` if ``err`` is a failed memory allocation (torch's
    ``RuntimeError`` / ``OutOfMemoryError``, ``MemoryError``); ``err`` itself otherwise."""
    from .validation import allocation_failure

    failure = allocation_failure(err)
    if failure is None:
        return err
    pairs = zip(argv, argv[1:], strict=False)
    sizes = [f"{flag} {value}" for flag, value in pairs if flag.startswith("--") and _numeric(value)]
    hint = f"reduce the sizes given ({', '.join(sizes)})" if sizes else "use smaller sizes"
    return CLIError(f"{failure}; {hint}")


def _numeric(text: str) -> bool:
    try:
        float(text.split(",")[0])
    except ValueError:
        return False
    return True


# -- parser --------------------------------------------------------------------------------------


def _add_plot_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plot", default=None, help="write the context-scaling PNG here")
    parser.add_argument(
        "--log-y",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="logarithmic y axis (default: log for errors, linear for accuracy)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = OptionParser(prog="hf-icl", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"hf-icl {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    quick = commands.add_parser("quickstart", help=COMMANDS["quickstart"], formatter_class=_formatter)
    quick.add_argument("--output-dir", default="outputs/quickstart", help="model, card, plot, checkpoints")
    quick.add_argument("--max-steps", type=int, default=None, help="override the run's optimizer steps")
    quick.add_argument("--n-prompts", type=int, default=1280, help="evaluation prompts")
    quick.add_argument("--seed", type=int, default=0, help="seed of weights and prompts")
    quick.set_defaults(run=run_quickstart)

    commands.add_parser("train", help=COMMANDS["train"], add_help=False)
    commands.add_parser(
        "bench",
        help=COMMANDS["bench"],
        add_help=False,
    )

    ev = commands.add_parser("evaluate", help=COMMANDS["evaluate"], formatter_class=_formatter)
    ev.add_argument("--model", required=True, help="directory written by hf-icl train (or a Hub id)")
    ev.add_argument("--task", default=None, help="task family (default: the one the model was trained on)")
    ev.add_argument("--task-params", type=_json_dict, default={}, help="JSON hyperparameters with --task")
    ev.add_argument("--ood", default=None, help="distribution shift: scaled_x, scaled_y, skewed_covariance, ...")
    ev.add_argument(
        "--suite",
        choices=["garg"],
        default=None,
        help="garg: every evaluation of Garg et al.'s build_evals (standard, quadrants, orthogonal / overlapping "
        "train-test, half subspace, skewed covariance, scaled x and y, noisy labels); reruns compute only what "
        "OUTPUT_DIR/metrics.json lacks",
    )
    ev.add_argument(
        "--output-dir",
        default=None,
        help="metrics.json, the per-position CSV and the suite's plots (default: outputs/evaluate/MODEL_NAME)",
    )
    ev.add_argument(
        "--estimators",
        type=_names,
        default=None,
        help="comma-separated baselines (default: the task's, e.g. least_squares,averaging,knn)",
    )
    ev.add_argument("--n-prompts", type=int, default=1280, help="evaluation prompts")
    ev.add_argument("--seed", type=int, default=0, help="seed of the prompts")
    ev.add_argument("--device", default=None, help="device for the model (default: where it is)")
    _add_plot_arguments(ev)
    ev.set_defaults(run=run_evaluate)

    push = commands.add_parser("push", help=COMMANDS["push"], formatter_class=_formatter)
    push.add_argument("folder", help="a folder written by hf-icl train (save_pretrained weights, config, card)")
    push.add_argument("repo_id", help="the Hub model repo, 'user/name' (created if missing)")
    push.add_argument("--private", action="store_true", help="create the repo private")
    push.add_argument(
        "--commit-message", default=None, help="the Hub commit's message; None: 'Upload MODEL_TYPE trained with hf_icl'"
    )
    push.set_defaults(run=run_push)

    quick = commands.add_parser("compare", help=COMMANDS["compare"], formatter_class=_formatter)
    quick.add_argument(
        "--task", default="noisy_linear_regression", choices=sorted(TASK_REGISTRY), help="task family", metavar="NAME"
    )
    quick.add_argument("--task-params", type=_json_dict, default={}, help="JSON hyperparameters of the family")
    quick.add_argument(
        "--n-dims", type=int, default=None, help=f"input dimension d (the family's default, else {DEFAULT_N_DIMS})"
    )
    quick.add_argument("--n-points", type=int, default=16, help="examples per prompt")
    quick.add_argument("--n-prompts", type=int, default=1280, help="prompts to average over")
    quick.add_argument("--seed", type=int, default=0, help="seed of the prompts")
    quick.add_argument(
        "--estimators",
        type=_names,
        default=None,
        help="comma-separated (default: the task's baselines, as in hf-icl evaluate)",
    )
    _add_plot_arguments(quick)
    quick.set_defaults(run=run_compare)

    tasks = commands.add_parser("tasks", help=COMMANDS["tasks"])
    tasks.set_defaults(run=run_tasks)

    data = commands.add_parser("dataset", help=COMMANDS["dataset"], formatter_class=_formatter)
    data.add_argument("--config", default="linear_regression", help="a predefined ICLTasks config name")
    data.add_argument("--family", default=None, help="override the config's task family")
    data.add_argument("--task-params", type=_json_dict, default=None, help="JSON hyperparameters")
    data.add_argument("--n-dims", type=int, default=None, help="input dimension (config default if unset)")
    data.add_argument("--n-points", type=int, default=None, help="examples per prompt (config default if unset)")
    data.add_argument("--n-tasks", type=int, default=None, help="finite task-pool size")
    data.add_argument("--seed", type=int, default=None, help="seed of the pool and splits (config default if unset)")
    data.add_argument("--n-train", type=int, default=12_800, help="train prompts (0: no split)")
    data.add_argument("--n-validation", type=int, default=1_280, help="validation prompts (0: no split)")
    data.add_argument("--n-test", type=int, default=1_280, help="test prompts (0: no split)")
    data.add_argument("--cache-dir", default=None, help="datasets cache (HF_DATASETS_CACHE if unset)")
    data.add_argument("--save-to-disk", default=None, metavar="PATH", help="write the DatasetDict here")
    data.add_argument("--push-to-hub", default=None, metavar="REPO_ID", help="upload as parquet to this Hub repo")
    data.set_defaults(run=run_dataset)

    _add_niah_parser(commands)
    _add_perplexity_parser(commands)

    from .reproduce import PAPERS

    listing = "; ".join(f"{paper}: {', '.join(module.EXPERIMENTS)}" for paper, module in PAPERS.items())
    rep = commands.add_parser(
        "reproduce",
        help=COMMANDS["reproduce"],
        description=f"Experiments: {listing}. Writes OUTPUT_DIR/PAPER/EXPERIMENT/results.md and results.json.",
        formatter_class=_formatter,
    )
    rep.add_argument("paper", choices=sorted(PAPERS), help="the seed document")
    rep.add_argument("experiment", help="the figure or table, e.g. fig1 or table1 (see the list above)")
    rep.add_argument(
        "--full",
        action="store_true",
        help="the document's sizes (for a GPU); default: CPU-sized, under 30 min on 2 cores (linear-attention: "
        "width 64, 3 seeds, a fifth of the steps; kernel-icl: 5 seeds, a quarter of Table 2's steps; gd-icl: 3 "
        "seeds, shorter training and no 6-block trained model, a small template story corpus)",
    )
    rep.add_argument("--output-dir", default="outputs/reproduce", help="where runs, plots and results go")
    rep.add_argument("--steps", type=int, default=None, help="override the training steps of every run")
    rep.add_argument("--mlp-steps", type=int, default=None, help="override the training steps of the MLP runs only")
    rep.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of weights, training and evaluation prompts (linear-attention: added to the document's 5 seeds)",
    )
    rep.add_argument("--retrain", action="store_true", help="retrain runs that finished with the same arguments")
    rep.set_defaults(run=run_reproduce)
    return parser


def _add_causal_lm_arguments(parser: argparse.ArgumentParser) -> None:
    """--model, --gguf-file, --tokenizer, --device, --dtype: the model niah and perplexity evaluate."""
    parser.add_argument("--model", required=True, help="causal LM: local directory or Hub name (AutoModelForCausalLM)")
    parser.add_argument(
        "--gguf-file",
        default=None,
        metavar="FILE",
        help="load this GGUF file of --model's directory (model, config and tokenizer); needs pip install "
        "'hf_icl[llm]'",
    )
    parser.add_argument(
        "--tokenizer", default=None, help="fast tokenizer path or name (None: --model's, from its GGUF file if given)"
    )
    parser.add_argument("--device", default=None, help="None: cuda if available, else cpu")
    parser.add_argument(
        "--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"), help="model weights dtype"
    )


def _add_cab_arguments(parser: argparse.ArgumentParser, block_size: int) -> None:
    """The methods (--policies × --sparsities after dense) and CAB's knobs."""
    from .attention.cab import BUDGETS, POLICIES, SCORES
    from .evaluation.niah import DEFAULT_POLICIES, DEFAULT_SPARSITIES, SCORED_METHODS

    parser.add_argument(
        "--policies",
        type=_csv(str, "names"),
        default=",".join(DEFAULT_POLICIES),
        help=f"comma-separated CAB methods, of {', '.join((*POLICIES, *SCORED_METHODS))} ('' for dense only); "
        "quest and max_l2 rank blocks by Quest's bound and by the largest-norm key",
    )
    parser.add_argument(
        "--sparsities",
        type=_csv(float, "numbers"),
        default=",".join(map(str, DEFAULT_SPARSITIES)),
        help="CAB sparsities in [0, 1) (each token drops that fraction of its visible blocks; '' for none)",
    )
    parser.add_argument(
        "--kept-blocks",
        type=_csv(int, "integers"),
        default="",
        help="CAB budgets in key blocks per query token, sink and local window included (e.g. 16: 1,024 tokens "
        "at block 64); each runs beside the --sparsities",
    )
    parser.add_argument("--block-size", type=int, default=block_size, help="CAB block size (power of two, 16 to 128)")
    parser.add_argument("--budget", default="row", choices=BUDGETS, help="CAB budget")
    parser.add_argument("--topk", type=int, default=None, help="key blocks per query with --budget topk (None: 8)")
    parser.add_argument(
        "--score", default=None, choices=SCORES, help="CAB's block score (None: the model's, else mean)"
    )
    parser.add_argument("--lam", type=float, default=None, help="FRC's two-hop weight λ (None: the model's, else 0.5)")
    parser.add_argument("--sink-blocks", type=int, default=None, help="leading blocks always kept (None: 1)")
    parser.add_argument(
        "--local-blocks",
        type=int,
        default=None,
        help="a token's own block and the blocks just before it always kept, in all (None: 1, its own block)",
    )
    parser.add_argument(
        "--magnitude-fraction", type=float, default=None, help="hybrid's share of slots by magnitude (None: 0.5)"
    )


def _add_niah_parser(commands) -> None:
    niah = commands.add_parser("niah", help=COMMANDS["niah"], formatter_class=_formatter)
    _add_causal_lm_arguments(niah)
    niah.add_argument(
        "--chat-template",
        default="auto",
        choices=("auto", "on", "off"),
        help="wrap each prompt as the user message of the tokenizer's chat template (auto: if it has one)",
    )
    niah.add_argument(
        "--answer-prefix",
        default=None,
        metavar="TEXT",
        help="text that opens the answer after the prompt, e.g. 'The pass key is' with a chat template",
    )
    niah.add_argument(
        "--lengths", type=_csv(int, "integers"), default="1024,2048,4096", help="comma-separated context lengths"
    )
    niah.add_argument(
        "--depths", type=_csv(float, "numbers"), default="0,0.25,0.5,0.75,1", help="needle depths in [0, 1]"
    )
    niah.add_argument("--samples", type=int, default=5, help="prompts per (length, depth) cell")
    _add_cab_arguments(niah, block_size=16)
    niah.add_argument(
        "--haystack", default="filler", help="'filler', 'passkey' (the passkey test's five sentences) or a text file"
    )
    niah.add_argument("--seed", type=int, default=0, help="seed of the passkeys and haystack offsets")
    niah.add_argument(
        "--variant",
        default="single",
        choices=("single", "multikey", "multivalue"),
        help="needles (RULER): one passkey; several keys, one asked for; several values of one key, all asked for",
    )
    niah.add_argument(
        "--value-kind", default="number", choices=("number", "word", "uuid"), help="what the needles' values are"
    )
    niah.add_argument(
        "--keys", type=int, default=None, metavar="N", help="keys (needles) per prompt with --variant multikey (4)"
    )
    niah.add_argument(
        "--values", type=int, default=None, metavar="N", help="values per prompt with --variant multivalue (4)"
    )
    niah.add_argument(
        "--preservation-queries",
        type=int,
        default=None,
        help="final prompt tokens scoring preservation (None: the question's and the chat template's after it)",
    )
    niah.add_argument("--output-dir", default="outputs/niah", help="results.jsonl and the report; reruns resume")
    niah.add_argument("--no-progress", action="store_true", help="no progress bar")
    niah.set_defaults(run=run_niah_command)


def _add_perplexity_parser(commands) -> None:
    ppl = commands.add_parser(
        "perplexity",
        help=COMMANDS["perplexity"],
        description="Perplexity of --windows consecutive windows of --length tokens of each text, under dense "
        "attention and every CAB policy × sparsity, with intervals over the windows. Without --text, every "
        "built-in text: the Python Language Reference topics (pydoc_data.topics), the standard library's "
        "docstrings and a fixed set of its source files, all read from the Python install (nothing is "
        "downloaded); results record each text's SHA-256.",
        formatter_class=_formatter,
    )
    _add_causal_lm_arguments(ppl)
    ppl.add_argument(
        "--text",
        default=None,
        metavar="TEXTS",
        help="comma-separated built-in text names (python-language-reference, python-stdlib-docstrings, "
        "python-stdlib-source) and UTF-8 text files (None: every built-in text)",
    )
    ppl.add_argument(
        "--length",
        type=_csv(int, "integers"),
        required=True,
        help="tokens per window, comma-separated for several (e.g. 4096,8192); every text runs at every length",
    )
    ppl.add_argument("--windows", type=int, default=1, help="consecutive non-overlapping windows")
    _add_cab_arguments(ppl, block_size=64)
    ppl.add_argument("--output-dir", default="outputs/perplexity", help="results.json and results.md")
    ppl.add_argument("--no-progress", action="store_true", help="no progress bar")
    ppl.set_defaults(run=run_perplexity_command)


def run_reproduce(args) -> int:
    from .reproduce import reproduce
    from .validation import check_int

    for flag, value in (("--steps", args.steps), ("--mlp-steps", args.mlp_steps)):
        if value is not None:
            check_int(flag, value, low=1)
    check_int("--seed", args.seed, low=0)
    _writable("--output-dir", args.output_dir, directory=True)
    command = (
        "hf-icl " + " ".join(sys.argv[1:])
        if sys.argv[1:2] == ["reproduce"]
        else f"hf-icl reproduce {args.paper} {args.experiment}"
    )
    path = reproduce(
        args.paper,
        args.experiment,
        full=args.full,
        output_dir=args.output_dir,
        seed=args.seed,
        retrain=args.retrain,
        steps=args.steps,
        mlp_steps=args.mlp_steps,
        command=command,
    )
    print(path.read_text())
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv else None
    try:
        if command == "train":  # HfArgumentParser owns every training flag
            return run_train(argv[1:])
        if command == "bench":  # each benchmark parses its own flags
            return run_bench(argv[1:])
        args = build_parser().parse_args(argv)
        return args.run(args)
    except (ValueError, OSError) as err:  # user errors (bad values, missing files, no Hub): one line, no traceback
        print(f"hf-icl {command}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    # a diverged run names the checkpoint to resume from: one line too (the class, looked up only when an error
    # propagates, exists once training was imported; () matches nothing)
    except getattr(sys.modules.get("hf_icl.training.trainer"), "TrainingDivergedError", ()) as err:
        print(f"hf-icl {command}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except (RuntimeError, MemoryError) as err:  # an absurd size: torch's allocation failure, as one line
        failure = _allocation_error(err, argv)
        if failure is err:
            raise
        print(f"hf-icl {command}: error: {_one_line(failure)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
