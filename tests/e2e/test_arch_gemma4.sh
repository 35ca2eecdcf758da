#!/usr/bin/env bash
# gemma4 (Gemma 4, the dense 31B's layout) against llama.cpp. A small
# `kvseal mkmodel --arch gemma4` model (llama-spm vocab, random weights):
# 4 layers, every other one full (--swa-period 2: layers 1 and 3), sliding
# layers with 2 K/V heads of 64 and a window of 32 tokens (so it matters at
# context 128), full layers with 1 K/V head of 128 (a per-layer
# head_count_kv array), no attn_v there (--k-eq-v: V is the K projection),
# proportional RoPE on the full layers (rope_freqs: a quarter of the pairs
# turn, base 1e6) and plain RoPE at base 10000 on the sliding ones, Q/K
# norms, V rms-normed, unscaled scores, post-norms, layer_output_scale, a
# final logit cap of 30, tied output. Through the check_arch matrix
# (qtypes_lib.sh): perplexity within 0.5% of llama-perplexity's at F16,
# Q8_0 and Q4_K_M (quantized by llama-quantize), 32 greedy tokens identical
# (or parting at a near tie) at F16 and Q8_0. The same weights with the
# window wider than the context are more than 0.5% away, so the check
# would catch a forward pass that ignored it. Then an E2B-like model through
# the same matrix: its last 2 layers read earlier layers' K/V (through the
# same tag-checked page access), FFNs of per-layer widths, per-layer
# embeddings. Then a 26B-A4B-like model (experts beside each dense FFN, a
# router on rmsnorm(x) / sqrt(E) times its scale vector, per-expert output
# scales, three more norms). (Checked by hand on a build
# that dropped one piece at a time, seed 6 at F16: without the V norm the
# perplexity moves +1.1%, without rope_freqs -0.9%, with scores scaled by
# 1/sqrt(D) +21%, without layer_output_scale x4.1; the MoE model, seed 8,
# without ffn_down_exps.scale +2.5%, with the fused gate and up taken in
# the other order -12% (seed 6); 2026-12-06.) Then through `kvseal serve`
# with Gemma 4's chat template (the E2B-like model): three chats sent at
# once each get the greedy text they get alone.
# The perplexity of these random models is ~4e11 (confidently wrong), so
# quantization noise moves it either way: Q8_0 / Q4_K_M ratios were 0.9992 /
# 0.9958 (seed 4), 1.0034 / 1.0021 (5), 1.0000 / 1.0042 (6), F16 within
# 0.0002 for all (measured 2026-12-06); seed 6 is checked.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/qtypes_lib.sh"
VOCAB=$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf
[ -e "$VOCAB" ] || skip "$VOCAB is absent"
G=(--arch gemma4 --n-layer 4 --n-head 4 --n-head-kv 2 --head-dim 64 --head-dim-full 128
    --n-head-kv-full 1 --swa-period 2 --k-eq-v --final-softcap 30 --seed 6 -t 2)
mkmodel_to "$TMPD/g4.gguf" "${G[@]}" --swa 32
check_arch gemma4 "$TMPD/g4.gguf"
# the check can fail: the same weights without the window
l=$(ll_ppl "$TMPD/g4.gguf")
mkmodel_to "$TMPD/g4-nowin.gguf" "${G[@]}" --swa 4096
k=$(kv_ppl "$TMPD/g4-nowin.gguf")
[ -n "$k" ] && [ -n "$l" ] || fail "no perplexity (kvseal [$k], llama.cpp [$l])"
awk -v a="$k" -v b="$l" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; exit !(d < 0.005) }' &&
    fail "without the window kvseal's $k is within 0.5% of llama.cpp's $l: the check cannot fail"
echo "  gemma4 without the window: $k (llama.cpp with it: $l)"
# E2B / E4B style: 6 layers, the last 2 sharing K/V (layer 4, sliding, reads
# layer 2's; layer 5, full, reads layer 3's) with FFNs twice as wide (a
# feed_forward_length array), per-layer embeddings of 64
E=("${G[@]}" --n-layer 6 --n-kv-shared 2 --n-embd-per-layer 64 --swa 32)
mkmodel_to "$TMPD/g4e.gguf" "${E[@]}"
check_arch "gemma4 E2B-like" "$TMPD/g4e.gguf"
# 26B-A4B style: every layer's dense FFN beside 8 experts (2 used), the
# experts' gate and up in one ffn_gate_up_exps (as the released files);
# then with them in two tensors, at F16
M=("${G[@]}" --n-expert 8 --n-expert-used 2 --n-ff-exp 256 --seed 8 --swa 32)
mkmodel_to "$TMPD/g4m.gguf" "${M[@]}" --gate-up-exps
check_arch "gemma4 MoE" "$TMPD/g4m.gguf"
mkmodel_to "$TMPD/g4m2.gguf" "${M[@]}"
check_ppl "gemma4 MoE split" "$TMPD/g4m2.gguf"
echo
# Gemma 4's own tokenizer ("gemma4": SentencePiece-style BPE) on the
# llama-spm vocabulary made into one (tok_specials --gemma4; the oracle test
# checks its ids): the dense model's perplexity and greedy text, where
# pieces turn U+2581 back into spaces and <0xXX> into bytes
SPECIALS=${KS_BUILD:-}/tok_specials
if [ -x "$SPECIALS" ]; then
    "$SPECIALS" --gemma4 "$VOCAB" "$TMPD/v-gemma4.gguf" >/dev/null || fail "tok_specials --gemma4"
    VOCAB=$TMPD/v-gemma4.gguf mkmodel_to "$TMPD/g4v.gguf" "${G[@]}" --swa 32
    check_ppl "gemma4 vocab F16" "$TMPD/g4v.gguf"
    check_greedy "gemma4 vocab F16" "$TMPD/g4v.gguf"
    # tokenizer.ggml.suppress_tokens: llama.cpp's gemma4 graph sets their
    # logits to -inf; suppressing the tokens this model repeats (" created",
    # and the bare U+2581) changes its greedy text in both engines alike
    sup=$("$KS_BIN" tokenize -m "$TMPD/g4v.gguf" --ids -- " created" | awk '{ print $NF }')
    VOCAB=$TMPD/v-gemma4.gguf mkmodel_to "$TMPD/g4s.gguf" "${G[@]}" --swa 32 \
        --suppress-tokens "$sup,29871"
    ARCH_PROMPTS=("In the beginning God created")
    printf 'gemma4 suppress_tokens %s,29871' "$sup"
    check_greedy "gemma4 suppressed" "$TMPD/g4s.gguf"
    a=$(kv_gen "$TMPD/g4v.gguf" "${ARCH_PROMPTS[0]}")
    b=$(kv_gen "$TMPD/g4s.gguf" "${ARCH_PROMPTS[0]}")
    [ "$a" != "$b" ] || fail "suppressing tokens $sup,29871 did not change the greedy text: $a"
else
    echo "note: no $SPECIALS: the gemma4 tokenizer part is skipped" >&2
fi
echo "gemma4 vs llama.cpp ok"

command -v curl >/dev/null || { echo "note: no curl: the serve part is skipped" >&2; exit 0; }
T=$KS_SHARED/templates/google-gemma-4-31B-it-interleaved.jinja
[ -e "$T" ] || { echo "note: $T is absent: the serve part is skipped" >&2; exit 0; }
start_server "$TMPD/serve.err" -m "$TMPD/g4e.gguf" --alias g4 --chat-template-file "$T"
chats_batched g4
Q=("${CHAT_QS[@]}")
# Gemma 4's tool calls and thought channel, detected from the template; a
# named tool_choice constrains decoding to "<|tool_call>call:now{...}
# <tool_call|>", which comes back as a call with JSON arguments
expect_has "format logged" "$(cat "$TMPD/serve.err")" "tool calls in format gemma4, reasoning split at <|channel>thought"
named_call "$KS_URL" g4 "$TMPD/call.json"; SERVED_ARGS=$CALL_ARGS
for i in 0 1; do chat_text "$KS_URL" g4 "${Q[$i]}"; SERVED[$i]=$CHAT; done
SERVE_PID=$KS_PID
# through the cluster: the same answers and the same call
CLUSTER_PROBE_MODEL=g4 start_cluster "$TMPD/c" 1 1 -m "$TMPD/g4e.gguf" --alias g4 \
    --chat-template-file "$T"
trap 'kill -KILL $SERVE_PID $KS_PID "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}" 2>/dev/null; rm_tmpd' EXIT
for i in 0 1; do
    chat_text "$KS_URL" g4 "${Q[$i]}"
    expect_eq "chat through the cluster (${Q[$i]})" "$CHAT" "${SERVED[$i]}"
done
named_call "$KS_URL" g4 "$TMPD/ccall.json"
expect_eq "the cluster's call arguments" "$CALL_ARGS" "$SERVED_ARGS"
stop_cluster
KS_PID=$SERVE_PID stop_server
echo "gemma4 through serve and the cluster with its chat template ok"
