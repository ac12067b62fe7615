#!/usr/bin/env bash
# How long CI takes (issue 53): `.ci/run` -- a fresh venv, the README's install and main job, the README's test
# command -- on a clean clone of this checkout's HEAD, RUNS times one after another, each timed from the clone to
# the last test.  It prints the load average before each run (the README's figure is for idle cores: stop other
# work first) and pytest's own summary line, and leaves each run's log in its scratch folder; the clone itself
# (about 6 GB with its venv) is removed after each run.  Each run gets an empty Inductor cache of its own
# (TORCHINDUCTOR_CACHE_DIR in the scratch folder), as on a fresh machine: with the shared /tmp/torchinductor_$USER
# of earlier runs, the compile tests read kernels compiled before (figures before 2026-11-28 08:00 did).
#
#   bash bench/ci_time.sh [RUNS]      # default 2
set -uo pipefail
runs=${1:-2}
repo=$(git rev-parse --show-toplevel)
for i in $(seq "$runs"); do
    dir=$(mktemp -d /tmp/ci_time.XXXXXX)
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    start=$(date +%s)
    git clone -q "$repo" "$dir/archspec"
    (cd "$dir/archspec" && TORCHINDUCTOR_CACHE_DIR="$dir/inductor" .ci/run) > "$dir/ci.log" 2>&1
    rc=$?
    took=$(( $(date +%s) - start ))
    summary=$(grep -E "[0-9]+ (passed|failed)" "$dir/ci.log" | tail -n 1)
    rm -rf "$dir/archspec" "$dir/inductor"
    echo "run $i: exit $rc, ${took} s from clone to last test (load average before: $load); pytest: $summary; log: $dir/ci.log"
done
