#!/usr/bin/env bash
# leak_run.sh — runs the leak suite (js/leak.mjs) once against a fresh
# `kvseal serve` from $KS_SERVE_BIN (default $KS_BIN) with 6 tenants, a KV
# pool small enough that requests must wait, and the prefix cache on.
# Exits with the suite's status: 0 clean, 1 a leak or wrong answer found.
# Extra environment passes through (KS_FAULT for the fault injector;
# LEAK_EXPECT_VIOLATION=1 when one violation is expected).
. "$(dirname "$0")/lib.sh"
command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs it)"
tenants='[' ; list='['
for i in 0 1 2 3 4 5; do
    sep=$([ $i -gt 0 ] && echo ,)
    tenants+="$sep{\"name\":\"tenant$i\",\"keys\":[\"sk-leak-$i-$RANDOM$RANDOM\"],\"max_concurrent\":64,\"tokens_per_minute\":100000000}"
done
tenants+=']'
echo "{\"tenants\":$tenants,\"admin_key\":\"adm-$RANDOM$RANDOM\"}" >"$TMPD/tenants.json"
LEAK_TENANTS=$(node -e 'const t=require(process.argv[1]);console.log(JSON.stringify(t.tenants.map(x=>({name:x.name,key:x.keys[0]}))))' "$TMPD/tenants.json")
KS_ADMIN_KEY=$(node -e 'console.log(require(process.argv[1]).admin_key)' "$TMPD/tenants.json")
# 48 pages x 16 = 768 tokens for ctx 512: at most a few requests fit at once
start_server "$TMPD/server.log" -m "$KS_SRC/models/kjv-mini.gguf" --alias kjv-mini --ctx 512 \
    --kv-pages 48 --queue-timeout-ms 300000 --tenants "$TMPD/tenants.json" --threads 2
export KS_URL KS_ADMIN_KEY LEAK_TENANTS LEAK_MODEL=kjv-mini
node "$(dirname "$0")/js/leak.mjs"
rc=$?
stop_server
grep -h "SECURITY" "$TMPD/server.log" >&2 || true
exit $rc
