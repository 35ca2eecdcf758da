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
PROMPTS=("In the beginning God created" "And the LORD said unto Moses," "For God so loved the world,")
mk() {  # OUT ARGS...
    local out=$1
    shift
    "$KS_BIN" mkmodel -o "$out" --vocab "$VOCAB" "$@" >/dev/null 2>"$TMPD/mk.err" ||
        fail "mkmodel $*: $(cat "$TMPD/mk.err")"
}
mk "$TMPD/qwen3moe.gguf" --arch qwen3moe --seed 5
mk "$TMPD/llama-moe.gguf" --arch llama --n-expert 4 --n-expert-used 2 --seed 6
for arch in qwen3moe llama-moe; do
    f16=$TMPD/$arch.gguf
    "$KS_BIN" inspect "$f16" | grep -q "^runs: yes" || fail "$arch: inspect does not say it runs"
    for q in F16 Q8_0 Q4_K_M; do
        m=$f16
        if [ "$q" != F16 ]; then
            quantize "$f16" "$TMPD/q.gguf" "$q"
            m=$TMPD/q.gguf
        fi
        check_ppl "$arch $q" "$m"
        if [ "$q" != Q4_K_M ]; then
            for p in "${PROMPTS[@]}"; do
                gen_same_or_tie "$m" "$p" || { echo; fail "$arch $q: greedy text differs ($G_NOTE):
  kvseal:    $G_KV
  llama.cpp: $G_LL"; }
                [ -z "$G_NOTE" ] || printf '  [%s]' "$G_NOTE"
            done
            printf '  greedy ok'
        fi
        echo
    done
done
echo "mixture of experts vs llama.cpp ok"
