#!/usr/bin/env bash
# Table rows on a lent GPU machine's CPU cores (issue 52 item 4): one `archspec table` worker per core on a
# journal storage, for SECONDS, then the rows exported under $OUT for `archspec table SPACE --import` here.
# The GPU stays idle on purpose: the table's protocol trains on one CPU thread, and rows trained elsewhere would
# not be rows of the same protocol.  A worker still training at the deadline loses that pair (the storage it ran
# on stays behind); every row that comes back is a complete pair, its machine and torch version in the row.
#
# Usage, from the repository root (device `run`, carry [".whl", ".fm", ".devrun"]):
#   bash research/device_table.sh SPACE SECONDS [archspec table options, e.g. --designs 24 --seeds 0 1 2 3 4 5]
# Needs, prepared here: .whl/ (optuna, pydantic and their needs as cp312 wheels: the machine has neither),
# .fm/ (Debian's Fashion-MNIST .gz files: the machine has no apt), .devrun/commit (`git rev-parse --short HEAD`:
# the copy that travels has no .git).  Writes $OUT/SPACE.jsonl, its .meta.json and $OUT/workers.log.
set -u
space=$1 secs=$2
shift 2
out=${OUT:?OUT is the folder that comes back}
if [ -z "${SKIP_WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 ARCHSPEC_COMMIT="$(cat .devrun/commit 2>/dev/null || echo unknown)"
if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    mkdir -p /usr/share/datasets/fashion-mnist && cp .fm/*.gz /usr/share/datasets/fashion-mnist/ || exit 1
fi
storage=journal:${TABLE_JOURNAL:-/tmp/$space.journal}
python3 -m archspec table "$space" --import "archspec/search/tables/$space.jsonl" --storage "$storage" || exit 1
workers=${WORKERS:-$(nproc --all)}  # --all: nproc obeys the OMP_NUM_THREADS=1 above
for i in $(seq "$workers"); do
    timeout "$secs" python3 -m archspec table "$space" --storage "$storage" "$@" > "/tmp/worker$i.log" 2>&1 &
done
wait
for i in $(seq "$workers"); do echo "== worker $i"; tail -n 5 "/tmp/worker$i.log"; done > "$out/workers.log"
python3 -m archspec table "$space" --storage "$storage" --export "$out/$space.jsonl"
python3 -m archspec table "$space" --storage "$storage" --report | tee "$out/report.txt"
