#!/usr/bin/env bash
# test_inspect.sh — `kvseal inspect` on the shipped kjv-mini model (header,
# keys, tensor table) and on broken files (exit 1 with a message naming the
# file and what is wrong). Env: KS_BIN (kvseal binary), KS_SRC (source dir).
set -u
BIN=${KS_BIN:?KS_BIN not set}
SRC=${KS_SRC:?KS_SRC not set}
MODEL="$SRC/models/kjv-mini.gguf"
[ -f "$MODEL" ] || { echo "SKIP: $MODEL absent"; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# --- a valid model ----------------------------------------------------------
"$BIN" inspect "$MODEL" >"$TMP/out" 2>"$TMP/err" || fail "inspect exited $? ($(cat "$TMP/err"))"
has() { grep -qE -- "$1" "$TMP/out" || fail "output lacks /$1/"; }
has '^version: +3$'
has '^alignment: +32$'
has '^tensors: +57$'
has '^kv count: +24$'
has '^data offset: +[0-9]+$'
has 'general\.architecture +string += "llama"'
has 'llama\.vocab_size +uint32 += 2048'
has 'llama\.attention\.head_count_kv +uint32 += 4'
has 'llama\.rope\.freq_base +float32 += 10000'
has 'tokenizer\.ggml\.tokens +array\[string; 2048\] += \["<unk>", "<s>", "</s>"'
has 'tokenizer\.ggml\.add_bos_token +bool += true'
has '^  token_embd\.weight +F16 +\[256, 2048\] +0 +1048576$'
has '^  blk\.0\.attn_norm\.weight +F32 +\[256\] '
has '^  blk\.5\.attn_k\.weight +F16 +\[256, 128\] '
has '^  blk\.5\.ffn_down\.weight +F16 +\[704, 256\] '
has '^  output\.weight +F16 +\[256, 2048\] '
has 'total: 57 tensors, 5475584 elements'
[ "$(grep -cE '^  blk\.[0-9]+\.' "$TMP/out")" = 54 ] || fail "expected 54 block tensors"
has '^runs: yes$'

# --- a valid GGUF kvseal cannot run: the loader's one-line reason ----------
# (the same file with another architecture: a byte-for-byte rename of the
# "llama" value and keys to "mamba", which keeps every offset)
LC_ALL=C sed 's/llama/mamba/g' "$MODEL" >"$TMP/mamba.gguf"
"$BIN" inspect "$TMP/mamba.gguf" >"$TMP/out" 2>"$TMP/err" || fail "inspect mamba exited $?"
has "^runs: no: .*mamba.gguf: unsupported architecture 'mamba' \\(supported: llama, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3, gemma4, glm4, glm4moe, deepseek2, deepseek32, glm-dsa, qwen35, qwen35moe, mistral3, nemotron_h, gpt-oss, bert, nomic-bert\\)"

# --- broken files: exit 1, message names the file and the problem ------------
expect_fail() {  # FILE REGEX
    "$BIN" inspect "$1" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    [ $rc = 1 ] || fail "inspect $1: exit $rc, want 1"
    grep -qE -- "$2" "$TMP/err" || fail "inspect $1: stderr lacks /$2/: $(cat "$TMP/err")"
    [ -s "$TMP/out" ] && fail "inspect $1 printed to stdout"
    return 0
}
head -c 100000 "$MODEL" >"$TMP/trunc.gguf"
expect_fail "$TMP/trunc.gguf" \
    "trunc\.gguf: tensor 'token_embd\.weight': data \[49312, 1097888\) extends past end of file \(100000 bytes\)"
head -c 2000 "$MODEL" >"$TMP/short.gguf"
expect_fail "$TMP/short.gguf" "short\.gguf: key 'tokenizer\.ggml\.tokens': truncated"
{ printf 'GGUX'; tail -c +5 "$MODEL"; } >"$TMP/magic.gguf"
expect_fail "$TMP/magic.gguf" "magic\.gguf: header: bad magic .*KS_ERR_FORMAT"
{ printf 'GGUF\001\000\000\000'; tail -c +9 "$MODEL"; } >"$TMP/v1.gguf"
expect_fail "$TMP/v1.gguf" "v1\.gguf: header: unsupported GGUF version 1.*KS_ERR_UNSUPPORTED"
: >"$TMP/empty.gguf"
expect_fail "$TMP/empty.gguf" "empty\.gguf: header: truncated"
expect_fail "$TMP/missing.gguf" "missing\.gguf: open: No such file"

# usage errors exit 2
"$BIN" inspect >/dev/null 2>&1; [ $? = 2 ] || fail "no argument: want exit 2"
echo "test_inspect: ok"
