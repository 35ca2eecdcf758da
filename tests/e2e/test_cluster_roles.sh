#!/usr/bin/env bash
# The cluster's processes (issue 4): workers may start before the router and
# register once it is up; a node with the wrong secret, a worker serving
# another model, a decode worker with another KV type (--kv-type: pages
# travel in their type), an insecure secret file and a secret or admin key
# under 16 bytes are refused with a clear message; a request with no workers registered gets 503; a worker that stops
# answering health checks is dropped (SIGSTOP) while the router keeps
# serving with the others; after a router restart the workers register with
# the new one; every process exits 0 on SIGTERM. Each worker's --health-port
# endpoint: /health 200 throughout, /ready 503 before registration and while
# draining, 200 while registered (issue 40).
. "$(dirname "$0")/lib.sh"
M=(-m "$KS_SRC/models/kjv-mini.gguf" --ctx 256 --kv-pages 64 --threads 1)
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMPD/secret"; chmod 600 "$TMPD/secret"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMPD/other"; chmod 600 "$TMPD/other"

# an insecure secret file is refused at start
cp "$TMPD/secret" "$TMPD/loose"; chmod 644 "$TMPD/loose"
out=$("$KS_BIN" prefill "${M[@]}" --router 127.0.0.1:1 --secret-file "$TMPD/loose" 2>&1); rc=$?
expect_eq "insecure secret status" "$rc" 2
expect_has "insecure secret message" "$out" "readable by group or others"
# a secret or admin key short enough to guess is refused at start, by every role
printf '0123456789abcde\n' >"$TMPD/short"; chmod 600 "$TMPD/short"
for role in router prefill decode; do
    to=(--router 127.0.0.1:1); [ $role = router ] && to=(--port 0 --cluster-port 0)
    out=$("$KS_BIN" $role "${M[@]}" "${to[@]}" --secret-file "$TMPD/short" 2>&1); rc=$?
    expect_eq "$role short secret status" "$rc" 2
    expect_has "$role short secret message" "$out" "has 15 bytes; at least 16 are needed"
done
out=$("$KS_BIN" router "${M[@]}" --port 0 --cluster-port 0 --secret-file "$TMPD/secret" --admin-key adm-short 2>&1)
rc=$?
expect_eq "router short admin key status" "$rc" 2
expect_has "router short admin key message" "$out" "--admin-key has 9 bytes; at least 16 are needed"
out=$("$KS_BIN" decode "${M[@]}" --secret-file "$TMPD/secret" 2>&1); rc=$?
expect_eq "missing --router status" "$rc" 2
expect_has "missing --router message" "$out" "--router HOST:PORT is required"

# workers first: they retry until the router is up
port=$(rawc --free-port)
"$KS_BIN" decode "${M[@]}" --router 127.0.0.1:$port --secret-file "$TMPD/secret" --health-port 0 \
    >"$TMPD/d.out" 2>"$TMPD/d.log" &
D=$!
"$KS_BIN" prefill "${M[@]}" --log-level debug --router 127.0.0.1:$port --secret-file "$TMPD/secret" \
    --health-port 0 --health-host 127.0.0.1 >"$TMPD/p.out" 2>"$TMPD/p.log" &
P=$!
# an intruder with another secret, and a prefill worker of another model
"$KS_BIN" prefill "${M[@]}" --router 127.0.0.1:$port --secret-file "$TMPD/other" >/dev/null 2>"$TMPD/x.log" &
X=$!
"$KS_BIN" mkmodel -o "$TMPD/other.gguf" --vocab "$KS_SRC/models/kjv-mini.gguf" --shape tiny --seed 3 >/dev/null 2>&1 ||
    fail "mkmodel"
"$KS_BIN" prefill -m "$TMPD/other.gguf" --ctx 256 --kv-pages 64 --threads 1 --router 127.0.0.1:$port \
    --secret-file "$TMPD/secret" >/dev/null 2>"$TMPD/y.log" &
Y=$!
# a decode worker whose KV pages are q8_0 (the router's are f16, the default)
"$KS_BIN" decode "${M[@]}" --kv-type q8_0 --router 127.0.0.1:$port --secret-file "$TMPD/secret" \
    >/dev/null 2>"$TMPD/z.log" &
Z=$!
trap 'kill -KILL $D $P $X $Y $Z ${R:-} 2>/dev/null; rm_tmpd' EXIT
KS_CLUSTER_LOGS="$TMPD/d.log $TMPD/p.log"
# the router is not up yet: both workers have tried and are retrying
wait_for "the decode worker to retry the router" file_has "$TMPD/d.log" "Connection refused"
wait_for "the prefill worker to retry the router" file_has "$TMPD/p.log" "Connection refused"
# probe URL PATH WANT_STATUS TEXT: GET URL/PATH answers WANT_STATUS with TEXT in its body (wait_for)
probe() {
    local code
    code=$(curl -sS -o "$TMPD/probe" -w '%{http_code}' "$1$2") && [ "$code" = "$3" ] &&
        grep -qF -- "$4" "$TMPD/probe"
}
health_url() { sed -n 's/^health on \(http:[^ ]*\).*/\1/p' "$TMPD/$1.out" | head -1; }
has_health() { [ -n "$(health_url "$1")" ]; }
wait_for "the decode worker's health endpoint" has_health d
wait_for "the prefill worker's health endpoint" has_health p
HD=$(health_url d); HP=$(health_url p)
for h in $HD $HP; do
    probe $h /health 200 ok || fail "$h/health before registration: $(cat "$TMPD/probe")"
    probe $h /ready 503 "not registered with the router" ||
        fail "$h/ready before registration: $(cat "$TMPD/probe")"
done
probe $HD /nothing 404 "not found" || fail "$HD/nothing: $(cat "$TMPD/probe")"
registered() { [ "$(grep -c "$2 [0-9]* registered" "$TMPD/$1.log")" -ge "$3" ]; }
answers() {
    curl -sS "$URL/v1/completions" -H 'Content-Type: application/json' \
        -d '{"model":"kjv-mini","prompt":"In the beginning","max_tokens":6,"temperature":0}' | grep -q '"text"'
}
# router NAME: starts the router on the fixed cluster port (logs
# $TMPD/NAME.{out,log}), waits for both workers to register, sets R and URL
router() {
    "$KS_BIN" router "${M[@]}" --host 127.0.0.1 --port 0 --cluster-port $port --secret-file "$TMPD/secret" \
        --health-interval-ms 200 >"$TMPD/$1.out" 2>"$TMPD/$1.log" &
    R=$!
    KS_CLUSTER_LOGS+=" $TMPD/$1.log"
    wait_for "both workers to register with router $1" registered "$1" worker 2
    URL=$(sed -n 's/^listening on \(http:[^ ]*\).*/\1/p' "$TMPD/$1.out")
}
router r
wait_for "the intruder to be refused" file_has "$TMPD/r.log" "auth failed"
wait_for "the other model to be refused" file_has "$TMPD/r.log" "different model"
wait_for "the q8_0 decode worker to be refused" file_has "$TMPD/r.log" \
    "the worker's KV type q8_0 differs from the router's f16"
wait_for "the q8_0 worker to be told why" file_has "$TMPD/z.log" "KV type q8_0 differs"
kill -KILL $X $Y $Z 2>/dev/null
expect_eq "only the two good workers registered" "$(grep -c 'worker [0-9]* registered' "$TMPD/r.log")" 2

ans=$(curl -sS "$URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"kjv-mini","prompt":"In the beginning","max_tokens":6,"temperature":0}')
expect_has "answer through the cluster" "$ans" '"text"'
for h in $HD $HP; do wait_for "$h/ready to say ready" probe $h /ready 200 ready; done

# a worker that stops answering is dropped; its requests fail, the router lives
kill -STOP $D
wait_for "the silent worker to be dropped" file_has "$TMPD/r.log" "missed 3 health checks"
code=$(curl -sS -o "$TMPD/busy" -w '%{http_code}' "$URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"kjv-mini","prompt":"In the beginning","max_tokens":6}')
expect_eq "no decode worker: status" "$code" 503
expect_has "no decode worker: message" "$(cat "$TMPD/busy")" "no decode worker is registered"
kill -CONT $D
# it notices the lost router connection and registers again
wait_for "the decode worker to register again" registered r "decode worker" 2
wait_for "an answer after re-registration" answers

# the router restarts: both workers notice, register with the new one, serve on
kill -TERM $R; wait $R || fail "router exited with status $?"
router r2
# the new router's request ids are not the old one's: decode remembers every
# id it served, and would refuse a reused one (a 500 to the client)
code=$(curl -sS -o "$TMPD/after" -w '%{http_code}' "$URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"kjv-mini","prompt":"In the beginning","max_tokens":6,"temperature":0}')
expect_eq "the first request after the router restarted: status ($(cat "$TMPD/after"))" "$code" 200
wait_for "an answer after the router restarted" answers
# the new router numbers the decode worker afresh: the prefill worker retires
# its link under the old router's id instead of retrying it forever (issue 38)
old_id=$(sed -n 's/.*router: decode worker \([0-9]*\) registered.*/\1/p' "$TMPD/r.log" | tail -1)
new_id=$(sed -n 's/.*router: decode worker \([0-9]*\) registered.*/\1/p' "$TMPD/r2.log" | tail -1)
[ -n "$old_id" ] && [ -n "$new_id" ] && [ "$old_id" != "$new_id" ] ||
    fail "expected the new router to give the decode worker another id (old '$old_id', new '$new_id')"
wait_for "the prefill worker to retire the link to the old decode worker id $old_id" \
    file_has "$TMPD/p.log" "decode worker $old_id is not known to the router; retiring its link"

for h in $HD $HP; do wait_for "$h/ready to say ready with router r2" probe $h /ready 200 ready; done

# a draining worker is not ready (it takes nothing new) but live: with the
# router stopped nothing releases it, so it stays draining (until T_router)
kill -STOP $R
kill -TERM $D
wait_for "the draining decode worker's /ready to say draining" probe $HD /ready 503 draining
probe $HD /health 200 ok || fail "$HD/health while draining: $(cat "$TMPD/probe")"
kill -CONT $R
wait $D || fail "the drained decode worker exited with status $?"
for p in $P $R; do kill -TERM $p; done
for p in $P $R; do wait $p || fail "process $p exited with status $?"; done
echo PASS
