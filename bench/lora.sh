#!/usr/bin/env bash
# bench/lora.sh — what LoRA adapters cost in batched decode: `kvseal bench
# --streams` over the same streams without adapters and with 4 rank-16
# adapters (made by `kvseal mklora --type LTYPE`, F16 factors by default as
# llama.cpp's converter writes them, every target: q, k, v, o, gate, up,
# down) taken round-robin, so each decode batch mixes 4 adapters over the
# streams. One run per model prints both decode rates and their ratio (the
# goal: with adapters at 0.8 or more of without). Models: kjv-mini (the
# repo's) and a larger llama made by `kvseal mkmodel` (SHAPE), where the
# dense matmuls dominate a step. A benchmark, not a test.
# Environment: STREAMS (16), RANK (16), N_LORA (4), PP (32), TG (32),
# THREADS (2), REPS (5 rounds: the median of their ratios), MODELS (which to run:
# "kjv big"), SHAPE (mkmodel options of "big"), TYPE (its weights, q8_0),
# LTYPE (the adapters' factors: f16, or f32 / q8_0).
set -euo pipefail
cd "$(dirname "$0")/.."
KS=${KS:-build/kvseal}
STREAMS=${STREAMS:-16}
RANK=${RANK:-16}
N_LORA=${N_LORA:-4}
PP=${PP:-32}
TG=${TG:-32}
THREADS=${THREADS:-2}
REPS=${REPS:-5}
MODELS=${MODELS:-kjv big}
SHAPE=${SHAPE:---n-embd 1024 --n-layer 8 --n-head 16 --n-head-kv 4 --n-ff 2816 --ctx 1024}
TYPE=${TYPE:-q8_0}
LTYPE=${LTYPE:-f16}
CACHE=${CACHE:-build/bench-models} # the made model is kept here
[ -x "$KS" ] || { cmake -S . -B build >/dev/null && cmake --build build -j2 >/dev/null; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

run() {  # run NAME MODEL — makes the adapters, runs the bench, prints the ratio
    local name=$1 m=$2 args=() i
    for i in $(seq "$N_LORA"); do
        "$KS" mklora -m "$m" -o "$TMP/$name-$i.gguf" --rank "$RANK" --seed "$i" --type "$LTYPE" \
            >/dev/null
        args+=(--lora "$TMP/$name-$i.gguf")
    done
    "$KS" bench -m "$m" -t "$THREADS" -p "$PP" -n "$TG" -r "$REPS" --streams "$STREAMS" \
        "${args[@]}" | tee "$TMP/$name.out"
    local ratio
    ratio=$(sed -n 's/.* = \([0-9.]*\)$/\1/p' "$TMP/$name.out" | tail -1)
    echo "lora: $name: $STREAMS streams over $N_LORA rank-$RANK $LTYPE adapters: decode ratio $ratio"
}

for which in $MODELS; do
    case $which in
    kjv) run kjv models/kjv-mini.gguf ;;
    big)
        mkdir -p "$CACHE"
        big=$CACHE/lora-big-$TYPE.gguf
        # shellcheck disable=SC2086 # SHAPE is a list of options
        [ -f "$big" ] || "$KS" mkmodel -o "$big" --vocab models/kjv-mini.gguf $SHAPE --type "$TYPE" \
            -t "$THREADS" >/dev/null
        run big "$big"
        ;;
    *) echo "lora: unknown model '$which' (kjv or big)" >&2; exit 2 ;;
    esac
done
