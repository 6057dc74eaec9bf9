"""Toy sizes the reproduction tests run whole experiments at (seconds, not minutes)."""

from hf_icl.reproduce.sgpt import Scale

#: every SGPT figure end to end: one-layer width-8 models, 2 steps
SGPT_TOY = Scale(
    "toy",
    steps=2,
    batch_size=4,
    eval_prompts=8,
    n_embd=8,
    n_layer=1,
    n_head=1,
    mlp_width=8,
    learning_rate=1e-3,
    full=False,
    hilbert_prompts=64,
    hilbert_max_log2=7,
)
