#!/usr/bin/env bash
# netns_proxy_run.sh — latency, cut connections and a swallowing middlebox between prefill and
# decode, on real network stacks (issue 40 section 3; tests/e2e/netns.sh):
# router, prefill, decode and a userspace TCP proxy (build/netns_proxy), each
# in its own network namespace; the decode worker advertises the proxy's
# address, so every data link crosses it. Three tenants send long canary
# prompts (the prefill link capped with tbf, so KV is in flight):
#  1. 25 ms each way: everything is answered whole, as without the proxy;
#  2. the proxy resets every connection in the middle of a KV transfer
#     (decode holds part of a page): requests end whole or
#     refused clearly, the link comes back;
#  3. the proxy swallows everything mid-transfer (connections stay open and
#     acknowledged, nothing arrives): decode's own timers must end it
#     (T_xfer, then T_ack tears the link down), and new data links through
#     the proxy must not hang (T_handshake); then the proxy forwards again.
# Each ends with no tenant's canary in another's answer, every pool FREE and
# scrubbed, and the cluster answering exactly as before.
# NS_PHASES picks the phases ("1 2 3" by default): test_netns_proxy.sh runs
# 1 and 2, test_netns_proxy_hole.sh 3, so each stays short.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/netns.sh"
command -v node >/dev/null || skip "node is not installed"
PROXY=${KS_BUILD:-$KS_SRC/build}/netns_proxy
[ -x "$PROXY" ] || fail "netns_proxy not built at $PROXY"
ns_require
ns_tenants 3
DPORT=7443  # each namespace has its own ports: a fixed one cannot collide
ns_node x1; ns_node d1
ns_exec x1 "$PROXY" "${NS_ADDR[x1]}" $DPORT "${NS_ADDR[d1]}" $DPORT 25 >"$TMPD/proxy.out" 2>&1 &
PX=$!
wait_for "the proxy to listen" grep -q '^proxy listening' "$TMPD/proxy.out"
M=(-m "$KS_SRC/models/kjv-mini.gguf" --ctx 512 --kv-pages 160 --threads 1)
NS_ARGS[d1]="--data-port $DPORT"; NS_ADVERTISE[d1]=${NS_ADDR[x1]}
NS_ARGS[p1]="--kv-pages 600"
ROUTER_ARGS="--tenants $TMPD/tenants.json" DECODE_ARGS="--log-level debug" \
    start_cluster_ns "$TMPD/c" "r1" "p1" "d1" "${M[@]}"
grep -q "data link to decode worker [0-9]* (${NS_ADDR[x1]}:$DPORT) up" "$TMPD/c.p1" ||
    fail "prefill's data link does not go through the proxy: $(grep 'data link' "$TMPD/c.p1")"

NS_PHASES=${NS_PHASES:-1 2 3}
ns_refs base
# 1. latency
if [[ " $NS_PHASES " == *" 1 "* ]]; then
NS_COPIES=2 ns_load_start delay base
ns_load_wait delay
expect_eq "requests refused with 25 ms latency" "$NS_REFUSED" 0
ns_pools_clean "latency"
fi

ns_rate p1 16mbit
# 2. cut mid-transfer
if [[ " $NS_PHASES " == *" 2 "* ]]; then
n_first=$(grep -c 'first KV page from' "$TMPD/c.d1"); n_up=$(grep -c 'decode: link up' "$TMPD/c.d1")
NS_COPIES=2 ns_load_start cut base
wait_for "a KV transfer to start" ns__more_lines 'first KV page from' "$n_first" "$TMPD/c.d1"
kill -USR1 $PX
wait_for "the proxy to cut" grep -q '^proxy: cut' "$TMPD/proxy.out"
ns_load_wait cut
[ "$NS_REFUSED" -gt 0 ] || fail "the cut hit no request in flight"
wait_for "the data link to come back through the proxy" ns__more_lines 'decode: link up' "$n_up" "$TMPD/c.d1"
ns_pools_clean "the cut"
ns_serving_again base
fi

# 3. black hole mid-transfer
if [[ " $NS_PHASES " == *" 3 "* ]]; then
n_first=$(grep -c 'first KV page from' "$TMPD/c.d1"); n_up=$(grep -c 'decode: link up' "$TMPD/c.d1")
n_down=$(grep -c 'decode: link down' "$TMPD/c.d1")
NS_COPIES=2 ns_load_start hole base
wait_for "a KV transfer to start" ns__more_lines 'first KV page from' "$n_first" "$TMPD/c.d1"
kill -USR2 $PX
wait_for "the black hole" grep -q '^proxy: black hole on' "$TMPD/proxy.out"
wait_for "decode to give up on the swallowed link" ns__more_lines 'decode: link down' "$n_down" "$TMPD/c.d1"
# requests that wait for the link (no grant without one) wait in the
# router's queue: the load ends once the proxy forwards again
kill -USR2 $PX
wait_for "the proxy to forward again" grep -q '^proxy: black hole off' "$TMPD/proxy.out"
ns_load_wait hole
[ "$NS_REFUSED" -gt 0 ] || fail "the black hole swallowed no request in flight"
wait_for "the data link to come back through the proxy" ns__more_lines 'decode: link up' "$n_up" "$TMPD/c.d1"
grep -h 'torn down\|decode: link down' "$TMPD/c.d1" | tail -2
ns_pools_clean "the black hole"
ns_serving_again base
fi
ns_rate p1 off
stop_cluster_ns
kill $PX 2>/dev/null
echo PASS
