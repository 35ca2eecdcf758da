#!/usr/bin/env bash
# cluster_abort_run.sh — the leak suite's mid-transfer abort phase (I5),
# against `kvseal router` + 1 prefill + 1 decode from $KS_SERVE_BIN (a
# KS_TEST_FAULTS build). The prefill worker's second KV_PAGE frame is cut in
# half (stall fault) until the next frame arrives on that data link: decode
# holds a half-received page while the client of that request disconnects,
# so decode aborts while prefill is still sending, and its ABORT is what
# releases the rest of the frame. Decode must keep the request's pages in
# QUARANTINE until prefill's ABORT_ACK: the late bytes land in a quarantined
# page, which is scrubbed on the ACK. A decode that frees at once (the
# free_before_quiesce build) lets them land in a FREE page. Every step waits
# on what the processes log, so the order does not depend on timing.
# Passes (exit 0) when afterwards every worker's pool is FREE and scrubbed and
# the cluster still answers; exit 1 otherwise.
. "$(dirname "$0")/lib.sh"
ARGS=(-m "$KS_SRC/models/kjv-mini.gguf" --ctx 512 --kv-pages 64 --threads 1)
# the probe request of start_cluster sends KV_PAGE frame 1 (a 1-page prompt)
PREFILL_ENV="KS_PD_FAULT=stall:20:2:600000" ROUTER_ARGS="--admin-key adm-x-0123456789abcdef" start_cluster "$TMPD/c" 1 1 "${ARGS[@]}"
long=$(printf 'And the LORD said unto Moses, %.0s' $(seq 1 30))
curl -sS -N "$KS_URL/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\":\"kjv-mini\",\"prompt\":\"$long\",\"max_tokens\":32,\"temperature\":0,\"stream\":true}" >"$TMPD/aborted" 2>/dev/null &
CPID=$!
wait_for "the stall fault to cut a KV_PAGE frame" file_has "$TMPD/c.prefill1" "frame cut mid-payload"
kill -KILL $CPID
wait $CPID 2>/dev/null
grep -q '"text"' "$TMPD/aborted" && fail "the aborted request got tokens before its KV arrived"
wait_for "decode to get the ABORT_ACK (the late bytes landed before it)" file_has "$TMPD/c.decode1" "ABORT_ACK"
grep -q 'released by an incoming frame' "$TMPD/c.prefill1" || fail "the stall ended before decode's ABORT"
rc=0
chk=$(curl -sS -H "Authorization: Bearer adm-x-0123456789abcdef" "$KS_URL/admin/kv/check?timeout_ms=$((KS_WAIT_S * 1000))")
echo "pool check: $chk" >&2
case "$chk" in *'"clean":true'*) ;; *) echo "LEAK: a page written after the abort is not scrubbed" >&2; rc=1;; esac
out=$(curl -sS "$KS_URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"kjv-mini","prompt":"In the beginning","max_tokens":4,"temperature":0}')
expect_has "cluster still serving" "$out" '"text"'
stop_cluster
exit $rc
