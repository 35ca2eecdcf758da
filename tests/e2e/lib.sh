# lib.sh — helpers for the end-to-end tests (sourced). They run the real
# kvseal binary ($KS_BIN) from the build tree.
set -u
: "${KS_BIN:?KS_BIN must point at the kvseal binary}"
: "${KS_SRC:?KS_SRC must point at the source tree}"
KS_SHARED=${KS_SHARED:-$KS_SRC/../shared}
TMPD=$(mktemp -d)
trap 'rm -rf "$TMPD"' EXIT

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
    trap 'kill -KILL $KS_PID 2>/dev/null; rm -rf "$TMPD"' EXIT
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
