#!/usr/bin/env bash
# test_serve_queue.sh — engine back-pressure through the server, with one
# running slot and one queue slot: A's client stops reading, so A pauses
# (kvseal_paused_requests) and keeps the slot for as long as the test needs;
# B waits in the queue; C finds the queue full (503 queue_full in OpenAI's
# shape, counted in /metrics). B's client then vanishes while B is still
# queued: B is cancelled at once, not when it reaches the front, and not one
# KV page is allocated for it. A queued D then produces the reference text
# once A's client reads on and A ends with [DONE]. Anonymous mode (no
# --tenants): no key needed, and the startup warning says so.
. "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl is not installed (scripts/install-deps.sh)"
M=$KS_SRC/models/kjv-mini.gguf
REF=" of the Lord, and in the Lord Jesus Christ. And I will send my voice, and will not hear the word of God, but that the Lord Jesus Christ is in the Lord Jesus. And I say unto you, that ye may be the Lord Jesus Christ, and the Lord Jesus Christ,"

start_server "$TMPD/err" -m "$M" --max-running 1 --queue-max 1 --threads 1
U=$KS_URL
expect_has "anonymous warning" "$(cat "$TMPD/err")" "NO API key is required"

# A runs, and pauses as soon as its client's socket buffers are full
stall_reader "$U" kjv-mini "$TMPD/a" --resume-on "$TMPD/resume"
APID=$STALL_PID
wait_for "A to pause" metric_is "$U" kvseal_paused_requests 1
allocs=$(metric "$U" kvseal_kv_page_allocations_total)
# B waits in the queue, C finds it full
curl -sS "$U/v1/completions" -o "$TMPD/b" -d '{"model":"kjv-mini","prompt":"In the beginning","max_tokens":60,"temperature":0}' &
BPID=$!
wait_for "B to queue" metric_is "$U" kvseal_queue_requests 1
code=$(curl -sS -o "$TMPD/c" -w '%{http_code}' "$U/v1/completions" -d '{"model":"kjv-mini","prompt":"x","max_tokens":2}')
expect_eq "queue full status ($(cat "$TMPD/c"))" "$code" 503
expect_has "queue full code" "$(cat "$TMPD/c")" '"code":"queue_full"'
expect_has "queue full shape" "$(cat "$TMPD/c")" '{"error":{"message":"'
# B's client goes away while B is queued: B leaves the queue at once
kill -KILL "$BPID"
wait "$BPID" 2>/dev/null
wait_for "the queued request to be cancelled" metric_is "$U" kvseal_queue_requests 0
wait_for "B's disconnect to be counted" metric_is "$U" kvseal_client_disconnects_total 1
expect_eq "running after B's cancel" "$(metric "$U" kvseal_running_requests)" 1
expect_eq "pages allocated for B" "$(metric "$U" kvseal_kv_page_allocations_total)" "$allocs"
expect_eq "engine outcome of B" "$(metric "$U" 'kvseal_engine_requests_total{outcome="aborted"}')" 1
# D queues; A's client reads on; A ends whole, then D runs
curl -sS "$U/v1/completions" -o "$TMPD/d" -d '{"model":"kjv-mini","prompt":"In the beginning","max_tokens":60,"temperature":0}' &
DPID=$!
wait_for "D to queue" metric_is "$U" kvseal_queue_requests 1
touch "$TMPD/resume"
wait "$APID" || fail "A's client failed"
wait "$DPID" || fail "D failed"
expect_eq "A ended" "$(grep '^data: ' "$TMPD/a" | tail -1)" "data: [DONE]"
expect_has "A ran to max_tokens" "$(cat "$TMPD/a")" '"finish_reason":"length"'
expect_has "queued request content" "$(cat "$TMPD/d")" "\"text\":\"$REF\""
code=$(curl -sS -o "$TMPD/e" -w '%{http_code}' "$U/v1/completions" -d '{"model":"kjv-mini","prompt":"In the beginning","max_tokens":60,"temperature":0}')
expect_eq "after drain ($(cat "$TMPD/e"))" "$code" 200
expect_has "after drain content" "$(cat "$TMPD/e")" "\"text\":\"$REF\""
m=$(metrics_text "$U")
expect_has "metrics queue_full" "$m" 'kvseal_rejections_total{reason="queue_full"} '
grep -q '^kvseal_rejections_total{reason="queue_full"} 0$' <<<"$m" && fail "queue_full not counted"
stop_server
echo "serve queue ok"
