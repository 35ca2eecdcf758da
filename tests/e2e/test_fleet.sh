#!/usr/bin/env bash
# The fleet (issue 40, "Done means"), every node in its own network namespace
# on a bridge (tests/e2e/netns.sh): two models (two `kvseal mkmodel` files,
# seeds 11 and 12: their greedy answers differ) behind two routers that both
# carry the catalog (-m alpha.gguf --alias alpha -m beta.gguf,beta); per model two
# prefill and two decode workers (8 workers), each registered with both
# routers. Three tenants send canary prompts to both models through both
# routers (js/netns_load.mjs with NS_MODELS / NS_URLS), the prefill links
# capped (tbf) so that KV is in flight when each fault strikes:
#  A. a prefill worker's link down mid-transfer (its veth: no carrier), up
#     again once both routers dropped it: every request answered whole
#     (re-placed) or refused clearly;
#  B. decode worker da1 cut off from both routers but not from prefill
#     (blackhole routes): the routers drop it, it gives up on them and ends
#     their requests (the clients are told the worker was lost);
#  C. kill -9 of router r2: its clients see their connections drop (nothing
#     that looks finished, never a short 200), r1's clients see nothing
#     (every one of their requests whole), every decode worker ends r2's
#     requests; r2 restarted on its cluster port gets every worker back.
# Each ends clean: every accepted request answered whole (equal to its
# reference) or refused clearly, no tenant's canary in any answer, every
# pool FREE and scrubbed (/admin/kv/check on each router), and both models
# answering exactly as before through both routers.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/netns.sh"
command -v node >/dev/null || skip "node is not installed"
command -v jq >/dev/null || skip "jq is not installed"
ns_require
ns_tenants 3
MK=(mkmodel --vocab "$KS_SRC/models/kjv-mini.gguf" --shape tiny)
"$KS_BIN" "${MK[@]}" --seed 11 -o "$TMPD/alpha.gguf" >/dev/null 2>&1 || fail "mkmodel alpha"
"$KS_BIN" "${MK[@]}" --seed 12 -o "$TMPD/beta.gguf" >/dev/null 2>&1 || fail "mkmodel beta"
W=(--ctx 512 --kv-pages 160 --threads 1)
NS_ARGS[r1]="-m $TMPD/alpha.gguf --alias alpha -m $TMPD/beta.gguf,beta"
NS_ARGS[r2]=${NS_ARGS[r1]}
for n in pa1 pa2 da1 da2; do NS_ARGS[$n]="-m $TMPD/alpha.gguf --alias alpha"; done
for n in pb1 pb2 db1 db2; do NS_ARGS[$n]="-m $TMPD/beta.gguf --alias beta"; done
PREFILLS="pa1 pa2 pb1 pb2" DECODES="da1 da2 db1 db2"
export CLUSTER_PROBE_MODEL=alpha
ROUTER_ARGS="--tenants $TMPD/tenants.json" DECODE_ARGS="--log-level debug" \
    start_cluster_ns "$TMPD/c" "r1 r2" "$PREFILLS" "$DECODES" "${W[@]}"
t0=$SECONDS
for n in $PREFILLS $DECODES; do
    [ "$(grep -c 'registered with router' "${NS_LOG[$n]}")" -ge 2 ] || fail "$n: not registered with both routers"
done
# beta answers through each router too (the probe asked alpha)
beta_up() { KS_URL=$1 CLUSTER_PROBE_MODEL=beta cluster__probe; }
for u in "${KS_ROUTER_URLS[@]}"; do wait_for "beta to answer at $u" beta_up "$u"; done
fleet_urls() { NS_URLS=$(IFS=,; echo "${KS_ROUTER_URLS[*]}"); export NS_URLS; }
fleet_urls
export NS_MODELS=alpha,beta
DLOGS=(); for n in $DECODES; do DLOGS+=("${NS_LOG[$n]}"); done

# fleet_clean WHAT — every pool FREE and scrubbed, seen from each router
fleet_clean() {
    local u
    for u in "${KS_ROUTER_URLS[@]}"; do KS_URL=$u ns_pools_clean "$1 (router $u)"; done
}
# regs NODE — registrations logged by router NODE
regs() { grep -c 'worker [0-9]* registered' "${NS_LOG[$1]}"; }
regs_ge() { [ "$(regs "$1")" -ge "$2" ]; }
count() { cat "${@:2}" | grep -c -- "$1"; }
caps() { local n; for n in $PREFILLS; do ns_rate "$n" "$1"; done; }

# references: each prompt alone, both models, both routers (which must agree)
ns_refs base
a=$(jq -r '."tenant0/alpha/0"' "$TMPD/base.ref") b=$(jq -r '."tenant0/beta/0"' "$TMPD/base.ref")
[ -n "$a" ] && [ "$a" != "$b" ] || fail "alpha and beta must answer differently: [$a] [$b]"
caps 4mbit

# A. a prefill worker's link down mid-transfer, then up
r1a=$(regs r1) r2a=$(regs r2)
n_first=$(count 'first KV page from' "${DLOGS[@]}")
NS_COPIES=2 ns_load_start a base
wait_for "a KV transfer of the load to start" ns__more_lines 'first KV page from' "$n_first" "${DLOGS[@]}"
addr=$(grep -h 'first KV page from' "${DLOGS[@]}" | sort | tail -1 | sed 's/.*first KV page from \([0-9.]*\):.*/\1/')
victim=$(ns_node_of_addr "$addr") || fail "no node has the address $addr"
echo "A: link down: $victim ($addr) mid-transfer"
ns_link "$victim" down
wait_for "r1 to drop $victim" grep -q 'prefill worker [0-9]* lost' "${NS_LOG[r1]}"
wait_for "r2 to drop $victim" grep -q 'prefill worker [0-9]* lost' "${NS_LOG[r2]}"
ns_link "$victim" up
ns_load_wait a
[ "$NS_WHOLE" -gt 0 ] || fail "A: no request was answered at all"
grep -q 'placing it on another prefill worker' "${NS_LOG[r1]}" "${NS_LOG[r2]}" || [ "$NS_REFUSED" -gt 0 ] ||
    fail "A: the link went down with no request in flight on $victim (nothing was re-placed or refused)"
wait_for "$victim to register again with r1" regs_ge r1 $((r1a + 1))
wait_for "$victim to register again with r2" regs_ge r2 $((r2a + 1))
fleet_clean "A: $victim's link down and up"
ns_serving_again base
echo "A: done at $((SECONDS - t0)) s"

# B. decode worker da1 cut off from both routers, not from prefill
r1b=$(regs r1) r2b=$(regs r2)
n_first=$(count 'first KV page from' "${NS_LOG[da1]}")
n_lost=$(count 'lost; aborting its' "${NS_LOG[da1]}")
n_r1=$(count 'decode worker [0-9]* lost' "${NS_LOG[r1]}") n_r2=$(count 'decode worker [0-9]* lost' "${NS_LOG[r2]}")
NS_COPIES=2 ns_load_start b base
wait_for "a KV transfer of the load to da1" ns__more_lines 'first KV page from' "$n_first" "${NS_LOG[da1]}"
echo "B: partition da1 | r1, r2"
ns_partition da1 r1; ns_partition da1 r2
wait_for "r1 to drop da1" ns__more_lines 'decode worker [0-9]* lost' "$n_r1" "${NS_LOG[r1]}"
wait_for "r2 to drop da1" ns__more_lines 'decode worker [0-9]* lost' "$n_r2" "${NS_LOG[r2]}"
wait_for "da1 to give up on both routers" ns__more_lines 'lost; aborting its' $((n_lost + 1)) "${NS_LOG[da1]}"
ns_heal da1 r1; ns_heal da1 r2
ns_load_wait b
grep -q 'decode worker serving this request was lost' "$TMPD/b.load" ||
    fail "B: no request was in flight on da1 when it was cut off (none ended with the worker lost)"
grep -h 'lost; aborting its' "${NS_LOG[da1]}" | tail -2
wait_for "da1 to register again with r1" regs_ge r1 $((r1b + 1))
wait_for "da1 to register again with r2" regs_ge r2 $((r2b + 1))
fleet_clean "B: da1 partitioned from the routers"
ns_serving_again base
echo "B: done at $((SECONDS - t0)) s"

# C. kill -9 of router r2 under load
n_first=$(count 'first KV page from' "${DLOGS[@]}")
r2addr=${KS_ROUTER_ADDRS[1]}
declare -A n_r2lost=()
for n in $DECODES; do n_r2lost[$n]=$(count "router $r2addr lost; aborting its" "${NS_LOG[$n]}"); done
NS_COPIES=1 NS_DROP_URL=${KS_ROUTER_URLS[1]} NS_WHOLE_ONLY=1 ns_load_start c base
wait_for "a KV transfer of the load to start" ns__more_lines 'first KV page from' "$n_first" "${DLOGS[@]}"
echo "C: kill -9 r2 ($r2addr)"
kill -KILL "${KS_ROUTER_PIDS[1]}"
wait "${KS_ROUTER_PIDS[1]}" 2>/dev/null
ns_load_wait c
dropped=$(sed -n 's/^load: .* refused, \([0-9]*\) dropped.*/\1/p' "$TMPD/c.load")
[ "${dropped:-0}" -gt 0 ] || fail "C: none of r2's requests was in flight when it was killed"
for n in $DECODES; do
    wait_for "$n to end r2's requests" ns__more_lines "router $r2addr lost; aborting its" "${n_r2lost[$n]}" "${NS_LOG[$n]}"
done
KS_URL=${KS_ROUTER_URLS[0]} ns_pools_clean "C: r2 killed (router r1)"
# r1's clients see nothing while r2 comes back either (fresh links: r2 is a
# new router identity, and each router has links of its own)
NS_URLS=${KS_ROUTER_URLS[0]} NS_COPIES=2 NS_WHOLE_ONLY=1 NS_STARTED=$TMPD/d.started ns_load_start d base
wait_for "r1's load to be sent" test -s "$TMPD/d.started"
n_dup=$(count 'has a live link the router has not retired' "${DLOGS[@]}")
ns_restart_router r2 "$TMPD/c.r2b"
wait_for "the 8 workers to register with the restarted r2" regs_ge r2 8
ns_load_wait d
KS_URL=${KS_ROUTER_URLS[1]} wait_for "the restarted r2 to answer alpha" cluster__probe
wait_for "the restarted r2 to answer beta" beta_up "${KS_ROUTER_URLS[1]}"
fleet_urls
fleet_clean "C: r2 restarted"
# the links r2's predecessor named are retired, never re-dialed under the new
# r2's identity (decode would refuse one of the two links it then gets for
# the same prefill worker, and a grant could name the one retired next)
dup=$(count 'has a live link the router has not retired' "${DLOGS[@]}")
[ "$dup" -eq "$n_dup" ] || fail "C: a prefill worker linked twice under the restarted r2: $(grep -h 'has a live link the router has not retired' "${DLOGS[@]}" | tail -1)"
ns_serving_again base
echo "C: done at $((SECONDS - t0)) s"
caps off
stop_cluster_ns
echo PASS
