#!/usr/bin/env bash
# LoRA adapters through the cluster (docs/cluster.md "LoRA adapters"): a
# router whose tenants file names adapters, one prefill and one decode
# worker holding the adapter files (--lora), each known by its digest.
# - a tenant's greedy completion with its adapter equals `kvseal run --lora`
#   of that file (tenant0's and tenant1's "sql" are different files), a
#   public one serves every tenant, no adapter gives the base text;
# - another tenant guessing a name gets 404 adapter_not_found in the same
#   words as a name nobody has;
# - requests with different adapters (and none) at once each equal their
#   answer alone;
# - the prefill worker's prefix cache is keyed by (tenant, adapter): a prompt
#   cached without an adapter is computed afresh under one, then reused;
# - POST /admin/adapters answers 501 (adapters go to the workers' --lora and
#   the tenants file), GET lists the router's table with each digest;
# - a decode worker started without one of the adapters is refused at
#   registration, the router's log naming the missing adapter's digest;
# - every pool ends FREE and scrubbed (I3).
. "$(dirname "$0")/lib.sh"
M=$KS_SRC/models/kjv-mini.gguf
for s in 1 2 3; do
    "$KS_BIN" mklora -m "$M" -o "$TMPD/a$s.gguf" --rank 16 --seed $s --delta 0.3 2>"$TMPD/mk.err" ||
        fail "mklora: $(cat "$TMPD/mk.err")"
done
ADM=adm-cluster-lora-$RANDOM$RANDOM
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
# the digest every node computes: SHA-256 of the file's bytes and the scale (f32 LE)
digest() { python3 -c 'import hashlib,struct,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()+struct.pack("<f",1.0)).hexdigest())' "$1"; }
D3=$(digest "$TMPD/a3.gguf")

# --lora is the workers' alone
"$KS_BIN" serve -m "$M" --port 0 --lora "$TMPD/a1.gguf" >/dev/null 2>"$TMPD/serve.err" &&
    fail "serve took --lora"
expect_has "serve --lora" "$(cat "$TMPD/serve.err")" "tenants file"

LORAS="--lora $TMPD/a1.gguf --lora $TMPD/a2.gguf --lora $TMPD/a3.gguf:1"
export ROUTER_ARGS="--tenants $TMPD/tenants.json" PREFILL_ARGS=$LORAS DECODE_ARGS=$LORAS
CLUSTER_PROBE_AUTH=$K2
start_cluster "$TMPD/c" 1 1 -m "$M" --alias kjv-mini --ctx 512 --kv-pages 96 -t 2
grep -q "LoRA adapter .*a3.gguf (sha256 $D3) loaded" "$TMPD/c.prefill1" ||
    fail "the prefill worker's digest of a3 is not $D3: $(grep 'LoRA' "$TMPD/c.prefill1")"

# a worker given a file that is no adapter of its model refuses to start, named
for role in prefill decode; do
    "$KS_BIN" $role -m "$M" --router 127.0.0.1:1 --secret-file "$TMPD/secret" --ctx 512 \
        --kv-pages 96 -t 2 --lora "$M" >/dev/null 2>"$TMPD/bad.err" &&
        fail "$role started with a model file as an adapter"
    expect_has "$role: the bad adapter named" "$(cat "$TMPD/bad.err")" "--lora $M"
done

P="In the beginning God created the heaven and the earth. And the earth was without form"
complete() { # KEY EXTRA_JSON — a greedy completion of $P (16 tokens); TEXT its text
    req "completion ($2)" 200 -H "Authorization: Bearer $1" -H "Content-Type: application/json" \
        "$KS_URL/v1/completions" -d "{\"model\":\"kjv-mini\",\"prompt\":\"$P\",\"max_tokens\":16,\"temperature\":0$2}"
    TEXT=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["choices"][0]["text"])' "$BODY")
}
cached() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])["usage"]["prompt_tokens_details"]["cached_tokens"])' "$BODY"; }
run_ref() { # [--lora FILE] — `kvseal run`'s 16 greedy tokens of $P
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
expect_eq "cached under no adapter: not found under one" "$(cached)" 0
complete "$K0" ',"adapter":"sql"'
expect_eq "tenant0's sql again" "$TEXT" "$a1_ref"
[ "$(cached)" -gt 0 ] || fail "its own prefix was not reused: $BODY"
complete "$K1" ',"adapter":"sql"'
expect_eq "tenant1's sql (its own file)" "$TEXT" "$a2_ref"
req "model base:adapter" 200 -H "Authorization: Bearer $K1" -H "Content-Type: application/json" \
    "$KS_URL/v1/completions" -d "{\"model\":\"kjv-mini:sql\",\"prompt\":\"$P\",\"max_tokens\":16,\"temperature\":0}"
expect_eq "kjv-mini:sql" "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["choices"][0]["text"])' "$BODY")" "$a2_ref"
complete "$K2" ',"adapter":"style"'
expect_eq "the public adapter, another tenant" "$TEXT" "$a3_ref"

# another tenant's name reads exactly as a name nobody has
req "tenant2 guesses sql" 404 -H "Authorization: Bearer $K2" -H "Content-Type: application/json" \
    "$KS_URL/v1/completions" -d "{\"model\":\"kjv-mini\",\"prompt\":\"$P\",\"adapter\":\"sql\"}"
guess=$BODY
req "a name nobody has" 404 -H "Authorization: Bearer $K2" -H "Content-Type: application/json" \
    "$KS_URL/v1/completions" -d "{\"model\":\"kjv-mini\",\"prompt\":\"$P\",\"adapter\":\"sqm\"}"
expect_has "not found" "$guess" '"code":"adapter_not_found"'
expect_eq "the same words" "${guess//sql/X}" "${BODY//sqm/X}"

# at once: each answer equals its own alone
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

# the admin routes: the table is the tenants file's
req "admin upload" 501 -H "Authorization: Bearer $ADM" --data-binary "@$TMPD/a1.gguf" \
    "$KS_URL/admin/adapters?tenant=tenant2&name=mine"
expect_has "501 says where adapters go" "$BODY" "--lora"
req "list" 200 -H "Authorization: Bearer $ADM" "$KS_URL/admin/adapters"
n=$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])["data"]))' "$BODY")
expect_eq "adapters listed" "$n" 3
expect_has "the digest listed" "$BODY" "\"sha256\":\"$D3\""

# a decode worker without a3 is refused at registration, the digest named
"$KS_BIN" decode --router "127.0.0.1:${KS_CPORTS[0]}" --secret-file "$TMPD/secret" -m "$M" --ctx 512 \
    --kv-pages 96 -t 2 --lora "$TMPD/a1.gguf" --lora "$TMPD/a2.gguf" >"$TMPD/short.out" 2>"$TMPD/short.err" &
short=$!
wait_for "the router to refuse a worker without a3" file_has "$KS_ROUTER_LOG" "lacks LoRA adapter sha256 $D3"
kill -TERM $short 2>/dev/null
wait $short 2>/dev/null
complete "$K0" ',"adapter":"style"'
expect_eq "still served by the registered workers" "$TEXT" "$a3_ref"

req "pool clean" 200 -H "Authorization: Bearer $ADM" "$KS_URL/admin/kv/check"
grep -q "SECURITY" "$TMPD/c.router" && fail "security events: $(grep SECURITY "$TMPD/c.router")"
stop_cluster
echo "PASS"
