#!/usr/bin/env bash
# bench/spec.sh — speculative decoding's speed through `kvseal serve
# --spec-tokens K` (issue 42 §2, docs/speculative.md), against the same
# server with the request's "speculative": false, alternated in one run.
#
# Workloads, ROUNDS rounds each (default 3), one stream at a time:
#   ceiling  the 1.1B Q4_0 shape (MODEL; made as bench/vs-llamacpp.sh makes
#            it when absent): a greedy answer of N tokens (default 128)
#            without drafts, then the same request with that answer as its
#            prediction, so every draft is kept (the target as its own
#            draft): the mechanism's ceiling and its overhead, K drafts a step
#   self-draft  the same model as its own --draft-model (DRAFT=0 skips it):
#            every draft kept, but each draft costs a pass of the draft
#            model, here as large as the model: the draft model's overhead
#   quote    kjv-mini (trained): a passage, then its first words again; the
#            model quotes it on and prompt lookup drafts from the prompt
#   nextn    a glm4moe file of GLM_SHAPE (mkmodel, random weights, kjv-mini's
#            vocabulary) drafting with its NextN block (--spec-nextn): what
#            a head costs, with what random weights keep (next to nothing;
#            unit_engine_spec's probes show what it predicts)
# Reported per workload: decode tokens/s with and without (time from the
# first streamed token to the last, over the tokens after the first), the
# median of the per-round ratios, and drafts kept / drafted. A benchmark,
# not a test. Environment: MODEL, K (4), N (128), ROUNDS (3), THREADS (2),
# WORKLOADS ("ceiling self-draft quote nextn"), GLM_SHAPE (mkmodel options).
set -euo pipefail
NAME=spec
. "$(dirname "$0")/lib.sh"
K=${K:-4}
N=${N:-128}
MODEL=${MODEL:-$MODELS/tinyllama-1.1b-Q4_0.gguf}
if [ ! -f "$MODEL" ]; then
    [ -f "$VOCAB" ] || { echo "spec: SKIPPED: no vocabulary at $VOCAB" >&2; exit 0; }
    mkdir -p "$MODELS"
    f16=$MODELS/tinyllama-1.1b-f16.gguf
    [ -f "$f16" ] || "$KS" mkmodel -o "$f16" --vocab "$VOCAB" --shape 1.1b --type f16 \
        --name tinyllama-shape -t "$THREADS" >/dev/null
    "$A/llama-quantize" "$f16" "$MODEL" Q4_0 "$THREADS" >/dev/null 2>&1
fi
TMP=$(mktemp -d)
trap 'kill $PID 2>/dev/null; rm -rf "$TMP"' EXIT

serve() {  # serve MODEL [ARGS...] — starts kvseal serve on it; sets URL, PID
    local m=$1; shift
    "$KS" serve -m "$m" --alias m --port 0 --ctx 2048 --kv-pages 512 --threads "$THREADS" \
        --spec-tokens "$K" "$@" >"$TMP/out" 2>"$TMP/log" &
    PID=$!
    for _ in $(seq 600); do
        URL=$(sed -n 's/^listening on \(http:[^ ]*\).*/\1/p' "$TMP/out" | head -1)
        [ -n "$URL" ] && curl -fsS "$URL/health" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    cat "$TMP/log" >&2
    exit 1
}

# one streamed completion: prints "tokens/s kept drafted" then the text (JSON)
stream() {  # stream PROMPT SPEC(true|false) [PREDICTION]
    python3 - "$URL" "$1" "$2" "$N" "${3:-}" <<'EOF'
import http.client, json, sys, time, urllib.parse
url, prompt, spec, n, pred = sys.argv[1:6]
u = urllib.parse.urlparse(url)
body = {"model": "m", "prompt": prompt, "max_tokens": int(n), "temperature": 0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True}, "speculative": spec == "true"}
if pred:
    body["prediction"] = {"type": "content", "content": json.loads(pred)}
c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
r = c.getresponse()
text, times, usage = "", [], {}
for line in r:
    line = line.decode().strip()
    if not line.startswith("data: ") or line == "data: [DONE]":
        continue
    d = json.loads(line[6:])
    if d.get("usage"):
        usage = d["usage"]
    for ch in d.get("choices", []):
        if ch.get("text"):
            times.append(time.monotonic())
            text += ch["text"]
det = usage.get("completion_tokens_details") or {}
kept = det.get("accepted_prediction_tokens", 0)
drafted = kept + det.get("rejected_prediction_tokens", 0)
toks = usage.get("completion_tokens", 0)
# decode rate: the tokens after the first over the time since the first
rate = (toks - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
print("%.2f %d %d" % (rate, kept, drafted))
print(json.dumps(text))
EOF
}

bench() {  # bench NAME PROMPT — ROUNDS alternated rounds, the ceiling or the lookup
    local name=$1 prompt=$2 plain spec r0 r1 text kept drafted ratios=() r0s=() r1s=() acc=()
    for r in $(seq "$ROUNDS"); do
        stream "$prompt" false >"$TMP/a"
        r0=$(head -1 "$TMP/a" | cut -d' ' -f1)
        text=$(sed -n 2p "$TMP/a")
        if [ "$name" = ceiling ]; then
            stream "$prompt" true "$text" >"$TMP/b"
        else
            stream "$prompt" true >"$TMP/b"
        fi
        read -r r1 kept drafted < <(head -1 "$TMP/b")
        [ "$(sed -n 2p "$TMP/b")" = "$text" ] || echo "spec: $name: the text differs!" >&2
        echo "  $name round $r: off $r0 t/s, on $r1 t/s, kept $kept of $drafted drafts" >&2
        r0s+=("$r0") r1s+=("$r1") acc+=("$(awk -v k="$kept" -v d="$drafted" 'BEGIN { print d ? k / d : 0 }')")
        ratios+=("$(awk -v a="$r1" -v b="$r0" 'BEGIN { print a / b }')")
    done
    printf '| %s | %s | %.1f | %.1f | **%.2fx** | %.2f |\n' "$name" "$(basename "$3")" \
        "$(printf '%s\n' "${r0s[@]}" | median)" "$(printf '%s\n' "${r1s[@]}" | median)" \
        "$(printf '%s\n' "${ratios[@]}" | median)" "$(printf '%s\n' "${acc[@]}" | median)"
}

echo "| workload | model | decode t/s, off | decode t/s, spec $K | ratio | drafts kept |"
echo "|---|---|---|---|---|---|"
W=" ${WORKLOADS:-ceiling self-draft quote nextn} "
if [[ $W == *" ceiling "* ]]; then
    serve "$MODEL"
    bench ceiling "In the beginning" "$MODEL"
    kill $PID; wait $PID 2>/dev/null || true
fi
if [[ $W == *" self-draft "* ]] && [ "${DRAFT:-1}" = 1 ]; then # every draft kept, each costs a pass
    serve "$MODEL" --draft-model "$MODEL"
    bench self-draft "In the beginning" "$MODEL"
    kill $PID; wait $PID 2>/dev/null || true
fi
KJV=models/kjv-mini.gguf
Q="And God said, Let there be light: and there was light. And God saw the light, that it was good: and God divided the light from the darkness. And God called the light Day, and the darkness he called Night. And the evening and the morning were the first day. And God said, Let there be light: and there was light."
if [[ $W == *" quote "* ]]; then
    serve "$KJV"
    bench quote "$Q" "$KJV"
    kill $PID; wait $PID 2>/dev/null || true
fi
if [[ $W == *" nextn "* ]]; then
    GLM=$TMP/glm4moe-nextn.gguf
    # shellcheck disable=SC2086 # GLM_SHAPE is a list of options
    "$KS" mkmodel -o "$GLM" --vocab "$KJV" --arch glm4moe --seed 12 ${GLM_SHAPE:-} >/dev/null
    serve "$GLM" --spec-nextn
    bench nextn "$Q" "$GLM"
fi
