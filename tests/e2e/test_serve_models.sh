#!/usr/bin/env bash
# Several models in one `kvseal serve` (docs/models.md "Several models in one
# server"), end to end:
#  - `kvseal check` with -m repeated and with --models-dir checks every
#    model's pool (I8), and refuses a model that could never fit
#    --models-memory;
#  - serve --models-dir: /v1/models lists every model and models.json's
#    aliases; a model is loaded on first use, answering 503 model_loading
#    with Retry-After until it is, then serves the same greedy text as a
#    one-model serve of the same file;
#  - under --models-max-loaded 2 the least recently used idle model is
#    unloaded for a third (kvseal_model_unloads_total), never one with a
#    request running (a stalled stream holds one); /v1/models says which
#    are loaded; the admin's /unload is 409 while a request runs, then
#    unloads, and /load loads;
#  - a model whose file was replaced after the start (its tokenizer is the
#    old file's) is not loaded: a clear 503 naming the change, nothing
#    unloaded for it, the others keep serving; the server stops cleanly.
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || skip "python3 is absent"
MK=(mkmodel --vocab "$KS_SRC/models/kjv-mini.gguf" --shape tiny)
D=$TMPD/models
mkdir -p "$D"
for s in alpha:11 beta:12 gamma:13 delta:14; do
    "$KS_BIN" "${MK[@]}" --seed "${s#*:}" -o "$D/${s%%:*}.gguf" >/dev/null 2>&1 || fail "mkmodel ${s%%:*}"
done
cat >"$D/models.json" <<'JSON'
{"alpha": {"aliases": ["a", "@cf/test/alpha"]}, "beta": {"ctx": 768}}
JSON
POOL=(--ctx 1024 --kv-pages 160)

# ---- the deploy-time check, per model
"$KS_BIN" check --models-dir "$D" "${POOL[@]}" >"$TMPD/check.out" 2>"$TMPD/check.err" ||
    fail "check --models-dir: exit $? ($(cat "$TMPD/check.err"))"
for m in alpha beta gamma delta; do
    grep -q "^model $m: " "$TMPD/check.out" || fail "check: no line for $m: $(cat "$TMPD/check.out")"
done
grep -q "^4 models" "$TMPD/check.out" || fail "check: no summary: $(cat "$TMPD/check.out")"
"$KS_BIN" check -m "$D/alpha.gguf" -m "$D/beta.gguf,bb" "${POOL[@]}" >"$TMPD/check2.out" 2>&1 ||
    fail "check -m -m: exit $? ($(cat "$TMPD/check2.out"))"
grep -q "^2 models" "$TMPD/check2.out" || fail "check -m -m: $(cat "$TMPD/check2.out")"
rc=0
"$KS_BIN" check --models-dir "$D" "${POOL[@]}" --models-memory 64K >"$TMPD/check3.out" 2>&1 || rc=$?
expect_eq "check with a budget below one model: exit" "$rc" 1
grep -q "could never load" "$TMPD/check3.out" || fail "budget refusal: $(cat "$TMPD/check3.out")"
rc=0
"$KS_BIN" check -m "$D/alpha.gguf" -m "$D/alpha.gguf" "${POOL[@]}" >"$TMPD/check4.out" 2>&1 || rc=$?
expect_eq "two models of one name: exit" "$rc" 2
grep -q "two models answer to 'alpha'" "$TMPD/check4.out" || fail "duplicate: $(cat "$TMPD/check4.out")"

printf '{"alpha": {"alias": ["x"]}}' >"$TMPD/bad1.json"
printf '{"omega": {"ctx": 512}}' >"$TMPD/bad2.json"
for b in bad1:"unknown key 'alias'" bad2:"no model named 'omega'"; do
    rc=0
    "$KS_BIN" check --models-dir "$D" --models-config "$TMPD/${b%%:*}.json" "${POOL[@]}" \
        >"$TMPD/${b%%:*}.out" 2>&1 || rc=$?
    expect_eq "${b%%:*}.json: exit" "$rc" 2
    grep -qF "${b#*:}" "$TMPD/${b%%:*}.out" || fail "${b%%:*}.json: $(cat "$TMPD/${b%%:*}.out")"
done

# ---- the reference: alpha served alone
start_server "$TMPD/one" -m "$D/alpha.gguf" "${POOL[@]}"
PROMPT="In the beginning God created"
complete() { # URL MODEL -> TEXT (greedy, 12 tokens)
    req "completion ($2)" 200 -H "Content-Type: application/json" "$1/v1/completions" \
        -d "{\"model\":\"$2\",\"prompt\":\"$PROMPT\",\"max_tokens\":12,\"temperature\":0}"
    TEXT=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["choices"][0]["text"])' "$BODY")
}
complete "$KS_URL" alpha
REF=$TEXT
stop_server

# ---- several models
ADMIN=adm-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
start_server "$TMPD/s" --models-dir "$D" "${POOL[@]}" --models-max-loaded 2 --admin-key "$ADMIN"
IDS=$(curl -fsS "$KS_URL/v1/models" | python3 -c 'import json, sys; print(" ".join(sorted(m["id"] for m in json.load(sys.stdin)["data"])))')
expect_eq "/v1/models" "$IDS" "@cf/test/alpha a alpha beta delta gamma"
loaded() { metric_is "$KS_URL" "kvseal_model_loaded{model=\"$1\",state=\"loaded\"}" 1; }
# first use: 503 model_loading with a Retry-After, then the load
code=$(curl -sS -D "$TMPD/h" -o "$TMPD/body" -w '%{http_code}' -H "Content-Type: application/json" \
    "$KS_URL/v1/completions" -d "{\"model\":\"a\",\"prompt\":\"$PROMPT\",\"max_tokens\":4}")
expect_eq "first request to alpha" "$code" 503
expect_has "503 body" "$(cat "$TMPD/body")" '"code":"model_loading"'
expect_has "503 body" "$(cat "$TMPD/body")" "the model 'alpha' is loading"
grep -qi '^retry-after: [1-9]' "$TMPD/h" || fail "no Retry-After on the 503: $(cat "$TMPD/h")"
wait_for "alpha to load" loaded alpha
STATUS=$(curl -fsS "$KS_URL/v1/models" | python3 -c 'import json, sys
print(" ".join("%s=%s" % (m["id"], m["status"]["value"]) for m in sorted(json.load(sys.stdin)["data"], key=lambda m: m["id"])))')
expect_eq "/v1/models status" "$STATUS" \
    "@cf/test/alpha=loaded a=loaded alpha=loaded beta=unloaded delta=unloaded gamma=unloaded"
complete "$KS_URL" a
expect_eq "alpha's greedy text beside others = alone" "$TEXT" "$REF"
# beta, then gamma: with two loaded, gamma evicts alpha (the least recently used)
req "beta's first request" 503 -H "Content-Type: application/json" "$KS_URL/v1/completions" \
    -d "{\"model\":\"beta\",\"prompt\":\"x\",\"max_tokens\":2}"
wait_for "beta to load" loaded beta
complete "$KS_URL" beta
req "gamma's first request" 503 -H "Content-Type: application/json" "$KS_URL/v1/completions" \
    -d "{\"model\":\"gamma\",\"prompt\":\"x\",\"max_tokens\":2}"
wait_for "gamma to load" loaded gamma
expect_eq "alpha unloaded" "$(metric "$KS_URL" 'kvseal_model_unloads_total{model="alpha"}')" 1
expect_eq "beta kept" "$(metric "$KS_URL" 'kvseal_model_unloads_total{model="beta"}')" 0
# beta busy (a stream its client stopped reading) and then gamma used: beta is
# the least recently used, but busy: alpha's load must unload gamma, not beta
stall_reader "$KS_URL" beta "$TMPD/stalled.out"
complete "$KS_URL" gamma
req "alpha again" 503 -H "Content-Type: application/json" "$KS_URL/v1/completions" \
    -d "{\"model\":\"alpha\",\"prompt\":\"x\",\"max_tokens\":2}"
wait_for "alpha to load again" loaded alpha
expect_eq "gamma unloaded" "$(metric "$KS_URL" 'kvseal_model_unloads_total{model="gamma"}')" 1
expect_eq "busy beta kept" "$(metric "$KS_URL" 'kvseal_model_unloads_total{model="beta"}')" 0
complete "$KS_URL" alpha
expect_eq "alpha after a reload" "$TEXT" "$REF"
# the operator's unload: refused while beta runs a request, done once it ended
admin() { req "admin $1 $2" "$3" -X POST -H "Authorization: Bearer $ADMIN" "$KS_URL/admin/models/$1/$2"; }
admin beta unload 409
expect_has "busy unload's message" "$BODY" "has 1 request(s) running"
kill $STALL_PID 2>/dev/null; wait $STALL_PID 2>/dev/null
admin_ok() { [ "$(curl -sS -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $ADMIN" \
    "$KS_URL/admin/models/$1/$2")" = 202 ]; }
wait_for "beta's unload, once its request is gone" admin_ok beta unload
wait_for "beta to unload" metric_is "$KS_URL" 'kvseal_model_unloads_total{model="beta"}' 1
admin gamma load 202
expect_has "load's answer" "$BODY" '"status":"loading"'
wait_for "gamma to load (asked by the admin)" loaded gamma
# a file gone bad after the start: its load fails with a clear 503, the rest serve on
rm -f "$D/delta.gguf"
head -c 4096 /dev/urandom >"$D/delta.gguf"
req "delta's first request" 503 -H "Content-Type: application/json" "$KS_URL/v1/completions" \
    -d "{\"model\":\"delta\",\"prompt\":\"x\",\"max_tokens\":2}"
wait_for "delta's load to fail" metric_is "$KS_URL" 'kvseal_model_load_failures_total{model="delta"}' 1
req "delta after the failure" 503 -H "Content-Type: application/json" "$KS_URL/v1/completions" \
    -d "{\"model\":\"delta\",\"prompt\":\"x\",\"max_tokens\":2}"
expect_has "failed load's message" "$BODY" "the model 'delta' failed to load"
expect_has "failed load's message" "$BODY" "changed on disk since the start"
expect_eq "nothing unloaded for a load that could not work" \
    "$(metric "$KS_URL" 'kvseal_model_unloads_total{model="alpha"}')" 1
complete "$KS_URL" alpha
expect_eq "alpha after delta's failure" "$TEXT" "$REF"
req "unknown model" 404 -H "Content-Type: application/json" "$KS_URL/v1/completions" \
    -d '{"model":"epsilon","prompt":"x","max_tokens":2}'
stop_server
grep -q "model beta: unloading (least" "$TMPD/s" && fail "beta was unloaded while busy"
echo "PASS"
