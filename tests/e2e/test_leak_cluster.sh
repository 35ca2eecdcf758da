#!/usr/bin/env bash
# The leak suite in disaggregated mode: router + 2 prefill + 2 decode workers
# (6 tenants with canaries, over-long requests, mid-stream disconnects, pools
# small enough that requests wait); every answer must equal `kvseal serve`'s
# and every page of every worker must end FREE and scrubbed. Runs under the
# sanitizers too (the fault and broken-build runs are in test_cluster_faults.sh).
# Then the same on a hybrid recurrent model (qwen35, made here with the
# kjv-mini vocabulary): each request's recurrent-state pages travel with its
# KV pages, and the prefill workers' prefix cache resumes from state snapshots.
. "$(dirname "$0")/lib.sh"
LEAK_DISAGG=1 LEAK_THREADS=1 bash "$(dirname "$0")/leak_run.sh" || exit $?
"$KS_BIN" mkmodel -o "$TMPD/q35.gguf" --vocab "$KS_SRC/models/kjv-mini.gguf" --arch qwen35 \
    --n-layer 8 --seed 7 >/dev/null || fail "mkmodel qwen35"
LEAK_DISAGG=1 LEAK_THREADS=1 LEAK_MODEL_FILE="$TMPD/q35.gguf" LEAK_KV_PAGES=128 \
    bash "$(dirname "$0")/leak_run.sh"
