#!/usr/bin/env bash
# cluster_abort_run.sh — the leak suite's mid-transfer abort phase (I5),
# against `kvseal router` + 1 prefill + 1 decode from $KS_SERVE_BIN (a
# KS_TEST_FAULTS build). The prefill worker's second KV_PAGE frame is cut in
# half for 1.5 s (stall fault): decode holds a half-received page while the
# client of that request disconnects, so decode aborts while prefill is still
# sending. Decode must keep the request's pages in QUARANTINE until prefill's
# ABORT_ACK: when the rest of the frame lands, it lands in a quarantined page,
# which is scrubbed on the ACK. A decode that frees at once (the
# free_before_quiesce build) lets the late bytes land in a FREE page.
# Passes (exit 0) when afterwards every worker's pool is FREE and scrubbed and
# the cluster still answers; exit 1 otherwise.
. "$(dirname "$0")/lib.sh"
ARGS=(-m "$KS_SRC/models/kjv-mini.gguf" --ctx 512 --kv-pages 64 --threads 1)
# the probe request of start_cluster sends KV_PAGE frame 1 (a 1-page prompt)
PREFILL_ENV="KS_PD_FAULT=stall:20:2:1500" ROUTER_ARGS="--admin-key adm-x" start_cluster "$TMPD/c" 1 1 "${ARGS[@]}"
long=$(printf 'And the LORD said unto Moses, %.0s' $(seq 1 30))
t0=$(date +%s%N)
curl -sS -N --max-time 0.7 "$KS_URL/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\":\"$long\",\"max_tokens\":32,\"temperature\":0,\"stream\":true}" >"$TMPD/aborted" 2>/dev/null
grep -q '"text"' "$TMPD/aborted" && fail "the aborted request got tokens before its KV arrived"
sleep 2.5  # the stalled frame lands, then ABORT_ACK
rc=0
chk=$(curl -sS -H "Authorization: Bearer adm-x" "$KS_URL/admin/kv/check?timeout_ms=10000")
echo "pool check: $chk" >&2
case "$chk" in *'"clean":true'*) ;; *) echo "LEAK: a page written after the abort is not scrubbed" >&2; rc=1;; esac
grep -h 'stall' "$TMPD"/c.prefill1 >&2 || { echo "the stall fault never fired" >&2; rc=2; }
out=$(curl -sS "$KS_URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"In the beginning","max_tokens":4,"temperature":0}')
expect_has "cluster still serving" "$out" '"text"'
stop_cluster
exit $rc
