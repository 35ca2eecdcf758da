# lib.sh — helpers for the end-to-end tests (sourced). They run the real
# kvseal binary ($KS_BIN) from the build tree.
set -u
: "${KS_BIN:?KS_BIN must point at the kvseal binary}"
: "${KS_SRC:?KS_SRC must point at the source tree}"
KS_SHARED=${KS_SHARED:-$KS_SRC/../shared}
TMPD=$(mktemp -d)
# rm_tmpd — removes the test's scratch folder (logs included) unless
# KS_KEEP_TMP is set, for debugging a failure.
rm_tmpd() { [ -n "${KS_KEEP_TMP:-}" ] || rm -rf "$TMPD"; }
trap rm_tmpd EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*" >&2; exit 77; }
# expect_eq WHAT GOT WANT
expect_eq() { [ "$2" == "$3" ] || fail "$1: got [$2], want [$3]"; }
# expect_has WHAT HAYSTACK NEEDLE
expect_has() { case "$2" in *"$3"*) ;; *) fail "$1: [$2] lacks [$3]";; esac; }

# start_server LOGFILE ARGS... — starts `kvseal serve --port 0 ARGS` in the
# background, waits for its "listening on" line and /health, and sets
# KS_PID and KS_URL. The server is killed on exit.
start_server() {
    local log=$1; shift
    "${KS_SERVE_BIN:-$KS_BIN}" serve --host 127.0.0.1 --port 0 "$@" >"$log.out" 2>"$log" &
    KS_PID=$!
    trap 'kill -KILL $KS_PID 2>/dev/null; rm_tmpd' EXIT
    local i
    for i in $(seq 1 300); do
        KS_URL=$(sed -n 's/^listening on \(http:[^ ]*\).*/\1/p' "$log.out" | head -1)
        if [ -n "$KS_URL" ] && curl -fsS "$KS_URL/health" >/dev/null 2>&1; then return 0; fi
        kill -0 $KS_PID 2>/dev/null || { cat "$log" >&2; fail "server exited during start"; }
        sleep 0.1
    done
    cat "$log" >&2
    fail "server did not come up"
}

# stop_server — SIGTERM, then SIGKILL after 10 s; fails if the exit status is not 0.
stop_server() {
    kill -TERM $KS_PID 2>/dev/null
    local i
    for i in $(seq 1 100); do
        kill -0 $KS_PID 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 $KS_PID 2>/dev/null; then kill -KILL $KS_PID; fail "server ignored SIGTERM"; fi
    wait $KS_PID
    local rc=$?
    [ $rc -eq 0 ] || fail "server exited with status $rc"
}

# start_cluster LOGPREFIX NPREFILL NDECODE ARGS... — starts `kvseal router`
# (HTTP and cluster ports picked freely; $ROUTER_ARGS are router-only
# options such as --tenants), NPREFILL `kvseal prefill` and NDECODE `kvseal
# decode` workers (ARGS go to every process; $PREFILL_ENV / $DECODE_ENV are
# prepended as environment, e.g. KS_PD_FAULT=...), all with one fresh
# secret. Waits until every worker has registered and sets KS_URL, KS_PID
# (the router), KS_PREFILL_PIDS and KS_DECODE_PIDS (arrays), KS_CLUSTER_LOGS.
start_cluster() {
    local log=$1 np=$2 nd=$3; shift 3
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMPD/secret"
    chmod 600 "$TMPD/secret"
    "${KS_SERVE_BIN:-$KS_BIN}" router --host 127.0.0.1 --port 0 --cluster-port 0 \
        --secret-file "$TMPD/secret" --health-interval-ms ${KS_HEALTH_MS:-$([ -n "${KS_SANITIZE:-}" ] && echo 1000 || echo 300)} ${ROUTER_ARGS:-} "$@" \
        >"$log.router.out" 2>"$log.router" &
    KS_PID=$!
    KS_PREFILL_PIDS=(); KS_DECODE_PIDS=()
    trap 'kill -KILL $KS_PID "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}" 2>/dev/null; rm_tmpd' EXIT
    local i cport=
    for i in $(seq 1 300); do
        cport=$(sed -n 's/^cluster port \([0-9]*\).*/\1/p' "$log.router.out" | head -1)
        KS_URL=$(sed -n 's/^listening on \(http:[^ ]*\).*/\1/p' "$log.router.out" | head -1)
        [ -n "$cport" ] && [ -n "$KS_URL" ] && break
        kill -0 $KS_PID 2>/dev/null || { cat "$log.router" >&2; fail "router exited during start"; }
        sleep 0.1
    done
    [ -n "$KS_URL" ] || fail "router did not come up"
    KS_CLUSTER_LOGS="$log.router"
    for i in $(seq 1 "$nd"); do
        env ${DECODE_ENV:-} "${KS_SERVE_BIN:-$KS_BIN}" decode --router 127.0.0.1:$cport \
            --secret-file "$TMPD/secret" "$@" >"$log.decode$i.out" 2>"$log.decode$i" &
        KS_DECODE_PIDS+=($!); KS_CLUSTER_LOGS+=" $log.decode$i"
    done
    for i in $(seq 1 "$np"); do
        env ${PREFILL_ENV:-} "${KS_SERVE_BIN:-$KS_BIN}" prefill --router 127.0.0.1:$cport \
            --secret-file "$TMPD/secret" "$@" >"$log.prefill$i.out" 2>"$log.prefill$i" &
        KS_PREFILL_PIDS+=($!); KS_CLUSTER_LOGS+=" $log.prefill$i"
    done
    local want=$((np + nd)) n=0
    for i in $(seq 1 600); do
        n=$(grep -c 'worker [0-9]* registered' "$log.router" 2>/dev/null)
        [ "$n" -ge "$want" ] && break
        sleep 0.1
    done
    [ "$n" -ge "$want" ] || { cat $KS_CLUSTER_LOGS >&2; fail "only $n of $want workers registered"; }
    # data links come up right after registration: one tiny request proves the path
    for i in $(seq 1 100); do
        curl -fsS "$KS_URL/v1/completions" ${CLUSTER_PROBE_AUTH:+-H "Authorization: Bearer $CLUSTER_PROBE_AUTH"} \
            -H 'Content-Type: application/json' \
            -d '{"prompt":"In the","max_tokens":1,"temperature":0}' >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    cat $KS_CLUSTER_LOGS >&2
    fail "the cluster does not answer a probe request"
}

# stop_cluster — SIGTERM to every process; fails unless all exit 0 in 10 s.
stop_cluster() {
    local p rc=0
    for p in "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}" $KS_PID; do
        kill -TERM $p 2>/dev/null
    done
    for p in "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}" $KS_PID; do
        local i
        for i in $(seq 1 100); do kill -0 $p 2>/dev/null || break; sleep 0.1; done
        if kill -0 $p 2>/dev/null; then kill -KILL $p; fail "process $p ignored SIGTERM"; fi
        wait $p 2>/dev/null
        local s=$?
        # a worker killed on purpose by a test exits 137: callers unset it first
        [ $s -eq 0 ] || { echo "process $p exited with status $s" >&2; rc=1; }
    done
    [ $rc -eq 0 ] || { cat $KS_CLUSTER_LOGS >&2; fail "a cluster process did not exit cleanly"; }
}
