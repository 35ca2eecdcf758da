#!/usr/bin/env bash
# spec_channel_run.sh — does the speed of one tenant's request depend on
# another tenant's text? With speculative decoding a request's drafts are
# invisible in its output, but how many are kept is visible in its speed
# (and in usage.completion_tokens_details), so a draft source shared across
# requests is a timing channel (I6, docs/speculative.md). Against a fresh
# `kvseal serve --spec-tokens 4` from $KS_SERVE_BIN (default $KS_BIN):
#   tenant A asks for a greedy continuation of PA: text TA, K1 drafts kept;
#   tenant B sends PA + TA (B quotes what A will write);
#   tenant A asks again: the same text, and it must keep exactly K1 drafts.
# Exits 0 when A's count did not move, 1 (a "SPEC CHANNEL" line) when it did.
. "$(dirname "$0")/lib.sh"
KA=sk-spec-a-$RANDOM$RANDOM KB=sk-spec-b-$RANDOM$RANDOM
echo "{\"tenants\":[{\"name\":\"a\",\"keys\":[\"$KA\"]},{\"name\":\"b\",\"keys\":[\"$KB\"]}]}" \
    >"$TMPD/tenants.json"
start_server "$TMPD/server.log" -m "$KS_SRC/models/kjv-mini.gguf" --alias kjv-mini --ctx 512 \
    --kv-pages 96 --tenants "$TMPD/tenants.json" --spec-tokens 4
PA="The LORD is my shepherd"
ask() {  # ask KEY PROMPT — greedy, 48 tokens; prints "KEPT<TAB>TEXT"
    local body
    body=$(python3 -c 'import json,sys
print(json.dumps({"model":"kjv-mini","prompt":sys.argv[1],"max_tokens":48,"temperature":0,"ignore_eos":True}))' "$2")
    req "completion" 200 -H "Authorization: Bearer $1" -H "Content-Type: application/json" \
        "$KS_URL/v1/completions" -d "$body"
    python3 -c 'import json,sys
b = json.loads(sys.argv[1])
d = b["usage"].get("completion_tokens_details") or {}
print("%d\t%s" % (d.get("accepted_prediction_tokens", 0), b["choices"][0]["text"]))' "$BODY"
}
first=$(ask "$KA" "$PA")
ask "$KB" "$PA${first#*$'\t'}" >/dev/null
again=$(ask "$KA" "$PA")
stop_server
[ "${first#*$'\t'}" = "${again#*$'\t'}" ] || fail "tenant a's answer changed"
echo "tenant a kept ${first%%$'\t'*} drafts alone, ${again%%$'\t'*} after tenant b's request" >&2
if [ "${first%%$'\t'*}" != "${again%%$'\t'*}" ]; then
    echo "SPEC CHANNEL: tenant b's text changed how many of tenant a's drafts were kept" >&2
    exit 1
fi
