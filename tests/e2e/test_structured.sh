#!/usr/bin/env bash
# Structured output through `kvseal serve` (issue 12 section 3): the official
# openai npm client (tests/e2e/js/structured.mjs: json_schema, json_object,
# parse, streaming, grammar, refusals), then curl for what the client does
# not reach: the raw error bodies, a grammar above the size limit, and
# Workers AI refusing the fields it does not implement; then the client
# checks again through router + prefill + decode workers.
. "$(dirname "$0")/lib.sh"
command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs it)"
[ -d "$(dirname "$0")/js/node_modules/openai" ] || skip "the openai npm package is not installed (scripts/install-deps.sh)"
echo '{"tenants":[{"name":"acme","keys":["sk-acme-test"],"max_concurrent":8,"tokens_per_minute":100000000}]}' >"$TMPD/t.json"
start_server "$TMPD/server.log" --alias @cf/kvseal/kjv-mini --tenants "$TMPD/t.json"
KS_URL=$KS_URL KS_KEY=sk-acme-test KS_MODEL_NAME=@cf/kvseal/kjv-mini node "$(dirname "$0")/js/structured.mjs" ||
    fail "structured output checks failed"

H=(-H "Authorization: Bearer sk-acme-test" -H "Content-Type: application/json")
# curl: a schema with an enum and a number, greedy
req "curl json_schema" 200 "${H[@]}" "$KS_URL/v1/chat/completions" -d '{"model":"@cf/kvseal/kjv-mini",
  "messages":[{"role":"user","content":"Hi"}],"max_tokens":100,"temperature":0,
  "response_format":{"type":"json_schema","json_schema":{"name":"t","strict":true,"schema":{"type":"object",
  "properties":{"k":{"enum":["a","b"]},"x":{"type":"number"}},"required":["k","x"],"additionalProperties":false}}}}'
content=$(printf '%s' "$BODY" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const c=JSON.parse(JSON.parse(s).choices[0].message.content);if(!["a","b"].includes(c.k)||typeof c.x!=="number"||Object.keys(c).length!==2)process.exit(1);console.log("ok")})') ||
    fail "curl json_schema: invalid content: $BODY"
expect_eq "curl json_schema" "$content" "ok"
# the error shape, with the parameter named
req "unsupported keyword" 400 "${H[@]}" "$KS_URL/v1/chat/completions" -d '{"model":"@cf/kvseal/kjv-mini",
  "messages":[{"role":"user","content":"Hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"t",
  "schema":{"type":"object","properties":{"a":{"type":"string","pattern":"x"}}}}}}'
expect_has "unsupported keyword" "$BODY" '"param":"response_format.json_schema.schema"'
expect_has "unsupported keyword" "$BODY" "unsupported keyword 'pattern'"
expect_has "unsupported keyword" "$BODY" '/properties/a'
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
curl -fsS "$KS_URL/health" >/dev/null || fail "server unhealthy after the structured output checks"
stop_server

# the same client checks through the cluster: the grammar travels to the
# prefill worker (first token) and the decode worker (the rest)
CLUSTER_PROBE_AUTH=sk-acme-test CLUSTER_PROBE_MODEL=@cf/kvseal/kjv-mini \
    start_cluster "$TMPD/c" 1 1 -m "$KS_SRC/models/kjv-mini.gguf" --alias @cf/kvseal/kjv-mini --tenants "$TMPD/t.json"
KS_URL=$KS_URL KS_KEY=sk-acme-test KS_MODEL_NAME=@cf/kvseal/kjv-mini node "$(dirname "$0")/js/structured.mjs" ||
    fail "structured output checks through the cluster failed"
stop_cluster
echo "structured ok"
