#!/usr/bin/env bash
# test_serve_api.sh — runs the real `kvseal serve` on the shipped kjv-mini
# with a tenants file and checks CONTENT, not just status codes (I9): greedy
# completions equal the reference text of models/kjv-mini.README.md through
# every route (OpenAI completions and chat, streaming and not, Workers AI),
# usage numbers, /v1/models, every error with its status and code, tenant
# limits (429), offline (503), a client disconnecting mid-stream (its
# request is cancelled, its pages freed), /metrics, that neither keys nor
# prompts reach the log, that the server still serves after all of it, and
# a clean exit 0 on SIGTERM.
. "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl is not installed (scripts/install-deps.sh)"
M=$KS_SRC/models/kjv-mini.gguf
REF=" of the Lord, and in the Lord Jesus Christ. And I will send my voice, and will not hear the word of God, but that the Lord Jesus Christ is in the Lord Jesus. And I say unto you, that ye may be the Lord Jesus Christ, and the Lord Jesus Christ,"

cat >"$TMPD/tenants.json" <<'EOF'
{"tenants": [
  {"name": "acme", "keys": ["sk-acme-1", "sk-acme-2"], "max_concurrent": 4, "tokens_per_minute": 1000000},
  {"name": "solo", "keys": ["sk-solo"], "max_concurrent": 1, "tokens_per_minute": 1000000},
  {"name": "small", "keys": ["sk-small"], "tokens_per_minute": 50},
  {"name": "globex", "keys": ["sk-globex"]}
 ],
 "admin_key": "adm-key-123-456789abcdef"}
EOF

start_server "$TMPD/err" -m "$M" --alias kjv --tenants "$TMPD/tenants.json" \
    --security-log "$TMPD/security.log"
U=$KS_URL
PORT=${U##*:}

A=(-H "Authorization: Bearer sk-acme-1")
J=(-H "Content-Type: application/json")
# concatenates the "FIELD":"..." values of every data: line (reference text has no escapes)
sse_join() { grep '^data: {' "$1" | sed -n "s/.*\"$2\":\"\([^\"]*\)\".*/\1/p" | tr -d '\n'; }

req health 200 "$U/health"
expect_has "health" "$BODY" '"status":"ok"'
expect_has "health model" "$BODY" '"model":"kjv"'
expect_has "health isa" "$BODY" '"kernels":"'
expect_has "health online" "$BODY" '"online":true'

# ---- content: OpenAI completions, not streaming
req "completion" 200 "${A[@]}" "${J[@]}" "$U/v1/completions" \
    -d '{"model":"kjv","prompt":"In the beginning","max_tokens":60,"temperature":0}'
expect_has "completion text" "$BODY" "\"text\":\"$REF\""
expect_has "completion object" "$BODY" '"object":"text_completion"'
expect_has "completion id" "$BODY" '"id":"cmpl-'
expect_has "completion finish" "$BODY" '"finish_reason":"length"'
expect_has "completion usage" "$BODY" '"usage":{"prompt_tokens":5,"completion_tokens":60,"total_tokens":65,'
expect_has "completion model" "$BODY" '"model":"kjv"'

# ---- content: completions streaming (concatenated deltas), usage chunk, [DONE]
curl -sSN "${A[@]}" "$U/v1/completions" -o "$TMPD/sse" \
    -d '{"model":"kjv","prompt":"In the beginning","max_tokens":60,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' ||
    fail "stream curl"
expect_eq "stream text" "$(sse_join "$TMPD/sse" text)" "$REF"
expect_eq "stream ends with [DONE]" "$(grep '^data: ' "$TMPD/sse" | tail -1)" "data: [DONE]"
expect_has "stream finish" "$(cat "$TMPD/sse")" '"finish_reason":"length"'
expect_has "stream usage" "$(cat "$TMPD/sse")" '"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":60,"total_tokens":65,'
# SSE framing: every event is one data: line followed by a blank line
expect_eq "sse framing" "$(grep -c '^data: ' "$TMPD/sse")" "$(grep -c '^$' "$TMPD/sse")"

# ---- content: chat (the shipped model's template renders a lone user turn as itself)
req "chat" 200 "${A[@]}" "$U/v1/chat/completions" \
    -d '{"model":"kjv-mini","messages":[{"role":"user","content":"In the beginning"}],"max_tokens":60,"temperature":0}'
expect_has "chat content" "$BODY" "\"message\":{\"role\":\"assistant\",\"content\":\"$REF\"}"
expect_has "chat object" "$BODY" '"object":"chat.completion"'
expect_has "chat id" "$BODY" '"id":"chatcmpl-'
expect_has "chat model echoed" "$BODY" '"model":"kjv-mini"'
expect_has "chat usage" "$BODY" '"usage":{"prompt_tokens":5,"completion_tokens":60,"total_tokens":65,'
curl -sSN "${A[@]}" "$U/v1/chat/completions" -o "$TMPD/sse" \
    -d '{"model":"kjv","messages":[{"role":"user","content":"In the beginning"}],"max_tokens":60,"temperature":0,"stream":true}' ||
    fail "chat stream curl"
expect_has "chat stream role first" "$(grep '^data: ' "$TMPD/sse" | head -1)" '"delta":{"role":"assistant"'
expect_has "chat stream object" "$(head -1 "$TMPD/sse")" '"object":"chat.completion.chunk"'
expect_eq "chat stream text" "$(sse_join "$TMPD/sse" content)" "$REF"
expect_has "chat stream finish" "$(grep '^data: ' "$TMPD/sse" | tail -2 | head -1)" '"delta":{},"logprobs":null,"finish_reason":"length"'
expect_eq "chat stream [DONE]" "$(grep '^data: ' "$TMPD/sse" | tail -1)" "data: [DONE]"

# ---- logprobs: one entry per generated token, the greedy token is the top one
req "logprobs" 200 "${A[@]}" "$U/v1/chat/completions" \
    -d '{"model":"kjv","messages":[{"role":"user","content":"In the beginning"}],"max_tokens":3,"temperature":0,"logprobs":true,"top_logprobs":2}'
expect_has "logprobs first" "$BODY" '"logprobs":{"content":[{"token":" of","logprob":'
expect_has "logprobs top" "$BODY" '"top_logprobs":[{"token":" of","logprob":'
req "completion logprobs" 200 "${A[@]}" "$U/v1/completions" \
    -d '{"model":"kjv","prompt":"In the beginning","max_tokens":3,"temperature":0,"logprobs":1}'
expect_has "completion logprobs" "$BODY" '"logprobs":{"tokens":[" of"," the"," Lord"],"token_logprobs":['

# ---- stop strings end the text before them
req "stop" 200 "${A[@]}" "$U/v1/completions" \
    -d '{"model":"kjv","prompt":"Blessed are the","max_tokens":60,"temperature":0,"stop":["the LORD said"]}'
expect_has "stop text" "$BODY" '"text":" people, and the people that are in the land. And ","index":0,"logprobs":null,"finish_reason":"stop"'

# ---- I7: prefix reuse is scoped by the AUTHENTICATED tenant. The same
# tenant reuses its cached prefix pages; another tenant never does, even when
# its body claims to be the first one; the text is the same every time.
PR=$(printf 'And the word of the LORD came unto me, saying, %.0s' 1 2 3 4 5)
pq() { req "prefix $1" 200 -H "Authorization: Bearer $1" "$U/v1/completions" \
    -d "{\"model\":\"kjv\",\"prompt\":\"$PR\",\"max_tokens\":8,\"temperature\":0${2:-}}"; }
cached() { sed -n 's/.*"cached_tokens":\([0-9]*\).*/\1/p' <<<"$BODY"; }
ptext() { sed -n 's/.*"text":"\([^"]*\)".*/\1/p' <<<"$BODY"; }
pq sk-acme-1
expect_eq "prefix: first request, nothing cached" "$(cached)" 0
T0=$(ptext)
[ -n "$T0" ] || fail "prefix: empty text ($BODY)"
pq sk-acme-2
[ "$(cached)" -gt 0 ] || fail "prefix: same tenant did not reuse its prefix ($BODY)"
expect_eq "prefix: same text on reuse" "$(ptext)" "$T0"
pq sk-globex ',"user":"acme"'
expect_eq "prefix: other tenant (naming acme as its user) reused nothing" "$(cached)" 0
expect_eq "prefix: other tenant text" "$(ptext)" "$T0"
# a body cannot even claim a tenant: the field is refused, not ignored
req "prefix: tenant in the body" 400 -H "Authorization: Bearer sk-globex" "$U/v1/completions" \
    -d "{\"model\":\"kjv\",\"prompt\":\"$PR\",\"max_tokens\":8,\"tenant\":\"acme\"}"
expect_has "prefix: tenant in the body" "$BODY" '"param":"tenant","code":"unsupported_parameter"'
pq sk-globex
[ "$(cached)" -gt 0 ] || fail "prefix: globex did not reuse its own prefix ($BODY)"

# ---- models
req "models" 200 "${A[@]}" "$U/v1/models"
expect_has "models list" "$BODY" '"object":"list"'
expect_has "models alias" "$BODY" '"id":"kjv"'
expect_has "models name" "$BODY" '"id":"kjv-mini"'

# ---- Workers AI route, both ways
req "workers" 200 -H "Authorization: Bearer sk-acme-2" "$U/accounts/acct1/ai/run/kjv" \
    -d '{"prompt":"In the beginning","max_tokens":60,"temperature":0}'
expect_has "workers response" "$BODY" "{\"result\":{\"response\":\"$REF\""
expect_has "workers envelope" "$BODY" '"success":true,"errors":[],"messages":[]}'
curl -sSN -H "Authorization: Bearer sk-acme-2" "$U/accounts/acct1/ai/run/kjv" -o "$TMPD/sse" \
    -d '{"messages":[{"role":"user","content":"In the beginning"}],"max_tokens":60,"temperature":0,"stream":true}' ||
    fail "workers stream curl"
expect_eq "workers stream text" "$(sse_join "$TMPD/sse" response)" "$REF"
expect_eq "workers stream [DONE]" "$(grep '^data: ' "$TMPD/sse" | tail -1)" "data: [DONE]"
req "workers 404" 404 "${A[@]}" "$U/accounts/acct1/ai/run/@cf/meta/llama-3-8b-instruct" -d '{"prompt":"x"}'
# (Workers AI numbers the error: 3042 "Invalid model ID", its documented code for a 404)
expect_has "workers 404 shape" "$BODY" '{"result":null,"success":false,"errors":[{"code":3042,"message":"The model '"'"'@cf/meta/llama-3-8b-instruct'"'"' does not exist'
req "workers 400" 400 "${A[@]}" "$U/accounts/acct1/ai/run/kjv" -d '{}'
expect_has "workers 400 shape" "$BODY" '"success":false,"errors":[{"code":5006,"message":"exactly one of'

# ---- concurrent requests batched together give the same text (streaming and not,
# two tenants at once)
pids=()
for i in 1 2 3 4 5 6; do
    key=sk-acme-1
    [ $((i % 2)) -eq 0 ] && key=sk-globex
    stream=false
    [ "$i" -gt 3 ] && stream=true
    curl -sSN -H "Authorization: Bearer $key" "$U/v1/completions" -o "$TMPD/par$i" \
        -d "{\"model\":\"kjv\",\"prompt\":\"In the beginning\",\"max_tokens\":60,\"temperature\":0,\"stream\":$stream}" &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail "parallel curl failed"; done
for i in 1 2 3; do expect_has "parallel $i" "$(cat "$TMPD/par$i")" "\"text\":\"$REF\""; done
for i in 4 5 6; do expect_eq "parallel stream $i" "$(sse_join "$TMPD/par$i" text)" "$REF"; done

# ---- errors: status + OpenAI error code
req "context length" 400 "${A[@]}" "$U/v1/completions" -d '{"model":"kjv","prompt":"In the beginning","max_tokens":1000}'
expect_has "context length code" "$BODY" '"code":"context_length_exceeded"'
expect_has "context length message" "$BODY" "maximum context length is 512 tokens"
expect_has "context length numbers" "$BODY" "1005 tokens (5 in the prompt, 1000 for the completion)"
LONG=$(printf 'and the word %.0s' $(seq 400))
req "long prompt" 400 "${A[@]}" "$U/v1/chat/completions" -d "{\"model\":\"kjv\",\"messages\":[{\"role\":\"user\",\"content\":\"$LONG\"}]}"
expect_has "long prompt code" "$BODY" '"code":"context_length_exceeded"'
req "bad type" 400 "${A[@]}" "$U/v1/completions" -d '{"model":"kjv","prompt":"x","temperature":"hot"}'
expect_has "bad type" "$BODY" '"message":"'"'"'temperature'"'"' must be a number, got string","type":"invalid_request_error","param":"temperature"'
req "negative max_tokens" 400 "${A[@]}" "$U/v1/completions" -d '{"model":"kjv","prompt":"x","max_tokens":-5}'
expect_has "negative max_tokens" "$BODY" '"param":"max_tokens"'
req "huge max_tokens" 400 "${A[@]}" "$U/v1/completions" -d '{"model":"kjv","prompt":"x","max_tokens":99999999999}'
expect_has "huge max_tokens" "$BODY" '"param":"max_tokens"'
req "n=17" 400 "${A[@]}" "$U/v1/completions" -d '{"model":"kjv","prompt":"x","n":17}'
expect_has "n=17" "$BODY" '"param":"n"'
req "5 stops" 400 "${A[@]}" "$U/v1/completions" -d '{"model":"kjv","prompt":"x","stop":["a","b","c","d","e"]}'
expect_has "5 stops" "$BODY" '"param":"stop"'
req "malformed json" 400 "${A[@]}" "$U/v1/completions" --data-binary $'{"model":"kjv","prompt": "x",\n "max_tokens": }'
expect_has "malformed json" "$BODY" 'malformed JSON at line 2, column'
expect_has "malformed json code" "$BODY" '"code":"invalid_json"'
req "invalid utf-8" 400 "${A[@]}" "$U/v1/completions" --data-binary $'{"model":"kjv","prompt":"\xff\xfe"}'
expect_has "invalid utf-8" "$BODY" 'malformed JSON'
req "bad role" 400 "${A[@]}" "$U/v1/chat/completions" -d '{"model":"kjv","messages":[{"role":"wizard","content":"x"}]}'
expect_has "bad role" "$BODY" '"param":"messages[0].role"' # issue 12: the exact param
req "no key" 401 "$U/v1/completions" -d '{"model":"kjv","prompt":"x"}'
expect_has "no key" "$BODY" '"code":"invalid_api_key"'
req "wrong key" 401 -H "Authorization: Bearer sk-acme-3" "$U/v1/completions" -d '{"model":"kjv","prompt":"x"}'
expect_has "wrong key" "$BODY" '"code":"invalid_api_key"'
req "models no key" 401 "$U/v1/models"
req "model 404" 404 "${A[@]}" "$U/v1/chat/completions" -d '{"model":"gpt-4o","messages":[{"role":"user","content":"x"}]}'
expect_has "model 404" "$BODY" '"code":"model_not_found"'
req "route 404" 404 "${A[@]}" "$U/v1/audio/speech" -d '{}' # (/v1/embeddings is served since issue 13)
req "405" 405 "${A[@]}" "$U/v1/chat/completions"
expect_has "405" "$BODY" '"code":"method_not_allowed"'
head -c 2000000 /dev/zero | tr '\0' 'a' >"$TMPD/big"
req "413" 413 "${A[@]}" "$U/v1/completions" --data-binary @"$TMPD/big"
expect_has "413" "$BODY" '"code":"request_too_large"'
req "413 chunked" 413 "${A[@]}" -H "Transfer-Encoding: chunked" "$U/v1/completions" --data-binary @"$TMPD/big"

# ---- tenant limits: tokens per minute, then concurrency, then a client that
# vanishes mid-stream. A client that stops reading pauses its stream
# (kvseal_paused_requests), so its request, and its slot, stay busy for as
# long as the test needs, whatever the machine's speed.
req "rate" 429 -H "Authorization: Bearer sk-small" "$U/v1/completions" -d '{"model":"kjv","prompt":"x","max_tokens":100}'
expect_has "rate code" "$BODY" '"code":"rate_limit_exceeded"'
expect_has "rate message" "$BODY" "50 tokens per minute"
req "rate ok" 200 -H "Authorization: Bearer sk-small" "$U/v1/completions" -d '{"model":"kjv","prompt":"x","max_tokens":4}'
RAWC_AUTH=sk-solo stall_reader "$U" kjv "$TMPD/slow"
CPID=$STALL_PID
wait_for "the stalled reader's request to pause" metric_is "$U" kvseal_paused_requests 1
req "concurrency" 429 -H "Authorization: Bearer sk-solo" "$U/v1/completions" -d '{"model":"kjv","prompt":"x","max_tokens":2}'
expect_has "concurrency" "$BODY" "already has 1 requests running (limit 1)"
# other tenants are not affected
req "other tenant" 200 "${A[@]}" "$U/v1/completions" -d '{"model":"kjv","prompt":"x","max_tokens":2}'
# SIGKILL with unread data in its socket: the kernel resets the connection
kill -KILL "$CPID"
wait "$CPID" 2>/dev/null
wait_for "the disconnect to be counted" metric_is "$U" kvseal_client_disconnects_total 1
wait_for "the cancelled request to leave the batch" metric_is "$U" kvseal_running_requests 0
expect_eq "pages of the cancelled request" "$(metric "$U" 'kvseal_kv_pages{state="allocated"}')" 0
expect_eq "paused after the cancel" "$(metric "$U" kvseal_paused_requests)" 0
req "solo again" 200 -H "Authorization: Bearer sk-solo" "$U/v1/completions" -d '{"model":"kjv","prompt":"x","max_tokens":2}'

# ---- admin: offline -> 503 in both shapes, wrong key -> 401, back online
req "admin no key" 401 -X POST "$U/admin/models/kjv/offline"
req "admin tenant key" 401 "${A[@]}" -X POST "$U/admin/models/kjv/offline"
req "admin unknown model" 404 -H "Authorization: Bearer adm-key-123-456789abcdef" -X POST "$U/admin/models/nope/offline"
req "offline" 200 -H "Authorization: Bearer adm-key-123-456789abcdef" -X POST "$U/admin/models/kjv/offline"
expect_has "offline" "$BODY" '"online":false'
req "offline health" 200 "$U/health"
expect_has "offline health" "$BODY" '"online":false'
req "503" 503 "${A[@]}" "$U/v1/completions" -d '{"model":"kjv","prompt":"x","max_tokens":2}'
expect_has "503 code" "$BODY" '"code":"model_offline"'
req "503 workers" 503 "${A[@]}" "$U/accounts/a/ai/run/kjv" -d '{"prompt":"x","max_tokens":2}'
expect_has "503 workers (3040: out of capacity)" "$BODY" '"success":false,"errors":[{"code":3040'
req "online" 200 -H "Authorization: Bearer adm-key-123-456789abcdef" -X POST "$U/admin/models/kjv/online" -d '{"abort_running":false}'
expect_has "online" "$BODY" '"online":true'

# ---- abort while streaming: an SSE error event, no [DONE]. The client
# pauses first, so the abort always lands mid-stream; it then reads the rest.
RAWC_AUTH=sk-acme-1 stall_reader "$U" kjv "$TMPD/abort" --resume-on "$TMPD/resume"
CPID=$STALL_PID
wait_for "the stream to pause" metric_is "$U" kvseal_paused_requests 1
curl -s -o /dev/null -H "Authorization: Bearer adm-key-123-456789abcdef" -X POST "$U/admin/models/kjv/offline?abort_running=true"
touch "$TMPD/resume"
wait "$CPID" || fail "the aborted stream's client failed"
expect_has "abort event" "$(grep '^data: ' "$TMPD/abort" | tail -1)" '"code":"request_aborted"'
grep -q '^data: \[DONE\]' "$TMPD/abort" && fail "aborted stream sent [DONE]"
req "online again" 200 -H "Authorization: Bearer adm-key-123-456789abcdef" -X POST "$U/admin/models/kjv/online"

# ---- still serving, same content
req "after errors" 200 "${A[@]}" "$U/v1/completions" -d '{"model":"kjv","prompt":"In the beginning","max_tokens":60,"temperature":0}'
expect_has "after errors text" "$BODY" "\"text\":\"$REF\""

# ---- metrics
req "metrics" 200 -H "Authorization: Bearer $KS_METRICS_KEY" "$U/metrics"
for want in 'kvseal_requests_total{route="completions",status="200"}' \
    'kvseal_requests_total{route="completions",status="400"}' \
    'kvseal_requests_total{route="completions",status="401"}' \
    'kvseal_requests_total{route="chat_completions",status="404"}' \
    'kvseal_requests_total{route="chat_completions",status="405"}' \
    'kvseal_requests_total{route="completions",status="413"}' \
    'kvseal_requests_total{route="completions",status="429"}' \
    'kvseal_requests_total{route="completions",status="503"}' \
    'kvseal_requests_total{route="workers_ai",status="200"}' \
    'kvseal_rejections_total{reason="context_length"} 2' \
    'kvseal_rejections_total{reason="tenant_rate"} 1' \
    'kvseal_rejections_total{reason="tenant_concurrency"} 1' \
    'kvseal_rejections_total{reason="offline"} 2' \
    'kvseal_rejections_total{reason="auth"} 5' \
    'kvseal_isolation_violations_total 0' \
    'kvseal_kv_pages{state="quarantine"} 0' \
    'kvseal_ttft_seconds_bucket{le="+Inf"}' 'kvseal_tpot_seconds_count' \
    'kvseal_prefix_cache_hit_pages_total' 'kvseal_queue_requests 0' \
    '# TYPE kvseal_ttft_seconds histogram'; do
    expect_has "metrics" "$BODY" "$want"
done
tout=$(sed -n 's/^kvseal_tokens_out_total \([0-9]*\)$/\1/p' <<<"$BODY")
[ "${tout:-0}" -ge 420 ] || fail "tokens_out_total $tout < 420 (7 answers of 60)"

# ---- quiescence: every KV page FREE and scrubbed once idle (admin only)
req "kv check no key" 401 "$U/admin/kv/check"
req "kv check POST" 405 -X POST -H "Authorization: Bearer adm-key-123-456789abcdef" "$U/admin/kv/check"
req "kv check" 200 -H "Authorization: Bearer adm-key-123-456789abcdef" "$U/admin/kv/check?timeout_ms=$((KS_WAIT_S * 1000))"
expect_has "kv check clean" "$BODY" '"clean":true'

# ---- no keys and (log_content off) no prompt text in the logs
for secret in sk-acme-1 sk-acme-2 sk-solo adm-key-123-456789abcdef "In the beginning" "Lord Jesus"; do
    grep -qF -- "$secret" "$TMPD/err" && fail "log contains '$secret'"
done
grep -q "no --tenants" "$TMPD/err" && fail "anonymous warning with a tenants file"

# ---- SIGTERM: clean exit 0
stop_server
echo "serve api ok"
