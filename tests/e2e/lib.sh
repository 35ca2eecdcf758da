# lib.sh — helpers for the end-to-end tests (sourced). They run the real
# kvseal binary ($KS_BIN) from the build tree.
set -u
: "${KS_BIN:?KS_BIN must point at the kvseal binary}"
: "${KS_SRC:?KS_SRC must point at the source tree}"
KS_SHARED=${KS_SHARED:-$KS_SRC/../shared}
TMPD=$(mktemp -d)
trap 'rm -rf "$TMPD"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*" >&2; exit 77; }
# expect_eq WHAT GOT WANT
expect_eq() { [ "$2" == "$3" ] || fail "$1: got [$2], want [$3]"; }
# expect_has WHAT HAYSTACK NEEDLE
expect_has() { case "$2" in *"$3"*) ;; *) fail "$1: [$2] lacks [$3]";; esac; }
