#!/usr/bin/env bash
# test_webui.sh — the web pages in a real browser (Debian's chromium driven
# by puppeteer-core, js/webui.mjs): the chat page at / streams a greedy
# answer equal to the API's, Stop frees the request, the key stays in the
# browser and a wrong one is refused; the operator's page at /admin maps
# the KV pool with a running request's pages under its tenant's name (the
# admin key's alone: a tenant key gets 401, and no page names a tenant
# without it), and its button runs the idle pool check. Skips, saying so,
# where node, puppeteer-core or a browser that starts is missing.
. "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl is not installed (scripts/install-deps.sh)"
command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs it)"
JS=$(dirname "$0")/js
[ -d "$JS/node_modules/puppeteer-core" ] ||
    skip "the puppeteer-core npm package is not installed (scripts/install-deps.sh)"
CHROMIUM=${KS_CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[ -n "$CHROMIUM" ] || skip "no chromium browser (scripts/install-deps.sh installs Debian's chromium)"
M=$KS_SRC/models/kjv-mini.gguf
cat >"$TMPD/t.json" <<'JSON'
{"admin_key":"sk-admin-0123456789abcdef",
 "tenants":[{"name":"alpha","keys":["sk-alpha-0123456789abcdef"]},
            {"name":"beta","keys":["sk-beta-0123456789abcdef"]}]}
JSON
start_server "$TMPD/s" -m "$M" --tenants "$TMPD/t.json"

# the pages carry no data and need no key; their policy admits only this origin's scripts
for p in / /admin /ui/chat.js /ui/admin.js /ui/style.css; do
    code=$(curl -sS -o /dev/null -D "$TMPD/h" -w '%{http_code}' "$KS_URL$p")
    expect_eq "GET $p" "$code" 200
    expect_has "GET $p: CSP" "$(cat "$TMPD/h")" "script-src 'self'"
    expect_has "GET $p: nosniff" "$(cat "$TMPD/h")" "X-Content-Type-Options: nosniff"
done
expect_has "the chat page" "$(curl -sS "$KS_URL/")" '<script src="/ui/chat.js"></script>'
expect_eq "an unknown page file" "$(curl -sS -o /dev/null -w '%{http_code}' "$KS_URL/ui/nope.js")" 404
expect_eq "POST /" "$(curl -sS -o /dev/null -w '%{http_code}' -d x "$KS_URL/")" 405
# the pool's map names tenants: the admin key only
expect_eq "/admin/pool without a key" \
    "$(curl -sS -o /dev/null -w '%{http_code}' "$KS_URL/admin/pool")" 401
expect_eq "/admin/pool with a tenant key" "$(curl -sS -o /dev/null -w '%{http_code}' \
    -H 'Authorization: Bearer sk-alpha-0123456789abcdef' "$KS_URL/admin/pool")" 401
pool=$(curl -sS -H 'Authorization: Bearer sk-admin-0123456789abcdef' "$KS_URL/admin/pool")
python3 - "$pool" <<'PY' || fail "/admin/pool: $pool"
import json, sys
j = json.loads(sys.argv[1])
m, p = j["map"], j["pool"]
assert m["pages"] == p["free"] + p["allocated"] + p["ready"] + p["quarantined"], "page counts"
assert sum(r[2] for r in m["runs"]) == m["pages"], "runs cover the pool"
assert [t["name"] for t in j["tenants"]] == ["alpha", "beta"], j["tenants"]
PY

# browser MODE — js/webui.mjs's checks of MODE (chat, admin, check)
browser() {
    local rc=0
    node "$JS/webui.mjs" "$1" "$KS_URL" sk-alpha-0123456789abcdef sk-admin-0123456789abcdef \
        "$CHROMIUM" || rc=$?
    [ $rc -eq 77 ] && skip "chromium cannot start here"
    [ $rc -eq 0 ] || fail "the browser's $1 checks failed"
}
browser chat
# alpha's request held running (its client stopped reading) while /admin maps the pool
RAWC_AUTH=sk-alpha-0123456789abcdef stall_reader "$KS_URL" kjv-mini "$TMPD/stall" \
    --resume-on "$TMPD/resume"
browser admin
touch "$TMPD/resume"
wait "$STALL_PID" || fail "the held request's client failed: $(tail -c 300 "$TMPD/stall")"
browser check
stop_server
echo "PASS"
