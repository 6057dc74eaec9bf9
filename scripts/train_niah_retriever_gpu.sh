#!/usr/bin/env bash
# The GPU recipe for the NIAH retriever, in two stages that fit one ten-minute GPU session:
#   1. 64-1024 tokens (batch 32): the model learns to retrieve;
#   2. only if stage 1 reaches 95% exact match at 1024: continue from it at 256-4096 tokens (batch 16),
#      else keep training at 64-1024 for the remaining time.
# Usage: bash scripts/train_niah_retriever_gpu.sh OUTPUT_ROOT   (writes OUTPUT_ROOT/stage1, OUTPUT_ROOT/stage2)
set -euo pipefail
root=${1:?usage: train_niah_retriever_gpu.sh OUTPUT_ROOT}
train="python3 scripts/train_niah_retriever.py --device cuda --workers 4 --eval-samples 20 --answer-weight 2"

$train --output-dir "$root/stage1" --min-length 64 --max-length 1024 --steps 5000 --ramp-steps 1500 \
    --batch-size 32 --lr 1e-3 --max-minutes 3.5

if python3 -c "import json,sys; sys.exit(json.load(open('$root/stage1/retrieval_eval.json'))['1024'] < 0.95)"; then
    $train --output-dir "$root/stage2" --init-from "$root/stage1" --min-length 256 --max-length 4096 \
        --steps 2500 --ramp-steps 800 --batch-size 16 --lr 5e-4 --max-minutes 2.5 --eval-lengths 1024 2048 4096
else
    $train --output-dir "$root/stage2" --init-from "$root/stage1" --min-length 64 --max-length 1024 \
        --steps 4000 --ramp-steps 1 --batch-size 32 --lr 5e-4 --max-minutes 2.5
fi
