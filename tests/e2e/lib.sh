# lib.sh — helpers for the end-to-end tests (sourced). They run the real
# kvseal binary ($KS_BIN) from the build tree.
set -u
: "${KS_BIN:?KS_BIN must point at the kvseal binary}"
: "${KS_SRC:?KS_SRC must point at the source tree}"
KS_SHARED=${KS_SHARED:-$KS_SRC/../shared}
TMPD=$(mktemp -d)
# rm_tmpd — removes the test's scratch folder (logs included) unless
# KS_KEEP_TMP is set, for debugging a failure.
rm_tmpd() {
    kill -KILL $(jobs -p) 2>/dev/null  # clients left behind by a failed test (rawc, curl)
    [ -n "${KS_KEEP_TMP:-}" ] || rm -rf "$TMPD"
}
trap rm_tmpd EXIT

# fail MSG — ends the test; the tail of each server log goes with the message,
# and a sanitizer's report, whose head (the faulting stacks) the tail misses.
fail() {
    echo "FAIL: $*" >&2
    local f
    for f in ${KS_SERVER_LOG:-} ${KS_CLUSTER_LOGS:-}; do
        [ -s "$f" ] || continue
        grep -q -m1 -e 'ERROR: AddressSanitizer' -e 'ERROR: LeakSanitizer' -e 'runtime error:' "$f" &&
            { echo "--- sanitizer report in $(basename "$f"):" >&2
              grep -m1 -A30 -e 'ERROR: AddressSanitizer' -e 'ERROR: LeakSanitizer' -e 'runtime error:' "$f" >&2; }
        echo "--- last lines of $(basename "$f"):" >&2
        tail -n 15 "$f" >&2
    done
    exit 1
}
skip() { echo "SKIP: $*" >&2; exit 77; }
# expect_eq WHAT GOT WANT
expect_eq() { [ "$2" == "$3" ] || fail "$1: got [$2], want [$3]"; }
# expect_has WHAT HAYSTACK NEEDLE
expect_has() { case "$2" in *"$3"*) ;; *) fail "$1: [$2] lacks [$3]";; esac; }

# Waiting: every wait is on a condition the server reports (a metric, a log
# line, a file a client wrote), polled every 50 ms up to a deadline generous
# enough for a sanitizer build on a loaded machine: KS_WAIT_S seconds (60;
# x3 under a sanitizer). A deadline only turns a hang into a clear failure.
export KS_WAIT_S=${KS_WAIT_S:-$([ -n "${KS_SANITIZE:-}" ] && echo 180 || echo 60)}
KS_RAWC=${KS_RAWC:-${KS_BUILD:-}/rawc}

# The servers' own time limits (queue wait, drain) are set far beyond any
# test's wait, so a sanitizer build on a loaded machine never hits them;
# a test that is about a limit passes its own value later on the line.
KS_SLOW_LIMITS="--queue-timeout-ms $((KS_WAIT_S * 10000)) --drain-timeout-ms $((KS_WAIT_S * 10000))"
# Grammar masks run 3-10x slower under a sanitizer: there the per-token and
# per-request mask CPU budgets are lifted (on serve and on every cluster
# role); test_fairness, which is about them, passes its own.
KS_SLOW_GRAMMAR=$([ -n "${KS_SANITIZE:-}" ] && echo "--grammar-budget-ms 0 --grammar-cpu-ms 0")
KS_SLOW_LIMITS="$KS_SLOW_LIMITS $KS_SLOW_GRAMMAR"

# wait_for WHAT CMD... — runs CMD until it succeeds; fails naming WHAT at the deadline.
wait_for() {
    local what=$1; shift
    local end=$((SECONDS + KS_WAIT_S))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $end ] || fail "timed out after ${KS_WAIT_S}s waiting for: $what"
        sleep 0.05
    done
}

# /metrics is the scraper's when tenants are configured: start_server and
# start_cluster's router take this key (--metrics-key), metrics_text sends it
# (`KS_METRICS_KEY= start_server ...` starts one without).
KS_METRICS_KEY=${KS_METRICS_KEY:-mk-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
# metrics_text URL — prints the /metrics text, read with the metrics key.
metrics_text() { curl -sS -H "Authorization: Bearer $KS_METRICS_KEY" "$1/metrics"; }
# metric URL NAME — prints the value of the /metrics line NAME (with its labels), or nothing.
metric() {
    metrics_text "$1" | awk -v n="$2" '$1 == n && !f { print $2; f = 1 }'
}
# metric_is URL NAME VALUE / metric_ge URL NAME VALUE — for wait_for.
metric_is() { [ "$(metric "$1" "$2")" = "$3" ]; }
metric_ge() { local v; v=$(metric "$1" "$2"); [ -n "$v" ] && [ "${v%.*}" -ge "$3" ]; }
# file_has FILE TEXT — for wait_for.
file_has() { grep -qF -- "$2" "$1" 2>/dev/null; }
# proc_gone PID — for wait_for.
proc_gone() { ! kill -0 "$1" 2>/dev/null; }

# rawc_request PATH BODY — prints a raw HTTP/1.1 POST of the JSON BODY (with
# $RAWC_AUTH as the bearer key when set), for tests/e2e/rawc.c:
#   rawc --pause-after 'data: ' ... $PORT < <(rawc_request /v1/completions "$body") &
# ($! is then rawc itself, so the test can kill it).
rawc_request() {
    local nl=$'\r\n' auth=
    [ -n "${RAWC_AUTH:-}" ] && auth="Authorization: Bearer $RAWC_AUTH$nl"
    printf '%s' "POST $1 HTTP/1.1${nl}Host: 127.0.0.1${nl}Content-Type: application/json$nl${auth}Content-Length: ${#2}${nl}Connection: close$nl$nl$2"
}
# rawc ARGS... — runs rawc; in the background (`rawc ... &`) $! is rawc itself.
rawc() {
    [ -x "$KS_RAWC" ] || fail "the test client rawc is not built ($KS_RAWC)"
    if [ "$BASHPID" != "$$" ]; then exec "$KS_RAWC" "$@"; fi
    "$KS_RAWC" "$@"
}

# req NAME WANT_STATUS CURL_ARGS... — one curl request; sets BODY, checks the status.
req() {
    local name=$1 want=$2
    shift 2
    local code
    code=$(curl -sS -o "$TMPD/body" -w '%{http_code}' "$@") || fail "$name: curl failed"
    BODY=$(cat "$TMPD/body")
    expect_eq "$name: status ($BODY)" "$code" "$want"
}

# chat_text URL MODEL USER_TEXT — CHAT gets the reasoning and content of a
# greedy chat answer (16 tokens, a system message and one user turn),
# rendered by the server's chat template, as "REASONING|CONTENT"; fails on
# any status but 200 or an empty answer.
chat_text() {
    req "chat ($3)" 200 -H "Content-Type: application/json" "$1/v1/chat/completions" \
        -d "{\"model\":\"$2\",\"max_tokens\":16,\"temperature\":0,\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"$3\"}]}"
    CHAT=$(python3 -c 'import json, sys
m = json.loads(sys.argv[1])["choices"][0]["message"]
print((m.get("reasoning_content") or "") + "|" + (m["content"] or ""))' "$BODY") ||
        fail "chat ($3): no content in $BODY"
    [ "$CHAT" != "|" ] || fail "chat ($3): empty answer in $BODY"
}

# The greedy chats the chat-template tests send.
CHAT_QS=("In the beginning" "And the LORD said unto Moses" "For God so loved the world")
# chats_batched MODEL — each CHAT_QS chat (a system message and one user
# turn, 16 greedy tokens) alone, then all three at once: the same content
# both times (batched == alone), not empty, some prompt tokens counted.
chats_batched() {
    local i a b
    chats__body() {
        printf '{"model":"%s","max_tokens":16,"temperature":0,"messages":[%s,%s]}' "$1" \
            '{"role":"system","content":"Be brief."}' "{\"role\":\"user\",\"content\":\"$2\"}"
    }
    chats__content() {
        python3 -c 'import json, sys
print(json.load(open(sys.argv[1]))["choices"][0]["message"]["content"])' "$1"
    }
    for i in 0 1 2; do
        req "chat $i alone" 200 -H "Content-Type: application/json" "$KS_URL/v1/chat/completions" \
            -d "$(chats__body "$1" "${CHAT_QS[$i]}")"
        cp "$TMPD/body" "$TMPD/alone$i.json"
    done
    grep -q '"prompt_tokens":[1-9]' "$TMPD/alone0.json" ||
        fail "no prompt tokens: $(cat "$TMPD/alone0.json")"
    local pids=()
    for i in 0 1 2; do
        curl -sS -o "$TMPD/batch$i.json" -H "Content-Type: application/json" \
            "$KS_URL/v1/chat/completions" -d "$(chats__body "$1" "${CHAT_QS[$i]}")" &
        pids+=($!)
    done
    wait "${pids[@]}"
    for i in 0 1 2; do
        a=$(chats__content "$TMPD/alone$i.json") || fail "chat $i: $(cat "$TMPD/alone$i.json")"
        b=$(chats__content "$TMPD/batch$i.json") || fail "chat $i batched: $(cat "$TMPD/batch$i.json")"
        [ -n "$a" ] || fail "chat $i: empty content"
        expect_eq "chat $i batched = alone" "$b" "$a"
    done
}

# named_call URL MODEL OUT — a greedy chat whose tool_choice names `now`
# (the only tool, no parameters): 200, finish_reason tool_calls, exactly
# one call to now, its arguments JSON; the answer in OUT, and CALL_ARGS
# its arguments.
named_call() {
    local tools='"tools":[{"type":"function","function":{"name":"now","description":"The time.","parameters":{"type":"object","properties":{},"additionalProperties":false}}}]'
    req "named tool call" 200 -H "Content-Type: application/json" "$1/v1/chat/completions" \
        -d "{\"model\":\"$2\",\"max_tokens\":64,\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":\"Time?\"}],$tools,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"now\"}}}"
    cp "$TMPD/body" "$3"
    CALL_ARGS=$(python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))["choices"][0]
t = c["message"]["tool_calls"]
assert c["finish_reason"] == "tool_calls" and len(t) == 1 and t[0]["function"]["name"] == "now", c
json.loads(t[0]["function"]["arguments"])
print(t[0]["function"]["arguments"])' "$3") || fail "named tool call: not one call to now: $(cat "$3")"
}

# stall_reader URL MODEL OUT [RAWC_ARGS...] — a streamed request of 500
# tokens ($RAWC_AUTH as its key) whose client takes the first event, then
# stops reading (e.g. until --resume-on FILE): its answer cannot fit the
# socket buffers, so it cannot end, and in serve the request pauses
# (kvseal_paused_requests). Returns once the client stopped reading, with
# STALL_PID its pid and its answer going to OUT.
stall_reader() {
    local url=$1 model=$2 out=$3; shift 3
    rm -f "$TMPD/stalled"
    rawc --rcvbuf 2048 --pause-after 'data: ' --ready "$TMPD/stalled" -o "$out" "$@" "${url##*:}" \
        < <(rawc_request /v1/completions \
        "{\"model\":\"$model\",\"prompt\":\"In\",\"max_tokens\":500,\"ignore_eos\":true,\"stream\":true}") &
    STALL_PID=$!
    wait_for "the stalled client to stop reading" test -e "$TMPD/stalled"
}

# start_server LOGFILE ARGS... — starts `kvseal serve --port 0 ARGS` in the
# background, waits for its "listening on" line and /health, and sets
# KS_PID and KS_URL. The server is killed on exit.
start_server() {
    local log=$1; shift
    "${KS_SERVE_BIN:-$KS_BIN}" serve --host 127.0.0.1 --port 0 $KS_SLOW_LIMITS \
        ${KS_METRICS_KEY:+--metrics-key "$KS_METRICS_KEY"} "$@" >"$log.out" 2>"$log" &
    KS_PID=$!
    trap 'kill -KILL $KS_PID 2>/dev/null; rm_tmpd' EXIT
    KS_SERVER_LOG=$log
    wait_for "the server to come up (log: $(basename "$log"))" server__up
}
# server__up — true once the server printed its URL and answers /health;
# fails at once if it exited.
server__up() {
    KS_URL=$(sed -n 's/^listening on \(https\{0,1\}:[^ ]*\).*/\1/p' "$KS_SERVER_LOG.out" | head -1)
    [ -n "$KS_URL" ] && curl -fsS "$KS_URL/health" >/dev/null 2>&1 && return 0
    kill -0 $KS_PID 2>/dev/null || { cat "$KS_SERVER_LOG" >&2; fail "server exited during start"; }
    return 1
}

# stop_server — SIGTERM; fails unless the server exits 0 by the deadline.
stop_server() {
    kill -TERM $KS_PID 2>/dev/null
    local end=$((SECONDS + KS_WAIT_S))
    while kill -0 $KS_PID 2>/dev/null; do
        [ $SECONDS -lt $end ] || { kill -KILL $KS_PID; fail "server ignored SIGTERM"; }
        sleep 0.05
    done
    wait $KS_PID
    local rc=$?
    [ $rc -eq 0 ] || fail "server exited with status $rc"
}

# (Health checks every second, two under a sanitizer: a worker starved of CPU
# on a loaded machine must not miss three in a row and be dropped.)
# start_cluster LOGPREFIX NPREFILL NDECODE ARGS... — starts `kvseal router`
# (HTTP and cluster ports picked freely; $ROUTER_ARGS are router-only
# options such as --tenants), NPREFILL `kvseal prefill` and NDECODE `kvseal
# decode` workers (ARGS go to every process, $PREFILL_ARGS / $DECODE_ARGS
# to one kind of worker only; $PREFILL_ENV / $DECODE_ENV are
# prepended as environment, e.g. KS_PD_FAULT=...), all with one fresh
# secret. Waits until every worker has registered and sets KS_URL, KS_PID
# (the router), KS_PREFILL_PIDS and KS_DECODE_PIDS (arrays), KS_CLUSTER_LOGS.
# With KS_ROUTERS=R (default 1) it starts R routers (logs LOGPREFIX.router,
# LOGPREFIX.router2, ...; each its own HTTP and cluster port), every worker
# registers with all of them (--router A,B,...), and KS_URLS, KS_ROUTER_PIDS,
# KS_ROUTER_LOGS and KS_CPORTS are arrays over them (KS_URL/KS_PID: the first).
start_cluster() {
    local log=$1 np=$2 nd=$3; shift 3
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMPD/secret"
    chmod 600 "$TMPD/secret"
    KS_URLS=(); KS_ROUTER_PIDS=(); KS_ROUTER_LOGS=(); KS_CPORTS=()
    KS_PREFILL_PIDS=(); KS_DECODE_PIDS=()
    trap 'kill -KILL "${KS_ROUTER_PIDS[@]}" $KS_PID "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}" 2>/dev/null; rm_tmpd' EXIT
    KS_CLUSTER_LOGS=
    local i r routers=
    for r in $(seq 1 "${KS_ROUTERS:-1}"); do
        local rl=$log.router; [ "$r" -gt 1 ] && rl=$log.router$r
        start_router "$rl" 0 "$@"
        routers+="${routers:+,}127.0.0.1:${KS_CPORTS[$((r - 1))]}"
    done
    KS_URL=${KS_URLS[0]}; KS_PID=${KS_ROUTER_PIDS[0]}; KS_ROUTER_LOG=${KS_ROUTER_LOGS[0]}
    for i in $(seq 1 "$nd"); do
        env ${DECODE_ENV:-} "${KS_SERVE_BIN:-$KS_BIN}" decode --router "$routers" \
            --secret-file "$TMPD/secret" --drain-timeout-ms $((KS_WAIT_S * 10000)) $KS_SLOW_GRAMMAR "$@" ${DECODE_ARGS:-} >"$log.decode$i.out" 2>"$log.decode$i" &
        KS_DECODE_PIDS+=($!); KS_CLUSTER_LOGS+=" $log.decode$i"
    done
    for i in $(seq 1 "$np"); do
        env ${PREFILL_ENV:-} "${KS_SERVE_BIN:-$KS_BIN}" prefill --router "$routers" \
            --secret-file "$TMPD/secret" --drain-timeout-ms $((KS_WAIT_S * 10000)) $KS_SLOW_GRAMMAR "$@" ${PREFILL_ARGS:-} >"$log.prefill$i.out" 2>"$log.prefill$i" &
        KS_PREFILL_PIDS+=($!); KS_CLUSTER_LOGS+=" $log.prefill$i"
    done
    KS_CLUSTER_WANT=$((np + nd))
    for i in "${!KS_ROUTER_LOGS[@]}"; do
        KS_ROUTER_LOG=${KS_ROUTER_LOGS[$i]}
        wait_for "$KS_CLUSTER_WANT workers to register with router $((i + 1)) (logs: $KS_CLUSTER_LOGS)" cluster__registered
        # data links come up right after registration: one tiny request proves the path
        KS_URL=${KS_URLS[$i]}
        wait_for "the cluster to answer a probe request through router $((i + 1))" cluster__probe
    done
    KS_URL=${KS_URLS[0]}; KS_ROUTER_LOG=${KS_ROUTER_LOGS[0]}
    KS_MORE_ROUTERS=("${KS_ROUTER_PIDS[@]:1}") # stop_cluster stops these and $KS_PID
}
# start_router LOG CPORT ARGS... — starts one `kvseal router` of start_cluster
# on cluster port CPORT (0: any; a restarted router takes its old one) with
# $TMPD/secret, waits for it to listen, and appends its URL, pid, log and
# cluster port to KS_URLS, KS_ROUTER_PIDS, KS_ROUTER_LOGS and KS_CPORTS.
start_router() {
    local rl=$1 cp=$2; shift 2
    "${KS_SERVE_BIN:-$KS_BIN}" router --host 127.0.0.1 --port 0 --cluster-port "$cp" $KS_SLOW_LIMITS \
        ${KS_METRICS_KEY:+--metrics-key "$KS_METRICS_KEY"} \
        --secret-file "$TMPD/secret" --health-interval-ms ${KS_HEALTH_MS:-$([ -n "${KS_SANITIZE:-}" ] && echo 2000 || echo 1000)} ${ROUTER_ARGS:-} "$@" \
        >"$rl.out" 2>"$rl" &
    KS_PID=$!
    KS_ROUTER_LOG=$rl
    KS_CLUSTER_LOGS+=" $rl"
    wait_for "the router to come up" cluster__router_up
    KS_URLS+=("$KS_URL"); KS_ROUTER_PIDS+=($KS_PID); KS_ROUTER_LOGS+=("$rl")
    KS_CPORTS+=("$(sed -n 's/^cluster port \([0-9]*\).*/\1/p' "$rl.out" | head -1)")
}
cluster__router_up() {
    KS_URL=$(sed -n 's/^listening on \(https\{0,1\}:[^ ]*\).*/\1/p' "$KS_ROUTER_LOG.out" | head -1)
    [ -n "$KS_URL" ] && grep -q '^cluster port [0-9]' "$KS_ROUTER_LOG.out" && return 0
    kill -0 $KS_PID 2>/dev/null || { cat "$KS_ROUTER_LOG" >&2; fail "router exited during start"; }
    return 1
}
cluster__registered() {
    [ "$(grep -c 'worker [0-9]* registered' "$KS_ROUTER_LOG" 2>/dev/null)" -ge "$KS_CLUSTER_WANT" ]
}
cluster__probe() { # a completion, or (CLUSTER_PROBE_EMBED set: an encoder) an embedding
    local ep=completions body='"prompt":"In the","max_tokens":1,"temperature":0'
    [ -z "${CLUSTER_PROBE_EMBED:-}" ] || ep=embeddings body='"input":"In the"'
    curl -fsS "$KS_URL/v1/$ep" ${CLUSTER_PROBE_AUTH:+-H "Authorization: Bearer $CLUSTER_PROBE_AUTH"} \
        -H 'Content-Type: application/json' -d '{"model":"'"${CLUSTER_PROBE_MODEL:-kjv-mini}"'",'"$body"'}'
}

# stop_cluster — SIGTERM to every process; fails unless all exit 0 by the deadline.
stop_cluster() {
    local p rc=0
    for p in "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}" $KS_PID "${KS_MORE_ROUTERS[@]}"; do
        kill -TERM $p 2>/dev/null
    done
    local end=$((SECONDS + KS_WAIT_S))
    for p in "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}" $KS_PID "${KS_MORE_ROUTERS[@]}"; do
        while kill -0 $p 2>/dev/null; do
            [ $SECONDS -lt $end ] || { kill -KILL $p; fail "process $p ignored SIGTERM"; }
            sleep 0.05
        done
        wait $p 2>/dev/null
        local s=$?
        # a worker killed on purpose by a test exits 137: callers unset it first
        [ $s -eq 0 ] || { echo "process $p exited with status $s" >&2; rc=1; }
    done
    [ $rc -eq 0 ] || { cat $KS_CLUSTER_LOGS >&2; fail "a cluster process did not exit cleanly"; }
}
