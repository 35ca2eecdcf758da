#!/usr/bin/env bash
# bench/cluster-mla.sh [TOKENS...] — the KV handoff of latent-attention
# models against dense ones at long context (issue 11): bytes and transfer
# time per request through router + 1 prefill + 1 decode on loopback (TLS,
# the default), for prompts of about TOKENS tokens (default 1000 4000),
# REPEAT requests each (default 3). The models share one width, 1024 embd,
# 4 layers, 16 heads of 64 (`kvseal mkmodel`, F16 KV pages):
#   deepseek32   MLA latent 512 + rope key 64 + indexer key 128 (DeepSeek-V3.2's)
#   deepseek2    MLA latent 512 + rope key 64
#   llama MHA    16 K and 16 V heads
#   llama GQA-4  4 K and 4 V heads
# Prints each model's mean bytes, bytes per prompt token and milliseconds
# per handoff (decode's "KV handoff" log line: first page to verified DONE).
# A benchmark, not a test. Needs ../shared/vocab and node.
set -euo pipefail
cd "$(dirname "$0")/.."
VOCAB=${VOCAB:-../shared/vocab/ggml-vocab-llama-spm.gguf}
[ -e "$VOCAB" ] || { echo "cluster-mla: SKIPPED: no vocabulary at $VOCAB" >&2; exit 0; }
cmake -S . -B build >/dev/null && cmake --build build --target kvseal -j2 >/dev/null
export KS_BIN=$PWD/build/kvseal KS_SRC=$PWD REPEAT=${REPEAT:-3}
. tests/e2e/lib.sh
LENS=("${@:-1000 4000}")
read -r -a LENS <<<"${LENS[*]}"
W=(--n-embd 1024 --n-layer 4 --n-head 16 --ctx 8192 --seed 7)
"$KS_BIN" mkmodel -o "$TMPD/deepseek32.gguf" --vocab "$VOCAB" --arch deepseek32 "${W[@]}" \
    --kv-lora 512 --qk-rope 64 --idx-dim 128 --idx-heads 16 --idx-topk 2048 >/dev/null
"$KS_BIN" mkmodel -o "$TMPD/deepseek2.gguf" --vocab "$VOCAB" --arch deepseek2 "${W[@]}" \
    --kv-lora 512 --qk-rope 64 >/dev/null
"$KS_BIN" mkmodel -o "$TMPD/mha.gguf" --vocab "$VOCAB" --arch llama "${W[@]}" --n-head-kv 16 >/dev/null
"$KS_BIN" mkmodel -o "$TMPD/gqa4.gguf" --vocab "$VOCAB" --arch llama "${W[@]}" --n-head-kv 4 >/dev/null
export KS_MODEL_NAME=m CLUSTER_PROBE_MODEL=m
printf '%-12s %7s %12s %12s %10s\n' model tokens "bytes/req" "bytes/token" "ms/req"
for kind in deepseek32 deepseek2 mha gqa4; do
    start_cluster "$TMPD/c-$kind" 1 1 -m "$TMPD/$kind.gguf" --alias m --ctx 8192 --kv-pages 1200 \
        --threads 2 --batch-tokens 512
    for n in "${LENS[@]}"; do
        : >"$TMPD/mark"
        for f in "$TMPD"/c-$kind.decode*; do wc -l <"$f"; done >"$TMPD/mark"
        node bench/ttft.mjs "$KS_URL" "$KS_URL" "$n" >"$TMPD/ttft.json"
        toks=$(sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p' "$TMPD/ttft.json" | head -1)
        # the handoffs of this length's requests: the decode log past the mark
        skip=$(head -1 "$TMPD/mark")
        tail -n +$((skip + 1)) "$TMPD"/c-$kind.decode1 |
            sed -n 's/.*KV handoff: \([0-9]*\) bytes in \([0-9.]*\) ms.*/\1 \2/p' |
            awk -v k="$kind" -v n="${toks:-$n}" '{ c++; b += $1; t += $2 }
                END { if (c) printf "%-12s %7d %12.0f %12.1f %10.2f\n", k, n, b / c, b / c / n, t / c }'
    done
    stop_cluster
done
