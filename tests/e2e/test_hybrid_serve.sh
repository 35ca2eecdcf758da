#!/usr/bin/env bash
# A hybrid recurrent model (qwen35, `kvseal mkmodel` with the kjv-mini
# vocabulary) through `kvseal serve`: the deploy-time check counts each
# sequence's recurrent-state pages; a completion, a streamed one and n = 3
# choices (the others share choice 0's full prompt pages and start from a
# copy of its recurrent state at their end) give the same greedy text; the
# prefix cache resumes prompts from kept recurrent state; afterwards every
# page (state pages too) is FREE and scrubbed; and the cluster gives serve's answers on the TLS and the UCX
# data planes (and, with HYBRID_TEMPLATE, chat answers rendered by the
# model's own template). HYBRID_MK_ARGS picks another hybrid model
# (test_hybrid_serve_nemotronh.sh: nemotron_h's Mamba2 layers).
. "$(dirname "$0")/lib.sh"
read -ra MK_ARGS <<<"${HYBRID_MK_ARGS:---arch qwen35 --n-layer 8 --seed 11}"
"$KS_BIN" mkmodel -o "$TMPD/q35.gguf" --vocab "$KS_SRC/models/kjv-mini.gguf" "${MK_ARGS[@]}" \
    >/dev/null || fail "mkmodel ${MK_ARGS[*]}"
ADM=adm-hybrid-0123456789abcdef
# 8-token pages: 64 pages for 512 tokens of context, state pages on top;
# the prefix cache may hold a quarter of the pool (100 pages), three
# snapshots of the state here
start_server "$TMPD/s.log" -m "$TMPD/q35.gguf" --alias q35 --ctx 512 --kv-pages 400 \
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
# the prefix cache resumes a hybrid prompt from the recurrent state kept at
# the last page boundary before its last token (a snapshot, the cache's own
# pages): prompts sent again, or extended, reuse exactly up to a kept
# boundary and give the text computed without the cache; an extension that
# parts from a cached prompt inside a page resumes from the shallower snapshot
long="In the beginning God created the heaven and the earth. And the earth was without form, and void"
ext="$long; and darkness was upon the face of the deep. And the Spirit of God moved"
ext2="$long, and the LORD said unto Moses"
gen() { # gen NAME PROMPT: greedy text -> TEXT, cached prompt tokens -> CACHED, prompt tokens -> NP
    req "$1" 200 "$KS_URL/v1/completions" -d "{\"model\":\"q35\",\"prompt\":\"$2\",\"max_tokens\":12,\"temperature\":0}"
    TEXT=$(sed -n 's/.*"text":"\([^"]*\)".*/\1/p' <<<"$BODY")
    CACHED=$(sed -n 's/.*"cached_tokens":\([0-9]*\).*/\1/p' <<<"$BODY")
    NP=$(sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p' <<<"$BODY")
    [ -n "$TEXT" ] && [ -n "$NP" ] || fail "$1: no text or usage in $BODY"
}
bound() { echo $(( ($1 - 1) / 8 * 8 )); } # the last page boundary before token $1
gen ext_cold "$ext"; t_ext=$TEXT; n_ext=$NP
expect_eq "nothing cached at first" "${CACHED:-0}" 0
gen long_cold "$long"; t_long=$TEXT; n_long=$NP
expect_eq "a shorter prompt finds no state at its own boundary" "${CACHED:-0}" 0
gen ext2_cold "$ext2"; t_ext2=$TEXT; n_ext2=$NP
gen long_warm "$long"
expect_eq "the same prompt resumes at its boundary" "$CACHED" "$(bound "$n_long")"
expect_eq "text from the cached state" "$TEXT" "$t_long"
gen ext_warm "$ext"
expect_eq "the extension resumes at its own snapshot" "$CACHED" "$(bound "$n_ext")"
expect_eq "extension text from the cached state" "$TEXT" "$t_ext"
gen ext2_warm "$ext2"
expect_eq "ext2 resumes at its own snapshot" "$CACHED" "$(bound "$n_ext2")"
expect_eq "ext2 text from the cached state" "$TEXT" "$t_ext2"
req metrics 200 -H "Authorization: Bearer $ADM" "$KS_URL/metrics"
cp=$(sed -n 's/^kvseal_prefix_cache_pages \([0-9]*\).*/\1/p' <<<"$BODY")
[ -n "$cp" ] && [ "$cp" -ge $((3 * sp)) ] || fail "the cache holds $cp pages, fewer than three snapshots of $sp"
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
    # HYBRID_TEMPLATE: the chat template the model ships (../shared/templates)
    TEMPLATE=
    if [ -n "${HYBRID_TEMPLATE:-}" ]; then
        if [ -e "$HYBRID_TEMPLATE" ]; then
            TEMPLATE=$HYBRID_TEMPLATE
            ARGS+=(--chat-template-file "$TEMPLATE")
        else
            echo "note: $HYBRID_TEMPLATE is absent: no chat through the cluster"
        fi
    fi
    start_server "$TMPD/serve.log" "${ARGS[@]}"
    URL_A=$KS_URL; SERVE_PID=$KS_PID
    CLUSTER_PROBE_MODEL=q35 ROUTER_ARGS="--admin-key $ADM" start_cluster "$TMPD/c" 1 1 "${ARGS[@]}"
    trap 'kill -KILL $SERVE_PID $KS_PID "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}" 2>/dev/null; rm_tmpd' EXIT
    SAME_MODEL=q35 URL_A=$URL_A URL_B=$KS_URL node "$(dirname "$0")/js/same_tokens.mjs" ||
        { tail -n 20 $KS_CLUSTER_LOGS >&2; fail "cluster outputs differ from serve's"; }
    if [ -n "$TEMPLATE" ]; then # chat with the model's own template: the same answers
        for q in "In the beginning" "And the LORD said unto Moses"; do
            chat_text "$URL_A" q35 "$q"; a=$CHAT
            chat_text "$KS_URL" q35 "$q"
            expect_eq "chat through the cluster ($q)" "$CHAT" "$a"
        done
    fi
    req cluster_kv_check 200 -H "Authorization: Bearer $ADM" \
        "$KS_URL/admin/kv/check?timeout_ms=$((KS_WAIT_S * 1000))"
    expect_has "cluster pools clean" "$BODY" '"clean":true'
    expect_has "cluster pools name the workers" "$BODY" "decode worker"
    stop_cluster
    # the UCX data plane: the state pages are sealed records in the staging
    # area like the KV pages; every request's pages came through it
    PREFILL_ENV="UCX_TLS=tcp" DECODE_ENV="UCX_TLS=tcp" PREFILL_ARGS="--data-plane ucx" \
        DECODE_ARGS="--data-plane ucx" CLUSTER_PROBE_MODEL=q35 ROUTER_ARGS="--admin-key $ADM" \
        start_cluster "$TMPD/u" 1 1 "${ARGS[@]}"
    SAME_MODEL=q35 URL_A=$URL_A URL_B=$KS_URL node "$(dirname "$0")/js/same_tokens.mjs" ||
        { tail -n 20 $KS_CLUSTER_LOGS >&2; fail "UCX cluster outputs differ from serve's"; }
    n=$(grep -c 'KV bytes opened from UCX staging' "$TMPD/u.decode1")
    [ "$n" -ge 17 ] || fail "only $n requests' pages came through UCX staging (17 expected)"
    grep -q 'pages come on the TLS link\|tag does not verify\|UCX record' $KS_CLUSTER_LOGS &&
        fail "a transfer left the UCX plane"
    req ucx_kv_check 200 -H "Authorization: Bearer $ADM" \
        "$KS_URL/admin/kv/check?timeout_ms=$((KS_WAIT_S * 1000))"
    expect_has "UCX cluster pools clean" "$BODY" '"clean":true'
    stop_cluster
    KS_PID=$SERVE_PID stop_server
else
    echo "(node is not installed: the disaggregated comparison is left out)"
fi
echo "hybrid model through serve and the cluster ok"
