#!/usr/bin/env bash
# deepseek2's multi-head latent attention (MLA) against llama.cpp. A
# `kvseal mkmodel --arch deepseek2` model (llama-spm vocabulary; a latent of
# 128, a rope key of 32, 8 heads of 64 nope + 32 rope query dims and 64
# output dims; every FFN dense) through the check_arch matrix (qtypes_lib.sh:
# perplexity within 0.5% at F16, Q8_0, Q4_K_M; greedy text at F16 and Q8_0),
# with and without the query bottleneck (q_lora_rank 0: one attn_q, as
# DeepSeek-V2-Lite), and at --qk-gain 3, where attention depends on
# position (there, scores scaled by 1/sqrt(the latent row) instead of
# 1/sqrt(key_length_mla) miss llama.cpp by 1.3%, and NEOX rope pairs by 15%).
# kvseal attends in latent space: one KV row per position and layer,
# [rmsnorm(latent) | rope key], K the whole row and V its first 128.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/qtypes_lib.sh"
VOCAB=$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf
[ -e "$VOCAB" ] || skip "$VOCAB is absent"
mk() { mkmodel_to "$1" --arch deepseek2 "${@:2}"; }  # OUT ARGS...
mk "$TMPD/ds.gguf" --seed 11
mk "$TMPD/ds-noq.gguf" --seed 12 --q-lora 0
mk "$TMPD/ds-g3.gguf" --seed 13 --qk-gain 3
check_arch deepseek2 "$TMPD/ds.gguf"
check_ppl "deepseek2 q_lora 0 F16" "$TMPD/ds-noq.gguf"
echo
check_ppl "deepseek2 qk-gain 3 F16" "$TMPD/ds-g3.gguf"
echo
check_greedy "deepseek2 qk-gain 3" "$TMPD/ds-g3.gguf"
# mixture-of-experts layers as DeepSeek-V3 has them: a dense first layer,
# then 8 routed experts (sigmoid, a selection bias, weights renormalized and
# scaled by 2.5) in 4 groups of which the 2 whose two best experts score
# highest may be picked, plus a shared expert. Within 1% (issue 11's bound)
# at F16, Q8_0 and Q4_K_M; greedy text at F16. Measured 0.99996 / 1.0055 /
# 1.0019; picking from every group instead misses by 1.2% at F16.
mk "$TMPD/ds-moe.gguf" --seed 31 --n-expert 8 --expert-groups 4 --group-used 2
for q in F16 Q8_0 Q4_K_M; do
    m=$TMPD/ds-moe.gguf
    [ $q = F16 ] || { quantize "$m" "$TMPD/q.gguf" $q; m=$TMPD/q.gguf; }
    PPL_TOL=0.01 check_ppl "deepseek2 MoE $q" "$m"
    echo
done
for p in "${ARCH_PROMPTS[@]}"; do
    gen_same_or_tie "$TMPD/ds-moe.gguf" "$p" || fail "deepseek2 MoE: greedy text differs ($G_NOTE):
  kvseal:    $G_KV
  llama.cpp: $G_LL"
done
echo "  greedy ok"
# DeepSeek-V2-Lite's layout: one attn_q (no query bottleneck) and two shared
# experts, stored as one shared FFN twice the routed experts' width.
mk "$TMPD/ds-v2.gguf" --seed 32 --q-lora 0 --n-expert 8 --n-shared 2
for q in F16 Q4_K_M; do
    m=$TMPD/ds-v2.gguf
    [ $q = F16 ] || { quantize "$m" "$TMPD/q.gguf" $q; m=$TMPD/q.gguf; }
    PPL_TOL=0.01 check_ppl "deepseek2 2 shared experts $q" "$m"
    echo
done
echo "deepseek2 vs llama.cpp ok"
