/* pd_xxh.h — the frame checksum's XXH3-64 update, compiled once per vector
 * unit (xxh_avx2.c, xxh_avx512.c get their ISA flags from CMake). Every
 * variant computes the same hash as libxxhash's; wire.c's pd__xxh_update
 * picks the widest the CPU has. The state is an XXH3_state_t (void * here
 * because the inline copies of xxhash.h rename the type). */
#ifndef KS_PD_XXH_H
#define KS_PD_XXH_H

#include <stddef.h>

/* Folds n bytes at p into the XXH3 state, with AVX2 / AVX-512 code; call
 * only on a CPU that has the unit (ks_cpu_get). Can't fail. */
void pd__xxh3_update_avx2(void *state, const void *p, size_t n);
void pd__xxh3_update_avx512(void *state, const void *p, size_t n);

#endif /* KS_PD_XXH_H */
