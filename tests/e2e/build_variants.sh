#!/usr/bin/env bash
# build_variants.sh — CTest fixture: builds the test-only variants of kvseal
# once per suite run, into $KS_BUILD/isolation-NAME/kvseal:
#   faults                    -DKS_TEST_FAULTS=ON (fault injectors)
#   no_scrub, no_tag_check,   -DKS_BROKEN=NAME: one isolation safeguard off
#   placeholder, shared_prefix
#   free_before_quiesce,      -DKS_BROKEN=NAME -DKS_TEST_FAULTS=ON: a decode-side
#   no_coverage               safeguard off, with the injectors that expose it
# Used by test_isolation_broken.sh and test_cluster_faults.sh (I9). Release
# suite only: under sanitizers the variants are not built (those tests skip).
. "$(dirname "$0")/lib.sh"
[ -z "${KS_SANITIZE:-}" ] || skip "variants are built by the Release suite only"
: "${KS_BUILD:?}"
build_variant() {  # build_variant NAME CMAKE-ARGS... -> $KS_BUILD/isolation-NAME/kvseal
    local dir=$KS_BUILD/isolation-$1; shift
    cmake -S "$KS_SRC" -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >"$dir.cmake.log" 2>&1 &&
        cmake --build "$dir" --target kvseal -j2 >"$dir.build.log" 2>&1 ||
        { tail -30 "$dir.build.log" >&2; fail "building $dir failed"; }
}
build_variant faults -DKS_TEST_FAULTS=ON
for v in no_scrub no_tag_check placeholder shared_prefix; do build_variant $v -DKS_BROKEN=$v; done
for v in free_before_quiesce no_coverage; do build_variant $v -DKS_BROKEN=$v -DKS_TEST_FAULTS=ON; done
echo "variants built"
