#!/usr/bin/env bash
# CAB on one GPU in one call (budget: under 8 minutes on an H100/H200; the step limits below add up to 7 min 50 s,
# and the whole script ran in 275 s on an H100 on 2026-11-26): the environment, the CAB kernel tests on CUDA,
# `hf-icl bench cab --device cuda` at 8k and 32k tokens (the pairs section, CAB end to end vs flash SDPA, decode at
# 16k, the selection alone, the per-kernel sections), then scripts/profile_cab_gpu.py (where a 32k call's time goes,
# kernel by kernel; the query-range budget's time and memory; the fused selection's launch sweep, early exit
# included); every table written under OUT_DIR. Each step has its own time limit, so a slow step cannot eat the others' time; the script goes on after a
# failed step and exits non-zero at the end. The tests log one line per test (-v) and, where pytest-timeout is
# installed, stop any single test after 140 s, so a cut-short step still names what ran and what failed.
#
#   bash scripts/gpu_check.sh OUT_DIR            # on the GPU machine (python3 with torch, triton, transformers)
#   bash scripts/gpu_check.sh --dry-run OUT_DIR  # the same steps at tiny sizes on CPU (TRITON_INTERPRET=1; CI runs it)
#
# CAB_QK=FILE adds the captured-q/k tables (scripts/capture_cab_qk.py writes one; the bench uses its lengths <= the
# capture's). Record the tables in docs/results/cab.md with the date and the card.
set -uo pipefail
dry=0
if [[ "${1:-}" == "--dry-run" ]]; then
    dry=1
    shift
fi
out=${1:?usage: gpu_check.sh [--dry-run] OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
failed=()

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to OUT_DIR/NAME.log, remember failures
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s): $*"
    local start=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$out/$name.log"
    echo "== $name: exit $rc after $((SECONDS - start)) s"
    ((rc == 0)) || failed+=("$name")
}

# the tests whose tensors go to the GPU (the CAB attention tests on CPU models run in CI)
tests=(tests/kernels/token_sparse/test_triton.py tests/attention/test_cab_triton_backend.py
    tests/kernels/test_block_sparse_decode.py tests/kernels/token_selection/test_fused.py)
qk=()
if [[ -n "${CAB_QK:-}" ]]; then
    qk=(--qk "$CAB_QK")
fi
if ((dry)); then
    export TRITON_INTERPRET=1 OMP_NUM_THREADS=1
    step environment 60 "$python" -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
    step kernel_tests 300 "$python" -m pytest -q -x -p no:cacheprovider tests/attention/test_cab_triton_backend.py -k "route_table or actually_taken"
    step bench 300 "$python" -m hf_icl.cli bench cab --smoke --lengths 64 --sparsities 0.9 "${qk[@]}" --output "$out/cab_bench.md"
    step profile 300 "$python" scripts/profile_cab_gpu.py --dry-run --output "$out/profile.md"
else
    step environment 30 "$python" -c "
import torch, triton, transformers
print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)
p = torch.cuda.get_device_properties(0)
print(p.name, p.multi_processor_count, 'SMs', round(p.total_memory / 2**30), 'GiB')"
    per_test=()
    if "$python" -c "import pytest_timeout" 2>/dev/null; then
        per_test=(--timeout 140)
    fi
    # one thread per worker: 14 workers of 16 threads each starve the CPU references (seen on an H100 machine)
    step kernel_tests 150 env OMP_NUM_THREADS=1 "$python" -m pytest -v -n 14 -p no:cacheprovider --durations 20 "${per_test[@]}" "${tests[@]}"
    step bench 150 "$python" -m hf_icl.cli bench cab --device cuda --lengths 8192 32768 --shapes 1,12,64 \
        --sparsities 0.9 0.95 --pairs-lengths 8192 16384 32768 --pairs-sparsities 0.9 0.95 "${qk[@]}" \
        --model-lengths 8192 32768 --cache-lengths 16384 --model-layers 12 --no-flex \
        --repeats 10 --warmup 3 --output "$out/cab_bench.md"
    step profile 140 "$python" scripts/profile_cab_gpu.py --output "$out/profile.md"
fi
if ((${#failed[@]})); then
    echo "failed steps: ${failed[*]}"
    exit 1
fi
echo "all steps passed"
