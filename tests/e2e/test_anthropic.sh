#!/usr/bin/env bash
# test_anthropic.sh — Anthropic's POST /v1/messages and the Workers AI routes
# (issue 13) through the real `kvseal serve` on kjv-mini, and once through a
# cluster router:
# - the official @anthropic-ai/sdk client (js/anthropic_client.mjs):
#   messages.create and messages.stream, each answer equal to the OpenAI
#   route's for the same conversation; stop_sequences (stop_reason
#   stop_sequence, which one), max_tokens; a tool round trip (a forced
#   tool_use, its tool_result sent back, the answer); errors in Anthropic's
#   shape (missing max_tokens, a bad role, an image, an unknown model 404
#   not_found_error, a wrong x-api-key 401 authentication_error);
#   messages.countTokens equal to messages.create's prompt tokens (plain,
#   system, tools, a tool round trip, thinking off; thinking on counted)
#   and its errors;
# - curl: the Workers AI run route under /client/v4 answers as without it;
#   the OpenAI-compatible /accounts/{id}/ai/v1/chat/completions (both
#   prefixes) answers OpenAI's shape with the chat route's text; refusals
#   in Cloudflare's envelope with their mapped codes (5006 bad input, 3003
#   missing field, 3042 unknown model, 10000 authentication, 3036 the key's
#   rate limit, 3040 out of capacity while the model is offline);
# - POST /v1/messages/count_tokens: the prompt tokens /v1/messages reports
#   for the same body, its errors in Anthropic's shape, the tenant's limit.
. "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl is not installed (scripts/install-deps.sh)"
command -v jq >/dev/null || skip "jq is not installed"
command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs it)"
JSD=$(dirname "$0")/js
[ -d "$JSD/node_modules/@anthropic-ai/sdk" ] && [ -d "$JSD/node_modules/openai" ] ||
    skip "the @anthropic-ai/sdk or openai npm package is not installed (scripts/install-deps.sh)"
JS=$JSD/anthropic_client.mjs
M=$KS_SRC/models/kjv-mini.gguf

# a template that renders every turn a tool round trip has (kjv-mini has
# none); --log-content shows what reached it
cat >"$TMPD/t.jinja" <<'EOF'
{{- bos_token }}{% for m in messages %}{% if m.role == "system" %}{{ m.content }}
{% elif m.role == "user" %}User: {{ m.content }}
Assistant:{% elif m.role == "assistant" %}{% for tc in m.tool_calls | default([]) %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>{% endfor %}{% if m.content %} {{ m.content }}{% endif %}
{% elif m.role == "tool" %}Tool: {{ m.content }}
Assistant:{% endif %}{% endfor %}
EOF
cat >"$TMPD/tenants.json" <<'EOF'
{"tenants": [{"name": "acme", "keys": ["sk-anth-1"]},
             {"name": "tiny", "keys": ["sk-tiny"], "tokens_per_minute": 10}]}
EOF
OPTS=(--alias kjv --tool-call-format hermes --chat-template-file "$TMPD/t.jinja")
start_server "$TMPD/serve.log" -m "$M" "${OPTS[@]}" --tenants "$TMPD/tenants.json" \
    --admin-key adm-anthropic-0001 --log-content
KS_URL=$KS_URL KS_KEY=sk-anth-1 KS_MODEL_NAME=kjv KS_MODE=serve node "$JS" >"$TMPD/client.out" ||
    { cat "$TMPD/client.out" >&2; fail "anthropic client checks failed"; }
REF=$(sed -n 's/^REF=//p' "$TMPD/client.out") # a JSON string
[ -n "$REF" ] || fail "the client printed no reference text"
# the tool result reached the template, after the call the model made
expect_has "tool result in the prompt" "$(cat "$TMPD/serve.log")" "</tool_call>Tool: sunny in Paris
Assistant:"
expect_has "metrics: messages route" "$(metrics_text "$KS_URL")" \
    'kvseal_requests_total{route="messages",status="200"}'
U=$KS_URL
A=(-H "Authorization: Bearer sk-anth-1" -H "Content-Type: application/json")
req "GET /v1/messages" 405 "${A[@]}" "$U/v1/messages"
expect_has "405 in Anthropic's shape" "$BODY" '{"type":"error","error":{"type":"invalid_request_error"'
req "x-api-key only on /v1/messages" 401 -H "x-api-key: sk-anth-1" "$U/v1/chat/completions" \
    -d '{"model":"kjv","messages":[{"role":"user","content":"x"}]}'

# ---- a stream's message_start and message_delta agree on the input and
# cache-read tokens, also when the prompt was served from the prefix cache
# (the second time: message_delta once counted the cached part, message_start
# could not know it)
LONGP=$(printf 'And God said, Let there be light: and there was light. %.0s' $(seq 6))
MSG="{\"model\":\"kjv\",\"max_tokens\":4,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"$LONGP\"}]}"
for i in 1 2; do
    curl -sSN "${A[@]}" -H 'anthropic-version: 2023-06-01' "$U/v1/messages" -d "$MSG" -o "$TMPD/anth$i.sse" ||
        fail "messages stream $i: curl failed"
    u0=$(sed -n 's/^data: //p' "$TMPD/anth$i.sse" | jq -c 'select(.type == "message_start") | .message.usage | [.input_tokens, .cache_read_input_tokens]')
    u1=$(sed -n 's/^data: //p' "$TMPD/anth$i.sse" | jq -c 'select(.type == "message_delta") | .usage | [.input_tokens, .cache_read_input_tokens]')
    [ -n "$u0" ] || fail "messages stream $i: no message_start usage"
    expect_eq "messages stream $i: message_delta's input usage equals message_start's" "$u1" "$u0"
done

# ---- POST /v1/messages/count_tokens: the prompt tokens the same request to
# /v1/messages has (system and tools included; a system prompt of its own,
# so nothing of it is in the prefix cache), charged as /tokenize is; its
# errors in Anthropic's shape as /v1/messages has them
X=(-H "x-api-key: sk-anth-1" -H "Content-Type: application/json" -H 'anthropic-version: 2023-06-01')
CT=$(jq -nc --arg sys "count the tokens $$ $RANDOM" '{model: "kjv", system: $sys,
    messages: [{role: "user", content: "In the beginning God created"},
               {role: "assistant", content: "the heaven"}, {role: "user", content: "and the earth"}],
    tools: [{name: "weather", description: "the weather in a city",
             input_schema: {type: "object", properties: {city: {type: "string"}}}}]}')
req "count_tokens" 200 "${X[@]}" "$U/v1/messages/count_tokens" -d "$CT"
expect_eq "count_tokens: only input_tokens" "$(jq -c keys <<<"$BODY")" '["input_tokens"]'
N=$(jq .input_tokens <<<"$BODY")
req "messages, max_tokens 1" 200 "${X[@]}" "$U/v1/messages" -d "$(jq -c '.max_tokens = 1' <<<"$CT")"
expect_eq "count_tokens equals the request's usage.input_tokens" "$(jq .usage.input_tokens <<<"$BODY")" "$N"
expect_eq "count_tokens: nothing of it was cached" "$(jq .usage.cache_read_input_tokens <<<"$BODY")" 0
req "count_tokens: unknown model" 404 "${X[@]}" "$U/v1/messages/count_tokens" -d "$(jq -c '.model = "nope"' <<<"$CT")"
expect_has "count_tokens 404 in Anthropic's shape" "$BODY" '{"type":"error","error":{"type":"not_found_error"'
req "count_tokens: no messages" 400 "${X[@]}" "$U/v1/messages/count_tokens" -d '{"model":"kjv"}'
expect_has "count_tokens 400 in Anthropic's shape" "$BODY" '{"type":"error","error":{"type":"invalid_request_error"'
req "count_tokens: wrong key" 401 -H "x-api-key: sk-nope" "$U/v1/messages/count_tokens" -d "$CT"
expect_has "count_tokens 401 in Anthropic's shape" "$BODY" '"authentication_error"'
req "count_tokens: GET" 405 "${X[@]}" "$U/v1/messages/count_tokens"
# (8: the SDK client's seven messages.countTokens above, then this one)
expect_has "count_tokens: metrics" "$(metrics_text "$KS_URL")" \
    'kvseal_requests_total{route="messages_count_tokens",status="200"} 8'
# the tokens count against the tenant's tokens per minute (10): the prompt is more
req "count_tokens: the key's token limit" 429 -H "x-api-key: sk-tiny" "$U/v1/messages/count_tokens" -d "$CT"

# ---- Workers AI: the run route, with and without /client/v4
RUN='{"prompt":"In the beginning","max_tokens":20,"temperature":0}'
req "workers run" 200 "${A[@]}" "$U/accounts/acct1/ai/run/kjv" -d "$RUN"
W=$BODY
expect_has "workers run envelope" "$W" '"success":true,"errors":[],"messages":[]}'
req "workers run under /client/v4" 200 "${A[@]}" "$U/client/v4/accounts/acct1/ai/run/kjv" -d "$RUN"
expect_eq "workers run under /client/v4" "$BODY" "$W"
# ---- the OpenAI-compatible route: OpenAI's answer, the chat route's text
CHAT='{"model":"kjv","messages":[{"role":"user","content":"In the beginning"}],"max_tokens":60,"temperature":0}'
for P in "" /client/v4; do
    req "workers v1 chat ($P)" 200 "${A[@]}" "$U$P/accounts/acct1/ai/v1/chat/completions" -d "$CHAT"
    expect_eq "workers v1 chat object ($P)" "$(jq -r .object <<<"$BODY")" chat.completion
    expect_eq "workers v1 chat text ($P)" "$(jq -c '.choices[0].message.content' <<<"$BODY")" "$REF"
    curl -sSN "${A[@]}" "$U$P/accounts/acct1/ai/v1/chat/completions" -o "$TMPD/sse" \
        -d "${CHAT%\}},\"stream\":true}" || fail "workers v1 chat stream curl"
    expect_eq "workers v1 chat stream ($P)" \
        "$(sed -n 's/^data: {/{/p' "$TMPD/sse" | jq -sc '[.[].choices[0].delta.content // empty] | join("")')" "$REF"
    expect_eq "workers v1 chat [DONE] ($P)" "$(grep '^data: ' "$TMPD/sse" | tail -1)" "data: [DONE]"
done
# ---- refusals in Cloudflare's envelope, each with its mapped code
V1=$U/client/v4/accounts/acct1/ai/v1/chat/completions
env_code() { jq -c '[.success, .result, (.errors[0].code), (.messages | length)]' <<<"$BODY"; }
req "v1 chat: unknown model" 404 "${A[@]}" "$V1" -d '{"model":"@cf/meta/llama-3.1-8b-instruct","messages":[{"role":"user","content":"x"}]}'
expect_eq "unknown model: 3042" "$(env_code)" '[false,null,3042,0]'
expect_has "unknown model: message" "$BODY" "The model '@cf/meta/llama-3.1-8b-instruct' does not exist"
req "v1 chat: bad temperature" 400 "${A[@]}" "$V1" -d '{"model":"kjv","messages":[{"role":"user","content":"x"}],"temperature":"hot"}'
expect_eq "bad input: 5006" "$(env_code)" '[false,null,5006,0]'
req "v1 chat: malformed JSON" 400 "${A[@]}" "$V1" -d '{"model":'
expect_eq "malformed JSON: 5006" "$(env_code)" '[false,null,5006,0]'
req "v1 chat: no messages" 400 "${A[@]}" "$V1" -d '{"model":"kjv"}'
expect_eq "missing field: 3003" "$(env_code)" '[false,null,3003,0]'
req "v1 chat: wrong key" 401 -H "Authorization: Bearer sk-nope" "$V1" -d "$CHAT"
expect_eq "authentication: 10000" "$(env_code)" '[false,null,10000,0]'
req "run: the key's rate limit" 429 -H "Authorization: Bearer sk-tiny" "$U/client/v4/accounts/a/ai/run/kjv" -d "$RUN"
expect_eq "rate limit: 3036" "$(env_code)" '[false,null,3036,0]'
req "embeddings: input missing" 400 "${A[@]}" "$U/accounts/acct1/ai/v1/embeddings" -d '{}'
expect_eq "embeddings input missing: 3003" "$(env_code)" '[false,null,3003,0]'
req "embeddings" 200 "${A[@]}" "$U/client/v4/accounts/acct1/ai/v1/embeddings" -d '{"input":"In the beginning"}'
expect_has "embeddings answer" "$BODY" '"embedding":['
req "unknown url" 404 "${A[@]}" "$U/accounts/acct1/ai/v1/nothing" -d '{}'
expect_eq "unknown url: 404" "$(env_code)" '[false,null,404,0]'
req "offline" 200 -H "Authorization: Bearer adm-anthropic-0001" -X POST "$U/admin/models/kjv/offline"
req "run while offline" 503 "${A[@]}" "$U/accounts/a/ai/run/kjv" -d "$RUN"
expect_eq "offline: 3040" "$(env_code)" '[false,null,3040,0]'
req "v1 chat while offline" 503 "${A[@]}" "$V1" -d "$CHAT"
expect_eq "offline v1: 3040" "$(env_code)" '[false,null,3040,0]'
req "messages while offline" 503 "${A[@]}" "$U/v1/messages" -d '{"model":"kjv","max_tokens":4,"messages":[{"role":"user","content":"x"}]}'
expect_has "messages offline: overloaded_error" "$BODY" '{"type":"error","error":{"type":"overloaded_error"'
req "online" 200 -H "Authorization: Bearer adm-anthropic-0001" -X POST "$U/admin/models/kjv/online"
req "run after" 200 "${A[@]}" "$U/accounts/a/ai/run/kjv" -d "$RUN"
expect_eq "run after" "$BODY" "$W"
stop_server

# ---- once through the cluster: the router is the HTTP front
CLUSTER_PROBE_AUTH=sk-anth-1 ROUTER_ARGS="--tenants $TMPD/tenants.json ${OPTS[*]}" \
    start_cluster "$TMPD/c" 1 1 -m "$M"
KS_URL=$KS_URL KS_KEY=sk-anth-1 KS_MODEL_NAME=kjv KS_MODE=cluster KS_REF=$(jq -r . <<<"$REF") \
    node "$JS" || fail "anthropic client checks through the cluster failed"
req "cluster: workers v1 chat" 200 "${A[@]}" "$KS_URL/client/v4/accounts/a/ai/v1/chat/completions" -d "$CHAT"
expect_eq "cluster: workers v1 chat text" "$(jq -c '.choices[0].message.content' <<<"$BODY")" "$REF"
stop_cluster
echo "anthropic ok"
