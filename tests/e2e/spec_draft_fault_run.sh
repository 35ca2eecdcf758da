#!/usr/bin/env bash
# spec_draft_fault_run.sh — is the draft model's pool read through the tag
# check (I1)? Against a fresh `kvseal serve --spec-tokens 4 --draft-model`
# (kjv-mini drafting for itself) from $KS_SERVE_BIN with KS_FAULT=swap_draft:
# tenants A and B each ask alone (their references), then together, and
# the injector points the newer request's first draft page at the older
# one's. Exits 0 when the draft pass refused that read (its log line, one
# violation) and both answers equal their references; 1 otherwise. Without
# the check the request drafts from the other tenant's rows (verification
# keeps its answer right: what leaks is how many drafts it keeps, a timing
# channel) and the violation only shows once its pages are released.
. "$(dirname "$0")/lib.sh"
KA=sk-draft-a-$RANDOM$RANDOM KB=sk-draft-b-$RANDOM$RANDOM
echo "{\"tenants\":[{\"name\":\"a\",\"keys\":[\"$KA\"]},{\"name\":\"b\",\"keys\":[\"$KB\"]}]}" \
    >"$TMPD/tenants.json"
export KS_FAULT=swap_draft
start_server "$TMPD/server.log" -m "$KS_SRC/models/kjv-mini.gguf" \
    --alias kjv-mini --ctx 512 --kv-pages 96 --tenants "$TMPD/tenants.json" --spec-tokens 4 \
    --draft-model "$KS_SRC/models/kjv-mini.gguf"
# ask_all OUT KEY PROMPT [OUT KEY PROMPT] — greedy completions of 300
# tokens, sent at once from threads of one process; each text into its OUT
ask_all() {
    python3 - "$KS_URL" "$@" <<'PY'
import json, sys, threading, urllib.request
url, args = sys.argv[1], sys.argv[2:]
jobs = [args[i:i + 3] for i in range(0, len(args), 3)]
go, errs = threading.Barrier(len(jobs)), []
def ask(out, key, prompt):
    body = {"model": "kjv-mini", "prompt": prompt, "max_tokens": 300, "temperature": 0,
            "ignore_eos": True}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Authorization": "Bearer " + key,
                                  "Content-Type": "application/json"})
    go.wait()
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            open(out, "w").write(json.load(r)["choices"][0]["text"])
    except Exception as e:
        errs.append("%s: %s" % (out, e))
ts = [threading.Thread(target=ask, args=j) for j in jobs]
for t in ts: t.start()
for t in ts: t.join()
sys.exit("; ".join(errs) if errs else 0)
PY
}
PA="The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures"
PB="In the beginning God created the heaven and the earth. And the earth was without form"
ask_all "$TMPD/a.ref" "$KA" "$PA" || fail "tenant a alone"
ask_all "$TMPD/b.ref" "$KB" "$PB" || fail "tenant b alone"
ask_all "$TMPD/a.out" "$KA" "$PA" "$TMPD/b.out" "$KB" "$PB" || fail "tenants a and b together"
v=$(metric "$KS_URL" kvseal_isolation_violations_total)
stop_server
grep -q "TEST FAULT" "$TMPD/server.log" || fail "the two requests never decoded together"
cmp -s "$TMPD/a.ref" "$TMPD/a.out" || fail "tenant a's answer changed beside tenant b"
cmp -s "$TMPD/b.ref" "$TMPD/b.out" || fail "tenant b's answer changed beside tenant a"
grep -h "SECURITY" "$TMPD/server.log" >&2 || true
if ! grep -qF "draft model: KV page check failed (isolation violation)" "$TMPD/server.log"; then
    echo "DRAFT POOL: a draft pass read another request's page unrefused (violations: ${v:-none})" >&2
    exit 1
fi
[ "${v:-0}" = 1 ] || fail "isolation violations = ${v:-none}, expected exactly 1"
echo "draft pool: the swapped page was refused where it was read" >&2
