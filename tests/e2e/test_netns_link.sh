#!/usr/bin/env bash
# A link taken down mid-transfer, on real network stacks (issue 40 section 3;
# tests/e2e/netns.sh): router, two prefill and two decode workers, each in
# its own network namespace on a bridge. Three tenants send long canary
# prompts while the prefill workers' links are capped (tbf) so that KV takes
# a while to cross; once decode logs a KV page arriving from a prefill
# worker, that worker's link goes down (its veth on the bridge: the node
# loses carrier, its sockets see nothing), then up again once the router has
# dropped the worker. Every request must be answered whole (re-placed on the
# other prefill worker) or refused clearly, no tenant's canary may appear in
# another's answer, every pool ends FREE and scrubbed, the worker comes back
# and the cluster answers exactly as before.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/netns.sh"
command -v node >/dev/null || skip "node is not installed"
ns_require
ns_tenants 3
M=(-m "$KS_SRC/models/kjv-mini.gguf" --ctx 512 --kv-pages 160 --threads 1)
ROUTER_ARGS="--tenants $TMPD/tenants.json" DECODE_ARGS="--log-level debug" \
    start_cluster_ns "$TMPD/c" "r1" "p1 p2" "d1 d2" "${M[@]}"
ns_refs base
regs=$(ns_registered_count)
ns_rate p1 16mbit; ns_rate p2 16mbit
n_first=$(cat "$TMPD/c.d1" "$TMPD/c.d2" | grep -c 'first KV page from')
NS_COPIES=2 ns_load_start down base
wait_for "a KV transfer of the load to start" ns__more_lines 'first KV page from' "$n_first" "$TMPD/c.d1" "$TMPD/c.d2"
addr=$(grep -h 'first KV page from' "$TMPD/c.d1" "$TMPD/c.d2" | sort | tail -1 | sed 's/.*first KV page from \([0-9.]*\):.*/\1/')
victim=$(ns_node_of_addr "$addr") || fail "no node has the address $addr"
echo "link down: $victim ($addr) mid-transfer"
ns_link "$victim" down
wait_for "the router to drop $victim" grep -q 'prefill worker [0-9]* lost' "$TMPD/c.r1"
ns_link "$victim" up
ns_load_wait down
[ "$NS_WHOLE" -gt 0 ] || fail "no request was answered at all"
grep -q 'placing it on another prefill worker' "$TMPD/c.r1" || [ "$NS_REFUSED" -gt 0 ] ||
    fail "the link went down with no request in flight on $victim (nothing was re-placed or refused)"
ns_rate p1 off; ns_rate p2 off
wait_for "$victim to register again" ns_registered_ge $((regs + 1))
ns_pools_clean "the link came back"
ns_serving_again base
grep -h 'placing it on another prefill worker\|link down\|torn down' $KS_CLUSTER_LOGS | head -5
stop_cluster_ns
echo PASS
