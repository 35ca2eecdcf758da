#!/usr/bin/env bash
# I7, operator side: tenants share cached prompt prefixes only when the
# tenants file puts them in the same "prefix_share" group. Tenants a and b
# share group "docs"; c does not. After a sends a document, b's first
# request reuses a's pages (cached_tokens > 0) with the same output, while
# c's first request reuses nothing.
. "$(dirname "$0")/lib.sh"
command -v curl >/dev/null && command -v node >/dev/null || skip "curl or node is not installed"
cat >"$TMPD/t.json" <<'JSON'
{"tenants":[
  {"name":"a","keys":["sk-a"],"prefix_share":"docs"},
  {"name":"b","keys":["sk-b"],"prefix_share":"docs"},
  {"name":"c","keys":["sk-c"]}]}
JSON
start_server "$TMPD/server.log" --tenants "$TMPD/t.json"
doc='Hear, O Israel: The LORD our God is one LORD: And thou shalt love the LORD thy God with all thine heart, and with all thy soul, and with all thy might.'
ask() {  # ask KEY -> "cached_tokens|text"
    curl -fsS "$KS_URL/v1/completions" -H "authorization: Bearer $1" -H 'content-type: application/json' \
        -d "{\"model\":\"kjv-mini\",\"prompt\":\"$doc\",\"max_tokens\":8,\"temperature\":0}" |
        node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const j=JSON.parse(s);
          console.log(((j.usage.prompt_tokens_details||{}).cached_tokens||0)+"|"+j.choices[0].text)})'
}
ra=$(ask sk-a); rb=$(ask sk-b); rc=$(ask sk-c)
expect_eq "a cold" "${ra%%|*}" 0
[ "${rb%%|*}" -gt 0 ] || fail "b (same group) did not reuse a's prefix: $rb"
expect_eq "c (no group)" "${rc%%|*}" 0
expect_eq "same output" "${rb#*|}" "${ra#*|}"
expect_eq "same output c" "${rc#*|}" "${ra#*|}"
stop_server
echo "prefix share ok"
