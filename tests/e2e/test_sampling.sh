#!/usr/bin/env bash
# test_sampling.sh — issue 12's sampling features (n, echo with prompt
# logprobs, logit_bias, best_of) through `kvseal serve` and through the
# cluster router, driven by the official openai npm client (js/sampling.mjs),
# plus curl for what the client hides: the raw 400 bodies; echo's prompt
# logprobs through the router (the prefill worker's PROMPT_LP records)
# byte for byte equal to serve's answers; a client vanishing mid echo
# request leaves every page of both workers FREE and scrubbed.
. "$(dirname "$0")/lib.sh"
command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs it)"
[ -d "$(dirname "$0")/js/node_modules/openai" ] || skip "the openai npm package is not installed (scripts/install-deps.sh)"
command -v jq >/dev/null || skip "jq is not installed (scripts/install-deps.sh installs it)"
MODEL="$KS_SRC/models/kjv-mini.gguf"
OF=$("$KS_BIN" tokenize -m "$MODEL" --ids --no-bos "of")
case "$OF" in ""|*" "*) fail "tokenize 'of': [$OF], want one id";; esac
THE=$("$KS_BIN" tokenize -m "$MODEL" --ids --no-bos "the")
[ "$THE" = 261 ] || fail "tokenize 'the': $THE"
echo '{"tenants":[{"name":"acme","keys":["sk-acme-test"],"max_concurrent":8,"tokens_per_minute":10000000}],"admin_key":"adm-test-0123456789"}' >"$TMPD/t.json"
start_server "$TMPD/server.log" -m "$MODEL" --alias kjv --tenants "$TMPD/t.json"
KS_URL=$KS_URL KS_KEY=sk-acme-test KS_MODEL_NAME=kjv KS_BIAS_IDS="$OF,$THE" \
    node "$(dirname "$0")/js/sampling.mjs" || fail "sampling checks failed"

# the raw error shape: 400, param named
AUTH=(-H "Authorization: Bearer sk-acme-test" -H 'Content-Type: application/json')
req "n too large" 400 "$KS_URL/v1/completions" "${AUTH[@]}" -d '{"model":"kjv","prompt":"In","n":17}'
expect_has "n too large" "$BODY" '"param":"n"'
req "workers logit_bias" 400 "$KS_URL/accounts/a/ai/run/kjv" "${AUTH[@]}" -d '{"prompt":"In","logit_bias":{"5":1}}'
expect_has "workers logit_bias" "$BODY" 'logit_bias'
req "chat echo" 400 "$KS_URL/v1/chat/completions" "${AUTH[@]}" -d '{"model":"kjv","messages":[{"role":"user","content":"x"}],"echo":true}'
expect_has "chat echo" "$BODY" '"param":"echo"'
# min_tokens (issue 39): a stop string cannot end generation before it
min_tokens_checks() { # URL MODEL
    req "stop without min_tokens" 200 "$1/v1/completions" "${AUTH[@]}" \
        -d '{"model":"'"$2"'","prompt":"In the beginning","max_tokens":3,"temperature":0,"stop":["the"]}'
    expect_has "stop without min_tokens" "$BODY" '"text":" of "'
    req "min_tokens" 200 "$1/v1/completions" "${AUTH[@]}" \
        -d '{"model":"'"$2"'","prompt":"In the beginning","max_tokens":3,"temperature":0,"stop":["the"],"min_tokens":3}'
    expect_has "min_tokens holds the stop string off" "$BODY" '"text":" of the Lord"'
    # ... nor EOS (id 2, forced by logit_bias): banned for the first 3 tokens
    # (through the cluster the first by the prefill worker, the rest by decode)
    req "EOS without min_tokens" 200 "$1/v1/completions" "${AUTH[@]}" \
        -d '{"model":"'"$2"'","prompt":"In the beginning","max_tokens":5,"temperature":0,"logit_bias":{"2":100}}'
    expect_has "EOS without min_tokens" "$BODY" '"completion_tokens":0,'
    req "min_tokens bans EOS" 200 "$1/v1/completions" "${AUTH[@]}" \
        -d '{"model":"'"$2"'","prompt":"In the beginning","max_tokens":5,"temperature":0,"logit_bias":{"2":100},"min_tokens":3}'
    expect_has "min_tokens bans EOS" "$BODY" '"text":" of the Lord","index":0,"logprobs":null,"finish_reason":"stop"'
    expect_has "min_tokens bans EOS: 3 tokens" "$BODY" '"completion_tokens":3,'
    req "min_tokens above max_tokens" 400 "$1/v1/completions" "${AUTH[@]}" \
        -d '{"model":"'"$2"'","prompt":"In","max_tokens":2,"min_tokens":3}'
    expect_has "min_tokens above max_tokens" "$BODY" '"param":"min_tokens"'
}
min_tokens_checks "$KS_URL" kjv
# a client that disconnects mid-stream from n=4 choices: every choice is
# cancelled and every page (shared prompt pages included) comes back once
# (rawc: it stops reading once choice 3's first chunk arrived, with a small
# receive buffer, so the answer cannot end; then it vanishes)
rm -f "$TMPD/cut-ready"
RAWC_AUTH=sk-acme-test rawc --rcvbuf 2048 --pause-after '"index":3' --ready "$TMPD/cut-ready" \
    -o "$TMPD/cut.sse" "${KS_URL##*:}" < <(RAWC_AUTH=sk-acme-test rawc_request /v1/completions \
    '{"model":"kjv","prompt":"In the beginning God created the heaven and the earth.","n":4,"max_tokens":400,"ignore_eos":true,"stream":true}') &
CUT_PID=$!
wait_for "the cut client to get choice 3 and stop reading" test -e "$TMPD/cut-ready"
kill -KILL $CUT_PID
wait_for "the cut request's disconnect to be counted" metric_ge "$KS_URL" kvseal_client_disconnects_total 1
# every page came back (n choices released once each, echo's extra rows)
req "kv check" 200 "$KS_URL/admin/kv/check?timeout_ms=$((KS_WAIT_S * 1000))" -H "Authorization: Bearer adm-test-0123456789"
expect_has "kv check" "$BODY" 'scrubbed'

# echo with prompt logprobs: kvseal serve's answers are the reference the
# router's must equal byte for byte (tokens, token_logprobs, top_logprobs,
# text_offset, text, finish_reason, usage): the kernels are batch-invariant,
# so the prefill worker's rows are serve's. Prompts: one token after BOS, a
# sentence, and one of >300 tokens (many KV pages, several PROMPT_LP chunks).
V1="In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God said, Let there be light: and there was light."
LONG="$V1 $V1 $V1 $V1 $V1 $V1 $V1"
ECHO_PROMPTS=("In" "$V1" "$LONG")
ECHO_CASES=("0 1" "0 5" "1 1" "1 5" "4 3" "0 0") # max_tokens, logprobs (0: none)
# echo_runs URL MODEL OUTDIR CURL_ARGS... — each prompt x case, one answer file each
echo_runs() {
    local url=$1 model=$2 out=$3; shift 3
    mkdir -p "$out"
    local pi c mt k body
    for pi in "${!ECHO_PROMPTS[@]}"; do
        for c in "${ECHO_CASES[@]}"; do
            read -r mt k <<<"$c"
            body=$(jq -cn --arg m "$model" --arg p "${ECHO_PROMPTS[$pi]}" --argjson mt "$mt" --argjson k "$k" \
                '{model:$m,prompt:$p,echo:true,max_tokens:$mt,temperature:0} + if $k > 0 then {logprobs:$k} else {} end')
            req "echo p$pi max_tokens $mt logprobs $k ($out)" 200 "$url/v1/completions" "$@" \
                -H 'Content-Type: application/json' -d "$body"
            jq -c '{c: .choices, u: .usage}' <<<"$BODY" >"$out/p$pi.m$mt.k$k" ||
                fail "echo p$pi max_tokens $mt logprobs $k: not JSON: $BODY"
        done
    done
    # streamed: the same chunks (ids and timestamps aside)
    body=$(jq -cn --arg m "$model" --arg p "$LONG" \
        '{model:$m,prompt:$p,echo:true,max_tokens:3,logprobs:2,temperature:0,stream:true}')
    req "echo streamed ($out)" 200 "$url/v1/completions" "$@" -H 'Content-Type: application/json' -d "$body"
    sed 's/"id":"[^"]*"//; s/"created":[0-9]*//; s/"model":"[^"]*"//' <<<"$BODY" >"$out/stream"
    expect_has "echo streamed ($out)" "$(cat "$out/stream")" 'data: [DONE]'
}
echo_runs "$KS_URL" kjv "$TMPD/echo-serve" "${AUTH[@]}"
NLONG=$(jq '.u.prompt_tokens' "$TMPD/echo-serve/p2.m0.k1")
[ "$NLONG" -gt 300 ] || fail "the long echo prompt has $NLONG tokens, want > 300"
expect_eq "serve echo: records for the long prompt" \
    "$(jq '.c[0].logprobs.token_logprobs | length' "$TMPD/echo-serve/p2.m0.k5")" "$NLONG"
stop_server

# disaggregated serving: n (independent requests, choice i seeded seed + i)
# and logit_bias cross the wire (test_cluster_same_tokens compares them token
# for token with kvseal serve); echo with prompt logprobs comes from the
# prefill worker (PROMPT_LP) and must equal serve's answers exactly
ROUTER_ARGS="--admin-key adm-k-0123456789abcdef" start_cluster "$TMPD/c" 1 1 -m "$MODEL"
req "cluster n" 200 "$KS_URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"kjv-mini","prompt":"In","n":2,"max_tokens":2,"temperature":1,"seed":5}'
expect_has "cluster n" "$BODY" '"index":1'
req "cluster logit_bias" 200 "$KS_URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"kjv-mini","prompt":"In","logit_bias":{"'"$THE"'":100},"max_tokens":2,"temperature":0}'
expect_has "cluster logit_bias forces the token" "$BODY" '"text":" the the"'
echo_runs "$KS_URL" kjv-mini "$TMPD/echo-cluster"
for f in "$TMPD"/echo-serve/*; do
    g="$TMPD/echo-cluster/$(basename "$f")"
    cmp -s "$f" "$g" || fail "cluster echo $(basename "$f") differs from serve's:
$(diff <(jq . "$f" 2>/dev/null || cat "$f") <(jq . "$g" 2>/dev/null || cat "$g") | head -n 20)"
done
# the npm client's checks (n, echo with prompt logprobs at max_tokens 0 and
# 1, logit_bias, best_of, the 400s) through the router as well
KS_URL=$KS_URL KS_KEY=sk-none KS_MODEL_NAME=kjv-mini KS_BIAS_IDS="$OF,$THE" \
    node "$(dirname "$0")/js/sampling.mjs" || fail "sampling checks through the router failed"
req "cluster echo plain" 200 "$KS_URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"kjv-mini","prompt":"In the beginning","echo":true,"max_tokens":3,"temperature":0}'
expect_has "cluster echo plain" "$BODY" '"text":"In the beginning of the Lord"'
AUTH=(-H 'Content-Type: application/json')
min_tokens_checks "$KS_URL" kjv-mini # through the router and the sampling extension
# a client that vanishes mid echo request (it takes the first prompt
# records, then stops reading and is killed) while decode still has most
# of 3000 tokens to go (a context beyond the model's 512, so it cannot end
# first): the router aborts it at both workers, and every page of both
# pools is FREE and scrubbed again
ROUTER_ARGS="--admin-key adm-k-0123456789abcdef" start_cluster "$TMPD/a" 1 1 -m "$MODEL" --ctx 4096 2>/dev/null
rm -f "$TMPD/echo-cut-ready"
rawc --rcvbuf 2048 --pause-after 'data: ' --ready "$TMPD/echo-cut-ready" -o "$TMPD/echo-cut.sse" \
    "${KS_URL##*:}" < <(rawc_request /v1/completions "$(jq -cn --arg p "$LONG" \
    '{model:"kjv-mini",prompt:$p,echo:true,logprobs:5,max_tokens:3000,ignore_eos:true,stream:true}')") &
CUT_PID=$!
wait_for "the echo client to get its first event and stop reading" test -e "$TMPD/echo-cut-ready"
kill -KILL $CUT_PID
wait_for "the router to count the echo client's disconnect" metric_ge "$KS_URL" kvseal_client_disconnects_total 1
wait_for "the router to abort the echo request" \
    metric_ge "$KS_URL" 'kvseal_engine_requests_total{outcome="aborted"}' 1
chk=$(curl -sS -H "Authorization: Bearer adm-k-0123456789abcdef" "$KS_URL/admin/kv/check?timeout_ms=$((KS_WAIT_S * 1000))")
expect_has "pools after the echo client vanished" "$chk" '"clean":true'
stop_cluster
echo "sampling ok"
