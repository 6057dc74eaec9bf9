"""The benchmarks behind ``hf-icl bench NAME``: each module's ``main(argv)`` prints (and can append) a markdown
report whose every ratio is against a baseline measured in the same run. The shared helpers: ``timing`` (medians,
markdown output), ``memory`` (peak memory of a call), ``report`` (the machine line and environment), ``flags``."""

from importlib import import_module

from .timing import emit_markdown, median_seconds

#: benchmark name → what it measures (the module of the same name, ``-`` as ``_``, under ``hf_icl.benchmarks`` runs it)
BENCHMARKS = {
    "cab": "CAB block-sparse attention against dense SDPA: coarsening, prefill, FlexAttention, GPT-2 prefill, decode",
    "estimators": "LeastSquares against the per-prefix lstsq loop, then every estimator's time per prompt",
    "linear-attention": "causal linear attention against SDPA: layer fwd+bwd time and memory vs T, decode per token",
    "samplers": "prompts per second of every task family's sampler",
    "seeds": "N seeds of a tiny model trained at once (hf-icl train --seeds N) against N separate runs",
    "sgpt": "SGPT against GPT-2 ICL: train step (same width and depth), one-pass vs per-prefix all-prefix forward",
    "startup": "what `import hf_icl` adds to importing torch + transformers.modeling_utils; `hf-icl --help` time",
}


def run_benchmark(name: str, argv: list[str] | None = None) -> str:
    """Run benchmark ``name`` with command-line arguments ``argv``; returns its markdown report."""
    if name not in BENCHMARKS:
        raise ValueError(f"benchmark={name!r} is unknown; allowed: {sorted(BENCHMARKS)}")
    # names are CLI words ("linear-attention"); modules are Python identifiers ("linear_attention")
    return import_module(f"{__name__}.{name.replace('-', '_')}").main(argv)


__all__ = ["BENCHMARKS", "emit_markdown", "median_seconds", "run_benchmark"]
