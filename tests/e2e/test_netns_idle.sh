#!/usr/bin/env bash
# An idle data link partitioned, on real network stacks (issue 40 section 3;
# tests/e2e/netns.sh): router, one prefill and two decode workers, each in
# its own network namespace. With no traffic, blackhole routes cut prefill
# p1 off from decode d1: nothing is sent, so nothing fails on its own; both
# ends must still find the link dead while the partition lasts (TCP
# keepalive under T_tcp, docs/pd-protocol.md section 8), so that d1 stops
# granting for a link that cannot carry KV. Three tenants' canary requests
# sent then are answered whole or refused clearly; after the heal the link
# comes back, every pool is FREE and scrubbed and the cluster answers
# exactly as before.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/netns.sh"
command -v node >/dev/null || skip "node is not installed"
ns_require
ns_tenants 3
M=(-m "$KS_SRC/models/kjv-mini.gguf" --ctx 512 --kv-pages 160 --threads 1)
ROUTER_ARGS="--tenants $TMPD/tenants.json" start_cluster_ns "$TMPD/c" "r1" "p1" "d1 d2" "${M[@]}"
ns_refs base
d1id=$(sed -n "s/.*decode worker \([0-9]*\) registered from ${NS_ADDR[d1]}:.*/\1/p" "$TMPD/c.r1" | tail -1)
n_pdown=$(grep -c "data link to decode worker $d1id down" "$TMPD/c.p1")
n_ddown=$(grep -c 'decode: link down' "$TMPD/c.d1"); n_up=$(grep -c 'decode: link up' "$TMPD/c.d1")
echo "partition p1 | d1 (idle link)"
ns_partition p1 d1
wait_for "p1 to find its idle link to d1 (worker $d1id) dead" \
    ns__more_lines "data link to decode worker $d1id down" "$n_pdown" "$TMPD/c.p1"
wait_for "d1 to find its idle link from p1 dead" ns__more_lines 'decode: link down' "$n_ddown" "$TMPD/c.d1"
grep -h "data link to decode worker $d1id down" "$TMPD/c.p1" | tail -1
grep -h 'decode: link down' "$TMPD/c.d1" | tail -1
ns_load_start during base
ns_load_wait during
ns_heal p1 d1
wait_for "the link to come back" ns__more_lines 'decode: link up' "$n_up" "$TMPD/c.d1"
ns_pools_clean "the idle partition"
ns_serving_again base
stop_cluster_ns
echo PASS
