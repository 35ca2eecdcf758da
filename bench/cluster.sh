#!/usr/bin/env bash
# bench/cluster.sh [MODEL] — disaggregated vs monolithic serving on loopback:
# the time to first token of `kvseal router` + 1 prefill + 1 decode against
# `kvseal serve` for prompts of about 128, 1k and 4k tokens (one request at a
# time, A/B alternated, medians of 5); the TTFT of a repeated document on
# the cluster, first vs again, which the prefill workers' prefix cache
# serves; and the KV transfer rate (below).
#
# KV transfer: decode logs "KV handoff: N bytes in T ms" per verified
# handoff, from its first KV_PAGE to the verified DONE (prefill computes the
# whole prompt before its first page leaves, so this is the transfer alone).
# It is measured over TLS (the default) and with --insecure-plaintext, and
# compared with what the same two endpoints allow, measured in the same run:
# plaintext against a plain TCP copy between them (test_pd bench: blocking
# 1 MiB send/recv), TLS against the bound AES-GCM leaves (kv_report). Both on
# loopback, and between two network namespaces joined by a veth pair
# (router and decode in one, prefill in the other: the KV crosses the veth)
# when run as root with `ip` (NETNS=0 skips it). The prefill worker and the
# copy's sender run on CPU 0, the decode worker and the copy's receiver on
# CPU 1 (kv_wrapper; PIN=0: unpinned).
#
# KV_ONLY=1: only the KV transfer (no `kvseal serve`, no TTFT tables), on a
# KV-heavy model it makes (below; or MODEL), REPEAT requests of ~2k tokens
# (or the lengths in KV_LENS; the default run's are ~1k and ~4k).
# KV_BINS="before:/path/kvseal after:build/kvseal": the KV transfer of each
# binary, one after the other in the same run (default: this build's).
# With KV_ONLY, also clusters with --data-plane ucx over UCX's tcp and sm
# transports on loopback (the transports in UCX_PLANES, "tcp sm"; UCX_PLANES=
# skips them): sealed puts, the time from prefill's first put to its flush
# plus decode's opening (verifying) of the records.
set -u
cd "$(dirname "$0")/.."
MODEL=${1:-models/kjv-mini.gguf}
if [ -z "${KV_INNER:-}" ]; then
    cmake -S . -B build -DKS_WERROR=ON >/dev/null &&
        cmake --build build --target kvseal test_pd -j2 >/dev/null || exit 1
fi
export KS_BIN=${KS_BIN:-$PWD/build/kvseal} KS_SRC=$PWD
. tests/e2e/lib.sh
if [ -n "${KV_ONLY:-}" ] && [ -z "${1:-}" ]; then
    # A KV-heavy model for the transfer alone: 16 layers of 8 full KV heads
    # (32 KB of KV per token, kjv-mini has 3 KB) at little compute, so a
    # ~2k-token prompt hands 64 MB over (kjv-mini's ~4k, 12.8 MB: a few ms,
    # where a wake-up or a tick is a tenth of the figure).
    MODEL=$TMPD/kv-heavy.gguf
    "$KS_BIN" mkmodel -o "$MODEL" --vocab models/kjv-mini.gguf --n-embd 512 --n-layer 16 \
        --n-head 8 --n-head-kv 8 --n-ff 512 --ctx 4608 --type q8_0 >/dev/null || exit 1
    export KS_MODEL_NAME=kv-heavy CLUSTER_PROBE_MODEL=kv-heavy KV_LENS=${KV_LENS:-2000}
fi
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

# kv_rate DECODE_LOG — the median GB/s of the handoffs above 4 MB ("KV
# handoff: N bytes in T ms"; the median, as a busy host stalls a few)
kv_rate() {
    grep -h 'KV handoff' "$1" | sed -n 's/.*: \([0-9]*\) bytes in \([0-9.]*\) ms.*/\1 \2/p' |
        awk '$1 > 4000000 && $2 > 0 { printf "%.3f\n", $1 / $2 / 1e6 }' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}
# plain_copy — GB/s of a plain TCP copy between the KV link's endpoints
# (KS_BENCH_HOST / KS_BENCH_TX_NETNS: see test_pd's bench), the best of three
# (a shared host's dips then lower the copy less than the transfers: the
# ratios err against kvseal)
plain_copy() {
    for _ in 1 2 3; do
        ./build/test_pd bench 256 2>&1 | sed -n 's/.*plain socket copy \([0-9.]*\) GB\/s.*/\1/p' | head -1
    done | sort -g | tail -1
}
# kv_cluster LOG [ARGS...] — one cluster (workers run by KS_SERVE_BIN), the
# KV_LENS prompts REPEAT times; sets KV_GBS to decode's GB/s (not in a
# subshell: start_cluster's EXIT trap would remove TMPD)
kv_cluster() {
    local log=$1
    shift
    start_cluster "$log" 1 1 "${ARGS[@]}" "$@"
    node bench/ttft.mjs "$KS_URL" "$KS_URL" ${KV_LENS:-1024 4000} >/dev/null || fail "ttft.mjs failed"
    stop_cluster
    KV_GBS=$(kv_rate "$log.decode1")
}
# kv_where WHERE — for each binary of KV_BINS the KV transfer (TLS, then
# plaintext), and the plain TCP copy between the same endpoints before and
# after: lines "kv WHERE LABEL TLS PLAIN COPY" (COPY: the better of before
# and after) and "copy WHERE BEFORE AFTER"
kv_where() {
    local b label base after best lines=()
    base=$(plain_copy)
    for b in ${KV_BINS:-now:$KS_BIN}; do
        label=${b%%:*}
        export NS_BIN=${b#*:}
        KS_SERVE_BIN=${KV_WRAP:-$NS_BIN}
        kv_cluster "$TMPD/t-$label"
        lines+=("$label ${KV_GBS:-0}")
        kv_cluster "$TMPD/p-$label" --insecure-plaintext
        lines[-1]+=" ${KV_GBS:-0}"
    done
    after=$(plain_copy)
    best=$(printf '%s\n%s\n' "${base:-0}" "${after:-0}" | sort -g | tail -1)
    for b in "${lines[@]}"; do echo "kv $1 $b $best"; done
    echo "copy $1 ${base:-0} ${after:-0}"
}

# kv_wrapper — $TMPD/kv-wrap, the KS_SERVE_BIN of the transfer clusters: runs
# $NS_BIN, a prefill worker pinned to CPU KV_CPU_P and a decode worker to
# KV_CPU_D (each end of the link on a core of its own, as on two hosts: left
# to itself the scheduler wakes the receiver on the sender's core, where the
# two take turns for the first milliseconds of a transfer; PIN=0 leaves them
# free), and between namespaces prefill in namespace KV_NETNS_B reaching
# decode and the router at KV_IP_A.
kv_wrapper() {
    {
        echo '#!/usr/bin/env bash'
        echo 'pin=(); case "$1" in'
        [ -n "$KV_PIN" ] && echo "  prefill) pin=(taskset -c $KV_CPU_P);; decode) pin=(taskset -c $KV_CPU_D);;"
        echo 'esac'
        if [ -n "${KV_NETNS_B:-}" ]; then
            echo '[ "$1" = prefill ] || exec "${pin[@]}" "$NS_BIN" "$@"'
            echo "a=(); for x in \"\$@\"; do a+=(\"\${x/#127.0.0.1:/$KV_IP_A:}\"); done"
            echo "exec ip netns exec $KV_NETNS_B \"\${pin[@]}\" \"\$NS_BIN\" \"\${a[@]}\""
        else
            echo 'exec "${pin[@]}" "$NS_BIN" "$@"'
        fi
    } >"$TMPD/kv-wrap"
    chmod +x "$TMPD/kv-wrap"
    KV_WRAP=$TMPD/kv-wrap
}
KV_PIN=
if [ "${PIN:-1}" != 0 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    KV_PIN=1 KV_CPU_P=${KV_CPU_P:-0} KV_CPU_D=${KV_CPU_D:-1}
    export KS_BENCH_CPUS=$KV_CPU_P,$KV_CPU_D # test_pd's copy: sender and receiver the same way
fi

if [ -n "${KV_INNER:-}" ]; then
    # inside namespace A (router, decode, the copy's receiver); prefill runs
    # in namespace KV_NETNS_B and reaches the router at KV_IP_A
    kv_wrapper
    export KS_BENCH_HOST=$KV_IP_A KS_BENCH_TX_NETNS=/var/run/netns/$KV_NETNS_B
    export ROUTER_ARGS="--cluster-host 0.0.0.0" DECODE_ARGS="--data-host $KV_IP_A"
    kv_where netns
    exit 0
fi
kv_wrapper

# kv_netns — kv_where between two fresh namespaces joined by a veth pair
kv_netns() {
    local a=ksbA$$ b=ksbB$$ ip=10.$((200 + $$ % 50)).$(($$ / 50 % 250)).1
    ip netns add $a && ip netns add $b || return 0
    ip link add ksb$$a type veth peer name ksb$$b &&
        ip link set ksb$$a netns $a && ip link set ksb$$b netns $b &&
        ip -n $a addr add $ip/24 dev ksb$$a && ip -n $b addr add ${ip%.1}.2/24 dev ksb$$b &&
        ip -n $a link set ksb$$a up && ip -n $b link set ksb$$b up &&
        ip -n $a link set lo up && ip -n $b link set lo up &&
        ip netns exec $a env KV_INNER=1 KV_NETNS_B=$b KV_IP_A=$ip KS_BIN="$KS_BIN" \
            KV_BINS="${KV_BINS:-now:$KS_BIN}" bash bench/cluster.sh "$MODEL"
    ip netns del $a
    ip netns del $b
}
# kv_report — the "kv" / "copy" lines on stdin as a table. TLS is set against
# what AES-GCM leaves of the link: each end's core both moves every byte
# through the socket (at most the plain copy's rate) and seals or opens it
# (one core's AES-128-GCM, `openssl speed`, best of 3), so a link can carry at most
# 1 / (1/copy + 1/AES) GB/s.
kv_report() {
    local aes
    aes=$(for _ in 1 2 3; do
        openssl speed -seconds 1 -evp aes-128-gcm -bytes 262144 2>/dev/null |
            awk '/^AES-128-GCM/ { sub(/k$/, "", $NF); printf "%.3f\n", $NF / 1e6 }'
    done | sort -g | tail -1) # the best of three, as the copy
    awk -v aes="${aes:-0}" '
        $1 == "copy" { printf "  %-8s plain TCP copy (best of 3) %s GB/s before the clusters, %s after: the ratios use the better\n", $2, $3, $4; next }
        $1 == "kv" { b = (aes > 0 && $6 > 0) ? 1 / (1 / aes + 1 / $6) : 0
                     printf "  %-8s %-7s plaintext %s GB/s = %.2f of the TCP copy (%s GB/s); TLS %s GB/s = %.2f of the AES-GCM bound %.3f GB/s (1/(1/copy + 1/AES), AES-128-GCM %s GB/s on one core)\n",
                     $2, $3, $5, $5 / ($6 > 0 ? $6 : 1), $6, $4, $4 / (b > 0 ? b : 1), b, aes }'
}
# kv_all — kv_where on loopback, then between namespaces where possible
kv_all() {
    echo "KV transfer (median of the handoffs over 4 MB, first KV_PAGE to verified DONE, REPEAT=$REPEAT${KV_PIN:+, prefill on CPU $KV_CPU_P and decode on CPU $KV_CPU_D}):"
    {
        kv_where loopback
        if [ "${NETNS:-1}" != 0 ] && [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then kv_netns; fi
        trap - EXIT # this subshell's exit must not remove TMPD (start_cluster's trap)
    } | kv_report
}

if [ -n "${KV_ONLY:-}" ]; then
    export REPEAT=${REPEAT:-3}
    kv_all
    ucx=""
    for tl in ${UCX_PLANES-tcp sm}; do
        PREFILL_ENV="UCX_TLS=$tl" DECODE_ENV="UCX_TLS=$tl" PREFILL_ARGS="--data-plane ucx" \
            DECODE_ARGS="--data-plane ucx" start_cluster "$TMPD/u$tl" 1 1 "${ARGS[@]}"
        node bench/ttft.mjs "$KS_URL" "$KS_URL" ${KV_LENS:-1024 4000} >/dev/null || exit 1
        ucx="$ucx UCX over $tl $(ucx_rate "$TMPD/u$tl.prefill1" "$TMPD/u$tl.decode1") GB/s;"
        stop_cluster
    done
    [ -n "$ucx" ] && echo "  loopback UCX plane (sealed one-sided puts):$ucx"
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
stop_cluster
KS_PID=$SERVE_PID stop_server
REPEAT=3 kv_all
