"""Sampler throughput: prompts per second for every task family.

hf-icl bench samplers --batch-size 1280 --n-points 41 --n-dims 20 --output docs/results/estimators.md
"""

from __future__ import annotations

import torch

from hf_icl.data.tasks import available_tasks, get_task

from .flags import BenchParser, bench_device, bench_memory, check_flags
from .report import cpu_name, machine_line
from .timing import emit_markdown, median_seconds

# Families whose input dimension is part of their definition.
FIXED_DIMS = {"sinusoid": 1, "latent_group_sinusoid": 10}


def time_family(name: str, args) -> tuple[int, float]:
    n_dims = FIXED_DIMS.get(name, args.n_dims)
    family = get_task(name, n_dims=n_dims)
    generator = torch.Generator(device=args.device).manual_seed(0)

    def draw():
        family.sample(args.batch_size, args.n_points, generator=generator)

    return n_dims, median_seconds(draw, args.repeats, args.device)


def main(argv=None) -> str:
    parser = BenchParser(prog="hf-icl bench samplers", description=__doc__)
    parser.add_argument("--batch-size", type=int, default=1280)
    parser.add_argument("--n-points", type=int, default=41)
    parser.add_argument("--n-dims", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--output", default=None, help="append the markdown table to this file")
    args = parser.parse_args(argv)
    positive = ("batch_size", "n_points", "n_dims", "repeats", "threads")
    check_flags(parser, args, ints={name: (1, None) for name in positive})
    device = bench_device(parser, args.device)
    widest = max(args.n_dims, *FIXED_DIMS.values()) + 1  # an input row and its target
    bench_memory(
        parser,
        f"--batch-size {args.batch_size} --n-points {args.n_points} --n-dims {args.n_dims}",
        4 * args.batch_size * args.n_points * widest,
        device,
        "one batch of float32 prompts",
    )
    if args.threads:
        torch.set_num_threads(args.threads)

    lines = [
        f"### Sampler throughput (B={args.batch_size}, N={args.n_points}, d={args.n_dims}, device={args.device})",
        "",
        machine_line(
            f"hf-icl bench samplers --batch-size {args.batch_size} --n-points {args.n_points} "
            f"--n-dims {args.n_dims} --device {args.device}",
            cpu_name(),
            f"{torch.get_num_threads()} threads",
            f"torch {torch.__version__}",
        ),
        "",
        "| family | d | median ms / batch | prompts / s |",
        "|---|---:|---:|---:|",
    ]
    for name in available_tasks():
        n_dims, seconds = time_family(name, args)
        lines.append(f"| {name} | {n_dims} | {1e3 * seconds:.2f} | {args.batch_size / seconds:,.0f} |")
    return emit_markdown(lines, args.output)


if __name__ == "__main__":
    main()
