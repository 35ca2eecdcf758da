#!/usr/bin/env bash
# RoPE scaling against llama.cpp: linear, YaRN and Llama 3's per-pair
# rope_freqs tensor. For each, a tiny mkmodel model (the llama-spm vocab)
# gets kvseal's perplexity and the anchor's llama-perplexity on the same
# text at context 256, which is past YaRN's original context (64): they
# must agree within 0.5%. The same weights without the scaling, and YaRN
# read as linear, are each more than 0.5% away from llama.cpp's figure, so
# the check would catch a loader or a kern_rope_table_cfg that ignored the
# scaling or got the ramp wrong.
. "$(dirname "$0")/lib.sh"
A=${KS_ANCHOR:-$KS_SHARED/anchors/llama.cpp}
VOCAB=$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf
T=$KS_SHARED/models/kjv-heldout.txt
[ -x "$A/llama-perplexity" ] || skip "the llama.cpp anchor is not at $A"
[ -f "$VOCAB" ] && [ -f "$T" ] || skip "../shared vocab or text absent"
head -c 9000 "$T" >"$TMPD/text.txt" # 8 chunks of 256 tokens: the same for both

mk() { # NAME mkmodel-args...
    local n=$1
    shift
    "$KS_BIN" mkmodel -o "$TMPD/$n.gguf" --vocab "$VOCAB" --seed 3 -t 2 "$@" >/dev/null ||
        fail "mkmodel $n $*"
}
ks_ppl() {
    "$KS_BIN" perplexity -m "$TMPD/$1.gguf" -f "$TMPD/text.txt" -c 256 -t 2 2>"$TMPD/err" |
        sed -n 's/^perplexity: //p'
}
lc_ppl() { # asked again where the anchor's logger lost its last line (qtypes_lib.sh)
    local try v
    for try in 1 2 3 4 5 6 7 8 9 10; do
        v=$("$A/llama-perplexity" -m "$TMPD/$1.gguf" -f "$TMPD/text.txt" -c 256 -t 2 2>&1 |
            sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p')
        [ -n "$v" ] && break
    done
    echo "$v"
}
# |a - b| / b < 0.005
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; exit !(d < 0.005) }'; }

mk none
mk linear --rope-scale 4
mk yarn --rope-scale 4 --rope-type yarn --rope-orig-ctx 64
mk freqs --rope-freqs
base=$(ks_ppl none)
[ -n "$base" ] || fail "kvseal perplexity: $(cat "$TMPD/err")"
for n in linear yarn freqs; do
    k=$(ks_ppl $n)
    l=$(lc_ppl $n)
    [ -n "$k" ] && [ -n "$l" ] || fail "$n: no perplexity (kvseal [$k], llama.cpp [$l]): $(cat "$TMPD/err")"
    close "$k" "$l" || fail "$n: kvseal perplexity $k is not within 0.5% of llama.cpp's $l"
    close "$base" "$l" && fail "$n: the unscaled model's $base is within 0.5% of $l: the check cannot fail"
    echo "$n: kvseal $k, llama.cpp $l (unscaled $base)"
    [ $n = yarn ] && yarn=$l
done
close "$(ks_ppl linear)" "$yarn" && fail "YaRN read as linear is within 0.5% of llama.cpp's YaRN $yarn"
echo "rope scaling ok"
