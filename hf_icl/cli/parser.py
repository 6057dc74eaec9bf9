"""The ``hf-icl`` parser: one sub-parser per command (their one-line help from :mod:`hf_icl_cli.commands`)."""

from __future__ import annotations

import argparse

from hf_icl_cli.argument_types import comma_names, comma_separated, json_object
from hf_icl_cli.commands import COMMANDS, DESCRIPTION

from .. import __version__
from ..attention.cab_params import CABParams
from ..data.tasks import TASK_REGISTRY
from ..options import OptionParser
from .checks import help_formatter
from .icl_commands import (
    DEFAULT_N_DIMS,
    run_compare,
    run_dataset,
    run_evaluate,
    run_push,
    run_quickstart,
    run_reproduce,
    run_tasks,
)
from .lm_commands import run_niah_command, run_perplexity_command

#: the block size every command defaults to: enable_cab's
DEFAULT_BLOCK_SIZE = CABParams.__dataclass_fields__["block_size"].default


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

    quick = commands.add_parser("quickstart", help=COMMANDS["quickstart"], formatter_class=help_formatter)
    quick.add_argument("--output-dir", default="outputs/quickstart", help="model, card, plot, checkpoints")
    quick.add_argument("--max-steps", type=int, minimum=1, default=None, help="override the run's optimizer steps")
    quick.add_argument("--n-prompts", type=int, minimum=1, default=1280, help="evaluation prompts")
    quick.add_argument("--seed", type=int, minimum=0, default=0, help="seed of weights and prompts")
    quick.set_defaults(run=run_quickstart)

    commands.add_parser("train", help=COMMANDS["train"], add_help=False)
    commands.add_parser(
        "bench",
        help=COMMANDS["bench"],
        add_help=False,
    )

    ev = commands.add_parser("evaluate", help=COMMANDS["evaluate"], formatter_class=help_formatter)
    ev.add_argument("--model", required=True, help="directory written by hf-icl train (or a Hub id)")
    ev.add_argument("--task", default=None, help="task family (default: the one the model was trained on)")
    ev.add_argument("--task-params", type=json_object, default={}, help="JSON hyperparameters with --task")
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
        type=comma_names,
        default=None,
        help="comma-separated baselines (default: the task's, e.g. least_squares,averaging,knn)",
    )
    ev.add_argument("--n-prompts", type=int, minimum=1, default=1280, help="evaluation prompts")
    ev.add_argument("--seed", type=int, minimum=0, default=0, help="seed of the prompts")
    ev.add_argument("--device", default=None, help="device for the model (default: where it is)")
    _add_plot_arguments(ev)
    ev.set_defaults(run=run_evaluate)

    push = commands.add_parser("push", help=COMMANDS["push"], formatter_class=help_formatter)
    push.add_argument("folder", help="a folder written by hf-icl train (save_pretrained weights, config, card)")
    push.add_argument("repo_id", help="the Hub model repo, 'user/name' (created if missing)")
    push.add_argument("--private", action="store_true", help="create the repo private")
    push.add_argument(
        "--commit-message", default=None, help="the Hub commit's message; None: 'Upload MODEL_TYPE trained with hf_icl'"
    )
    push.set_defaults(run=run_push)

    quick = commands.add_parser("compare", help=COMMANDS["compare"], formatter_class=help_formatter)
    quick.add_argument(
        "--task", default="noisy_linear_regression", choices=sorted(TASK_REGISTRY), help="task family", metavar="NAME"
    )
    quick.add_argument("--task-params", type=json_object, default={}, help="JSON hyperparameters of the family")
    quick.add_argument(
        "--n-dims",
        type=int,
        minimum=1,
        default=None,
        help=f"input dimension d (the family's default, else {DEFAULT_N_DIMS})",
    )
    quick.add_argument("--n-points", type=int, minimum=1, default=16, help="examples per prompt")
    quick.add_argument("--n-prompts", type=int, minimum=1, default=1280, help="prompts to average over")
    quick.add_argument("--seed", type=int, minimum=0, default=0, help="seed of the prompts")
    quick.add_argument(
        "--estimators",
        type=comma_names,
        default=None,
        help="comma-separated (default: the task's baselines, as in hf-icl evaluate)",
    )
    _add_plot_arguments(quick)
    quick.set_defaults(run=run_compare)

    tasks = commands.add_parser("tasks", help=COMMANDS["tasks"])
    tasks.set_defaults(run=run_tasks)

    data = commands.add_parser("dataset", help=COMMANDS["dataset"], formatter_class=help_formatter)
    data.add_argument("--config", default="linear_regression", help="a predefined ICLTasks config name")
    data.add_argument("--family", default=None, help="override the config's task family")
    data.add_argument("--task-params", type=json_object, default=None, help="JSON hyperparameters")
    data.add_argument("--n-dims", type=int, minimum=1, default=None, help="input dimension (config default if unset)")
    data.add_argument(
        "--n-points", type=int, minimum=1, default=None, help="examples per prompt (config default if unset)"
    )
    data.add_argument("--n-tasks", type=int, minimum=1, default=None, help="finite task-pool size")
    data.add_argument(
        "--seed", type=int, minimum=0, default=None, help="seed of the pool and splits (config default if unset)"
    )
    data.add_argument("--n-train", type=int, minimum=0, default=12_800, help="train prompts (0: no split)")
    data.add_argument("--n-validation", type=int, minimum=0, default=1_280, help="validation prompts (0: no split)")
    data.add_argument("--n-test", type=int, minimum=0, default=1_280, help="test prompts (0: no split)")
    data.add_argument("--cache-dir", default=None, help="datasets cache (HF_DATASETS_CACHE if unset)")
    data.add_argument("--save-to-disk", default=None, metavar="PATH", help="write the DatasetDict here")
    data.add_argument("--push-to-hub", default=None, metavar="REPO_ID", help="upload as parquet to this Hub repo")
    data.set_defaults(run=run_dataset)

    _add_niah_parser(commands)
    _add_perplexity_parser(commands)

    from ..reproduce import PAPERS

    listing = "; ".join(f"{name}: {', '.join(paper.experiments)}" for name, paper in PAPERS.items())
    rep = commands.add_parser(
        "reproduce",
        help=COMMANDS["reproduce"],
        description=f"Experiments: {listing}. Writes OUTPUT_DIR/PAPER/EXPERIMENT/results.md and results.json.",
        formatter_class=help_formatter,
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
    from ..attention.cab import BUDGETS, POLICIES, SCORES
    from ..evaluation.niah import DEFAULT_POLICIES, DEFAULT_SPARSITIES, SCORED_METHODS

    parser.add_argument(
        "--policies",
        type=comma_separated(str),
        default=",".join(DEFAULT_POLICIES),
        help=f"comma-separated CAB methods, of {', '.join((*POLICIES, *SCORED_METHODS))} ('' for dense only); "
        "quest and max_l2 rank blocks by Quest's bound and by the largest-norm key",
    )
    parser.add_argument(
        "--sparsities",
        type=comma_separated(float),
        default=",".join(map(str, DEFAULT_SPARSITIES)),
        help="CAB sparsities in [0, 1) (each token drops that fraction of its visible blocks; '' for none)",
    )
    parser.add_argument(
        "--kept-blocks",
        type=comma_separated(int),
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
    niah = commands.add_parser("niah", help=COMMANDS["niah"], formatter_class=help_formatter)
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
        "--lengths",
        type=comma_separated(int),
        default=None,
        help="comma-separated context lengths (default: a quarter, half and all of the longest power of two that fits "
        "the model's positions, at most 4096: 1024,2048,4096 for a long-context model)",
    )
    niah.add_argument(
        "--depths", type=comma_separated(float), default="0,0.25,0.5,0.75,1", help="needle depths in [0, 1]"
    )
    niah.add_argument("--samples", type=int, minimum=1, default=5, help="prompts per (length, depth) cell")
    _add_cab_arguments(niah, block_size=DEFAULT_BLOCK_SIZE)
    niah.add_argument(
        "--haystack", default="filler", help="'filler', 'passkey' (the passkey test's five sentences) or a text file"
    )
    niah.add_argument("--seed", type=int, minimum=0, default=0, help="seed of the passkeys and haystack offsets")
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
        "--keys",
        type=int,
        minimum=2,
        default=None,
        metavar="N",
        help="keys (needles) per prompt with --variant multikey (4)",
    )
    niah.add_argument(
        "--values",
        type=int,
        minimum=2,
        default=None,
        metavar="N",
        help="values per prompt with --variant multivalue (4)",
    )
    niah.add_argument(
        "--preservation-queries",
        type=int,
        minimum=1,
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
        formatter_class=help_formatter,
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
        type=comma_separated(int),
        minimum=2,
        required=True,
        help="tokens per window, comma-separated for several (e.g. 4096,8192); every text runs at every length",
    )
    ppl.add_argument("--windows", type=int, minimum=1, default=1, help="consecutive non-overlapping windows")
    _add_cab_arguments(ppl, block_size=DEFAULT_BLOCK_SIZE)
    ppl.add_argument("--output-dir", default="outputs/perplexity", help="results.json and results.md")
    ppl.add_argument("--no-progress", action="store_true", help="no progress bar")
    ppl.set_defaults(run=run_perplexity_command)
