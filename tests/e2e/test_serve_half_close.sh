#!/usr/bin/env bash
# test_serve_half_close.sh — a client that half-closes after sending a
# complete request (shutdown(SHUT_WR), which HTTP/1.1 allows) gets its whole
# answer (issue 8, defect 4); only a client that is really gone is
# cancelled. A holder (a paused stream) keeps the one running slot, so the
# half-closed requests wait in the queue, where the server cannot yet tell a
# half-close from a vanished client: it sends one interim "102 Processing"
# (counted in kvseal_http_probes_total), which a live client ignores and a
# vanished one answers with a reset. Both then get their whole answers, and
# no disconnect is counted.
. "$(dirname "$0")/lib.sh"
M=$KS_SRC/models/kjv-mini.gguf
REF=" of the Lord, and in the Lord Jesus Christ. And I will send my voice, and will not hear the word of God, but that the Lord Jesus Christ is in the Lord Jesus. And I say unto you, that ye may be the Lord Jesus Christ, and the Lord Jesus Christ,"
start_server "$TMPD/err" -m "$M" --max-running 1 --queue-max 4
U=$KS_URL
P=${U##*:}
stall_reader "$U" kjv-mini "$TMPD/a" --resume-on "$TMPD/resume"
APID=$STALL_PID
wait_for "the holder to pause" metric_is "$U" kvseal_paused_requests 1
rawc --half-close -o "$TMPD/e" "$P" < <(rawc_request /v1/completions \
    '{"model":"kjv-mini","prompt":"In the beginning","max_tokens":60,"temperature":0}') &
EPID=$!
rawc --half-close --body-only -o "$TMPD/f" "$P" < <(rawc_request /v1/completions \
    '{"model":"kjv-mini","prompt":"In the beginning","max_tokens":60,"temperature":0,"stream":true}') &
FPID=$!
wait_for "both half-closed requests to queue" metric_is "$U" kvseal_queue_requests 2
wait_for "the server to probe both" metric_is "$U" kvseal_http_probes_total 2
expect_eq "queued after the probes" "$(metric "$U" kvseal_queue_requests)" 2
touch "$TMPD/resume"
wait $APID || fail "the holder's client failed"
wait $EPID || fail "E's client failed"
wait $FPID || fail "F's client failed"
expect_has "E's interim answer" "$(cat "$TMPD/e")" "HTTP/1.1 102 Processing"
expect_has "E's answer" "$(cat "$TMPD/e")" "HTTP/1.1 200 OK"
expect_has "E's text" "$(cat "$TMPD/e")" "\"text\":\"$REF\""
expect_eq "F's stream ends" "$(grep '^data: ' "$TMPD/f" | tail -1)" "data: [DONE]"
expect_eq "no disconnects" "$(metric "$U" kvseal_client_disconnects_total)" 0
stop_server
echo "half-close ok"
