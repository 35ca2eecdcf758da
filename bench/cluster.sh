#!/usr/bin/env bash
# bench/cluster.sh [MODEL] — disaggregated vs monolithic serving on loopback:
# the time to first token of `kvseal router` + 1 prefill + 1 decode against
# `kvseal serve` for prompts of about 128, 1k and 4k tokens (one request at a
# time, A/B alternated, medians of 5), and the KV transfer rate decode
# measured (first KV_PAGE to verified DONE) as a ratio to the loopback TCP
# bandwidth measured in the same run (a plain socket copy, test_pd bench);
# and the TTFT of a repeated document on the cluster, first vs again, which
# the prefill workers' prefix cache serves. The KV transfer is measured twice,
# over TLS (the default) and on a second cluster with --insecure-plaintext,
# both against the same loopback TCP copy. KV_ONLY=1: only the KV transfer
# (no `kvseal serve`, no TTFT tables; REPEAT requests of ~1k and ~4k tokens,
# or the lengths in KV_LENS), and also on clusters with --data-plane ucx over
# UCX's tcp and sm transports (the transports in UCX_PLANES, "tcp sm";
# UCX_PLANES= skips them): sealed puts, the time from prefill's first put to
# its flush plus decode's opening (verifying) of the records.
set -u
cd "$(dirname "$0")/.."
MODEL=${1:-models/kjv-mini.gguf}
cmake -S . -B build -DKS_WERROR=ON >/dev/null && cmake --build build --target kvseal test_pd -j2 >/dev/null || exit 1
export KS_BIN=$PWD/build/kvseal KS_SRC=$PWD
. tests/e2e/lib.sh
ARGS=(-m "$MODEL" --ctx 4608 --kv-pages 600 --threads 2 --batch-tokens 512)
# ucx_rate PREFILL_LOG DECODE_LOG — GB/s over the UCX transfers above 4 MB: bytes
# over (prefill's "UCX transfer: N bytes put and flushed in T ms" + decode's
# "KV handoff: N bytes in T ms", which on the UCX plane is the opening)
ucx_rate() {
    { grep -h 'UCX transfer:' "$1" | sed -n 's/.*request \([0-9]*\): UCX transfer: \([0-9]*\) bytes put and flushed in \([0-9.]*\) ms.*/P \1 \2 \3/p'
      grep -h 'KV handoff' "$2" | sed -n 's/.*request \([0-9]*\): KV handoff: \([0-9]*\) bytes in \([0-9.]*\) ms.*/D \1 \2 \3/p'; } |
        awk '$1 == "P" { pb[$2] = $3; pt[$2] = $4 } $1 == "D" { dt[$2] = $4 }
             END { for (r in pb) if (pb[r] > 4000000 && (r in dt)) { b += pb[r]; t += pt[r] + dt[r] }
                   if (t > 0) printf "%.3f", b / t / 1e6 }'
}
# kv_rate DECODE_LOG — GB/s over the handoffs above 4 MB ("KV handoff: N bytes in T ms")
kv_rate() {
    grep -h 'KV handoff' "$1" | sed -n 's/.*: \([0-9]*\) bytes in \([0-9.]*\) ms.*/\1 \2/p' |
        awk '$1 > 4000000 { b += $1; t += $2 } END { if (t > 0) printf "%.3f", b / t / 1e6 }'
}
if [ -n "${KV_ONLY:-}" ]; then
    export REPEAT=${REPEAT:-3}
    start_cluster "$TMPD/c" 1 1 "${ARGS[@]}"
    node bench/ttft.mjs "$KS_URL" "$KS_URL" ${KV_LENS:-1024 4000} >/dev/null || exit 1
    tls=$(kv_rate "$TMPD/c.decode1")
    stop_cluster
    start_cluster "$TMPD/p" 1 1 "${ARGS[@]}" --insecure-plaintext
    node bench/ttft.mjs "$KS_URL" "$KS_URL" ${KV_LENS:-1024 4000} >/dev/null || exit 1
    plain=$(kv_rate "$TMPD/p.decode1")
    stop_cluster
    ucx=""
    for tl in ${UCX_PLANES-tcp sm}; do
        PREFILL_ENV="UCX_TLS=$tl" DECODE_ENV="UCX_TLS=$tl" PREFILL_ARGS="--data-plane ucx" \
            DECODE_ARGS="--data-plane ucx" start_cluster "$TMPD/u$tl" 1 1 "${ARGS[@]}"
        node bench/ttft.mjs "$KS_URL" "$KS_URL" ${KV_LENS:-1024 4000} >/dev/null || exit 1
        ucx="$ucx, UCX over $tl $(ucx_rate "$TMPD/u$tl.prefill1" "$TMPD/u$tl.decode1") GB/s"
        stop_cluster
    done
    base=$(./build/test_pd bench 256 2>&1 | sed -n 's/.*plain socket copy \([0-9.]*\) GB\/s.*/\1/p' | head -1)
    echo "KV transfer (handoffs over 4 MB): TLS ${tls:-?} GB/s, plaintext ${plain:-?} GB/s$ucx; loopback TCP ${base:-?} GB/s"
    echo "ratios to loopback TCP: TLS $(awk -v a="${tls:-0}" -v b="${base:-1}" 'BEGIN{printf "%.2f", a/b}'), plaintext $(awk -v a="${plain:-0}" -v b="${base:-1}" 'BEGIN{printf "%.2f", a/b}')"
    exit 0
fi
start_server "$TMPD/serve.log" "${ARGS[@]}" --no-prefix-cache
A=$KS_URL; SERVE_PID=$KS_PID
start_cluster "$TMPD/c" 1 1 "${ARGS[@]}"
trap 'kill -KILL $SERVE_PID $KS_PID "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}" 2>/dev/null; rm_tmpd' EXIT
echo "TTFT, one request at a time (ms, median of ${REPEAT:-5}):"
node bench/ttft.mjs "$A" "$KS_URL" 128 1024 4000 | tee "$TMPD/ttft.json" |
    node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{for(const l of s.trim().split("\n")){const j=JSON.parse(l);
      console.log(`  ${String(j.prompt_tokens).padStart(5)} tokens: serve ${j.a_ms.toFixed(1)}  cluster ${j.b_ms.toFixed(1)}  added ${(j.b_ms-j.a_ms).toFixed(1)} ms (${(j.b_ms/j.a_ms).toFixed(3)}x)`)}})'
echo "TTFT of a repeated document with a new question, cluster (prefill prefix cache):"
SHARED=1 node bench/ttft.mjs "$A" "$KS_URL" 1024 4000 |
    node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{for(const l of s.trim().split("\n")){const j=JSON.parse(l);
      console.log(`  ${String(j.prompt_tokens).padStart(5)} tokens: first ${j.cold_ms.toFixed(1)}  repeated ${j.warm_ms.toFixed(1)} ms (${(j.warm_ms/j.cold_ms).toFixed(3)}x)`)}})'
# decode logs one line per verified handoff: "... KV handoff: N bytes in T ms"
rate=$(kv_rate "$TMPD/c.decode1")
stop_cluster
# the same transfers without TLS, for the cost of encryption
start_cluster "$TMPD/p" 1 1 "${ARGS[@]}" --insecure-plaintext
REPEAT=3 node bench/ttft.mjs "$KS_URL" "$KS_URL" 1024 4000 >/dev/null
plain=$(kv_rate "$TMPD/p.decode1")
stop_cluster
base=$(./build/test_pd bench 256 2>&1 | sed -n 's/.*plain socket copy \([0-9.]*\) GB\/s.*/\1/p' | head -1)
echo "KV transfer (handoffs over 4 MB): TLS ${rate:-?} GB/s, plaintext ${plain:-?} GB/s; loopback TCP: ${base:-?} GB/s"
echo "ratios to loopback TCP: TLS $(awk -v a="${rate:-0}" -v b="${base:-1}" 'BEGIN{printf "%.2f", a/b}'), plaintext $(awk -v a="${plain:-0}" -v b="${base:-1}" 'BEGIN{printf "%.2f", a/b}')"
KS_PID=$SERVE_PID stop_server
