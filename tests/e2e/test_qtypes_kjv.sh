#!/usr/bin/env bash
# Every llama.cpp preset of the newer weight types (qtypes_lib.sh) on the
# shipped, really trained kjv-mini (F16; its ffn_down rows of 704 are not a
# multiple of 256, so the K-quant presets write their fallback type there),
# quantized by the anchor's llama-quantize:
# - every quantized tensor, dequantized by kvseal, equals bit for bit what
#   llama-quantize --allow-requantize writes back to F32 (the block layouts);
# - `kvseal perplexity` within 0.5% of llama-perplexity's (-c 128);
# - 32 greedy tokens identical to llama-completion's on two prompts, except
#   the near ties listed in GREEDY_TIES (preset:prompt), printed, not failed.
#   Measured with the anchor of late 2026: Q4_1, Q5_0, Q2_K, Q3_K_M, IQ4_NL
#   and IQ4_XS identical on both prompts; Q5_1:0 flips at token 5 ("And the
#   man" -> kvseal "said", llama.cpp "shall"); Q3_K_S:0/1, Q4_K_S:0,
#   Q5_K_S:1, Q5_K_M:1 flip after 15-25 identical tokens. Why these are ties
#   and not layout or kernel bugs: the dequantized weights are llama.cpp's bit
#   for bit (first check); kvseal's ref (double sums), AVX2 and AVX-512 give
#   the same text; on an F16 copy of the Q5_1 weights both engines say
#   "shall"; and Q5_K_S vs Q5_K_M swap the very same two continuations
#   ("Thus saith the LORD, I will not" / "..., Behold, I will bring")
#   between the engines. The flips come from the activation rounding:
#   kvseal's Q8_0 (scale rounded to f16 before dividing) and Q8_K (amax/127)
#   vs llama.cpp's Q8_1 and Q8_K (-127/signed max).
# (The random-weight model of test_qtypes_random.sh is checked on
# perplexity only; why is said there.)
. "$(dirname "$0")/lib.sh"
QT_TEXT_BYTES=3000
. "$(dirname "$0")/qtypes_lib.sh"
CMP=${KS_BUILD:-}/qdeq_cmp
[ -x "$CMP" ] || skip "qdeq_cmp is not built ($CMP)"
GREEDY_TIES=" Q5_1:0 Q3_K_S:0 Q3_K_S:1 Q4_K_S:0 Q5_K_S:1 Q5_K_M:1 "
for q in $PRESETS; do
    quantize "$KS_SRC/models/kjv-mini.gguf" "$TMPD/q.gguf" "$q"
    "$A/llama-quantize" --allow-requantize "$TMPD/q.gguf" "$TMPD/f32.gguf" F32 2 \
        >"$TMPD/q.log" 2>&1 || fail "llama-quantize $q -> F32: $(tail -n 3 "$TMPD/q.log")"
    types=$("$CMP" "$TMPD/q.gguf" "$TMPD/f32.gguf" 2>"$TMPD/cmp.err") ||
        fail "kjv-mini $q: dequantization differs from llama.cpp's: $(cat "$TMPD/cmp.err")"
    echo "kjv-mini $q: dequantized = llama.cpp's for$types"
    check_ppl "kjv-mini $q" "$TMPD/q.gguf"
    i=0
    for p in "${PROMPTS[@]}"; do
        if gen_same "$TMPD/q.gguf" "$p"; then
            printf '  greedy %d identical' $i
        else
            case "$GREEDY_TIES" in
            *" $q:$i "*) printf '\n  greedy %d differs (a known near tie, see the header):\n  kvseal:    %s\n  llama.cpp: %s' $i "$G_KV" "$G_LL" ;;
            *) echo; fail "kjv-mini $q: greedy text $i differs:
  kvseal:    $G_KV
  llama.cpp: $G_LL" ;;
            esac
        fi
        i=$((i + 1))
    done
    echo
done
echo "quant types on kjv-mini vs llama.cpp ok"
