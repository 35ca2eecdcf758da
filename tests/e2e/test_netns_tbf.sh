#!/usr/bin/env bash
# A bandwidth cap on a real network stack (issue 40 section 3;
# tests/e2e/netns.sh): router, prefill and decode each in its own network
# namespace, the prefill worker's egress capped with tc tbf. Three tenants
# send long canary prompts at once: every transfer must complete (every
# request answered whole, exactly as without the cap; none refused), no
# tenant's canary may appear in another's answer, the pools end FREE and
# scrubbed, and the KV rate decode measured (bytes of all handoffs over the
# span from the first KV page to the last commit) is below the cap.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/netns.sh"
command -v node >/dev/null || skip "node is not installed"
command -v tc >/dev/null || skip "tc (iproute2) is not installed"
ns_require
ns_tenants 3
CAP_MBIT=${NS_CAP_MBIT:-40}
M=(-m "$KS_SRC/models/kjv-mini.gguf" --ctx 512 --kv-pages 160 --threads 1)
# prefill's own pool holds every request at once: the cap, not its pool, is the limit
NS_ARGS[p1]="--kv-pages 600"
ROUTER_ARGS="--tenants $TMPD/tenants.json" DECODE_ARGS="--log-level debug" \
    start_cluster_ns "$TMPD/c" "r1" "p1" "d1" "${M[@]}"
ns_refs base
ns_rate p1 ${CAP_MBIT}mbit
from=$(grep -c 'KV handoff' "$TMPD/c.d1")
NS_COPIES=2 ns_load_start capped base
ns_load_wait capped
expect_eq "requests refused under the cap" "$NS_REFUSED" 0
# the rate: KV bytes of the capped handoffs over their span (log timestamps)
rate=$(awk -v from="$from" '
    function t(s) { split(substr(s, 12, 12), a, ":"); return a[1] * 3600 + a[2] * 60 + a[3] }
    /first KV page from/ { n1++; if (n1 > from && !t0) t0 = t($1) }
    /KV handoff:/ { n2++; if (n2 > from) { bytes += $9; t1 = t($1); k++ } }
    END { if (k && t1 > t0) printf "%d %d %.0f\n", k, bytes, bytes / (t1 - t0) }' "$TMPD/c.d1")
read -r n_xfer kv_bytes kv_rate <<<"$rate"
[ "${kv_rate:-0}" -gt 0 ] || fail "no KV rate measured (decode log: $(grep -c 'KV handoff' "$TMPD/c.d1") handoffs)"
cap=$((CAP_MBIT * 125000))
echo "KV rate under a ${CAP_MBIT} Mbit/s cap: $n_xfer transfers, $kv_bytes bytes, $kv_rate B/s ($(awk -v r="$kv_rate" -v c="$cap" 'BEGIN { printf "%.2f", r / c }') of the cap)"
[ "$kv_rate" -lt "$cap" ] || fail "KV moved at $kv_rate B/s, above the ${CAP_MBIT} Mbit/s cap ($cap B/s): the cap is not in the path"
ns_rate p1 off
ns_pools_clean "the capped transfers"
ns_serving_again base
stop_cluster_ns
echo PASS
