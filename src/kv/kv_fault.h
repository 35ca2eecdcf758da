/* kv_fault.h — TEST ONLY: the kv fault injector for the leak suite (I9).
 *
 * Not part of the public API (include/kvseal/kv.h): it exists only in
 * KS_TEST_FAULTS builds (CMake -DKS_TEST_FAULTS=ON, or any KS_BROKEN
 * variant), where the engine's KS_FAULT=swap_page and tests/unit/test_kv.c
 * use it. Defined in pool.c. */
#ifndef KS_KV_FAULT_H
#define KS_KV_FAULT_H

#include "kvseal/kv.h"

#ifdef KS_TEST_FAULTS
/* Test-only fault injector: points entry `idx` of victim at the page of
 * entry `idx` of other, keeping victim's expected tag — what a corrupted
 * block table looks like. The tag check must catch the read. */
void kv_fault_swap_entry(kv_seq *victim, const kv_seq *other, uint32_t idx);
/* The same for recurrent-state page idx (both sequences hold their state). */
void kv_fault_swap_state(kv_seq *victim, const kv_seq *other, uint32_t idx);
#endif

#endif /* KS_KV_FAULT_H */
