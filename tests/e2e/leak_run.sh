#!/usr/bin/env bash
# leak_run.sh — runs the leak suite (js/leak.mjs) once against a fresh
# `kvseal serve` from $KS_SERVE_BIN (default $KS_BIN) with 6 tenants, a KV
# pool small enough that requests must wait, and the prefix cache on.
# Exits with the suite's status: 0 clean, 1 a leak or wrong answer found.
# On kjv-mini it also makes two LoRA adapters (js/leak.mjs LEAK_ADAPTERS).
# LEAK_MODEL_FILE: another model file (served under the alias kjv-mini).
# LEAK_SERVE_ARGS: more server options (e.g. --spec-tokens 4: speculative decoding;
# LEAK_EXPECT_SPEC=1 then fails the run unless drafts were kept; =drafted:
# unless drafts were computed).
# Extra environment passes through (KS_FAULT for the fault injector;
# LEAK_EXPECT_VIOLATION=1 when one violation is expected).
# LEAK_DISAGG=1: the suite runs against `kvseal router` with 2 prefill and 2
# decode workers instead (same tenants and pool per decode worker), while a
# `kvseal serve` produces the references; PREFILL_ENV / DECODE_ENV (e.g.
# KS_PD_FAULT=...) reach the workers, LEAK_EXPECT_FAILED=1 with a fault.
. "$(dirname "$0")/lib.sh"
command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs it)"
tenants='[' ; list='['
for i in 0 1 2 3 4 5; do
    sep=$([ $i -gt 0 ] && echo ,)
    tenants+="$sep{\"name\":\"tenant$i\",\"keys\":[\"sk-leak-$i-$RANDOM$RANDOM\"],\"max_concurrent\":64,\"tokens_per_minute\":100000000}"
done
tenants+=']'
echo "{\"tenants\":$tenants,\"admin_key\":\"adm-leak-run-key-$RANDOM$RANDOM\"}" >"$TMPD/tenants.json"
LEAK_TENANTS=$(node -e 'const t=require(process.argv[1]);console.log(JSON.stringify(t.tenants.map(x=>({name:x.name,key:x.keys[0]}))))' "$TMPD/tenants.json")
KS_ADMIN_KEY=$(node -e 'console.log(require(process.argv[1]).admin_key)' "$TMPD/tenants.json")
# 48 pages x 16 = 768 tokens for ctx 512: at most a few requests fit at once
# (LEAK_KV_PAGES: more for a hybrid model, whose every sequence also holds its
# state's pages, and whose prefix cache, a quarter of the pool, keeps state
# snapshots of that size)
POOL=(-m "${LEAK_MODEL_FILE:-$KS_SRC/models/kjv-mini.gguf}" --alias kjv-mini --ctx 512
      --kv-pages "${LEAK_KV_PAGES:-48}"
      --queue-timeout-ms 300000 --threads ${LEAK_THREADS:-2} ${LEAK_SERVE_ARGS:-})
if [ "${LEAK_DISAGG:-0}" = 1 ]; then
    start_server "$TMPD/ref.log" "${POOL[@]}" --tenants "$TMPD/tenants.json"
    REF_URL=$KS_URL; REF_PID=$KS_PID
    CLUSTER_PROBE_AUTH=$(node -e 'console.log(require(process.argv[1]).tenants[0].keys[0])' "$TMPD/tenants.json")
    ROUTER_ARGS="--tenants $TMPD/tenants.json" start_cluster "$TMPD/c" 2 2 "${POOL[@]}"
    trap 'kill -KILL $REF_PID $KS_PID "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}" 2>/dev/null; rm_tmpd' EXIT
    export LEAK_REF_URL=$REF_URL  # the prefill workers cache prefixes as serve does
fi
[ "${LEAK_DISAGG:-0}" = 1 ] || start_server "$TMPD/server.log" "${POOL[@]}" --tenants "$TMPD/tenants.json"
# two LoRA adapters of kjv-mini, uploaded by the suite (serve on the default
# model only; LEAK_NO_ADAPTERS=1 leaves them out)
if [ "${LEAK_DISAGG:-0}" != 1 ] && [ -z "${LEAK_MODEL_FILE:-}" ] && [ "${LEAK_NO_ADAPTERS:-0}" != 1 ]; then
    for s in 1 2; do
        "$KS_BIN" mklora -m "$KS_SRC/models/kjv-mini.gguf" -o "$TMPD/ad$s.gguf" \
            --rank 16 --seed $s --delta 0.5 2>"$TMPD/mklora.err" || fail "mklora: $(cat "$TMPD/mklora.err")"
    done
    export LEAK_ADAPTERS="[\"$TMPD/ad1.gguf\",\"$TMPD/ad2.gguf\"]"
fi
export KS_URL KS_ADMIN_KEY LEAK_TENANTS LEAK_MODEL=kjv-mini
node "$(dirname "$0")/js/leak.mjs"
rc=$?
if [ "${LEAK_DISAGG:-0}" = 1 ]; then
    [ $rc -eq 0 ] || tail -n 30 $KS_CLUSTER_LOGS >&2
    stop_cluster
    KS_PID=$REF_PID stop_server
    grep -h "SECURITY" $KS_CLUSTER_LOGS >&2 || true
else
    if [ -n "${LEAK_EXPECT_SPEC:-}" ]; then # the suite's requests drafted, and kept drafts
        kept=$(metric "$KS_URL" kvseal_spec_accepted_tokens_total)
        drafted=$(metric "$KS_URL" kvseal_spec_draft_tokens_total)
        echo "leak suite: speculative drafts kept: ${kept:-none} of ${drafted:-none}" >&2
        if [ "$LEAK_EXPECT_SPEC" = drafted ]; then # random weights: drafts, kept or not
            [ "${drafted:-0}" -gt 0 ] || { echo "LEAK SUITE FAILURE: nothing was drafted" >&2; rc=1; }
        else
            [ "${kept:-0}" -gt 0 ] || { echo "LEAK SUITE FAILURE: no draft was kept" >&2; rc=1; }
        fi
    fi
    stop_server
    grep -h "SECURITY" "$TMPD/server.log" >&2 || true
fi
exit $rc
