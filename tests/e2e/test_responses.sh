#!/usr/bin/env bash
# test_responses.sh — OpenAI's Responses API (POST /v1/responses, GET and
# DELETE /v1/responses/{id}) through the real `kvseal serve` on kjv-mini,
# and once through a cluster router:
# - the official openai client (js/responses_client.mjs): responses.create
#   and responses.stream, each answer equal to /v1/chat/completions' for the
#   same conversation (greedy); events in order with sequence numbers;
#   retrieve / del / store false; previous_response_id; instructions; a tool
#   round trip (function_call -> function_call_output -> the answer, the
#   same through previous_response_id as with the items sent again);
#   text.format json_schema; errors with the field named;
# - curl: two tenants cannot read, delete or continue each other's
#   responses (the same 404 / 400 as an unknown id); the store's bounds per
#   tenant (count, bytes, age) evict the oldest, and one tenant's responses
#   never evict another's; malformed requests are 400s naming the field; a
#   client that leaves a stream frees its request.
. "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl is not installed (scripts/install-deps.sh)"
command -v jq >/dev/null || skip "jq is not installed"
command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs it)"
JSD=$(dirname "$0")/js
[ -d "$JSD/node_modules/openai" ] || skip "the openai npm package is not installed (scripts/install-deps.sh)"
JS=$JSD/responses_client.mjs
M=$KS_SRC/models/kjv-mini.gguf

# a template that renders every turn a tool round trip has (kjv-mini has none)
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
{"tenants": [{"name": "acme", "keys": ["sk-resp-acme"]},
             {"name": "beta", "keys": ["sk-resp-beta"]}]}
EOF
OPTS=(--alias kjv --tool-call-format hermes --chat-template-file "$TMPD/t.jinja")
start_server "$TMPD/serve.log" -m "$M" "${OPTS[@]}" --tenants "$TMPD/tenants.json" --log-content
KS_URL=$KS_URL KS_KEY=sk-resp-acme KS_MODEL_NAME=kjv KS_MODE=serve node "$JS" >"$TMPD/client.out" ||
    { cat "$TMPD/client.out" >&2; fail "responses client checks failed"; }
REF=$(sed -n 's/^REF=//p' "$TMPD/client.out") # a JSON string
[ -n "$REF" ] || fail "the client printed no reference text"
# the tool's output reached the template, after the call the model made
expect_has "tool output in the prompt" "$(cat "$TMPD/serve.log")" "</tool_call>Tool: sunny in Paris
Assistant:"
expect_has "metrics: responses route" "$(metrics_text "$KS_URL")" \
    'kvseal_requests_total{route="responses",status="200"}'

U=$KS_URL
A=(-H "Authorization: Bearer sk-resp-acme" -H "Content-Type: application/json")
B=(-H "Authorization: Bearer sk-resp-beta" -H "Content-Type: application/json")
BODY1='{"model":"kjv","input":"In the beginning","max_output_tokens":4,"temperature":0}'

# ---- greedy text equals the chat route's (curl, no SDK in between)
req "create" 200 "${A[@]}" "$U/v1/responses" -d "$BODY1"
RID=$(jq -r .id <<<"$BODY")
TXT=$(jq -c '[.output[] | select(.type == "message") | .content[].text] | join("")' <<<"$BODY")
req "chat" 200 "${A[@]}" "$U/v1/chat/completions" \
    -d '{"model":"kjv","messages":[{"role":"user","content":"In the beginning"}],"max_tokens":4,"temperature":0}'
expect_eq "responses text equals chat's" "$TXT" "$(jq -c .choices[0].message.content <<<"$BODY")"

# ---- two tenants: beta cannot read, delete or continue acme's response,
# and gets exactly what an unknown id gets
req "acme reads its own" 200 "${A[@]}" "$U/v1/responses/$RID"
req "beta reads acme's" 404 "${B[@]}" "$U/v1/responses/$RID"
OTHER=${BODY//$RID/ID}
req "beta reads an unknown id" 404 "${B[@]}" "$U/v1/responses/resp_000000000000000000000000"
expect_eq "another tenant's id reads as unknown" "$OTHER" "${BODY//resp_000000000000000000000000/ID}"
req "beta deletes acme's" 404 -X DELETE "${B[@]}" "$U/v1/responses/$RID"
expect_eq "another tenant's delete reads as unknown" "${BODY//$RID/ID}" "$OTHER"
req "beta continues acme's" 400 "${B[@]}" "$U/v1/responses" \
    -d "{\"model\":\"kjv\",\"input\":\"x\",\"max_output_tokens\":2,\"previous_response_id\":\"$RID\"}"
expect_has "continue: code" "$BODY" '"param":"previous_response_id","code":"previous_response_not_found"'
BC=${BODY//$RID/ID}
req "beta continues an unknown id" 400 "${B[@]}" "$U/v1/responses" \
    -d '{"model":"kjv","input":"x","max_output_tokens":2,"previous_response_id":"resp_nope"}'
expect_eq "another tenant's continue reads as unknown" "${BODY//resp_nope/ID}" "$BC"
req "acme still has it" 200 "${A[@]}" "$U/v1/responses/$RID"
req "acme continues it" 200 "${A[@]}" "$U/v1/responses" \
    -d "{\"model\":\"kjv\",\"input\":\"x\",\"max_output_tokens\":2,\"previous_response_id\":\"$RID\"}"
req "acme deletes it" 200 -X DELETE "${A[@]}" "$U/v1/responses/$RID"
expect_eq "delete answer" "$(jq -c . <<<"$BODY")" "{\"id\":\"$RID\",\"object\":\"response\",\"deleted\":true}"
req "gone" 404 "${A[@]}" "$U/v1/responses/$RID"
req "no key" 401 "$U/v1/responses/$RID"
req "PUT" 405 -X PUT "${A[@]}" "$U/v1/responses/$RID"

# ---- malformed requests: 400 naming the field
bad() { # NAME PARAM BODY
    req "$1" 400 "${A[@]}" "$U/v1/responses" -d "$3"
    expect_eq "$1: param" "$(jq -r .error.param <<<"$BODY")" "$2"
}
bad "malformed JSON" null '{"model":'
bad "input missing" input '{"model":"kjv"}'
bad "input a number" input '{"model":"kjv","input":3}'
bad "input empty" input '{"model":"kjv","input":[]}'
bad "item type" "input[1].type" '{"model":"kjv","input":[{"role":"user","content":"x"},{"type":"web_search_call"}]}'
bad "item key" "input[0]" '{"model":"kjv","input":[{"role":"user","content":"x","name":"n"}]}'
bad "content part" "input[0].content[1]" '{"model":"kjv","input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_file","file_id":"f"}]}]}'
bad "call without name" "input[0].name" '{"model":"kjv","input":[{"type":"function_call","call_id":"c","arguments":"{}"}]}'
bad "output not a string" "input[0].output" '{"model":"kjv","input":[{"type":"function_call_output","call_id":"c","output":3}]}'
bad "tool name" "tools[0].name" '{"model":"kjv","input":"x","tools":[{"type":"function"}]}'
bad "tool_choice" tool_choice '{"model":"kjv","input":"x","tool_choice":{"type":"file_search"}}'
bad "text.format" "text.format.type" '{"model":"kjv","input":"x","text":{"format":{"type":"yaml"}}}'
bad "schema" "text.format.schema" '{"model":"kjv","input":"x","text":{"format":{"type":"json_schema","name":"a","schema":{"type":"object","properties":{"a":{"type":"string","pattern":5}}}}}}'
bad "temperature" temperature '{"model":"kjv","input":"x","temperature":9}'
bad "store" store '{"model":"kjv","input":"x","store":"yes"}'
bad "metadata" metadata '{"model":"kjv","input":"x","metadata":{"a":1}}'
bad "truncation" truncation '{"model":"kjv","input":"x","truncation":"auto"}'
bad "unknown field" top_logprobs '{"model":"kjv","input":"x","top_logprobs":2}'

# ---- a client that leaves a stream frees its request (greedy, this answer runs
# to the context: far more than the socket buffers hold)
DIS=$(metric "$U" kvseal_client_disconnects_total)
RAWC_AUTH=sk-resp-acme # rawc_request's key
rawc --rcvbuf 2048 --pause-after 'data: ' --ready "$TMPD/stalled" \
    -o "$TMPD/slow" "${U##*:}" < <(rawc_request /v1/responses \
    '{"model":"kjv","input":"In","temperature":0,"stream":true}') &
CPID=$!
wait_for "the stalled client to stop reading" test -e "$TMPD/stalled"
kill -KILL "$CPID"
wait "$CPID" 2>/dev/null
wait_for "the disconnect to be counted" metric_ge "$U" kvseal_client_disconnects_total $((${DIS:-0} + 1))
wait_for "the cancelled request to leave the batch" metric_is "$U" kvseal_running_requests 0
expect_eq "pages of the cancelled request" "$(metric "$U" 'kvseal_kv_pages{state="allocated"}')" 0
stop_server

# ---- the store's bounds: count per tenant (another tenant's are never
# evicted by it), then bytes, then age
start_server "$TMPD/bounds.log" -m "$M" --alias kjv --tenants "$TMPD/tenants.json" --responses-max 2
U=$KS_URL
req "beta's, the oldest in the store" 200 "${B[@]}" "$U/v1/responses" -d "$BODY1"
BID=$(jq -r .id <<<"$BODY")
ids=()
for i in 1 2 3; do
    req "create $i" 200 "${A[@]}" "$U/v1/responses" -d "$BODY1"
    ids+=("$(jq -r .id <<<"$BODY")")
done
req "the oldest evicted" 404 "${A[@]}" "$U/v1/responses/${ids[0]}"
req "the second kept" 200 "${A[@]}" "$U/v1/responses/${ids[1]}"
req "the newest kept" 200 "${A[@]}" "$U/v1/responses/${ids[2]}"
req "beta's kept" 200 "${B[@]}" "$U/v1/responses/$BID"
# one entry's bytes: the response's JSON and its conversation (the input
# item and the output items); a bound of 2.5 entries holds two, not three
ONE=$(( ${#BODY} + $(jq -c .output <<<"$BODY" | wc -c) + 80 ))
stop_server
start_server "$TMPD/bytes.log" -m "$M" --alias kjv --tenants "$TMPD/tenants.json" \
    --responses-max-bytes $(( ONE * 5 / 2 ))
U=$KS_URL
ids=()
for i in 1 2 3; do
    req "create $i (bytes)" 200 "${A[@]}" "$U/v1/responses" -d "$BODY1"
    ids+=("$(jq -r .id <<<"$BODY")")
done
req "the oldest evicted (bytes)" 404 "${A[@]}" "$U/v1/responses/${ids[0]}"
req "the newest kept (bytes)" 200 "${A[@]}" "$U/v1/responses/${ids[2]}"
stop_server
# age: --responses-ttl 1; the response is there, then gone
start_server "$TMPD/ttl.log" -m "$M" --alias kjv --tenants "$TMPD/tenants.json" --responses-ttl 1
U=$KS_URL
req "create (ttl)" 200 "${A[@]}" "$U/v1/responses" -d "$BODY1"
TID=$(jq -r .id <<<"$BODY")
gone() { [ "$(curl -s -o /dev/null -w '%{http_code}' "${A[@]}" "$U/v1/responses/$TID")" = 404 ]; }
wait_for "the response to expire" gone
stop_server
# --responses-ttl 0 keeps nothing
start_server "$TMPD/none.log" -m "$M" --alias kjv --responses-ttl 0
U=$KS_URL
req "create (none kept)" 200 -H "Content-Type: application/json" "$U/v1/responses" -d "$BODY1"
req "not kept" 404 "$U/v1/responses/$(jq -r .id <<<"$BODY")"
stop_server

# ---- reasoning: an answer inside a think block is a reasoning item, the
# chat route's reasoning_content, its tokens counted as reasoning_tokens
start_server "$TMPD/think.log" -m "$M" --alias kjv --reasoning-format deepseek
U=$KS_URL
J=(-H "Content-Type: application/json")
TB='"model":"kjv","max_output_tokens":24,"temperature":0'
req "chat reasoning" 200 "${J[@]}" "$U/v1/chat/completions" \
    -d '{"model":"kjv","messages":[{"role":"user","content":"<think>\n"}],"max_tokens":24,"temperature":0}'
WANT=$(jq -c .choices[0].message.reasoning_content <<<"$BODY")
[ "$WANT" != null ] && [ "$WANT" != '""' ] || fail "chat answered no reasoning: $BODY"
req "responses reasoning" 200 "${J[@]}" "$U/v1/responses" -d "{$TB,\"input\":\"<think>\\n\"}"
expect_eq "reasoning item" "$(jq -c '[.output[] | .type]' <<<"$BODY")" '["reasoning"]'
expect_eq "reasoning text" "$(jq -c '.output[0].summary[0].text' <<<"$BODY")" "$WANT"
expect_eq "reasoning content" "$(jq -c '.output[0].content[0].text' <<<"$BODY")" "$WANT"
expect_eq "reasoning tokens" "$(jq -c '.usage.output_tokens_details.reasoning_tokens' <<<"$BODY")" \
    "$(jq -c '.usage.output_tokens' <<<"$BODY")"
curl -sSN "${J[@]}" "$U/v1/responses" -d "{$TB,\"stream\":true,\"input\":\"<think>\\n\"}" \
    -o "$TMPD/think.sse" || fail "reasoning stream: curl failed"
expect_eq "streamed reasoning deltas" \
    "$(sed -n 's/^data: //p' "$TMPD/think.sse" | jq -sc '[.[] | select(.type == "response.reasoning_summary_text.delta") | .delta] | join("")')" "$WANT"
expect_eq "streamed reasoning item" "$(sed -n 's/^data: //p' "$TMPD/think.sse" |
    jq -c 'select(.type == "response.output_item.done") | .item.summary[0].text')" "$WANT"
stop_server

# ---- the same client through a cluster router (the store lives there)
start_cluster "$TMPD/c" 1 1 -m "$M" "${OPTS[@]}"
KS_URL=$KS_URL KS_REF=$REF KS_MODEL_NAME=kjv KS_MODE=cluster node "$JS" ||
    fail "responses client checks through the cluster failed"
stop_cluster
echo "responses ok"
