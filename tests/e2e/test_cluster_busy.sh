#!/usr/bin/env bash
# A prefill worker whose KV cache is full of other prompts answers BUSY; the
# router places the request again after a backoff (another prefill worker
# first, when there is one) until the queue timeout, instead of answering
# 503 while the capacity frees (it did: 4 of 6 such requests got 503
# "the prefill worker's KV cache is full"). Six ~185-token prompts at once
# against a prefill pool of 16 pages (one prompt takes 12): every one
# answers 200 with the same greedy text as alone (no prefix cache: each
# reserves its own pages), the router logs the retries, and the pools end
# clean.
. "$(dirname "$0")/lib.sh"
ARGS=(-m "$KS_SRC/models/kjv-mini.gguf" --ctx 256 --kv-pages 64 --threads 1)
ROUTER_ARGS="--admin-key adm-busy-0123456789ab" PREFILL_ARGS="--kv-pages 16 --no-prefix-cache" \
    start_cluster "$TMPD/b" 1 1 "${ARGS[@]}"
P=$(printf 'In the beginning God created the heaven and the earth %.0s' $(seq 14))
body() { printf '{"model":"kjv-mini","prompt":"%s %s","max_tokens":4,"temperature":0}' "$1" "$P"; }
ref=$(curl -sS "$KS_URL/v1/completions" -H 'Content-Type: application/json' -d "$(body 0)" |
      node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).choices[0].text))')
[ -n "$ref" ] || fail "the reference request failed"
pids=()
for i in 1 2 3 4 5 6; do
    curl -sS -o "$TMPD/o$i" -w '%{http_code}' "$KS_URL/v1/completions" \
        -H 'Content-Type: application/json' -d "$(body 0)" >"$TMPD/s$i" &
    pids+=($!)
done
wait "${pids[@]}"
for i in 1 2 3 4 5 6; do
    expect_eq "request $i status ($(head -c 200 "$TMPD/o$i"))" "$(cat "$TMPD/s$i")" 200
    expect_has "request $i text" "$(cat "$TMPD/o$i")" "\"text\":$(node -e 'console.log(JSON.stringify(process.argv[1]))' "$ref")"
done
grep -q 'is busy (the prefill worker'"'"'s KV cache is full); placing it again' "$TMPD/b.router" ||
    fail "no request met a busy prefill worker: the test did not test the retry"
chk=$(curl -sS -H "Authorization: Bearer adm-busy-0123456789ab" "$KS_URL/admin/kv/check?timeout_ms=$((KS_WAIT_S * 1000))")
expect_has "pools after the retries" "$chk" '"clean":true'
stop_cluster
echo PASS
