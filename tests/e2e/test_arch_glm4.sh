#!/usr/bin/env bash
# glm4 (dense) against llama.cpp: Q/K/V biases, partial rotary embedding
# (half of each head) in the interleaved (non-NEOX) style, one ffn_up tensor
# of gate then up rows, and RMSNorm of each sublayer's output before its
# residual add (post_attention_norm, post_ffw_norm). A `kvseal mkmodel
# --arch glm4` model (llama-spm vocabulary) through the check_arch matrix
# (qtypes_lib.sh: perplexity within 0.5% at F16, Q8_0, Q4_K_M, greedy text
# at F16 and Q8_0); then the same shape with --qk-gain 3 at F16, where
# attention depends on position: read with NEOX pairs it misses llama.cpp's
# perplexity by 36% (at unit gain the two styles are 0.02% apart). At Q8_0
# that sharp attention magnifies the engines' rounding differences to
# +-0.5-0.7%, so it is checked at F16 only.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/qtypes_lib.sh"
VOCAB=$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf
[ -e "$VOCAB" ] || skip "$VOCAB is absent"
for g in 1 3; do
    mkmodel_to "$TMPD/glm4-$g.gguf" --arch glm4 --seed 9 --qk-gain $g
done
check_arch glm4 "$TMPD/glm4-1.gguf"
check_ppl "glm4 qk-gain 3 F16" "$TMPD/glm4-3.gguf"
check_greedy "glm4 qk-gain 3" "$TMPD/glm4-3.gguf"
echo "glm4 vs llama.cpp ok"
