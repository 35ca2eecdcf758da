#!/usr/bin/env bash
# --kv-type f32|f16|q8_0 (default f16), end to end:
# - `kvseal check` prints the type and the bytes per token, and sizes the pool
#   of a given --kv-memory in bytes of that type (2x / ~3.8x the tokens of f32);
# - a bad value is refused by every subcommand, listing the choices; q8_0 on a
#   model whose head_dim is not a multiple of 32 is refused with the reason;
# - perplexity with f16 and q8_0 KV is within 0.5% of f32 KV on kjv-mini
#   (kjv-heldout.txt, -c 256, as test_perplexity.sh) and on a synthetic model
#   made by `kvseal mkmodel` (random weights; a shorter text).
# The cluster's refusal of a worker with another KV type: test_cluster_roles.sh.
. "$(dirname "$0")/lib.sh"
MODEL=$KS_SRC/models/kjv-mini.gguf

# sizing: kjv-mini has 6 layers x kv_dim 128; 8 MiB of 16-token pages
check() { "$KS_BIN" check -m "$MODEL" --ctx 512 --kv-memory 8M "$@" 2>"$TMPD/check.err"; }
out=$(check) || fail "check (default): $out $(cat "$TMPD/check.err")"
expect_has "default type" "$out" "kv type f16, 3072 bytes/token"
expect_has "default pages" "$out" "kv pool: 170 pages x 16 tokens = 2720 tokens"
out=$(check --kv-type f32) || fail "check f32: $out"
expect_has "f32 type" "$out" "kv type f32, 6144 bytes/token"
expect_has "f32 pages" "$out" "kv pool: 85 pages x 16 tokens = 1360 tokens"
out=$(check --kv-type q8_0) || fail "check q8_0: $out"
expect_has "q8_0 type" "$out" "kv type q8_0, 1632 bytes/token"
expect_has "q8_0 pages" "$out" "kv pool: 321 pages x 16 tokens = 5136 tokens"
expect_has "q8_0 row" "$out" "x 136 B per 128-element row"
# the same pages hold the same tokens whatever the type (I8 is about tokens)
out=$("$KS_BIN" check -m "$MODEL" --ctx 512 --kv-pages 32 --kv-type q8_0 2>&1) || fail "check pages: $out"
expect_has "pages: q8_0 fits" "$out" "= 512 tokens"

# bad values, every subcommand that takes the option
for cmd in check serve run perplexity bench prefill decode router; do
    out=$("$KS_BIN" $cmd -m "$MODEL" --kv-type q4_0 -p x -f /dev/null 2>&1); rc=$?
    expect_eq "$cmd --kv-type q4_0: status" "$rc" 2
    expect_has "$cmd --kv-type q4_0: message" "$out" "--kv-type expects f32, f16 or q8_0, got 'q4_0'"
done

# q8_0 blocks must not straddle heads: head_dim 16 is refused, f16 is fine
"$KS_BIN" mkmodel -o "$TMPD/hd16.gguf" --vocab "$MODEL" --shape tiny --head-dim 16 --seed 5 \
    >/dev/null 2>&1 || fail "mkmodel --head-dim 16"
out=$("$KS_BIN" check -m "$TMPD/hd16.gguf" --kv-pages 64 --kv-type q8_0 2>&1); rc=$?
expect_eq "q8_0 on head_dim 16: status" "$rc" 1
expect_has "q8_0 on head_dim 16: message" "$out" \
    "KV type q8_0 needs head_dim to be a multiple of 32"
expect_has "q8_0 on head_dim 16: the model's" "$out" "this model's head_dim is 16"
out=$("$KS_BIN" run -m "$TMPD/hd16.gguf" --kv-type q8_0 -p "In the beginning" -n 2 2>&1); rc=$?
expect_eq "run q8_0 on head_dim 16: status" "$rc" 1
expect_has "run q8_0 on head_dim 16: message" "$out" "needs head_dim to be a multiple of 32"
"$KS_BIN" check -m "$TMPD/hd16.gguf" --kv-pages 64 --kv-type f16 >/dev/null 2>&1 ||
    fail "f16 on head_dim 16 should be accepted"

# perplexity per KV type: f16 and q8_0 within 0.5% of f32
ppl() {  # ppl NAME MODEL TEXT CTX TYPE — prints the perplexity
    "$KS_BIN" perplexity -m "$2" -f "$3" -c "$4" --kv-type "$5" 2>"$TMPD/$1.err" |
        sed -n 's/^perplexity: //p'
}
within() {  # within WHAT GOT REF
    awk -v p="$2" -v r="$3" 'BEGIN { d = (p - r) / r; if (d < 0) d = -d; exit !(d < 0.005) }' ||
        fail "$1: perplexity $2 is not within 0.5% of f32 KV's $3"
}
T=$KS_SHARED/models/kjv-heldout.txt
[ -f "$T" ] || skip "$T is absent (../shared not present); the sizing and refusal checks passed"
head -c 6000 "$T" >"$TMPD/short.txt"
"$KS_BIN" mkmodel -o "$TMPD/tiny.gguf" --vocab "$MODEL" --shape tiny --seed 11 >/dev/null 2>&1 ||
    fail "mkmodel tiny"
for m in "kjv-mini $MODEL $T 256" "tiny $TMPD/tiny.gguf $TMPD/short.txt 128"; do
    set -- $m
    declare -A P
    for t in f32 f16 q8_0; do
        P[$t]=$(ppl "$1-$t" "$2" "$3" "$4" $t)
        [ -n "${P[$t]}" ] || fail "$1 $t: no perplexity ($(cat "$TMPD/$1-$t.err"))"
    done
    echo "$1: perplexity f32 ${P[f32]}, f16 ${P[f16]}, q8_0 ${P[q8_0]}"
    within "$1 f16" "${P[f16]}" "${P[f32]}"
    within "$1 q8_0" "${P[q8_0]}" "${P[f32]}"
done
echo "kv types ok"
