#!/usr/bin/env bash
# netns_partition_run.sh — partitions on real network stacks (issue 40 section 3; tests/e2e/netns.sh):
# router, one prefill and two decode workers, each in its own network
# namespace; three tenants send long canary prompts while the prefill
# worker's link is capped (tbf) so that KV is in flight when the partition
# starts (decode has logged a KV page arriving). Blackhole routes on both
# sides drop every packet between two nodes, silently, as a real partition:
#  A. decode d1 cut off from the router but not from prefill: the router
#     drops d1 after missed health checks, d1 loses the router (T_router)
#     and aborts what it holds through the data link, which still works;
#  B. decode d2 cut off from prefill but not from the router: d2's
#     transfers stall (T_xfer, then T_ack tears the link down: F5), the
#     router fails or re-places them, prefill must keep serving d1 and see
#     the dead link itself while the partition lasts (a TCP timeout).
# Each ends with every request answered whole or refused clearly, no
# tenant's canary in another's answer, the partition healed, every pool FREE
# and scrubbed, and the cluster answering exactly as before.
# NS_PHASES picks the phases ("A B" by default): test_netns_partition_router.sh
# runs A, test_netns_partition_prefill.sh B, so each stays short.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/netns.sh"
command -v node >/dev/null || skip "node is not installed"
ns_require
ns_tenants 3
M=(-m "$KS_SRC/models/kjv-mini.gguf" --ctx 512 --kv-pages 160 --threads 1)
ROUTER_ARGS="--tenants $TMPD/tenants.json" DECODE_ARGS="--log-level debug" \
    start_cluster_ns "$TMPD/c" "r1" "p1" "d1 d2" "${M[@]}"
ns_refs base
ns_rate p1 16mbit

NS_PHASES=${NS_PHASES:-A B}
# A. d1 <-/-> router
if [[ " $NS_PHASES " == *" A "* ]]; then
regs=$(ns_registered_count)
n_first=$(grep -c 'first KV page from' "$TMPD/c.d1")
NS_COPIES=2 ns_load_start a base
wait_for "a KV transfer of the load to d1" ns__more_lines 'first KV page from' "$n_first" "$TMPD/c.d1"
echo "A: partition d1 | r1"
ns_partition d1 r1
wait_for "the router to drop d1" grep -q 'decode worker [0-9]* lost' "$TMPD/c.r1"
wait_for "d1 to give up on the router" grep -q 'decode: router [0-9.:]* lost' "$TMPD/c.d1"
ns_heal d1 r1
ns_load_wait a
grep -q 'decode worker serving this request was lost' "$TMPD/a.load" ||
    fail "A: no request was in flight on d1 when it was cut off (none ended with the worker lost)"
wait_for "d1 to register again" ns_registered_ge $((regs + 1))
grep -h 'lost; aborting\|decode worker [0-9]* lost' "$TMPD/c.d1" "$TMPD/c.r1"
ns_pools_clean "the partition of d1 from the router"
ns_serving_again base

fi

# B. d2 <-/-> p1
if [[ " $NS_PHASES " == *" B "* ]]; then
regs=$(ns_registered_count)
n_first=$(grep -c 'first KV page from' "$TMPD/c.d2")
NS_COPIES=2 ns_load_start b base
wait_for "a KV transfer to d2" ns__more_lines 'first KV page from' "$n_first" "$TMPD/c.d2"
echo "B: partition d2 | p1"
n_down=$(grep -c 'decode: link down' "$TMPD/c.d2"); n_up=$(grep -c 'decode: link up' "$TMPD/c.d2")
d2id=$(sed -n "s/.*decode worker \([0-9]*\) registered from ${NS_ADDR[d2]}:.*/\1/p" "$TMPD/c.r1" | tail -1)
n_pdown=$(grep -c "data link to decode worker $d2id down" "$TMPD/c.p1")
ns_partition d2 p1
wait_for "d2 to lose its link from p1" ns__more_lines 'decode: link down' "$n_down" "$TMPD/c.d2"
# and prefill must see it too while the partition lasts (the kernel alone
# would retransmit into the void for ~15 minutes, holding the transfers)
wait_for "p1 to see its link to d2 (worker $d2id) dead" \
    ns__more_lines "data link to decode worker $d2id down" "$n_pdown" "$TMPD/c.p1"
ns_heal d2 p1
ns_load_wait b
grep 'decode: link down' "$TMPD/c.d2" | tail -1 | grep -q ', [1-9][0-9]* request(s) ended' ||
    fail "B: no transfer was in flight from p1 to d2 when they were cut apart"
wait_for "p1's link to d2 to come back" ns__more_lines 'decode: link up' "$n_up" "$TMPD/c.d2"
grep -h 'torn down\|decode: link down' "$TMPD/c.d2" | tail -2
grep -h "data link to decode worker $d2id down" "$TMPD/c.p1" | tail -1
ns_pools_clean "the partition of d2 from p1"
ns_serving_again base
fi
ns_rate p1 off
stop_cluster_ns
echo PASS
