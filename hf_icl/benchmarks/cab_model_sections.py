"""The model sections of ``hf-icl bench cab`` (:mod:`.cab`): end-to-end prefill of a GPT-2-shaped model (random
weights, no LM head) with ``attn_implementation="cab"`` vs ``"sdpa"``, and decode latency per token on a prefilled
cache: sdpa, CAB re-summarising the key cache every step (a plain ``DynamicCache``), and CAB selecting from the
block summaries a ``CABCache`` keeps."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from hf_icl.attention.cab import enable_cab
from hf_icl.attention.cab_cache import CABCache

from .timing import median_seconds


def _gpt2(args, length: int, implementation: str, sparsity: float):
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    small = args.smoke
    config = GPT2Config(
        n_layer=args.model_layers,
        n_embd=64 if small else 768,
        n_head=2 if small else 12,
        n_positions=length + 64,
        vocab_size=1000 if small else 50257,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2Model(config).to(device=args.device, dtype=args.dtype).eval()
    if implementation == "cab":
        return enable_cab(model, sparsity=sparsity, block_size=args.block_size, policy=args.policy, min_seq_len=0)
    model.set_attn_implementation(implementation)
    return model


def _ids(length: int, device, vocab: int) -> torch.Tensor:
    return torch.randint(vocab, (1, length), generator=torch.Generator().manual_seed(0)).to(device)


def _model_row(args, length: int, measured) -> str:
    """Time ``measured(model, ids)`` (a zero-argument callable it returns) on an sdpa and a cab GPT-2: one row."""
    times = {}
    for implementation in ("sdpa", "cab"):
        model = _gpt2(args, length, implementation, args.model_sparsity)
        ids = _ids(length + 1, args.device, model.config.vocab_size)
        with torch.no_grad():
            times[implementation] = median_seconds(measured(model, ids), args.repeats, args.device, warmup=args.warmup)
        del model
    sdpa, cab = times["sdpa"], times["cab"]
    return f"| {length} | {1e3 * sdpa:.2f} | {1e3 * cab:.2f} | {sdpa / cab:.2f}× |"


def _prefill(model, ids):
    return lambda: model(ids[:, :-1], use_cache=False)


def _decode_step(model, ids, cache=None):
    """One new token on a cache (``cache``, else the model's own ``DynamicCache``) prefilled with all but the last
    id; the cache is cropped back after each step (a ``CABCache`` drops a block summary the step completed)."""
    cache = model(ids[:, :-1], past_key_values=cache, use_cache=True).past_key_values

    def step():
        model(ids[:, -1:], past_key_values=cache, use_cache=True)
        cache.crop(-1)

    return step


def _decode_row(args, length: int) -> str:
    """ms per token at one cache length: sdpa, CAB recomputing its selection from the keys (plain
    ``DynamicCache``), CAB selecting from the block summaries a ``CABCache`` keeps; one table row."""
    times = {}
    for name, implementation in (("sdpa", "sdpa"), ("uncached", "cab"), ("cached", "cab")):
        model = _gpt2(args, length, implementation, args.model_sparsity)
        ids = _ids(length + 1, args.device, model.config.vocab_size)
        cache = CABCache(model.config) if name == "cached" else DynamicCache()
        with torch.no_grad():
            step = _decode_step(model, ids, cache)
            times[name] = median_seconds(step, args.repeats, args.device, warmup=args.warmup)
        del model, cache
    sdpa, uncached, cached = times["sdpa"], times["uncached"], times["cached"]
    return (
        f"| {length} | {1e3 * sdpa:.2f} | {1e3 * uncached:.2f} | {1e3 * cached:.2f} | {uncached / cached:.2f}× "
        f"| {sdpa / uncached:.2f}× | {sdpa / cached:.2f}× |"
    )


def model_prefill_section(args) -> list[str]:
    return [
        "",
        f"End-to-end prefill, GPT-2-shaped model ({args.model_layers} layers, no LM head, {args.dtype_name}), "
        f"CAB {args.policy} at sparsity {args.model_sparsity}:",
        "",
        "| T | sdpa ms | cab ms | speed-up |",
        "|---:|---:|---:|---:|",
        *(_model_row(args, length, _prefill) for length in args.model_lengths),
    ]


def decode_section(args) -> list[str]:
    return [
        "",
        f"Decode latency per token, GPT-2-shaped model ({args.model_layers} layers, {args.dtype_name}), one new token "
        f"on a prefilled cache; CAB {args.policy} at sparsity {args.model_sparsity}, uncached (every step "
        "re-summarises the key cache: a plain DynamicCache) and cached (block summaries kept by a CABCache); "
        "speed-ups are the first time / the second:",
        "",
        "| cache length | sdpa ms/token | CAB uncached ms/token | CAB cached ms/token | cached vs uncached "
        "| sdpa vs uncached | sdpa vs cached |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *(_decode_row(args, length) for length in args.cache_lengths),
    ]
