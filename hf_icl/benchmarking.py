"""Small helpers shared by the benchmark scripts: median wall time and markdown output."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def median_seconds(fn: Callable, repeats: int, device: str | torch.device, *inputs) -> float:
    """Median wall time of ``fn(*inputs)`` over ``repeats`` runs after one warm-up (CUDA-synchronised)."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    fn(*inputs)
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn(*inputs)
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def emit_markdown(lines: list[str], output: str | None) -> str:
    """Print the report and, with ``output``, append it to that markdown file."""
    table = "\n".join(lines) + "\n"
    print(table)
    if output:
        with open(output, "a", encoding="utf-8") as handle:
            handle.write("\n" + table)
    return table
