# netns.sh — cluster nodes on real network stacks (sourced after lib.sh).
#
# Each node (a router, a prefill or decode worker, a test proxy) runs in its
# own network namespace, attached by a veth pair to one bridge in the root
# namespace, with its own address on a /24 of its own; the test client stays
# in the root namespace and reaches the routers over the bridge (the bridge
# holds .1). No path between nodes uses loopback. Names carry the shell's
# pid, so tests run in parallel; everything (processes in the namespaces,
# namespaces, veths, bridge) is removed when the test exits, failed or not.
# Needs root, `ip netns`, veth and bridge support: else the test skips (77).
#
#   ns_require                        skip unless namespaces work here
#   ns_node NAME                      a namespace with an address: NS_ADDR[NAME],
#                                     NS_VETH[NAME] (the root-side end, for faults)
#   ns_exec NAME CMD...               runs CMD in NAME's namespace
#   start_cluster_ns LOG "ROUTERS" "PREFILLS" "DECODES" ARGS...
#                                     one node per name, lists of any length
#   stop_cluster_ns                   SIGTERM to all; every process must exit 0
#   ns_restart_router NAME LOG        a killed router again, on its cluster port
# Faults: ns_link NAME up|down, ns_partition A B / ns_heal A B (blackhole
# routes both ways), ns_rate NAME RATE / ns_rate NAME off (tbf on NAME's
# egress).
NS_TAG=k$$
NS_BR=${NS_TAG}br
declare -A NS_ADDR=() NS_VETH=() NS_NETNS=()
NS_NODES=()
NS_NET=

# ns_require — skips the test (77) with the reason when this machine cannot
# give it namespaces, veths and a bridge.
ns_require() {
    # fault timing on real stacks with up to ten nodes: the Release suite runs
    # them (as test_cluster_faults); the code paths they reach run under the
    # sanitizers in the cluster unit tests and the loopback cluster e2e tests
    [ -z "${KS_SANITIZE:-}" ] || skip "the netns tests run in the Release suite, not under $KS_SANITIZE"
    [ "$(id -u)" = 0 ] || skip "network namespaces need root (run the netns tests as root)"
    command -v ip >/dev/null || skip "iproute2 (ip) is not installed (scripts/install-deps.sh installs it)"
    ip netns add "${NS_TAG}probe" 2>/dev/null || skip "ip netns is not available here (no CAP_SYS_ADMIN or no netns support)"
    ip netns del "${NS_TAG}probe"
    ip link add "$NS_BR" type bridge 2>/dev/null || skip "cannot create a bridge (no bridge support in this kernel)"
    NS__CLEAN=1
    ip link set "$NS_BR" up
    ns__pick_net
    ip addr add "$NS_NET.1/24" dev "$NS_BR" || fail "cannot address the bridge $NS_BR"
}

# A /24 of 10.0.0.0/8 that no route of the root namespace covers yet (but
# the default one), derived from the pid so parallel tests differ.
ns__pick_net() {
    local n=$(( $$ & 0xffff )) i
    for i in $(seq 0 255); do
        local a=$(( ((n >> 8) + i) % 200 + 20 )) b=$(( n & 255 ))
        if ! ip -4 route show match "10.$a.$b.1" | grep -qv '^default'; then
            NS_NET=10.$a.$b
            return 0
        fi
    done
    fail "no free 10.x.y.0/24 for the bridge"
}

# ns_node NAME — a fresh namespace for node NAME, its veth on the bridge,
# address $NS_NET.(10 + its index), loopback up.
ns_node() {
    local name=$1 i=${#NS_NODES[@]}
    local netns="${NS_TAG}-$name" veth="${NS_TAG}v$i" addr="$NS_NET.$((10 + i))"
    ip netns add "$netns" || fail "ip netns add $netns"
    NS_NODES+=("$name"); NS_NETNS[$name]=$netns; NS_VETH[$name]=$veth; NS_ADDR[$name]=$addr
    ip link add "$veth" type veth peer name eth0 netns "$netns" || fail "veth for $name"
    ip link set "$veth" master "$NS_BR" up || fail "attaching $veth to $NS_BR"
    ip -n "$netns" addr add "$addr/24" dev eth0 || fail "address $addr for $name"
    ip -n "$netns" link set lo up
    ip -n "$netns" link set eth0 up
    # a new bridge port forwards at once without STP; say so if it does not
    wait_for "$veth to forward on $NS_BR" ns__forwarding "$veth"
}

ns__forwarding() { ! command -v bridge >/dev/null || bridge link show dev "$1" | grep -q 'state forwarding'; }

# ns_exec NAME CMD... — CMD in node NAME's namespace (exec: $! is CMD's pid).
ns_exec() {
    local n=$1; shift
    if [ "$BASHPID" != "$$" ]; then exec ip netns exec "${NS_NETNS[$n]}" "$@"; fi
    ip netns exec "${NS_NETNS[$n]}" "$@"
}

# ns_link NAME up|down — the node's link to the bridge (its root-side end:
# the node's eth0 stays configured and loses carrier, as with a pulled cable).
ns_link() { ip link set "${NS_VETH[$1]}" "$2" || fail "ip link set ${NS_VETH[$1]} $2"; }

# ns_partition A B / ns_heal A B — drop (or restore) every packet between
# nodes A and B, both ways (blackhole routes in each namespace: sends vanish
# silently, as on a partitioned network; no error reaches either socket).
ns_partition() {
    ip -n "${NS_NETNS[$1]}" route add blackhole "${NS_ADDR[$2]}/32" || fail "partition $1 -> $2"
    ip -n "${NS_NETNS[$2]}" route add blackhole "${NS_ADDR[$1]}/32" || fail "partition $2 -> $1"
}
ns_heal() {
    ip -n "${NS_NETNS[$1]}" route del blackhole "${NS_ADDR[$2]}/32" || fail "heal $1 -> $2"
    ip -n "${NS_NETNS[$2]}" route del blackhole "${NS_ADDR[$1]}/32" || fail "heal $2 -> $1"
}

# ns_rate NAME RATE|off — caps what node NAME sends at RATE (tc tbf on its
# eth0, e.g. 20mbit), or removes the cap.
ns_rate() {
    if [ "$2" = off ]; then
        ip netns exec "${NS_NETNS[$1]}" tc qdisc del dev eth0 root || fail "tc qdisc del on $1"
    else
        ip netns exec "${NS_NETNS[$1]}" tc qdisc add dev eth0 root tbf rate "$2" burst 32kb latency 2s ||
            fail "tc tbf $2 on $1"
    fi
}

# Teardown: every process left in a namespace, the namespaces (their veth
# ends go with them), the bridge. Runs from rm_tmpd, which every EXIT trap
# of lib.sh calls, so a trap that a later helper sets still cleans up.
ns_cleanup() {
    [ -n "${NS__CLEAN:-}" ] || return 0
    local n p
    for n in "${NS_NODES[@]}"; do
        for p in $(ip netns pids "${NS_NETNS[$n]}" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    done
    for n in "${NS_NODES[@]}"; do
        ip netns del "${NS_NETNS[$n]}" 2>/dev/null
    done
    ip link del "$NS_BR" 2>/dev/null
    NS__CLEAN=
}
eval "$(declare -f rm_tmpd | sed '1s/^rm_tmpd/ns__rm_tmpd_lib/')"
rm_tmpd() { ns_cleanup; ns__rm_tmpd_lib; }

# ns__router_opts — the options that point a worker at the routers (every
# router of the cluster; KS_ROUTER_ADDRS holds their HOST:PORT).
ns__router_opts() {
    local a
    for a in "${KS_ROUTER_ADDRS[@]}"; do printf -- '--router\n%s\n' "$a"; done
}

# start_cluster_ns LOG "ROUTERS" "PREFILLS" "DECODES" ARGS... — like
# start_cluster (lib.sh), with one node per name in each list (a name that
# ns_node has not made yet is made now). ARGS go to every process,
# NS_ARGS[name] to that node's only (another model, another port),
# NS_ADVERTISE[name] replaces a decode node's own address as the one it
# advertises to prefill (a proxy's, say), and
# $ROUTER_ARGS / $PREFILL_ARGS / $DECODE_ARGS / $PREFILL_ENV / $DECODE_ENV as
# in start_cluster. Every listener binds its node's own address, never
# loopback. Sets KS_URL / KS_PID (the first router), KS_ROUTER_URLS,
# KS_ROUTER_PIDS, KS_ROUTER_ADDRS (cluster HOST:PORT), KS_PREFILL_PIDS,
# KS_DECODE_PIDS, KS_CLUSTER_LOGS, and NS_LOG[name] (each node's log).
declare -A NS_ARGS=() NS_LOG=() NS_ADVERTISE=()
start_cluster_ns() {
    local log=$1 routers=$2 prefills=$3 decodes=$4; shift 4
    local n bin=${KS_SERVE_BIN:-$KS_BIN} cport nw=0
    for n in $routers $prefills $decodes; do [ -n "${NS_NETNS[$n]:-}" ] || ns_node "$n"; done
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMPD/secret"
    chmod 600 "$TMPD/secret"
    KS_ROUTER_URLS=(); KS_ROUTER_PIDS=(); KS_ROUTER_ADDRS=(); KS_PREFILL_PIDS=(); KS_DECODE_PIDS=()
    KS_CLUSTER_LOGS=
    trap 'kill -KILL "${KS_ROUTER_PIDS[@]}" "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}" 2>/dev/null; rm_tmpd' EXIT
    NS__ROUTERS=($routers); NS__RARGS=("$@"); NS__ROUTER_ARGS=${ROUTER_ARGS:-}
    for n in $routers; do
        ns__start_router "$n" "$log.$n" 0
        cport=$(sed -n 's/^cluster port \([0-9]*\).*/\1/p' "$log.$n.out" | head -1)
        KS_ROUTER_PIDS+=($KS_PID); KS_ROUTER_URLS+=("$KS_URL"); KS_ROUTER_ADDRS+=("${NS_ADDR[$n]}:$cport")
    done
    KS_PID=${KS_ROUTER_PIDS[0]}; KS_URL=${KS_ROUTER_URLS[0]}; KS_ROUTER_LOG=$log.${routers%% *}
    local ropts
    mapfile -t ropts < <(ns__router_opts)
    for n in $decodes; do
        NS_LOG[$n]=$log.$n
        ns_exec "$n" env ${DECODE_ENV:-} "$bin" decode "${ropts[@]}" --secret-file "$TMPD/secret" \
            --data-host "${NS_ADDR[$n]}" --advertise-host "${NS_ADVERTISE[$n]:-${NS_ADDR[$n]}}" \
            --drain-timeout-ms $((KS_WAIT_S * 10000)) $KS_SLOW_GRAMMAR "$@" ${DECODE_ARGS:-} \
            ${NS_ARGS[$n]:-} >"$log.$n.out" 2>"$log.$n" &
        KS_DECODE_PIDS+=($!); KS_CLUSTER_LOGS+=" $log.$n"; nw=$((nw + 1))
    done
    for n in $prefills; do
        NS_LOG[$n]=$log.$n
        ns_exec "$n" env ${PREFILL_ENV:-} "$bin" prefill "${ropts[@]}" --secret-file "$TMPD/secret" \
            --drain-timeout-ms $((KS_WAIT_S * 10000)) $KS_SLOW_GRAMMAR "$@" ${PREFILL_ARGS:-} \
            ${NS_ARGS[$n]:-} >"$log.$n.out" 2>"$log.$n" &
        KS_PREFILL_PIDS+=($!); KS_CLUSTER_LOGS+=" $log.$n"; nw=$((nw + 1))
    done
    KS_CLUSTER_WANT=$nw
    for n in $routers; do
        KS_ROUTER_LOG=$log.$n
        wait_for "$nw workers to register at router $n (logs: $KS_CLUSTER_LOGS)" cluster__registered
    done
    KS_ROUTER_LOG=$log.${routers%% *}
    local u
    for u in "${KS_ROUTER_URLS[@]}"; do
        KS_URL=$u wait_for "the cluster to answer a probe request at $u" cluster__probe
    done
}

# ns__start_router NAME LOG CPORT — router NAME in its namespace with
# start_cluster_ns's options (its ARGS and $ROUTER_ARGS), on cluster port CPORT (0: any); waits for it
# to listen (KS_PID, KS_URL, KS_ROUTER_LOG are then its own).
ns__start_router() {
    local n=$1 l=$2 cp=$3
    NS_LOG[$n]=$l
    ns_exec "$n" "${KS_SERVE_BIN:-$KS_BIN}" router --host "${NS_ADDR[$n]}" --port 0 \
        --cluster-host "${NS_ADDR[$n]}" --cluster-port "$cp" $KS_SLOW_LIMITS \
        ${KS_METRICS_KEY:+--metrics-key "$KS_METRICS_KEY"} --secret-file "$TMPD/secret" \
        --health-interval-ms ${KS_HEALTH_MS:-$([ -n "${KS_SANITIZE:-}" ] && echo 2000 || echo 1000)} \
        $NS__ROUTER_ARGS "${NS__RARGS[@]}" ${NS_ARGS[$n]:-} >"$l.out" 2>"$l" &
    KS_PID=$!
    KS_CLUSTER_LOGS+=" $l"
    KS_ROUTER_LOG=$l
    wait_for "router $n to come up" cluster__router_up
}

# ns_restart_router NAME LOG — router NAME (of start_cluster_ns, killed by
# the test) started again in its namespace with the same options and its
# old cluster port (the workers' --router lists name it), a new HTTP port,
# its log in LOG; its entries of KS_ROUTER_PIDS / KS_ROUTER_URLS (and
# KS_URL / KS_PID when it is the first) become the new process's.
ns_restart_router() {
    local n=$1 i k=-1 u=$KS_URL p=$KS_PID rl=$KS_ROUTER_LOG
    for i in "${!NS__ROUTERS[@]}"; do [ "${NS__ROUTERS[$i]}" = "$n" ] && k=$i; done
    [ $k -ge 0 ] || fail "ns_restart_router: $n is not a router of this cluster"
    ns__start_router "$n" "$2" "${KS_ROUTER_ADDRS[$k]##*:}"
    KS_ROUTER_PIDS[$k]=$KS_PID; KS_ROUTER_URLS[$k]=$KS_URL
    if [ $k -gt 0 ]; then KS_URL=$u; KS_PID=$p; KS_ROUTER_LOG=$rl; fi
}

# stop_cluster_ns — stop_cluster (lib.sh) for every router.
stop_cluster_ns() {
    local first=$KS_PID p
    for p in "${KS_ROUTER_PIDS[@]}"; do
        [ "$p" = "$first" ] || KS_PREFILL_PIDS+=("$p")  # the others exit like workers
    done
    stop_cluster
}

# ---------------------------------------------------------------------------
# Canary traffic and the end-of-fault checks (js/netns_load.mjs).

# ns_tenants N — a tenants file ($TMPD/tenants.json) with N tenants and an
# admin key; sets NS_TENANTS (for netns_load.mjs), NS_ADMIN_KEY and
# CLUSTER_PROBE_AUTH. Pass `--tenants $TMPD/tenants.json` to the routers.
ns_tenants() {
    local i t='[' j='['
    for i in $(seq 0 $(($1 - 1))); do
        local key="sk-ns-$i-$RANDOM$RANDOM$RANDOM"
        t+="$([ $i -gt 0 ] && echo ,){\"name\":\"tenant$i\",\"keys\":[\"$key\"],\"max_concurrent\":64,\"tokens_per_minute\":100000000}"
        j+="$([ $i -gt 0 ] && echo ,){\"name\":\"tenant$i\",\"key\":\"$key\"}"
        [ $i -gt 0 ] || CLUSTER_PROBE_AUTH=$key
    done
    NS_ADMIN_KEY="adm-ns-$RANDOM$RANDOM$RANDOM"
    echo "{\"tenants\":$t],\"admin_key\":\"$NS_ADMIN_KEY\"}" >"$TMPD/tenants.json"
    NS_TENANTS="$j]"
}

# ns_refs NAME — every canary prompt alone, answers to $TMPD/NAME.ref; with
# NS_REF_CHECK=FILE they must equal FILE's (the cluster serves as before).
ns_refs() {
    KS_URL=$KS_URL NS_TENANTS=$NS_TENANTS NS_MODE=ref NS_REF="$TMPD/$1.ref" \
        node "$KS_SRC/tests/e2e/js/netns_load.mjs" >"$TMPD/$1.reflog" 2>&1 ||
        { cat "$TMPD/$1.reflog" >&2; fail "references ($1)"; }
}

# ns_load_start NAME REF — all canary prompts at once in the background
# (NS_LOAD_PID; NS_COPIES times each), judged against ns_refs REF's answers.
ns_load_start() {
    KS_URL=$KS_URL NS_TENANTS=$NS_TENANTS NS_MODE=load NS_REF="$TMPD/$2.ref" \
        node "$KS_SRC/tests/e2e/js/netns_load.mjs" >"$TMPD/$1.load" 2>&1 &
    NS_LOAD_PID=$!
}

# ns_load_wait NAME — waits for the load to end; fails on any violation
# (a short or wrong answer, an unclear refusal, a foreign canary, a link
# loss reported as a failed verification). Prints
# the summary and sets NS_WHOLE / NS_REFUSED.
ns_load_wait() {
    wait_for "the canary load ($1) to end" proc_gone "$NS_LOAD_PID"
    wait "$NS_LOAD_PID"
    local rc=$?
    grep -E '^(load:|refused|NETNS)' "$TMPD/$1.load" | head -20
    [ $rc -eq 0 ] || { cat "$TMPD/$1.load" >&2; fail "$1: the canary load found a violation"; }
    # these faults lose connections, they never alter bytes (TLS would see
    # it): a request that fails "verification" had a lost link misreported
    ! grep -q 'failed verification' "$TMPD/$1.load" ||
        fail "$1: a lost connection was reported as a failed KV verification: $(grep 'failed verification' "$TMPD/$1.load" | head -1)"
    NS_WHOLE=$(sed -n 's/^load: \([0-9]*\) whole.*/\1/p' "$TMPD/$1.load")
    NS_REFUSED=$(sed -n 's/^load: [0-9]* whole, \([0-9]*\) refused.*/\1/p' "$TMPD/$1.load")
}

# ns_pools_clean WHAT — every worker's pool FREE and scrubbed, nothing in
# flight (/admin/kv/check of the first router, waiting up to the deadline).
ns_pools_clean() {
    local chk
    chk=$(curl -sS -H "Authorization: Bearer $NS_ADMIN_KEY" \
        "$KS_URL/admin/kv/check?timeout_ms=$((KS_WAIT_S * 1000))")
    expect_has "pools after $1" "$chk" '"clean":true'
}

# ns_serving_again NAME — the canary prompts answer exactly as ns_refs NAME did.
ns_serving_again() {
    KS_URL=$KS_URL NS_TENANTS=$NS_TENANTS NS_MODE=ref NS_REF_CHECK="$TMPD/$1.ref" \
        node "$KS_SRC/tests/e2e/js/netns_load.mjs" >"$TMPD/$1.again" 2>&1 ||
        { cat "$TMPD/$1.again" >&2; fail "$1: the cluster does not serve as before after the fault"; }
}

# ns_registered_count — how many registrations the first router has logged.
ns_registered_count() { grep -c 'worker [0-9]* registered' "$KS_ROUTER_LOG"; }
ns_registered_ge() { [ "$(ns_registered_count)" -ge "$1" ]; }

# ns_node_of_addr ADDR — the node whose address ADDR is.
ns_node_of_addr() {
    local n
    for n in "${NS_NODES[@]}"; do [ "${NS_ADDR[$n]}" = "$1" ] && { echo "$n"; return 0; }; done
    return 1
}

# ns__more_lines TEXT N FILE... — for wait_for: the FILEs together have
# more than N lines with TEXT.
ns__more_lines() { local t=$1 n=$2; shift 2; [ "$(cat "$@" | grep -c -- "$t")" -gt "$n" ]; }
