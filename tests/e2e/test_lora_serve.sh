#!/usr/bin/env bash
# LoRA adapters through `kvseal serve`, each a tenant's own (docs/api.md
# "LoRA adapters"):
# - the tenants file gives tenant0 and tenant1 each an adapter named "sql"
#   (different files) and tenant0 a public one; a request naming "sql" runs
#   its own tenant's (greedy text = `kvseal run --lora` of that file), as
#   the "adapter" field, as "model": "kjv-mini:sql" and as Workers AI's
#   "lora"; tenant2 naming "sql" gets 404 adapter_not_found with the same
#   words as a name nobody has; the public one serves every tenant;
# - requests with different adapters (and none) batched together each equal
#   their answer alone;
# - the prefix cache is keyed by (tenant, adapter): a prompt cached without
#   an adapter (or under another) is computed afresh under an adapter;
# - the admin adds one (POST /admin/adapters, the GGUF file as the body),
#   lists and removes it; bad files, unknown tenants, a duplicate name and a
#   request without the admin key are refused, named; after the removal
#   the name is not found, and nothing is left in the pool (I3).
. "$(dirname "$0")/lib.sh"
M=$KS_SRC/models/kjv-mini.gguf
for s in 1 2 3 4; do
    "$KS_BIN" mklora -m "$M" -o "$TMPD/a$s.gguf" --rank 16 --seed $s --delta 0.3 2>"$TMPD/mk.err" ||
        fail "mklora: $(cat "$TMPD/mk.err")"
done
ADM=adm-lora-serve-key-$RANDOM$RANDOM
cat >"$TMPD/tenants.json" <<EOF
{"admin_key": "$ADM", "tenants": [
 {"name": "tenant0", "keys": ["sk-t0-$RANDOM$RANDOM"],
  "adapters": [{"name": "sql", "path": "$TMPD/a1.gguf"},
               {"name": "style", "path": "$TMPD/a3.gguf", "public": true}]},
 {"name": "tenant1", "keys": ["sk-t1-$RANDOM$RANDOM"],
  "adapters": [{"name": "sql", "path": "$TMPD/a2.gguf"}]},
 {"name": "tenant2", "keys": ["sk-t2-$RANDOM$RANDOM"]}]}
EOF
key() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tenants"][int(sys.argv[2])]["keys"][0])' "$TMPD/tenants.json" "$1"; }
K0=$(key 0) K1=$(key 1) K2=$(key 2)

# a tenants file naming a file that is no adapter of this model refuses the start, named
sed "s#$TMPD/a2.gguf#$M#" "$TMPD/tenants.json" >"$TMPD/bad.json"
"$KS_BIN" serve -m "$M" --port 0 --tenants "$TMPD/bad.json" >/dev/null 2>"$TMPD/bad.err" &&
    fail "serve started with a model file as an adapter"
expect_has "bad adapter at start" "$(cat "$TMPD/bad.err")" 'tenant "tenant1" adapter "sql"'

start_server "$TMPD/server.log" -m "$M" --alias kjv-mini --ctx 512 --kv-pages 96 -t 2 \
    --tenants "$TMPD/tenants.json"
P="In the beginning God created the heaven and the earth. And the earth was without form"
# complete KEY EXTRA_JSON — a greedy completion of $P (16 tokens); TEXT its text
complete() {
    req "completion ($2)" 200 -H "Authorization: Bearer $1" -H "Content-Type: application/json" \
        "$KS_URL/v1/completions" -d "{\"model\":\"kjv-mini\",\"prompt\":\"$P\",\"max_tokens\":16,\"temperature\":0$2}"
    TEXT=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["choices"][0]["text"])' "$BODY")
}
run_ref() {  # [--lora FILE] — `kvseal run`'s 16 greedy tokens of $P
    "$KS_BIN" run -m "$M" -p "$P" -n 16 --temp 0 -t 2 "$@" 2>"$TMPD/run.err" ||
        fail "run $*: $(cat "$TMPD/run.err")"
}
base_ref=$(run_ref) a1_ref=$(run_ref --lora "$TMPD/a1.gguf") a2_ref=$(run_ref --lora "$TMPD/a2.gguf")
a3_ref=$(run_ref --lora "$TMPD/a3.gguf")
[ "$a1_ref" != "$base_ref" ] && [ "$a2_ref" != "$a1_ref" ] || fail "the adapters do not change the text"

complete "$K0" ""
expect_eq "no adapter" "$TEXT" "$base_ref"
complete "$K0" ',"adapter":"sql"'
expect_eq "tenant0's sql" "$TEXT" "$a1_ref"
complete "$K1" ',"adapter":"sql"'
expect_eq "tenant1's sql (its own file)" "$TEXT" "$a2_ref"
req "model base:adapter" 200 -H "Authorization: Bearer $K1" -H "Content-Type: application/json" \
    "$KS_URL/v1/completions" -d "{\"model\":\"kjv-mini:sql\",\"prompt\":\"$P\",\"max_tokens\":16,\"temperature\":0}"
expect_eq "kjv-mini:sql" "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["choices"][0]["text"])' "$BODY")" "$a2_ref"
req "both, differing" 400 -H "Authorization: Bearer $K1" -H "Content-Type: application/json" \
    "$KS_URL/v1/completions" -d "{\"model\":\"kjv-mini:sql\",\"adapter\":\"style\",\"prompt\":\"$P\"}"
req "workers lora" 200 -H "Authorization: Bearer $K0" -H "Content-Type: application/json" \
    "$KS_URL/accounts/acct/ai/run/kjv-mini" -d "{\"prompt\":\"$P\",\"max_tokens\":16,\"temperature\":0,\"lora\":\"sql\"}"
expect_has "workers lora" "$BODY" "$(printf '%s' "$a1_ref" | head -c 20)"
complete "$K2" ',"adapter":"style"'
expect_eq "the public adapter, another tenant" "$TEXT" "$a3_ref"

# /v1/models lists the caller's own adapters and the public ones (vLLM's "parent")
req "models, tenant0" 200 -H "Authorization: Bearer $K0" "$KS_URL/v1/models"
ids=$(python3 -c 'import json,sys; print(" ".join(sorted(m["id"] for m in json.loads(sys.argv[1])["data"] if m.get("parent"))))' "$BODY")
expect_eq "tenant0's adapters" "$ids" "kjv-mini:sql kjv-mini:style"
req "models, tenant2" 200 -H "Authorization: Bearer $K2" "$KS_URL/v1/models"
ids=$(python3 -c 'import json,sys; print(" ".join(sorted(m["id"] for m in json.loads(sys.argv[1])["data"] if m.get("parent"))))' "$BODY")
expect_eq "tenant2 sees the public one only" "$ids" "kjv-mini:style"

# another tenant's name reads exactly as a name nobody has
req "tenant2 guesses sql" 404 -H "Authorization: Bearer $K2" -H "Content-Type: application/json" \
    "$KS_URL/v1/completions" -d "{\"model\":\"kjv-mini\",\"prompt\":\"$P\",\"adapter\":\"sql\"}"
guess=$BODY
req "a name nobody has" 404 -H "Authorization: Bearer $K2" -H "Content-Type: application/json" \
    "$KS_URL/v1/completions" -d "{\"model\":\"kjv-mini\",\"prompt\":\"$P\",\"adapter\":\"sqm\"}"
expect_has "not found" "$guess" '"code":"adapter_not_found"'
expect_eq "the same words" "${guess//sql/X}" "${BODY//sqm/X}"
req "chat, tenant2 guesses via the model" 404 -H "Authorization: Bearer $K2" \
    -H "Content-Type: application/json" "$KS_URL/v1/chat/completions" \
    -d '{"model":"kjv-mini:sql","messages":[{"role":"user","content":"hi"}]}'

# batched together: each answer equals its own alone
pids=()
for i in 0 1 2 3; do
    case $i in 0) k=$K0 x=',"adapter":"sql"';; 1) k=$K1 x=',"adapter":"sql"';;
               2) k=$K2 x=',"adapter":"style"';; 3) k=$K2 x='';; esac
    curl -sS -o "$TMPD/mix$i.json" -H "Authorization: Bearer $k" -H "Content-Type: application/json" \
        "$KS_URL/v1/completions" -d "{\"model\":\"kjv-mini\",\"prompt\":\"$P\",\"max_tokens\":16,\"temperature\":0$x}" &
    pids+=($!)
done
wait "${pids[@]}"
want=("$a1_ref" "$a2_ref" "$a3_ref" "$base_ref")
for i in 0 1 2 3; do
    got=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' "$TMPD/mix$i.json") ||
        fail "mixed batch $i: $(cat "$TMPD/mix$i.json")"
    expect_eq "mixed batch $i = alone" "$got" "${want[$i]}"
done

# the prefix cache: $P is cached now for tenant2 without an adapter and with
# "style"; a fresh adapter for tenant2 finds nothing cached
cached() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])["usage"]["prompt_tokens_details"]["cached_tokens"])' "$BODY"; }
complete "$K2" ''
[ "$(cached)" -gt 0 ] || fail "the plain prompt was not cached: $BODY"
req "admin upload" 201 -H "Authorization: Bearer $ADM" --data-binary "@$TMPD/a4.gguf" \
    "$KS_URL/admin/adapters?tenant=tenant2&name=mine"
expect_has "upload answer" "$BODY" '"rank":16'
complete "$K2" ',"adapter":"mine"'
expect_eq "a new adapter: nothing cached" "$(cached)" 0
a4_ref=$(run_ref --lora "$TMPD/a4.gguf")
expect_eq "the uploaded adapter" "$TEXT" "$a4_ref"
complete "$K2" ',"adapter":"mine"'
[ "$(cached)" -gt 0 ] || fail "its own prefix was not reused: $BODY"
expect_eq "from its cache" "$TEXT" "$a4_ref"
req "tenant0 guesses mine" 404 -H "Authorization: Bearer $K0" -H "Content-Type: application/json" \
    "$KS_URL/v1/completions" -d "{\"model\":\"kjv-mini\",\"prompt\":\"$P\",\"adapter\":\"mine\"}"

# the admin routes' refusals
# without the admin key a body past the usual 1 MiB bound is refused unread
req "no key" 413 --data-binary "@$TMPD/a4.gguf" "$KS_URL/admin/adapters?tenant=tenant2&name=x"
req "a tenant's key" 413 -H "Authorization: Bearer $K0" --data-binary "@$TMPD/a4.gguf" \
    "$KS_URL/admin/adapters?tenant=tenant0&name=x"
req "a tenant's key, small body" 401 -H "Authorization: Bearer $K0" --data-binary "GGUF" \
    "$KS_URL/admin/adapters?tenant=tenant0&name=x"
req "duplicate" 409 -H "Authorization: Bearer $ADM" --data-binary "@$TMPD/a4.gguf" \
    "$KS_URL/admin/adapters?tenant=tenant2&name=mine"
req "public name taken" 409 -H "Authorization: Bearer $ADM" --data-binary "@$TMPD/a4.gguf" \
    "$KS_URL/admin/adapters?tenant=tenant1&name=style&public=true"
req "unknown tenant" 404 -H "Authorization: Bearer $ADM" --data-binary "@$TMPD/a4.gguf" \
    "$KS_URL/admin/adapters?tenant=nobody&name=x"
req "not a GGUF" 400 -H "Authorization: Bearer $ADM" --data-binary "not a gguf file" \
    "$KS_URL/admin/adapters?tenant=tenant2&name=x"
req "the base model as an adapter" 400 -H "Authorization: Bearer $ADM" --data-binary "@$M" \
    "$KS_URL/admin/adapters?tenant=tenant2&name=x"
expect_has "named cause" "$BODY" "adapter"
req "bad name" 400 -H "Authorization: Bearer $ADM" --data-binary "@$TMPD/a4.gguf" \
    "$KS_URL/admin/adapters?tenant=tenant2&name=..%2Fx"
req "list" 200 -H "Authorization: Bearer $ADM" "$KS_URL/admin/adapters"
n=$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])["data"]))' "$BODY")
expect_eq "adapters listed" "$n" 4
wait_for "the adapter gauge" metric_is "$KS_URL" kvseal_lora_adapters 4
req "delete" 200 -X DELETE -H "Authorization: Bearer $ADM" "$KS_URL/admin/adapters/tenant2/mine"
req "delete again" 404 -X DELETE -H "Authorization: Bearer $ADM" "$KS_URL/admin/adapters/tenant2/mine"
req "another's by the wrong owner" 404 -X DELETE -H "Authorization: Bearer $ADM" \
    "$KS_URL/admin/adapters/tenant2/sql"
req "removed: not found" 404 -H "Authorization: Bearer $K2" -H "Content-Type: application/json" \
    "$KS_URL/v1/completions" -d "{\"model\":\"kjv-mini\",\"prompt\":\"$P\",\"adapter\":\"mine\"}"
wait_for "the adapter gauge" metric_is "$KS_URL" kvseal_lora_adapters 3
req "pool clean" 200 -H "Authorization: Bearer $ADM" "$KS_URL/admin/kv/check"
grep -q "SECURITY" "$TMPD/server.log" && fail "security events: $(grep SECURITY "$TMPD/server.log")"
stop_server

# serving several models (--models-dir): a model's adapters load with it
# and again after it was unloaded; the adapter is checked against the
# model when added, even while the model is not loaded
mkdir -p "$TMPD/models"
cp "$M" "$TMPD/models/alpha.gguf"
cp "$M" "$TMPD/models/beta.gguf"
start_server "$TMPD/multi.log" --models-dir "$TMPD/models" --ctx 512 --kv-pages 64 -t 2 \
    --models-max-loaded 1 --tenants "$TMPD/tenants.json"
# mc MODEL KEY EXTRA — a greedy completion, retried while the model loads (503)
mc() {
    local code
    for _ in $(seq 1 200); do
        code=$(curl -sS -o "$TMPD/body" -w '%{http_code}' -H "Authorization: Bearer $2" \
            -H "Content-Type: application/json" "$KS_URL/v1/completions" \
            -d "{\"model\":\"$1\",\"prompt\":\"$P\",\"max_tokens\":16,\"temperature\":0$3}")
        [ "$code" = 503 ] && grep -q model_loading "$TMPD/body" && { sleep 0.1; continue; }
        break
    done
    BODY=$(cat "$TMPD/body")
    expect_eq "$1$3: status ($BODY)" "$code" 200
    TEXT=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["choices"][0]["text"])' "$BODY")
}
req "upload to an unloaded model" 201 -H "Authorization: Bearer $ADM" --data-binary "@$TMPD/a4.gguf" \
    "$KS_URL/admin/adapters?tenant=tenant2&name=mine&model=beta"
req "a file that is no adapter, unloaded model" 400 -H "Authorization: Bearer $ADM" --data-binary "@$M" \
    "$KS_URL/admin/adapters?tenant=tenant2&name=x&model=beta"
mc beta "$K2" ',"adapter":"mine"'
expect_eq "beta:mine" "$TEXT" "$a4_ref"
mc alpha "$K0" ',"adapter":"sql"'   # the tenants file's, loaded with alpha (beta unloaded)
expect_eq "alpha:sql" "$TEXT" "$a1_ref"
req "beta's adapter asked of alpha" 404 -H "Authorization: Bearer $K2" -H "Content-Type: application/json" \
    "$KS_URL/v1/completions" -d "{\"model\":\"alpha\",\"prompt\":\"$P\",\"adapter\":\"mine\"}"
mc beta:mine "$K2" ''               # beta loads again, its adapter with it
expect_eq "beta:mine after a reload" "$TEXT" "$a4_ref"
stop_server
echo "PASS"
