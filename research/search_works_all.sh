#!/bin/bash
# Every figure of research/search-works-notebook.md that comes from the table, in one run (issue 32), once the table is
# complete: the seed check, the fidelity table, the search simulations (all methods, the proxy at 120 and 200
# steps, and at equal simulated CPU), the headroom per proxy, and the anytime plot.  One torch thread per
# process; about 45 minutes on one core (150 designs).  Results under OUT (default /tmp/search-works), one file per figure:
#
#   bash research/search_works_all.sh                    # the shipped table
#   TABLE=/tmp/sim/levit_small.jsonl bash research/search_works_all.sh   # a merged copy (its sidecars beside it)
#
# Each simulation reads a snapshot of TABLE (bench/search_works.py snapshot_table), so a tabulation may go on
# merging into it; the figures are then those of the rows at each step's start.  JOBS=2 runs the two long
# simulations side by side (one core each: about 30 minutes on 2 idle cores).
set -euo pipefail
OUT=${OUT:-/tmp/search-works}
TABLE=${TABLE:-archspec/search/tables/levit_small.jsonl}
REPEATS=${REPEATS:-20}
JOBS=${JOBS:-1}
export OMP_NUM_THREADS=1 PYTHONPATH=${PYTHONPATH:-$PWD}
mkdir -p "$OUT"
git rev-parse --short HEAD > "$OUT/commit.txt" 2>/dev/null || true
works() { python bench/search_works.py "$@"; }
simulate() {  # simulate NAME ARGS...: OUT/NAME.json and OUT/NAME.txt
    local name=$1; shift
    works simulate --table "$TABLE" --repeats "$REPEATS" --json "$OUT/$name.json" "$@" > "$OUT/$name.txt"
    cat "$OUT/$name.txt"
}

python bench/space_table.py --table "$TABLE" --report | tee "$OUT/seed_report.json"
works fidelity --table "$TABLE" --json "$OUT/fidelity.json" | tee "$OUT/fidelity.txt"
for score in accuracy tse; do
    for steps in 120 200; do
        works headroom --table "$TABLE" --score "$score" --steps "$steps" --trials 12 20 40 \
            --json "$OUT/headroom_${score}_$steps.json" | tee "$OUT/headroom_${score}_$steps.txt"
    done
done
# the defaults' comparison at 20 trained candidates (research/search-works-notebook.md, "The defaults"): 200 steps (the plot)
# and 120.  GP is left out: a run with every method spent its last 30+ minutes in Optuna's GPSampler, unfinished
# (`--methods "GP, TSE proxy"` runs it).
AT_200=("random sampling" "random sampling, TSE proxy" "TPE, TSE proxy" "TPE, 10 start-up, TSE proxy"
        "NSGA-II, TSE proxy" "TPE, SynFlow rung")
AT_120=("random sampling" "random sampling, TSE proxy" "TPE, TSE proxy" "TPE, 10 start-up, TSE proxy")
if [ "$JOBS" -gt 1 ]; then
    simulate simulate_200 --trials 20 --steps 200 --plot "$OUT/search-works-hv.png" --methods "${AT_200[@]}" & first=$!
    simulate simulate_120 --trials 20 --steps 120 --methods "${AT_120[@]}"
    wait "$first"  # set -e: a failed background simulation fails the script here
else
    simulate simulate_200 --trials 20 --steps 200 --plot "$OUT/search-works-hv.png" --methods "${AT_200[@]}"
    simulate simulate_120 --trials 20 --steps 120 --methods "${AT_120[@]}"
fi
# equal simulated CPU: 12 candidates of 200 steps against the 20 of 120 above
simulate simulate_200x12 --trials 12 --steps 200 --methods "random sampling, TSE proxy" "TPE, TSE proxy"
