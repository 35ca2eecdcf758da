#!/usr/bin/env bash
# bench/lora-cluster.sh [MODEL] [RANK] — bench/lora-serve.sh through the
# cluster: `kvseal router` + 1 prefill + 1 decode worker on loopback, both
# workers holding 4 F16 adapters of rank RANK (16, --lora) and the router's
# tenants file giving them to one tenant; 16 concurrent streamed clients
# (bench/serve-load.mjs, 64 requests, short prompts, 64-token answers), every
# request naming one of the 4 adapters, against the same requests naming
# none, alternated twice. Prints each run's output tokens/s and the ratio.
set -uo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/kjv-mini.gguf}
RANK=${2:-16}
cmake -S . -B build >/dev/null && cmake --build build --target kvseal -j2 >/dev/null
export KS_BIN=$PWD/build/kvseal KS_SRC=$PWD KS_BUILD=$PWD/build
. tests/e2e/lib.sh
ads="" loras=""
for s in 1 2 3 4; do
    "$KS_BIN" mklora -m "$MODEL" -o "$TMPD/a$s.gguf" --rank "$RANK" --seed $s --delta 0.2 --type f16 2>/dev/null
    ads+="${ads:+,}{\"name\":\"a$s\",\"path\":\"$TMPD/a$s.gguf\"}"
    loras+=" --lora $TMPD/a$s.gguf"
done
KEY=sk-bench-$RANDOM$RANDOM
echo "{\"tenants\":[{\"name\":\"bench\",\"keys\":[\"$KEY\"],\"adapters\":[$ads]}]}" >"$TMPD/tenants.json"
export ROUTER_ARGS="--tenants $TMPD/tenants.json" PREFILL_ARGS=$loras DECODE_ARGS=$loras
export CLUSTER_PROBE_AUTH=$KEY CLUSTER_PROBE_MODEL=bench
start_cluster "$TMPD/c" 1 1 -m "$MODEL" --alias bench --ctx 1024 --max-running 16 -t 1 --no-prefix-cache
export KEY PMED=48 PMIN=16 PMAX=96 AMED=64 AMIN=64 AMAX=64
run() { ADAPTERS=$1 node bench/serve-load.mjs "$KS_URL" bench 16 64 7 | sed -n 's/.*"out_tok_s":\([0-9.]*\).*/\1/p'; }
run "" >/dev/null # warm
for round in 1 2; do
    none=$(run "") with=$(run a1,a2,a3,a4)
    echo "round $round: none $none tokens/s, 4 adapters rank $RANK $with tokens/s"
    echo "$none $with" >>"$TMPD/r"
done
awk '{ n += $1; w += $2 } END { printf "adapters / none (cluster): %.3f\n", w / n }' "$TMPD/r"
stop_cluster
