#!/usr/bin/env bash
# Speculative decoding through `kvseal serve --spec-tokens 4` (docs/speculative.md):
# - a quoting completion (greedy) gives the same text as with "speculative":
#   false and as a server without speculation, with drafts computed and kept
#   (usage.completion_tokens_details), and the counters in /metrics (engine,
#   vLLM's names, the tenant's own);
# - a chat with a prediction equal to its answer: every draft kept; the
#   prediction as an array of text parts too;
# - sampled with a seed: the same text as without speculation;
# - the model as its own draft model (--draft-model): the same text, every
#   draft kept; one of another vocabulary refused at start;
# - a glm4moe file's NextN block (--spec-nextn): the same text, drafts
#   computed; a model without the block refused at start;
# - bad prediction / speculative values are refused by name (400), and the
#   server keeps serving;
# - one tenant's kept drafts do not move with another tenant's text
#   (spec_channel_run.sh);
# - the leak suite (six tenants, canaries, a small pool) passes with
#   speculation on (lookup, a draft model, NextN), and every page comes back
#   scrubbed.
. "$(dirname "$0")/lib.sh"
MODEL=$KS_SRC/models/kjv-mini.gguf
KEY=sk-spec-$RANDOM$RANDOM
echo "{\"tenants\":[{\"name\":\"quoter\",\"keys\":[\"$KEY\"]}]}" >"$TMPD/tenants.json"
AUTH=(-H "Authorization: Bearer $KEY" -H "Content-Type: application/json")
QUOTE="In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness was upon the face of the deep. In the beginning God created the heaven and the earth. And the earth"

complete() {  # complete NAME EXTRA_JSON — greedy completion of QUOTE; sets BODY, TEXT
    req "$1" 200 "${AUTH[@]}" "$KS_URL/v1/completions" \
        -d "{\"model\":\"kjv-mini\",\"prompt\":\"$QUOTE\",\"max_tokens\":64,\"temperature\":0,\"ignore_eos\":true$2}"
    TEXT=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["choices"][0]["text"])' "$BODY")
}
usage() {  # usage FIELD — from the last BODY's usage.completion_tokens_details (0 when absent)
    python3 -c 'import json,sys
d = json.loads(sys.argv[1])["usage"].get("completion_tokens_details") or {}
print(d.get(sys.argv[2], 0))' "$BODY" "$1"
}

# the reference: a server without speculation
start_server "$TMPD/ref.log" -m "$MODEL" --alias kjv-mini --ctx 512 --kv-pages 96 \
    --tenants "$TMPD/tenants.json"
complete "reference" ""
REF=$TEXT
req "reference, sampled" 200 "${AUTH[@]}" "$KS_URL/v1/completions" \
    -d "{\"model\":\"kjv-mini\",\"prompt\":\"$QUOTE\",\"max_tokens\":48,\"temperature\":0.8,\"seed\":4242}"
REF_SAMPLED=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["choices"][0]["text"])' "$BODY")
stop_server

start_server "$TMPD/spec.log" -m "$MODEL" --alias kjv-mini --ctx 512 --kv-pages 96 \
    --tenants "$TMPD/tenants.json" --spec-tokens 4
complete "speculative" ""
expect_eq "speculative == reference" "$TEXT" "$REF"
kept=$(usage accepted_prediction_tokens)
rejected=$(usage rejected_prediction_tokens)
[ "$kept" -gt 10 ] || fail "a quoting completion kept only $kept drafts ($BODY)"
echo "quote: $kept drafts kept, $rejected rejected" >&2
complete "opted out" ",\"speculative\":false"
expect_eq "opted out == reference" "$TEXT" "$REF"
expect_eq "opted out: no drafts" "$(usage accepted_prediction_tokens)" 0
req "sampled" 200 "${AUTH[@]}" "$KS_URL/v1/completions" \
    -d "{\"model\":\"kjv-mini\",\"prompt\":\"$QUOTE\",\"max_tokens\":48,\"temperature\":0.8,\"seed\":4242}"
got=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["choices"][0]["text"])' "$BODY")
expect_eq "sampled, seeded == reference" "$got" "$REF_SAMPLED"

# a prediction equal to the answer: every draft kept (string, then parts)
chat() {  # chat NAME PREDICTION_JSON — sets BODY, TEXT
    req "$1" 200 "${AUTH[@]}" "$KS_URL/v1/chat/completions" \
        -d "{\"model\":\"kjv-mini\",\"max_tokens\":32,\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":\"And God said\"}]$2}"
    TEXT=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["choices"][0]["message"]["content"])' "$BODY")
}
chat "chat" ""
ANSWER=$TEXT
[ -n "$ANSWER" ] || fail "empty chat answer: $BODY"
PRED=$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$ANSWER")
chat "chat, predicted" ",\"prediction\":{\"type\":\"content\",\"content\":$PRED}"
expect_eq "predicted == plain" "$TEXT" "$ANSWER"
expect_eq "predicted: nothing rejected" "$(usage rejected_prediction_tokens)" 0
[ "$(usage accepted_prediction_tokens)" -gt 4 ] || fail "predicted: too few drafts kept: $BODY"
chat "chat, predicted in parts" ",\"prediction\":{\"type\":\"content\",\"content\":[{\"type\":\"text\",\"text\":$PRED}]}"
expect_eq "predicted in parts == plain" "$TEXT" "$ANSWER"

# refusals, by name
req "prediction not an object" 400 "${AUTH[@]}" "$KS_URL/v1/completions" \
    -d '{"model":"kjv-mini","prompt":"x","max_tokens":2,"prediction":"text"}'
expect_has "prediction message" "$BODY" "'prediction' must be {"
req "prediction part" 400 "${AUTH[@]}" "$KS_URL/v1/completions" \
    -d '{"model":"kjv-mini","prompt":"x","max_tokens":2,"prediction":{"type":"content","content":[{"type":"image"}]}}'
expect_has "prediction part message" "$BODY" "text parts"
req "speculative not a boolean" 400 "${AUTH[@]}" "$KS_URL/v1/completions" \
    -d '{"model":"kjv-mini","prompt":"x","max_tokens":2,"speculative":"yes"}'
expect_has "speculative message" "$BODY" "'speculative' must be a boolean"
complete "after the refusals" ""
expect_eq "still serving" "$TEXT" "$REF"

# the counters
m=$(metrics_text "$KS_URL")
for name in kvseal_spec_draft_tokens_total kvseal_spec_accepted_tokens_total \
    kvseal_spec_verify_steps_total kvseal_spec_acceptance_ratio; do
    v=$(awk -v n=$name '$1 == n { print $2 }' <<<"$m")
    awk -v v="$v" 'BEGIN { exit !(v > 0) }' || fail "$name is [$v]"
done
expect_has "vLLM's name" "$m" "vllm:spec_decode_num_accepted_tokens_total{model_name="
v=$(awk '$1 == "kvseal_tenant_spec_accepted_tokens_total{tenant=\"quoter\"}" { print $2 }' <<<"$m")
[ "${v:-0}" -gt 0 ] || fail "the tenant's kept drafts: [$v]"
stop_server
grep -q "SECURITY" "$TMPD/spec.log" && fail "security events with speculation on"

# a draft model: the model itself (its greedy drafts are the model's own
# greedy tokens: every draft kept), the same text
start_server "$TMPD/draft.log" -m "$MODEL" --alias kjv-mini --ctx 512 --kv-pages 96 \
    --tenants "$TMPD/tenants.json" --draft-model "$MODEL"
file_has "$TMPD/draft.log" "speculative decoding: up to 4 drafts a step from" ||
    fail "the draft model is not announced"
complete "draft model" ""
expect_eq "draft model == reference" "$TEXT" "$REF"
[ "$(usage accepted_prediction_tokens)" -gt 30 ] || fail "draft model: too few drafts kept: $BODY"
expect_eq "draft model: nothing rejected" "$(usage rejected_prediction_tokens)" 0
stop_server
# a draft model of another vocabulary is refused at start, naming both sizes
if [ -f "$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf" ]; then
    "$KS_BIN" mkmodel -o "$TMPD/other.gguf" --vocab "$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf" \
        --shape tiny --seed 3 >/dev/null 2>&1 || fail "mkmodel"
    out=$("$KS_BIN" serve -m "$MODEL" --port 0 --ctx 512 --kv-pages 96 --draft-model "$TMPD/other.gguf" 2>&1)
    expect_eq "another vocabulary: status" "$?" 1
    expect_has "another vocabulary: message" "$out" "draft model: its vocabulary has 32000 tokens"
else
    echo "(no ../shared/vocab: the draft model of another vocabulary is left out)" >&2
fi
out=$("$KS_BIN" decode -m "$MODEL" --draft-model "$MODEL" 2>&1)
expect_eq "decode --draft-model: status" "$?" 2
expect_has "decode --draft-model: message" "$out" "--draft-model is kvseal serve's"

# the NextN block of a glm4moe file drafts (--spec-nextn): the same text as
# without speculation, drafts computed (random weights: few kept, the
# probes of unit_engine_spec check what it predicts); a model without the
# block, or with --draft-model too, is refused at start
"$KS_BIN" mkmodel -o "$TMPD/glm.gguf" --vocab "$MODEL" --arch glm4moe --seed 12 >/dev/null ||
    fail "mkmodel glm4moe"
glm() {  # glm NAME — a greedy completion of QUOTE by the glm4moe model; sets BODY, TEXT
    req "$1" 200 "$KS_URL/v1/completions" -H "Content-Type: application/json" \
        -d "{\"model\":\"glm\",\"prompt\":\"$QUOTE\",\"max_tokens\":48,\"temperature\":0,\"ignore_eos\":true}"
    TEXT=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["choices"][0]["text"])' "$BODY")
}
start_server "$TMPD/glm-ref.log" -m "$TMPD/glm.gguf" --ctx 512 --kv-pages 96
glm "glm reference"
GLM_REF=$TEXT
stop_server
start_server "$TMPD/glm.log" -m "$TMPD/glm.gguf" --ctx 512 --kv-pages 96 --spec-nextn
file_has "$TMPD/glm.log" "speculative decoding: up to 4 drafts a step from the model's NextN block" ||
    fail "NextN drafting is not announced"
glm "glm, NextN drafts"
expect_eq "NextN drafts == reference" "$TEXT" "$GLM_REF"
n=$(( $(usage accepted_prediction_tokens) + $(usage rejected_prediction_tokens) ))
[ "$n" -gt 4 ] || fail "NextN: too few drafts ($BODY)"
echo "NextN (random weights): $(usage accepted_prediction_tokens) of $n drafts kept" >&2
stop_server
out=$("$KS_BIN" serve -m "$MODEL" --port 0 --ctx 512 --kv-pages 96 --spec-nextn 2>&1)
expect_eq "--spec-nextn without a NextN block: status" "$?" 1
expect_has "--spec-nextn without a NextN block: message" "$out" "has no NextN (multi-token prediction) block"
out=$("$KS_BIN" serve -m "$TMPD/glm.gguf" --port 0 --spec-nextn --draft-model "$TMPD/glm.gguf" 2>&1)
expect_eq "--spec-nextn with --draft-model: status" "$?" 2
expect_has "--spec-nextn with --draft-model: message" "$out" "--draft-model or --spec-nextn, not both"

# a tenant's kept drafts depend on its own text only (the timing channel a
# shared draft source would open; the broken build that shares one is caught
# by test_isolation_broken.sh)
bash "$(dirname "$0")/spec_channel_run.sh" || fail "the speculative timing channel is open"

# the leak suite with speculation on: six tenants, canaries, a small pool
if command -v node >/dev/null; then
    LEAK_SERVE_ARGS="--spec-tokens 4" LEAK_EXPECT_SPEC=1 bash "$(dirname "$0")/leak_run.sh" >"$TMPD/leak.log" 2>&1 ||
        { tail -30 "$TMPD/leak.log" >&2; fail "the leak suite failed with speculation on"; }
    grep "drafts kept" "$TMPD/leak.log" >&2
    # and with a draft model: its KV pages, in a pool of their own, also
    # come back scrubbed (the engine's quiescent check covers both pools)
    LEAK_SERVE_ARGS="--draft-model $MODEL" LEAK_EXPECT_SPEC=1 bash "$(dirname "$0")/leak_run.sh" \
        >"$TMPD/leak-draft.log" 2>&1 ||
        { tail -30 "$TMPD/leak-draft.log" >&2; fail "the leak suite failed with a draft model"; }
    grep "drafts kept" "$TMPD/leak-draft.log" >&2
    # and with NextN drafting: the head's pool too
    LEAK_MODEL_FILE="$TMPD/glm.gguf" LEAK_SERVE_ARGS="--spec-nextn" LEAK_EXPECT_SPEC=drafted \
        bash "$(dirname "$0")/leak_run.sh" >"$TMPD/leak-nextn.log" 2>&1 ||
        { tail -30 "$TMPD/leak-nextn.log" >&2; fail "the leak suite failed with NextN drafting"; }
    grep "drafts kept" "$TMPD/leak-nextn.log" >&2
else
    echo "(node is not installed: the leak suite with speculation is left out)" >&2
fi
echo "speculative decoding ok"
