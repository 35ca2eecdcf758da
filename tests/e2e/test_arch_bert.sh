#!/usr/bin/env bash
# test_arch_bert.sh — the bert (embedding encoder) architecture, so far:
# `kvseal mkmodel --arch bert` writes the keys and tensors a converted BERT
# file has (checked with inspect), in F16 and Q8_0, with mean or CLS
# pooling; llama.cpp's llama-server (the anchor) loads each file and serves
# unit-length embeddings of the model's width from /v1/embeddings; kvseal
# itself still refuses to run the architecture, by name (the encoder is the
# next step of issue 41). Needs $KS_SHARED/vocab-wpm (the bert-bge vocab).
. "$(dirname "$0")/lib.sh"

VOCAB=$KS_SHARED/vocab-wpm/ggml-vocab-bert-bge.gguf
A=$KS_SHARED/anchors/llama.cpp/llama-server
[ -f "$VOCAB" ] || skip "no $VOCAB (the shared WordPiece vocab)"

mk() { "$KS_BIN" mkmodel --vocab "$VOCAB" --arch bert "$@" >"$TMPD/mk.out" 2>"$TMPD/mk.err" ||
       fail "mkmodel $*: $(cat "$TMPD/mk.err")"; }
has() { grep -qE -- "$1" "$TMPD/out" || fail "$2: inspect output lacks /$1/"; }

mk -o "$TMPD/f16.gguf" --n-head 4
mk -o "$TMPD/q8.gguf" --n-head 4 --type q8_0 --pooling cls
for f in f16 q8; do
    "$KS_BIN" inspect "$TMPD/$f.gguf" >"$TMPD/out" 2>&1
    has '^tensors: +37$' $f
    has 'general\.architecture +string += "bert"' $f
    has 'bert\.attention\.causal +bool += false' $f
    has 'bert\.attention\.layer_norm_epsilon +float32' $f
    has 'tokenizer\.ggml\.model +string += "bert"' $f
    has '^  position_embd\.weight +F32 +\[256, 512\] ' $f
    has '^  token_types\.weight +F32 +\[256, 2\] ' $f
    has '^  blk\.1\.layer_output_norm\.bias +F32 +\[256\] ' $f
    has "^runs: no: .*unsupported architecture 'bert'" $f
done
"$KS_BIN" inspect "$TMPD/f16.gguf" >"$TMPD/out" 2>&1
has 'bert\.pooling_type +uint32 += 1$' f16
has '^  blk\.0\.attn_q\.weight +F16 +\[256, 256\] ' f16
"$KS_BIN" inspect "$TMPD/q8.gguf" >"$TMPD/out" 2>&1
has 'bert\.pooling_type +uint32 += 2$' q8
has '^  blk\.0\.ffn_up\.weight +Q8_0 +\[256, 512\] ' q8
"$KS_BIN" mkmodel --vocab "$VOCAB" -o "$TMPD/bad.gguf" --pooling cls >/dev/null 2>"$TMPD/err" &&
    fail "--pooling accepted for llama"
grep -q "pooling is bert's" "$TMPD/err" || fail "--pooling refusal: $(cat "$TMPD/err")"

[ -x "$A" ] || { echo "note: no llama.cpp anchor at $A: the files are not loaded there"; echo "ok"; exit 0; }
for f in f16 q8; do
    port=$((20000 + RANDOM % 20000))
    "$A" -m "$TMPD/$f.gguf" --embedding --host 127.0.0.1 --port $port -t 2 -c 512 \
        >"$TMPD/ls_$f.log" 2>&1 &
    LPID=$!
    trap 'kill -KILL $LPID 2>/dev/null; rm_tmpd' EXIT
    wait_for "llama-server on $f" curl -fsS "http://127.0.0.1:$port/health"
    curl -fsS "http://127.0.0.1:$port/v1/embeddings" \
        -d '{"input":["Hello world","The quick brown fox jumps over the lazy dog."]}' \
        >"$TMPD/emb_$f.json" || fail "llama-server /v1/embeddings ($f)"
    python3 - "$TMPD/emb_$f.json" <<'PY' || fail "llama-server embeddings ($f): $(head -c 300 "$TMPD/emb_$f.json")"
import json, math, sys
d = json.load(open(sys.argv[1]))["data"]
assert len(d) == 2
for e in d:
    v = e["embedding"]
    n = math.sqrt(sum(x * x for x in v))
    assert len(v) == 256 and abs(n - 1) < 1e-3, (len(v), n)
PY
    kill $LPID
    wait $LPID 2>/dev/null
done
echo "ok: bert files from mkmodel load in llama.cpp (F16 mean, Q8_0 CLS)"
