"""What every benchmark's report says about where it ran: the machine line under its title ("`hf-icl bench ...` ·
x86_64, torch ..., date"), the hardware and load average its JSON records, and the JSON file itself."""

from __future__ import annotations

import json
import os
import platform
import time

import torch


def cpu_name() -> str:
    """The processor as ``platform`` names it, else the architecture (``platform.processor()`` is often empty)."""
    return platform.processor() or platform.machine()


def hardware_name(device: torch.device) -> str:
    """The GPU's name on a CUDA ``device``, else :func:`cpu_name`."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return name or platform.machine()


def cpu_model(architecture: bool = False) -> str:
    """The CPU's model name (Linux names it in /proc/cpuinfo; else :func:`cpu_name`), with ``architecture`` the
    architecture in parentheses, and the CPU count: "Intel(R) Xeon(R) Processor (x86_64), 2 CPUs"."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    except OSError:
        model = ""
    machine = f" ({platform.machine()})" if architecture else ""
    return f"{model or cpu_name()}{machine}, {os.cpu_count()} CPUs"


def load_average() -> float | None:
    """The 1-minute load average, None where the platform has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def load_text(load: float | None) -> str:
    """A load average as the reports print it: two decimals, "n/a" where there is none."""
    return "n/a" if load is None else f"{load:.2f}"


def today() -> str:
    return time.strftime("%Y-%m-%d")


def environment(device: str, architecture: bool = False) -> dict:
    """The machine facts a benchmark's JSON records: hardware (the GPU on ``device`` "cuda", else
    :func:`cpu_model`), torch version, torch threads and the date and time."""
    return {
        "hardware": torch.cuda.get_device_name() if device == "cuda" else cpu_model(architecture),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
    }


def machine_line(command: str, hardware: str, *facts: str) -> str:
    """The line under a report's title that says what ran where: "`COMMAND` · HARDWARE, FACT, ..., DATE"."""
    return f"`{command}` · {', '.join([hardware, *facts, today()])}"


def write_json(path: str, result: dict) -> None:
    """``result`` as indented JSON in ``path`` (overwritten), ending with a newline."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
        handle.write("\n")
