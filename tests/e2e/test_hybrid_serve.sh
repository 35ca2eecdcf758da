#!/usr/bin/env bash
# A hybrid recurrent model (qwen35, `kvseal mkmodel` with the kjv-mini
# vocabulary) through `kvseal serve`: the deploy-time check counts each
# sequence's recurrent-state pages; a completion, a streamed one and n = 3
# choices (each choice computes the whole prompt: hybrid models share no
# prompt pages) give the same greedy text; afterwards every page (state pages too) is FREE and scrubbed; and the
# cluster workers refuse the model with the way out, until the protocol
# hands the recurrent state over. HYBRID_MK_ARGS picks another hybrid
# model (test_hybrid_serve_nemotronh.sh: nemotron_h's Mamba2 layers).
. "$(dirname "$0")/lib.sh"
read -ra MK_ARGS <<<"${HYBRID_MK_ARGS:---arch qwen35 --n-layer 8 --seed 11}"
"$KS_BIN" mkmodel -o "$TMPD/q35.gguf" --vocab "$KS_SRC/models/kjv-mini.gguf" "${MK_ARGS[@]}" \
    >/dev/null || fail "mkmodel ${MK_ARGS[*]}"
ADM=adm-hybrid-0123456789abcdef
# 8-token pages: 64 pages for 512 tokens of context, state pages on top
# (a pool of 100 fits one full-context sequence with them, not 100 - 64)
start_server "$TMPD/s.log" -m "$TMPD/q35.gguf" --alias q35 --ctx 512 --kv-pages 100 \
    --page-tokens 8 --admin-key "$ADM" --threads 2
cap=$(grep -m1 "kv pool: " "$TMPD/s.log")
expect_has "capacity line" "$cap" "recurrent state"
sp=$(sed -n 's/.*recurrent state \([0-9]*\) pages per sequence.*/\1/p' <<<"$cap")
[ -n "$sp" ] && [ "$sp" -gt 0 ] || fail "no state page count in [$cap]"
echo "state pages per sequence: $sp"
expect_has "the context counts them" "$cap" "context length 512 needs $((64 + sp)) pages"
body='{"model":"q35","prompt":"And God said, Let there be light","max_tokens":16,"temperature":0'
req plain 200 "$KS_URL/v1/completions" -d "$body}"
t1=$(node -e 'console.log(JSON.parse(process.argv[1]).choices[0].text)' "$BODY" 2>/dev/null ||
     sed -n 's/.*"text":"\([^"]*\)".*/\1/p' <<<"$BODY")
[ -n "$t1" ] || fail "empty completion: $BODY"
req choices 200 "$KS_URL/v1/completions" -d "$body,\"n\":3}"
n_same=$(grep -o "\"text\":\"[^\"]*\"" <<<"$BODY" | sort -u | wc -l)
expect_eq "n=3 greedy choices are one text" "$n_same" 1
expect_has "n=3 text" "$BODY" "$(sed 's/[][\\.*^$/]/\\&/g' <<<"$t1" | head -c 20)"
req stream 200 "$KS_URL/v1/completions" -d "$body,\"stream\":true}"
st=$(grep -o '"text":"[^"]*"' <<<"$BODY" | sed 's/"text":"//; s/"$//' | tr -d '\n')
expect_eq "streamed text" "$st" "$t1"
req kv_check 200 -H "Authorization: Bearer $ADM" "$KS_URL/admin/kv/check?timeout_ms=$((KS_WAIT_S * 1000))"
expect_has "pool clean" "$BODY" '"clean":true'
stop_server
# disaggregated: router + 1 prefill + 1 decode hand each request's state
# pages over with its KV pages (docs/pd-protocol.md, GRANT's state entries):
# 16 concurrent requests (greedy and seeded sampling, streamed and not, stop
# strings, logprobs) give the monolithic server's answers exactly (a
# decode worker starting from any other state would not), and every page on
# every worker ends FREE and scrubbed
if command -v node >/dev/null; then
    ARGS=(-m "$TMPD/q35.gguf" --alias q35 --ctx 512 --kv-pages 200 --threads 2)
    start_server "$TMPD/serve.log" "${ARGS[@]}"
    URL_A=$KS_URL; SERVE_PID=$KS_PID
    CLUSTER_PROBE_MODEL=q35 ROUTER_ARGS="--admin-key $ADM" start_cluster "$TMPD/c" 1 1 "${ARGS[@]}"
    trap 'kill -KILL $SERVE_PID $KS_PID "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}" 2>/dev/null; rm_tmpd' EXIT
    SAME_MODEL=q35 URL_A=$URL_A URL_B=$KS_URL node "$(dirname "$0")/js/same_tokens.mjs" ||
        { tail -n 20 $KS_CLUSTER_LOGS >&2; fail "cluster outputs differ from serve's"; }
    req cluster_kv_check 200 -H "Authorization: Bearer $ADM" \
        "$KS_URL/admin/kv/check?timeout_ms=$((KS_WAIT_S * 1000))"
    expect_has "cluster pools clean" "$BODY" '"clean":true'
    expect_has "cluster pools name the workers" "$BODY" "decode worker"
    stop_cluster
    KS_PID=$SERVE_PID stop_server
else
    echo "(node is not installed: the disaggregated comparison is left out)"
fi
# the UCX plane stages KV pages only: a hybrid model is refused there
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMPD/secret"
chmod 600 "$TMPD/secret"
for role in prefill decode; do
    out=$("$KS_BIN" $role -m "$TMPD/q35.gguf" --router 127.0.0.1:1 --secret-file "$TMPD/secret" \
        --data-plane ucx 2>&1)
    expect_has "$role refuses ucx" "$out" "hybrid recurrent model"
done
echo "hybrid model through serve and the cluster ok"
