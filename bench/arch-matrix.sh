#!/usr/bin/env bash
# bench/arch-matrix.sh [ARCH...] — single-stream decode of each architecture
# at the 1.1B shape (kvseal mkmodel --shape 1.1b --arch ARCH, F16, the
# llama-spm vocabulary, phi3 the phi-3 one, quantized to Q8_0 and Q4_K_M by the anchor's
# llama-quantize), kvseal against llama.cpp on the same file and threads,
# alternated for ROUNDS rounds (default 3): tg128 of both (kvseal bench,
# llama-bench), the median of the per-round ratios, and kvseal's tg as a
# fraction of the memory-read roofline measured in the same process. The
# models are cached in $MODELS (default build/bench-models). A benchmark,
# not a test; it skips where the anchor or the vocabulary is absent.
set -euo pipefail
NAME=arch-matrix
. "$(dirname "$0")/lib.sh"
TYPES=${TYPES:-"Q8_0 Q4_K_M"}
[ -f "$VOCAB" ] || { echo "arch-matrix: SKIPPED: no vocabulary at $VOCAB" >&2; exit 0; }
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(llama qwen2 qwen3 phi3 gemma2 gemma3 glm4 qwen35 mistral3 nemotron_h gpt-oss)
mkdir -p "$MODELS"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
printf '%-8s %-7s %10s %10s %7s %10s\n' arch type "kvseal" "llama.cpp" ratio "roofline"
for a in "${archs[@]}"; do
    f16=$MODELS/$a-1.1b-f16.gguf
    v=$VOCAB # llama.cpp loads phi3 only with phi-3's special tokens
    [ "$a" != phi3 ] || v=$(dirname "$VOCAB")/ggml-vocab-phi-3.gguf
    [ -f "$f16" ] || "$KS" mkmodel -o "$f16" --vocab "$v" --shape 1.1b --arch "$a" -t "$THREADS" >/dev/null
    for q in $TYPES; do
        m=$MODELS/$a-1.1b-$q.gguf
        [ -f "$m" ] || "$A/llama-quantize" "$f16" "$m" "$q" "$THREADS" >/dev/null 2>&1
        : >"$TMP/rows"
        for r in $(seq "$ROUNDS"); do
            "$KS" bench -m "$m" -p 16 -n 128 -t "$THREADS" -r 1 2>/dev/null >"$TMP/ks"
            "$A/llama-bench" -m "$m" -t "$THREADS" -p 0 -n 128 -r 1 -o csv 2>/dev/null >"$TMP/lb"
            k=$(awk '/^tg128:/ { print $2 }' "$TMP/ks")
            f=$(awk '/^tg \/ roofline:/ { print $4 }' "$TMP/ks")
            l=$(lb_col "$TMP/lb" 0 128 avg_ts)
            echo "$k $l $f" >>"$TMP/rows"
        done
        printf '%-8s %-7s %10.1f %10.1f %6.2fx %10.2f\n' "$a" "$q" \
            "$(awk '{ print $1 }' "$TMP/rows" | median)" "$(awk '{ print $2 }' "$TMP/rows" | median)" \
            "$(awk '$2 > 0 { print $1 / $2 }' "$TMP/rows" | median)" "$(awk '{ print $3 }' "$TMP/rows" | median)"
    done
done
