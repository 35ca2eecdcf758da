#!/usr/bin/env bash
# test_serve_headers.sh — the answer headers operators and browsers rely on
# (issue 13), on the real `kvseal serve` and once through the cluster router
# (kvseal router + prefill + decode), driven by curl:
# - CORS: a preflight exactly as a browser sends it (OPTIONS with Origin,
#   Access-Control-Request-Method, Access-Control-Request-Headers) gets 204
#   with the allow headers for an allowed origin and 403 without them for
#   another, needs no API key; real answers (a completion, an error, an SSE
#   stream) carry Access-Control-Allow-Origin and -Expose-Headers; with no
#   --cors-origin there are no CORS headers at all;
# - x-request-id on every answer: the client's echoed (and in the
#   completion's id and the server's log line), a generated unique one
#   otherwise, an insane one replaced;
# - a tenant limited to 1 request/min gets 429 with Retry-After ~60 (the
#   bucket's real refill time) and x-ratelimit-* that count down; a 503
#   (model offline) carries a Retry-After too;
# - /metrics: model_name and tenant labels, vLLM's names, histogram counts
#   that grow with requests, the KV usage ratio within [0, 1].
. "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl is not installed (scripts/install-deps.sh)"
M=$KS_SRC/models/kjv-mini.gguf
[ -f "$M" ] || skip "the shipped model $M is absent"

cat >"$TMPD/tenants.json" <<'JSON'
{"tenants": [
  {"name": "acme", "keys": ["sk-acme"]},
  {"name": "slow", "keys": ["sk-slow"], "requests_per_minute": 1},
  {"name": "metered", "keys": ["sk-meter"], "requests_per_minute": 6, "tokens_per_minute": 60}
 ],
 "admin_key": "adm-key-0123456789"}
JSON
ORIGIN=https://app.example.com
CORS=(--cors-origin "$ORIGIN" --cors-origin http://localhost:5173)
J=(-H "Content-Type: application/json")
A=(-H "Authorization: Bearer sk-acme")
BODY1='{"model":"kjv","prompt":"In the","max_tokens":3,"temperature":0}'

# hreq NAME WANT_STATUS CURL_ARGS... — as req, also keeping the headers in
# $TMPD/hdr (lowercased names; HDR holds them)
hreq() {
    local name=$1 want=$2 code
    shift 2
    code=$(curl -sS -D "$TMPD/hdr.raw" -o "$TMPD/body" -w '%{http_code}' "$@") || fail "$name: curl failed"
    tr -d '\r' <"$TMPD/hdr.raw" | awk -F': ' '{ if (NF > 1) { $1 = tolower($1) } print }' OFS=': ' >"$TMPD/hdr"
    BODY=$(cat "$TMPD/body")
    HDR=$(cat "$TMPD/hdr")
    expect_eq "$name: status ($BODY)" "$code" "$want"
}
# hval NAME — the value of header NAME (lowercase) of the last hreq, or nothing
hval() { sed -n "s/^$1: //p" "$TMPD/hdr" | head -1; }
no_header() { ! grep -q "^$1:" "$TMPD/hdr" || fail "$2: unexpected header $(grep "^$1:" "$TMPD/hdr")"; }
# mval NAME — a /metrics series's value (the full name with labels)
mval() { metric "$U" "$1"; }

walk() {
    local F=$1 LOG=$2
    # --- CORS preflight, as a browser sends it: no key
    hreq "$F preflight" 204 -X OPTIONS -H "Origin: $ORIGIN" \
        -H "Access-Control-Request-Method: POST" \
        -H "Access-Control-Request-Headers: authorization, content-type, x-stainless-os, x-evil" \
        "$U/v1/chat/completions"
    expect_eq "$F preflight: allow-origin" "$(hval access-control-allow-origin)" "$ORIGIN"
    expect_eq "$F preflight: vary" "$(hval vary)" "Origin"
    expect_has "$F preflight: methods" "$(hval access-control-allow-methods)" "POST"
    expect_eq "$F preflight: allowed headers echoed, x-evil left out" \
        "$(hval access-control-allow-headers)" "authorization, content-type, x-stainless-os"
    expect_eq "$F preflight: max-age" "$(hval access-control-max-age)" "600"
    [ -n "$(hval x-request-id)" ] || fail "$F preflight: no x-request-id"
    hreq "$F preflight, other origin" 403 -X OPTIONS -H "Origin: https://evil.example.net" \
        -H "Access-Control-Request-Method: POST" "$U/v1/chat/completions"
    no_header access-control-allow-origin "$F refused preflight"
    no_header access-control-allow-methods "$F refused preflight"
    no_header access-control-allow-headers "$F refused preflight"

    # --- real answers carry the CORS headers: a completion, an error, a stream
    hreq "$F completion with Origin" 200 -H "Origin: $ORIGIN" "${A[@]}" "${J[@]}" \
        "$U/v1/completions" -d "$BODY1"
    expect_eq "$F completion: allow-origin" "$(hval access-control-allow-origin)" "$ORIGIN"
    expect_has "$F completion: expose" "$(hval access-control-expose-headers)" "x-request-id"
    expect_has "$F completion: expose" "$(hval access-control-expose-headers)" "x-ratelimit-remaining-requests"
    expect_has "$F completion: expose" "$(hval access-control-expose-headers)" "retry-after"
    hreq "$F error with Origin" 401 -H "Origin: $ORIGIN" -H "Authorization: Bearer nope" "${J[@]}" \
        "$U/v1/completions" -d "$BODY1"
    expect_eq "$F error: allow-origin" "$(hval access-control-allow-origin)" "$ORIGIN"
    [ -n "$(hval x-request-id)" ] || fail "$F error: no x-request-id"
    hreq "$F stream with Origin" 200 -N -H "Origin: http://localhost:5173" "${A[@]}" "${J[@]}" \
        "$U/v1/chat/completions" -H "X-Request-Id: stream-$F-1" \
        -d '{"model":"kjv","messages":[{"role":"user","content":"In the"}],"max_tokens":3,"stream":true}'
    expect_eq "$F stream: content type" "$(hval content-type)" "text/event-stream"
    expect_eq "$F stream: allow-origin" "$(hval access-control-allow-origin)" "http://localhost:5173"
    expect_eq "$F stream: request id" "$(hval x-request-id)" "stream-$F-1"
    expect_has "$F stream: chunk id" "$BODY" '"id":"chatcmpl-stream-'"$F"'-1"'
    expect_has "$F stream: ends" "$BODY" "data: [DONE]"
    hreq "$F other origin: served, no CORS" 200 -H "Origin: https://evil.example.net" "${A[@]}" "${J[@]}" \
        "$U/v1/completions" -d "$BODY1"
    no_header access-control-allow-origin "$F disallowed origin"

    # --- x-request-id: echoed, generated unique, insane ones replaced
    hreq "$F echoed id" 200 -H "X-Request-Id: client-$F-42" "${A[@]}" "${J[@]}" \
        "$U/v1/completions" -d "$BODY1"
    expect_eq "$F echoed id" "$(hval x-request-id)" "client-$F-42"
    expect_has "$F completion id" "$BODY" "\"id\":\"cmpl-client-$F-42\""
    wait_for "$F: the id in the log line" file_has "$LOG" "request_id=client-$F-42"
    # a printable id that spells another field is quoted in the text log, never raw
    hreq "$F id with =" 200 -H "X-Request-Id: tenant=beta$F" "${A[@]}" "${J[@]}" \
        "$U/v1/completions" -d "$BODY1"
    expect_eq "$F id with = echoed" "$(hval x-request-id)" "tenant=beta$F"
    wait_for "$F: the quoted id in the log line" file_has "$LOG" "request_id=\"tenant=beta$F\""
    ! grep -q "request_id=tenant=beta$F" "$LOG" || fail "$F: raw id in the log: $(grep "request_id=tenant=beta$F" "$LOG")"
    hreq "$F id with = refused" 401 -H "X-Request-Id: x\"y=1" "$U/v1/completions" -d "$BODY1"
    wait_for "$F: the escaped id in the error's log line" file_has "$LOG" 'request_id="x\"y=1"'
    hreq "$F generated id 1" 200 "${A[@]}" "${J[@]}" "$U/v1/completions" -d "$BODY1"
    local g1 g2; g1=$(hval x-request-id)
    expect_has "$F generated id in the completion's" "$BODY" "\"id\":\"cmpl-$g1\""
    hreq "$F generated id 2" 404 "${A[@]}" "$U/v1/nothing-here"
    g2=$(hval x-request-id)
    [[ $g1 =~ ^[0-9a-f]{32}$ && $g2 =~ ^[0-9a-f]{32}$ ]] || fail "$F generated ids [$g1] [$g2]"
    [ "$g1" != "$g2" ] || fail "$F generated ids are not unique: $g1"
    hreq "$F health has an id" 200 -H "X-Request-Id: hc-1" "$U/health"
    expect_eq "$F health id" "$(hval x-request-id)" "hc-1"
    hreq "$F insane id replaced" 200 -H "X-Request-Id: has space" "$U/health"
    [[ $(hval x-request-id) =~ ^[0-9a-f]{32}$ ]] || fail "$F: insane id kept: $(hval x-request-id)"
    hreq "$F long id replaced" 200 -H "X-Request-Id: $(printf 'a%.0s' {1..200})" "$U/health"
    [[ $(hval x-request-id) =~ ^[0-9a-f]{32}$ ]] || fail "$F: 200-byte id kept"

    # --- rate limits: 1 request per minute -> 429 with Retry-After ~60
    hreq "$F slow 1" 200 -H "Authorization: Bearer sk-slow" "${J[@]}" "$U/v1/completions" -d "$BODY1"
    expect_eq "$F slow 1: limit" "$(hval x-ratelimit-limit-requests)" "1"
    expect_eq "$F slow 1: remaining" "$(hval x-ratelimit-remaining-requests)" "0"
    expect_has "$F slow 1: reset" "$(hval x-ratelimit-reset-requests)" "s"
    no_header x-ratelimit-limit-tokens "$F slow has no token limit"
    hreq "$F slow 2" 429 -H "Origin: $ORIGIN" -H "Authorization: Bearer sk-slow" "${J[@]}" \
        "$U/v1/completions" -d "$BODY1"
    expect_has "$F slow 2: code" "$BODY" '"code":"rate_limit_exceeded"'
    local ra; ra=$(hval retry-after)
    [[ $ra =~ ^[0-9]+$ ]] && [ "$ra" -ge 55 ] && [ "$ra" -le 60 ] ||
        fail "$F slow 2: Retry-After [$ra], want the refill time of 1 request/min (~60)"
    expect_eq "$F slow 2: remaining" "$(hval x-ratelimit-remaining-requests)" "0"
    expect_eq "$F slow 2: allow-origin on a 429" "$(hval access-control-allow-origin)" "$ORIGIN"
    # requests and tokens count down
    hreq "$F metered 1" 200 -H "Authorization: Bearer sk-meter" "${J[@]}" "$U/v1/completions" -d "$BODY1"
    local r1 t1 r2 t2
    r1=$(hval x-ratelimit-remaining-requests); t1=$(hval x-ratelimit-remaining-tokens)
    expect_eq "$F metered: limit requests" "$(hval x-ratelimit-limit-requests)" "6"
    expect_eq "$F metered: limit tokens" "$(hval x-ratelimit-limit-tokens)" "60"
    expect_eq "$F metered: requests remaining" "$r1" "5"
    [ -n "$(hval x-ratelimit-reset-tokens)" ] || fail "$F metered: no x-ratelimit-reset-tokens"
    hreq "$F metered 2" 200 -H "Authorization: Bearer sk-meter" "${J[@]}" "$U/v1/completions" -d "$BODY1"
    r2=$(hval x-ratelimit-remaining-requests); t2=$(hval x-ratelimit-remaining-tokens)
    # (the buckets refill 1 request per 10 s and 1 token per second meanwhile;
    # a request costs 1 request and its 3 prompt + 3 generated tokens)
    [ "$r2" -lt "$r1" ] || fail "$F metered: requests remaining $r1 then $r2"
    [ "$t1" -le 57 ] && [ "$t2" -lt "$t1" ] || fail "$F metered: tokens remaining $t1 then $t2"
    hreq "$F metered too much" 429 -H "Authorization: Bearer sk-meter" "${J[@]}" "$U/v1/completions" \
        -d '{"model":"kjv","prompt":"In the","max_tokens":56}'
    ra=$(hval retry-after)
    [[ $ra =~ ^[0-9]+$ ]] && [ "$ra" -ge 1 ] && [ "$ra" -le 60 ] || fail "$F metered: Retry-After [$ra]"

    # --- a 503 (model offline) says when to come back
    hreq "$F offline" 200 -X POST -H "Authorization: Bearer adm-key-0123456789" "$U/admin/models/kjv/offline"
    hreq "$F 503" 503 "${A[@]}" "${J[@]}" "$U/v1/completions" -d "$BODY1"
    ra=$(hval retry-after)
    [[ $ra =~ ^[0-9]+$ ]] && [ "$ra" -ge 1 ] || fail "$F 503: Retry-After [$ra]"
    hreq "$F online" 200 -X POST -H "Authorization: Bearer adm-key-0123456789" "$U/admin/models/kjv/online"

    # --- /metrics is tenant data (names, traffic): the scraper's key or the
    # admin key reads it, no key or a tenant's key gets 401; /health stays open
    hreq "$F metrics: no key" 401 "$U/metrics"
    [[ $BODY != *acme* ]] || fail "$F metrics: a refused scrape names a tenant: $BODY"
    hreq "$F metrics: a tenant's key" 401 "${A[@]}" "$U/metrics"
    hreq "$F metrics: a wrong key" 401 -H "Authorization: Bearer $KS_METRICS_KEY-x" "$U/metrics"
    hreq "$F metrics: the admin key" 200 -H "Authorization: Bearer adm-key-0123456789" "$U/metrics"
    expect_has "$F metrics (admin key): tenant series" "$BODY" 'kvseal_tenant_requests_total{tenant="acme"}'
    hreq "$F metrics: the metrics key" 200 -H "Authorization: Bearer $KS_METRICS_KEY" "$U/metrics"
    expect_has "$F metrics (metrics key): tenant series" "$BODY" 'kvseal_tenant_requests_total{tenant="metered"}'
    expect_has "$F metrics (metrics key): engine series" "$BODY" 'kvseal_requests_total{'
    hreq "$F health: no key" 200 "$U/health"

    # --- /metrics
    local ML='{model_name="kjv"}' e0 q0 e1 q1 s0
    e0=$(mval "vllm:e2e_request_latency_seconds_count$ML")
    q0=$(mval "vllm:request_queue_time_seconds_count$ML")
    s0=$(mval 'vllm:request_success_total{finished_reason="length",model_name="kjv"}')
    [ -n "$e0" ] && [ -n "$q0" ] && [ -n "$s0" ] || fail "$F: vLLM histograms missing"
    hreq "$F one more" 200 "${A[@]}" "${J[@]}" "$U/v1/completions" -d "$BODY1"
    e1=$(mval "vllm:e2e_request_latency_seconds_count$ML")
    q1=$(mval "vllm:request_queue_time_seconds_count$ML")
    expect_eq "$F e2e histogram count grows" "$e1" "$((e0 + 1))"
    expect_eq "$F queue histogram count grows" "$q1" "$((q0 + 1))"
    expect_eq "$F success counter grows" "$(mval 'vllm:request_success_total{finished_reason="length",model_name="kjv"}')" "$((s0 + 1))"
    expect_eq "$F kvseal e2e count" "$(mval kvseal_e2e_request_latency_seconds_count)" "$e1"
    local text; text=$(metrics_text "$U")
    for n in vllm:num_requests_running vllm:num_requests_waiting vllm:kv_cache_usage_perc \
        vllm:gpu_cache_usage_perc vllm:prompt_tokens_total vllm:generation_tokens_total \
        vllm:time_to_first_token_seconds_count vllm:time_per_output_token_seconds_count; do
        expect_has "$F metrics: $n" "$text" "$n$ML "
    done
    expect_has "$F metrics: histogram type" "$text" "# TYPE vllm:time_to_first_token_seconds histogram"
    expect_has "$F metrics: model_info" "$text" "kvseal_model_info$ML 1"
    local ratio; ratio=$(mval "vllm:kv_cache_usage_perc$ML")
    awk -v r="$ratio" 'BEGIN { exit !(r != "" && r >= 0 && r <= 1) }' || fail "$F KV usage [$ratio] outside [0,1]"
    ratio=$(mval kvseal_kv_usage_ratio)
    awk -v r="$ratio" 'BEGIN { exit !(r != "" && r >= 0 && r <= 1) }' || fail "$F kvseal KV usage [$ratio]"
    local sl; sl=$(mval 'kvseal_tenant_requests_total{tenant="slow"}')
    [ "$sl" -ge 2 ] || fail "$F tenant slow requests [$sl]"
    expect_eq "$F tenant slow 429s" "$(mval 'kvseal_tenant_rate_limited_total{tenant="slow"}')" "1"
    local gt; gt=$(mval 'kvseal_tenant_generation_tokens_total{tenant="metered"}')
    [ "$gt" -ge 2 ] || fail "$F tenant metered generated [$gt]"
    # tenants come from the file only: a model name in a body makes no series
    expect_eq "$F tenant series" "$(grep -c '^kvseal_tenant_requests_total{' <<<"$text")" "3"
}

# a --cors-origin that is no origin stops the command line, saying why
rc=0; "$KS_BIN" serve -m "$M" --cors-origin app.example.com 2>"$TMPD/bad.err" || rc=$?
expect_eq "bad --cors-origin: status" "$rc" 2
expect_has "bad --cors-origin: message" "$(cat "$TMPD/bad.err")" "expects '*' or an origin"

# kvseal serve
start_server "$TMPD/s" -m "$M" --alias kjv --tenants "$TMPD/tenants.json" "${CORS[@]}"
U=$KS_URL
walk serve "$TMPD/s"
stop_server

# CORS off by default: no CORS headers at all, a preflight is not answered as one
start_server "$TMPD/off" -m "$M" --alias kjv
U=$KS_URL
hreq "off: preflight" 405 -X OPTIONS -H "Origin: $ORIGIN" -H "Access-Control-Request-Method: POST" \
    "$U/v1/completions"
no_header access-control-allow-origin "CORS off preflight"
no_header access-control-allow-methods "CORS off preflight"
hreq "off: completion" 200 -H "Origin: $ORIGIN" "${J[@]}" "$U/v1/completions" -d "$BODY1"
! grep -q '^access-control-' "$TMPD/hdr" || fail "CORS off: $(grep '^access-control-' "$TMPD/hdr")"
[ -n "$(hval x-request-id)" ] || fail "CORS off: no x-request-id"
no_header x-ratelimit-limit-requests "anonymous tenant without limits"
hreq "off: metrics need no key without tenants" 200 "$U/metrics"
expect_has "off: metrics" "$BODY" 'kvseal_tenant_requests_total{tenant="default"}'
stop_server

# tenants without a metrics key or an admin key: nobody may read /metrics
# (403, saying how to turn it on); /health stays open
echo '{"tenants": [{"name": "solo", "keys": ["sk-solo"]}]}' >"$TMPD/solo.json"
KS_METRICS_KEY= start_server "$TMPD/nokey" -m "$M" --alias kjv --tenants "$TMPD/solo.json"
U=$KS_URL
hreq "no metrics key: a tenant's key" 403 -H "Authorization: Bearer sk-solo" "$U/metrics"
expect_has "no metrics key: says how" "$BODY" "--metrics-key"
hreq "no metrics key: health" 200 "$U/health"
stop_server

# the cluster router: the same HTTP front over prefill + decode workers
ROUTER_ARGS="--alias kjv --tenants $TMPD/tenants.json ${CORS[*]}" CLUSTER_PROBE_AUTH=sk-acme \
    start_cluster "$TMPD/c" 1 1 -m "$M"
U=$KS_URL
walk cluster "$TMPD/c.router"
stop_cluster
echo "PASS test_serve_headers"
