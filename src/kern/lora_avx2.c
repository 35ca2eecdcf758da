/* lora_avx2.c — the batched LoRA kernels for AVX2 + FMA (the contract:
 * kern_lora.h; the reference: lora_ref.c).
 *
 * As lora_avx512.c with 8 lanes: shrink sums each U element in one
 * 8-lane accumulator along K (a masked tail last) and a fixed halving
 * tree; expand runs an fma chain over i per column, then y + scale * acc.
 * Tiles of up to 4 tokens (x 2 ranks in shrink, the 16 registers' worth).
 * The f16 variants are the same code with each factor load widened by
 * F16C (h, a constant the tiles are inlined with). */
#include "kern/kern_int.h"
#include "kern/lora_int.h"

#include <immintrin.h>
#include <string.h>

#define AVX2__INLINE static inline __attribute__((always_inline))

/* The 8 lanes summed as (l, l+4), then (l, l+2), (l, l+1). */
AVX2__INLINE float avx2__lora_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Lanes l < n set (n in 0..8). */
AVX2__INLINE __m256i avx2__lora_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 8 factor values from element o of p (f32, or binary16 widened exactly by
 * F16C when h). */
AVX2__INLINE __m256 avx2__ldf8(const void *p, size_t o, const int h) {
    if (h) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + o)));
    return _mm256_loadu_ps((const float *)p + o);
}

/* 8 factor values from element o of p (f32, or binary16 widened exactly by
 * F16C when h), lanes outside m (a prefix of lanes) zero. */
AVX2__INLINE __m256 avx2__ldf(const void *p, size_t o, __m256i m, const int h) {
    if (!h) return _mm256_maskload_ps((const float *)p + o, m);
    const uint16_t *q = (const uint16_t *)p + o;
    const int n = __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(m)));
    if (n == 8) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)q));
    uint16_t t[8] = {0};
    memcpy(t, q, sizeof *q * (size_t)n);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)t));
}

AVX2__INLINE void avx2__shrink_tile(const int nt, const int ni, int64_t K, const void *A,
                                    int32_t i, const float *const *X, float *U, int64_t ldu,
                                    const int h) {
    size_t a[2];
    const float *x[4];
    __m256 acc[4][2];
    #pragma GCC unroll 4
    for (int q = 0; q < ni; q++) a[q] = (size_t)(i + q) * (size_t)K;
    #pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        x[t] = X[t];
        #pragma GCC unroll 4
        for (int q = 0; q < ni; q++) acc[t][q] = _mm256_setzero_ps();
    }
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 av[2];
        #pragma GCC unroll 4
        for (int q = 0; q < ni; q++) av[q] = avx2__ldf8(A, a[q] + (size_t)k, h);
        #pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const __m256 xv = _mm256_loadu_ps(x[t] + k);
            #pragma GCC unroll 4
            for (int q = 0; q < ni; q++) acc[t][q] = _mm256_fmadd_ps(av[q], xv, acc[t][q]);
        }
    }
    if (k < K) {
        const __m256i m = avx2__lora_mask(K - k);
        __m256 av[2];
        #pragma GCC unroll 4
        for (int q = 0; q < ni; q++) av[q] = avx2__ldf(A, a[q] + (size_t)k, m, h);
        #pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const __m256 xv = _mm256_maskload_ps(x[t] + k, m);
            #pragma GCC unroll 4
            for (int q = 0; q < ni; q++) acc[t][q] = _mm256_fmadd_ps(av[q], xv, acc[t][q]);
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        #pragma GCC unroll 4
        for (int q = 0; q < ni; q++)
            U[(size_t)t * (size_t)ldu + (size_t)(i + q)] = avx2__lora_hsum(acc[t][q]);
    }
}

AVX2__INLINE void avx2__shrink_blk(int nt, int ni, int64_t K, const void *A, int32_t i,
                                   const float *const *X, float *U, int64_t ldu, const int h) {
    switch (nt * 8 + ni) {
    case 8 + 2: avx2__shrink_tile(1, 2, K, A, i, X, U, ldu, h); break;
    case 16 + 2: avx2__shrink_tile(2, 2, K, A, i, X, U, ldu, h); break;
    case 24 + 2: avx2__shrink_tile(3, 2, K, A, i, X, U, ldu, h); break;
    case 32 + 2: avx2__shrink_tile(4, 2, K, A, i, X, U, ldu, h); break;
    case 8 + 1: avx2__shrink_tile(1, 1, K, A, i, X, U, ldu, h); break;
    case 16 + 1: avx2__shrink_tile(2, 1, K, A, i, X, U, ldu, h); break;
    case 24 + 1: avx2__shrink_tile(3, 1, K, A, i, X, U, ldu, h); break;
    default: avx2__shrink_tile(4, 1, K, A, i, X, U, ldu, h); break;
    }
}

AVX2__INLINE void avx2__shrink(int64_t K, const void *A, int32_t i0, int32_t i1, int n,
                               const float *const *X, float *U, int64_t ldu, const int h) {
    for (int j = 0; j < n; j += 4) {
        const int nt = n - j < 4 ? n - j : 4;
        float *Uj = U + (size_t)j * (size_t)ldu;
        int32_t i = i0;
        for (; i + 2 <= i1; i += 2) avx2__shrink_blk(nt, 2, K, A, i, X + j, Uj, ldu, h);
        for (; i < i1; i++) avx2__shrink_blk(nt, 1, K, A, i, X + j, Uj, ldu, h);
    }
}

/* Y columns c .. c + 8 nv (the last vector's lanes limited by m) for nt tokens. */
AVX2__INLINE void avx2__expand_tile(const int nt, const int nv, __m256i m, int32_t r, int64_t N,
                                    const void *Bt, int64_t c, const float *U, int64_t ldu,
                                    __m256 sc, float *const *Y, const int h) {
    const __m256i all = _mm256_set1_epi32(-1);
    __m256 acc[4][2];
    #pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        #pragma GCC unroll 4
        for (int v = 0; v < nv; v++) acc[t][v] = _mm256_setzero_ps();
    }
    for (int32_t i = 0; i < r; i++) {
        const size_t b = (size_t)i * (size_t)N + (size_t)c;
        __m256 bv[2];
        #pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            bv[v] = avx2__ldf(Bt, b + 8 * (size_t)v, v == nv - 1 ? m : all, h);
        #pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const __m256 u = _mm256_broadcast_ss(U + (size_t)t * (size_t)ldu + (size_t)i);
            #pragma GCC unroll 4
            for (int v = 0; v < nv; v++) acc[t][v] = _mm256_fmadd_ps(bv[v], u, acc[t][v]);
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        #pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
            float *y = Y[t] + c + 8 * v;
            const __m256i mv = v == nv - 1 ? m : all;
            const __m256 yv = _mm256_add_ps(_mm256_maskload_ps(y, mv), _mm256_mul_ps(sc, acc[t][v]));
            _mm256_maskstore_ps(y, mv, yv);
        }
    }
}

AVX2__INLINE void avx2__expand_blk(int nt, int nv, __m256i m, int32_t r, int64_t N, const void *Bt,
                                   int64_t c, const float *U, int64_t ldu, __m256 sc,
                                   float *const *Y, const int h) {
    switch (nt * 8 + nv) {
    case 8 + 2: avx2__expand_tile(1, 2, m, r, N, Bt, c, U, ldu, sc, Y, h); break;
    case 16 + 2: avx2__expand_tile(2, 2, m, r, N, Bt, c, U, ldu, sc, Y, h); break;
    case 24 + 2: avx2__expand_tile(3, 2, m, r, N, Bt, c, U, ldu, sc, Y, h); break;
    case 32 + 2: avx2__expand_tile(4, 2, m, r, N, Bt, c, U, ldu, sc, Y, h); break;
    case 8 + 1: avx2__expand_tile(1, 1, m, r, N, Bt, c, U, ldu, sc, Y, h); break;
    case 16 + 1: avx2__expand_tile(2, 1, m, r, N, Bt, c, U, ldu, sc, Y, h); break;
    case 24 + 1: avx2__expand_tile(3, 1, m, r, N, Bt, c, U, ldu, sc, Y, h); break;
    default: avx2__expand_tile(4, 1, m, r, N, Bt, c, U, ldu, sc, Y, h); break;
    }
}

AVX2__INLINE void avx2__expand(int32_t r, int64_t N, const void *Bt, int64_t c0, int64_t c1, int n,
                               const float *U, int64_t ldu, float scale, float *const *Y,
                               const int h) {
    const __m256 sc = _mm256_set1_ps(scale);
    const __m256i all = _mm256_set1_epi32(-1);
    for (int j = 0; j < n; j += 4) {
        const int nt = n - j < 4 ? n - j : 4;
        const float *Uj = U + (size_t)j * (size_t)ldu;
        int64_t c = c0;
        for (; c + 16 <= c1; c += 16)
            avx2__expand_blk(nt, 2, all, r, N, Bt, c, Uj, ldu, sc, Y + j, h);
        for (; c < c1; c += 8) {
            const int64_t rem = c1 - c;
            avx2__expand_blk(nt, 1, rem >= 8 ? all : avx2__lora_mask(rem), r, N, Bt, c, Uj, ldu, sc,
                             Y + j, h);
        }
    }
}

void kern__avx2_lora_shrink(int64_t K, const float *A, int32_t i0, int32_t i1, int n,
                            const float *const *X, float *U, int64_t ldu) {
    avx2__shrink(K, A, i0, i1, n, X, U, ldu, 0);
}

void kern__avx2_lora_shrink16(int64_t K, const uint16_t *A, int32_t i0, int32_t i1, int n,
                              const float *const *X, float *U, int64_t ldu) {
    avx2__shrink(K, A, i0, i1, n, X, U, ldu, 1);
}

void kern__avx2_lora_expand(int32_t r, int64_t N, const float *Bt, int64_t c0, int64_t c1, int n,
                            const float *U, int64_t ldu, float scale, float *const *Y) {
    avx2__expand(r, N, Bt, c0, c1, n, U, ldu, scale, Y, 0);
}

void kern__avx2_lora_expand16(int32_t r, int64_t N, const uint16_t *Bt, int64_t c0, int64_t c1,
                              int n, const float *U, int64_t ldu, float scale, float *const *Y) {
    avx2__expand(r, N, Bt, c0, c1, n, U, ldu, scale, Y, 1);
}
