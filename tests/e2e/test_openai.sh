#!/usr/bin/env bash
# The official openai npm client (streaming and not) against `kvseal serve`,
# in both majors package.json holds: 4.x ('openai') and 6.x ('openai6'),
# whose models.retrieve percent-encodes the slash of "@cf/kvseal/kjv-mini".
# curl: a model id with %2F (either case) in GET /v1/models/{id} and in
# Workers AI's run route answers as the literal slash does; a %2F anywhere
# else in a path is still refused (it would decode into another route).
. "$(dirname "$0")/lib.sh"
command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs it)"
JSD=$(dirname "$0")/js
[ -d "$JSD/node_modules/openai" ] && [ -d "$JSD/node_modules/openai6" ] ||
    skip "the openai npm packages (4.x and the openai6 alias) are not installed (scripts/install-deps.sh)"
echo '{"tenants":[{"name":"acme","keys":["sk-acme-test"],"max_concurrent":8,"tokens_per_minute":1000000}],"admin_key":"adm-test-0123456789"}' >"$TMPD/t.json"
start_server "$TMPD/server.log" --alias @cf/kvseal/kjv-mini --tenants "$TMPD/t.json"
for pkg in openai openai6; do
    KS_URL=$KS_URL KS_KEY=sk-acme-test KS_MODEL_NAME=@cf/kvseal/kjv-mini KS_OPENAI_PKG=$pkg \
        node "$JSD/openai_client.mjs" || fail "openai client checks failed ($pkg)"
done

A=(-H "Authorization: Bearer sk-acme-test")
for id in %40cf%2Fkvseal%2Fkjv-mini @cf%2fkvseal%2fkjv-mini @cf/kvseal/kjv-mini; do
    req "GET /v1/models/$id" 200 "${A[@]}" "$KS_URL/v1/models/$id"
    expect_eq "GET /v1/models/$id: its id" "$(jq -r .id <<<"$BODY")" "@cf/kvseal/kjv-mini"
done
req "GET /v1/models/org%2Fnope" 404 "${A[@]}" "$KS_URL/v1/models/org%2Fnope"
expect_has "unknown encoded id: named decoded" "$BODY" "The model 'org/nope' does not exist"
W='{"prompt":"In the beginning","max_tokens":3,"temperature":0}'
req "Workers AI run, literal slash" 200 "${A[@]}" "$KS_URL/accounts/acct/ai/run/@cf/kvseal/kjv-mini" -d "$W"
LIT=$(jq -c .result <<<"$BODY")
req "Workers AI run, %2F" 200 "${A[@]}" "$KS_URL/accounts/acct/ai/run/%40cf%2Fkvseal%2Fkjv-mini" -d "$W"
expect_eq "Workers AI run: %2F answers as the literal slash" "$(jq -c .result <<<"$BODY")" "$LIT"
# still refused where decoding would pick another route
req "%2F before the model id" 400 "${A[@]}" --path-as-is "$KS_URL/v1%2Fmodels/kjv-mini"
expect_has "%2F before the model id: invalid_path" "$BODY" '"invalid_path"'
req "%2F in the account" 400 "${A[@]}" "$KS_URL/accounts/a%2Fb/ai/run/@cf/kvseal/kjv-mini" -d "$W"
stop_server
echo "openai ok"
