#!/usr/bin/env bash
# Runs the libFuzzer harnesses of a KS_FUZZ build (`make fuzz` builds one in
# build-fuzz and calls this) for as long as asked, JOBS at a time, niced.
#
#   scripts/fuzz.sh BUILD_DIR SECONDS JOBS [TARGET...]   (default: every harness)
#
# Each target starts from the seeds in tests/fuzz/corpus/<target> and the
# regression inputs in tests/fuzz/regressions/<target>, and grows its corpus
# in BUILD_DIR/fuzz-corpus/<target> (scratch, kept between runs, never in the
# repo). Crashing inputs land in BUILD_DIR/fuzz-crashes/<target>/, logs in
# BUILD_DIR/fuzz-logs/<target>.log. At the end it prints, per target,
# executions, exec/s, coverage (cov: edges, ft: features) and corpus size, and
# exits 1 if any harness found a crash. A crash becomes a regression: fix the
# parser, then add the input to tests/fuzz/regressions/<target>/.
set -uo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:?usage: fuzz.sh BUILD_DIR SECONDS JOBS [TARGET...]}"
secs="${2:?seconds}"
jobs="${3:-1}"
shift 3 || shift $#
build="$(cd "$build" && pwd)"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$src"/tests/fuzz/fuzz_*.c; do t="$(basename "$f" .c)"; targets+=("${t#fuzz_}"); done
fi
mkdir -p "$build/fuzz-logs"

run_one() {
  local t="$1" bin="$build/fuzz_$1"
  local corpus="$build/fuzz-corpus/$t" crashes="$build/fuzz-crashes/$t"
  mkdir -p "$corpus" "$crashes"
  local args=(-max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=4096
              -artifact_prefix="$crashes/")
  [ -f "$src/tests/fuzz/$t.dict" ] && args+=(-dict="$src/tests/fuzz/$t.dict")
  local dirs=("$corpus" "$src/tests/fuzz/corpus/$t")
  [ -d "$src/tests/fuzz/regressions/$t" ] && dirs+=("$src/tests/fuzz/regressions/$t")
  nice -n 10 "$bin" "${args[@]}" "${dirs[@]}" >"$build/fuzz-logs/$t.log" 2>&1
  echo $? >"$build/fuzz-logs/$t.rc"
}

for t in "${targets[@]}"; do
  [ -x "$build/fuzz_$t" ] || { echo "fuzz.sh: no $build/fuzz_$t (make fuzz builds it)" >&2; exit 2; }
done
echo "fuzz.sh: ${#targets[@]} targets x ${secs}s, $jobs at a time; logs in $build/fuzz-logs"
running=0
for t in "${targets[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
done
wait

status=0
printf '%-10s %12s %9s %7s %7s %8s %9s  %s\n' target execs exec/s cov ft corpus bytes result
for t in "${targets[@]}"; do
  log="$build/fuzz-logs/$t.log"
  last="$(grep -E '^#[0-9]+' "$log" | tail -1)"
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  eps="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
  cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")"
  ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")"
  files="$(find "$build/fuzz-corpus/$t" -type f | wc -l)"
  bytes="$(du -sb "$build/fuzz-corpus/$t" | cut -f1)"
  rc="$(cat "$build/fuzz-logs/$t.rc" 2>/dev/null || echo '?')"
  result=ok
  if [ "$rc" != 0 ]; then
    result="CRASH (rc $rc): $(ls "$build/fuzz-crashes/$t" | head -3 | tr '\n' ' ')"
    status=1
  fi
  printf '%-10s %12s %9s %7s %7s %8s %9s  %s\n' "$t" "${execs:-?}" "${eps:-?}" "${cov:-?}" \
    "${ft:-?}" "$files" "$bytes" "$result"
done
exit $status
