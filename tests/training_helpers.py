"""What the training tests share: tiny, fast training arguments and a copy of a model's weights.

Imported as ``from training_helpers import ...`` (pytest's default ``prepend`` import mode puts ``tests/`` on the path).
"""

import torch

from hf_icl.training import ICLTrainingArguments


def tiny_args(output_dir, **overrides) -> ICLTrainingArguments:
    """A tiny GPT-2 on 3-D linear regression, 6 points, no trackers, no progress bar; ``overrides`` win."""
    values = dict(
        n_dims=3,
        n_points=6,
        model_size="tiny",
        max_steps=10,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        eval_steps=0,
        eval_prompts=32,
        save_steps=5,
        report_to="none",
        disable_tqdm=True,
        output_dir=str(output_dir),
    )
    values.update(overrides)
    return ICLTrainingArguments(**values)


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
