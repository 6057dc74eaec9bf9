"""Peak memory of one call, shared by the benchmarks: the CUDA allocator's peak on a GPU, the CPU allocator's events
(recorded by the PyTorch profiler) on a CPU; and whether an error means the call ran out of memory."""

from __future__ import annotations

from collections.abc import Callable

import torch


def cuda_peak_bytes(fn: Callable[[], object], device: str | torch.device) -> int:
    """Peak ``torch.cuda.max_memory_allocated`` during ``fn()`` above the memory allocated before it."""
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def peak_bytes(fn: Callable[[], None], device: torch.device) -> int | None:
    """Peak memory allocated during ``fn()`` above what was allocated before it: :func:`cuda_peak_bytes` on CUDA,
    else :func:`profiled_cpu_peak` (None where the profiler does not expose its events)."""
    if device.type == "cuda":
        return cuda_peak_bytes(fn, device)
    return profiled_cpu_peak(fn)


def profiled_cpu_peak(fn: Callable[[], None]) -> int | None:
    """The peak of the CPU allocator's allocation and free events the PyTorch profiler records during ``fn()``
    (tensors and ATen workspaces on the calling thread), None on a torch whose profiler keeps them elsewhere."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    try:  # the allocator's events in order: + bytes allocated, - bytes freed
        events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    except AttributeError:  # a torch whose profiler keeps its events elsewhere: say n/a rather than guess
        return None
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):  # stable: same-time events keep their order
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation failure (CUDA's ``OutOfMemoryError`` or the CPU allocator's message)."""
    text = str(error)
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text
