#!/usr/bin/env bash
# test_template_oracle.sh — kvseal's Jinja engine against Python's jinja2 set
# up as Hugging Face renders chat templates (tests/e2e/jinja_oracle.py): every
# template in $KS_SHARED/templates and tests/e2e/templates, for a fixed set
# of conversations (system, multi-turn, tools, assistant tool calls with
# null content, tool results, generation prompt on and off, thinking on and
# off), must render byte-identical through `kvseal template`, or fail on
# both sides.
# KS_ORACLE_ONLY=TEXT keeps the templates whose file name contains TEXT.
. "$(dirname "$0")/lib.sh"
[ -d "$KS_SHARED/templates" ] || skip "no $KS_SHARED/templates (the shared chat templates)"
PY=
for p in python3 /usr/bin/python3; do
    command -v "$p" >/dev/null && "$p" -c 'import jinja2' 2>/dev/null && { PY=$p; break; }
done
[ -n "$PY" ] || skip "no python3 with jinja2 (Debian: python3-jinja2, scripts/install-deps.sh)"
"$PY" "$(dirname "$0")/jinja_oracle.py" "$KS_BIN" "$KS_SHARED/templates" "${KS_ORACLE_ONLY:-}"
rc=$?
[ $rc -eq 77 ] && skip "the oracle skipped"
[ $rc -eq 0 ] || fail "kvseal's renderings differ from jinja2's (above)"
# and the templates kept with the tests (those the shared collection lacks)
"$PY" "$(dirname "$0")/jinja_oracle.py" "$KS_BIN" "$(dirname "$0")/templates" \
    "${KS_ORACLE_ONLY:-}" ||
    fail "kvseal's renderings of tests/e2e/templates differ from jinja2's (above)"
echo "PASS"
