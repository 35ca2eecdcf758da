#!/usr/bin/env bash
# bench/serve.sh [MODEL] — the serving benchmark (bench_serve) at 1, 4 and 16
# concurrent clients, on the normal build and on a build with the per-page
# safeguards (tag checks + scrub on free) switched off, alternated A/B/A/B so
# the machine's drift hits both; then the instruction count of one fixed
# workload under callgrind for each, and their ratio. That workload has one
# client: with several, how requests meet in batches depends on thread
# timing, and the total moved by 4% between two runs of the same binary
# (callgrind serializes the threads), twenty times the safeguards' share.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/kjv-mini.gguf}
cmake -S . -B build -DKS_WERROR=ON >/dev/null && cmake --build build --target bench_serve -j2 >/dev/null
cmake -S . -B build-nochecks -DKS_BROKEN=no_checks >/dev/null && cmake --build build-nochecks --target bench_serve -j2 >/dev/null
for round in 1 2; do
    for b in build build-nochecks; do
        echo "== $b (round $round)"
        ./$b/bench_serve -m "$MODEL" -c 1,4,16 -r 3 -n 64 2>/dev/null
    done
done
if command -v valgrind >/dev/null; then
    for b in build build-nochecks; do
        valgrind --tool=callgrind --callgrind-out-file=/tmp/ks_cg.$$ ./$b/bench_serve -m "$MODEL" -c 1 -r 1 -n 32 -t 1 \
            >/dev/null 2>/tmp/ks_cg_err.$$
        ir=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' /tmp/ks_cg_err.$$)
        echo "$b: $ir instructions"
        eval "ir_${b//-/_}=$ir"
    done
    rm -f /tmp/ks_cg.$$ /tmp/ks_cg_err.$$
    awk -v on="$ir_build" -v off="$ir_build_nochecks" \
        'BEGIN { printf "safeguard cost (instructions, on/off): %.4f (%+.2f%%)\n", on/off, (on/off-1)*100 }'
fi
