#!/usr/bin/env bash
# Graceful shutdown of the HTTP front (kvseal serve and kvseal router).
# After SIGTERM: new requests get 503 server_shutting_down (with
# Retry-After) and /health answers 503 "draining", while every request
# already accepted, running or still queued, finishes with its whole answer;
# then the process exits 0. A second signal, or --drain-timeout-ms running
# out, aborts what is left: those requests end with a clean error (never a
# cut answer passed off as complete) and the process still exits 0.
# In serve, a holder (a streaming client that stops reading, so its request
# pauses) keeps the drain open for as long as the test needs: the probes
# always land while draining, and an abort always has something to abort.
. "$(dirname "$0")/lib.sh"
command -v node >/dev/null || skip "node is not installed"
N=6
# long enough answers that the signal lands mid-work (sanitized builds are ~10x slower)
MAXTOK=$([ -n "${KS_SANITIZE:-}" ] && echo 100 || echo 400)
MODEL=(-m "$KS_SRC/models/kjv-mini.gguf" --alias kjv-mini --threads 1)
BODY='{"model":"kjv-mini","prompt":"In the beginning God created the heaven","max_tokens":'$MAXTOK',"temperature":0'

post() {  # post OUT BODY_SUFFIX [curl args]: the status code on stdout
    local out=$1 suffix=$2; shift 2
    curl -s -o "$out" -w '%{http_code}' "$@" "$KS_URL/v1/completions" \
        -H 'content-type: application/json' -d "$BODY$suffix}"
}
# the text of a JSON answer, or of an SSE stream ("" plus a note on error)
text_of() {
    node -e '
const s = require("fs").readFileSync(process.argv[1], "utf8");
if (!s.startsWith("data:")) { const j = JSON.parse(s); process.stdout.write(j.choices ? j.choices[0].text : "ERROR " + j.error.code); process.exit(0); }
let t = "", done = false, err = null;
for (const l of s.split("\n")) {
  if (!l.startsWith("data: ")) continue;
  if (l === "data: [DONE]") { done = true; continue; }
  const j = JSON.parse(l.slice(6));
  if (j.error) err = j.error.code || j.error.message; else if (j.choices && j.choices[0]) t += j.choices[0].text;
}
process.stdout.write(err ? "ERROR " + err : done ? t : "ERROR no [DONE]");' "$1"
}
# fire [router]: N requests, returns once all are accepted. In serve the
# holder keeps the one running slot, so they all wait in the queue and
# none can end: kvseal_queue_requests reaches N and stays. In the
# router they run at once (the decode worker does not pause), so they are
# all streamed, and each counts as accepted once its status line is in.
fire() {
    PIDS=()
    local i
    for i in $(seq 1 $N); do
        rm -f "$TMPD/r$i.hdr"
        if [ $i = 1 ] || [ "${1:-}" = router ]; then
            post "$TMPD/r$i.out" ',"stream":true' -N -D "$TMPD/r$i.hdr" >"$TMPD/r$i.code" &
        else post "$TMPD/r$i.out" '' >"$TMPD/r$i.code" &
        fi
        PIDS+=($!)
    done
    if [ "${1:-}" = router ]; then
        for i in $(seq 1 $N); do wait_for "request $i to be accepted" file_has "$TMPD/r$i.hdr" "HTTP/1.1 200"; done
    else
        wait_for "the $N requests to queue" metric_is "$KS_URL" kvseal_queue_requests $N
    fi
}

# hold [router]: a streaming request whose client stops reading after the
# first event until $TMPD/resume exists (output in $TMPD/hold.out). Its
# answer (500 events, ~90 KB) cannot fit the socket buffers (~40 KB with
# rcvbuf 2 KiB), so the answer cannot end and the drain cannot either; in
# serve the request also pauses (kvseal_paused_requests), which the router
# does not report.
hold() {
    rm -f "$TMPD/resume"
    stall_reader "$KS_URL" kjv-mini "$TMPD/hold.out" --resume-on "$TMPD/resume" --body-only
    HOLD_PID=$STALL_PID
    [ "${1:-}" = router ] || wait_for "the holder's request to pause" metric_is "$KS_URL" kvseal_paused_requests 1
}

# probes while draining: /health and a new request both get 503 (the
# signal is asynchronous: wait until the server says it is draining)
draining() { [ "$(curl -s -o /dev/null -w '%{http_code}' "$KS_URL/health")" = 503 ]; }
probe_draining() {
    local code
    wait_for "the server to report draining" draining
    code=$(curl -s -o "$TMPD/health.json" -w '%{http_code}' "$KS_URL/health")
    expect_eq "/health while draining" "$code" 503
    expect_has "/health body" "$(cat "$TMPD/health.json")" '"status":"draining"'
    code=$(post "$TMPD/late.json" '' -D "$TMPD/late.hdr")
    expect_eq "a new request while draining" "$code" 503
    expect_has "its error" "$(cat "$TMPD/late.json")" '"code":"server_shutting_down"'
    grep -qi '^retry-after:' "$TMPD/late.hdr" || fail "the 503 has no Retry-After"
}

# every accepted request finished with the reference answer
expect_all_complete() {
    local i
    for i in $(seq 1 $N); do
        expect_eq "request $i status" "$(cat "$TMPD/r$i.code")" 200
        expect_eq "request $i text" "$(text_of "$TMPD/r$i.out")" "$REF"
    done
}

# expect_aborted WHAT LOG LINE: after an abort, every request has either its
# whole answer or a clean error, at least one was cut, and the process
# exits 0 having logged LINE
expect_aborted() {
    local i t n=0
    wait "${PIDS[@]}"
    for i in $(seq 1 $N); do
        t=$(text_of "$TMPD/r$i.out")
        case "$t" in
        "ERROR server_shutting_down") n=$((n + 1)) ;;
        "$REF") ;;
        *) fail "$1: request $i is neither the whole answer nor a clean error: [${t:0:120}]" ;;
        esac
    done
    [ $n -ge 1 ] || fail "$1 aborted nothing"
    wait_exit $KS_PID "serve ($1)"
    grep -q "$3" "$2" || fail "$1: serve did not log [$3]"
}

wait_exit() {  # wait_exit PID WHAT: it must exit 0 by the deadline
    wait_for "$2 to exit after draining" proc_gone $1
    wait $1
    expect_eq "$2 exit status" "$?" 0
}

# 1. serve: queued and running requests all finish after SIGTERM
start_server "$TMPD/s1.log" "${MODEL[@]}" --max-running 1 --drain-timeout-ms 600000 \
    --queue-timeout-ms 600000
post "$TMPD/ref.json" '' >/dev/null
REF=$(text_of "$TMPD/ref.json")
[ ${#REF} -gt 100 ] || fail "reference answer too short to take time: [$REF]"
hold
fire
kill -TERM $KS_PID
probe_draining
touch "$TMPD/resume"  # the holder reads on, then the queued requests run
wait $HOLD_PID || fail "the holder's client failed"
expect_eq "the holder's answer ends" "$(grep '^data: ' "$TMPD/hold.out" | tail -1)" "data: [DONE]"
wait "${PIDS[@]}"
expect_all_complete
wait_exit $KS_PID "serve"
grep -q "drained: every request finished" "$TMPD/s1.log" || fail "serve did not log the drain"

# 1b. an answer built but not yet sent when the signal comes is still
# sent whole: the drain counts a request until its last byte has left, not
# until its answer was built. The client stops reading after the status
# line of a non-streamed answer larger than the socket buffers can ever
# hold (16 choices of 500 tokens with their top-20 logprobs, 4.7 MB, where
# Linux caps a send buffer at 4 MiB), so the answer is still being written
# when SIGTERM arrives, and stays so until the test resumes the client; the
# server must drain it, not close the connection.
start_server "$TMPD/s1b.log" "${MODEL[@]}" --drain-timeout-ms 600000 --kv-pages 1024
rm -f "$TMPD/resume" "$TMPD/stalled"
rawc --rcvbuf 2048 --pause-after 'HTTP/1.1 200' --ready "$TMPD/stalled" --resume-on "$TMPD/resume" \
    --body-only -o "$TMPD/big.json" "${KS_URL##*:}" < <(rawc_request /v1/completions \
    '{"model":"kjv-mini","prompt":"In","max_tokens":500,"ignore_eos":true,"logprobs":20,"n":16,"temperature":0}') &
BIG_PID=$!
wait_for "the big answer's client to stop reading" test -e "$TMPD/stalled"
kill -TERM $KS_PID
wait_for "the server to report draining" draining
touch "$TMPD/resume"
wait $BIG_PID || fail "the big answer's client failed (the answer was cut)"
node -e '
const j = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
const n = j.choices.map(c => c.logprobs.tokens.length);
if (n.length !== 16 || n.some(k => k !== 500)) { console.error("choices: " + n); process.exit(1); }' \
    "$TMPD/big.json" || fail "the big answer is not whole: $(head -c 200 "$TMPD/big.json")"
max=$(($(cat /proc/sys/net/ipv4/tcp_wmem | awk '{print $3}') + 2048))
[ "$(stat -c %s "$TMPD/big.json")" -gt $max ] || fail "the big answer fits the socket buffers ($max bytes): the test proves nothing"
wait_exit $KS_PID "serve (a big answer)"

# 2. a second signal aborts what is left, cleanly (the holder keeps the
# one running slot, so the others are all still queued)
start_server "$TMPD/s2.log" "${MODEL[@]}" --max-running 1 --drain-timeout-ms 600000 --queue-timeout-ms 600000
hold
fire
kill -TERM $KS_PID
probe_draining
kill -TERM $KS_PID
touch "$TMPD/resume"
expect_aborted "a second signal" "$TMPD/s2.log" "second signal: aborting"
wait $HOLD_PID
expect_eq "the holder's stream after the abort" "$(text_of "$TMPD/hold.out")" "ERROR server_shutting_down"

# 3. so does the end of --drain-timeout-ms
start_server "$TMPD/s3.log" "${MODEL[@]}" --max-running 1 --drain-timeout-ms 150 --queue-timeout-ms 600000
hold
fire
kill -TERM $KS_PID
wait_for "the drain timeout" file_has "$TMPD/s3.log" "drain timeout: aborting"
touch "$TMPD/resume"
expect_aborted "the drain timeout" "$TMPD/s3.log" "drain timeout: aborting"
wait $HOLD_PID
expect_eq "the holder's stream after the abort" "$(text_of "$TMPD/hold.out")" "ERROR server_shutting_down"

# 4. the router drains the same way, its workers still serving
ROUTER_ARGS="--drain-timeout-ms 600000" start_cluster "$TMPD/c" 1 1 "${MODEL[@]}"
hold router
fire router
kill -TERM $KS_PID
probe_draining
wait "${PIDS[@]}"
expect_all_complete
probe_draining  # the holder still runs
touch "$TMPD/resume"
wait $HOLD_PID || fail "the holder's client failed"
expect_eq "the holder's answer ends" "$(grep '^data: ' "$TMPD/hold.out" | tail -1)" "data: [DONE]"
wait_exit $KS_PID "router"
grep -q "drained: every request finished" "$TMPD/c.router" || fail "the router did not log the drain"
KS_PID= # the router is gone: stop only the workers
for p in "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}"; do kill -TERM $p; done
for p in "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}"; do wait_exit $p "worker $p"; done
echo "drain: accepted requests finished, new ones got 503, aborts were clean"
