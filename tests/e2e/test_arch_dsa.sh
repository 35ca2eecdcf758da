#!/usr/bin/env bash
# DeepSeek sparse attention (deepseek32, and GLM-5's glm-dsa) against
# llama.cpp. `kvseal mkmodel --arch deepseek32` writes deepseek2's latent
# attention plus the lightning indexer (8 heads of 64, rope part first and
# NEOX-paired, a LayerNorm'd key stored behind the rope key in the KV row)
# keeping the top 8 positions, so at context 128 a token attends to at most
# 8 of up to 127 past positions.
#   1. top_k 256 >= the context (every position kept): perplexity within 1%
#      (issue 11's bound; measured 0.03-0.55%) of llama.cpp's at F16, Q8_0
#      and Q4_K_M, for deepseek32 and glm-dsa (which llama.cpp always runs
#      dense), at unit qk-gain.
#   2. top_k 8: within 1% of llama.cpp's deepseek32 at F16 and Q4_K_M, 32
#      greedy tokens at F16; and the sparse result is not the dense one
#      (kvseal's own top_k 256 file differs by more than 2%).
#   3. glm-dsa at top_k 8 gives exactly kvseal's deepseek32 result on the
#      same tensors, where llama.cpp computes dense attention.
#   4. glm-dsa with MoE layers and a NextN block (GLM-5's layout) runs
#      without it, and agrees with llama.cpp.
# The checks can fail: the indexer's rope in interleaved pairs (not NEOX)
# misses llama.cpp by 3% at top_k 8 F16.
# Not checked: Q8_0 at top_k 8. The selection is a discrete choice, and on
# random weights a score that moves by rounding flips it; this model then
# amplifies a flip into percents of perplexity. Seen on this file: kvseal's
# own f32 / f16 / q8_0 KV give 67.6M / 67.3M / 63.6M, llama.cpp's 64.8M /
# 64.2M / 64.6M; other seeds land 0.98-1.03 at every type (llama.cpp notes
# the same of its own CPU and GPU backends).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/qtypes_lib.sh"
PPL_TOL=0.01
VOCAB=$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf
[ -e "$VOCAB" ] || skip "$VOCAB is absent"
mk() { mkmodel_to "$1" --arch "$2" --seed 21 --qk-gain 3 "${@:3}"; }  # OUT ARCH ARGS...
mk "$TMPD/ds32-wide.gguf" deepseek32 --idx-topk 256 --qk-gain 1
mk "$TMPD/glmdsa-wide.gguf" glm-dsa --idx-topk 256 --qk-gain 1
mk "$TMPD/ds32-wide3.gguf" deepseek32 --idx-topk 256
mk "$TMPD/ds32.gguf" deepseek32
mk "$TMPD/glmdsa.gguf" glm-dsa
for a in ds32 glmdsa; do
    for q in F16 Q8_0 Q4_K_M; do
        m=$TMPD/$a-wide.gguf
        [ $q = F16 ] || { quantize "$m" "$TMPD/q.gguf" $q; m=$TMPD/q.gguf; }
        check_ppl "$a top_k 256 $q" "$m"
        echo
    done
done
close1() { awk -v a="$1" -v b="$2" 'BEGIN { d = a / b - 1; if (d < 0) d = -d; exit !(d < 0.01) }'; }
for q in F16 Q4_K_M; do
    m=$TMPD/ds32.gguf
    [ $q = F16 ] || { quantize "$m" "$TMPD/q.gguf" $q; m=$TMPD/q.gguf; }
    kp=$(kv_ppl "$m"); lp=$(ll_ppl "$m")
    [ -n "$kp" ] && [ -n "$lp" ] || fail "deepseek32 top_k 8 $q: no perplexity (kvseal '$kp', llama.cpp '$lp')"
    printf 'ds32 top_k 8 %-6s ppl kvseal %-14s llama.cpp %-14s ratio %s\n' $q "$kp" "$lp" \
        "$(awk -v a="$kp" -v b="$lp" 'BEGIN { printf "%.5f", a / b }')"
    close1 "$kp" "$lp" || fail "deepseek32 top_k 8 $q: not within 1% of llama.cpp"
done
for p in "${ARCH_PROMPTS[@]}"; do
    gen_same_or_tie "$TMPD/ds32.gguf" "$p" || fail "deepseek32 top_k 8: greedy text differs ($G_NOTE):
  kvseal:    $G_KV
  llama.cpp: $G_LL"
done
echo "  greedy ok"
sparse=$(kv_ppl "$TMPD/ds32.gguf"); dense=$(kv_ppl "$TMPD/ds32-wide3.gguf")
awk -v a="$sparse" -v b="$dense" 'BEGIN { d = a / b - 1; if (d < 0) d = -d; exit !(d > 0.02) }' ||
    fail "top_k 8 ($sparse) is within 2% of top_k 256 ($dense): the selection drops nothing?"
echo "sparse $sparse vs dense $dense: the indexer's selection matters"
g=$(kv_ppl "$TMPD/glmdsa.gguf")
[ "$g" = "$sparse" ] || fail "glm-dsa top_k 8 gives $g, deepseek32 on the same tensors $sparse"
echo "glm-dsa top_k 8 = deepseek32's $g (llama.cpp, dense: $(ll_ppl "$TMPD/glmdsa.gguf"))"
# 4. GLM-5's layout: MoE layers and a NextN block after them, which
#    block_count counts and inference skips: the same perplexity as the file
#    without it (run as a fourth layer it moves it), and llama.cpp's, dense.
mk "$TMPD/g5.gguf" glm-dsa --n-expert 8 --n-expert-used 2 --idx-topk 256 --qk-gain 1
mk "$TMPD/g5-mtp.gguf" glm-dsa --n-expert 8 --n-expert-used 2 --idx-topk 256 --qk-gain 1 --nextn 1
a=$(kv_ppl "$TMPD/g5.gguf"); b=$(kv_ppl "$TMPD/g5-mtp.gguf")
[ -n "$a" ] && [ "$a" = "$b" ] || fail "glm-dsa with a NextN block gives '$b', without '$a'"
check_ppl "glm-dsa MoE + NextN F16" "$TMPD/g5-mtp.gguf"
echo "sparse attention vs llama.cpp ok"
