#!/usr/bin/env bash
# Every figure of the SGPT study at the document's sizes (--full: transformers of width 256 and depth 8,
# MLPs of width 1024, d = 20 / 8, 50 000 steps × 64 prompts per run, pools up to 10^6 tasks), on one GPU.
# Not run yet (no GPU was lent to the session that wrote it); the CPU-sized results are docs/results/sgpt.md.
# Finished runs are reused, so the script resumes figure by figure after an interruption.
# Usage: bash scripts/reproduce_sgpt_gpu.sh OUTPUT_ROOT [EXPERIMENT ...]   (default: fig1 … fig7, hilbert, lengths)
set -euo pipefail
root=${1:?usage: reproduce_sgpt_gpu.sh OUTPUT_ROOT [EXPERIMENT ...]}
shift
experiments=${*:-fig1 fig2 fig3 fig4 fig5 fig6 fig7 hilbert lengths}
for experiment in $experiments; do
    hf-icl reproduce sgpt "$experiment" --full --output-dir "$root"
done
hf-icl bench sgpt --device cuda --dtype bfloat16 --output "$root/sgpt_speed_cuda.md"
