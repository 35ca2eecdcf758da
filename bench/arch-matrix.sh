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
cd "$(dirname "$0")/.."
A=${A:-../shared/anchors/llama.cpp}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
MODELS=${MODELS:-build/bench-models}
VOCAB=${VOCAB:-../shared/vocab/ggml-vocab-llama-spm.gguf}
TYPES=${TYPES:-"Q8_0 Q4_K_M"}
KS=build/kvseal
[ -x "$A/llama-bench" ] || { echo "arch-matrix: SKIPPED: no llama.cpp anchor at $A" >&2; exit 0; }
[ -f "$VOCAB" ] || { echo "arch-matrix: SKIPPED: no vocabulary at $VOCAB" >&2; exit 0; }
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(llama qwen2 qwen3 phi3 gemma2 gemma3 glm4)
mkdir -p "$MODELS"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
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
            l=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) { gsub(/"/, "", $i); h[$i] = i }; next }
                { gsub(/"/, "") } $h["n_gen"] == 128 { print $h["avg_ts"] }' "$TMP/lb")
            echo "$k $l $f" >>"$TMP/rows"
        done
        printf '%-8s %-7s %10.1f %10.1f %6.2fx %10.2f\n' "$a" "$q" \
            "$(awk '{ print $1 }' "$TMP/rows" | median)" "$(awk '{ print $2 }' "$TMP/rows" | median)" \
            "$(awk '$2 > 0 { print $1 / $2 }' "$TMP/rows" | median)" "$(awk '{ print $3 }' "$TMP/rows" | median)"
    done
done
