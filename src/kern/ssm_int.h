/* ssm_int.h — the Mamba2 scan step's implementations (kern_ssm.h states the
 * contract): the reference in ssm_ref.c, the SIMD ones in ssm_avx2.c and
 * ssm_avx512.c. Private to kern/ and its tests. */
#ifndef KS_KERN_SSM_INT_H
#define KS_KERN_SSM_INT_H

#include "kvseal/kern_ssm.h"

/* The reference step (kern_ssm.h kern_ssm_scan_fn), its dot products in double. */
void kern__ssm_scan_ref(int N, int P, float *const *rows, const float *x, const float *B,
                        const float *C, float dA, float dt, float *y);
/* The AVX2 + FMA step (N a multiple of 16). */
void kern__avx2_ssm_scan(int N, int P, float *const *rows, const float *x, const float *B,
                         const float *C, float dA, float dt, float *y);
/* The AVX-512F step (N a multiple of 16). */
void kern__a512_ssm_scan(int N, int P, float *const *rows, const float *x, const float *B,
                         const float *C, float dA, float dt, float *y);

#endif
