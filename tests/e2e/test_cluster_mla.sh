#!/usr/bin/env bash
# Disaggregated serving of latent-attention models: a deepseek32 file from
# `kvseal mkmodel` (MLA rows of [latent 128 | rope key 32 | indexer key 64],
# one plane per page, top 8 positions: the 16 requests' prompts and outputs
# pass 8, so decode runs the sparse path on handed-off pages) through
# router + 1 prefill + 1 decode gives exactly `kvseal serve`'s tokens
# (js/same_tokens.mjs), and every page ends FREE and scrubbed. The same run
# on a dense llama of the same width (256 embd, 2 layers, 8 heads, each with
# its own K and V) prints the KV handoff bytes per request of both.
. "$(dirname "$0")/lib.sh"
command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs it)"
VOCAB=$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf
[ -e "$VOCAB" ] || skip "$VOCAB is absent"
"$KS_BIN" mkmodel -o "$TMPD/mla.gguf" --vocab "$VOCAB" --arch deepseek32 --seed 5 >/dev/null ||
    fail "mkmodel deepseek32"
"$KS_BIN" mkmodel -o "$TMPD/dense.gguf" --vocab "$VOCAB" --arch llama --seed 5 --n-head-kv 8 >/dev/null ||
    fail "mkmodel llama"
export CLUSTER_PROBE_MODEL=m SAME_MODEL=m
handoff() {  # LOGS... — "N requests, B bytes each on average, M ms"
    cat "$@" | sed -n 's/.*KV handoff: \([0-9]*\) bytes in \([0-9.]*\) ms.*/\1 \2/p' |
        awk '{ n++; b += $1; t += $2 } END { if (n) printf "%d handoffs, %.0f bytes, %.3f ms each on average", n, b / n, t / n }'
}
for kind in mla dense; do
    ARGS=(-m "$TMPD/$kind.gguf" --alias m --ctx 512 --kv-pages 128 --threads 2)
    start_server "$TMPD/serve-$kind.log" "${ARGS[@]}"
    URL_A=$KS_URL; SERVE_PID=$KS_PID
    grep -q "1 plane" "$TMPD/serve-$kind.log" && [ $kind = dense ] && fail "a dense model's pages have 1 plane"
    [ $kind = dense ] || grep -q "x 1 plane x" "$TMPD/serve-$kind.log" || fail "the MLA model's pages do not have 1 plane"
    ROUTER_ARGS="--admin-key adm-mla-0123456789ab" start_cluster "$TMPD/c-$kind" 1 1 "${ARGS[@]}"
    trap 'kill -KILL $SERVE_PID $KS_PID "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}" 2>/dev/null; rm_tmpd' EXIT
    URL_A=$URL_A URL_B=$KS_URL node "$(dirname "$0")/js/same_tokens.mjs" ||
        { tail -n 20 $KS_CLUSTER_LOGS >&2; fail "$kind: cluster and serve outputs differ"; }
    chk=$(curl -sS -H "Authorization: Bearer adm-mla-0123456789ab" "$KS_URL/admin/kv/check?timeout_ms=$((KS_WAIT_S * 1000))")
    expect_has "$kind cluster pool check" "$chk" '"clean":true'
    echo "$kind: same tokens as serve; $(handoff "$TMPD"/c-$kind.decode*)"
    stop_cluster
    KS_PID=$SERVE_PID stop_server
done
echo "PASS"
