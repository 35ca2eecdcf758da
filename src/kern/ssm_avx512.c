/* ssm_avx512.c — the Gated DeltaNet recurrence and the Mamba2 scan step for AVX-512F
 * (the contracts: kern.h gdn_step, kern_ssm.h; the reference: ssm_ref.c). */
#include "kern/kern_int.h"
#include "kern/ssm_int.h"

#include <immintrin.h>

/* Matches kern__gdn_step_ref within f32 rounding of its two dot products
 * (16 lanes, one accumulator per row, fixed order; S a multiple of 16).
 * Two rows per iteration, so the two rows' reductions overlap. */
void kern__a512_gdn_step(int S, float *const *rows, const float *q, const float *k,
                         const float *v, float decay, float beta, float *out) {
    const __m512 dv = _mm512_set1_ps(decay);
    int j = 0;
    for (; j + 2 <= S; j += 2) {
        float *r0 = rows[j], *r1 = rows[j + 1];
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (int i = 0; i < S; i += 16) {
            const __m512 kk = _mm512_loadu_ps(k + i);
            __m512 x0 = _mm512_mul_ps(_mm512_loadu_ps(r0 + i), dv);
            __m512 x1 = _mm512_mul_ps(_mm512_loadu_ps(r1 + i), dv);
            _mm512_storeu_ps(r0 + i, x0);
            _mm512_storeu_ps(r1 + i, x1);
            a0 = _mm512_fmadd_ps(x0, kk, a0);
            a1 = _mm512_fmadd_ps(x1, kk, a1);
        }
        const __m512 d0 = _mm512_set1_ps((v[j] - _mm512_reduce_add_ps(a0)) * beta);
        const __m512 d1 = _mm512_set1_ps((v[j + 1] - _mm512_reduce_add_ps(a1)) * beta);
        a0 = a1 = _mm512_setzero_ps();
        for (int i = 0; i < S; i += 16) {
            const __m512 kk = _mm512_loadu_ps(k + i), qq = _mm512_loadu_ps(q + i);
            __m512 x0 = _mm512_fmadd_ps(kk, d0, _mm512_loadu_ps(r0 + i));
            __m512 x1 = _mm512_fmadd_ps(kk, d1, _mm512_loadu_ps(r1 + i));
            _mm512_storeu_ps(r0 + i, x0);
            _mm512_storeu_ps(r1 + i, x1);
            a0 = _mm512_fmadd_ps(x0, qq, a0);
            a1 = _mm512_fmadd_ps(x1, qq, a1);
        }
        out[j] = _mm512_reduce_add_ps(a0);
        out[j + 1] = _mm512_reduce_add_ps(a1);
    }
    for (; j < S; j++) { // odd S: never for a multiple of 16, kept for the contract
        float *r = rows[j];
        __m512 a = _mm512_setzero_ps();
        for (int i = 0; i < S; i += 16) {
            __m512 x = _mm512_mul_ps(_mm512_loadu_ps(r + i), dv);
            _mm512_storeu_ps(r + i, x);
            a = _mm512_fmadd_ps(x, _mm512_loadu_ps(k + i), a);
        }
        const __m512 d = _mm512_set1_ps((v[j] - _mm512_reduce_add_ps(a)) * beta);
        a = _mm512_setzero_ps();
        for (int i = 0; i < S; i += 16) {
            __m512 x = _mm512_fmadd_ps(_mm512_loadu_ps(k + i), d, _mm512_loadu_ps(r + i));
            _mm512_storeu_ps(r + i, x);
            a = _mm512_fmadd_ps(x, _mm512_loadu_ps(q + i), a);
        }
        out[j] = _mm512_reduce_add_ps(a);
    }
}

/* Matches kern__ssm_scan_ref within f32 rounding of its dot product (16
 * lanes, one accumulator per row, fixed order; N a multiple of 16); the
 * state update is the reference's bits. Two rows per iteration, so their
 * reductions overlap. */
void kern__a512_ssm_scan(int N, int P, float *const *rows, const float *x, const float *B,
                         const float *C, float dA, float dt, float *y) {
    const __m512 da = _mm512_set1_ps(dA);
    int i = 0;
    for (; i + 2 <= P; i += 2) {
        float *r0 = rows[i], *r1 = rows[i + 1];
        const __m512 xd0 = _mm512_set1_ps(x[i] * dt), xd1 = _mm512_set1_ps(x[i + 1] * dt);
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (int j = 0; j < N; j += 16) {
            const __m512 bb = _mm512_loadu_ps(B + j), cc = _mm512_loadu_ps(C + j);
            __m512 s0 = _mm512_fmadd_ps(bb, xd0, _mm512_mul_ps(_mm512_loadu_ps(r0 + j), da));
            __m512 s1 = _mm512_fmadd_ps(bb, xd1, _mm512_mul_ps(_mm512_loadu_ps(r1 + j), da));
            _mm512_storeu_ps(r0 + j, s0);
            _mm512_storeu_ps(r1 + j, s1);
            a0 = _mm512_fmadd_ps(s0, cc, a0);
            a1 = _mm512_fmadd_ps(s1, cc, a1);
        }
        y[i] = _mm512_reduce_add_ps(a0);
        y[i + 1] = _mm512_reduce_add_ps(a1);
    }
    for (; i < P; i++) { // odd P
        float *r = rows[i];
        const __m512 xd = _mm512_set1_ps(x[i] * dt);
        __m512 a = _mm512_setzero_ps();
        for (int j = 0; j < N; j += 16) {
            __m512 s = _mm512_fmadd_ps(_mm512_loadu_ps(B + j), xd,
                                       _mm512_mul_ps(_mm512_loadu_ps(r + j), da));
            _mm512_storeu_ps(r + j, s);
            a = _mm512_fmadd_ps(s, _mm512_loadu_ps(C + j), a);
        }
        y[i] = _mm512_reduce_add_ps(a);
    }
}
