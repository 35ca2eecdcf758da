#!/usr/bin/env bash
# dsa-sweep.sh [CONTEXTS...] — decode cost against context for DeepSeek
# sparse attention: the same random-weight deepseek32 model (kvseal mkmodel:
# 256 embd, 2 layers, 8 heads, MLA latent 128 + rope 32, an indexer of 8
# heads of 64) with top_k 64 and with top_k past every context (dense), each
# decoding 64 tokens after a prompt of N tokens (`kvseal bench --streams 1 -p N -n 64`: the
# decode steps attend over the prompt, as llama-batched-bench measures),
# alternated, REPS rounds (default 3), medians printed. A benchmark, not a
# test. Needs ../shared/vocab (the llama-spm vocabulary).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
KS=${KS_BIN:-$here/build/kvseal}
VOCAB=${VOCAB:-$here/../shared/vocab/ggml-vocab-llama-spm.gguf}
[ -e "$VOCAB" ] || { echo "skip: $VOCAB is absent"; exit 0; }
CTXS=("${@:-512 1024 2048 4096 8192}")
read -r -a CTXS <<<"${CTXS[*]}"
REPS=${REPS:-3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
max=$(printf '%s\n' "${CTXS[@]}" | sort -n | tail -1)
for k in 64 1000000; do
    "$KS" mkmodel -o "$tmp/k$k.gguf" --vocab "$VOCAB" --arch deepseek32 --seed 3 --n-head 32 --idx-topk $k \
        --ctx $((max + 128)) >/dev/null
done
tg() {  # MODEL N -> tokens/s of tg
    "$KS" bench -m "$1" --streams 1 -p "$2" -n 64 -t 2 2>/dev/null |
        sed -n 's/.*tg 1 x 64: \([0-9.]*\) tokens.*/\1/p' | head -1
}
med() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
printf '%-8s %14s %14s %8s\n' context "top_k 64 t/s" "dense t/s" ratio
for n in "${CTXS[@]}"; do
    : >"$tmp/s"; : >"$tmp/d"
    for r in $(seq "$REPS"); do
        tg "$tmp/k64.gguf" "$n" >>"$tmp/s"
        tg "$tmp/k1000000.gguf" "$n" >>"$tmp/d"
    done
    s=$(med <"$tmp/s"); d=$(med <"$tmp/d")
    printf '%-8s %14s %14s %8s\n' "$n" "$s" "$d" "$(awk -v a="$s" -v b="$d" 'BEGIN { printf "%.2f", a / b }')"
done
