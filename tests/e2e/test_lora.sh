#!/usr/bin/env bash
# LoRA adapters against llama.cpp's --lora: an adapter made by `kvseal
# mklora` for kjv-mini (F32, F16 and Q8_0 factors; F16 kept as f16) moves the perplexity (the
# adapter does something), `kvseal perplexity --lora` is within 0.2% of
# llama-perplexity --lora on the same files, and 32 greedy tokens of
# `kvseal run --lora` equal llama-completion --lora's; a qwen3moe model's
# attention adapter agrees too. Skips the llama.cpp half where ../shared or
# the anchor is absent.
. "$(dirname "$0")/lib.sh"
M=$KS_SRC/models/kjv-mini.gguf
A=$KS_SHARED/anchors/llama.cpp
T=$KS_SHARED/models/kjv-heldout.txt
[ -f "$T" ] || skip "$T is absent (../shared not present)"
head -c 6000 "$T" >"$TMPD/text.txt"

"$KS_BIN" mklora -m "$M" -o "$TMPD/f32.gguf" --rank 16 --seed 5 --delta 0.2 2>"$TMPD/mk.err" ||
    fail "mklora f32: $(cat "$TMPD/mk.err")"
"$KS_BIN" mklora -m "$M" -o "$TMPD/f16.gguf" --rank 16 --alpha 32 --seed 7 --type f16 --delta 0.3 \
    2>"$TMPD/mk.err" || fail "mklora f16: $(cat "$TMPD/mk.err")"
# (mkmodel --lora-of is mklora under mkmodel's name: the same file)
"$KS_BIN" mkmodel --lora-of "$M" -o "$TMPD/q8.gguf" --rank 32 --alpha 16 --seed 9 --lora-type q8_0 \
    --lora-targets q,v,o,down --delta 0.4 2>"$TMPD/mk.err" || fail "mkmodel --lora-of: $(cat "$TMPD/mk.err")"
"$KS_BIN" mklora -m "$M" -o "$TMPD/q8b.gguf" --rank 32 --alpha 16 --seed 9 --type q8_0 \
    --targets q,v,o,down --delta 0.4 2>"$TMPD/mk.err" || fail "mklora q8_0: $(cat "$TMPD/mk.err")"
cmp -s "$TMPD/q8.gguf" "$TMPD/q8b.gguf" || fail "mkmodel --lora-of and mklora wrote different files"
# an adapter for another architecture's shapes is refused, named
"$KS_BIN" mklora -m "$M" -o "$TMPD/bad.gguf" --type q8_0 --rank 8 2>"$TMPD/mk.err" &&
    fail "mklora accepted q8_0 with rank 8"
expect_has "q8_0 rank" "$(cat "$TMPD/mk.err")" "multiple of 32"

kv_ppl() {  # [--lora FILE] — kvseal's perplexity of the text at -c 128
    "$KS_BIN" perplexity -m "$M" -f "$TMPD/text.txt" -c 128 -t 2 "$@" 2>"$TMPD/kv.err" |
        sed -n 's/^perplexity: //p'
}
# the anchor's logger may lose its last lines at exit on a loaded machine:
# asked again where the estimate is missing (qtypes_lib.sh's ll_ppl)
ll_ppl() {  # [--lora FILE]
    local try v
    for try in 1 2 3 4 5; do
        "$A/llama-perplexity" -m "$M" -f "$TMPD/text.txt" -c 128 -t 2 "$@" >"$TMPD/ll.log" 2>&1
        v=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$TMPD/ll.log")
        [ -n "$v" ] && break
    done
    echo "$v"
}
within() {  # A B TOL — |A/B - 1| < TOL
    awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a / b - 1; if (d < 0) d = -d; exit !(d < t) }'
}

base=$(kv_ppl)
[ -n "$base" ] || fail "perplexity: $(tail -n 3 "$TMPD/kv.err")"
"$KS_BIN" perplexity -m "$M" -f "$TMPD/text.txt" -c 128 -t 2 --lora "$TMPD/missing.gguf" \
    >/dev/null 2>"$TMPD/err" && fail "perplexity ran with a missing adapter"
for ad in f32 f16 q8; do
    p=$(kv_ppl --lora "$TMPD/$ad.gguf")
    [ -n "$p" ] || fail "perplexity --lora $ad: $(tail -n 3 "$TMPD/kv.err")"
    within "$p" "$base" 0.01 && fail "$ad: perplexity with the adapter $p is within 1% of the base's $base"
    # --lora-scale 0: the base's exactly
    p0=$(kv_ppl --lora "$TMPD/$ad.gguf" --lora-scale 0)
    expect_eq "$ad --lora-scale 0" "$p0" "$base"
    echo "$ad: perplexity $p (base $base)"
    eval "ppl_$ad=$p"
done

for f in "$A/llama-perplexity" "$A/llama-completion"; do
    [ -e "$f" ] || { echo "SKIP: $f is absent (the llama.cpp anchor not present): no comparison"; exit 0; }
done
[ -n "${KS_SANITIZE:-}" ] && { echo "SKIP: llama.cpp comparisons are not run under a sanitizer"; exit 0; }
for ad in f32 f16 q8; do
    lp=$(ll_ppl --lora "$TMPD/$ad.gguf")
    [ -n "$lp" ] || fail "llama-perplexity --lora $ad: $(tail -n 5 "$TMPD/ll.log")"
    eval "kp=\$ppl_$ad"
    echo "$ad: perplexity kvseal $kp llama.cpp $lp"
    # measured within 0.03%; 0.2% (not the 1% first asked for) so that an
    # adapter matrix left unapplied (attn_output: 0.4% off) fails
    within "$kp" "$lp" 0.002 || fail "$ad: kvseal's perplexity $kp is not within 0.2% of llama.cpp's $lp"
done

# greedy text: the prompt + kvseal's 32 tokens against llama-completion's
# (asked for 40, its leading SentencePiece space dropped: qtypes_lib.sh)
for p in "In the beginning God created" "And the LORD said unto Moses,"; do
    for ad in f32 f16 q8; do
        kv=$(printf '%s' "$p"; "$KS_BIN" run -m "$M" -p "$p" -n 32 --temp 0 -t 2 \
            --lora "$TMPD/$ad.gguf" 2>"$TMPD/run.err") || fail "run --lora: $(cat "$TMPD/run.err")"
        expect_has "run --lora" "$(cat "$TMPD/run.err")" "generated 32 tokens"
        base_kv=$(printf '%s' "$p"; "$KS_BIN" run -m "$M" -p "$p" -n 32 --temp 0 -t 2 2>/dev/null)
        [ "$kv" != "$base_kv" ] || fail "$ad: the adapter left the greedy text unchanged [$kv]"
        ok=""
        for try in 1 2 3 4 5; do
            ll=$("$A/llama-completion" -m "$M" -p "$p" -n 40 --temp 0 -t 2 --no-warmup -no-cnv \
                --lora "$TMPD/$ad.gguf" 2>/dev/null </dev/null | sed '1s/^ //')
            [ ${#ll} -gt ${#kv} ] || continue
            [ "${ll:0:${#kv}}" == "$kv" ] && ok=1
            break
        done
        [ -n "$ok" ] || fail "$ad: greedy text differs:
  kvseal:    $kv
  llama.cpp: ${ll:-}"
        echo "$ad: greedy ok [$kv]"
    done
done

# a MoE model: the adapter targets its attention (the experts are not
# targeted), and agrees with llama.cpp's --lora as the dense one does
"$KS_BIN" mkmodel -o "$TMPD/moe.gguf" --vocab "$M" --arch qwen3moe --seed 3 >/dev/null 2>&1 ||
    fail "mkmodel qwen3moe"
"$KS_BIN" mklora -m "$TMPD/moe.gguf" -o "$TMPD/moe-lora.gguf" --rank 16 --seed 2 --delta 0.3 \
    2>"$TMPD/mk.err" || fail "mklora on a MoE model: $(cat "$TMPD/mk.err")"
expect_has "MoE adapter: attention only" "$(cat "$TMPD/mk.err")" "8 matrices"
M=$TMPD/moe.gguf
mb=$(kv_ppl) mk=$(kv_ppl --lora "$TMPD/moe-lora.gguf") ml=$(ll_ppl --lora "$TMPD/moe-lora.gguf")
[ -n "$mb" ] && [ -n "$mk" ] && [ -n "$ml" ] || fail "MoE perplexities: [$mb] [$mk] [$ml]"
echo "qwen3moe: perplexity kvseal $mk llama.cpp $ml (base $mb)"
within "$mk" "$mb" 0.001 && fail "MoE: the adapter moved the perplexity less than 0.1%"
within "$mk" "$ml" 0.002 || fail "MoE: kvseal's perplexity $mk is not within 0.2% of llama.cpp's $ml"
echo PASS
