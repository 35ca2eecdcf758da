#!/usr/bin/env bash
# test_serve_contract.sh — the request contract at the edges (issue 8,
# sections 3 and 4) against the real `kvseal serve` on kjv-mini (ctx 512):
#  1. over-long prompts: refused from their bytes before tokenizing, stopped
#     at the context length when tokenized, subject to the tenant's limits
#     and charged to the tenant;
#  2. HTTP framing (RFC 9112): conflicting Content-Length, Content-Length
#     with Transfer-Encoding, Content-Encoding, %2F / %00 in paths, a
#     duplicated Authorization header;
#  3. request fields: unimplemented ones refused by name on every route,
#     `model` required on the OpenAI routes.
# Every wait is on a condition the server reports (lib.sh wait_for).
. "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl is not installed (scripts/install-deps.sh)"
M=$KS_SRC/models/kjv-mini.gguf

cat >"$TMPD/tenants.json" <<'EOF'
{"tenants": [
  {"name": "acme", "keys": ["sk-acme"], "max_concurrent": 8, "tokens_per_minute": 10000000},
  {"name": "solo", "keys": ["sk-solo"], "max_concurrent": 1, "tokens_per_minute": 10000000},
  {"name": "meter", "keys": ["sk-meter"], "max_concurrent": 8, "tokens_per_minute": 1200},
  {"name": "parts", "keys": ["sk-parts"], "max_concurrent": 8, "tokens_per_minute": 1200}
 ]}
EOF
start_server "$TMPD/err" -m "$M" --alias kjv --tenants "$TMPD/tenants.json"
U=$KS_URL
PORT=${U##*:}

A=(-H "Authorization: Bearer sk-acme")

# ---- 1. over-long prompts
# (a) 600 KB of text cannot fit 512 tokens whatever it says: refused from its
# bytes and the longest token, before any tokenizing
head -c 600000 /dev/zero | tr '\0' 'a' | sed 's/^/{"model":"kjv","prompt":"/; s/$/"}/' >"$TMPD/big.json"
req "byte bound" 400 "${A[@]}" "$U/v1/completions" --data-binary @"$TMPD/big.json"
expect_has "byte bound code" "$BODY" '"code":"context_length_exceeded"'
expect_has "byte bound message" "$BODY" "in the prompt of 600000 bytes"
# (b) ~840 tokens in 3.6 KB: past the byte bound, tokenized, refused; the
# tokenizer stops past the context, so the count is a lower bound
LONG=$(printf 'And the LORD said unto Moses, %.0s' $(seq 120))
OVER="{\"model\":\"kjv\",\"prompt\":\"$LONG\",\"max_tokens\":64}"
req "tokenized over-long" 400 "${A[@]}" "$U/v1/completions" -d "$OVER"
expect_has "tokenized over-long code" "$BODY" '"code":"context_length_exceeded"'
expect_has "tokenized over-long message" "$BODY" "However, you requested at least"
# (c) the tenant's concurrency limit applies to it: solo's one slot is held
# by a stalled stream, so its over-long request is a 429, not work
RAWC_AUTH=sk-solo stall_reader "$U" kjv "$TMPD/slow"
CPID=$STALL_PID
wait_for "the stalled reader's request to pause" metric_is "$U" kvseal_paused_requests 1
req "over-long at the concurrency limit" 429 -H "Authorization: Bearer sk-solo" "$U/v1/completions" -d "$OVER"
expect_has "over-long at the concurrency limit" "$BODY" "already has 1 requests running (limit 1)"
# issue 38: /tokenize and /detokenize take a slot of the tenant's concurrency too
req "tokenize at the concurrency limit" 429 -H "Authorization: Bearer sk-solo" "$U/tokenize" -d '{"content":"In"}'
expect_has "tokenize at the concurrency limit" "$BODY" "already has 1 requests running (limit 1)"
req "detokenize at the concurrency limit" 429 -H "Authorization: Bearer sk-solo" "$U/detokenize" -d '{"tokens":[1]}'
kill -KILL "$CPID"
wait "$CPID" 2>/dev/null
wait_for "the cancelled request to leave the batch" metric_is "$U" kvseal_running_requests 0
# (d) refused work is charged: two over-long requests cost meter (1200 tokens
# a minute) the ~1700 prompt tokens tokenized, so a 400-token request right
# after them exceeds its budget; without the charge it would pass
for i in 1 2; do
    req "meter over-long $i" 400 -H "Authorization: Bearer sk-meter" "$U/v1/completions" -d "$OVER"
done
req "meter charged" 429 -H "Authorization: Bearer sk-meter" "$U/v1/completions" \
    -d '{"model":"kjv","prompt":"In","max_tokens":400}'
expect_has "meter charged" "$BODY" "1200 tokens per minute"
# (e) issue 38: a chat of many content parts too long by its bytes alone is
# charged as a tokenized over-long prompt is (n_ctx + 1 = 513 tokens each):
# after two, a 400-token request exceeds parts' 1200 a minute; and more than
# 4096 parts is a clear 400
# parts_body N LEN — a chat body with N text parts of LEN bytes each
parts_body() {
    awk -v n="$1" -v len="$2" 'BEGIN {
        t = sprintf("%*s", len, ""); gsub(/ /, "a", t)
        printf "{\"model\":\"kjv\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":["
        for (i = 0; i < n; i++) printf "%s{\"type\":\"text\",\"text\":\"%s\"}", i ? "," : "", t
        printf "]}]}\n" }'
}
parts_body 3000 200 >"$TMPD/parts.json"
for i in 1 2; do
    req "parts over-long $i" 400 -H "Authorization: Bearer sk-parts" "$U/v1/chat/completions" \
        --data-binary @"$TMPD/parts.json"
    expect_has "parts over-long $i" "$BODY" '"code":"context_length_exceeded"'
done
req "parts charged" 429 -H "Authorization: Bearer sk-parts" "$U/v1/completions" \
    -d '{"model":"kjv","prompt":"In","max_tokens":400}'
expect_has "parts charged" "$BODY" "1200 tokens per minute"
parts_body 4097 1 >"$TMPD/parts2.json"
req "too many parts" 400 "${A[@]}" "$U/v1/chat/completions" --data-binary @"$TMPD/parts2.json"
expect_has "too many parts" "$BODY" "more than 4096 content parts"

# ---- 2. HTTP framing (RFC 9112), with exact bytes (rawc)
# raw NAME WANT_STATUS WANT_CODE REQUEST : sends REQUEST, checks the status
# line and the error code, and that exactly one answer came back on a
# connection the server then closed (nothing smuggled after the body)
raw() {
    local name=$1 status=$2 code=$3 out
    out=$(printf '%s' "$4" | rawc "$PORT") || fail "$name: rawc failed"
    OUT=$out
    expect_has "$name: status" "$(head -1 <<<"$out")" "HTTP/1.1 $status"
    [ -n "$code" ] && expect_has "$name: code" "$out" "\"code\":\"$code\""
    expect_eq "$name: answers" "$(grep -c '^HTTP/1.1 ' <<<"$out")" 1
}
nl=$'\r\n'
B='{"model":"kjv","prompt":"In","max_tokens":2}'
H="Host: 127.0.0.1${nl}Authorization: Bearer sk-acme${nl}"
SMUGGLED="GET /health HTTP/1.1${nl}Host: x${nl}${nl}"
raw "two Content-Lengths" 400 invalid_framing \
    "POST /v1/completions HTTP/1.1${nl}${H}Content-Length: ${#B}${nl}Content-Length: 5${nl}${nl}$B$SMUGGLED"
raw "same Content-Length twice" 200 "" \
    "POST /v1/completions HTTP/1.1${nl}${H}Content-Length: ${#B}${nl}Content-Length: ${#B}${nl}Connection: close${nl}${nl}$B"
raw "Content-Length with Transfer-Encoding" 400 invalid_framing \
    "POST /v1/completions HTTP/1.1${nl}${H}Content-Length: 4${nl}Transfer-Encoding: chunked${nl}${nl}$(printf '%x' ${#B})${nl}$B${nl}0${nl}${nl}$SMUGGLED"
raw "unknown transfer coding" 501 unsupported_transfer_encoding \
    "POST /v1/completions HTTP/1.1${nl}${H}Transfer-Encoding: gzip, chunked${nl}${nl}$(printf '%x' ${#B})${nl}$B${nl}0${nl}${nl}"
raw "Content-Encoding" 415 unsupported_content_encoding \
    "POST /v1/completions HTTP/1.1${nl}${H}Content-Length: ${#B}${nl}Content-Encoding: gzip${nl}Connection: close${nl}${nl}$B"
raw "Content-Encoding identity" 200 "" \
    "POST /v1/completions HTTP/1.1${nl}${H}Content-Length: ${#B}${nl}Content-Encoding: identity${nl}Connection: close${nl}${nl}$B"
raw "%2F in the path" 400 invalid_path \
    "POST /v1%2Fcompletions HTTP/1.1${nl}${H}Content-Length: ${#B}${nl}Connection: close${nl}${nl}$B"
raw "%2f in an account" 400 "" \
    "POST /accounts/a%2fb/ai/run/kjv HTTP/1.1${nl}${H}Content-Length: ${#B}${nl}Connection: close${nl}${nl}$B"
expect_has "%2f in an account: Workers AI shape" "$OUT" '"success":false'
raw "%00 in the path" 400 invalid_path \
    "POST /v1/completions%00.json HTTP/1.1${nl}${H}Content-Length: ${#B}${nl}Connection: close${nl}${nl}$B"
# a request with a bad path that ends before its headers do: nothing to
# answer, and the server lives on (it once freed the path's static mark)
printf 'POST /v1%%2Fcompletions HTTP/1.1\r\nHost: x\r\n' | rawc --half-close "$PORT" >/dev/null
raw "two Authorization headers" 400 duplicate_header \
    "POST /v1/completions HTTP/1.1${nl}${H}Authorization: Bearer sk-solo${nl}Content-Length: ${#B}${nl}Connection: close${nl}${nl}$B"
# Anthropic's x-api-key twice: the first used to win; which key is meant is ambiguous
XH="Host: 127.0.0.1${nl}anthropic-version: 2023-06-01${nl}"
MB='{"model":"kjv","max_tokens":2,"messages":[{"role":"user","content":"In"}]}'
raw "two x-api-key headers" 400 "" \
    "POST /v1/messages HTTP/1.1${nl}${XH}x-api-key: sk-acme${nl}x-api-key: sk-solo${nl}Content-Length: ${#MB}${nl}Connection: close${nl}${nl}$MB"
expect_has "two x-api-key headers: says so" "$OUT" "x-api-key header appears 2 times"
raw "one x-api-key header" 200 "" \
    "POST /v1/messages HTTP/1.1${nl}${XH}x-api-key: sk-acme${nl}Content-Length: ${#MB}${nl}Connection: close${nl}${nl}$MB"
raw "plain request still fine" 200 "" \
    "POST /v1/completions HTTP/1.1${nl}${H}Content-Length: ${#B}${nl}Connection: close${nl}${nl}$B"

# ---- 3. request fields: what kvseal does not implement is refused by name
# (never silently ignored), the same way on every route; `model` is required
# on the OpenAI routes as in OpenAI, and comes from the URL on Workers AI
MSG='"messages":[{"role":"user","content":"In the beginning"}]'
for field in suffix tools tool_choice; do # refused on completions (chat has the tool ones)
    req "completions $field" 400 "${A[@]}" "$U/v1/completions" \
        -d "{\"model\":\"kjv\",\"prompt\":\"In\",\"max_tokens\":2,\"$field\":1}"
    expect_has "completions $field" "$BODY" "\"param\":\"$field\",\"code\":\"unsupported_parameter\""
    field_body='{}'
    case $field in tools|tool_choice) ;; *) # chat implements these (test_serve_tools.sh,
                                           # test_chat_template.sh)
    req "chat $field" 400 "${A[@]}" "$U/v1/chat/completions" \
        -d "{\"model\":\"kjv\",$MSG,\"max_tokens\":2,\"$field\":$field_body}"
    expect_has "chat $field" "$BODY" "\"param\":\"$field\",\"code\":\"unsupported_parameter\""
    esac
    req "workers $field" 400 "${A[@]}" "$U/accounts/a/ai/run/kjv" \
        -d "{\"prompt\":\"In\",\"max_tokens\":2,\"$field\":null}"
    expect_has "workers $field" "$BODY" "'$field' is not supported"
done
for field in response_format grammar; do # issue 12: chat and completions only
    req "workers $field" 400 "${A[@]}" "$U/accounts/a/ai/run/kjv" \
        -d "{\"prompt\":\"In\",\"max_tokens\":2,\"$field\":null}"
    expect_has "workers $field" "$BODY" "'$field' is not supported"
done
req "completions without model" 400 "${A[@]}" "$U/v1/completions" -d '{"prompt":"In","max_tokens":2}'
expect_has "completions without model" "$BODY" '"param":"model","code":"missing_required_parameter"'
req "chat without model" 400 "${A[@]}" "$U/v1/chat/completions" -d "{$MSG,\"max_tokens\":2}"
expect_has "chat without model" "$BODY" '"param":"model","code":"missing_required_parameter"'
req "workers: the model is the URL's" 200 "${A[@]}" "$U/accounts/a/ai/run/kjv" -d '{"prompt":"In","max_tokens":2}'
# the harmless OpenAI fields are taken (user; n of 1; stream_options.include_usage)
req "harmless fields" 200 "${A[@]}" "$U/v1/chat/completions" \
    -d "{\"model\":\"kjv\",$MSG,\"max_tokens\":2,\"user\":\"u-1\",\"n\":1,\"stream_options\":{\"include_usage\":false}}"
expect_has "harmless fields" "$BODY" '"object":"chat.completion"'

echo "serve contract ok"
stop_server
