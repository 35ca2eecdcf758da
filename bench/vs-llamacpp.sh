#!/usr/bin/env bash
# bench/vs-llamacpp.sh [MODEL.gguf...] — kvseal against llama.cpp on the
# same file and the same threads, alternated in one run (issue 9).
#
# For each model, ROUNDS rounds (default 3) each run kvseal then llama.cpp:
#   pp512, tg128        kvseal bench          vs llama-bench
#   decode at 1/4/16    kvseal bench --streams vs llama-batched-bench
#                       (prompt 128, 64 steps; aggregate decode tokens/s)
# then TTFT of a ~1000-token prompt through `kvseal serve` vs llama-server
# (bench/ttft.mjs, A/B alternated, REPEAT times). kvseal's tg over the
# memory-read roofline comes twice: against probe passes interleaved with
# generation (roofline) and against the best pass before it (roofline-peak).
# It prints each figure's
# median per engine and the median of the per-round ratios kvseal/llama.cpp
# (for TTFT, llama.cpp's time over kvseal's: > 1 means kvseal answers first).
#
# Without MODEL arguments it makes the TinyLlama-shape models (kvseal mkmodel
# --shape 1.1b, F16, the llama-spm vocabulary) and quantizes them with the
# anchor's llama-quantize to Q8_0, Q4_0 and Q4_K_M, so both engines read the
# same bytes; they are cached in $MODELS (default build/bench-models).
# Long context (issue 42): on a 32k-context 1.1B Q4_0 file (mkmodel --ctx
# 32768, cached in $MODELS), for each depth D in DEPTHS (default 8192; add
# 32768 for 32k, minutes per round on 2 threads), LONG_ROUNDS rounds
# (default 2) alternate kvseal bench --streams 1 -p D -n 32 with
# llama-batched-bench -npp D -ntg 32 -npl 1: prefill of D tokens (pp-D) and
# decode at depth D (tg32-dD); depth 0 is pp512/tg128 above. LONG=0 skips it.
# Environment: A (anchor folder), THREADS (2), ROUNDS (3), REPEAT (5),
# TTFT=0 to skip the server comparison. A benchmark, not a test.
set -euo pipefail
NAME=vs-llamacpp
. "$(dirname "$0")/lib.sh"

models=("$@")
if [ ${#models[@]} -eq 0 ]; then
    [ -f "$VOCAB" ] || { echo "vs-llamacpp: SKIPPED: no vocabulary at $VOCAB" >&2; exit 0; }
    mkdir -p "$MODELS"
    f16=$MODELS/tinyllama-1.1b-f16.gguf
    [ -f "$f16" ] || "$KS" mkmodel -o "$f16" --vocab "$VOCAB" --shape 1.1b --type f16 \
        --name tinyllama-shape -t "$THREADS" >/dev/null
    for q in Q8_0 Q4_0 Q4_K_M; do
        out=$MODELS/tinyllama-1.1b-$q.gguf
        [ -f "$out" ] || "$A/llama-quantize" "$f16" "$out" "$q" "$THREADS" >/dev/null 2>&1
        models+=("$out")
    done
fi

TMP=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT

port_free() { # an unused loopback port
    local p
    for _ in $(seq 50); do
        p=$((20000 + RANDOM % 20000))
        (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null || { echo $p; return; }
    done
    echo 0
}
wait_health() { # url pid
    for _ in $(seq 600); do
        curl -sf "$1/health" >/dev/null 2>&1 && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.2
    done
    return 1
}

summary=()
for m in "${models[@]}"; do
    name=$(basename "$m" .gguf)
    echo "== $name ($THREADS threads, $ROUNDS rounds)"
    : >"$TMP/rows"
    for r in $(seq "$ROUNDS"); do
        "$KS" bench -m "$m" -p 512 -n 128 -t "$THREADS" -r 1 2>/dev/null >"$TMP/ks"
        "$A/llama-bench" -m "$m" -t "$THREADS" -p 512 -n 128 -r 1 -o csv 2>/dev/null >"$TMP/lb"
        "$KS" bench -m "$m" --streams 1,4,16 -p 128 -n 64 -t "$THREADS" 2>/dev/null >"$TMP/kss"
        "$A/llama-batched-bench" -m "$m" -t "$THREADS" -c 4096 -b 2048 -ub 512 -npp 128 -ntg 64 \
            -npl 1,4,16 2>/dev/null >"$TMP/lbb"
        ks_pp=$(awk '/^pp512:/ { print $2 }' "$TMP/ks")
        ks_tg=$(awk '/^tg128:/ { print $2 }' "$TMP/ks")
        roof=$(awk '/^tg \/ roofline:/ { print $4 }' "$TMP/ks")
        roofp=$(awk '/^tg \/ best-pass roofline:/ { print $5 }' "$TMP/ks")
        lb_pp=$(lb_col "$TMP/lb" 512 0 avg_ts)
        lb_tg=$(lb_col "$TMP/lb" 0 128 avg_ts)
        echo "round $r: pp512 $ks_pp / $lb_pp, tg128 $ks_tg / $lb_tg (kvseal tg at $roof of the roofline, $roofp of the best pass)"
        echo "pp512 $ks_pp $lb_pp" >>"$TMP/rows"
        echo "tg128 $ks_tg $lb_tg" >>"$TMP/rows"
        echo "roofline $roof 1" >>"$TMP/rows"
        echo "roofline-peak $roofp 1" >>"$TMP/rows"
        for n in 1 4 16; do
            ks_s=$(awk -v n="$n" '$1 == "streams" && $2 == n ":" { print $(NF - 2) }' "$TMP/kss")
            # | PP | TG | B | N_KV | T_PP | S_PP | T_TG | S_TG | T | S |
            lb_s=$(awk -F'|' -v n="$n" '$4 + 0 == n && $2 + 0 == 128 { gsub(/ /, "", $9); print $9 }' "$TMP/lbb")
            echo "  decode x$n: $ks_s / $lb_s tokens/s"
            echo "decode-x$n $ks_s $lb_s" >>"$TMP/rows"
        done
    done
    if [ "${TTFT:-1}" != 0 ] && command -v node >/dev/null; then
        pk=$(port_free)
        "$KS" serve -m "$m" --port "$pk" --threads "$THREADS" --alias bench --ctx 2048 \
            --batch-tokens 512 >"$TMP/ks.log" 2>&1 &
        kpid=$!
        pl=$(port_free)
        "$A/llama-server" -m "$m" -t "$THREADS" --port "$pl" -c 2048 >"$TMP/ls.log" 2>&1 &
        lpid=$!
        if wait_health "http://127.0.0.1:$pk" $kpid && wait_health "http://127.0.0.1:$pl" $lpid; then
            KS_MODEL_NAME=bench node bench/ttft.mjs "http://127.0.0.1:$pk" "http://127.0.0.1:$pl" 1000 \
                >"$TMP/ttft" 2>&1 || true
            cat "$TMP/ttft"
            # {"tokens":1000,"prompt_tokens":P,"a_ms":K,"b_ms":L}: speedup L/K
            sed -n 's/.*"a_ms":\([0-9.]*\),"b_ms":\([0-9.]*\).*/ttft-1000 \1 \2/p' "$TMP/ttft" \
                | awk '{ print $1, $3, $2 }' >>"$TMP/rows"
        else
            echo "ttft: a server did not come up (logs: $TMP/ks.log, $TMP/ls.log)"
        fi
        kill $kpid $lpid 2>/dev/null || true
        wait $kpid $lpid 2>/dev/null || true
    fi
    for fig in pp512 tg128 decode-x1 decode-x4 decode-x16 ttft-1000 roofline roofline-peak; do
        grep -q "^$fig " "$TMP/rows" || continue
        k=$(awk -v f=$fig '$1 == f { print $2 }' "$TMP/rows" | median)
        l=$(awk -v f=$fig '$1 == f { print $3 }' "$TMP/rows" | median)
        ratio=$(awk -v f=$fig '$1 == f && $3 > 0 { print $2 / $3 }' "$TMP/rows" | median)
        case $fig in
        roofline) line=$(printf "%-24s %-13s kvseal tg / memory-read roofline: %.3f" "$name" "$fig" "$k") ;;
        roofline-peak) line=$(printf "%-24s %-13s kvseal tg / the best probe pass's roofline: %.3f" "$name" "$fig" "$k") ;;
        ttft-1000) line=$(printf "%-24s %-11s llama-server %8.1f ms  kvseal %8.1f ms  speedup %.2fx" \
            "$name" "$fig" "$k" "$l" "$ratio") ;;
        *) line=$(printf "%-24s %-11s kvseal %8.2f  llama.cpp %8.2f  ratio %.2fx" "$name" "$fig" "$k" "$l" "$ratio") ;;
        esac
        echo "$line"
        summary+=("$line")
    done
done
if [ "${LONG:-1}" != 0 ] && [ -f "$VOCAB" ]; then
    mkdir -p "$MODELS"
    f16l=$MODELS/tinyllama-1.1b-32k-f16.gguf
    ml=$MODELS/tinyllama-1.1b-32k-Q4_0.gguf
    [ -f "$f16l" ] || "$KS" mkmodel -o "$f16l" --vocab "$VOCAB" --shape 1.1b --ctx 32768 --type f16 \
        --name tinyllama-shape -t "$THREADS" >/dev/null
    [ -f "$ml" ] || "$A/llama-quantize" "$f16l" "$ml" Q4_0 "$THREADS" >/dev/null 2>&1
    name=$(basename "$ml" .gguf)
    echo "== $name long context ($THREADS threads, ${LONG_ROUNDS:-2} rounds, depths ${DEPTHS:-8192})"
    : >"$TMP/rows"
    for r in $(seq "${LONG_ROUNDS:-2}"); do
        for d in ${DEPTHS:-8192}; do
            "$KS" bench -m "$ml" --streams 1 -p "$d" -n 32 -t "$THREADS" 2>/dev/null >"$TMP/ksl"
            "$A/llama-batched-bench" -m "$ml" -t "$THREADS" -c $((d + 64)) -b 2048 -ub 512 \
                -npp "$d" -ntg 32 -npl 1 2>/dev/null >"$TMP/lbl"
            # streams 1: pp 1 x D: X tokens/s, tg 1 x 32: Y tokens/s aggregate
            ks_p=$(awk '$1 == "streams" { print $6 }' "$TMP/ksl")
            ks_t=$(awk '$1 == "streams" { print $(NF - 2) }' "$TMP/ksl")
            # | PP | TG | B | N_KV | T_PP | S_PP | T_TG | S_TG | T | S |
            lb_p=$(awk -F'|' -v d="$d" '$2 + 0 == d && $4 + 0 == 1 { gsub(/ /, "", $7); print $7 }' "$TMP/lbl")
            lb_t=$(awk -F'|' -v d="$d" '$2 + 0 == d && $4 + 0 == 1 { gsub(/ /, "", $9); print $9 }' "$TMP/lbl")
            echo "round $r depth $d: prefill $ks_p / $lb_p, decode $ks_t / $lb_t tokens/s"
            echo "pp-$d $ks_p $lb_p" >>"$TMP/rows"
            echo "tg32-d$d $ks_t $lb_t" >>"$TMP/rows"
        done
    done
    for d in ${DEPTHS:-8192}; do
        for fig in "pp-$d" "tg32-d$d"; do
            k=$(awk -v f="$fig" '$1 == f { print $2 }' "$TMP/rows" | median)
            l=$(awk -v f="$fig" '$1 == f { print $3 }' "$TMP/rows" | median)
            ratio=$(awk -v f="$fig" '$1 == f && $3 > 0 { print $2 / $3 }' "$TMP/rows" | median)
            line=$(printf "%-24s %-11s kvseal %8.2f  llama.cpp %8.2f  ratio %.2fx" "$name" "$fig" "$k" "$l" "$ratio")
            echo "$line"
            summary+=("$line")
        done
    done
fi
echo
echo "== summary (medians; ratio = median of per-round kvseal/llama.cpp)"
printf '%s\n' "${summary[@]}"
