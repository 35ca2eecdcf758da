#!/usr/bin/env bash
# test_serve_tools.sh — chat tool fields and the reasoning split through the
# real `kvseal serve` on kjv-mini (issue 12, src/server/toolcall.c), with the
# official openai npm client (js/tools_client.mjs) and curl:
# - --tool-call-format hermes: requests with tools (auto, none,
#   parallel_tool_calls false) answer the model's plain continuation as
#   content, no tool_calls, finish_reason as without tools, streamed or not;
#   tool_choice "required" / a named function constrain decoding to one call
#   that comes back in message.tool_calls / delta.tool_calls with
#   finish_reason "tool_calls", also with n > 1 (each choice through its own
#   parser, choice i equal to the n = 1 answer seeded seed + i) and through
#   the npm client's runTools loop; malformed tool fields are 400s naming
#   them;
# - --reasoning-format deepseek: an answer that starts inside a think block
#   (the prompt ends with <think>) is reasoning_content, equal to the
#   completions route's text for the same prompt (every choice of n = 2 too);
#   other answers stay content;
# - both client runs again through a cluster (router + 1 prefill + 1 decode).
. "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl is not installed (scripts/install-deps.sh)"
command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs it)"
[ -d "$(dirname "$0")/js/node_modules/openai" ] || skip "the openai npm package is not installed (scripts/install-deps.sh)"
JS=$(dirname "$0")/js/tools_client.mjs

# tools need a chat template (kjv-mini has none): one that renders the
# plain format kjv-mini answers REF to, and leaves the tools out
printf '%s' '{{- bos_token }}{% for m in messages %}{% if m.role == "user" %}User: {{ m.content }}
Assistant:{% endif %}{% endfor %}' >"$TMPD/plain.jinja"
start_server "$TMPD/tools.log" --alias kjv --tool-call-format hermes --chat-template-file "$TMPD/plain.jinja"
expect_has "format logged" "$(cat "$TMPD/tools.log")" "tool calls in format hermes"
KS_URL=$KS_URL KS_MODEL_NAME=kjv KS_MODE=tools node "$JS" || fail "tools client checks failed"
U=$KS_URL
J=(-H "Content-Type: application/json")
MSG='"model":"kjv","messages":[{"role":"user","content":"In"}],"max_tokens":2'
req "tools not an array" 400 "${J[@]}" "$U/v1/chat/completions" -d "{$MSG,\"tools\":{}}"
expect_has "tools not an array" "$BODY" '"param":"tools","code":"invalid_parameter"'
req "bad function name" 400 "${J[@]}" "$U/v1/chat/completions" \
    -d "{$MSG,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}"
expect_has "bad function name" "$BODY" '"param":"tools[0].function.name"'
req "tool_choice unknown" 400 "${J[@]}" "$U/v1/chat/completions" -d "{$MSG,\"tool_choice\":\"maybe\"}"
expect_has "tool_choice unknown" "$BODY" '"param":"tool_choice","code":"invalid_parameter"'
req "parallel_tool_calls type" 400 "${J[@]}" "$U/v1/chat/completions" -d "{$MSG,\"parallel_tool_calls\":\"no\"}"
expect_has "parallel_tool_calls type" "$BODY" '"param":"parallel_tool_calls"'
req "completions has no tools" 400 "${J[@]}" "$U/v1/completions" -d '{"model":"kjv","prompt":"In","tools":[]}'
expect_has "completions has no tools" "$BODY" '"param":"tools","code":"unsupported_parameter"'
stop_server

start_server "$TMPD/reasoning.log" --alias kjv --reasoning-format deepseek
expect_has "reasoning logged" "$(cat "$TMPD/reasoning.log")" "reasoning split at <think></think>"
KS_URL=$KS_URL KS_MODEL_NAME=kjv KS_MODE=reasoning node "$JS" || fail "reasoning client checks failed"
stop_server

# the same client checks through the cluster router, which renders the
# template and parses the answers (the workers see token ids only)
M=(-m "$KS_SRC/models/kjv-mini.gguf" --alias kjv)
start_cluster "$TMPD/ct" 1 1 "${M[@]}" --tool-call-format hermes --chat-template-file "$TMPD/plain.jinja"
KS_URL=$KS_URL KS_MODEL_NAME=kjv KS_MODE=tools node "$JS" || fail "tools client checks through the cluster failed"
stop_cluster
start_cluster "$TMPD/cr" 1 1 "${M[@]}" --reasoning-format deepseek
KS_URL=$KS_URL KS_MODEL_NAME=kjv KS_MODE=reasoning node "$JS" ||
    fail "reasoning client checks through the cluster failed"
stop_cluster
echo "tools ok"
