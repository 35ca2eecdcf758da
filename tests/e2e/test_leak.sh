#!/usr/bin/env bash
# The leak suite against the normal build: must pass, on kjv-mini and on a
# hybrid recurrent model (qwen35: each sequence's recurrent state in its own
# state pages; the prefix cache resumes a tenant's prompt from a snapshot of
# the state, never another tenant's).
. "$(dirname "$0")/lib.sh"
bash "$(dirname "$0")/leak_run.sh" || exit $? # 77: skipped (no node)
"$KS_BIN" mkmodel -o "$TMPD/q35.gguf" --vocab "$KS_SRC/models/kjv-mini.gguf" --arch qwen35 \
    --n-layer 8 --seed 7 >/dev/null || fail "mkmodel qwen35"
LEAK_MODEL_FILE="$TMPD/q35.gguf" LEAK_KV_PAGES=128 bash "$(dirname "$0")/leak_run.sh"
