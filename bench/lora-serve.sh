#!/usr/bin/env bash
# bench/lora-serve.sh [MODEL] [RANK] — the cost of LoRA adapters through
# `kvseal serve`: 16 concurrent streams (bench/serve-load.mjs, 64 requests,
# short prompts, 64-token answers), once with every request naming one of 4
# adapters of rank RANK (16) — so each decode batch mixes them — and once
# with none, alternated twice on one server so the machine's drift hits
# both. Prints each run's output tokens/s and the ratio adapters / none
# (issue 44 asks for >= 0.8 at rank 16). The adapters are F16 files (llama.cpp's
# converter's default), kept f16.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/kjv-mini.gguf}
RANK=${2:-16}
cmake -S . -B build >/dev/null && cmake --build build --target kvseal -j2 >/dev/null
T=$(mktemp -d)
trap 'kill $PID 2>/dev/null; rm -rf "$T"' EXIT
ads=""
for s in 1 2 3 4; do
    ./build/kvseal mklora -m "$MODEL" -o "$T/a$s.gguf" --rank "$RANK" --seed $s --delta 0.2 --type f16 2>/dev/null
    ads+="${ads:+,}{\"name\":\"a$s\",\"path\":\"$T/a$s.gguf\"}"
done
KEY=sk-bench-$RANDOM$RANDOM
echo "{\"tenants\":[{\"name\":\"bench\",\"keys\":[\"$KEY\"],\"adapters\":[$ads]}]}" >"$T/tenants.json"
./build/kvseal serve -m "$MODEL" --alias bench --port 0 --ctx 1024 --max-running 16 \
    --tenants "$T/tenants.json" --no-prefix-cache >"$T/out" 2>"$T/err" &
PID=$!
for _ in $(seq 1 300); do grep -q "^listening on" "$T/out" && break; sleep 0.1; done
URL=$(sed -n 's/^listening on \(http:[^ ]*\).*/\1/p' "$T/out")
export KEY PMED=48 PMIN=16 PMAX=96 AMED=64 AMIN=64 AMAX=64
run() { ADAPTERS=$1 node bench/serve-load.mjs "$URL" bench 16 64 7 | sed -n 's/.*"out_tok_s":\([0-9.]*\).*/\1/p'; }
run "" >/dev/null # warm
for round in 1 2; do
    none=$(run "") with=$(run a1,a2,a3,a4)
    echo "round $round: none $none tokens/s, 4 adapters rank $RANK $with tokens/s"
    echo "$none $with" >>"$T/r"
done
awk '{ n += $1; w += $2 } END { printf "adapters / none: %.3f\n", w / n }' "$T/r"
