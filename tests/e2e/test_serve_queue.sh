#!/usr/bin/env bash
# test_serve_queue.sh — engine back-pressure through the server: with one
# running slot and one queue slot, a third concurrent request gets 503
# queue_full (in OpenAI's shape, counted in /metrics), the queued request
# still produces the reference text, and the server serves again once the
# queue drains. Anonymous mode (no --tenants): no key needed, and the
# startup warning says so.
. "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl is not installed (scripts/install-deps.sh)"
M=$KS_SRC/models/kjv-mini.gguf
REF=" of the Lord, and in the Lord Jesus Christ. And I will send my voice, and will not hear the word of God, but that the Lord Jesus Christ is in the Lord Jesus. And I say unto you, that ye may be the Lord Jesus Christ, and the Lord Jesus Christ,"

SPID=
cleanup() {
    if [ -n "$SPID" ] && kill -0 "$SPID" 2>/dev/null; then
        kill -TERM "$SPID" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$SPID" 2>/dev/null
    fi
    rm -rf "$TMPD"
}
trap cleanup EXIT

"$KS_BIN" serve -m "$M" --port 0 --max-running 1 --queue-max 1 --threads 1 >"$TMPD/out" 2>"$TMPD/err" &
SPID=$!
PORT=
for _ in $(seq 300); do
    PORT=$(sed -n 's#^listening on http://127\.0\.0\.1:\([0-9][0-9]*\)$#\1#p' "$TMPD/out")
    [ -n "$PORT" ] && break
    kill -0 "$SPID" 2>/dev/null || fail "server died: $(cat "$TMPD/err")"
    sleep 0.1
done
[ -n "$PORT" ] || fail "no 'listening on' line"
U=http://127.0.0.1:$PORT
expect_has "anonymous warning" "$(cat "$TMPD/err")" "NO API key is required"

# A runs (long), B waits in the queue, C finds the queue full
curl -sSN "$U/v1/completions" -o "$TMPD/a" \
    -d '{"prompt":"In","max_tokens":500,"ignore_eos":true,"stream":true}' &
APID=$!
for _ in $(seq 300); do [ -s "$TMPD/a" ] && break; sleep 0.01; done
curl -sS "$U/v1/completions" -o "$TMPD/b" \
    -d '{"prompt":"In the beginning","max_tokens":60,"temperature":0}' &
BPID=$!
# C goes in once B is seen waiting (A is still running: 500 tokens)
ok=
for _ in $(seq 500); do
    if curl -sS "$U/metrics" | grep -q '^kvseal_queue_requests 1$'; then ok=1; break; fi
    sleep 0.01
done
[ -n "$ok" ] || fail "B never queued: $(curl -sS "$U/metrics" | grep -E 'queue|running')"
code=$(curl -sS -o "$TMPD/c" -w '%{http_code}' "$U/v1/completions" -d '{"prompt":"x","max_tokens":2}')
expect_eq "queue full status ($(cat "$TMPD/c"))" "$code" 503
expect_has "queue full code" "$(cat "$TMPD/c")" '"code":"queue_full"'
expect_has "queue full shape" "$(cat "$TMPD/c")" '{"error":{"message":"'
wait "$APID" || fail "A failed"
wait "$BPID" || fail "B failed"
expect_has "queued request content" "$(cat "$TMPD/b")" "\"text\":\"$REF\""
expect_eq "A ended" "$(grep '^data: ' "$TMPD/a" | tail -1)" "data: [DONE]"
code=$(curl -sS -o "$TMPD/d" -w '%{http_code}' "$U/v1/completions" -d '{"prompt":"In the beginning","max_tokens":60,"temperature":0}')
expect_eq "after drain ($(cat "$TMPD/d"))" "$code" 200
expect_has "after drain content" "$(cat "$TMPD/d")" "\"text\":\"$REF\""
m=$(curl -sS "$U/metrics")
expect_has "metrics queue_full" "$m" 'kvseal_rejections_total{reason="queue_full"} '
grep -q '^kvseal_rejections_total{reason="queue_full"} 0$' <<<"$m" && fail "queue_full not counted"

kill -TERM "$SPID"
rc=0
wait "$SPID" || rc=$?
SPID=
expect_eq "exit status after SIGTERM" "$rc" 0
echo "serve queue ok"
