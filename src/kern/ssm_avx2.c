/* ssm_avx2.c — the Gated DeltaNet recurrence and the Mamba2 scan step for AVX2 + FMA
 * (the contracts: kern.h gdn_step, kern_ssm.h; the reference: ssm_ref.c). */
#include "kern/kern_int.h"
#include "kern/ssm_int.h"

#include <immintrin.h>

static inline float ssm__hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Matches kern__gdn_step_ref within f32 rounding of its two dot products
 * (8 lanes x 2 accumulators, fixed order; S a multiple of 16). Rows are S
 * contiguous floats (any alignment); q, k the key head's S floats. */
void kern__avx2_gdn_step(int S, float *const *rows, const float *q, const float *k,
                         const float *v, float decay, float beta, float *out) {
    const __m256 dv = _mm256_set1_ps(decay);
    for (int j = 0; j < S; j++) {
        float *r = rows[j];
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int i = 0; i < S; i += 16) {
            __m256 x0 = _mm256_mul_ps(_mm256_loadu_ps(r + i), dv);
            __m256 x1 = _mm256_mul_ps(_mm256_loadu_ps(r + i + 8), dv);
            _mm256_storeu_ps(r + i, x0);
            _mm256_storeu_ps(r + i + 8, x1);
            a0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(k + i), a0);
            a1 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(k + i + 8), a1);
        }
        const __m256 d = _mm256_set1_ps((v[j] - ssm__hsum8(_mm256_add_ps(a0, a1))) * beta);
        a0 = a1 = _mm256_setzero_ps();
        for (int i = 0; i < S; i += 16) {
            __m256 x0 = _mm256_fmadd_ps(_mm256_loadu_ps(k + i), d, _mm256_loadu_ps(r + i));
            __m256 x1 = _mm256_fmadd_ps(_mm256_loadu_ps(k + i + 8), d, _mm256_loadu_ps(r + i + 8));
            _mm256_storeu_ps(r + i, x0);
            _mm256_storeu_ps(r + i + 8, x1);
            a0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(q + i), a0);
            a1 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(q + i + 8), a1);
        }
        out[j] = ssm__hsum8(_mm256_add_ps(a0, a1));
    }
}

/* Matches kern__ssm_scan_ref within f32 rounding of its dot product (8
 * lanes x 2 accumulators, fixed order; N a multiple of 16); the state
 * update is the reference's bits (one fma of B and x dt onto r dA). */
void kern__avx2_ssm_scan(int N, int P, float *const *rows, const float *x, const float *B,
                         const float *C, float dA, float dt, float *y) {
    const __m256 da = _mm256_set1_ps(dA);
    for (int i = 0; i < P; i++) {
        float *r = rows[i];
        const __m256 xd = _mm256_set1_ps(x[i] * dt);
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int j = 0; j < N; j += 16) {
            __m256 s0 = _mm256_fmadd_ps(_mm256_loadu_ps(B + j), xd,
                                        _mm256_mul_ps(_mm256_loadu_ps(r + j), da));
            __m256 s1 = _mm256_fmadd_ps(_mm256_loadu_ps(B + j + 8), xd,
                                        _mm256_mul_ps(_mm256_loadu_ps(r + j + 8), da));
            _mm256_storeu_ps(r + j, s0);
            _mm256_storeu_ps(r + j + 8, s1);
            a0 = _mm256_fmadd_ps(s0, _mm256_loadu_ps(C + j), a0);
            a1 = _mm256_fmadd_ps(s1, _mm256_loadu_ps(C + j + 8), a1);
        }
        y[i] = ssm__hsum8(_mm256_add_ps(a0, a1));
    }
}
