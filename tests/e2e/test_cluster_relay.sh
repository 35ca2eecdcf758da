#!/usr/bin/env bash
# The cluster handshake cannot be relayed (issue 8, section 1): a fake router
# without the secret (build/pd_relay) takes a real prefill worker's control
# connection (as if it squatted the router's port) and relays it to a real
# decode worker's data port, then tries to LINK as the live prefill worker.
# No link may come up from the relay, and the live link of the real prefill
# worker must stay untouched: same epoch, and the cluster keeps serving.
# Run twice: over TLS (the default), and with --insecure-plaintext, where the
# old handshake still lets the relay in but decode refuses its LINK.
. "$(dirname "$0")/lib.sh"
RELAY=${KS_BUILD:-$KS_SRC/build}/pd_relay
[ -x "$RELAY" ] || fail "pd_relay not built at $RELAY"
M=(-m "$KS_SRC/models/kjv-mini.gguf" --ctx 256 --kv-pages 64 --threads 1)
R=""; X=""

# relay_attack NAME EXTRA_ARGS... — a cluster (1 prefill, 1 decode) with the
# extra args on every node, the relay attack on it, and the checks
relay_attack() {
    local name=$1; shift
    start_cluster "$TMPD/$name" 1 1 "${M[@]}" "$@"
    trap 'kill -KILL $KS_PID "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}" $R $X 2>/dev/null; rm_tmpd' EXIT
    local dlog="$TMPD/$name.decode1" victim vrouter dport links_before epoch rport result i
    victim=$(sed -n 's/.*prefill worker \([0-9]*\) registered.*/\1/p' "$TMPD/$name.router" | head -1)
    dport=$(sed -n 's/.*decode worker [0-9]* registered.*:\([0-9]*\))$/\1/p' "$TMPD/$name.router" | head -1)
    vrouter=$(sed -n 's/.*registered with router .* as worker [0-9]* (router \([0-9a-f]*\)).*/\1/p' "$TMPD/$name.prefill1" | head -1)
    [ -n "$victim" ] && [ -n "$dport" ] && [ -n "$vrouter" ] || { cat "$TMPD/$name.router" >&2; fail "no prefill id / router id / decode data port"; }
    links_before=$(grep -c 'decode: link up' "$dlog")
    epoch=$(sed -n 's/.*decode: link up: prefill .* epoch \([0-9]*\).*/\1/p' "$dlog" | tail -1)
    expect_eq "$name: one live link" "$links_before" 1

    "$RELAY" "$dport" "$victim" "$vrouter" >"$TMPD/$name.relay" 2>&1 &
    R=$!
    wait_for "the relay to listen" grep -q '^relay port [0-9]' "$TMPD/$name.relay"
    rport=$(sed -n 's/^relay port \([0-9]*\)$/\1/p' "$TMPD/$name.relay")
    # a real prefill worker (the cluster's own secret) that takes the relay for its router
    "$KS_BIN" prefill "${M[@]}" "$@" --router 127.0.0.1:$rport --secret-file "$TMPD/secret" \
        >"$TMPD/$name.x.out" 2>"$TMPD/$name.x.log" &
    X=$!
    wait_for "the relay to report" grep -q '^RELAY:' "$TMPD/$name.relay"
    result=$(grep '^RELAY:' "$TMPD/$name.relay")
    echo "$name: relay result: ${result:-none}"
    [ -n "$result" ] || { cat "$TMPD/$name.relay" "$dlog" >&2; fail "$name: the relay reported nothing"; }
    case "$result" in
    *"link up"*) cat "$dlog" >&2; fail "$name: the relay got an authenticated data link: $result";;
    esac
    expect_eq "$name: links that came up at decode" "$(grep -c 'decode: link up' "$dlog")" "$links_before"
    if grep -q "re-linked\|link down: prefill $victim, epoch $epoch" "$dlog"; then
        cat "$dlog" >&2
        fail "$name: the live link (epoch $epoch) was replaced or closed"
    fi
    ans=$(curl -sS "$KS_URL/v1/completions" -H 'Content-Type: application/json' \
        -d '{"model":"kjv-mini","prompt":"In the beginning","max_tokens":6,"temperature":0}')
    expect_has "$name: the live link still serves" "$ans" '"text"'
    kill -KILL $R $X 2>/dev/null
    wait $R $X 2>/dev/null
    R=""; X=""
    stop_cluster
}

# TLS (the default): the relay can only pass ciphertext along, and decode has
# no key for a prefill->router connection: the handshake fails
relay_attack tls
expect_has "tls: decode saw a failed handshake" "$(cat "$TMPD/tls.decode1")" "auth failed: TLS handshake"
# --insecure-plaintext: the KVPD v1 handshake is relayed (a known weakness,
# docs/pd-protocol.md section 3), but decode refuses a LINK for a worker id
# that has a live link the router has not retired
relay_attack plain --insecure-plaintext
expect_has "plain: LINK refused" "$(cat "$TMPD/plain.decode1")" "LINK refused: prefill worker"
expect_has "plain: the mode is loud" "$(cat "$TMPD/plain.decode1")" "--insecure-plaintext: NO TLS"
echo PASS
