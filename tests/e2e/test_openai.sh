#!/usr/bin/env bash
# The official openai npm client (streaming and not) against `kvseal serve`.
. "$(dirname "$0")/lib.sh"
command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs it)"
[ -d "$(dirname "$0")/js/node_modules/openai" ] || skip "the openai npm package is not installed (scripts/install-deps.sh)"
echo '{"tenants":[{"name":"acme","keys":["sk-acme-test"],"max_concurrent":8,"tokens_per_minute":1000000}],"admin_key":"adm-test-0123456789"}' >"$TMPD/t.json"
start_server "$TMPD/server.log" --alias @cf/kvseal/kjv-mini --tenants "$TMPD/t.json"
KS_URL=$KS_URL KS_KEY=sk-acme-test KS_MODEL_NAME=@cf/kvseal/kjv-mini node "$(dirname "$0")/js/openai_client.mjs" || fail "openai client checks failed"
stop_server
echo "openai ok"
