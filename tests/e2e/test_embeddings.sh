#!/usr/bin/env bash
# Issue 13: POST /v1/embeddings, /tokenize, /detokenize and GET
# /v1/models/{id}, through `kvseal serve` and through the cluster (router +
# prefill + decode), driven by the official npm client (embeddings.create,
# models.retrieve: js/embed_client.mjs) and curl. Checks: vectors normalized,
# batch-invariant, equal for text and its ids, base64 == float; errors (empty
# input, bad ids, too long, dimensions, unknown model, wrong key) with
# OpenAI's status and code; tokenize equals `kvseal tokenize`, detokenize
# inverts it; the same vectors from serve and the cluster, bit for bit (the
# router's --pooling carried in EMBED); a prefill worker's REJECT answered as
# serve answers; 100 inputs in one request; a tenant's token rate; a client
# that leaves mid-request (its inputs aborted); and every KV page free and
# scrubbed afterwards (the inputs' pages released).
. "$(dirname "$0")/lib.sh"
command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs it)"
[ -d "$(dirname "$0")/js/node_modules/openai" ] || skip "the openai npm package is not installed (scripts/install-deps.sh)"
MODEL=$KS_SRC/models/kjv-mini.gguf
echo '{"tenants":[{"name":"acme","keys":["sk-acme-test"],"max_concurrent":8,"tokens_per_minute":1000000},
{"name":"tiny","keys":["sk-tiny"],"max_concurrent":8,"tokens_per_minute":20},
{"name":"leave","keys":["sk-leave"],"max_concurrent":8},
{"name":"tokr","keys":["sk-tokr"],"requests_per_minute":3},
{"name":"tokt","keys":["sk-tokt"],"tokens_per_minute":20},
{"name":"tokl","keys":["sk-tokl"],"tokens_per_minute":1000}],"admin_key":"adm-emb-0123456789ab"}' >"$TMPD/t.json"
# (512 inputs of ~100 tokens in left_mid_request: past the default bound of 32768)
ARGS=(-m "$MODEL" --alias kjv-mini --ctx 256 --kv-pages 64 --threads 2 --embed-max-tokens 60000)
AUTH=(-H "Authorization: Bearer sk-acme-test" -H 'Content-Type: application/json')
TEXT='In the beginning God created the heaven and the earth.'

# curl_checks NAME — tokenize/detokenize and the refusals node cannot send
curl_checks() {
    local n=$1 ids want i
    # issue 38: /tokenize and /detokenize count against the tenant's requests
    # and tokens, and are bounded like a prompt (the context, 256 here)
    for i in 1 2 3; do
        req "$n tokenize rate $i" 200 -H "Authorization: Bearer sk-tokr" "$KS_URL/tokenize" -d '{"content":"In"}'
    done
    req "$n tokenize rate 4" 429 -H "Authorization: Bearer sk-tokr" "$KS_URL/tokenize" -d '{"content":"In"}'
    expect_has "$n tokenize rate 4" "$BODY" "limit of 3 requests per minute"
    req "$n detokenize rate" 429 -H "Authorization: Bearer sk-tokr" "$KS_URL/detokenize" -d '{"tokens":[1]}'
    req "$n tokenize tokens 1" 200 -H "Authorization: Bearer sk-tokt" "$KS_URL/tokenize" -d "{\"content\":\"$TEXT\"}"
    req "$n tokenize tokens 2" 429 -H "Authorization: Bearer sk-tokt" "$KS_URL/tokenize" -d "{\"content\":\"$TEXT\"}"
    expect_has "$n tokenize tokens 2" "$BODY" "20 tokens per minute"
    node -e 'console.log(JSON.stringify({content: "In the beginning God created the heaven and the earth. ".repeat(30)}))' \
        >"$TMPD/tlong.json"
    req "$n tokenize past the context" 400 "${AUTH[@]}" "$KS_URL/tokenize" -d @"$TMPD/tlong.json"
    expect_has "$n tokenize past the context" "$BODY" '"code":"context_length_exceeded"'
    head -c 1000000 /dev/zero | tr '\0' 'a' | sed 's/^/{"content":"/; s/$/"}/' >"$TMPD/tmb.json"
    req "$n tokenize 1 MB" 400 "${AUTH[@]}" "$KS_URL/tokenize" --data-binary @"$TMPD/tmb.json"
    expect_has "$n tokenize 1 MB" "$BODY" '"code":"context_length_exceeded"'
    node -e 'console.log(JSON.stringify({tokens: Array(300).fill(1043)}))' >"$TMPD/dlong.json"
    req "$n detokenize past the context" 400 "${AUTH[@]}" "$KS_URL/detokenize" -d @"$TMPD/dlong.json"
    expect_has "$n detokenize past the context" "$BODY" '"code":"context_length_exceeded"'
    # refused for size, charged: an over-long tokenize costs tokl (1000 a
    # minute) what was tokenized, past the context (> 256 tokens)
    local rem
    rem=$(curl -sS -D - -o /dev/null -H "Authorization: Bearer sk-tokl" "$KS_URL/tokenize" -d @"$TMPD/tlong.json" |
        tr -d '\r' | sed -n 's/^x-ratelimit-remaining-tokens: //Ip')
    [ -n "$rem" ] && [ "$rem" -le 760 ] || fail "$n: an over-long tokenize left tokl $rem of 1000 tokens"
    # one embeddings request holds at most --embed-max-tokens (60000) tokens
    node -e 'const t = "In the beginning God created the heaven and the earth. ".repeat(8);
        console.log(JSON.stringify({input: Array.from({length: 700}, () => t)}))' >"$TMPD/e700.json"
    req "$n embeddings past the bound" 400 "${AUTH[@]}" "$KS_URL/v1/embeddings" -d @"$TMPD/e700.json"
    expect_has "$n embeddings past the bound" "$BODY" "60000 tokens"
    want=$("$KS_BIN" tokenize -m "$MODEL" --ids "$TEXT" 2>/dev/null) || fail "kvseal tokenize failed"
    req "$n tokenize" 200 "${AUTH[@]}" "$KS_URL/tokenize" -d "{\"content\":\"$TEXT\",\"add_special\":true}"
    ids=$(node -e 'console.log(JSON.parse(process.argv[1]).tokens.join(" "))' "$BODY")
    expect_eq "$n tokenize == kvseal tokenize" "$ids" "$want"
    want=$("$KS_BIN" tokenize -m "$MODEL" --ids --no-bos "$TEXT" 2>/dev/null)
    req "$n tokenize (no BOS, llama.cpp's default)" 200 "${AUTH[@]}" "$KS_URL/tokenize" -d "{\"content\":\"$TEXT\"}"
    expect_eq "$n tokenize no BOS" "$(node -e 'console.log(JSON.parse(process.argv[1]).tokens.join(" "))' "$BODY")" "$want"
    req "$n tokenize pieces" 200 "${AUTH[@]}" "$KS_URL/tokenize" -d '{"content":"In the beginning","with_pieces":true}'
    expect_eq "$n pieces join to the text" \
        "$(node -e 'console.log(JSON.parse(process.argv[1]).tokens.map(t=>t.piece).join("").trim())' "$BODY")" "In the beginning"
    expect_has "$n pieces carry ids" "$BODY" '"id":'
    local arr="[${want// /,}]"
    req "$n detokenize" 200 "${AUTH[@]}" "$KS_URL/detokenize" -d "{\"tokens\":$arr}"
    expect_eq "$n detokenize inverts tokenize" "$BODY" "{\"content\":\"$TEXT\"}"
    req "$n detokenize bad id" 400 "${AUTH[@]}" "$KS_URL/detokenize" -d '{"tokens":[1,99999999]}'
    expect_has "$n bad id named" "$BODY" 'tokens[1]: token id 99999999 is out of range'
    req "$n detokenize negative id" 400 "${AUTH[@]}" "$KS_URL/detokenize" -d '{"tokens":[-3]}'
    req "$n tokenize without a key" 401 -H 'Content-Type: application/json' "$KS_URL/tokenize" -d '{"content":"x"}'
    req "$n detokenize wrong key" 401 -H 'Authorization: Bearer sk-no' "$KS_URL/detokenize" -d '{"tokens":[1]}'
    req "$n tokenize no content" 400 "${AUTH[@]}" "$KS_URL/tokenize" -d '{"add_special":true}'
    expect_has "$n missing content" "$BODY" '"param":"content"'
    req "$n embeddings no input" 400 "${AUTH[@]}" "$KS_URL/v1/embeddings" -d '{"model":"kjv-mini"}'
    req "$n embeddings mixed input" 400 "${AUTH[@]}" "$KS_URL/v1/embeddings" -d '{"input":["a",[1,2]]}'
    req "$n embeddings bad format" 400 "${AUTH[@]}" "$KS_URL/v1/embeddings" -d '{"input":"a","encoding_format":"int8"}'
    # 100 inputs: more than the engine's queue (64) holds at once, answered in order
    node -e 'const t = ["In the beginning", "And God said"]; console.log(JSON.stringify({input:
        Array.from({length: 100}, (_, i) => t[i % 2]), encoding_format: "float"}))' >"$TMPD/many.json"
    req "$n 100 inputs" 200 "${AUTH[@]}" "$KS_URL/v1/embeddings" -d @"$TMPD/many.json"
    node -e '
const d = JSON.parse(require("fs").readFileSync(process.argv[1])).data;
const eq = (a, b) => a.every((v, i) => v === b[i]);
if (d.length !== 100 || !d.every((x, i) => x.index === i)) throw new Error("100: order");
if (!d.every((x, i) => eq(x.embedding, d[i % 2].embedding))) throw new Error("100: a repeated input differs");
if (eq(d[0].embedding, d[1].embedding)) throw new Error("100: two inputs agree");
' "$TMPD/body" || fail "$n: 100 inputs"
    # the tenant's token rate counts the inputs' tokens: 4 x 6 tokens > 20 a minute
    req "$n token rate" 429 -H "Authorization: Bearer sk-tiny" -H 'Content-Type: application/json' \
        "$KS_URL/v1/embeddings" -d '{"input":["In the beginning God","In the beginning God","In the beginning God","In the beginning God"]}'
    expect_has "$n rate limited" "$BODY" 'rate'
    req "$n models/{id}" 200 "${AUTH[@]}" "$KS_URL/v1/models/kjv-mini"
    expect_has "$n model object" "$BODY" '"id":"kjv-mini","object":"model"'
    req "$n models/{id} unknown" 404 "${AUTH[@]}" "$KS_URL/v1/models/nope"
    expect_has "$n model_not_found" "$BODY" '"code":"model_not_found"'
    req "$n models/{id} POST" 405 "${AUTH[@]}" -X POST "$KS_URL/v1/models/kjv-mini"
}

# left_mid_request NAME — a client that leaves while its 512 inputs are
# computed: once the server reports the first of them finished, the client
# goes; the rest are cancelled (an aborted outcome), and once idle every page
# is free and scrubbed; the server then answers the next request. Each input
# stays under the cluster's prefill context (128 tokens).
left_mid_request() {
    local n=$1 fin ab pid
    node -e 'const t = "In the beginning God created the heaven and the earth. ".repeat(8);
        console.log(JSON.stringify({input: Array.from({length: 512}, () => t)}))' >"$TMPD/big.json"
    fin=$(metric "$KS_URL" 'kvseal_engine_requests_total{outcome="finished"}')
    ab=$(metric "$KS_URL" 'kvseal_engine_requests_total{outcome="aborted"}')
    curl -sS "${AUTH[@]}" "$KS_URL/v1/embeddings" -d @"$TMPD/big.json" -o "$TMPD/big.out" 2>/dev/null &
    pid=$!
    wait_for "$n: the first of the 512 inputs to finish" \
        metric_ge "$KS_URL" 'kvseal_engine_requests_total{outcome="finished"}' $((${fin:-0} + 1))
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    [ -s "$TMPD/big.out" ] && fail "$n: all 512 inputs were answered before the client could leave"
    wait_for "$n: the abandoned inputs to be aborted" \
        metric_ge "$KS_URL" 'kvseal_engine_requests_total{outcome="aborted"}' $((${ab:-0} + 1))
    kv_clean "$n after a client left"
    req "$n after a client left" 200 "${AUTH[@]}" "$KS_URL/v1/embeddings" -d "{\"input\":\"$TEXT\"}"
}

# clients_leave_together NAME — 4 clients, each with 2048 inputs (16 in
# flight), leave at once, 6 times over: the sweeper walks each one's 2048
# inputs to cancel them while the cancellations it already made resume that
# client's connection, whose thread then frees the request (a use after free
# in the sweeper until the request left the sweeper's list before any of it
# was freed), and a client whose inputs in flight had all finished when the
# sweeper cancelled them must get no more inputs computed (it got all 2048).
# Every request ends and the server goes on answering.
clients_leave_together() {
    local n=$1 base dis fin round k pids
    node -e 'console.log(JSON.stringify({input: Array(2048).fill("In the beginning God created the heaven and the earth.")}))' \
        >"$TMPD/many2048.json"
    base=$(metric "$KS_URL" kvseal_generations_inflight)
    for round in 1 2 3 4 5 6; do
        dis=$(metric "$KS_URL" kvseal_client_disconnects_total)
        fin=$(metric "$KS_URL" 'kvseal_engine_requests_total{outcome="finished"}')
        pids=()
        for k in 1 2 3 4; do
            curl -sS -H "Authorization: Bearer sk-leave" -H 'Content-Type: application/json' \
                "$KS_URL/v1/embeddings" -d @"$TMPD/many2048.json" -o /dev/null 2>/dev/null &
            pids+=($!)
        done
        wait_for "$n round $round: the 4 clients' requests in flight" \
            metric_ge "$KS_URL" kvseal_generations_inflight $((${base:-0} + 4))
        kill "${pids[@]}" 2>/dev/null
        wait "${pids[@]}" 2>/dev/null
        wait_for "$n round $round: every request to end" \
            metric_is "$KS_URL" kvseal_generations_inflight "${base:-0}"
        [ "$(metric "$KS_URL" kvseal_client_disconnects_total)" -gt "${dis:-0}" ] ||
            fail "$n round $round: all 4 clients were answered before they left"
        # a client gone is seen, and no more of its inputs are computed
        [ $(($(metric "$KS_URL" 'kvseal_engine_requests_total{outcome="finished"}') - ${fin:-0})) -lt 2048 ] ||
            fail "$n round $round: the inputs of a client that left were all computed"
    done
    kv_clean "$n after 24 clients left"
    req "$n after 24 clients left" 200 "${AUTH[@]}" "$KS_URL/v1/embeddings" -d "{\"input\":\"$TEXT\"}"
}

# kv_clean — every KV page (serve's, or every worker's) free and scrubbed
kv_clean() {
    local chk
    chk=$(curl -sS -H "Authorization: Bearer adm-emb-0123456789ab" "$KS_URL/admin/kv/check?timeout_ms=$((KS_WAIT_S * 1000))")
    expect_has "$1 pool check" "$chk" '"clean":true'
}

start_server "$TMPD/serve.log" "${ARGS[@]}" --tenants "$TMPD/t.json"
KS_URL=$KS_URL KS_KEY=sk-acme-test KS_MODEL_NAME=kjv-mini KS_OUT="$TMPD/serve.json" \
    node "$(dirname "$0")/js/embed_client.mjs" || fail "embeddings client checks failed (serve)"
curl_checks serve
kv_clean serve
left_mid_request serve
clients_leave_together serve
stop_server

# --pooling last: the last position's row, another (normalized) vector
start_server "$TMPD/serve_last.log" "${ARGS[@]}" --pooling last
req "serve --pooling last" 200 -H 'Content-Type: application/json' "$KS_URL/v1/embeddings" \
    -d "{\"input\":\"$TEXT\",\"encoding_format\":\"float\"}"
echo "$BODY" >"$TMPD/last.json"
node -e '
const fs = require("fs");
const mean = JSON.parse(fs.readFileSync(process.argv[1])).a;
const last = JSON.parse(fs.readFileSync(process.argv[2])).data[0].embedding;
const n = Math.sqrt(last.reduce((s, x) => s + x * x, 0));
if (last.length !== mean.length || Math.abs(n - 1) > 1e-5) throw new Error("last: bad vector");
if (last.every((v, i) => Math.fround(v) === Math.fround(mean[i]))) throw new Error("last equals mean");
' "$TMPD/serve.json" "$TMPD/last.json" || fail "--pooling last does not change the vector"
stop_server

# the cluster: the router's --pooling (mean) travels in EMBED and overrides the
# prefill worker's own (last), so the vectors must be serve's mean ones; the
# prefill worker's context (128) is below the router's (256), so it refuses
# some inputs the router admitted (REJECT)
CLUSTER_PROBE_AUTH=sk-acme-test ROUTER_ARGS="--tenants $TMPD/t.json --pooling mean" \
    PREFILL_ARGS="--pooling last --ctx 128" start_cluster "$TMPD/c" 1 1 "${ARGS[@]}"
KS_URL=$KS_URL KS_KEY=sk-acme-test KS_MODEL_NAME=kjv-mini KS_OUT="$TMPD/cluster.json" \
    node "$(dirname "$0")/js/embed_client.mjs" || fail "embeddings client checks failed (cluster)"
cmp -s "$TMPD/serve.json" "$TMPD/cluster.json" || fail "the cluster's vectors differ from serve's"
curl_checks cluster
node -e 'console.log(JSON.stringify({input: "In the beginning God created the heaven and the earth. ".repeat(12)}))' >"$TMPD/mid.json"
req "cluster: refused by the prefill worker" 400 "${AUTH[@]}" "$KS_URL/v1/embeddings" -d @"$TMPD/mid.json"
expect_has "prefill's refusal code" "$BODY" '"code":"context_length_exceeded"'
expect_has "prefill's refusal text" "$BODY" 'maximum context length is 128 tokens'
kv_clean cluster
left_mid_request cluster
clients_leave_together cluster
grep -q 'bad EMBED_RESULT' "$TMPD/c.router" && fail "the router refused an EMBED_RESULT"
stop_cluster
echo "PASS"
