"""The report of ``hf-icl bench linear-attention``: the targets computed from its measurements (reported, never
asserted) and its markdown tables, from the result dict the benchmark builds (what ``--json`` writes)."""

from __future__ import annotations

#: the issue's targets: decode time/token flat within 20%; chunked time ≤ 1.25× linear growth (20 for 1k → 16k)
DECODE_TARGET = 1.2
GROWTH_SLACK = 1.25
INTERPRETED_NOTE = "Triton interpreter: a smoke run, not a speed"
MIB = 2**20


def ratio_or_none(numerator, denominator):
    """``numerator / denominator``, None where either is missing (or the denominator is zero)."""
    return None if numerator is None or not denominator else numerator / denominator


# ----------------------------------------------------------------------------------------------------------------
# Targets
# ----------------------------------------------------------------------------------------------------------------


def decode_target(per_token: dict[int, float]) -> dict:
    """Time/token at the longest prompt over that at the shortest, against :data:`DECODE_TARGET`."""
    short, long = min(per_token), max(per_token)
    ratio = per_token[long] / per_token[short]
    return {"short": short, "long": long, "ratio": ratio, "target": DECODE_TARGET, "met": ratio <= DECODE_TARGET}


def growth_target(rows: list[dict], method: str, lengths: list[int]) -> dict:
    """``method``'s time(T2)/time(T1) against ``GROWTH_SLACK·T2/T1``; ``met`` None if either is unmeasured or
    interpreted (a verdict on the Triton interpreter's speed would mean nothing)."""
    short, long = lengths
    target = GROWTH_SLACK * long / short
    measured = {row["length"]: row for row in rows if row["method"] == method and row["status"] == "ok"}
    ratio = ratio_or_none(*(measured[t]["seconds"] if t in measured else None for t in (long, short)))
    interpreted = any(row["note"] == INTERPRETED_NOTE for row in measured.values())
    met = None if ratio is None or interpreted else ratio <= target
    return {"method": method, "short": short, "long": long, "ratio": ratio, "target": target, "met": met}


# ----------------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------------


def _cell(value, scale: float = 1.0, digits: int = 3, suffix: str = "") -> str:
    return "—" if value is None else f"{value * scale:.{digits}f}{suffix}"


def _peak_cell(row: dict) -> str:
    if row["status"] != "ok":
        return "—"
    return "n/a" if row["peak_bytes"] is None else f"{row['peak_bytes'] / MIB:.1f}"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _verdict(met: bool | None) -> str:
    return "n/a" if met is None else ("PASS" if met else "MISS")


def layer_table(result: dict) -> list[str]:
    config = result["config"]
    batch, heads, dim = config["shape"]
    lines = [
        f"Forward + backward of one attention layer (B={batch}, H={heads}, D={dim}, {config['dtype']}; linear "
        f"attention: squared_relu features, normalised, chunk {config['chunk_size']}; memory budget "
        f"{config['memory_budget_gb']:.1f} GiB). Peak: allocated during one fwd+bwd above the inputs "
        f"({result['environment']['memory_method']}).",
        "",
        "| T | method | fwd+bwd ms | SDPA ms | time / SDPA | peak MiB | peak / SDPA | estimate MiB | note |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in result["layer"]:
        lines.append(
            f"| {row['length']} | {row['method']} | {_cell(row['seconds'], 1e3)} | {_cell(row['sdpa_seconds'], 1e3)} "
            f"| {_cell(row['time_vs_sdpa'], digits=2, suffix='×')} | {_peak_cell(row)} "
            f"| {_cell(row['peak_vs_sdpa'], digits=2, suffix='×')} | {row['estimate_bytes'] / MIB:.1f} "
            f"| {row['note']} |"
        )
    return lines


def decode_table(result: dict) -> list[str]:
    config, decode = result["config"], result["decode"]
    batch, heads, dim = config["shape"]
    lines = [
        f"Decode, ms per step (one new token for each of B={batch} sequences; median of {config['decode_repeats']} "
        f"round-robin rounds): one layer's `linear_attention_step` on a prefilled (S, z), and "
        f"`LinearGPTForCausalLM` ({_plural(config['decode_layers'], 'layer')}, width {heads * dim}, {heads} heads, "
        f"vocabulary {config['decode_vocab']}, random weights) on a prefilled `LinearAttentionCache`:",
        "",
        "| prompt tokens | layer step ms | model ms/token |",
        "|---:|---:|---:|",
    ]
    for length in config["decode_lengths"]:
        lines.append(
            f"| {length} | {_cell(decode['layer'][length], 1e3, 4)} | {_cell(decode['model'][length], 1e3, 3)} |"
        )
    return lines


def targets_lines(result: dict) -> list[str]:
    lines = ["Targets (computed from the numbers above):", ""]
    for kind, label in (("model", "LinearGPTForCausalLM cache"), ("layer", "one layer's linear_attention_step")):
        target = result["targets"]["decode"][kind]
        lines.append(
            f"- decode ({label}): time/token at {target['long']} tokens / at {target['short']} = "
            f"{target['ratio']:.2f} (target ≤ {target['target']:g}): **{_verdict(target['met'])}**"
        )
    for target in result["targets"]["growth"]:
        ratio = "not measured at both lengths" if target["ratio"] is None else f"{target['ratio']:.1f}"
        why = " (interpreted)" if target["ratio"] is not None and target["met"] is None else ""
        lines.append(
            f"- chunked growth ({target['method']}): time(T={target['long']}) / time(T={target['short']}) = {ratio} "
            f"(target ≤ {target['target']:g}; linear: {target['long'] / target['short']:g}): "
            f"**{_verdict(target['met'])}**{why}"
        )
    return lines


def header_lines(result: dict, argv: list[str]) -> list[str]:
    env = result["environment"]
    return [
        f"`{' '.join(['hf-icl bench linear-attention', *argv])}`",
        "",
        f"{env['hardware']}, torch {env['torch']}, {env['threads']} torch threads, {env['date']}, 1-min load "
        f"average {env['load_average_start']} at the start; median of {result['config']['repeats']} round-robin "
        f"rounds after {max(result['config']['warmup'], 1)} untimed run(s) of each (the last measures memory).",
        "",
    ]
