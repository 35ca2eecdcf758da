#!/usr/bin/env bash
# CTest's fuzz_<target>: replays every input of tests/fuzz/regressions/<target>
# (each once: a fixed crash must stay fixed), then fuzzes for
# KS_FUZZ_SECONDS (default 5) from the seed corpus into a scratch directory.
# The harness comes from the clang sub-build of this tree (KS_FUZZ_DIR, set by
# CMakeLists.txt); without one the test is skipped (77) and says why.
# Long runs: `make fuzz FUZZ_SECONDS=600` (scripts/fuzz.sh).
set -uo pipefail
t="${1:?usage: smoke.sh TARGET}"
src="${KS_SRC:?KS_SRC}"
bin="${KS_FUZZ_DIR:-}/fuzz_$t"
if [ -z "${KS_FUZZ_DIR:-}" ] || [ ! -x "$bin" ]; then
  echo "SKIP: no fuzz harness for $t: ${KS_FUZZ_WHY:-the clang sub-build is missing}"
  exit 77
fi
secs="${KS_FUZZ_SECONDS:-5}"
regs=()
if [ -d "$src/tests/fuzz/regressions/$t" ]; then
  while IFS= read -r -d '' f; do regs+=("$f"); done < \
    <(find "$src/tests/fuzz/regressions/$t" -type f ! -name '*.md' -print0 | sort -z)
fi
if [ ${#regs[@]} -gt 0 ]; then
  echo "== replaying ${#regs[@]} regression input(s)"
  out="$("$bin" -timeout=10 "${regs[@]}" 2>&1)"
  rc=$?
  grep -vE '^(INFO|\*\*\*|Running|Executed)|Running [0-9]+ inputs' <<<"$out"
  [ $rc -eq 0 ] || { echo "FAIL: a regression input crashes fuzz_$t (rc $rc)"; exit 1; }
fi
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
args=(-max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=4096
      -artifact_prefix="$scratch/")
[ -f "$src/tests/fuzz/$t.dict" ] && args+=(-dict="$src/tests/fuzz/$t.dict")
echo "== fuzzing $t for ${secs}s"
"$bin" "${args[@]}" "$scratch" "$src/tests/fuzz/corpus/$t" >"$scratch/log" 2>&1
rc=$?
grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::number_of_executed_units' "$scratch/log"
if [ $rc -ne 0 ]; then
  cat "$scratch/log" | tail -60
  for f in "$scratch"/crash-* "$scratch"/leak-* "$scratch"/timeout-* "$scratch"/oom-*; do
    [ -f "$f" ] && echo "crashing input (base64): $(base64 -w0 "$f")"
  done
  echo "FAIL: fuzz_$t found a crash (rc $rc); add the input to tests/fuzz/regressions/$t/"
  exit 1
fi
