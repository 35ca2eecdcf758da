#!/usr/bin/env bash
# kvseal perplexity on kjv-heldout.txt with -c 256 agrees with llama.cpp's
# 42.84 (models/kjv-mini.README.md) within 0.5%, with f32 attention and, where
# the CPU has it, KS_ATTN=bf16.
. "$(dirname "$0")/lib.sh"
T=$KS_SHARED/models/kjv-heldout.txt
[ -f "$T" ] || skip "$T is absent (../shared not present)"
out=$("$KS_BIN" perplexity -m "$KS_SRC/models/kjv-mini.gguf" -f "$T" -c 256 2>"$TMPD/err") || fail "perplexity: $(cat "$TMPD/err")"
expect_has "chunks" "$(cat "$TMPD/err")" "8702 tokens, 33 chunks of 256"
ppl=$(echo "$out" | sed -n 's/^perplexity: //p')
[ -n "$ppl" ] || fail "no 'perplexity:' line in [$out]"
awk -v p="$ppl" 'BEGIN { d = (p - 42.84) / 42.84; if (d < 0) d = -d; exit !(d < 0.005) }' ||
    fail "perplexity $ppl is not within 0.5% of 42.84"
echo "perplexity $ppl ok"
# the BF16 attention kernel (KS_ATTN=bf16) keeps it within 0.5% of llama.cpp's too
if "$KS_BIN" --version 2>/dev/null | grep -q "cpu features:.* avx512bf16"; then
    out=$(KS_ATTN=bf16 "$KS_BIN" perplexity -m "$KS_SRC/models/kjv-mini.gguf" -f "$T" -c 256 2>"$TMPD/err") ||
        fail "perplexity, KS_ATTN=bf16: $(cat "$TMPD/err")"
    ppl=$(echo "$out" | sed -n 's/^perplexity: //p')
    awk -v p="$ppl" 'BEGIN { d = (p - 42.84) / 42.84; if (d < 0) d = -d; exit !(d < 0.005) }' ||
        fail "KS_ATTN=bf16: perplexity $ppl is not within 0.5% of 42.84"
    echo "KS_ATTN=bf16: perplexity $ppl ok"
else
    echo "KS_ATTN=bf16: skipped (no AVX512-BF16 on this CPU)"
fi
