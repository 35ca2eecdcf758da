#!/usr/bin/env bash
# qwen35 (Qwen3.5: hybrid recurrent) against llama.cpp: three Gated DeltaNet
# layers to one attention layer (full_attention_interval 4, 8 layers), the
# recurrent layers' causal convolution over q|k|v, L2-normed heads, the
# delta rule with 4 value heads over 2 key heads (value head h reads key
# head h % 2, llama.cpp's order), the gated RMSNorm of their output; the
# attention layers' query rows carrying a sigmoid output gate per head,
# Q/K norms and RoPE on a quarter of each head. A `kvseal mkmodel --arch
# qwen35` model (llama-spm vocabulary) through the check_arch matrix
# (qtypes_lib.sh: perplexity within 0.5% at F16, Q8_0, Q4_K_M, greedy text at
# F16 and Q8_0), then with --qk-gain 3 at F16, where attention depends on
# position (so a RoPE mistake shows). Then qwen35moe: the same layers with a
# mixture-of-experts FFN (8 experts, 2 used, softmax then renormalized) and
# a shared expert weighted per token by sigmoid(ffn_gate_inp_shexp . x),
# through the same matrix. Its routing is discrete: at Q8_0 a token routed
# the other way at a near tie moves later logits, and with seed 6 one of the
# three greedy texts parted at token 28 by a log-prob margin of 0.18 (past
# TIE_LP) while its perplexity ratio was 0.9983; seeds 7 and 8 part only at
# near ties (margins 0.005-0.089, measured 2026-12-06).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/qtypes_lib.sh"
VOCAB=$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf
[ -e "$VOCAB" ] || skip "$VOCAB is absent"
for g in 1 3; do
    mkmodel_to "$TMPD/q35-$g.gguf" --arch qwen35 --n-layer 8 --seed 5 --qk-gain $g
done
check_arch qwen35 "$TMPD/q35-1.gguf"
check_ppl "qwen35 qk-gain 3 F16" "$TMPD/q35-3.gguf"
check_greedy "qwen35 qk-gain 3" "$TMPD/q35-3.gguf"
mkmodel_to "$TMPD/q35moe.gguf" --arch qwen35moe --seed 7
check_arch qwen35moe "$TMPD/q35moe.gguf"
# Qwen3.5's MTP (NextN) block after the layers, counted in block_count as
# llama.cpp reads it (nextn_predict_layers): skipped by inference in both
mkmodel_to "$TMPD/q35mtp.gguf" --arch qwen35moe --n-layer 8 --nextn 1 --seed 3
check_ppl "qwen35moe + MTP block F16" "$TMPD/q35mtp.gguf"
echo
echo "qwen35, qwen35moe vs llama.cpp ok"
