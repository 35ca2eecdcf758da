#!/usr/bin/env bash
# test_arch_bert.sh — the bert (embedding encoder) architecture:
# `kvseal mkmodel --arch bert` writes the keys and tensors a converted BERT
# file has (checked with inspect), in F16 (mean pooling) and Q8_0 (CLS);
# `kvseal serve` embeds several inputs (one request, and each alone: the
# same vectors) within cosine 0.9999 of llama.cpp's llama-server (the
# anchor) on the same file; completions and chat are a clear 400 (no LM
# head); an input past the batch (the encoder reads it whole) is a 400
# context_length_exceeded; the OpenAI npm client's embeddings.create works
# (js/embed_client.mjs); through the cluster, serve's vectors bit for bit
# and the same refusals. nomic-bert (RoPE, SwiGLU, no biases) likewise: F16
# with --qk-gain 3, so that attention depends on position (the wrong RoPE
# pairing then misses by cosine 0.3), and Q8_0 at unit gain (at gain 3 the
# Q8_0 file's rounding moves each engine's vectors from its own F16 ones
# by the same cosine 0.9988, in different directions, and they agree only
# to 0.9994 there; see docs/models.md). Needs
# $KS_SHARED/vocab-wpm (the bert-bge vocab).
. "$(dirname "$0")/lib.sh"

VOCAB=$KS_SHARED/vocab-wpm/ggml-vocab-bert-bge.gguf
A=$KS_SHARED/anchors/llama.cpp/llama-server
[ -f "$VOCAB" ] || skip "no $VOCAB (the shared WordPiece vocab)"

mk() { "$KS_BIN" mkmodel --vocab "$VOCAB" --arch bert "$@" >"$TMPD/mk.out" 2>"$TMPD/mk.err" ||
       fail "mkmodel $*: $(cat "$TMPD/mk.err")"; }
has() { grep -qE -- "$1" "$TMPD/out" || fail "$2: inspect output lacks /$1/"; }

mk -o "$TMPD/f16.gguf" --n-head 4
mk -o "$TMPD/q8.gguf" --n-head 4 --type q8_0 --pooling cls
mkn() { "$KS_BIN" mkmodel --vocab "$VOCAB" --arch nomic-bert --n-head 4 "$@" \
        >"$TMPD/mk.out" 2>"$TMPD/mk.err" || fail "mkmodel nomic-bert $*: $(cat "$TMPD/mk.err")"; }
mkn -o "$TMPD/nf16.gguf" --qk-gain 3
mkn -o "$TMPD/nq8.gguf" --type q8_0
"$KS_BIN" inspect "$TMPD/nf16.gguf" >"$TMPD/out" 2>&1
has '^tensors: +22$' nf16
has 'nomic-bert\.attention\.causal +bool += false' nf16
has '^  blk\.0\.attn_qkv\.weight +F16 +\[256, 768\] ' nf16
has '^  blk\.1\.ffn_gate\.weight +F16 +\[256, 512\] ' nf16
has '^runs: yes$' nf16
grep -q 'position_embd' "$TMPD/out" && fail "nf16: nomic-bert has no position_embd"
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
    has '^runs: yes$' $f
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


INPUTS='["Hello world","The quick brown fox jumps over the lazy dog.","Äpfel, café & naïve Zürich: 3.14159!","你好，世界 — こんにちは","a"]'
# embed URL FILE — POSTs the inputs to URL/v1/embeddings, the answer to FILE
AUTH=(-H "Authorization: Bearer sk-bert-test" -H 'Content-Type: application/json')
echo '{"tenants":[{"name":"t","keys":["sk-bert-test"],"max_concurrent":8}]}' >"$TMPD/t.json"
embed() {
    curl -fsS "$1/v1/embeddings" "${AUTH[@]}" \
        -d "{\"model\":\"m\",\"input\":$INPUTS}" >"$2" || fail "POST $1/v1/embeddings"
}
for f in f16 q8 nf16 nq8; do
    start_server "$TMPD/ks_$f.log" -m "$TMPD/$f.gguf" --alias m --threads 2 --batch 128 \
        --tenants "$TMPD/t.json"
    embed "$KS_URL" "$TMPD/ks_$f.json"
    # one input alone gives the same vector as in the batch of five
    curl -fsS "$KS_URL/v1/embeddings" "${AUTH[@]}" \
        -d '{"model":"m","input":"The quick brown fox jumps over the lazy dog."}' >"$TMPD/one_$f.json" ||
        fail "POST one input"
    # no LM head: completions and chat are refused
    for ep in completions chat/completions; do
        body='{"model":"m","prompt":"Hello","max_tokens":2}'
        [ $ep = completions ] || body='{"model":"m","messages":[{"role":"user","content":"hi"}]}'
        code=$(curl -sS -o "$TMPD/r.json" -w '%{http_code}' "$KS_URL/v1/$ep" \
            "${AUTH[@]}" -d "$body")
        expect_eq "$f /v1/$ep status" "$code" 400
        expect_has "$f /v1/$ep" "$(cat "$TMPD/r.json")" "embedding encoder"
    done
    # the input is read whole in one batch: past --batch 128 it is refused
    long=$(printf 'word %.0s' $(seq 200))
    code=$(curl -sS -o "$TMPD/r.json" -w '%{http_code}' "$KS_URL/v1/embeddings" \
        "${AUTH[@]}" -d "{\"model\":\"m\",\"input\":\"$long\"}")
    expect_eq "$f long input status" "$code" 400
    expect_has "$f long input" "$(cat "$TMPD/r.json")" "context_length_exceeded"
    if [ $f = f16 ] && command -v node >/dev/null &&
        [ -d "$(dirname "$0")/js/node_modules/openai" ]; then
        KS_URL=$KS_URL KS_KEY=sk-bert-test KS_MODEL_NAME=m KS_OUT=$TMPD/node.json \
            node "$(dirname "$0")/js/embed_client.mjs" || fail "embeddings client checks failed"
    fi
    stop_server
done

# through the cluster (router + prefill worker): the same vectors, bit for
# bit, and the same refusals
TENANTS_ARGS=(--tenants "$TMPD/t.json")
CLUSTER_PROBE_MODEL=m CLUSTER_PROBE_EMBED=1 CLUSTER_PROBE_AUTH=sk-bert-test ROUTER_ARGS="${TENANTS_ARGS[*]}" \
    start_cluster "$TMPD/c" 1 1 -m "$TMPD/f16.gguf" --alias m --threads 2 --batch 128
embed "$KS_URL" "$TMPD/cl_f16.json"
python3 - "$TMPD/ks_f16.json" "$TMPD/cl_f16.json" <<'PY' || fail "cluster vectors differ from serve's"
import json, sys
a, b = (json.load(open(f))["data"] for f in sys.argv[1:])
assert len(a) == len(b) == 5, (len(a), len(b))
for x, y in zip(a, b):
    assert x["embedding"] == y["embedding"], x["index"]
PY
for ep in completions chat/completions; do
    body='{"model":"m","prompt":"Hello","max_tokens":2}'
    [ $ep = completions ] || body='{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    code=$(curl -sS -o "$TMPD/r.json" -w '%{http_code}' "$KS_URL/v1/$ep" "${AUTH[@]}" -d "$body")
    expect_eq "cluster /v1/$ep status ($(cat "$TMPD/r.json"))" "$code" 400
    expect_has "cluster /v1/$ep" "$(cat "$TMPD/r.json")" "embedding encoder"
done
long=$(printf 'word %.0s' $(seq 200))
code=$(curl -sS -o "$TMPD/r.json" -w '%{http_code}' "$KS_URL/v1/embeddings" \
    "${AUTH[@]}" -d "{\"model\":\"m\",\"input\":\"$long\"}")
expect_eq "cluster long input status" "$code" 400
expect_has "cluster long input" "$(cat "$TMPD/r.json")" "context_length_exceeded"
stop_cluster

[ -x "$A" ] || skip "no llama.cpp anchor at $A (kvseal's own checks passed)"
# llama-server's up: its /health answers; false at once (LS_DEAD set) if it exited
ls_up() { curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
          kill -0 $LPID 2>/dev/null || { LS_DEAD=1; return 0; }; return 1; }
for f in f16 q8 nf16 nq8; do
    for try in 1 2 3 4 5; do # a random port below the ephemeral range; another if it is taken
        port=$((20000 + RANDOM % 12000))
        "$A" -m "$TMPD/$f.gguf" --embedding --host 127.0.0.1 --port $port -t 2 -c 512 \
            >"$TMPD/ls_$f.log" 2>&1 &
        LPID=$!
        trap 'kill -KILL $LPID 2>/dev/null; rm_tmpd' EXIT
        LS_DEAD=
        wait_for "llama-server on $f" ls_up
        [ -z "$LS_DEAD" ] && break
        [ $try -lt 5 ] || fail "llama-server on $f exited: $(tail -3 "$TMPD/ls_$f.log")"
    done
    embed "http://127.0.0.1:$port" "$TMPD/ll_$f.json"
    kill $LPID
    wait $LPID 2>/dev/null
    python3 - "$TMPD/ks_$f.json" "$TMPD/ll_$f.json" "$TMPD/one_$f.json" "$f" <<'PY' || fail "$f: kvseal and llama.cpp embeddings differ"
import json, math, sys
ks = [e["embedding"] for e in sorted(json.load(open(sys.argv[1]))["data"], key=lambda e: e["index"])]
ll = [e["embedding"] for e in sorted(json.load(open(sys.argv[2]))["data"], key=lambda e: e["index"])]
one = json.load(open(sys.argv[3]))["data"][0]["embedding"]
assert len(ks) == len(ll) == 5, (len(ks), len(ll))
assert one == ks[1], "an input alone differs from it in a batch"
worst_cos, worst_abs = 1.0, 0.0
for a, b in zip(ks, ll):
    assert len(a) == len(b) == 256, (len(a), len(b))
    cos = sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    worst_cos = min(worst_cos, cos)
    worst_abs = max(worst_abs, max(abs(x - y) for x, y in zip(a, b)))
print("%s: 5 inputs, worst cosine %.7f, max |diff| %.2e" % (sys.argv[4], worst_cos, worst_abs))
assert worst_cos >= 0.9999 and worst_abs < 5e-3
PY
done
echo "ok: bert and nomic-bert embeddings from kvseal match llama.cpp's (F16, Q8_0; mean, CLS)"
