#!/usr/bin/env bash
# bench/arch-matrix.sh [ARCH...] — prefill and single-stream decode of each
# architecture at the 1.1B shape (kvseal mkmodel --shape 1.1b --arch ARCH,
# F16, the llama-spm vocabulary, phi3 the phi-3 one, quantized to Q8_0 and
# Q4_K_M by the anchor's llama-quantize, and gpt-oss also to MXFP4_MOE;
# TYPES may name the low-bit types too, the codebook ones quantized with a
# uniform importance matrix, scripts/uniform_imatrix.py),
# kvseal against llama.cpp on the same file and threads, alternated for
# ROUNDS rounds (default 3): pp$PP (default 128; PP=0 leaves it out) and
# tg128 of both (kvseal bench, llama-bench), the medians of the per-round
# ratios, and kvseal's tg as a fraction of the memory-read roofline
# measured in the same process (for a MoE, of the bytes a token reads: the
# used experts, attention, router, shared weights and output). SHAPE picks
# mkmodel's preset (default 1.1b); the MoE rows are
#   SHAPE=moe-3b TYPES="Q8_0 Q4_0 Q4_K_M" PP=512 bench/arch-matrix.sh qwen3moe
# (64 experts of 512, 8 used: 3.1B parameters, 0.5B run per token). The
# models are cached in $MODELS (default build/bench-models). A benchmark,
# not a test; it skips where the anchor or the vocabulary is absent.
set -euo pipefail
NAME=arch-matrix
. "$(dirname "$0")/lib.sh"
TYPES=${TYPES:-"Q8_0 Q4_K_M"}
PP=${PP:-128}
SHAPE=${SHAPE:-1.1b}
[ -f "$VOCAB" ] || { echo "arch-matrix: SKIPPED: no vocabulary at $VOCAB" >&2; exit 0; }
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(llama qwen2 qwen3 phi3 gemma2 gemma3 glm4 qwen35 mistral3 nemotron_h gpt-oss)
mkdir -p "$MODELS"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
printf '%-10s %-9s %9s %9s %7s %9s %9s %7s %9s %9s\n' arch type "pp kvseal" "llama.cpp" ratio \
    "tg kvseal" "llama.cpp" ratio "roofline" "pp/peak"
for a in "${archs[@]}"; do
    f16=$MODELS/$a-$SHAPE-f16.gguf
    v=$VOCAB # llama.cpp loads phi3 only with phi-3's special tokens
    [ "$a" != phi3 ] || v=$(dirname "$VOCAB")/ggml-vocab-phi-3.gguf
    [ -f "$f16" ] || "$KS" mkmodel -o "$f16" --vocab "$v" --shape "$SHAPE" --arch "$a" -t "$THREADS" >/dev/null
    types=$TYPES # gpt-oss ships MXFP4 experts: llama-quantize's MXFP4_MOE preset
    if [ "$a" = gpt-oss ]; then types="$TYPES MXFP4_MOE"; fi
    for q in $types; do
        m=$MODELS/$a-$SHAPE-$q.gguf
        im=() # the codebook types need an importance matrix: a uniform one
        case $q in IQ1_* | IQ2_* | IQ3_XXS)
            [ -f "$MODELS/$a.imatrix" ] ||
                "$KS" inspect "$f16" | python3 "$(dirname "$0")/../scripts/uniform_imatrix.py" \
                    "$MODELS/$a.imatrix"
            im=(--imatrix "$MODELS/$a.imatrix") ;;
        esac
        [ -f "$m" ] || "$A/llama-quantize" "${im[@]}" "$f16" "$m" "$q" "$THREADS" >/dev/null 2>&1
        : >"$TMP/rows"
        for r in $(seq "$ROUNDS"); do
            p=$PP; [ "$p" -gt 0 ] || p=16
            "$KS" bench -m "$m" -p "$p" -n 128 -t "$THREADS" -r 1 2>/dev/null >"$TMP/ks"
            "$A/llama-bench" -m "$m" -t "$THREADS" -p "$PP" -n 128 -r 1 -o csv 2>/dev/null >"$TMP/lb"
            kp=$(awk -v p="pp$PP:" '$1 == p { print $2 }' "$TMP/ks")
            lp=$(lb_col "$TMP/lb" "$PP" 0 avg_ts)
            k=$(awk '/^tg128:/ { print $2 }' "$TMP/ks")
            f=$(awk '/^tg \/ roofline:/ { print $4 }' "$TMP/ks")
            pk=$(awk '/ \/ int8 peak: [0-9]/ { print $5 }' "$TMP/ks")
            l=$(lb_col "$TMP/lb" 0 128 avg_ts)
            echo "${kp:-0} ${lp:-0} $k $l $f ${pk:-0}" >>"$TMP/rows"
        done
        col() { awk -v c="$1" '{ print $c }' "$TMP/rows" | median; }
        printf '%-10s %-9s %9.1f %9.1f %6.2fx %9.1f %9.1f %6.2fx %9.2f %9.3f\n' "$a" "$q" \
            "$(col 1)" "$(col 2)" "$(awk '$2 > 0 { print $1 / $2 }' "$TMP/rows" | median)" \
            "$(col 3)" "$(col 4)" "$(awk '$4 > 0 { print $3 / $4 }' "$TMP/rows" | median)" "$(col 5)" \
            "$(col 6)"
    done
done
