#!/usr/bin/env bash
# build_variants.sh — CTest fixture: builds the test-only variants of kvseal
# once per suite run, into $KS_BUILD/isolation-NAME/kvseal:
#   faults                    -DKS_TEST_FAULTS=ON (fault injectors)
#   no_scrub, no_tag_check,   -DKS_BROKEN=NAME: one isolation safeguard off
#   placeholder, shared_prefix
#   free_before_quiesce,      -DKS_BROKEN=NAME: a decode-side safeguard off
#   no_coverage               (every KS_BROKEN build has the fault injectors)
#   spec_shared               -DKS_BROKEN=spec_shared: speculative drafts from a table
#                             shared by every request (a timing channel)
#   adapter_shared_prefix,    -DKS_BROKEN=NAME: a LoRA safeguard off (prefixes pass
#   adapter_any_tenant        between adapters; any tenant's adapter answers its name)
# Used by test_isolation_broken.sh, test_cluster_faults.sh (I9) and
# test_cluster_catalog.sh (faults: KS_ROUTER_FAULT=mispair). Release
# suite only: under sanitizers the variants are not built (those tests skip).
. "$(dirname "$0")/lib.sh"
[ -z "${KS_SANITIZE:-}" ] || skip "variants are built by the Release suite only"
: "${KS_BUILD:?}"
# All variants share one build tree: the definitions reach only kv, pd and
# engine (CMakeLists.txt), so after the first variant each one recompiles
# those three modules and relinks, instead of building everything again.
tree=$KS_BUILD/variants
build_variant() {  # build_variant NAME CMAKE-ARGS... -> $KS_BUILD/isolation-NAME/kvseal
    local dir=$KS_BUILD/isolation-$1; shift
    mkdir -p "$dir"
    cmake -S "$KS_SRC" -B "$tree" -DCMAKE_BUILD_TYPE=Release -DKS_FUZZ_SMOKE=OFF "$@" \
        >"$dir.cmake.log" 2>&1 &&
        cmake --build "$tree" --target kvseal -j2 >"$dir.build.log" 2>&1 &&
        cp "$tree/kvseal" "$dir/kvseal" ||
        { tail -30 "$dir.build.log" >&2; fail "building $dir failed"; }
}
build_variant faults -DKS_BROKEN= -DKS_TEST_FAULTS=ON
for v in no_scrub no_tag_check placeholder shared_prefix free_before_quiesce no_coverage spec_shared \
    adapter_shared_prefix adapter_any_tenant; do
    build_variant $v -DKS_BROKEN=$v -DKS_TEST_FAULTS=ON
done
echo "variants built"
