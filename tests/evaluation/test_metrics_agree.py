"""One error normaliser: the trainer's evaluation, evaluate_context_scaling, `hf-icl evaluate` and the
model card report the same number for the same model and prompts."""

import re

import torch
from training_helpers import tiny_args
from transformers import AutoModel

from hf_icl.cli import main
from hf_icl.data.tasks import get_task
from hf_icl.evaluation import evaluate_context_scaling, metric_for_task
from hf_icl.training import train
from hf_icl.training.trainer import EVAL_SEED_OFFSET


def test_last_position_error_is_the_same_number_everywhere(tmp_path, capsys):
    # Decision trees have unit-variance leaves: their normaliser is 1, not d = 4, so a report that
    # divided by d somewhere (the model card once said 0.114 beside a table reading 0.456) shows up.
    out = tmp_path / "tree"
    args = tiny_args(
        out,
        task="decision_tree",
        task_params='{"depth": 2}',
        n_dims=4,
        n_points=8,
        max_steps=6,
        eval_steps=3,
        eval_prompts=48,
        save_steps=0,
    )
    result = train(args)
    family = get_task("decision_tree", n_dims=4, depth=2)
    assert metric_for_task(family).name == "squared_error/1"

    # the trainer's own evaluation of the final model
    trainer_value = result.final_metrics["eval/error_last/1"]
    assert "eval/error_last/4" not in result.final_metrics and "eval/error_last" not in result.final_metrics

    # evaluate_context_scaling on the reloaded model, on the trainer's evaluation prompts
    model = AutoModel.from_pretrained(out)
    scaling = evaluate_context_scaling(
        {"gpt2_icl": model}, family, n_prompts=48, n_points=8, seed=args.seed + EVAL_SEED_OFFSET
    )
    assert scaling.values["gpt2_icl"][-1].item() == trainer_value
    assert result.context_scaling.values["gpt2_icl"][-1].item() == trainer_value

    # an independent reference: the mean squared error at the last position, divided by 1
    xs, ys = family.sample(48, 8, seed=args.seed + EVAL_SEED_OFFSET)
    with torch.no_grad():
        preds = model(xs, ys).predictions
    reference = sum((preds[b, -1].double() - ys[b, -1].double()).item() ** 2 for b in range(48)) / 48
    assert abs(reference - trainer_value) < 1e-9

    # the model card: its final-metrics row and its context-scaling table carry the same number
    card = (out / "README.md").read_text()
    assert f"| eval/error_last/1 | {trainer_value:.4g} |" in card
    assert "squared error / 1 by number of in-context examples" in card
    table_last = re.search(r"^\| 7 \| (\S+) \[", card, flags=re.M).group(1)
    assert table_last == f"{trainer_value:.3g}"

    # hf-icl evaluate on the same prompts
    capsys.readouterr()
    argv = ["evaluate", "--model", str(out), "--n-prompts", "48", "--seed", str(args.seed + EVAL_SEED_OFFSET)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("squared error / 1, ")
    assert re.search(r"^\| 7 \| (\S+) \[", printed, flags=re.M).group(1) == table_last
