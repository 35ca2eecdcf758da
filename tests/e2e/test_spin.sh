#!/usr/bin/env bash
# test_spin.sh — model-checks the prefill/decode protocol (docs/pd-protocol.md)
# with spin: pd/model/pd.pml (the transfer protocol) and pd/model/handshake.pml
# (authentication and link set-up against a relaying/replaying intruder) must
# each verify EXHAUSTIVELY with 0 errors (safety assertions + invalid end
# states), and every mutant compiled from the same file with -DMUTANT_<NAME>
# (one protocol rule removed each) must make spin report a violation — among
# them the KVPD v1 handshake, whose relay spin must find. Mutant names are read from the model's #ifdef guards,
# so a mutant added to the model is checked without touching this script.
# Skips (77) when spin or a C compiler is missing.
. "$(dirname "$0")/lib.sh"

command -v spin >/dev/null 2>&1 || skip "spin not installed (scripts/install-deps.sh installs it)"
CC=${CC:-cc}
command -v "$CC" >/dev/null 2>&1 || CC=gcc
command -v "$CC" >/dev/null 2>&1 || skip "no C compiler for spin's pan.c"


# Exhaustive safety search: SAFETY (no cycle detection needed for safety
# properties), COLLAPSE (lossless state compression; no bitstate, no hash
# compaction), a DFS stack deep enough that the search is never truncated
# (checked below). Mutants fail within a few hundred states: pan is built
# without optimisation for them (faster to compile).
PAN_DEFS="-w -DSAFETY -DNOFAIR -DCOLLAPSE -DMEMLIM=4096"
PAN_ARGS="-m20000 -w24"

# verify NAME OPT [SPIN_DEFINE] — builds pan with -OPT and runs it in
# $TMPD/NAME; leaves the output in $TMPD/NAME/out.
verify() {
    local name=$1 opt=$2 def=${3:-} d=$TMPD/$1
    mkdir -p "$d"
    cp "$MODEL" "$d/model.pml"
    (cd "$d" && spin -a $def model.pml >spin.log 2>&1) || { cat "$d/spin.log" >&2; fail "$name: spin -a failed"; }
    (cd "$d" && $CC -$opt $PAN_DEFS -o pan pan.c >cc.log 2>&1) || { cat "$d/cc.log" >&2; fail "$name: compiling pan.c failed"; }
    (cd "$d" && ./pan $PAN_ARGS >out 2>&1)
    true
}

# field OUTFILE REGEX — first line matching REGEX, trimmed
field() { grep -m1 -E "$2" "$1" | sed 's/^[[:space:]]*//'; }

# check_model FILE REQUIRED_MUTANTS... — the model clean, every mutant caught
n=0
check_model() {
    MODEL=$KS_SRC/pd/model/$1; shift
    required="$*"
    base=$(basename "$MODEL" .pml)
    [ -f "$MODEL" ] || fail "model missing: $MODEL"
    # --- the model: 0 errors, complete search
    t0=$(date +%s)
    verify "$base" O2
    out=$TMPD/$base/out
    grep -q "errors: 0" "$out" || { cat "$out" >&2; fail "$base: spin found a violation (trail in pan output above)"; }
    grep -q "Full statespace search" "$out" || { cat "$out" >&2; fail "$base: not a full state-space search"; }
    if grep -qE "Search not completed|max search depth too small|out of memory" "$out"; then
        cat "$out" >&2; fail "$base: search incomplete (depth or memory)"
    fi
    t1=$(date +%s)
    echo "$base: errors 0, $(field "$out" 'states, stored'), $(field "$out" 'states, matched'), $(field "$out" 'depth reached' | sed 's/, errors.*//'), $(field "$out" 'total actual memory'), $((t1 - t0)) s (exhaustive, spin $(spin -V | sed -n 's/^Spin Version \([^ ]*\).*/\1/p'))"

    # --- the mutants: each must fail
    mutants=$(grep -oE '^#[[:space:]]*if(n)?def[[:space:]]+MUTANT_[A-Z0-9_]+' "$MODEL" |
              sed -E 's/.*(MUTANT_[A-Z0-9_]+)/\1/' | sort -u)
    for need in $required; do
        case " $(echo $mutants) " in *" $need "*) ;; *) fail "model lacks required mutant $need";; esac
    done
    for m in $mutants; do
        t0=$(date +%s)
        verify "$base.$m" O0 "-D$m"
        out=$TMPD/$base.$m/out
        grep -qE "errors: [1-9]" "$out" || { cat "$out" >&2; fail "$m: spin found no violation — the check for this rule is missing"; }
        what=$(grep -m1 -E "^pan:[0-9]+: " "$out" | sed -E 's/^pan:[0-9]+: //')
        t1=$(date +%s)
        echo "$base $m: caught — $what, $((t1 - t0)) s"
        n=$((n + 1))
    done
}
check_model pd.pml MUTANT_PLACEHOLDER MUTANT_FREE_BEFORE_ACK MUTANT_NO_COVERAGE MUTANT_NO_SCRUB \
    MUTANT_FINISH_NO_REASON MUTANT_NO_MODEL_CHECK MUTANT_REVOKE_AFTER_FREE MUTANT_NO_STATE_CHECK
# pd.pml checks a hybrid model's grant (a prompt page and a state page) by
# default; a plain model's (two prompt pages) must verify as well
t0=$(date +%s)
verify pd.plain O2 -DPLAIN_KV
out=$TMPD/pd.plain/out
grep -q "errors: 0" "$out" && grep -q "Full statespace search" "$out" ||
    { cat "$out" >&2; fail "pd.pml -DPLAIN_KV: not verified"; }
echo "pd.pml -DPLAIN_KV: errors 0, $(field "$out" 'states, stored'), $(($(date +%s) - t0)) s"
check_model handshake.pml MUTANT_V1_HANDSHAKE MUTANT_NO_KIND_BINDING MUTANT_LINK_REPLACE
echo "spin: models verified, $n/$n mutants caught"
