"""Timing and report helpers shared by the benchmarks: median run time (CUDA events on a GPU), round-robin medians
and markdown output."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def median_seconds(
    fn: Callable,
    repeats: int,
    device: str | torch.device,
    *inputs,
    warmup: int = 1,
    budget_s: float = float("inf"),
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Median time of ``fn(*inputs)`` over ``repeats`` runs after ``warmup`` runs.

    On CUDA each run is timed with a pair of CUDA events (GPU time between them, launch queue included); on CPU
    with ``clock`` (``time.perf_counter``; tests pass a fake one, so no test depends on the machine's speed), and
    there the repeats stop early once the timed runs have used ``budget_s`` seconds (at least one run is timed), so
    slow baselines do not dominate a benchmark's wall time.
    """
    for _ in range(warmup):
        fn(*inputs)
    if torch.device(device).type == "cuda":
        return _median_cuda_seconds(fn, repeats, inputs)
    samples = []
    while len(samples) < repeats and (not samples or sum(samples) < budget_s):
        start = clock()
        fn(*inputs)
        samples.append(clock() - start)
    return statistics.median(samples)


def _median_cuda_seconds(fn: Callable, repeats: int, inputs: tuple) -> float:
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    torch.cuda.synchronize()
    for start, end in events:
        start.record()
        fn(*inputs)
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events) / 1e3


def round_robin_medians(functions: dict, repeats: int, device: str | torch.device) -> dict:
    """Median seconds of each zero-argument function, timed one run of each per round over ``repeats`` rounds (warm-up
    done by the caller), so that a load change on a shared machine hits every function alike."""
    samples: dict = {name: [] for name in functions}
    for _ in range(repeats):
        for name, fn in functions.items():
            samples[name].append(median_seconds(fn, 1, device, warmup=0))
    return {name: statistics.median(times) for name, times in samples.items()}


def emit_markdown(lines: list[str], output: str | None) -> str:
    """Print the report and, with ``output``, append it to that markdown file."""
    table = "\n".join(lines) + "\n"
    print(table)
    if output:
        with open(output, "a", encoding="utf-8") as handle:
            handle.write("\n" + table)
    return table
