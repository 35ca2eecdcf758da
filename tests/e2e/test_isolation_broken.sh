#!/usr/bin/env bash
# I9: the leak suite must catch every deliberately broken build. Each variant
# is built from this tree with one safeguard switched off (-DKS_BROKEN=...,
# a test-only option that is off in every normal build) and must make the
# suite FAIL (exit 1). The fault injector (-DKS_TEST_FAULTS=ON, KS_FAULT=
# swap_page) points one block-table entry at another live sequence's page:
# with the tag check on, exactly that request fails cleanly and the violation
# counter reads 1 (suite passes); with the check off (no_tag_check) the other
# tenant's KV reaches the output and the suite fails.
. "$(dirname "$0")/lib.sh"
command -v node >/dev/null || skip "node is not installed"
# the variants are Release builds of their own: once per CI run is enough
[ -z "${KS_SANITIZE:-}" ] || skip "broken-build variants run in the Release suite, not under $KS_SANITIZE"
: "${KS_BUILD:?}"
here=$(dirname "$0")

expect() {  # expect WANT_RC NAME ENV... : runs the suite on build NAME
    local want=$1 name=$2; shift 2
    echo "== $name: expecting the leak suite to $([ "$want" = 0 ] && echo pass || echo FAIL)" >&2
    env "$@" KS_SERVE_BIN="$KS_BUILD/isolation-$name/kvseal" bash "$here/leak_run.sh" >"$TMPD/$name.log" 2>&1
    local rc=$?
    grep -E "LEAK SUITE FAILURE|leak suite:|SECURITY" "$TMPD/$name.log" | head -8 >&2
    [ "$rc" = "$want" ] || { tail -40 "$TMPD/$name.log" >&2; fail "$name: leak suite exited $rc, expected $want"; }
}

for v in faults no_scrub no_tag_check placeholder shared_prefix adapter_shared_prefix \
    adapter_any_tenant; do  # built by build_variants.sh
    [ -x "$KS_BUILD/isolation-$v/kvseal" ] || fail "variant $v missing (the build_variants fixture failed)"
done

expect 0 faults KS_FAULT=swap_page LEAK_EXPECT_VIOLATION=1
expect 1 no_tag_check KS_FAULT=swap_page LEAK_EXPECT_VIOLATION=1
# LoRA adapters (the suite uploads one adapter named "ft" for each of two
# tenants): with prefixes shared between adapters, a request with an adapter
# reuses KV its tenant computed without one; with the owner check off, a
# third tenant guessing "ft" runs another tenant's adapter.
expect 1 adapter_shared_prefix
expect 1 adapter_any_tenant
# DeepSeek sparse attention: the indexer scores positions and attention
# reads only its picks, both through the page table the tag check resolved,
# so the swapped entry fails its request there too; without the check the
# other tenant's latent rows (and indexer keys) reach the output.
VOCAB=$KS_SHARED/vocab/ggml-vocab-llama-spm.gguf
if [ -e "$VOCAB" ]; then
    "$KS_BIN" mkmodel -o "$TMPD/dsa.gguf" --vocab "$VOCAB" --arch deepseek32 --seed 7 >/dev/null ||
        fail "mkmodel deepseek32"
    expect 0 faults KS_FAULT=swap_page LEAK_EXPECT_VIOLATION=1 LEAK_MODEL_FILE="$TMPD/dsa.gguf"
    expect 1 no_tag_check KS_FAULT=swap_page LEAK_EXPECT_VIOLATION=1 LEAK_MODEL_FILE="$TMPD/dsa.gguf"
else
    echo "(no $VOCAB: the sparse-attention model's runs are left out)" >&2
fi
# A hybrid recurrent model (qwen35, made here with the kjv-mini vocabulary):
# each sequence's recurrent state lives in its own state pages. The injector
# points one decoding request's last state entry at another's state page:
# with the tag check that request fails cleanly (one violation); without
# it, it decodes from the other tenant's state and its output is wrong. The
# no-scrub build leaves a finished request's state in its freed pages, and
# the next request starts from it instead of from zero. With one root for
# every tenant (shared_prefix) a tenant resumes from another's cached prompt
# and its state snapshot.
"$KS_BIN" mkmodel -o "$TMPD/q35.gguf" --vocab "$KS_SRC/models/kjv-mini.gguf" --arch qwen35 \
    --n-layer 8 --seed 7 >/dev/null || fail "mkmodel qwen35"
Q35=(LEAK_MODEL_FILE="$TMPD/q35.gguf" LEAK_KV_PAGES=128)
expect 0 faults KS_FAULT=swap_state LEAK_EXPECT_VIOLATION=1 "${Q35[@]}"
expect 1 no_tag_check KS_FAULT=swap_state LEAK_EXPECT_VIOLATION=1 "${Q35[@]}"
expect 1 no_scrub "${Q35[@]}"
expect 1 shared_prefix "${Q35[@]}"
expect 1 no_scrub
expect 1 placeholder
expect 1 shared_prefix
# speculative decoding: drafts are positions of the request's own pages,
# written and read through the same tag check and scrubbed like any row, so
# with speculation on the suite passes on the fault build and catches the
# broken ones as without it. A draft source shared across requests (the
# spec_shared build) changes no output but opens a timing channel: how many
# of one tenant's drafts are kept moves with another tenant's text.
SPEC=(LEAK_SERVE_ARGS="--spec-tokens 4")
expect 0 faults KS_FAULT=swap_page LEAK_EXPECT_VIOLATION=1 LEAK_EXPECT_SPEC=1 "${SPEC[@]}"
expect 1 no_tag_check KS_FAULT=swap_page LEAK_EXPECT_VIOLATION=1 "${SPEC[@]}"
expect 1 no_scrub "${SPEC[@]}"
[ -x "$KS_BUILD/isolation-spec_shared/kvseal" ] || fail "variant spec_shared missing"
KS_SERVE_BIN="$KS_BUILD/isolation-faults/kvseal" bash "$here/spec_channel_run.sh" \
    >"$TMPD/channel-ok.log" 2>&1 || { cat "$TMPD/channel-ok.log" >&2; fail "spec channel on the fault build"; }
KS_SERVE_BIN="$KS_BUILD/isolation-spec_shared/kvseal" bash "$here/spec_channel_run.sh" \
    >"$TMPD/channel.log" 2>&1 && { cat "$TMPD/channel.log" >&2; fail "spec_shared: the channel was not caught"; }
grep -E "SPEC CHANNEL|tenant a kept" "$TMPD/channel.log" >&2
# A draft model keeps its rows in a pool of its own, read through the same
# tag check (spec_draft_fault_run.sh: the injector points one request's
# first draft page at another tenant's request's): the fault build refuses
# the read, the no_tag_check build lets that request draft from the other
# tenant's rows (a timing channel: its answer stays right).
KS_SERVE_BIN="$KS_BUILD/isolation-faults/kvseal" bash "$here/spec_draft_fault_run.sh" \
    >"$TMPD/draft-ok.log" 2>&1 || { cat "$TMPD/draft-ok.log" >&2; fail "draft pool on the fault build"; }
KS_SERVE_BIN="$KS_BUILD/isolation-no_tag_check/kvseal" bash "$here/spec_draft_fault_run.sh" \
    >"$TMPD/draft.log" 2>&1 && { cat "$TMPD/draft.log" >&2; fail "no_tag_check: the draft pool read was not caught"; }
grep -E "DRAFT POOL" "$TMPD/draft.log" >&2 || { cat "$TMPD/draft.log" >&2; fail "no_tag_check: the draft run failed otherwise"; }
# disaggregated: the same suite against router + 2 prefill + 2 decode
expect 1 placeholder LEAK_DISAGG=1
expect 1 shared_prefix LEAK_DISAGG=1  # the prefill workers' prefix cache (I7)
echo "isolation: every broken build was caught"
