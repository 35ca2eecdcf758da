/* lora_avx512.c — the batched LoRA kernels for AVX-512F (the contract:
 * kern_lora.h; the reference: lora_ref.c).
 *
 * Shrink: each U element is one 16-lane accumulator along K (lane l sums
 * k = l mod 16 in order, a masked tail last), then a fixed halving tree.
 * Expand: 16 columns a vector, each column an fma chain over i from zero,
 * then y + scale * acc. Tiles of up to 4 tokens share each load of A or Bt;
 * a token's element sees the same operations in a tile of 1 or of 4.
 * The f16 variants are the same code with each factor load widened by
 * vcvtph2ps (h, a constant the tiles are inlined with). */
#include "kern/kern_int.h"
#include "kern/lora_int.h"

#include <immintrin.h>

#define A512__INLINE static inline __attribute__((always_inline))

/* The 16 lanes summed as (l, l+8), then (l, l+4), (l, l+2), (l, l+1). */
A512__INLINE float a512__hsum(__m512 v) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 16 factor values from element o of p (f32, or binary16 widened exactly
 * when h), lanes outside m zero. */
A512__INLINE __m512 a512__ldf(const void *p, size_t o, __mmask16 m, const int h) {
    if (h) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + o));
    return _mm512_maskz_loadu_ps(m, (const float *)p + o);
}

/* U for nt tokens (X[0..nt), U rows 0..nt) and ranks i .. i + ni. */
A512__INLINE void a512__shrink_tile(const int nt, const int ni, int64_t K, const void *A,
                                    int32_t i, const float *const *X, float *U, int64_t ldu,
                                    const int h) {
    size_t a[4];
    const float *x[4];
    __m512 acc[4][4];
    #pragma GCC unroll 4
    for (int q = 0; q < ni; q++) a[q] = (size_t)(i + q) * (size_t)K;
    #pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        x[t] = X[t];
        #pragma GCC unroll 4
        for (int q = 0; q < ni; q++) acc[t][q] = _mm512_setzero_ps();
    }
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 av[4];
        #pragma GCC unroll 4
        for (int q = 0; q < ni; q++) av[q] = a512__ldf(A, a[q] + (size_t)k, (__mmask16)0xffff, h);
        #pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const __m512 xv = _mm512_loadu_ps(x[t] + k);
            #pragma GCC unroll 4
            for (int q = 0; q < ni; q++) acc[t][q] = _mm512_fmadd_ps(av[q], xv, acc[t][q]);
        }
    }
    if (k < K) {
        const __mmask16 m = (__mmask16)((1u << (K - k)) - 1u);
        __m512 av[4];
        #pragma GCC unroll 4
        for (int q = 0; q < ni; q++) av[q] = a512__ldf(A, a[q] + (size_t)k, m, h);
        #pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const __m512 xv = _mm512_maskz_loadu_ps(m, x[t] + k);
            #pragma GCC unroll 4
            for (int q = 0; q < ni; q++) acc[t][q] = _mm512_fmadd_ps(av[q], xv, acc[t][q]);
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        #pragma GCC unroll 4
        for (int q = 0; q < ni; q++) U[(size_t)t * (size_t)ldu + (size_t)(i + q)] = a512__hsum(acc[t][q]);
    }
}

/* One tile, its sizes made constants so the accumulators stay in registers. */
A512__INLINE void a512__shrink_blk(int nt, int ni, int64_t K, const void *A, int32_t i,
                                   const float *const *X, float *U, int64_t ldu, const int h) {
    switch (nt * 8 + ni) {
    case 8 + 4: a512__shrink_tile(1, 4, K, A, i, X, U, ldu, h); break;
    case 16 + 4: a512__shrink_tile(2, 4, K, A, i, X, U, ldu, h); break;
    case 24 + 4: a512__shrink_tile(3, 4, K, A, i, X, U, ldu, h); break;
    case 32 + 4: a512__shrink_tile(4, 4, K, A, i, X, U, ldu, h); break;
    case 8 + 1: a512__shrink_tile(1, 1, K, A, i, X, U, ldu, h); break;
    case 16 + 1: a512__shrink_tile(2, 1, K, A, i, X, U, ldu, h); break;
    case 24 + 1: a512__shrink_tile(3, 1, K, A, i, X, U, ldu, h); break;
    default: a512__shrink_tile(4, 1, K, A, i, X, U, ldu, h); break;
    }
}

A512__INLINE void a512__shrink(int64_t K, const void *A, int32_t i0, int32_t i1, int n,
                               const float *const *X, float *U, int64_t ldu, const int h) {
    for (int j = 0; j < n; j += 4) {
        const int nt = n - j < 4 ? n - j : 4;
        float *Uj = U + (size_t)j * (size_t)ldu;
        int32_t i = i0;
        for (; i + 4 <= i1; i += 4) a512__shrink_blk(nt, 4, K, A, i, X + j, Uj, ldu, h);
        for (; i < i1; i++) a512__shrink_blk(nt, 1, K, A, i, X + j, Uj, ldu, h);
    }
}

/* Y columns c .. c + 16 nv (nv 4 or 1) (the last vector's lanes limited by m) for nt tokens. */
A512__INLINE void a512__expand_tile(const int nt, const int nv, __mmask16 m, int32_t r, int64_t N,
                                    const void *Bt, int64_t c, const float *U, int64_t ldu,
                                    __m512 sc, float *const *Y, const int h) {
    __m512 acc[4][4];
    #pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        #pragma GCC unroll 4
        for (int v = 0; v < nv; v++) acc[t][v] = _mm512_setzero_ps();
    }
    for (int32_t i = 0; i < r; i++) {
        const size_t b = (size_t)i * (size_t)N + (size_t)c;
        __m512 bv[4];
        #pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            bv[v] = a512__ldf(Bt, b + 16 * (size_t)v, v == nv - 1 ? m : (__mmask16)0xffff, h);
        #pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const __m512 u = _mm512_set1_ps(U[(size_t)t * (size_t)ldu + (size_t)i]);
            #pragma GCC unroll 4
            for (int v = 0; v < nv; v++) acc[t][v] = _mm512_fmadd_ps(bv[v], u, acc[t][v]);
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        #pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
            float *y = Y[t] + c + 16 * v;
            const __mmask16 mv = v == nv - 1 ? m : (__mmask16)0xffff;
            const __m512 yv = _mm512_add_ps(_mm512_maskz_loadu_ps(mv, y), _mm512_mul_ps(sc, acc[t][v]));
            _mm512_mask_storeu_ps(y, mv, yv);
    }
        }
}

A512__INLINE void a512__expand_blk(int nt, int nv, __mmask16 m, int32_t r, int64_t N,
                                   const void *Bt, int64_t c, const float *U, int64_t ldu,
                                   __m512 sc, float *const *Y, const int h) {
    switch (nt * 8 + nv) {
    case 8 + 4: a512__expand_tile(1, 4, m, r, N, Bt, c, U, ldu, sc, Y, h); break;
    case 16 + 4: a512__expand_tile(2, 4, m, r, N, Bt, c, U, ldu, sc, Y, h); break;
    case 24 + 4: a512__expand_tile(3, 4, m, r, N, Bt, c, U, ldu, sc, Y, h); break;
    case 32 + 4: a512__expand_tile(4, 4, m, r, N, Bt, c, U, ldu, sc, Y, h); break;
    case 8 + 1: a512__expand_tile(1, 1, m, r, N, Bt, c, U, ldu, sc, Y, h); break;
    case 16 + 1: a512__expand_tile(2, 1, m, r, N, Bt, c, U, ldu, sc, Y, h); break;
    case 24 + 1: a512__expand_tile(3, 1, m, r, N, Bt, c, U, ldu, sc, Y, h); break;
    default: a512__expand_tile(4, 1, m, r, N, Bt, c, U, ldu, sc, Y, h); break;
    }
}

A512__INLINE void a512__expand(int32_t r, int64_t N, const void *Bt, int64_t c0, int64_t c1, int n,
                               const float *U, int64_t ldu, float scale, float *const *Y,
                               const int h) {
    const __m512 sc = _mm512_set1_ps(scale);
    for (int j = 0; j < n; j += 4) {
        const int nt = n - j < 4 ? n - j : 4;
        const float *Uj = U + (size_t)j * (size_t)ldu;
        int64_t c = c0;
        for (; c + 64 <= c1; c += 64)
            a512__expand_blk(nt, 4, 0xffff, r, N, Bt, c, Uj, ldu, sc, Y + j, h);
        for (; c < c1; c += 16) {
            const int64_t rem = c1 - c;
            const __mmask16 m = rem >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rem) - 1u);
            a512__expand_blk(nt, 1, m, r, N, Bt, c, Uj, ldu, sc, Y + j, h);
        }
    }
}

void kern__a512_lora_shrink(int64_t K, const float *A, int32_t i0, int32_t i1, int n,
                            const float *const *X, float *U, int64_t ldu) {
    a512__shrink(K, A, i0, i1, n, X, U, ldu, 0);
}

void kern__a512_lora_shrink16(int64_t K, const uint16_t *A, int32_t i0, int32_t i1, int n,
                              const float *const *X, float *U, int64_t ldu) {
    a512__shrink(K, A, i0, i1, n, X, U, ldu, 1);
}

void kern__a512_lora_expand(int32_t r, int64_t N, const float *Bt, int64_t c0, int64_t c1, int n,
                            const float *U, int64_t ldu, float scale, float *const *Y) {
    a512__expand(r, N, Bt, c0, c1, n, U, ldu, scale, Y, 0);
}

void kern__a512_lora_expand16(int32_t r, int64_t N, const uint16_t *Bt, int64_t c0, int64_t c1,
                              int n, const float *U, int64_t ldu, float scale, float *const *Y) {
    a512__expand(r, N, Bt, c0, c1, n, U, ldu, scale, Y, 1);
}
