#!/usr/bin/env bash
# test_serve_check.sh — the deploy-time sizing check (I8): `kvseal check`
# prints the pool arithmetic and exits 1 when one request of the advertised
# context cannot fit, `kvseal serve` refuses to start in that case (never
# printing "listening"), warns below 2x, and bad options / tenants files
# fail before binding with a precise message.
. "$(dirname "$0")/lib.sh"
M=$KS_SRC/models/kjv-mini.gguf

# kjv-mini: context 512 = 32 pages of 16 tokens
out=$("$KS_BIN" check -m "$M" --kv-pages 31 2>"$TMPD/err") && fail "check accepted 31 pages"
expect_has "check arithmetic" "$out" "31 pages x 16 tokens = 496 tokens"
expect_has "check need" "$out" "context length 512 needs 32 pages"
expect_has "check verdict" "$out" "DOES NOT FIT"
expect_has "check message" "$(cat "$TMPD/err")" "cannot hold one request of the advertised context length 512"

out=$("$KS_BIN" check -m "$M" --kv-pages 32 2>"$TMPD/err") || fail "check refused 32 pages: $(cat "$TMPD/err")"
expect_has "check exact fit" "$out" "fits, but below 2x"
expect_has "check warn" "$(cat "$TMPD/err")" "less than 2 requests"
out=$("$KS_BIN" check -m "$M" --kv-memory 6M --kv-type f32 2>/dev/null) || fail "check refused 6M"
expect_has "check kv-memory" "$out" "64 pages x 16 tokens = 1024 tokens"
expect_has "check ok" "$out" ": ok (2.00x the context)"
# the default KV type, f16, holds twice the tokens in the same memory
out=$("$KS_BIN" check -m "$M" --kv-memory 6M 2>/dev/null) || fail "check refused 6M (f16)"
expect_has "check kv-memory f16" "$out" "128 pages x 16 tokens = 2048 tokens"
expect_has "check kv type" "$out" "kv type f16, 3072 bytes/token"
expect_has "check planes" "$out" "49152 bytes/page = 6 layers x 2 planes (K, V) x 16 tokens x 256 B per 128-element row"
# a smaller advertised context fits a smaller pool
"$KS_BIN" check -m "$M" --kv-pages 16 --ctx 256 >/dev/null 2>&1 || fail "check refused --ctx 256 with 16 pages"
# automatic sizing from MemAvailable: at least 1x, at most 8x the context
out=$("$KS_BIN" check -m "$M" 2>/dev/null) || fail "automatic sizing failed"
expect_has "check auto" "$out" "context length 512 needs 32 pages"

# serve refuses to start on the same arithmetic, before binding
"$KS_BIN" serve -m "$M" --port 0 --kv-pages 31 >"$TMPD/out" 2>"$TMPD/err" && fail "serve started with 31 pages"
expect_has "serve refuses" "$(cat "$TMPD/err")" "refusing to start"
expect_has "serve arithmetic" "$(cat "$TMPD/err")" "DOES NOT FIT"
grep -q listening "$TMPD/out" && fail "serve printed listening"

# bad options and tenants files
"$KS_BIN" serve -m "$M" --kv-pages 64 --kv-memory 1G 2>"$TMPD/err" && fail "both pool sizes accepted"
expect_has "both sizes" "$(cat "$TMPD/err")" "not both"
"$KS_BIN" serve -m "$M" --scrub maybe 2>"$TMPD/err" && fail "bad --scrub accepted"
expect_has "bad scrub" "$(cat "$TMPD/err")" "zero or poison"
echo '{"tenants":[{"name":"a","keys":["k-secret"]},{"name":"b","keys":["k-secret"]}]}' >"$TMPD/t.json"
"$KS_BIN" serve -m "$M" --port 0 --tenants "$TMPD/t.json" >"$TMPD/out" 2>"$TMPD/err" && fail "shared key accepted"
expect_has "shared key" "$(cat "$TMPD/err")" "are the same key"
grep -q k-secret "$TMPD/err" && fail "tenants error printed a key"
"$KS_BIN" serve -m "$M" --port 0 --tenants "$TMPD/missing.json" >"$TMPD/out" 2>"$TMPD/err" && fail "missing tenants file accepted"
expect_has "missing tenants" "$(cat "$TMPD/err")" "missing.json"
echo "serve check ok"
