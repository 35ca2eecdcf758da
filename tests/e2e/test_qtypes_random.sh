#!/usr/bin/env bash
# Every llama.cpp preset of the newer weight types (qtypes_lib.sh: Q4_1,
# Q5_0, Q5_1, Q2_K, Q3_K_S/M, Q4_K_S, Q5_K_S/M, IQ4_NL, IQ4_XS) on a model
# made by `kvseal mkmodel` at F16 (llama-spm vocab, random weights; n_ff 544,
# so ffn_down's rows are not a multiple of 256 and each K-quant preset writes
# its fallback type there) and quantized by the anchor's llama-quantize:
# `kvseal perplexity` within 0.5% of llama-perplexity's (-c 128).
#
# Greedy tokens are compared on the trained kjv-mini instead
# (test_qtypes_kjv.sh): on this random model the top two logits are often
# near ties, which the two engines' different activation rounding breaks
# differently. Measured: the F16 and Q8_0 files give identical 32-token
# greedy text, but Q4_0 and Q4_K_M — types kvseal already matched llama.cpp
# on — diverge after 10-20 tokens on one of the two prompts, and the newer
# types do the same (some prompts identical, others diverging mid-way),
# while on kjv-mini all but one (a near tie, listed there) are identical.
# The random model's greedy text is compared for Q8_0, as a check of the
# comparison itself.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/qtypes_lib.sh"
VOCAB=$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf
[ -e "$VOCAB" ] || skip "$VOCAB is absent"
"$KS_BIN" mkmodel -o "$TMPD/f16.gguf" --vocab "$VOCAB" --shape tiny --n-ff 544 --seed 3 \
    >/dev/null 2>"$TMPD/mk.err" || fail "mkmodel: $(cat "$TMPD/mk.err")"
quantize "$TMPD/f16.gguf" "$TMPD/q.gguf" Q8_0
check_ppl "random Q8_0" "$TMPD/q.gguf"
for p in "${PROMPTS[@]}"; do
    gen_same "$TMPD/q.gguf" "$p" || { echo; fail "random Q8_0: greedy text differs:
  kvseal:    $G_KV
  llama.cpp: $G_LL"; }
done
echo "  greedy identical"
for q in $PRESETS; do
    quantize "$TMPD/f16.gguf" "$TMPD/q.gguf" "$q"
    check_ppl "random $q" "$TMPD/q.gguf"
    echo
done
echo "quant types on a random model vs llama.cpp ok"
