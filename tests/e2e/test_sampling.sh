#!/usr/bin/env bash
# test_sampling.sh — issue 12's sampling features (n, echo with prompt
# logprobs, logit_bias, best_of) through `kvseal serve`, driven by the
# official openai npm client (js/sampling.mjs), plus curl for what the
# client hides: the raw 400 bodies, and n / logit_bias / refusals in
# disaggregated serving.
. "$(dirname "$0")/lib.sh"
command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs it)"
[ -d "$(dirname "$0")/js/node_modules/openai" ] || skip "the openai npm package is not installed (scripts/install-deps.sh)"
MODEL="$KS_SRC/models/kjv-mini.gguf"
OF=$("$KS_BIN" tokenize -m "$MODEL" --ids --no-bos "of")
case "$OF" in ""|*" "*) fail "tokenize 'of': [$OF], want one id";; esac
THE=$("$KS_BIN" tokenize -m "$MODEL" --ids --no-bos "the")
[ "$THE" = 261 ] || fail "tokenize 'the': $THE"
echo '{"tenants":[{"name":"acme","keys":["sk-acme-test"],"max_concurrent":8,"tokens_per_minute":10000000}],"admin_key":"adm-test"}' >"$TMPD/t.json"
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
req "kv check" 200 "$KS_URL/admin/kv/check?timeout_ms=$((KS_WAIT_S * 1000))" -H "Authorization: Bearer adm-test"
expect_has "kv check" "$BODY" 'scrubbed'
stop_server

# disaggregated serving: n (independent requests, choice i seeded seed + i)
# and logit_bias cross the wire (test_cluster_same_tokens compares them token
# for token with kvseal serve); prompt logprobs do not yet: refused clearly
start_cluster "$TMPD/c" 1 1 -m "$MODEL"
req "cluster n" 200 "$KS_URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"kjv-mini","prompt":"In","n":2,"max_tokens":2,"temperature":1,"seed":5}'
expect_has "cluster n" "$BODY" '"index":1'
req "cluster logit_bias" 200 "$KS_URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"kjv-mini","prompt":"In","logit_bias":{"'"$THE"'":100},"max_tokens":2,"temperature":0}'
expect_has "cluster logit_bias forces the token" "$BODY" '"text":" the the"'
req "cluster echo logprobs" 400 "$KS_URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"kjv-mini","prompt":"In","echo":true,"logprobs":1,"max_tokens":2}'
expect_has "cluster echo" "$BODY" 'echo with logprobs'
req "cluster echo plain" 200 "$KS_URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"kjv-mini","prompt":"In the beginning","echo":true,"max_tokens":3,"temperature":0}'
expect_has "cluster echo plain" "$BODY" '"text":"In the beginning of the Lord"'
stop_cluster
echo "sampling ok"
