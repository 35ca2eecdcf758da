#!/usr/bin/env bash
# phi3 against llama.cpp: fused QKV (attn_qkv) and gate/up (ffn_up of 2 n_ff
# rows) tensors, NEOX RoPE, and LongRoPE (rope_factors_short/long with
# rope.scaling.attn_factor; the long factors are used when the context
# exceeds rope.scaling.original_context_length, as llama.cpp chooses).
# Models from `kvseal mkmodel --arch phi3` with the phi-3 vocabulary.
# `kvseal perplexity` within 0.5% of llama-perplexity's (-c 128) at F16,
# Q8_0 and Q4_K_M, and 32 greedy tokens identical (or parting only at a near
# tie, qtypes_lib.sh) at F16 and Q8_0; for LongRoPE, the same weights with
# an original context of 64 (long factors at -c 128) and of 256 (short
# ones), which llama.cpp itself rates more than 0.5% apart, so a wrong
# choice of factors would fail.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/qtypes_lib.sh"
VOCAB=$KS_SHARED/vocab/ggml-vocab-phi-3.gguf
[ -e "$VOCAB" ] || skip "$VOCAB is absent"
mk() { mkmodel_to "$1" --arch phi3 "${@:2}"; }  # OUT ARGS...
mk "$TMPD/phi3.gguf" --seed 7
check_arch phi3 "$TMPD/phi3.gguf"
mk "$TMPD/long.gguf" --seed 8 --longrope --rope-orig-ctx 64
mk "$TMPD/short.gguf" --seed 8 --longrope --rope-orig-ctx 256
check_ppl "phi3 longrope long" "$TMPD/long.gguf"
echo
ll_long=$(ll_ppl "$TMPD/long.gguf")
check_ppl "phi3 longrope short" "$TMPD/short.gguf"
echo
ll_short=$(ll_ppl "$TMPD/short.gguf")
awk -v a="$ll_long" -v b="$ll_short" 'BEGIN { d = a / b - 1; if (d < 0) d = -d; exit !(d > 0.005) }' ||
    fail "long and short RoPE factors are within 0.5% in llama.cpp ($ll_long, $ll_short): the check proves nothing"
echo "phi3 vs llama.cpp ok (long vs short factors: llama.cpp $ll_long vs $ll_short)"
