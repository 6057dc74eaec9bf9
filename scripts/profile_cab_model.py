"""Time one forward of a real causal LM with dense SDPA and with CAB, on a passkey prompt, and count the
(query token, key block) pairs CAB's PyTorch path executes against the pairs dense causal attention visits.

    python scripts/profile_cab_model.py --model DIR --gguf-file SmolLM2-135M-Instruct.Q4_1.gguf --length 8000

Prints the dense and CAB forward times (medians of ``--repeats`` forwards each, dense and CAB alternating, so a
machine busy with other work slows both alike), their ratio, and the executed pairs as a fraction of the dense causal
pairs (the work follows the pairs: key block by key block, the queries that chose a block attend to it).
Both forwards run in the same process on the same prompt; a warm-up forward runs first.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_icl.attention.cab as cab_module
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
    parser.add_argument("--repeats", type=int, default=3, help="forwards of each, alternating (median reported)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")

    tokenizer = AutoTokenizer.from_pretrained(args.model, gguf_file=args.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(args.model, gguf_file=args.gguf_file, dtype=torch.float32).eval()
    prompts = NeedleInAHaystackConfig(
        tokenizer=tokenizer, context_lengths=[args.length], depths=[0.5], samples_per_cell=1, haystack="passkey"
    )
    ids = torch.tensor([next(iter(prompts.rows()))["input_ids"]])

    model.set_attn_implementation("sdpa")
    _timed_forward(model, ids[:, : args.block_size * 4])  # warm-up

    # the pairs the PyTorch path runs, recorded range by range as the selection is handed to it
    pairs = {"kept": 0, "visible": 0}
    attend = cab_module.attend_selected

    def recording(query, key, value, select, **options):
        block_size, offset = options["block_size"], key.shape[2] - query.shape[2]

        def counted(start, stop):
            keep = select(start, stop)
            own = (offset + torch.arange(start, stop)) // block_size
            pairs["kept"] += int((keep & (torch.arange(keep.shape[-1]) <= own[:, None])).sum())
            pairs["visible"] += int((own + 1).sum()) * keep.shape[0] * keep.shape[1]
            return keep

        return attend(query, key, value, counted, **options)

    knobs = {} if args.min_seq_len is None else {"min_seq_len": args.min_seq_len}
    dense_times, cab_times = [], []
    for repeat in range(args.repeats):
        model.set_attn_implementation("sdpa")
        dense_times.append(_timed_forward(model, ids))
        enable_cab(
            model, sparsity=args.sparsity, block_size=args.block_size, policy=args.policy, score=args.score, **knobs
        )
        cab_module.attend_selected = recording if repeat == 0 else attend  # count the pairs once
        try:
            cab_times.append(_timed_forward(model, ids))
        finally:
            cab_module.attend_selected = attend
    dense, cab = statistics.median(dense_times), statistics.median(cab_times)
    print(f"prompt: {ids.shape[1]} tokens; threads: {torch.get_num_threads()}")
    print(f"dense SDPA forward: {dense:.2f} s (median of {', '.join(f'{t:.2f}' for t in dense_times)})")
    print(
        f"CAB {args.policy}@{args.sparsity} forward: {cab:.2f} s (median of {', '.join(f'{t:.2f}' for t in cab_times)};"
        f" {dense / cab:.2f}x dense)"
    )
    ratio = pairs["kept"] / max(1, pairs["visible"])
    print(f"executed (token, block) pairs / dense causal pairs: {ratio:.3f} (achieved sparsity {1 - ratio:.3f})")


if __name__ == "__main__":
    main()
