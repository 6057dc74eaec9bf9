"""Sparse attention judged on in-context learning: a trained ICL model's error against the number of in-context
examples under CAB budgets and policies, beside dense attention and least squares (and optionally a linear-attention
GPT on the same prompts).

    python scripts/sparse_icl.py --model .runs28/gpt2-icl-linreg-d5-n128 \\
        --linear-model .runs28/linear-gpt-linreg-d5-n128 --budgets 2,4,8 --policies streaming,magnitude,oracle \\
        --block-size 16 --n-prompts 1000 --output-dir outputs/sparse_icl

Writes OUTPUT_DIR/results.json (settings, every curve with its bootstrap band, achieved sparsity, late error, ratio
to dense, departures), OUTPUT_DIR/results.md (the table) and OUTPUT_DIR/sparse_icl.png (one panel per policy).
The task is the one the model was trained on (its ``training_args.json``, fresh tasks from the prior) unless
``--task`` names one. See :mod:`hf_icl.evaluation.sparse_icl` for the definitions (achieved sparsity, late window,
departure).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _float_list(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _name_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/sparse_icl.py",
        description="Error vs number of in-context examples of a trained ICL model under CAB budgets and policies, "
        "beside dense attention and least squares.",
    )
    parser.add_argument("--model", required=True, help="a saved GPT-2 ICL folder (save_pretrained, e.g. hf-icl train)")
    parser.add_argument("--linear-model", help="a saved linear-attention GPT folder, scored on the same prompts")
    parser.add_argument("--budgets", type=_int_list, default=[2, 4, 8], help="topk budgets: key blocks kept per query")
    parser.add_argument(
        "--row-sparsities", type=_float_list, default=[], help="row budgets: fraction of visible blocks dropped"
    )
    parser.add_argument(
        "--policies",
        type=_name_list,
        default=["streaming", "magnitude", "oracle"],
        help="CAB policies (dense, frc, frc_low, hybrid, magnitude, oracle, streaming) or quest / max_l2",
    )
    parser.add_argument(
        "--score", default="mean", help="block score of the score-ranked policies (mean, bound, max_l2)"
    )
    parser.add_argument("--block-size", type=int, default=16, help="CAB block size in tokens")
    parser.add_argument("--sink-blocks", type=int, default=1, help="blocks always kept at the start")
    parser.add_argument("--local-blocks", type=int, default=1, help="blocks always kept ending at the token's own")
    parser.add_argument("--n-prompts", type=int, default=1000, help="prompts shared by every curve")
    parser.add_argument("--n-points", type=int, help="examples per prompt (default: the model's config.n_points)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts and the bootstrap")
    parser.add_argument("--batch-size", type=int, default=250, help="prompts per forward pass")
    parser.add_argument("--task", help="task family (default: the model's training task)")
    parser.add_argument("--threshold", type=float, default=0.10, help="relative departure from dense (0.10 = 10%%)")
    parser.add_argument("--late-fraction", type=float, default=0.25, help="share of last positions judging departure")
    parser.add_argument("--n-bootstrap", type=int, default=1000, help="bootstrap replicates of the bands")
    parser.add_argument("--output-dir", required=True, help="where results.json, results.md and the PNG go")
    return parser


def _training_task(folder: Path, n_dims: int):
    """The task ``folder``'s model was trained on (fresh tasks from its prior)."""
    from hf_icl.data.tasks import make_task
    from hf_icl.training import ICLTrainingArguments
    from hf_icl.training.trainer import TRAINING_ARGS_FILE, build_task

    saved = folder / TRAINING_ARGS_FILE
    if not saved.is_file():
        raise SystemExit(f"sparse_icl.py: error: --task is required: {saved} (written by hf-icl train) is missing")
    trained = ICLTrainingArguments.from_dict(json.loads(saved.read_text()), source=str(saved))
    family = make_task({**build_task(trained).to_dict(), "n_tasks": None})
    if family.n_dims != n_dims:
        raise SystemExit(f"sparse_icl.py: error: {saved} trained on n_dims={family.n_dims}, the model has {n_dims}")
    return family


def _load(flag: str, folder: str):
    from transformers import AutoModel

    import hf_icl  # noqa: F401  (registers the architectures)

    path = Path(folder)
    if not (path / "config.json").is_file():
        raise SystemExit(f"sparse_icl.py: error: {flag} {folder}: no config.json there (a save_pretrained folder)")
    return AutoModel.from_pretrained(path).eval()


def _compact_png(path: Path) -> Path:
    """Rewrite the PNG with a 256-colour palette (a third of the size; the figure has few distinct colours)."""
    from PIL import Image  # Pillow comes with matplotlib

    with Image.open(path) as image:
        compact = image.convert("RGB").quantize(colors=256)
    compact.save(path, optimize=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    from hf_icl.data.tasks import get_task
    from hf_icl.evaluation.sparse_icl import sparse_icl_curves

    model = _load("--model", args.model)
    family = (
        get_task(args.task, n_dims=model.config.n_dims)
        if args.task
        else _training_task(Path(args.model), model.config.n_dims)
    )
    extras = {}
    if args.linear_model:
        linear = _load("--linear-model", args.linear_model)
        extras[f"{linear.config.model_type} (linear attention)"] = linear
    started = time.perf_counter()
    try:
        result = sparse_icl_curves(
            model,
            family,
            budgets=args.budgets,
            policies=args.policies,
            block_size=args.block_size,
            n_prompts=args.n_prompts,
            seed=args.seed,
            n_points=args.n_points or model.config.n_points,
            score=args.score,
            sink_blocks=args.sink_blocks,
            local_blocks=args.local_blocks,
            row_sparsities=args.row_sparsities,
            extra_predictors=extras,
            batch_size=args.batch_size,
            late_fraction=args.late_fraction,
            n_bootstrap=args.n_bootstrap,
            model_name=f"{model.config.model_type} ({Path(args.model).name})",
        )
        result.departures(args.threshold)  # validates the threshold before anything is written
    except ValueError as err:
        parser.error(str(err))
    seconds = time.perf_counter() - started
    command = "python scripts/sparse_icl.py " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )
    document = {
        "command": command,
        "seconds": seconds,
        "model": args.model,
        "linear_model": args.linear_model,
        **result.to_dict(args.threshold),
    }
    (output_dir / "results.json").write_text(json.dumps(document, indent=2))
    figure = _compact_png(result.plot(output_dir / "sparse_icl.png", dpi=90))
    settings = result.settings
    header = [
        f"# Sparse attention on in-context learning: {settings['model']}",
        "",
        f"`{command}` ({seconds:.0f} s)",
        "",
        f"Task {settings['task']} (d = {settings['n_dims']}), {result.n_points} examples = "
        f"{settings['n_tokens']} tokens, "
        f"{args.n_prompts} prompts (seed {args.seed}); CAB blocks of {settings['block_size']} tokens "
        f"({settings['n_blocks']} blocks), sink {settings['sink_blocks']}, local {settings['local_blocks']}, "
        f"score {settings['score']!r} for the score-ranked policies. Errors: {result.curves.metric.name}. Late window: "
        f"examples {result.late_start}–{result.n_points - 1}; a method departs from dense when its late error differs "
        f"from dense's by more than {100 * args.threshold:g}%.",
        "",
        "",
    ]
    (output_dir / "results.md").write_text("\n".join(header) + result.to_markdown(threshold=args.threshold) + "\n")
    print(result.to_markdown(threshold=args.threshold))
    print(f"wrote {output_dir / 'results.json'}, {output_dir / 'results.md'}, {figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
