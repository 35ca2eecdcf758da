#!/usr/bin/env bash
# Operating kvseal serve and router, end to end (docs/h-ops.md):
#  - --log-format json: a real completion's log line (serve and the
#    cluster router) is one JSON object with request_id (the client's
#    x-request-id), tenant, route, model, status, token counts, finish_reason, ttft_ms and duration_ms, and never the
#    prompt's or the output's text; a refused request's line has its status;
#    every other stderr line is a {ts, level, msg} object;
#  - KVSEAL_<NAME> environment variables: one takes effect (KVSEAL_ALIAS
#    names the model), the command line wins over one (KVSEAL_PORT), and a
#    malformed one is refused naming the variable;
#  - the process_* series in /metrics, with plausible values;
#  - a port in use is refused before the model is loaded: no load-progress
#    line comes before the error, which is said once;
#  - the KV pool line is logged once, and a pool too small for the context
#    is one error line.
. "$(dirname "$0")/lib.sh"
M=$KS_SRC/models/kjv-mini.gguf
command -v python3 >/dev/null || skip "python3 is absent"

cat >"$TMPD/tenants.json" <<'JSON'
{"tenants": [{"name": "acme", "keys": ["sk-ops-acme"]}]}
JSON
# ---- one server: json logs, an alias from the environment, a port the
# command line gives over the environment's (1 would not bind)
KVSEAL_ALIAS=env-model KVSEAL_PORT=1 start_server "$TMPD/s" -m "$M" --ctx 256 --kv-pages 64 \
    --tenants "$TMPD/tenants.json" --log-format json
AUTH=(-H "Authorization: Bearer sk-ops-acme" -H "Content-Type: application/json")
PROMPT="In the beginning God created the heaven"
req "completion" 200 "${AUTH[@]}" -H "X-Request-Id: ops-req-1" "$KS_URL/v1/completions" \
    -d "{\"model\":\"env-model\",\"prompt\":\"$PROMPT\",\"max_tokens\":8,\"temperature\":0}"
OUT=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["choices"][0]["text"])' "$BODY")
[ -n "$OUT" ] || fail "completion: no text in $BODY"
req "unknown model" 404 "${AUTH[@]}" -H "X-Request-Id: ops-req-2" "$KS_URL/v1/completions" \
    -d '{"model":"no-such-model","prompt":"x","max_tokens":2}'
wait_for "the completion's log line" file_has "$TMPD/s" '"request_id":"ops-req-1"'
wait_for "the refusal's log line" file_has "$TMPD/s" '"request_id":"ops-req-2"'
python3 - "$TMPD/s" "$PROMPT" "$OUT" <<'EOF' || fail "json log lines (log: $TMPD/s)"
import json, sys
path, prompt, out = sys.argv[1], sys.argv[2], sys.argv[3]
lines = open(path).read().splitlines()
objs = []
for l in lines:
    o = json.loads(l)  # every stderr line is one JSON object
    for k in ("ts", "level", "msg"):
        assert k in o, (k, l)
    objs.append(o)
done = [o for o in objs if o.get("request_id") == "ops-req-1"]
assert len(done) == 1, done
d = done[0]
want = {"tenant": "acme", "route": "completions", "model": "env-model", "status": 200,
        "finish_reason": "length", "prompt_tokens": d["prompt_tokens"],
        "completion_tokens": 8}
for k, v in want.items():
    assert d.get(k) == v, (k, d.get(k), v, d)
assert d["prompt_tokens"] >= 5, d
assert d["level"] == "info", d
assert isinstance(d["ttft_ms"], (int, float)) and d["ttft_ms"] > 0, d
assert isinstance(d["duration_ms"], (int, float)) and d["duration_ms"] >= d["ttft_ms"], d
assert "error" not in d, d
ref = [o for o in objs if o.get("request_id") == "ops-req-2"]
assert len(ref) == 1 and ref[0]["status"] == 404 and ref[0]["tenant"] == "acme", ref
# never the prompt's or the output's text, in any line
text = open(path).read()
assert prompt not in text, "the prompt is in the log"
assert out.strip() not in text, "the output is in the log"
EOF

# ---- process_* series
metrics_text "$KS_URL" >"$TMPD/metrics"
MT=$(cat "$TMPD/metrics")
python3 - "$KS_PID" "$TMPD/metrics" <<'EOF' || fail "process_* metrics: $(grep '^process_' <<<"$MT")"
import os, sys, time
pid = int(sys.argv[1])
m = {}
for l in open(sys.argv[2]).read().splitlines():
    if l.startswith("process_"):
        k, v = l.split(" ")
        m[k] = float(v)
for k in ("process_cpu_seconds_total", "process_resident_memory_bytes",
          "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
          "process_start_time_seconds"):
    assert k in m, k
assert 0 < m["process_cpu_seconds_total"] < 3600, m
rss = int(open(f"/proc/{pid}/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
assert 0.5 * rss < m["process_resident_memory_bytes"] < 2 * rss + (64 << 20), (m, rss)
assert m["process_virtual_memory_bytes"] >= m["process_resident_memory_bytes"], m
assert 3 <= m["process_open_fds"] <= m["process_max_fds"], m
assert time.time() - 600 < m["process_start_time_seconds"] <= time.time() + 1, m
EOF
for t in process_cpu_seconds_total process_resident_memory_bytes process_open_fds; do
    grep -q "^# TYPE $t " <<<"$MT" || fail "no TYPE line for $t"
done

# ---- the pool line once (the sizing check's; the engine's is not repeated)
expect_eq "kv pool lines" "$(grep -c 'kv pool: 64 pages' "$TMPD/s")" "1"
# the load's progress and rate (not a terminal: log lines)
grep -q '"msg":"model loaded: ' "$TMPD/s" || fail "no 'model loaded' line"
stop_server

# ---- a malformed variable: refused at once, naming it
rc=0
KVSEAL_LOG_CONTENT=maybe "$KS_BIN" serve -m "$M" --port 0 >"$TMPD/bad.out" 2>"$TMPD/bad" || rc=$?
expect_eq "bad KVSEAL_LOG_CONTENT: exit status" "$rc" "2"
expect_has "bad KVSEAL_LOG_CONTENT" "$(cat "$TMPD/bad")" "environment variable KVSEAL_LOG_CONTENT"
grep -q "loading model\|kv pool" "$TMPD/bad" && fail "a bad variable got as far as the load"

# ---- a port in use: refused before the model loads, the error said once
python3 - "$TMPD/port" "$TMPD/release" <<'EOF' &
import os, socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0))
s.listen()
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(s.getsockname()[1]))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
EOF
HOLDER=$!
wait_for "the port holder" test -s "$TMPD/port"
PORT=$(cat "$TMPD/port")
rc=0
"$KS_BIN" serve -m "$M" --host 127.0.0.1 --port "$PORT" >"$TMPD/busy.out" 2>"$TMPD/busy" || rc=$?
touch "$TMPD/release"
wait $HOLDER
expect_eq "port in use: exit status ($(cat "$TMPD/busy"))" "$rc" "1"
expect_eq "port in use: errors" "$(grep -c 'Address already in use' "$TMPD/busy")" "1"
expect_has "port in use" "$(cat "$TMPD/busy")" "cannot listen on 127.0.0.1:$PORT"
# the error comes before anything of the load
grep -q "loading model\|model loaded\|kv pool" "$TMPD/busy" &&
    fail "port in use: the model was loaded first: $(cat "$TMPD/busy")"

# ---- a pool too small for the context: one error line, not two
rc=0
"$KS_BIN" serve -m "$M" --port 0 --ctx 512 --kv-pages 8 >"$TMPD/small.out" 2>"$TMPD/small" || rc=$?
expect_eq "small pool: exit status ($(cat "$TMPD/small"))" "$rc" "1"
expect_eq "small pool: error lines ($(cat "$TMPD/small"))" "$(grep -c ' error: ' "$TMPD/small")" "1"
expect_has "small pool" "$(cat "$TMPD/small")" "DOES NOT FIT"
# ---- the router's request line has the same fields; each role says its pool once
ROUTER_ARGS="--log-format json" start_cluster "$TMPD/c" 1 1 -m "$M" --ctx 256 --kv-pages 64
req "router completion" 200 -H "Content-Type: application/json" -H "X-Request-Id: ops-rt-1" \
    "$KS_URL/v1/completions" -d '{"model":"kjv-mini","prompt":"In","max_tokens":4,"temperature":0}'
wait_for "the router's request line" file_has "$TMPD/c.router" '"request_id":"ops-rt-1"'
python3 - "$TMPD/c.router" <<'EOF' || fail "router json line: $(grep ops-rt-1 "$TMPD/c.router")"
import json, sys
d = [o for o in map(json.loads, open(sys.argv[1])) if o.get("request_id") == "ops-rt-1"]
assert len(d) == 1, d
d = d[0]
assert (d["tenant"], d["route"], d["status"], d["completion_tokens"]) == \
    ("default", "completions", 200, 4), d
assert d["ttft_ms"] > 0 and d["duration_ms"] >= d["ttft_ms"], d
EOF
expect_eq "decode worker's kv pool lines" "$(grep -c 'kv pool: 64 pages' "$TMPD/c.decode1")" "1"
echo "ok"
