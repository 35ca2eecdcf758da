#!/usr/bin/env bash
# The low-bit weight types (issue 41 section 3), quantized by the anchor's
# llama-quantize and checked as test_qtypes_kjv.sh checks the others:
# - every quantized tensor, dequantized by kvseal, equals bit for bit what
#   llama-quantize --allow-requantize writes back to F32 (qdeq_cmp: the
#   block layouts, codebooks and scale encodings);
# - `kvseal perplexity` within PPL_TOL of llama-perplexity's (-c 128).
# Ternary TQ1_0 / TQ2_0 on the trained kjv-mini (its ffn_down rows of 704
# fall back to Q4_0). Measured (late 2026 anchor): both ppl 130.4548 vs
# 130.4420 (ratio 1.0001; the two files hold the same ternary digits).
# MXFP4_MOE on a random qwen3moe model (`kvseal mkmodel --arch qwen3moe`,
# 8 experts): the preset writes MXFP4 only to the expert tensors (the rest
# Q8_0). Measured: ppl 95500537 vs 95457937 (ratio 1.00045; the random
# model is that far from the text at any type).
# Greedy text is not compared: at 1.6-2 bits kjv-mini's top logits are
# near ties on most steps.
. "$(dirname "$0")/lib.sh"
QT_TEXT_BYTES=3000
. "$(dirname "$0")/qtypes_lib.sh"
VOCAB=$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf
[ -e "$VOCAB" ] || skip "$VOCAB is absent"
CMP=${KS_BUILD:-}/qdeq_cmp
[ -x "$CMP" ] || skip "qdeq_cmp is not built ($CMP)"
LOWBIT=${KS_LOWBIT_PRESETS:-"TQ1_0 TQ2_0"}

# check_deq NAME MODEL — qdeq_cmp of MODEL against llama.cpp's F32 of it
check_deq() {
    local types
    "$A/llama-quantize" --allow-requantize "$2" "$TMPD/f32.gguf" F32 2 \
        >"$TMPD/q.log" 2>&1 || fail "llama-quantize $1 -> F32: $(tail -n 3 "$TMPD/q.log")"
    types=$("$CMP" "$2" "$TMPD/f32.gguf" 2>"$TMPD/cmp.err") ||
        fail "$1: dequantization differs from llama.cpp's: $(cat "$TMPD/cmp.err")"
    echo "$1: dequantized = llama.cpp's for$types"
}

for q in $LOWBIT; do
    quantize "$KS_SRC/models/kjv-mini.gguf" "$TMPD/q.gguf" "$q"
    check_deq "kjv-mini $q" "$TMPD/q.gguf"
    check_ppl "kjv-mini $q" "$TMPD/q.gguf"
    echo
done
if [ -z "${KS_LOWBIT_PRESETS:-}" ]; then
    mkmodel_to "$TMPD/moe.gguf" --arch qwen3moe --shape tiny --seed 3
    quantize "$TMPD/moe.gguf" "$TMPD/q.gguf" MXFP4_MOE
    "$KS_BIN" inspect "$TMPD/q.gguf" | grep -q "_exps.weight  *MXFP4 " ||
        fail "MXFP4_MOE wrote no MXFP4 expert tensor"
    check_deq "random qwen3moe MXFP4_MOE" "$TMPD/q.gguf"
    check_ppl "random qwen3moe MXFP4_MOE" "$TMPD/q.gguf"
    echo
fi
echo "low-bit quant types vs llama.cpp ok"
