#!/bin/bash
# Every figure of docs/search-works.md that comes from the table, in one run (issue 32), once the table is
# complete: the seed check, the fidelity table, the search simulations (all methods, the proxy at 120 and 200
# steps, and at equal simulated CPU), the headroom per proxy, and the anytime plot.  One torch thread per
# process; about 1.5 hours on one core.  Results under OUT (default /tmp/search-works), one file per figure:
#
#   bash bench/search_works_all.sh                    # the shipped table
#   TABLE=/tmp/sim/levit_small.jsonl bash bench/search_works_all.sh   # a merged copy (its sidecars beside it)
#
# The tabulation may not write into TABLE while this runs: the simulations read it more than once.
set -euo pipefail
OUT=${OUT:-/tmp/search-works}
TABLE=${TABLE:-archspec/search/tables/levit_small.jsonl}
REPEATS=${REPEATS:-20}
export OMP_NUM_THREADS=1 PYTHONPATH=${PYTHONPATH:-$PWD}
mkdir -p "$OUT"
git rev-parse --short HEAD > "$OUT/commit.txt" 2>/dev/null || true
works() { python bench/search_works.py "$@"; }

python bench/space_table.py --out "$TABLE" --report | tee "$OUT/seed_report.json"
works fidelity --table "$TABLE" --json "$OUT/fidelity.json" | tee "$OUT/fidelity.txt"
for score in accuracy tse; do
    for steps in 120 200; do
        works headroom --table "$TABLE" --score "$score" --steps "$steps" --trials 12 20 40 \
            --json "$OUT/headroom_${score}_$steps.json" | tee "$OUT/headroom_${score}_$steps.txt"
    done
done
# every method at 20 trained candidates, the proxy at 200 steps (the plot) and at 120
works simulate --table "$TABLE" --repeats "$REPEATS" --trials 20 --steps 200 --json "$OUT/simulate_200.json" \
    --plot "$OUT/search-works-hv.png" | tee "$OUT/simulate_200.txt"
works simulate --table "$TABLE" --repeats "$REPEATS" --trials 20 --steps 120 --json "$OUT/simulate_120.json" \
    | tee "$OUT/simulate_120.txt"
# equal simulated CPU: 12 candidates of 200 steps against the 20 of 120 above
works simulate --table "$TABLE" --repeats "$REPEATS" --trials 12 --steps 200 --json "$OUT/simulate_200x12.json" \
    --methods "random sampling, TSE proxy" "TPE, TSE proxy" | tee "$OUT/simulate_200x12.txt"
