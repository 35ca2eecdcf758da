#!/usr/bin/env bash
# test_https.sh — HTTPS on the front (--ssl-cert-file/--ssl-key-file) of
# `kvseal serve` and `kvseal router`, with a test CA and a certificate for
# 127.0.0.1 made here by the openssl CLI:
# - refused before the model loads (the model path given does not exist, so
#   any error but the TLS one would be the model's): one option without the
#   other, an unreadable file, a file with no certificate, a key that is not
#   the certificate's; and on a prefill worker (no HTTP API);
# - serve with TLS: the openai npm client (4.x and 6.x) trusting the CA
#   through NODE_EXTRA_CA_CERTS completes chats and streams; curl without
#   the CA fails verification (60); plain HTTP to the TLS port fails and the
#   server keeps serving;
# - the same through a cluster's router.
. "$(dirname "$0")/lib.sh"
command -v openssl >/dev/null || skip "the openssl CLI is not installed"
command -v curl >/dev/null || skip "curl is not installed (scripts/install-deps.sh)"
command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs it)"
JSD=$(dirname "$0")/js
[ -d "$JSD/node_modules/openai" ] && [ -d "$JSD/node_modules/openai6" ] ||
    skip "the openai npm packages are not installed (scripts/install-deps.sh)"

# ---- a test CA, a server certificate for 127.0.0.1 it signed, another key
D=$TMPD/pki
mkdir -p "$D"
EC=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
openssl req -x509 "${EC[@]}" -keyout "$D/ca.key" -out "$D/ca.pem" -days 2 \
    -subj /CN=kvseal-test-ca -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign 2>/dev/null || fail "openssl: the CA"
openssl req "${EC[@]}" -keyout "$D/srv.key" -out "$D/srv.csr" -subj /CN=127.0.0.1 2>/dev/null ||
    fail "openssl: the server key"
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$D/ext"
openssl x509 -req -in "$D/srv.csr" -CA "$D/ca.pem" -CAkey "$D/ca.key" -CAcreateserial \
    -out "$D/srv.pem" -days 2 -extfile "$D/ext" 2>/dev/null || fail "openssl: the server certificate"
openssl genpkey -algorithm ec -pkeyopt ec_paramgen_curve:P-256 -out "$D/other.key" 2>/dev/null ||
    fail "openssl: another key"

# ---- refusals, before the model loads
# refused ARGS... -- NEEDLE: kvseal ARGS exits 2 at once with NEEDLE on stderr
refused() {
    local args=() needle
    while [ "$1" != "--" ]; do args+=("$1"); shift; done
    needle=$2
    local rc=0
    "$KS_BIN" "${args[@]}" -m "$TMPD/no-such-model.gguf" >/dev/null 2>"$TMPD/err" || rc=$?
    [ $rc -eq 2 ] || fail "kvseal ${args[*]}: exit $rc, want 2 ($(cat "$TMPD/err"))"
    expect_has "kvseal ${args[*]}" "$(cat "$TMPD/err")" "$needle"
}
refused serve --ssl-cert-file "$D/srv.pem" -- "--ssl-cert-file needs --ssl-key-file too"
refused serve --ssl-key-file "$D/srv.key" -- "--ssl-key-file needs --ssl-cert-file too"
refused serve --ssl-cert-file "$D/nope.pem" --ssl-key-file "$D/srv.key" -- \
    "--ssl-cert-file '$D/nope.pem': No such file or directory"
refused serve --ssl-cert-file "$D/srv.pem" --ssl-key-file "$D/nope.key" -- \
    "--ssl-key-file '$D/nope.key': No such file or directory"
refused serve --ssl-cert-file "$D/srv.key" --ssl-key-file "$D/srv.key" -- \
    "--ssl-cert-file '$D/srv.key': no PEM certificate in it"
refused serve --ssl-cert-file "$D/srv.pem" --ssl-key-file "$D/srv.pem" -- \
    "--ssl-key-file '$D/srv.pem': no PEM private key in it"
refused serve --ssl-cert-file "$D/srv.pem" --ssl-key-file "$D/other.key" -- \
    "--ssl-key-file '$D/other.key' is not the private key of the certificate in --ssl-cert-file '$D/srv.pem'"
refused router --secret-file /dev/null --ssl-cert-file "$D/srv.pem" --ssl-key-file "$D/other.key" -- \
    "is not the private key of the certificate"
refused prefill --router 127.0.0.1:1 --secret-file /dev/null --ssl-cert-file "$D/srv.pem" \
    --ssl-key-file "$D/srv.key" -- "--ssl-cert-file/--ssl-key-file are kvseal serve's and router's"

# ---- checks ORIGIN NAME: the openai clients over TLS, curl without the CA,
# plain HTTP to the TLS port, and the server still serving
check_tls() {
    local what=$1
    case "$KS_URL" in https://127.0.0.1:*) ;; *) fail "$what: URL $KS_URL is not https" ;; esac
    local pkg
    for pkg in openai openai6; do
        NODE_EXTRA_CA_CERTS=$D/ca.pem KS_URL=$KS_URL KS_KEY=sk-tls-test KS_MODEL_NAME=kjv-mini \
            KS_OPENAI_PKG=$pkg node "$JSD/openai_client.mjs" || fail "$what: openai client over TLS ($pkg)"
    done
    local rc=0
    env -u CURL_CA_BUNDLE curl -sS -o /dev/null "$KS_URL/health" 2>"$TMPD/curl.err" || rc=$?
    [ $rc -eq 60 ] || fail "$what: curl without the CA: exit $rc, want 60 ($(cat "$TMPD/curl.err"))"
    rc=0
    curl -sS -o /dev/null "http://${KS_URL#https://}/health" 2>/dev/null || rc=$?
    [ $rc -ne 0 ] || fail "$what: plain HTTP to the TLS port was answered"
    req "$what: still serving after plain HTTP" 200 -H "Authorization: Bearer sk-tls-test" \
        -H "Content-Type: application/json" "$KS_URL/v1/completions" \
        -d '{"model":"kjv-mini","prompt":"In the beginning","max_tokens":4,"temperature":0}'
}
export CURL_CA_BUNDLE=$D/ca.pem # lib.sh's curl calls trust the test CA
TLS=(--ssl-cert-file "$D/srv.pem" --ssl-key-file "$D/srv.key")
echo '{"tenants":[{"name":"acme","keys":["sk-tls-test"]}]}' >"$TMPD/t.json"
start_server "$TMPD/server.log" --tenants "$TMPD/t.json" "${TLS[@]}"
check_tls serve
stop_server

# ---- the same through a cluster's router (workers talk to it over the cluster link)
KS_SERVER_LOG=
CLUSTER_PROBE_AUTH=sk-tls-test ROUTER_ARGS="--tenants $TMPD/t.json ${TLS[*]}" \
    start_cluster "$TMPD/c" 1 1
check_tls router
stop_cluster
echo "https ok"
