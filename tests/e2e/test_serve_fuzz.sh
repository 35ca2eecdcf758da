#!/usr/bin/env bash
# Bad and random input on every generation route (js/fuzz.mjs): every reply
# is well-formed JSON with the right error shape, no 500s, and the server
# still answers correctly afterwards. Under the sanitizer build this is also
# a memory- and UB-safety check of the request path.
. "$(dirname "$0")/lib.sh"
command -v node >/dev/null || skip "node is not installed"
start_server "$TMPD/server.log" --alias kjv-mini
KS_URL=$KS_URL node "$(dirname "$0")/js/fuzz.mjs" || { tail -20 "$TMPD/server.log" >&2; fail "fuzz failures"; }
stop_server
grep -E "AddressSanitizer|runtime error" "$TMPD/server.log" && fail "sanitizer report"
echo "fuzz ok"
