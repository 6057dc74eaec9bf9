"""Time one forward of a real causal LM with dense SDPA and with CAB, on a passkey prompt, and measure the
query tiles' union width (what the per-token executor actually runs).

    python scripts/profile_cab_model.py --model DIR --gguf-file SmolLM2-135M-Instruct.Q4_1.gguf --length 8000

Prints the dense and CAB forward times, their ratio, the mean number of key blocks a 64-token query tile gathers
(the union of its tokens' picks) against the mean number it could see, and the executed and achieved sparsity.
Both forwards run in the same process on the same prompt; a warm-up forward runs first.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_icl.kernels.block_sparse_reference as executor
from hf_icl.attention.cab import enable_cab
from hf_icl.data.niah import NeedleInAHaystackConfig


def _timed_forward(model, ids) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        model(ids)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="model directory")
    parser.add_argument("--gguf-file", default=None, help="GGUF file inside --model")
    parser.add_argument("--length", type=int, default=4096, help="prompt tokens")
    parser.add_argument("--policy", default="magnitude")
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--score", default="mean")
    parser.add_argument(
        "--min-seq-len", type=int, default=None, help="tokens before it attend densely (None: CAB's default, 1024)"
    )
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.model, gguf_file=args.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(args.model, gguf_file=args.gguf_file, dtype=torch.float32).eval()
    prompts = NeedleInAHaystackConfig(
        tokenizer=tokenizer, context_lengths=[args.length], depths=[0.5], samples_per_cell=1, haystack="passkey"
    )
    ids = torch.tensor([next(iter(prompts.rows()))["input_ids"]])

    model.set_attn_implementation("sdpa")
    _timed_forward(model, ids[:, : args.block_size * 4])  # warm-up
    dense = _timed_forward(model, ids)

    # the executor's tile unions, recorded as it computes them: (blocks gathered, blocks visible) per call
    unions: list[tuple[float, float]] = []
    select = executor.selected_block_indices

    def recording(keep: torch.Tensor):
        indices, valid = select(keep)
        tiles = keep.shape[-2]
        visible = (torch.arange(tiles) + 1).float().mean().item()  # tile t sees blocks 0 … t (prefill, no padding)
        unions.append((valid.sum(-1).float().mean().item(), visible))
        return indices, valid

    knobs = {} if args.min_seq_len is None else {"min_seq_len": args.min_seq_len}
    enable_cab(model, sparsity=args.sparsity, block_size=args.block_size, policy=args.policy, score=args.score, **knobs)
    executor.selected_block_indices = recording
    try:
        cab = _timed_forward(model, ids)
    finally:
        executor.selected_block_indices = select
    gathered = sum(u for u, _ in unions) / len(unions)
    visible = sum(v for _, v in unions) / len(unions)
    print(f"prompt: {ids.shape[1]} tokens; threads: {torch.get_num_threads()}")
    print(f"dense SDPA forward: {dense:.2f} s")
    print(f"CAB {args.policy}@{args.sparsity} forward: {cab:.2f} s ({dense / cab:.2f}x dense)")
    print(
        f"query tiles gather {gathered:.1f} of {visible:.1f} visible key blocks on average "
        f"(executed sparsity {1 - gathered / visible:.3f}; each token keeps ~{1 - args.sparsity:.0%} of its own)"
    )


if __name__ == "__main__":
    main()
