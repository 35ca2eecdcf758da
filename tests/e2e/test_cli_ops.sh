#!/usr/bin/env bash
# The operator's command line, end to end (issue 13):
#  - `kvseal serve --config F` starts from the file's options, the command
#    line overriding them (the file's host is unbindable), and serves a
#    completion under the file's alias;
#  - with --log-format json every stderr line is a JSON object with an
#    RFC 3339 UTC ts, a level and a msg;
#  - sd_notify: serve sends READY=1 (once bound, with STATUS=serving ...) to
#    the $NOTIFY_SOCKET this test binds, then STOPPING=1 on SIGTERM;
#  - perplexity's last line is llama.cpp's "Final estimate: PPL = x +/- y"
#    with x the PPL its "perplexity:" line prints;
#  - bench -o json is a JSON array whose avg_ts/stddev_ts are the mean and
#    the sample standard deviation of its samples; -o md is llama-bench's table;
#    text mode runs a bandwidth-probe pass after every 16 generated tokens and
#    prints tg over the roofline from those passes and from the best pass;
#  - packaging/kvseal.service passes `systemd-analyze verify` with no
#    warning (skipped with a message where systemd-analyze is absent);
#  - the Dockerfile's COPY sources exist and it runs the README's build.
. "$(dirname "$0")/lib.sh"
M=$KS_SRC/models/kjv-mini.gguf
command -v python3 >/dev/null || skip "python3 is absent"

# ---- serve --config, --log-format json, sd_notify
cat >"$TMPD/kvseal.conf" <<'EOF'
# overridden on the command line by start_server's --host/--port
host = 203.0.113.7
port = 1
alias = cfg-model
alias = "cfg model two"
ctx = 256
kv-pages = 64
no-prefix-cache = true
EOF
notify=no
if "$KS_BIN" --version | grep -q '^sd_notify: yes'; then
    notify=yes
    python3 - "$TMPD/notify.sock" "$TMPD/notify.log" <<'EOF' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
with open(sys.argv[2], "a", buffering=1) as out:
    while True:
        out.write(s.recv(4096).decode().replace("\n", "|") + "\n")
EOF
    wait_for "the notify socket" test -S "$TMPD/notify.sock"
    export NOTIFY_SOCKET=$TMPD/notify.sock
else
    echo "sd_notify part skipped: this build has no libsystemd (kvseal --version)" >&2
fi
start_server "$TMPD/serve.log" --config "$TMPD/kvseal.conf" -m "$M" --log-format json
unset NOTIFY_SOCKET
req "models" 200 "$KS_URL/v1/models"
expect_has "the file's first alias" "$BODY" '"id":"cfg-model"'
expect_has "the file's quoted alias" "$BODY" '"id":"cfg model two"'
req "completion" 200 "$KS_URL/v1/completions" -H 'content-type: application/json' \
    -d '{"model":"cfg-model","prompt":"In the beginning","max_tokens":8,"temperature":0}'
expect_has "completion text" "$BODY" '"text":"'
"$KS_BIN" check --config "$TMPD/kvseal.conf" -m "$M" >"$TMPD/check.out" 2>/dev/null ||
    fail "check --config: $(cat "$TMPD/check.out")"
expect_has "the file's kv-pages and ctx" "$(cat "$TMPD/check.out")" "64 pages x 16 tokens"
if [ $notify = yes ]; then
    wait_for "READY=1" file_has "$TMPD/notify.log" "READY=1"
    expect_has "status" "$(cat "$TMPD/notify.log")" "STATUS=serving kjv-mini on http://127.0.0.1:"
fi
stop_server
if [ $notify = yes ]; then
    wait_for "STOPPING=1" file_has "$TMPD/notify.log" "STOPPING=1"
    python3 - "$TMPD/notify.log" <<'EOF' || fail "notify order: $(cat "$TMPD/notify.log")"
import sys
lines = open(sys.argv[1]).read().splitlines()
ready = [i for i, l in enumerate(lines) if "READY=1" in l]
stop = [i for i, l in enumerate(lines) if "STOPPING=1" in l]
assert len(ready) == 1 and len(stop) == 1 and ready[0] < stop[0], lines
EOF
fi
python3 - "$TMPD/serve.log" "${KS_URL##*:}" <<'EOF' || fail "serve's --log-format json log"
import json, re, sys
lines = [l for l in open(sys.argv[1]).read().splitlines() if l.strip()]
assert len(lines) >= 3, lines
ts = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
for l in lines:
    o = json.loads(l)
    assert ts.match(o["ts"]), l
    assert o["level"] in ("debug", "info", "warn", "error"), l
    assert isinstance(o["msg"], str), l
serving = [json.loads(l) for l in lines if json.loads(l)["msg"].startswith("serving ")]
assert len(serving) == 1, lines
# the call's fields: the port bound (the command line's 0 overrode the file's 1)
s = serving[0]
assert s["port"] == int(sys.argv[2]) and s["host"] == "127.0.0.1" and s["name"] == "cfg-model", s
assert s["n_ctx"] == 256 and s["kv_pages"] == 64, s
EOF
# text logs carry the same timestamp
"$KS_BIN" check -m "$M" --kv-pages 64 --ctx 256 2>"$TMPD/check.err" >/dev/null || fail "check"
grep -qE '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z kvseal info: ' \
    "$TMPD/check.err" || fail "text log lines lack the timestamp: $(head -3 "$TMPD/check.err")"
# a config file's error names the file, the line and the key, and exits 2
printf 'port = 0\nbogus-key = 1\n' >"$TMPD/bad.conf"
"$KS_BIN" serve --config "$TMPD/bad.conf" 2>"$TMPD/bad.err" && fail "a bad config file was accepted"
expect_eq "bad config: status" "$?" 2
expect_has "bad config: message" "$(cat "$TMPD/bad.err")" "$TMPD/bad.conf:2: unknown key 'bogus-key'"

# ---- --version: CMakeLists.txt's project VERSION, first
want=$(sed -n 's/^project(kvseal VERSION \([0-9.]*\).*/\1/p' "$KS_SRC/CMakeLists.txt")
[ -n "$want" ] || fail "no project VERSION in CMakeLists.txt"
ver=$("$KS_BIN" --version) || fail "kvseal --version"
re_ver="^kvseal ${want//./\\.}( \\(git [^)]+\\))?\$"
[[ $(echo "$ver" | head -n 1) =~ $re_ver ]] || fail "--version: [$ver], want $want"
expect_eq "kvseal version = --version" "$("$KS_BIN" version)" "$ver"
expect_has "--version kernels" "$ver" "kernels: "
expect_has "--version attention" "$ver" "attention: f32"
# an unknown attention precision is refused by name, before any model loads
KS_ATTN=fp8 "$KS_BIN" run -m "$M" -p hi -n 2 >/dev/null 2>"$TMPD/attn.err"
expect_eq "KS_ATTN=fp8: status" "$?" 1
expect_has "KS_ATTN=fp8: message" "$(cat "$TMPD/attn.err")" "unknown KS_ATTN 'fp8'; want f32 or bf16"

# ---- perplexity's final line, on the head of the README (always present)
head -c 12000 "$KS_SRC/README.md" >"$TMPD/text.txt"
out=$("$KS_BIN" perplexity -m "$M" --file="$TMPD/text.txt" -c 128 2>"$TMPD/ppl.err") ||
    fail "perplexity: $(cat "$TMPD/ppl.err")"
ppl=$(echo "$out" | sed -n 's/^perplexity: //p')
last=$(echo "$out" | tail -n 1)
re_final='^Final estimate: PPL = ([0-9]+\.[0-9]{4}) \+/- ([0-9]+\.[0-9]{5})$'
[[ $last =~ $re_final ]] ||
    fail "the last line is not llama.cpp's final estimate: [$last]"
expect_eq "final estimate = perplexity line" "${BASH_REMATCH[1]}" "$ppl"
awk -v p="$ppl" -v e="${BASH_REMATCH[2]}" 'BEGIN { exit !(e > 0 && e < p) }' ||
    fail "implausible +/- $e for PPL $ppl"

# ---- bench -o json / md
"$KS_BIN" bench -m "$M" -p 32 -n 8 -r 3 -t 2 -o json >"$TMPD/bench.json" 2>"$TMPD/bench.err" ||
    fail "bench -o json: $(cat "$TMPD/bench.err")"
python3 - "$TMPD/bench.json" <<'EOF' || fail "bench -o json: $(cat "$TMPD/bench.json")"
import json, statistics, sys
tests = json.load(open(sys.argv[1]))
assert [t["test"] for t in tests] == ["pp32", "tg8"], tests
for t in tests:
    s = t["samples_ts"]
    assert len(s) == 3 and t["repetitions"] == 3 and len(t["samples_ns"]) == 3
    assert abs(t["avg_ts"] - statistics.mean(s)) <= 1e-6 * t["avg_ts"], t
    assert abs(t["stddev_ts"] - statistics.stdev(s)) <= 1e-6 * t["avg_ts"] + 1e-9, t
    assert t["avg_ts"] > 0 and t["n_threads"] == 2 and t["model_type"] == "llama"
assert tests[1]["roofline_ts"] > 0 and tests[1]["membw_peak_gbs"] > 0
EOF
# text: one probe pass after every 16 generated tokens (20 tokens: two), the
# roofline from those passes and from the best pass before generation
"$KS_BIN" bench -m "$M" -p 16 -n 20 -t 2 >"$TMPD/bench.txt" 2>"$TMPD/bench.err" ||
    fail "bench: $(cat "$TMPD/bench.err")"
grep -qE '^memory read bandwidth: [0-9.]+ GB/s \(2 passes between stretches of generation; best pass before it [0-9.]+ GB/s\)$' \
    "$TMPD/bench.txt" || fail "bench bandwidth line: $(cat "$TMPD/bench.txt")"
grep -qE '^tg / roofline: [0-9.]+$' "$TMPD/bench.txt" || fail "bench roofline line: $(cat "$TMPD/bench.txt")"
grep -qE '^probe loops \(GB/s, [^)]*\): plain ([0-9.]+|-) prefetch ([0-9.]+|-) two streams ([0-9.]+|-)$' \
    "$TMPD/bench.txt" || fail "bench probe loops line: $(cat "$TMPD/bench.txt")"
grep -qE '^tg / best-pass roofline: [0-9.]+$' "$TMPD/bench.txt" ||
    fail "bench best-pass line: $(cat "$TMPD/bench.txt")"
"$KS_BIN" bench -m "$M" -p 16 -n 4 -r 2 -t 2 -o md >"$TMPD/bench.md" 2>/dev/null || fail "bench -o md"
expect_eq "md header" "$(head -n 1 "$TMPD/bench.md")" "| model | size | arch | kernels | threads | type_kv | test | t/s |"
grep -qE '^\| kjv-mini\.gguf \| .* \| pp16 \| [0-9.]+ ± [0-9.]+ \|$' "$TMPD/bench.md" || fail "md pp row: $(cat "$TMPD/bench.md")"
grep -qE '^\| kjv-mini\.gguf \| .* \| tg4 \| [0-9.]+ ± [0-9.]+ \|$' "$TMPD/bench.md" || fail "md tg row: $(cat "$TMPD/bench.md")"

# ---- bench on a mixture of experts: the bytes a token reads and a prompt's
# ops count only the experts it runs (2 of 8), checked against the tensor
# list; the prompt's fraction of the int8 (VNNI) peak where the CPU has one
VOCAB=$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf
if [ -f "$VOCAB" ]; then
    "$KS_BIN" mkmodel -o "$TMPD/moe.gguf" --vocab "$VOCAB" --arch qwen3moe -t 2 >/dev/null ||
        fail "mkmodel qwen3moe"
    "$KS_BIN" inspect "$TMPD/moe.gguf" >"$TMPD/moe.inspect" || fail "inspect qwen3moe"
    "$KS_BIN" bench -m "$TMPD/moe.gguf" -p 24 -n 4 -r 1 -t 2 -o json >"$TMPD/moe.json" \
        2>"$TMPD/bench.err" || fail "bench qwen3moe: $(cat "$TMPD/bench.err")"
    vnni=0
    grep -qw avx512_vnni /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && vnni=1
    python3 - "$TMPD/moe.inspect" "$TMPD/moe.json" $vnni <<'EOF' || fail "bench MoE counts"
import json, re, sys
kv, w = {}, {}
for line in open(sys.argv[1]):
    m = re.match(r"\s+qwen3moe\.([\w.]+)\s+\w+\s+= (\d+)$", line)
    if m: kv[m[1]] = int(m[2])
    m = re.match(r"\s+(\S+\.weight)\s+\w+\s+\[([\d, ]+)\]\s+\d+\s+(\d+)$", line)
    if m: w[m[1]] = ([int(x) for x in m[2].split(",")], int(m[3]))
X, K, T = kv["expert_count"], kv["expert_used_count"], 24
P = B = 0
for name, (shape, nbytes) in w.items():
    if not name.startswith("blk.") or len(shape) < 2: continue
    f = K / X if name.endswith("_exps.weight") else 1  # the used experts only
    P += shape[0] * shape[1] * (shape[2] if len(shape) > 2 else 1) * f
    B += nbytes * f
E, V = w["token_embd.weight"][0]
B += w["token_embd.weight"][1] / V + w["output.weight"][1]
H, L = kv["attention.head_count"], kv["block_count"]
D = kv.get("attention.key_length", E // H)
ops = 2 * P * T + 2 * V * E + 2 * L * H * 2 * D * T * (T + 1) / 2
t = json.load(open(sys.argv[2]))
assert t[0]["model_size"] == B, (t[0]["model_size"], B)
assert abs(t[0]["ops"] - ops) <= 1e-9 * ops, (t[0]["ops"], ops)
if sys.argv[3] == "1":
    assert t[0]["int8_peak_gops"] > 1 and 0 < t[0]["peak_fraction"] < 1, t[0]
EOF
    "$KS_BIN" bench -m "$TMPD/moe.gguf" -p 16 -n 4 -t 2 >"$TMPD/moe.txt" 2>/dev/null ||
        fail "bench qwen3moe text"
    grep -qE '^pp16 / int8 peak: ([0-9.]+ \(.*GOP/s on 2 threads\)|not measured \(no AVX512-VNNI\))$' \
        "$TMPD/moe.txt" || fail "bench peak line: $(cat "$TMPD/moe.txt")"
fi

# ---- the systemd unit
if command -v systemd-analyze >/dev/null; then
    # verify wants ExecStart's binary to exist: point it at this build's
    sed "s|/usr/local/bin/kvseal|$KS_BIN|" "$KS_SRC/packaging/kvseal.service" >"$TMPD/kvseal.service"
    systemd-analyze verify "$TMPD/kvseal.service" >"$TMPD/verify.out" 2>&1 ||
        fail "systemd-analyze verify: $(cat "$TMPD/verify.out")"
    [ ! -s "$TMPD/verify.out" ] || fail "systemd-analyze verify warns: $(cat "$TMPD/verify.out")"
    grep -q '^Type=notify$' "$KS_SRC/packaging/kvseal.service" || fail "the unit is not Type=notify"
else
    echo "systemd unit part skipped: systemd-analyze is absent" >&2
fi

# ---- the Dockerfile (docker cannot run here): its COPY sources exist, it
# builds the README's way, runs unprivileged, checks /health, serves
# (continuation lines joined, so an instruction is one line)
sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$KS_SRC/Dockerfile" >"$TMPD/Dockerfile"
D=$TMPD/Dockerfile
while read -r src; do
    [ -e "$KS_SRC/$src" ] || fail "Dockerfile COPY source '$src' does not exist"
done < <(grep -E '^COPY ' "$D" | grep -v -- '--from=' | awk '{print $2}')
build_cmd=$(sed -n 's/^scripts\/install-deps.sh && \(make\) && .*/scripts\/install-deps.sh \&\& \1/p' "$KS_SRC/README.md" | head -1)
[ -n "$build_cmd" ] || fail "the README's build command was not found"
grep -qF "RUN $build_cmd" "$D" || fail "the Dockerfile does not run the README's build ($build_cmd)"
grep -qE '^FROM debian:bookworm' "$D" || fail "the Dockerfile is not on Debian bookworm"
grep -qE '^USER [a-z]' "$D" && ! grep -qE '^USER (root|0)$' "$D" || fail "the Dockerfile runs as root"
grep -qE '^HEALTHCHECK .*/health' "$D" || fail "no HEALTHCHECK on /health"
grep -qE '^EXPOSE 8080' "$D" || fail "no EXPOSE 8080"
grep -qE '^ENTRYPOINT \[.*"serve"' "$D" || fail "the ENTRYPOINT is not kvseal serve"
echo "cli ops ok"
