#!/usr/bin/env bash
# stress-test.sh — proves the suite does not flake under load (make
# stress-test): runs the whole CTest suite STRESS_RUNS times in a row (10)
# with `ctest -j4` beside a CPU hog (one busy loop per core), then once more
# under AddressSanitizer + UndefinedBehaviorSanitizer beside the same hog.
# Prints one line per run and a summary; exits 1 if any run failed. Logs of
# failed runs stay in $STRESS_LOG_DIR (default build-stress-logs/).
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${STRESS_RUNS:-10}
JOBS=${STRESS_JOBS:-4}
LOGS=${STRESS_LOG_DIR:-build-stress-logs}
mkdir -p "$LOGS"
make all >/dev/null || { echo "stress-test: build failed" >&2; exit 1; }
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKS_WERROR=ON -DKS_SANITIZE=address,undefined >/dev/null &&
    cmake --build build-asan -j"$(nproc)" >/dev/null || { echo "stress-test: asan build failed" >&2; exit 1; }

hog=()
stop_hog() { [ ${#hog[@]} -eq 0 ] || kill "${hog[@]}" 2>/dev/null; hog=(); }
trap stop_hog EXIT
for _ in $(seq "$(nproc)"); do (while :; do :; done) & hog+=($!); done
echo "stress-test: $RUNS runs of ctest -j$JOBS beside $(nproc) busy loops, then one under ASan+UBSan"

failed=0
run() {  # run NAME DIR [ENV...]
    local name=$1 dir=$2; shift 2
    local t0=$SECONDS log="$LOGS/$name.log"
    if (cd "$dir" && env "$@" ctest --output-on-failure -j"$JOBS") >"$log" 2>&1; then
        printf '%-8s PASS  %4ds  %s\n' "$name" $((SECONDS - t0)) "$(grep -o '[0-9]* tests passed.*' "$log" | head -1)"
        rm -f "$log"
    else
        failed=$((failed + 1))
        printf '%-8s FAIL  %4ds  %s (log: %s)\n' "$name" $((SECONDS - t0)) \
            "$(grep -E '^[[:space:]]*[0-9]+ - ' "$log" | tr -s ' ' | tr '\n' ';')" "$log"
    fi
}
for i in $(seq "$RUNS"); do run "run$i" build; done
run asan build-asan ASAN_OPTIONS=detect_leaks=1
stop_hog
echo "stress-test: $failed of $((RUNS + 1)) runs failed"
[ $failed -eq 0 ]
