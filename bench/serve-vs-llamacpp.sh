#!/usr/bin/env bash
# bench/serve-vs-llamacpp.sh [MODEL.gguf] — `kvseal serve` against the
# anchor's `llama-server` on the same file and threads, as users would load
# them (issue 42 s5): at each concurrency C of CONC (default "1 4 16 64"),
# C streaming clients send REQS(C) completions (default max(8, 2C); REQS=N
# fixes it) with prompt and answer lengths drawn from log-normal spreads
# (bench/serve-load.mjs: prompts median PMED 300 tokens in [50, PMAX 2000],
# answers median AMED 100 in [16, 512], forced to their length). Both
# servers run side by side, each sized for the largest C: llama-server with
# -np C parallel slots of SLOT_CTX (PMAX + 512 + 64) tokens each and
# continuous batching, kvseal with --max-running C and the same KV tokens in
# all (--kv-pages). Every round (ROUNDS, default 2) runs each level on
# kvseal then llama.cpp with the same requests (a new seed each round, so
# no prompt is cached from a round before). Reports per engine the medians
# over rounds of output tokens/s, TTFT p50/p99 and time per output token
# p50/p99, the throughput ratio, and kvseal's TTFT p99/p50, also per
# prompt token (the prompts' own spread sets TTFT's: serve-load.mjs).
# Without MODEL it uses the 1.1B-shape Q4_0 file vs-llamacpp.sh makes.
# Environment: A, THREADS (2), ROUNDS (2), CONC, REQS, PMED, PMAX, AMED,
# MODELS. A benchmark, not a test; it skips where the anchor or node is absent.
set -euo pipefail
NAME=serve-vs-llamacpp
. "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-2}
CONC=${CONC:-"1 4 16 64"}
export PMED=${PMED:-300} PMAX=${PMAX:-2000} AMED=${AMED:-100}
command -v node >/dev/null || { echo "$NAME: SKIPPED: node is absent" >&2; exit 0; }
m=${1:-}
if [ -z "$m" ]; then
    [ -f "$VOCAB" ] || { echo "$NAME: SKIPPED: no vocabulary at $VOCAB" >&2; exit 0; }
    mkdir -p "$MODELS"
    m=$MODELS/tinyllama-1.1b-Q4_0.gguf
    f16=$MODELS/tinyllama-1.1b-f16.gguf
    [ -f "$m" ] || [ -f "$f16" ] || "$KS" mkmodel -o "$f16" --vocab "$VOCAB" --shape 1.1b \
        --type f16 --name tinyllama-shape -t "$THREADS" >/dev/null
    [ -f "$m" ] || "$A/llama-quantize" "$f16" "$m" Q4_0 "$THREADS" >/dev/null 2>&1
fi
cmax=1
for c in $CONC; do [ "$c" -le "$cmax" ] || cmax=$c; done
SLOT_CTX=${SLOT_CTX:-$((PMAX + 512 + 64))}
TOTAL=$((SLOT_CTX * cmax))
PAGE=16

TMP=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT
port_free() {
    local p
    for _ in $(seq 50); do
        p=$((20000 + RANDOM % 20000))
        (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null || { echo $p; return; }
    done
    echo 0
}
wait_health() { # url pid
    for _ in $(seq 900); do
        curl -sf "$1/health" >/dev/null 2>&1 && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.2
    done
    return 1
}
pk=$(port_free)
"$KS" serve -m "$m" --port "$pk" --threads "$THREADS" --alias bench --ctx "$SLOT_CTX" \
    --kv-pages $(((TOTAL + PAGE - 1) / PAGE)) --page-tokens $PAGE --max-running "$cmax" \
    >"$TMP/ks.log" 2>&1 &
kpid=$!
pl=$(port_free)
"$A/llama-server" -m "$m" -t "$THREADS" --port "$pl" -np "$cmax" -c "$TOTAL" -cb \
    --alias bench >"$TMP/ls.log" 2>&1 &
lpid=$!
if ! wait_health "http://127.0.0.1:$pk" $kpid || ! wait_health "http://127.0.0.1:$pl" $lpid; then
    echo "$NAME: a server did not come up"; tail -5 "$TMP/ks.log" "$TMP/ls.log"; exit 1
fi
echo "== $(basename "$m") ($THREADS threads, $ROUNDS rounds, slots of $SLOT_CTX tokens, levels $CONC)"
: >"$TMP/rows"
for r in $(seq "$ROUNDS"); do
    for c in $CONC; do
        n=${REQS:-$((2 * c > 8 ? 2 * c : 8))}
        seed=$((r * 1000 + c))
        for eng in kvseal llama.cpp; do
            url=http://127.0.0.1:$pk
            [ $eng = kvseal ] || url=http://127.0.0.1:$pl
            j=$(node bench/serve-load.mjs "$url" bench "$c" "$n" "$seed")
            echo "round $r c=$c $eng $j"
            echo "$eng $c $j" >>"$TMP/rows"
        done
    done
done
# the median over rounds of field f for engine e at concurrency c
med() { grep "^$1 $2 " "$TMP/rows" | sed "s/.*\"$3\":\([0-9.e+-]*\).*/\1/" | median; }
echo
echo "== medians over $ROUNDS rounds (tokens/s; ms)"
printf '%-4s %-9s %9s %9s %9s %9s %9s %8s\n' C engine "out tok/s" "TTFT p50" "TTFT p99" \
    "TPOT p50" "TPOT p99" "tok/s x"
for c in $CONC; do
    for eng in kvseal llama.cpp; do
        ratio=-
        [ $eng = kvseal ] && ratio=$(awk -v a="$(med kvseal "$c" out_tok_s)" \
            -v b="$(med llama.cpp "$c" out_tok_s)" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
        printf '%-4s %-9s %9.1f %9.0f %9.0f %9.1f %9.1f %8s\n' "$c" $eng "$(med $eng "$c" out_tok_s)" \
            "$(med $eng "$c" ttft_p50)" "$(med $eng "$c" ttft_p99)" "$(med $eng "$c" tpot_p50)" \
            "$(med $eng "$c" tpot_p99)" "$ratio"
    done
    awk -v a="$(med kvseal "$c" ttft_p99)" -v b="$(med kvseal "$c" ttft_p50)" \
        -v na="$(med kvseal "$c" ttft_n_p99)" -v nb="$(med kvseal "$c" ttft_n_p50)" \
        -v pa="$(med kvseal "$c" plen_p99)" -v pb="$(med kvseal "$c" plen_p50)" \
        'BEGIN { if (b > 0) printf "     kvseal TTFT p99 / p50: %.2f; per prompt token: %.2f (the prompts: %.2f)\n", a / b, (nb > 0 ? na / nb : 0), (pb > 0 ? pa / pb : 0) }'
done
