#!/usr/bin/env bash
# The low-bit weight types (issue 41 section 3), quantized by the anchor's
# llama-quantize and checked as test_qtypes_kjv.sh checks the others:
# - every quantized tensor, dequantized by kvseal, equals bit for bit what
#   llama-quantize --allow-requantize writes back to F32 (qdeq_cmp: the
#   block layouts, codebooks and scale encodings);
# - `kvseal perplexity` within PPL_TOL of llama-perplexity's (-c 128).
# Ternary TQ1_0 / TQ2_0 on the trained kjv-mini (its ffn_down rows of 704
# fall back to Q4_0). Measured (late 2026 anchor, with the uniform
# importance matrix below): both ppl 133.0490 vs 133.0000 (ratio 1.0004;
# the two files hold the same ternary digits).
# MXFP4_MOE on a random qwen3moe model (`kvseal mkmodel --arch qwen3moe`,
# 8 experts): the preset writes MXFP4 only to the expert tensors (the rest
# Q8_0). Measured: ppl 95500537 vs 95457937 (ratio 1.00045; the random
# model is that far from the text at any type).
# The codebook types on kjv-mini with a uniform importance matrix (which
# llama-quantize requires for most of them; written here): the presets
# IQ3_S, IQ3_XXS (which also writes IQ2_S and IQ3_S tensors), IQ2_S (IQ2_XS
# and IQ3_S), IQ2_XS, IQ2_XXS, IQ1_S and IQ1_M (both with IQ2_XXS). Measured
# ppl ratios (kvseal / llama.cpp): 0.9998, 1.0001, 1.0011, 1.0008, 0.9973,
# 1.0005, 1.0032, so the usual 0.5% holds even at 1.6-1.75 bits; the spread
# is the activations' rounding (kvseal's Q8_K d = amax/127 vs llama.cpp's
# -127/max), not the weights: those are llama.cpp's bit for bit.
# Greedy text is not compared here (test_qtypes_kjv.sh does it for the
# other types; for these it is not yet measured how often near ties part the
# two engines).
. "$(dirname "$0")/lib.sh"
QT_TEXT_BYTES=3000
. "$(dirname "$0")/qtypes_lib.sh"
VOCAB=$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf
[ -e "$VOCAB" ] || skip "$VOCAB is absent"
CMP=${KS_BUILD:-}/qdeq_cmp
[ -x "$CMP" ] || skip "qdeq_cmp is not built ($CMP)"
LOWBIT=${KS_LOWBIT_PRESETS:-"TQ1_0 TQ2_0 IQ3_S IQ3_XXS IQ2_S IQ2_XS IQ2_XXS IQ1_S IQ1_M"}
command -v python3 >/dev/null || skip "python3 is absent (it writes the importance matrix)"

# write_imatrix MODEL OUT — a uniform importance matrix of MODEL
# (scripts/uniform_imatrix.py): llama-quantize refuses IQ1_*, IQ2_XXS/XS/S
# and IQ3_XXS without one, and uniform importance is what these tests want.
write_imatrix() {
    "$KS_BIN" inspect "$1" | python3 "$KS_SRC/scripts/uniform_imatrix.py" "$2" ||
        fail "could not write the importance matrix of $1"
}
write_imatrix "$KS_SRC/models/kjv-mini.gguf" "$TMPD/ones.imatrix"

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
    "$A/llama-quantize" --imatrix "$TMPD/ones.imatrix" "$KS_SRC/models/kjv-mini.gguf" \
        "$TMPD/q.gguf" "$q" 2 >"$TMPD/q.log" 2>&1 ||
        fail "llama-quantize $q: $(tail -n 3 "$TMPD/q.log")"
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
