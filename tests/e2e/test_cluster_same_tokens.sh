#!/usr/bin/env bash
# Disaggregated serving gives the same tokens as `kvseal serve`: 16
# concurrent requests (greedy and seeded sampling, streamed and not, stop
# strings, logprobs), then issue 12's features (grammars, JSON schemas,
# logit_bias, penalties, n, best_of, forced tool calls: js/same_tokens.mjs,
# and echo with prompt logprobs)
# through router + 1 prefill + 1 decode must equal the monolithic server's
# answers exactly; then the workers are checked idle and clean (every KV page
# FREE and scrubbed, on every worker).
. "$(dirname "$0")/lib.sh"
command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs it)"
# tool calls need a chat template (kjv-mini has none) and a call format
printf '%s' '{{- bos_token }}{% for m in messages %}{% if m.role == "user" %}User: {{ m.content }}
Assistant:{% endif %}{% endfor %}' >"$TMPD/plain.jinja"
ARGS=(-m "$KS_SRC/models/kjv-mini.gguf" --alias kjv-mini --ctx 512 --kv-pages 128 --threads 2
      --chat-template-file "$TMPD/plain.jinja" --tool-call-format hermes)
start_server "$TMPD/serve.log" "${ARGS[@]}"
URL_A=$KS_URL; SERVE_PID=$KS_PID
ROUTER_ARGS="--admin-key adm-same-0123456789" start_cluster "$TMPD/c" 1 1 "${ARGS[@]}"
trap 'kill -KILL $SERVE_PID $KS_PID "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}" 2>/dev/null; rm_tmpd' EXIT
SAME_FEATURES=1 URL_A=$URL_A URL_B=$KS_URL node "$(dirname "$0")/js/same_tokens.mjs" || { tail -n 20 $KS_CLUSTER_LOGS >&2; fail "outputs differ"; }
chk=$(curl -sS -H "Authorization: Bearer adm-same-0123456789" "$KS_URL/admin/kv/check?timeout_ms=$((KS_WAIT_S * 1000))")
expect_has "cluster pool check" "$chk" '"clean":true'
expect_has "cluster pool check names the workers" "$chk" "decode worker"
# echo with prompt logprobs (PROMPT_LP from the prefill worker): the same
# answer as serve's, byte for byte (test_sampling covers more cases)
for u in "$URL_A" "$KS_URL"; do
    req "echo" 200 "$u/v1/completions" -H 'Content-Type: application/json' \
        -d '{"model":"kjv-mini","prompt":"In the beginning","max_tokens":2,"echo":true,"logprobs":2,"temperature":0}'
    printf '%s' "$BODY" | sed 's/"id":"[^"]*"//; s/"created":[0-9]*//' >"$TMPD/echo.$([ "$u" = "$URL_A" ] && echo a || echo b)"
done
expect_has "echo has prompt logprobs" "$(cat "$TMPD/echo.b")" '"token_logprobs":[null,'
cmp -s "$TMPD/echo.a" "$TMPD/echo.b" || fail "echo differs: $(cat "$TMPD/echo.a") vs $(cat "$TMPD/echo.b")"
stop_cluster
KS_PID=$SERVE_PID stop_server
echo "PASS"
