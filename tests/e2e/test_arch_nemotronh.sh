#!/usr/bin/env bash
# nemotron_h (NVIDIA Nemotron-H / Nemotron Nano v2: hybrid Mamba2) against
# llama.cpp: one norm and one mixer per layer, the layer kinds in the
# file's per-layer head_count_kv / feed_forward_length arrays. Mamba2
# layers: ssm_in's z | x B C | dt rows, the causal convolution over x|B|C
# with its bias and SiLU, per head softplus(dt + dt_bias), the decay
# exp(dt A), the state fed by B x dt and read by C (8 heads over 2 groups:
# head h reads group h / 4), the D skip, silu(z) and the RMSNorm per group;
# attention layers without RoPE; MLP layers of relu(up x)^2. A `kvseal
# mkmodel --arch nemotron_h` model (llama-spm vocabulary) through the
# check_arch matrix (qtypes_lib.sh: perplexity within 0.5% at F16, Q8_0,
# Q4_K_M, greedy text at F16 and Q8_0), then with --qk-gain 3 at F16 on a
# longer pattern with two attention layers. Measured 2026-12-06, seeds 5-8:
# perplexity ratios F16 0.99996-1.00010, Q8_0 0.9996-1.0015, Q4_K_M
# 0.9996-1.0016; F32 1.00002 (seed 5). Seed 5's Q8_0 greedy text parts at
# token 22 by a log-prob margin of 0.127 (past TIE_LP): Q8_0 rounding carried
# through the recurrence, as qwen35moe's seed 6; seeds 6-8 part only at near
# ties. Reading group h % groups instead of h / (heads / groups) is off by 5%.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/qtypes_lib.sh"
VOCAB=$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf
[ -e "$VOCAB" ] || skip "$VOCAB is absent"
mkmodel_to "$TMPD/nh.gguf" --arch nemotron_h --seed 6
check_arch nemotron_h "$TMPD/nh.gguf"
mkmodel_to "$TMPD/nh3.gguf" --arch nemotron_h --pattern 'M-M*-M-M-M*-M-' --seed 6 --qk-gain 3
check_ppl "nemotron_h qk-gain 3 F16" "$TMPD/nh3.gguf"
check_greedy "nemotron_h qk-gain 3" "$TMPD/nh3.gguf"
echo
echo "nemotron_h vs llama.cpp ok"
