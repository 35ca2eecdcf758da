#!/usr/bin/env bash
# More than one router (issue 40, section 2): two routers, one prefill and
# two decode workers that register with both (--router A,B).
#  1. both routers serve, with the same greedy answer, equal to `kvseal
#     serve`'s (I9);
#  2. kill -9 of router 2 while each router carries streams on both decode
#     workers: router 2's clients see their connection drop (no [DONE], no
#     finish_reason: nothing looks finished; a non-streamed request gets no
#     status at all, never a short 200), router 1's streams run to their
#     full length and end with [DONE]; the workers end only router 2's
#     requests; afterwards every pool is FREE and scrubbed (/admin/kv/check
#     on router 1);
#  3. router 2 restarted on its cluster port gets every worker back (a new
#     router identity: fresh links) and answers as before.
. "$(dirname "$0")/lib.sh"
ARGS=(-m "$KS_SRC/models/kjv-mini.gguf" --ctx 1024 --kv-pages 512 --threads 1)
ADM=adm-routers-0123456789
JSON=(-H 'Content-Type: application/json')
short='{"model":"kjv-mini","prompt":"In the beginning","max_tokens":24,"temperature":0}'
start_server "$TMPD/ref" "${ARGS[@]}"
req "reference" 200 "$KS_URL/v1/completions" "${JSON[@]}" -d "$short"
ref=$(jq -r '.choices[0].text' <<<"$BODY")
stop_server
KS_ROUTERS=2 ROUTER_ARGS="--admin-key $ADM" start_cluster "$TMPD/c" 1 2 "${ARGS[@]}"
R1=${KS_URLS[0]} R2=${KS_URLS[1]}
for l in "$TMPD/c.prefill1" "$TMPD/c.decode1" "$TMPD/c.decode2"; do
    [ "$(grep -c 'registered with router' "$l")" -ge 2 ] || fail "$l: not registered with both routers"
done

# 1. the same answer through either router, equal to serve's
req "router 1" 200 "$R1/v1/completions" "${JSON[@]}" -d "$short"; a1=$(jq -r '.choices[0].text' <<<"$BODY")
req "router 2" 200 "$R2/v1/completions" "${JSON[@]}" -d "$short"; a2=$(jq -r '.choices[0].text' <<<"$BODY")
[ -n "$a1" ] || fail "router 1 answered nothing"
expect_eq "router 2's answer" "$a2" "$a1"
expect_eq "the routers' answer against serve's" "$a1" "$ref"

# 2. kill -9 of router 2 while both routers stream
N=700
long='{"model":"kjv-mini","prompt":"And God said","max_tokens":'$N',"ignore_eos":true,"temperature":0,"stream":true}'
pids1=(); pids2=()
for i in 1 2 3 4; do
    curl -sSN "$R1/v1/completions" "${JSON[@]}" -d "$long" >"$TMPD/s1.$i" 2>"$TMPD/s1.$i.err" & pids1+=($!)
    curl -sSN "$R2/v1/completions" "${JSON[@]}" -d "$long" >"$TMPD/s2.$i" 2>"$TMPD/s2.$i.err" & pids2+=($!)
done
# and one non-streamed request through router 2: it must not end as a short 200
nonstream='{"model":"kjv-mini","prompt":"And God said","max_tokens":'$N',"ignore_eos":true,"temperature":0}'
curl -sS -o "$TMPD/n2" -w '%{http_code}' "$R2/v1/completions" "${JSON[@]}" -d "$nonstream" \
    >"$TMPD/n2.code" 2>"$TMPD/n2.err" & npid=$!
streaming() { local f; for f in "$TMPD"/s[12].[1-4]; do grep -q '"text"' "$f" || return 1; done; }
wait_for "every stream to deliver tokens" streaming
for f in "$TMPD"/s[12].[1-4]; do grep -q 'data: \[DONE\]' "$f" && fail "$f ended before the kill (raise N)"; done
# both decode workers carry requests of both routers
for d in 1 2; do
    [ "$(grep -c 'KV handoff' "$TMPD/c.decode$d")" -ge 2 ] || echo "note: decode $d took few requests" >&2
done
kill -KILL "${KS_ROUTER_PIDS[1]}"
wait "${KS_ROUTER_PIDS[1]}" 2>/dev/null
for i in 1 2 3 4; do
    wait "${pids2[$((i - 1))]}" && fail "router 2's stream $i ended as a success"
    grep -q 'data: \[DONE\]' "$TMPD/s2.$i" && fail "router 2's stream $i got [DONE]"
    grep -q '"finish_reason":"[a-z]' "$TMPD/s2.$i" && fail "router 2's stream $i looks finished"
done
wait $npid && fail "router 2's non-streamed request ended as a success: $(cat "$TMPD/n2.code")"
[ "$(cat "$TMPD/n2.code")" = 000 ] || fail "router 2's non-streamed request got status $(cat "$TMPD/n2.code")"
for i in 1 2 3 4; do
    wait "${pids1[$((i - 1))]}" || fail "router 1's stream $i failed: $(cat "$TMPD/s1.$i.err")"
    grep -q 'data: \[DONE\]' "$TMPD/s1.$i" || fail "router 1's stream $i has no [DONE]"
    grep -q '"finish_reason":"length"' "$TMPD/s1.$i" || fail "router 1's stream $i did not run to max_tokens"
    n=$(grep -c '^data: {' "$TMPD/s1.$i")
    [ "$n" -ge "$N" ] || fail "router 1's stream $i has $n events, want at least $N"
    grep -q '"error"' "$TMPD/s1.$i" && fail "router 1's stream $i carries an error"
done
for d in 1 2; do
    grep -q "router 127.0.0.1:${KS_CPORTS[1]} lost; aborting its" "$TMPD/c.decode$d" ||
        fail "decode $d did not end router 2's requests"
done
chk=$(curl -sS -H "Authorization: Bearer $ADM" "$R1/admin/kv/check?timeout_ms=$((KS_WAIT_S * 1000))")
expect_has "pools after router 2's death" "$chk" '"clean":true'

# 3. router 2 again, on its cluster port: the workers come back
KS_CLUSTER_WANT=3
start_router "$TMPD/c.router2b" "${KS_CPORTS[1]}" "${ARGS[@]}"
KS_MORE_ROUTERS=("$KS_PID"); R2=$KS_URL
wait_for "the workers to register with the restarted router" cluster__registered
wait_for "the restarted router to answer" cluster__probe
req "restarted router 2" 200 "$R2/v1/completions" "${JSON[@]}" -d "$short"
expect_eq "restarted router 2's answer" "$(jq -r '.choices[0].text' <<<"$BODY")" "$a1"
req "router 1 after the restart" 200 "$R1/v1/completions" "${JSON[@]}" -d "$short"
expect_eq "router 1's answer after the restart" "$(jq -r '.choices[0].text' <<<"$BODY")" "$a1"
KS_PID=${KS_ROUTER_PIDS[0]}
stop_cluster
echo PASS
