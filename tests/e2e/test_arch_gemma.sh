#!/usr/bin/env bash
# gemma2 and gemma3 against llama.cpp. For each, a small `kvseal mkmodel`
# model (llama-spm vocab, random weights, head_dim 128 != n_embd / n_head,
# a sliding window of 32 tokens so that it matters at context 128; gemma2
# with 4 layers and an attention soft-cap of 2, small enough to bite on
# these weights, and its default final cap 30; gemma3 with 6 layers, so
# layers 0-4 slide and layer 5 is global, no soft-caps) at F16, and Q8_0
# and Q4_K_M made from it by llama-quantize:
# - `kvseal perplexity` within 0.5% of llama-perplexity's (-c 128);
# - at F16 and Q8_0, greedy 32 tokens identical to llama-completion's on
#   two prompts.
# The same weights with the window wider than the context, or gemma2's cap
# lifted to 1000, are each more than 0.5% away from llama.cpp's figure, so
# the perplexity check would catch a forward pass that ignored either.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/qtypes_lib.sh"
VOCAB=$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf
[ -e "$VOCAB" ] || skip "$VOCAB is absent"

mk() { # OUT ARCH mkmodel-args...
    mkmodel_to "$1" --arch "$2" --n-head 4 --n-head-kv 2 --head-dim 128 --swa 32 --seed 3 -t 2 "${@:3}"
}
# |a - b| / b < 0.005
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; exit !(d < 0.005) }'; }

for arch in gemma2 gemma3; do
    if [ $arch = gemma2 ]; then args=(--n-layer 4 --attn-softcap 2); else args=(--n-layer 6); fi
    mk "$TMPD/$arch-f16.gguf" $arch "${args[@]}"
    quantize "$TMPD/$arch-f16.gguf" "$TMPD/$arch-q8_0.gguf" Q8_0
    quantize "$TMPD/$arch-f16.gguf" "$TMPD/$arch-q4_k_m.gguf" Q4_K_M
    for t in f16 q8_0 q4_k_m; do
        m=$TMPD/$arch-$t.gguf
        check_ppl "$arch $t" "$m"
        if [ $t != q4_k_m ]; then
            for p in "${PROMPTS[@]}"; do
                gen_same "$m" "$p" || { echo; fail "$arch $t: greedy text differs:
  kvseal:    $G_KV
  llama.cpp: $G_LL"; }
            done
            printf '  greedy identical'
        fi
        echo
    done
    # the checks can fail: the same weights without the window (or the cap)
    ll_f16=$(ll_ppl "$TMPD/$arch-f16.gguf")
    mk "$TMPD/$arch-nowin.gguf" $arch "${args[@]}" --swa 4096
    k=$(kv_ppl "$TMPD/$arch-nowin.gguf")
    [ -n "$k" ] || fail "$arch without the window: kvseal perplexity failed"
    close "$k" "$ll_f16" && fail "$arch: without the window kvseal's $k is within 0.5% of $ll_f16"
    echo "  $arch without the window: $k (llama.cpp with it: $ll_f16)"
    if [ $arch = gemma2 ]; then
        mk "$TMPD/$arch-nocap.gguf" $arch "${args[@]}" --attn-softcap 1000
        k=$(kv_ppl "$TMPD/$arch-nocap.gguf")
        close "$k" "$ll_f16" && fail "$arch: without the score cap kvseal's $k is within 0.5% of $ll_f16"
        echo "  $arch without the score cap: $k"
    fi
done
echo "gemma2 and gemma3 vs llama.cpp ok"
