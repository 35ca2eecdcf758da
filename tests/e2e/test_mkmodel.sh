#!/usr/bin/env bash
# test_mkmodel.sh — `kvseal mkmodel`: tiny models from the llama-spm vocab
# are byte-identical across runs and thread counts, differ by seed, and have
# the expected keys, tensors, shapes and types (checked with `inspect`); bad
# shapes for a block type are refused. Env: KS_BIN, KS_SHARED.
set -u
BIN=${KS_BIN:?KS_BIN not set}
VOCAB="${KS_SHARED:-../shared}/vocab/ggml-vocab-llama-spm.gguf"
[ -f "$VOCAB" ] || { echo "SKIP: $VOCAB absent"; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
mk() { "$BIN" mkmodel --vocab "$VOCAB" "$@" >"$TMP/mk.out" 2>"$TMP/mk.err" \
       || fail "mkmodel $*: exit $? ($(cat "$TMP/mk.err"))"; }
inspect() { "$BIN" inspect "$1" >"$TMP/out" 2>"$TMP/err" || fail "inspect $1: $(cat "$TMP/err")"; }
has() { grep -qE -- "$1" "$TMP/out" || fail "${2:-model}: inspect output lacks /$1/"; }
lacks() { grep -qE -- "$1" "$TMP/out" && fail "${2:-model}: inspect output has /$1/"; return 0; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

# --- determinism ---------------------------------------------------------------
mk -o "$TMP/a.gguf" --seed 7
mk -o "$TMP/b.gguf" --seed 7 -t 1
mk -o "$TMP/c.gguf" --seed 7 -t 3
[ "$(sha "$TMP/a.gguf")" = "$(sha "$TMP/b.gguf")" ] || fail "same seed, different bytes (-t 1)"
[ "$(sha "$TMP/a.gguf")" = "$(sha "$TMP/c.gguf")" ] || fail "same seed, different bytes (-t 3)"
mk -o "$TMP/d.gguf" --seed 8
[ "$(sha "$TMP/a.gguf")" != "$(sha "$TMP/d.gguf")" ] || fail "seed has no effect"
ls "$TMP" | grep -q tmp && fail "temporary file left behind"

# --- default: llama tiny, F16 ------------------------------------------------------
inspect "$TMP/a.gguf"
has '^tensors: +21$' tiny
has 'general\.architecture +string += "llama"'
has 'general\.file_type +uint32 += 1$'
has 'llama\.vocab_size +uint32 += 32000'
has 'llama\.context_length +uint32 += 512'
has 'llama\.embedding_length +uint32 += 256'
has 'llama\.block_count +uint32 += 2$'
has 'llama\.feed_forward_length +uint32 += 512'
has 'llama\.attention\.head_count +uint32 += 8$'
has 'llama\.attention\.head_count_kv +uint32 += 2$'
has 'llama\.rope\.dimension_count +uint32 += 32$'
has 'llama\.rope\.freq_base +float32 += 10000$'
has 'llama\.attention\.layer_norm_rms_epsilon +float32'
has 'tokenizer\.ggml\.model +string += "llama"'
has 'tokenizer\.ggml\.tokens +array\[string; 32000\] += \["<unk>", "<s>", "</s>"'
has 'tokenizer\.ggml\.scores +array\[float32; 32000\]'
has '^  token_embd\.weight +F16 +\[256, 32000\] '
has '^  blk\.0\.attn_norm\.weight +F32 +\[256\] '
has '^  blk\.1\.attn_q\.weight +F16 +\[256, 256\] '
has '^  blk\.1\.attn_k\.weight +F16 +\[256, 64\] '
has '^  blk\.1\.attn_v\.weight +F16 +\[256, 64\] '
has '^  blk\.1\.attn_output\.weight +F16 +\[256, 256\] '
has '^  blk\.1\.ffn_norm\.weight +F32 +\[256\] '
has '^  blk\.1\.ffn_gate\.weight +F16 +\[256, 512\] '
has '^  blk\.1\.ffn_up\.weight +F16 +\[256, 512\] '
has '^  blk\.1\.ffn_down\.weight +F16 +\[512, 256\] '
has '^  output_norm\.weight +F32 +\[256\] '
has '^  output\.weight +F16 +\[256, 32000\] '
lacks 'rope\.scaling'
lacks 'blk\.2\.'

# --- every weight type: matrices in the type, norms stay F32 ------------------------
for spec in f32:F32:0 bf16:BF16:32 q8_0:Q8_0:7 q4_0:Q4_0:2 q4_k:Q4_K:14 q6_k:Q6_K:18 \
    q4_1:Q4_1:3 q5_0:Q5_0:8 q5_1:Q5_1:9 iq4_nl:IQ4_NL:25 q2_k:Q2_K:10 q3_k:Q3_K:11 \
    q5_k:Q5_K:16 iq4_xs:IQ4_XS:30; do
    IFS=: read -r ty name ft <<<"$spec"
    mk -o "$TMP/$ty.gguf" --type "$ty" --n-layer 1
    inspect "$TMP/$ty.gguf"
    has "^  blk\.0\.ffn_down\.weight +$name +\[512, 256\] " "$ty"
    has "^  token_embd\.weight +$name +\[256, 32000\] " "$ty"
    has '^  blk\.0\.ffn_norm\.weight +F32 ' "$ty"
    has "general\.file_type +uint32 += $ft\$" "$ty"
done

# --- qwen2 (biases), qwen3 (q/k norms, key_length), tied, rope scaling ---------------
mk -o "$TMP/q2.gguf" --arch qwen2 --type q8_0
inspect "$TMP/q2.gguf"
has 'general\.architecture +string += "qwen2"' qwen2
has 'qwen2\.rope\.freq_base +float32 += 1000000$' qwen2
has '^  blk\.0\.attn_q\.bias +F32 +\[256\] ' qwen2
has '^  blk\.1\.attn_k\.bias +F32 +\[64\] ' qwen2
has '^  blk\.1\.attn_v\.bias +F32 +\[64\] ' qwen2
has '^tensors: +27$' qwen2
mk -o "$TMP/q3.gguf" --arch qwen3 --head-dim 64 --n-head 4 --n-head-kv 2 --tied
inspect "$TMP/q3.gguf"
has 'qwen3\.attention\.key_length +uint32 += 64$' qwen3
has 'qwen3\.attention\.value_length +uint32 += 64$' qwen3
has 'qwen3\.rope\.dimension_count +uint32 += 64$' qwen3
has '^  blk\.0\.attn_q_norm\.weight +F32 +\[64\] ' qwen3
has '^  blk\.1\.attn_k_norm\.weight +F32 +\[64\] ' qwen3
has '^  blk\.0\.attn_k\.weight +F16 +\[256, 128\] ' qwen3
lacks '^  output\.weight' qwen3
has '^tensors: +24$' qwen3
# --- gemma2 (post-norms, caps, window), gemma3 (q/k norms, no caps by default) ---------
mk -o "$TMP/g2.gguf" --arch gemma2 --head-dim 128 --n-head 4 --n-head-kv 2
inspect "$TMP/g2.gguf"
has 'gemma2\.attention\.sliding_window +uint32 += 32$' gemma2
has 'gemma2\.attn_logit_softcapping +float32 += 50$' gemma2
has 'gemma2\.final_logit_softcapping +float32 += 30$' gemma2
has 'gemma2\.attention\.key_length +uint32 += 128$' gemma2
has 'gemma2\.attention\.layer_norm_rms_epsilon +float32 += 9.99999997e-07$' gemma2
has '^  blk\.0\.post_attention_norm\.weight +F32 +\[256\] ' gemma2
has '^  blk\.1\.post_ffw_norm\.weight +F32 +\[256\] ' gemma2
has '^  blk\.0\.attn_q\.weight +F16 +\[256, 512\] ' gemma2
has '^  blk\.0\.attn_output\.weight +F16 +\[512, 256\] ' gemma2
lacks '^  output\.weight' gemma2
lacks 'attn_q_norm' gemma2
has '^tensors: +24$' gemma2
has '^runs: yes$' gemma2
mk -o "$TMP/g3.gguf" --arch gemma3 --swa 16 --final-softcap 20
inspect "$TMP/g3.gguf"
has 'gemma3\.attention\.sliding_window +uint32 += 16$' gemma3
has 'gemma3\.rope\.freq_base +float32 += 1000000$' gemma3
has 'gemma3\.final_logit_softcapping +float32 += 20$' gemma3
lacks 'attn_logit_softcapping' gemma3
has '^  blk\.1\.attn_k_norm\.weight +F32 +\[32\] ' gemma3
has '^  blk\.1\.post_ffw_norm\.weight +F32 +\[256\] ' gemma3
has '^tensors: +28$' gemma3
has '^runs: yes$' gemma3
# gemma4: per-layer head sizes and K/V heads, no attn_v on full layers with --k-eq-v
mk -o "$TMP/g4.gguf" --arch gemma4 --n-layer 3 --n-head 4 --n-head-kv 2 --head-dim 64 \
    --n-head-kv-full 1 --swa-period 3 --k-eq-v
inspect "$TMP/g4.gguf"
has 'gemma4\.attention\.sliding_window_pattern +array\[bool; 3\] += \[true, true, false\]$' gemma4
has 'gemma4\.attention\.head_count_kv +array\[int32; 3\] += \[2, 2, 1\]$' gemma4
has 'gemma4\.attention\.key_length +uint32 += 128$' gemma4
has 'gemma4\.attention\.key_length_swa +uint32 += 64$' gemma4
has 'gemma4\.rope\.dimension_count +uint32 += 128$' gemma4
has '^  rope_freqs\.weight +F32 +\[64\] ' gemma4
has '^  blk\.1\.attn_v\.weight +F16 +\[256, 128\] ' gemma4
lacks '^  blk\.2\.attn_v\.weight' gemma4
has '^  blk\.2\.attn_k\.weight +F16 +\[256, 128\] ' gemma4
has '^  blk\.2\.attn_q_norm\.weight +F32 +\[128\] ' gemma4
has '^  blk\.2\.layer_output_scale\.weight +F32 +\[1\] ' gemma4
has '^runs: yes$' gemma4
mk -o "$TMP/rs.gguf" --rope-scale 4 --rope-base 500000 --ctx 4096
inspect "$TMP/rs.gguf"
has 'llama\.rope\.scaling\.type +string += "linear"' rope
has 'llama\.rope\.scaling\.factor +float32 += 4$' rope
has 'llama\.rope\.freq_base +float32 += 500000$' rope
has 'llama\.context_length +uint32 += 4096$' rope

# --- refusals ----------------------------------------------------------------------
expect_fail() {  # RC REGEX ARGS...
    local want=$1 re=$2; shift 2
    "$BIN" mkmodel "$@" >/dev/null 2>"$TMP/err"
    local rc=$?
    [ $rc = "$want" ] || fail "mkmodel $*: exit $rc, want $want"
    grep -qE -- "$re" "$TMP/err" || fail "mkmodel $*: stderr lacks /$re/: $(cat "$TMP/err")"
    [ -e "$TMP/bad.gguf" ] && fail "mkmodel $*: wrote a file"
    return 0
}
expect_fail 2 'Q4_K needs rows that are a multiple of its block size 256, but n_ff' \
    -o "$TMP/bad.gguf" --vocab "$VOCAB" --type q4_k --n-ff 704
expect_fail 2 'Q8_0 .*block size 32, but n_embd' -o "$TMP/bad.gguf" --vocab "$VOCAB" \
    --type q8_0 --n-embd 200 --n-head 5 --n-head-kv 5
expect_fail 2 'not a multiple of --n-head-kv' -o "$TMP/bad.gguf" --vocab "$VOCAB" --n-head-kv 3
expect_fail 2 "--type 'iq2_xs'" -o "$TMP/bad.gguf" --vocab "$VOCAB" --type iq2_xs
expect_fail 2 "--arch 'gpt2'" -o "$TMP/bad.gguf" --vocab "$VOCAB" --arch gpt2
expect_fail 1 'nope\.gguf: open: No such file' -o "$TMP/bad.gguf" --vocab "$TMP/nope.gguf"
expect_fail 2 'required' --vocab "$VOCAB"
expect_fail 2 'moe-3b needs an arch with --n-ff-exp' -o "$TMP/bad.gguf" --vocab "$VOCAB" \
    --shape moe-3b --arch qwen3

# --- the moe-3b preset, one of its 14 layers (Q4_0 keeps the file small):
# 64 experts of 512, 8 used, 16/4 heads of 128; a layer 211,947,776
# parameters, the embeddings and output 131,074,048 (14 layers: 3.10B)
mk -o "$TMP/moe.gguf" --shape moe-3b --arch qwen3moe --n-layer 1 --type q4_0
grep -q ' 343021824 parameters' "$TMP/mk.out" || fail "moe-3b, 1 layer: $(cat "$TMP/mk.out")"
inspect "$TMP/moe.gguf"
has 'qwen3moe.expert_count +uint32 += 64$' moe-3b
has 'qwen3moe.expert_used_count +uint32 += 8$' moe-3b
has 'qwen3moe.expert_feed_forward_length +uint32 += 512$' moe-3b
has 'qwen3moe.attention.key_length +uint32 += 128$' moe-3b
has 'blk.0.ffn_down_exps.weight +Q4_0 +\[512, 2048, 64\]' moe-3b
rm -f "$TMP/moe.gguf"
echo "test_mkmodel: ok"
