"""Where CAB's perplexity loss comes from: per-token loss of a causal LM on one window of a long text, dense vs CAB,
grouped by each token's offset inside its block and by its position.

    python scripts/perplexity_by_position.py --model DIR --gguf-file SmolLM2-135M-Instruct.Q4_1.gguf --length 4096 \
        --policies magnitude,streaming --sparsity 0.9 --local-blocks 1

Prints one row per method: the perplexity of all scored tokens, of the tokens at block offsets 0–15, 16–31, ...
(a quarter block each), and of the tokens before and after position 1024. The text is ``hf-icl perplexity``'s
default (Python's ``pydoc_data.topics``); every token is sparse (``cab_min_seq_len=0``), as in ``hf-icl perplexity``.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_icl.attention.cab import enable_cab
from hf_icl.evaluation.perplexity import builtin_text, text_windows


def token_losses(model, ids: torch.Tensor) -> torch.Tensor:
    """The loss of every token after the first, from one forward."""
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    return F.cross_entropy(logits, ids[0, 1:], reduction="none")


def grouped_perplexities(losses: torch.Tensor, block_size: int, split: int) -> list[tuple[str, float]]:
    position = torch.arange(1, losses.numel() + 1)  # of the predicted token
    offset = position % block_size
    quarter = block_size // 4
    groups = [("all", torch.ones_like(position, dtype=torch.bool))]
    groups += [
        (f"offset {lo}-{lo + quarter - 1}", (offset >= lo) & (offset < lo + quarter))
        for lo in range(0, block_size, quarter)
    ]
    groups += [(f"position < {split}", position < split), (f"position >= {split}", position >= split)]
    return [(name, float(losses[mask].mean().exp())) for name, mask in groups]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="model directory")
    parser.add_argument("--gguf-file", default=None, help="GGUF file inside --model")
    parser.add_argument("--length", type=int, default=4096, help="tokens in the window")
    parser.add_argument("--policies", default="magnitude,streaming", help="comma-separated CAB policies")
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--score", default="mean")
    parser.add_argument("--local-blocks", type=int, default=1)
    parser.add_argument("--split", type=int, default=1024, help="position splitting early from late tokens")
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.model, gguf_file=args.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(args.model, gguf_file=args.gguf_file, dtype=torch.float32).eval()
    ids = torch.tensor([text_windows(tokenizer, builtin_text(), args.length, 1)[0]])
    model.set_attn_implementation("sdpa")
    runs = [("dense", token_losses(model, ids))]
    for policy in args.policies.split(","):
        enable_cab(
            model,
            sparsity=args.sparsity,
            block_size=args.block_size,
            policy=policy,
            score=args.score,
            local_blocks=args.local_blocks,
            min_seq_len=0,
        )
        runs.append((f"{policy}@{args.sparsity} local_blocks={args.local_blocks}", token_losses(model, ids)))
    for name, losses in runs:
        cells = " | ".join(
            f"{group} {value:.2f}" for group, value in grouped_perplexities(losses, args.block_size, args.split)
        )
        print(f"{name}: {cells}", flush=True)


if __name__ == "__main__":
    main()
