#!/usr/bin/env bash
# Graceful shutdown of workers (rolling restarts): SIGTERM to one decode and
# one prefill worker while requests stream. They announce DRAINING, take no
# new request (DENY/REJECT DRAINING sends it elsewhere), finish every request
# they hold and exit 0; no request of the traffic in flight nor of a wave sent
# during the drain fails, and every answer equals its reference. Afterwards
# the remaining workers serve on with clean pools.
. "$(dirname "$0")/lib.sh"
command -v node >/dev/null || skip "node is not installed"
ARGS=(-m "$KS_SRC/models/kjv-mini.gguf" --ctx 512 --kv-pages 96 --threads 1)
ROUTER_ARGS="--admin-key adm-drain-0123456789" start_cluster "$TMPD/d" 2 2 "${ARGS[@]}"
dpid=${KS_DECODE_PIDS[0]}; ppid=${KS_PREFILL_PIDS[0]}
KS_DECODE_PIDS=("${KS_DECODE_PIDS[@]:1}"); KS_PREFILL_PIDS=("${KS_PREFILL_PIDS[@]:1}")
KS_URL=$KS_URL KILL_PID=$dpid,$ppid KILL_SIGNAL=SIGTERM CHAOS_N=8 \
    node "$(dirname "$0")/js/chaos.mjs" || { tail -n 25 $KS_CLUSTER_LOGS >&2; fail "requests failed during a drain"; }
for p in $dpid $ppid; do
    wait $p; rc=$?
    [ $rc -eq 0 ] || { tail -n 20 $KS_CLUSTER_LOGS >&2; fail "drained worker $p exited with status $rc"; }
done
grep -q 'decode worker: draining' "$TMPD/d.decode1" || fail "the decode worker did not drain"
grep -q 'prefill worker: draining' "$TMPD/d.prefill1" || fail "the prefill worker did not drain"
grep -q 'is draining; no new requests go to it' "$TMPD/d.router" || fail "the router did not see the drain"
chk=$(curl -sS -H "Authorization: Bearer adm-drain-0123456789" "$KS_URL/admin/kv/check?timeout_ms=$((KS_WAIT_S * 1000))")
expect_has "pools after the drain" "$chk" '"clean":true'
stop_cluster
echo PASS
