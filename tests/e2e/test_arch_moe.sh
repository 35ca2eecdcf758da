#!/usr/bin/env bash
# Mixture of experts against llama.cpp: a qwen3moe model (8 experts, 2 per
# token, experts narrower than the dense FFN) and a Mixtral-style llama MoE
# (4 experts, 2 per token), each made by `kvseal mkmodel` at F16 with the
# llama-spm vocabulary and quantized by the anchor's llama-quantize.
# `kvseal perplexity` within 0.5% of llama-perplexity's (-c 128) at F16,
# Q8_0 and Q4_K_M, and 32 greedy tokens identical to llama-completion's at
# F16 and Q8_0 on three prompts, or parting only at a near tie (qtypes_lib.sh
# gen_same_or_tie: on these random weights one of the six Q8_0 texts parts
# at a log-prob margin of 0.018). (A fourth prompt, "The LORD is my shepherd;
# I shall", gives the same tokens, but one is a lone UTF-8 lead byte that
# kvseal prints as U+FFFD and llama.cpp as the raw byte.)
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/qtypes_lib.sh"
VOCAB=$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf
[ -e "$VOCAB" ] || skip "$VOCAB is absent"
mk() { mkmodel_to "$@"; }  # OUT ARGS...
mk "$TMPD/qwen3moe.gguf" --arch qwen3moe --seed 5
mk "$TMPD/llama-moe.gguf" --arch llama --n-expert 4 --n-expert-used 2 --seed 6
check_arch qwen3moe "$TMPD/qwen3moe.gguf"
check_arch llama-moe "$TMPD/llama-moe.gguf"
echo "mixture of experts vs llama.cpp ok"
