#!/bin/bash
# The GPU figures of docs/benchmarks.md ("Training throughput") and docs/search.md ("Is the placement worth it?")
# in one call of a lent GPU machine (16 cores, one H100), results under $OUT:
#
#   bash bench/gpu_session.sh                         # OUT defaults to /tmp/archspec-gpu
#   PARTS=throughput bash bench/gpu_session.sh        # only part 1 (PARTS: throughput, masks, profile, pin)
#
# The machine has torch, timm and scikit-learn but no pydantic or Optuna: where a folder .whl holds wheels
# (pip download ... pydantic pydantic-core annotated-types typing-inspection typing-extensions timm), they are
# installed into /tmp/site first.  The mask comparison needs a best.yaml of the default `archspec search masks
# mait_tiny_sch1` run (CPU) in masks/ (FOUND=path to override).
set -u
OUT=${OUT:-/tmp/archspec-gpu}
FOUND=${FOUND:-masks/best.yaml}
PARTS=${PARTS:-throughput masks}
mkdir -p "$OUT"
WHEELS=${WHEELS:-.whl}
if [ -d "$WHEELS" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc
  python3 -c "import torch, timm; print('torch', torch.__version__, 'timm', timm.__version__)"
  git rev-parse --short HEAD 2>/dev/null; } | tee "$OUT/machine.txt"

# 1. archspec train vs timm's train_one_epoch on CUDA (bf16), batch 256 and 64, 12 loader workers
if [[ " $PARTS " == *" throughput "* ]]; then
    for batch in 256 64; do
        timeout 150 python3 bench/train_throughput.py --device cuda --batch "$batch" --workers 12 --threads 4 \
            --steps 30 --repeats "${TP_REPEATS:-3}" --out "$OUT/train_throughput_cuda_b$batch" 2>&1 | grep -v Warning | tail -9
    done
fi

# 1b. (PARTS=profile) where batch 256's gap sits: both loops under torch.profiler, 2 repeats (issue 38)
if [[ " $PARTS " == *" profile "* ]]; then
    timeout 240 python3 bench/train_throughput.py --device cuda --batch 256 --workers 12 --threads 4 --steps 30 \
        --repeats 2 --profile --out "$OUT/train_throughput_cuda_b256_profile" 2>&1 | grep -v Warning | tail -9
fi

# 1c. (PARTS=pin) issue 38's first suspect at batch 256: archspec without its pin-memory thread (timm's train.py
#     does not pin by default), 2 repeats each way, in one call
if [[ " $PARTS " == *" pin "* ]]; then
    for pin in "" "--archspec-no-pin"; do
        timeout 150 python3 bench/train_throughput.py --device cuda --batch 256 --workers 12 --threads 4 --steps 30 \
            --repeats 2 $pin --out "$OUT/train_throughput_cuda_b256${pin:+_nopin}" 2>&1 | grep -v Warning | tail -7
    done
fi

# 2. MaiT-T mask placements (found by the CPU default run, Sch.1, Sch.2, none, all), MASK_SEEDS seeds each, at
#    MASK_STEPS proxy steps (the search's proxy otherwise: digits, lr 1e-3, batch 32).  One MaiT-T proxy is
#    launch-bound on a large GPU, so every placement x seed trains in its own process, side by side (one CPU
#    thread each), and the parts are merged.  MASK_TIMEOUT caps each process (default: what is left of 570 s).
if [[ " $PARTS " == *" masks "* ]]; then
    MASK_STEPS=${MASK_STEPS:-1500}
    MASK_SEEDS=${MASK_SEEDS:-0 1 2}
    mkdir -p "$OUT/masks"
    for p in found sch1 sch2 none all; do
        for s in $MASK_SEEDS; do
            OMP_NUM_THREADS=1 timeout "${MASK_TIMEOUT:-$((570 - SECONDS))}" python3 bench/mask_compare.py --device "${MASK_DEVICE:-cuda}" \
                --found "$FOUND" --only "$p" --seeds "$s" --steps "$MASK_STEPS" ${MASK_ARGS:-} \
                --out "$OUT/masks/part_${p}_$s.json" > "$OUT/masks/log_${p}_$s.txt" 2>&1 &
        done
    done
    wait
    grep -h ": acc" "$OUT"/masks/log_*.txt
    python3 bench/mask_compare.py --merge "$OUT"/masks/part_*.json --out "$OUT/mask_compare_cuda.json"
fi
