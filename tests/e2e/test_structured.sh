#!/usr/bin/env bash
# Structured output through `kvseal serve` (issue 12 section 3): the official
# openai npm client (tests/e2e/js/structured.mjs: json_schema, json_object,
# parse, streaming, grammar, refusals), then curl for what the client does
# not reach: the raw error bodies, generation under pattern, numeric bounds
# and formats checked by an independent validator (schema_check.py), a
# grammar above the size limit, and
# Workers AI refusing the fields it does not implement, and the grammar
# refusals of issue 38 (too ambiguous, tool schemas the compiler refuses);
# then the client checks again through router + prefill + decode workers.
# Without node and the openai package only the curl checks run.
. "$(dirname "$0")/lib.sh"
have_client=1
command -v node >/dev/null || { have_client=0; echo "(node is not installed: the openai client checks are skipped; scripts/install-deps.sh installs it)"; }
[ $have_client = 1 ] && [ ! -d "$(dirname "$0")/js/node_modules/openai" ] &&
    { have_client=0; echo "(the openai npm package is not installed: the client checks are skipped; scripts/install-deps.sh)"; }
echo '{"tenants":[{"name":"acme","keys":["sk-acme-test"],"max_concurrent":8,"tokens_per_minute":100000000}]}' >"$TMPD/t.json"
start_server "$TMPD/server.log" --alias @cf/kvseal/kjv-mini --tenants "$TMPD/t.json"
if [ $have_client = 1 ]; then
    KS_URL=$KS_URL KS_KEY=sk-acme-test KS_MODEL_NAME=@cf/kvseal/kjv-mini node "$(dirname "$0")/js/structured.mjs" ||
        fail "structured output checks failed"
fi

H=(-H "Authorization: Bearer sk-acme-test" -H "Content-Type: application/json")
# curl: a schema with an enum and a number, greedy
req "curl json_schema" 200 "${H[@]}" "$KS_URL/v1/chat/completions" -d '{"model":"@cf/kvseal/kjv-mini",
  "messages":[{"role":"user","content":"Hi"}],"max_tokens":100,"temperature":0,
  "response_format":{"type":"json_schema","json_schema":{"name":"t","strict":true,"schema":{"type":"object",
  "properties":{"k":{"enum":["a","b"]},"x":{"type":"number"}},"required":["k","x"],"additionalProperties":false}}}}'
content=$(printf '%s' "$BODY" | jq -r '.choices[0].message.content | fromjson | select((.k == "a" or .k == "b") and (.x | type) == "number" and (keys | length) == 2) | "ok"') ||
    fail "curl json_schema: invalid content: $BODY"
expect_eq "curl json_schema" "$content" "ok"
# the error shape, with the parameter named
req "unsupported keyword" 400 "${H[@]}" "$KS_URL/v1/chat/completions" -d '{"model":"@cf/kvseal/kjv-mini",
  "messages":[{"role":"user","content":"Hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"t",
  "schema":{"type":"object","properties":{"a":{"type":"integer","multipleOf":2}}}}}}'
expect_has "unsupported keyword" "$BODY" '"param":"response_format.json_schema.schema"'
expect_has "unsupported keyword" "$BODY" "unsupported keyword 'multipleOf'"
expect_has "unsupported keyword" "$BODY" '/properties/a'
# pattern, numeric bounds and formats: what kjv-mini generates under them
# validates (tests/e2e/schema_check.py: Python's re, datetime, ipaddress),
# greedy and sampled over three seeds
kw_schema='{"type":"object","properties":{
  "code":{"type":"string","pattern":"^[A-Z]{2}-\\d{3}(x|yz)?$"},
  "q":{"type":"string","pattern":"\"[^\"]{0,3}\\\\"},
  "n":{"type":"integer","minimum":-20,"maximum":20},
  "big":{"type":"integer","exclusiveMinimum":999,"maximum":100000},
  "r":{"type":"number","minimum":-1.5,"exclusiveMaximum":2},
  "d":{"type":"string","format":"date"},"t":{"type":"string","format":"date-time"},
  "e":{"type":"string","format":"email"},"ip":{"type":"string","format":"ipv4"},
  "u":{"type":"string","format":"uuid"}},
  "required":["code","q","n","big","r","d","t","e","ip","u"],"additionalProperties":false}'
kw_files=()
for run in "0 0" "1 1" "1 2" "1 3"; do
    set -- $run
    req "keywords t=$1 seed=$2" 200 "${H[@]}" "$KS_URL/v1/chat/completions" -d "{\"model\":\"@cf/kvseal/kjv-mini\",
      \"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":500,\"temperature\":$1,\"seed\":$2,
      \"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"k\",\"schema\":$kw_schema}}}"
    printf '%s' "$BODY" >"$TMPD/kw_$1_$2.json"
    kw_files+=("$TMPD/kw_$1_$2.json")
done
python3 "$(dirname "$0")/schema_check.py" "${kw_files[@]}" || fail "keywords: an answer does not validate"
# a pattern outside the subset: refused with the construct and its offset
req "pattern refused" 400 "${H[@]}" "$KS_URL/v1/chat/completions" -d '{"model":"@cf/kvseal/kjv-mini",
  "messages":[{"role":"user","content":"Hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"t",
  "schema":{"type":"object","properties":{"a":{"type":"string","pattern":"^(?=x)y$"}}}}}}'
expect_has "pattern refused" "$BODY" '"param":"response_format.json_schema.schema"'
expect_has "pattern refused" "$BODY" "pattern: a lookahead at offset 1 is not supported"
req "unknown json_schema key" 400 "${H[@]}" "$KS_URL/v1/completions" -d '{"model":"@cf/kvseal/kjv-mini",
  "prompt":"Hi","response_format":{"type":"json_schema","json_schema":{"name":"t","schema":{},"frob":1}}}'
expect_has "unknown json_schema key" "$BODY" '"param":"response_format.json_schema.frob"'
# a grammar above the size limit (256 KiB) is refused before any work
big=$(head -c 300000 /dev/zero | tr '\0' ' ')
printf '{"model":"@cf/kvseal/kjv-mini","prompt":"Hi","grammar":"root ::= \\"a\\"%s"}' "$big" >"$TMPD/big.json"
req "grammar too large" 400 "${H[@]}" "$KS_URL/v1/completions" --data-binary @"$TMPD/big.json"
expect_has "grammar too large" "$BODY" '"param":"grammar"'
expect_has "grammar too large" "$BODY" 'above the limit'
# a pathological grammar is bounded: many rules of nested repetitions
g='root ::= a{0,1000}'
for i in $(seq 1 30); do g="$g b$i"; done
for i in $(seq 1 30); do g="$g\\nb$i ::= \\\"x\\\"{0,1000}"; done
req "too many rules" 400 "${H[@]}" "$KS_URL/v1/completions" -d "{\"model\":\"@cf/kvseal/kjv-mini\",\"prompt\":\"Hi\",\"grammar\":\"$g\\na ::= \\\"y\\\"\"}"
expect_has "too many rules" "$BODY" 'more than 20000 rules'
# Workers AI has no response_format here
req "workers" 400 "${H[@]}" "$KS_URL/accounts/x/ai/run/@cf/kvseal/kjv-mini" -d '{"prompt":"Hi","grammar":"root ::= \"a\""}'
expect_has "workers" "$BODY" 'grammar'
# issue 38: one character that opens more parses than the matcher's
# bounds is refused at compile time, with the rule named (it used to be
# accepted, then every token refused: an empty answer)
g='root ::= \"x\" big | \"\"\nbig ::= '
for i in $(seq 0 1099); do g="$g$([ $i = 0 ] || echo ' | ')\\\"$((i % 10))\\\" r$((i % 7))"; done
for i in $(seq 0 6); do g="$g\\nr$i ::= \\\"$i\\\""; done
printf '{"model":"@cf/kvseal/kjv-mini","prompt":"Hi","max_tokens":4,"grammar":"%s"}' "$g" >"$TMPD/amb.json"
req "too ambiguous" 400 "${H[@]}" "$KS_URL/v1/completions" --data-binary @"$TMPD/amb.json"
expect_has "too ambiguous" "$BODY" '"param":"grammar"'
expect_has "too ambiguous" "$BODY" "too ambiguous: in rule 'root'"
# a grammar no token of the vocabulary can continue is the request's fault:
# a 400 naming it, not a 500 (a lone surrogate: no UTF-8 text spells it)
req "no token can satisfy" 400 "${H[@]}" "$KS_URL/v1/completions" \
    -d '{"model":"@cf/kvseal/kjv-mini","prompt":"Hi","max_tokens":4,"grammar":"root ::= \"\\uD800\""}'
expect_has "no token can satisfy" "$BODY" 'no token of the vocabulary can continue'
curl -fsS "$KS_URL/health" >/dev/null || fail "server unhealthy after the structured output checks"
stop_server
# a tool schema the compiler refuses, with tool_choice required (or
# Anthropic's "any"), is refused as response_format's is; it used to become
# "any object" and yield {} against 'required' (a template and a
# tool-call format, as kjv-mini has none)
cat >"$TMPD/t.jinja" <<'EOF'
{{- bos_token }}{% for m in messages %}{% if m.role == "user" %}User: {{ m.content }}
Assistant:{% elif m.role == "assistant" %}{{ m.content }}
{% endif %}{% endfor %}
EOF
start_server "$TMPD/tools.log" --alias @cf/kvseal/kjv-mini --tenants "$TMPD/t.json" \
    --tool-call-format hermes --chat-template-file "$TMPD/t.jinja"
tools='[{"type":"function","function":{"name":"get","parameters":{"type":"object","properties":{"city":{"type":"string","pattern":"^[A-Z]"},"n":{"type":"integer","multipleOf":2}},"required":["city"]}}}]'
req "tool schema refused" 400 "${H[@]}" "$KS_URL/v1/chat/completions" -d "{\"model\":\"@cf/kvseal/kjv-mini\",
  \"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":30,\"tools\":$tools,\"tool_choice\":\"required\"}"
expect_has "tool schema refused" "$BODY" '"param":"tools[0].function.parameters"'
expect_has "tool schema refused" "$BODY" "unsupported keyword 'multipleOf'"
req "tool schema auto" 200 "${H[@]}" "$KS_URL/v1/chat/completions" -d "{\"model\":\"@cf/kvseal/kjv-mini\",
  \"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":4,\"tools\":$tools,\"tool_choice\":\"auto\"}"
req "input_schema refused" 400 -H "x-api-key: sk-acme-test" -H "anthropic-version: 2023-06-01" \
  -H "Content-Type: application/json" "$KS_URL/v1/messages" -d '{"model":"@cf/kvseal/kjv-mini",
  "max_tokens":30,"messages":[{"role":"user","content":"Hi"}],"tool_choice":{"type":"any"},
  "tools":[{"name":"get","input_schema":{"type":"object","required":["city"]}}]}'
expect_has "input_schema refused" "$BODY" "required property 'city' is not in 'properties'"
stop_server
[ $have_client = 1 ] || { echo "structured ok (curl checks only)"; exit 0; }

# the same client checks through the cluster: the grammar travels to the
# prefill worker (first token) and the decode worker (the rest)
CLUSTER_PROBE_AUTH=sk-acme-test CLUSTER_PROBE_MODEL=@cf/kvseal/kjv-mini \
    start_cluster "$TMPD/c" 1 1 -m "$KS_SRC/models/kjv-mini.gguf" --alias @cf/kvseal/kjv-mini --tenants "$TMPD/t.json"
KS_URL=$KS_URL KS_KEY=sk-acme-test KS_MODEL_NAME=@cf/kvseal/kjv-mini node "$(dirname "$0")/js/structured.mjs" ||
    fail "structured output checks through the cluster failed"
stop_cluster
echo "structured ok"
