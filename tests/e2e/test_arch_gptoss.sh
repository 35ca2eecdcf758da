#!/usr/bin/env bash
# gpt-oss against llama.cpp: a `kvseal mkmodel --arch gpt-oss` model
# (llama-spm vocabulary; 4 layers, the even ones sliding with a window of 32
# at context 128, heads of 64 wider than n_embd / n_head, YaRN 32x from 4096
# at base 150000) with what sets gpt-oss apart: a learned sink logit per head
# in each softmax's denominator, biased Q/K/V and attn_output, a biased
# router whose top-4 of 8 logits are weighted by a softmax over those 4, and
# experts with biases under the clamped SwiGLU (alpha 1.702, limit 7). Through
# the check_arch matrix (qtypes_lib.sh: perplexity within 0.5% at F16, Q8_0,
# Q4_K_M, greedy text at F16 and Q8_0), then llama-quantize's MXFP4_MOE
# preset (the experts in MXFP4, as the released files), a model with
# --qk-gain 3 at F16, where attention depends on position (so a RoPE,
# window or sink mistake shows), and one of the released widths at F16 and
# MXFP4_MOE. Then through `kvseal serve` with gpt-oss's own chat template
# (harmony; tests/e2e/templates, as ../shared/templates lacks it): chat
# completions render it and answer, three different chats sent at once
# each get the greedy text they get alone, and a named tool_choice comes
# back as a harmony call; through the cluster, the same answers.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/qtypes_lib.sh"
VOCAB=$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf
[ -e "$VOCAB" ] || skip "$VOCAB is absent"
mkmodel_to "$TMPD/oss.gguf" --arch gpt-oss --seed 5
"$KS_BIN" inspect "$TMPD/oss.gguf" >"$TMPD/inspect.txt" || fail "inspect failed"
grep -q "^runs: yes" "$TMPD/inspect.txt" || fail "inspect: $(cat "$TMPD/inspect.txt")"
check_arch gpt-oss "$TMPD/oss.gguf"
quantize "$TMPD/oss.gguf" "$TMPD/oss-mxfp4.gguf" MXFP4_MOE
check_ppl "gpt-oss MXFP4_MOE" "$TMPD/oss-mxfp4.gguf"
check_greedy "gpt-oss MXFP4_MOE" "$TMPD/oss-mxfp4.gguf"
mkmodel_to "$TMPD/oss-3.gguf" --arch gpt-oss --seed 6 --qk-gain 3
check_ppl "gpt-oss qk-gain 3 F16" "$TMPD/oss-3.gguf"
check_greedy "gpt-oss qk-gain 3" "$TMPD/oss-3.gguf"
# the released models' widths (n_embd 2880 = 45 heads' worth of 64, not a
# multiple of 256: K-quant presets fall back; the experts 2880 wide, so a
# row is 90 MXFP4 blocks), two layers of 4 experts
mkmodel_to "$TMPD/oss-w.gguf" --arch gpt-oss --seed 7 --n-embd 2880 --n-head 64 --n-head-kv 8 \
    --n-expert 4 --n-expert-used 2 --n-ff 2880 --n-ff-exp 2880 --n-layer 2 --swa 128
check_ppl "gpt-oss 2880 F16" "$TMPD/oss-w.gguf"
echo
quantize "$TMPD/oss-w.gguf" "$TMPD/oss-w-mxfp4.gguf" MXFP4_MOE
check_ppl "gpt-oss 2880 MXFP4_MOE" "$TMPD/oss-w-mxfp4.gguf"
echo
echo "gpt-oss vs llama.cpp ok"

command -v curl >/dev/null || { echo "note: no curl: the serve part is skipped" >&2; exit 0; }
T=$KS_SRC/tests/e2e/templates/openai-gpt-oss-120b.jinja
start_server "$TMPD/serve.err" -m "$TMPD/oss.gguf" --alias oss --chat-template-file "$T"
chats_batched oss
Q=("${CHAT_QS[@]}")
# harmony tool calls: detected from the template; a named tool_choice
# constrains decoding to "<|channel|>commentary to=functions.now
# <|constrain|>json<|message|>{}", which comes back as a call
expect_has "format logged" "$(cat "$TMPD/serve.err")" "tool calls in format harmony"
named_call "$KS_URL" oss "$TMPD/call.json"
expect_eq "named tool call arguments" "$CALL_ARGS" "{}"
for i in 0 1; do chat_text "$KS_URL" oss "${Q[$i]}"; SERVED[$i]=$CHAT; done
SERVE_PID=$KS_PID
# through the cluster: the router renders the template and parses the
# answers; the same reasoning and content, and the same call
CLUSTER_PROBE_MODEL=oss start_cluster "$TMPD/c" 1 1 -m "$TMPD/oss.gguf" --alias oss \
    --chat-template-file "$T"
trap 'kill -KILL $SERVE_PID $KS_PID "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}" 2>/dev/null; rm_tmpd' EXIT
for i in 0 1; do
    chat_text "$KS_URL" oss "${Q[$i]}"
    expect_eq "chat through the cluster (${Q[$i]})" "$CHAT" "${SERVED[$i]}"
done
named_call "$KS_URL" oss "$TMPD/ccall.json"
expect_eq "named tool call through the cluster" "$CALL_ARGS" "{}"
stop_cluster
KS_PID=$SERVE_PID stop_server
echo "gpt-oss through serve and the cluster with its chat template ok"
