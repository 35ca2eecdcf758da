/* avx2.c — AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c).
 * Same signatures and semantics as the _ref functions in ref.c; each names
 * the _ref it must match and its tolerance (checked in tests/unit/test_kern.c).
 *
 * Batch invariance (kern.h): a matmul walks rows x columns in tiles of up
 * to NR x NC; the tile body is one always-inline function whose per-element
 * work (own accumulators, same lane layout, same horizontal sum) does not
 * depend on the tile shape (nr, nc), so an element computed in a tile equals
 * it computed alone, bit for bit. Tails are handled in place (masked loads, zero padding) with a
 * sequence that depends only on K. No pointer needs alignment. */
#include "kern/iq_simd.h"
#include "kern/kern_int.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define NRQ 2 /* weight rows per tile, Q8_0 / Q4_0 (K-quants: 1, their decode is wide) */
#define NCQ 4 /* activation columns per tile, quantized types */
#define NRF 2 /* weight rows per tile, float types */
#define NCF 2 /* activation columns per tile, float types (2 accumulators each) */
#define NC_MAX 4 /* row pitch of a tile's out[] */

#define KERN_INLINE static inline __attribute__((always_inline))
/* Fully unrolls the per-column / per-accumulator loops of a tile (nc is a
 * constant after inlining) so the accumulator arrays live in registers;
 * GCC -O2 won't do it on its own. */
#define UNROLL _Pragma("GCC unroll 8")

// ----------------------------------------------------------------------------
// Helpers

/* Fixed-order horizontal sum: (lo128 + hi128), then pairs, then the two. */
KERN_INLINE float avx2__hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

KERN_INLINE float avx2__hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Lane mask with the first m (0..8) lanes set. */
KERN_INLINE __m256i avx2__mask(int64_t m) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

KERN_INLINE float avx2__f16(uint16_t h) { return _cvtsh_ss(h); }

/* e^x for 8 lanes: Cody-Waite reduction x = n*ln2 + r, |r| <= ln2/2, degree
 * 7 Taylor polynomial (truncation < 1e-8 relative), 2^n applied in two
 * halves so results down to the f32 subnormals are right. Overflow gives
 * +inf, underflow 0, as expf. Max error ~2 ulp vs expf. */
KERN_INLINE __m256 avx2__exp(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.7228394f), lo = _mm256_set1_ps(-103.972084f);
    __m256 big = _mm256_cmp_ps(x, hi, _CMP_GT_OQ), small = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504089f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    __m256 res = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    res = _mm256_blendv_ps(res, _mm256_set1_ps(INFINITY), big);
    return _mm256_blendv_ps(res, _mm256_setzero_ps(), small);
}

// ----------------------------------------------------------------------------
// Float weights (F32 / F16 / BF16) x F32 activations.
// Must match kern__dot_row_{f32,f16,bf16}_ref within relative 1e-5 of
// sum|w*x|: per element 2 accumulators of 8 lanes over 16-element steps,
// then at most one 8-element step into accumulator 0, then a zero-padded
// tail into accumulator 1; combine a0+a1, fixed-order hsum. Tiles of 2 rows
// x 2 columns (14 ymm registers) reuse each weight and activation load.

KERN_INLINE __m256 avx2__ld_f32(const uint8_t *w, int64_t k) {
    return _mm256_loadu_ps((const float *)(const void *)w + k);
}
KERN_INLINE __m256 avx2__ldn_f32(const uint8_t *w, int64_t k, int64_t m) {
    return _mm256_maskload_ps((const float *)(const void *)w + k, avx2__mask(m));
}
KERN_INLINE __m256 avx2__ld_f16(const uint8_t *w, int64_t k) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(w + 2 * k)));
}
KERN_INLINE __m256 avx2__ldn_f16(const uint8_t *w, int64_t k, int64_t m) {
    uint16_t buf[8] = {0};
    memcpy(buf, w + 2 * k, (size_t)m * 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)buf));
}
KERN_INLINE __m256 avx2__bf16x8(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
KERN_INLINE __m256 avx2__ld_bf16(const uint8_t *w, int64_t k) {
    return avx2__bf16x8(_mm_loadu_si128((const __m128i *)(const void *)(w + 2 * k)));
}
KERN_INLINE __m256 avx2__ldn_bf16(const uint8_t *w, int64_t k, int64_t m) {
    uint16_t buf[8] = {0};
    memcpy(buf, w + 2 * k, (size_t)m * 2);
    return avx2__bf16x8(_mm_loadu_si128((const __m128i *)(const void *)buf));
}

#define AVX2_FLOAT_TILE(T)                                                                   \
    KERN_INLINE void avx2__tile_##T(int64_t K, const uint8_t *const *w, int nr,             \
                                    const float *const *x, int nc, float *out) {            \
        __m256 acc[NRF][NCF][2];                                                            \
        UNROLL                                                                              \
        for (int i = 0; i < nr; i++)                                                        \
            UNROLL                                                                          \
            for (int j = 0; j < nc; j++)                                                    \
                acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();                          \
        int64_t k = 0;                                                                      \
        for (; k + 16 <= K; k += 16) {                                                      \
            __m256 wv[NRF][2];                                                              \
            UNROLL                                                                          \
            for (int i = 0; i < nr; i++)                                                    \
                wv[i][0] = avx2__ld_##T(w[i], k), wv[i][1] = avx2__ld_##T(w[i], k + 8);     \
            UNROLL                                                                          \
            for (int j = 0; j < nc; j++) {                                                  \
                __m256 x0 = _mm256_loadu_ps(x[j] + k), x1 = _mm256_loadu_ps(x[j] + k + 8);  \
                UNROLL                                                                      \
                for (int i = 0; i < nr; i++) {                                              \
                    acc[i][j][0] = _mm256_fmadd_ps(wv[i][0], x0, acc[i][j][0]);             \
                    acc[i][j][1] = _mm256_fmadd_ps(wv[i][1], x1, acc[i][j][1]);             \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        if (k + 8 <= K) {                                                                   \
            __m256 wv[NRF];                                                                 \
            UNROLL                                                                          \
            for (int i = 0; i < nr; i++) wv[i] = avx2__ld_##T(w[i], k);                     \
            UNROLL                                                                          \
            for (int j = 0; j < nc; j++) {                                                  \
                __m256 x0 = _mm256_loadu_ps(x[j] + k);                                      \
                UNROLL                                                                      \
                for (int i = 0; i < nr; i++)                                                \
                    acc[i][j][0] = _mm256_fmadd_ps(wv[i], x0, acc[i][j][0]);                \
            }                                                                               \
            k += 8;                                                                         \
        }                                                                                   \
        if (k < K) {                                                                        \
            __m256 wv[NRF];                                                                 \
            __m256i msk = avx2__mask(K - k);                                                \
            UNROLL                                                                          \
            for (int i = 0; i < nr; i++) wv[i] = avx2__ldn_##T(w[i], k, K - k);             \
            UNROLL                                                                          \
            for (int j = 0; j < nc; j++) {                                                  \
                __m256 x0 = _mm256_maskload_ps(x[j] + k, msk);                              \
                UNROLL                                                                      \
                for (int i = 0; i < nr; i++)                                                \
                    acc[i][j][1] = _mm256_fmadd_ps(wv[i], x0, acc[i][j][1]);                \
            }                                                                               \
        }                                                                                   \
        UNROLL                                                                              \
        for (int i = 0; i < nr; i++)                                                        \
            UNROLL                                                                          \
            for (int j = 0; j < nc; j++)                                                    \
                out[i * NC_MAX + j] = avx2__hsum(_mm256_add_ps(acc[i][j][0], acc[i][j][1])); \
    }

AVX2_FLOAT_TILE(f32)
AVX2_FLOAT_TILE(f16)
AVX2_FLOAT_TILE(bf16)

/* Q8_0 KV rows (kern.h dot_rows): 8 elements at k (k % 8 == 0) of a row of
 * Q8_0 blocks, dequantized exactly (f16 d times an int8 fits an f32
 * mantissa), so the tile computes what avx2__tile_f32 computes on the
 * dequantized row. Rows are whole blocks (n % 32 == 0): the masked tail
 * loader exists for the macro and is never reached. ("kvq8": avx2__tile_q8_0
 * is the Q8_0-weight x Q8_0-activation tile.) */
KERN_INLINE __m256 avx2__ld_kvq8(const uint8_t *w, int64_t k) {
    const uint8_t *b = w + (size_t)(k / 32) * sizeof(kern_block_q8_0);
    uint16_t h;
    memcpy(&h, b, 2);
    __m128i q8 = _mm_loadl_epi64((const __m128i *)(const void *)(b + 2 + k % 32));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)),
                         _mm256_set1_ps(avx2__f16(h)));
}
KERN_INLINE __m256 avx2__ldn_kvq8(const uint8_t *w, int64_t k, int64_t m) {
    float buf[8] = {0};
    for (int64_t i = 0; i < m; i++) {
        const uint8_t *b = w + (size_t)((k + i) / 32) * sizeof(kern_block_q8_0);
        uint16_t h;
        memcpy(&h, b, 2);
        buf[i] = avx2__f16(h) * (float)(int8_t)b[2 + (k + i) % 32];
    }
    return _mm256_loadu_ps(buf);
}
AVX2_FLOAT_TILE(kvq8)

/* Tiling driver shared by all types: rows in tiles of NR, columns in tiles
 * of NC; TILE(K, w_rows, nr, x_cols, nc, out) computes the nr x nc elements
 * into out[i*NC_MAX + j]. The switch gives each (nr, nc) its own
 * constant-folded copy of the tile. */
#define AVX2_TILE_CASE(TILE, NR, NC, nr, nc)                                                \
    case (nr) * 8 + (nc):                                                                   \
        TILE(K, wp, (nr) < (NR) ? (nr) : (NR), xp, (nc) < (NC) ? (nc) : (NC), out);         \
        break;
#define AVX2_MATMUL(name, NR, NC, TILE, XT)                                                 \
    static void avx2__matmul_##name(int64_t K, int n_rows, int n_cols, const void *W,       \
                                    size_t w_stride, const void *X, size_t x_stride,        \
                                    float *Y, size_t y_stride) {                            \
        for (int c0 = 0; c0 < n_cols; c0 += NC) {                                           \
            int nc = n_cols - c0 < NC ? n_cols - c0 : NC;                                   \
            const XT *xp[NC];                                                               \
            for (int j = 0; j < nc; j++)                                                    \
                xp[j] = (const XT *)(const void *)((const uint8_t *)X +                     \
                                                   (size_t)(c0 + j) * x_stride);            \
            for (int r0 = 0; r0 < n_rows; r0 += NR) {                                       \
                int nr = n_rows - r0 < NR ? n_rows - r0 : NR;                               \
                const uint8_t *wp[NR];                                                      \
                for (int i = 0; i < nr; i++)                                                \
                    wp[i] = (const uint8_t *)W + (size_t)(r0 + i) * w_stride;               \
                float out[NR * NC_MAX];                                                     \
                switch (nr * 8 + nc) {                                                      \
                    AVX2_TILE_CASE(TILE, NR, NC, 1, 1)                                      \
                    AVX2_TILE_CASE(TILE, NR, NC, 1, 2)                                      \
                    AVX2_TILE_CASE(TILE, NR, NC, 1, 3)                                      \
                    AVX2_TILE_CASE(TILE, NR, NC, 1, 4)                                      \
                    AVX2_TILE_CASE(TILE, NR, NC, 2, 1)                                      \
                    AVX2_TILE_CASE(TILE, NR, NC, 2, 2)                                      \
                    AVX2_TILE_CASE(TILE, NR, NC, 2, 3)                                      \
                    AVX2_TILE_CASE(TILE, NR, NC, 2, 4)                                      \
                default: KS_ASSERT(!"avx2 tile shape");                                     \
                }                                                                           \
                for (int i = 0; i < nr; i++)                                                \
                    for (int j = 0; j < nc; j++)                                            \
                        Y[(size_t)(c0 + j) * y_stride + (size_t)(r0 + i)] =                 \
                            out[i * NC_MAX + j];                                            \
            }                                                                               \
        }                                                                                   \
    }

AVX2_MATMUL(f32, NRF, NCF, avx2__tile_f32, float)
AVX2_MATMUL(f16, NRF, NCF, avx2__tile_f16, float)
AVX2_MATMUL(bf16, NRF, NCF, avx2__tile_bf16, float)

// ----------------------------------------------------------------------------
// Q8_0 / Q4_0 / Q5_0 / IQ4_NL / MXFP4 weights x Q8_0 activations. Must match
// kern__dot_row_{q8_0,q4_0,q5_0,iq4_nl,mxfp4}_ref within relative 1e-5 of sum|w*x|: the block integer
// dot is exact (8 int32 partial sums per block); only the f32 scaling
// (d_w*d_x rounded to f32, partial sums converted to f32) and the f32
// accumulation across blocks differ from ref's double sum.
// Uses the sign trick (|w| * sign(x, w)), exact as long as activations are
// never -128, which kern__quantize_q8_0_* guarantees.

KERN_INLINE __m256 avx2__q8_block(__m256i aw, __m256i sw_src, __m256i bx, float scale, __m256 acc) {
    __m256i sx = _mm256_sign_epi8(bx, sw_src);
    __m256i p16 = _mm256_maddubs_epi16(aw, sx);
    __m256i p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
    return _mm256_fmadd_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(p32), acc);
}

/* Decoded Q8_0 / Q4_0 weight block: |w| and w (the sign source). */
KERN_INLINE void avx2__dec_q8_0(const uint8_t *row, int64_t i, __m256i *aw, __m256i *bw, float *dw) {
    const kern_block_q8_0 *w = (const kern_block_q8_0 *)(const void *)row + i;
    *bw = _mm256_loadu_si256((const __m256i *)(const void *)w->qs);
    *aw = _mm256_sign_epi8(*bw, *bw);
    *dw = avx2__f16(w->d);
}
KERN_INLINE void avx2__dec_q4_0(const uint8_t *row, int64_t i, __m256i *aw, __m256i *bw, float *dw) {
    const kern_block_q4_0 *w = (const kern_block_q4_0 *)(const void *)row + i;
    const __m128i m4 = _mm_set1_epi8(15);
    __m128i q = _mm_loadu_si128((const __m128i *)(const void *)w->qs);
    __m128i lo = _mm_and_si128(q, m4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
    *bw = _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8)); // elements 0..31
    *aw = _mm256_sign_epi8(*bw, *bw);
    *dw = avx2__f16(w->d);
}

#define AVX2_Q8_TILE(T)                                                                     \
    KERN_INLINE void avx2__tile_##T(int64_t K, const uint8_t *const *w, int nr,            \
                                    const kern_block_q8_0 *const *x, int nc, float *out) { \
        __m256 acc[NRQ][NCQ];                                                              \
        UNROLL                                                                             \
        for (int i = 0; i < nr; i++)                                                       \
            UNROLL                                                                         \
            for (int j = 0; j < nc; j++) acc[i][j] = _mm256_setzero_ps();                  \
        for (int64_t b = 0; b < K / KERN_QK8_0; b++) {                                     \
            __m256i aw[NRQ], bw[NRQ];                                                      \
            float dw[NRQ];                                                                 \
            UNROLL                                                                         \
            for (int i = 0; i < nr; i++) avx2__dec_##T(w[i], b, &aw[i], &bw[i], &dw[i]);   \
            UNROLL                                                                         \
            for (int j = 0; j < nc; j++) {                                                 \
                __m256i bx = _mm256_loadu_si256((const __m256i *)(const void *)x[j][b].qs); \
                float dx = avx2__f16(x[j][b].d);                                           \
                UNROLL                                                                     \
                for (int i = 0; i < nr; i++)                                               \
                    acc[i][j] = avx2__q8_block(aw[i], bw[i], bx, dw[i] * dx, acc[i][j]);   \
            }                                                                              \
        }                                                                                  \
        UNROLL                                                                             \
        for (int i = 0; i < nr; i++)                                                       \
            UNROLL                                                                         \
            for (int j = 0; j < nc; j++) out[i * NC_MAX + j] = avx2__hsum(acc[i][j]);      \
    }

AVX2_Q8_TILE(q8_0)
AVX2_Q8_TILE(q4_0)

AVX2_MATMUL(q8_0, NRQ, NCQ, avx2__tile_q8_0, kern_block_q8_0)
AVX2_MATMUL(q4_0, NRQ, NCQ, avx2__tile_q4_0, kern_block_q8_0)

/* 0xFF in byte i of the result where bit i of h is set (i < 32). */
KERN_INLINE __m256i avx2__bits32(uint32_t h) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), shuf);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bits), bits);
}

/* The 32 nibbles of a Q4_0-packed qs[16], in element order (0..15). */
KERN_INLINE __m256i avx2__nibbles(const uint8_t *qs) {
    const __m128i m4 = _mm_set1_epi8(15);
    __m128i q = _mm_loadu_si128((const __m128i *)(const void *)qs);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
}

/* The 32 5-bit values (0..31) of a Q5 block: nibbles plus bit 4 from qh. */
KERN_INLINE __m256i avx2__q5(const uint8_t *qh, const uint8_t *qs) {
    uint32_t h;
    memcpy(&h, qh, 4);
    return _mm256_or_si256(avx2__nibbles(qs),
                           _mm256_and_si256(avx2__bits32(h), _mm256_set1_epi8(16)));
}

KERN_INLINE void avx2__dec_q5_0(const uint8_t *row, int64_t i, __m256i *aw, __m256i *bw,
                                float *dw) {
    const kern_block_q5_0 *w = (const kern_block_q5_0 *)(const void *)row + i;
    *bw = _mm256_sub_epi8(avx2__q5(w->qh, w->qs), _mm256_set1_epi8(16));
    *aw = _mm256_sign_epi8(*bw, *bw);
    *dw = avx2__f16(w->d);
}

/* IQ4_NL: the codebook values (|v| <= 127, so the sign trick is exact). */
KERN_INLINE void avx2__dec_iq4_nl(const uint8_t *row, int64_t i, __m256i *aw, __m256i *bw,
                                  float *dw) {
    const kern_block_iq4_nl *w = (const kern_block_iq4_nl *)(const void *)row + i;
    const __m256i tab = _mm256_broadcastsi128_si256(
        _mm_loadu_si128((const __m128i *)(const void *)kern_iq4nl_values));
    *bw = _mm256_shuffle_epi8(tab, avx2__nibbles(w->qs));
    *aw = _mm256_sign_epi8(*bw, *bw);
    *dw = avx2__f16(w->d);
}

/* MXFP4: the doubled E2M1 values (|v| <= 12), scale 2^(e - 128). */
KERN_INLINE void avx2__dec_mxfp4(const uint8_t *row, int64_t i, __m256i *aw, __m256i *bw,
                                 float *dw) {
    const kern_block_mxfp4 *w = (const kern_block_mxfp4 *)(const void *)row + i;
    const __m256i tab = _mm256_broadcastsi128_si256(
        _mm_loadu_si128((const __m128i *)(const void *)kern_mxfp4_values));
    *bw = _mm256_shuffle_epi8(tab, avx2__nibbles(w->qs));
    *aw = _mm256_sign_epi8(*bw, *bw);
    *dw = kern__e8m0_half(w->e);
}

AVX2_Q8_TILE(q5_0)
AVX2_Q8_TILE(iq4_nl)
AVX2_Q8_TILE(mxfp4)

AVX2_MATMUL(q5_0, NRQ, NCQ, avx2__tile_q5_0, kern_block_q8_0)
AVX2_MATMUL(iq4_nl, NRQ, NCQ, avx2__tile_iq4_nl, kern_block_q8_0)
AVX2_MATMUL(mxfp4, NRQ, NCQ, avx2__tile_mxfp4, kern_block_q8_0)

// Q4_1 / Q5_1 weights x Q8_0 activations: value = d*q + m with q >= 0, so
// the unsigned q multiplies x directly (maddubs, no saturation: q <= 31),
// and the m term needs sum(x), taken exactly from the activation bytes
// (kern_int.h). Per element and block: acc = fma(d_w*d_x, isum lanes, acc),
// then acc = fma(m_w*d_x, x-sum lanes, acc). Must match
// kern__dot_row_q4_1_ref / kern__dot_row_q5_1_ref within MATMUL_REL of
// sum(|d*q*x| + |m*x|) (the two terms can cancel).

KERN_INLINE void avx2__decm_q4_1(const uint8_t *row, int64_t i, __m256i *u, float *dw, float *mw) {
    const kern_block_q4_1 *w = (const kern_block_q4_1 *)(const void *)row + i;
    *u = avx2__nibbles(w->qs);
    *dw = avx2__f16(w->d);
    *mw = avx2__f16(w->m);
}
KERN_INLINE void avx2__decm_q5_1(const uint8_t *row, int64_t i, __m256i *u, float *dw, float *mw) {
    const kern_block_q5_1 *w = (const kern_block_q5_1 *)(const void *)row + i;
    *u = avx2__q5(w->qh, w->qs);
    *dw = avx2__f16(w->d);
    *mw = avx2__f16(w->m);
}

#define AVX2_Q8M_TILE(T)                                                                           \
    KERN_INLINE void avx2__tile_##T(int64_t K, const uint8_t *const *w, int nr,                    \
                                    const kern_block_q8_0 *const *x, int nc, float *out) {         \
        const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);                  \
        __m256 acc[NRQ][NCQ];                                                                      \
        UNROLL                                                                                     \
        for (int i = 0; i < nr; i++)                                                               \
            UNROLL                                                                                 \
        for (int j = 0; j < nc; j++)                                                               \
            acc[i][j] = _mm256_setzero_ps();                                                       \
        for (int64_t b = 0; b < K / KERN_QK8_0; b++) {                                             \
            __m256i u[NRQ];                                                                        \
            float dw[NRQ], mw[NRQ];                                                                \
            UNROLL                                                                                 \
            for (int i = 0; i < nr; i++)                                                           \
                avx2__decm_##T(w[i], b, &u[i], &dw[i], &mw[i]);                                    \
            UNROLL                                                                                 \
            for (int j = 0; j < nc; j++) {                                                         \
                __m256i bx = _mm256_loadu_si256((const __m256i *)(const void *)x[j][b].qs);        \
                __m256 xs = _mm256_cvtepi32_ps(                                                    \
                    _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, bx), ones16));                   \
                float dx = avx2__f16(x[j][b].d);                                                   \
                UNROLL                                                                             \
                for (int i = 0; i < nr; i++) {                                                     \
                    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u[i], bx), ones16);         \
                    acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(dw[i] * dx), _mm256_cvtepi32_ps(p), \
                                                acc[i][j]);                                        \
                    acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(mw[i] * dx), xs, acc[i][j]);        \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        UNROLL                                                                                     \
        for (int i = 0; i < nr; i++)                                                               \
            UNROLL                                                                                 \
        for (int j = 0; j < nc; j++)                                                               \
            out[i * NC_MAX + j] = avx2__hsum(acc[i][j]);                                           \
    }

AVX2_Q8M_TILE(q4_1)
AVX2_Q8M_TILE(q5_1)

AVX2_MATMUL(q4_1, NRQ, NCQ, avx2__tile_q4_1, kern_block_q8_0)
AVX2_MATMUL(q5_1, NRQ, NCQ, avx2__tile_q5_1, kern_block_q8_0)

// ----------------------------------------------------------------------------
// Q4_K / Q6_K weights x Q8_K activations. Must match kern__dot_row_q4_K_ref /
// kern__dot_row_q6_K_ref within relative 1e-5 of sum(|d*sc*q*x| + |dmin*m*x|)
// (Q4_K) or sum|w*x| (Q6_K): per super-block the integer sums are exact;
// f32 rounding only in the super-block scaling and the cross-block sum.

KERN_INLINE void avx2__tile_q4_K(int64_t K, const uint8_t *const *wr, int nr,
                                 const kern_block_q8_K *const *x, int nc, float *out) {
    const kern_block_q4_K *w = (const kern_block_q4_K *)(const void *)wr[0]; // nr == 1
    (void)nr;
    __m256 acc[NCQ];
    float accm[NCQ];
    UNROLL
    for (int j = 0; j < nc; j++) acc[j] = _mm256_setzero_ps(), accm[j] = 0.0f;
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int64_t i = 0; i < K / KERN_QK_K; i++) {
        int sc[8], m[8];
        UNROLL
        for (int s = 0; s < 8; s++) kern__q4k_scale_min(w[i].scales, s, &sc[s], &m[s]);
        __m256i q[8]; // q[s]: the 32 4-bit values of sub-block s
        UNROLL
        for (int c = 0; c < 4; c++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)(w[i].qs + 32 * c));
            q[2 * c] = _mm256_and_si256(raw, m4);
            q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        }
        float d = avx2__f16(w[i].d), dmin = avx2__f16(w[i].dmin);
        UNROLL
        for (int j = 0; j < nc; j++) {
            const kern_block_q8_K *xb = &x[j][i];
            __m256i isum = _mm256_setzero_si256();
            int32_t msum = 0;
            UNROLL
            for (int s = 0; s < 8; s++) {
                __m256i bx = _mm256_loadu_si256((const __m256i *)(const void *)(xb->qs + 32 * s));
                __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q[s], bx),
                                              _mm256_set1_epi16((int16_t)sc[s]));
                isum = _mm256_add_epi32(isum, p);
                msum += m[s] * (xb->bsums[2 * s] + xb->bsums[2 * s + 1]);
            }
            float dx = xb->d;
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(isum), acc[j]);
            accm[j] = accm[j] + (dmin * dx) * (float)msum;
        }
    }
    UNROLL
    for (int j = 0; j < nc; j++) out[j] = avx2__hsum(acc[j]) - accm[j];
}

KERN_INLINE void avx2__tile_q6_K(int64_t K, const uint8_t *const *wr, int nr,
                                 const kern_block_q8_K *const *x, int nc, float *out) {
    const kern_block_q6_K *w = (const kern_block_q6_K *)(const void *)wr[0]; // nr == 1
    (void)nr;
    __m256 acc[NCQ];
    UNROLL
    for (int j = 0; j < nc; j++) acc[j] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    for (int64_t i = 0; i < K / KERN_QK_K; i++) {
        __m256i q[8]; // q[4n+g]: elements 128n+32g .. +31, values 0..63 (true value - 32)
        __m256i scv[8]; // int16 scales: low 128 bits sub-block 2k, high 2k+1
        UNROLL
        for (int n = 0; n < 2; n++) {
            const uint8_t *ql = w[i].ql + 64 * n, *qh = w[i].qh + 32 * n;
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(const void *)ql);
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32));
            __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)qh);
            UNROLL
            for (int g = 0; g < 4; g++) {
                __m256i lo = (g & 1) ? l1 : l0;
                lo = (g & 2) ? _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4)
                             : _mm256_and_si256(lo, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(h, 2 * g), m2);
                q[4 * n + g] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
            }
        }
        UNROLL
        for (int k = 0; k < 8; k++)
            scv[k] = _mm256_set_m128i(_mm_set1_epi16(w[i].scales[2 * k + 1]),
                                      _mm_set1_epi16(w[i].scales[2 * k]));
        float d = avx2__f16(w[i].d);
        UNROLL
        for (int j = 0; j < nc; j++) {
            const kern_block_q8_K *xb = &x[j][i];
            __m256i isum = _mm256_setzero_si256();
            UNROLL
            for (int k = 0; k < 8; k++) {
                __m256i bx = _mm256_loadu_si256((const __m256i *)(const void *)(xb->qs + 32 * k));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], bx), scv[k]));
            }
            int32_t bias = 0; // sum sc*bsum: the -32 offset, exact
            UNROLL
            for (int s = 0; s < 16; s++) bias += w[i].scales[s] * xb->bsums[s];
            isum = _mm256_sub_epi32(isum, _mm256_setr_epi32(32 * bias, 0, 0, 0, 0, 0, 0, 0));
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(isum), acc[j]);
        }
    }
    UNROLL
    for (int j = 0; j < nc; j++) out[j] = avx2__hsum(acc[j]);
}

AVX2_MATMUL(q4_K, 1, NCQ, avx2__tile_q4_K, kern_block_q8_K)
AVX2_MATMUL(q6_K, 1, NCQ, avx2__tile_q6_K, kern_block_q8_K)

// Q5_K / Q3_K / Q2_K / IQ4_XS weights x Q8_K activations, the same scheme
// (one weight row per tile, its decode shared by up to 4 columns). Must
// match kern__dot_row_{q5_K,q3_K,q2_K,iq4_xs}_ref within MATMUL_REL of
// sum(|d*sc*q*x| + |dmin*m*x|) (Q5_K, Q2_K) or sum|w*x|: the integer sums
// per super-block are exact (q*x via maddubs never saturates: q <= 31, or
// |codebook| <= 127 with the sign moved onto x); only the f32 scaling and
// the cross-block sum round.

KERN_INLINE void avx2__tile_q5_K(int64_t K, const uint8_t *const *wr, int nr,
                                 const kern_block_q8_K *const *x, int nc, float *out) {
    const kern_block_q5_K *w = (const kern_block_q5_K *)(const void *)wr[0]; // nr == 1
    (void)nr;
    __m256 acc[NCQ];
    float accm[NCQ];
    UNROLL
    for (int j = 0; j < nc; j++)
        acc[j] = _mm256_setzero_ps(), accm[j] = 0.0f;
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < K / KERN_QK_K; i++) {
        int sc[8], m[8];
        UNROLL
        for (int s = 0; s < 8; s++)
            kern__q4k_scale_min(w[i].scales, s, &sc[s], &m[s]);
        __m256i q[8]; // q[s]: the 32 5-bit values of sub-block s
        __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)w[i].qh);
        UNROLL
        for (int c = 0; c < 4; c++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)(w[i].qs + 32 * c));
            q[2 * c] = _mm256_and_si256(raw, m4);
            q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        }
        UNROLL
        for (int s = 0; s < 8; s++) // bit s of qh[l] -> bit 4 (no bit crosses a byte)
            q[s] = _mm256_or_si256(
                q[s], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, s), one), 4));
        float d = avx2__f16(w[i].d), dmin = avx2__f16(w[i].dmin);
        UNROLL
        for (int j = 0; j < nc; j++) {
            const kern_block_q8_K *xb = &x[j][i];
            __m256i isum = _mm256_setzero_si256();
            int32_t msum = 0;
            UNROLL
            for (int s = 0; s < 8; s++) {
                __m256i bx = _mm256_loadu_si256((const __m256i *)(const void *)(xb->qs + 32 * s));
                __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q[s], bx),
                                              _mm256_set1_epi16((int16_t)sc[s]));
                isum = _mm256_add_epi32(isum, p);
                msum += m[s] * (xb->bsums[2 * s] + xb->bsums[2 * s + 1]);
            }
            float dx = xb->d;
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(isum), acc[j]);
            accm[j] = accm[j] + (dmin * dx) * (float)msum;
        }
    }
    UNROLL
    for (int j = 0; j < nc; j++)
        out[j] = avx2__hsum(acc[j]) - accm[j];
}

/* The 2-bit values of chunk g = 4n + j (elements 32g .. 32g+31) of a Q2_K /
 * Q3_K qs[64]: (qs[32n + l] >> 2j) & 3. */
KERN_INLINE __m256i avx2__q2(const uint8_t *qs, int g) {
    __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * (g / 4)));
    return _mm256_and_si256(_mm256_srli_epi16(raw, 2 * (g % 4)), _mm256_set1_epi8(3));
}

KERN_INLINE void avx2__tile_q2_K(int64_t K, const uint8_t *const *wr, int nr,
                                 const kern_block_q8_K *const *x, int nc, float *out) {
    const kern_block_q2_K *w = (const kern_block_q2_K *)(const void *)wr[0]; // nr == 1
    (void)nr;
    __m256 acc[NCQ];
    float accm[NCQ];
    UNROLL
    for (int j = 0; j < nc; j++)
        acc[j] = _mm256_setzero_ps(), accm[j] = 0.0f;
    for (int64_t i = 0; i < K / KERN_QK_K; i++) {
        __m256i q[8], scv[8]; // chunk g: values, int16 scales (low 128 bits 2g, high 2g+1)
        UNROLL
        for (int g = 0; g < 8; g++) {
            q[g] = avx2__q2(w[i].qs, g);
            scv[g] = _mm256_set_m128i(_mm_set1_epi16(w[i].scales[2 * g + 1] & 15),
                                      _mm_set1_epi16(w[i].scales[2 * g] & 15));
        }
        float d = avx2__f16(w[i].d), dmin = avx2__f16(w[i].dmin);
        UNROLL
        for (int j = 0; j < nc; j++) {
            const kern_block_q8_K *xb = &x[j][i];
            __m256i isum = _mm256_setzero_si256();
            UNROLL
            for (int g = 0; g < 8; g++) {
                __m256i bx = _mm256_loadu_si256((const __m256i *)(const void *)(xb->qs + 32 * g));
                isum = _mm256_add_epi32(isum,
                                        _mm256_madd_epi16(_mm256_maddubs_epi16(q[g], bx), scv[g]));
            }
            int32_t msum = 0;
            UNROLL
            for (int s = 0; s < 16; s++)
                msum += (w[i].scales[s] >> 4) * xb->bsums[s];
            float dx = xb->d;
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(isum), acc[j]);
            accm[j] = accm[j] + (dmin * dx) * (float)msum;
        }
    }
    UNROLL
    for (int j = 0; j < nc; j++)
        out[j] = avx2__hsum(acc[j]) - accm[j];
}

KERN_INLINE void avx2__tile_q3_K(int64_t K, const uint8_t *const *wr, int nr,
                                 const kern_block_q8_K *const *x, int nc, float *out) {
    const kern_block_q3_K *w = (const kern_block_q3_K *)(const void *)wr[0]; // nr == 1
    (void)nr;
    __m256 acc[NCQ];
    UNROLL
    for (int j = 0; j < nc; j++)
        acc[j] = _mm256_setzero_ps();
    const __m256i one = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < K / KERN_QK_K; i++) {
        int sc[16];
        UNROLL
        for (int s = 0; s < 16; s++)
            sc[s] = kern__q3k_scale(w[i].scales, s) - 32;
        __m256i q[8], scv[8]; // chunk g = 4n + j: values q (0..7; true value q - 4)
        __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)w[i].hmask);
        UNROLL
        for (int g = 0; g < 8; g++) {
            __m256i hb = _mm256_and_si256(_mm256_srli_epi16(h, g), one); // bit g of hmask[l]
            q[g] = _mm256_or_si256(avx2__q2(w[i].qs, g), _mm256_slli_epi16(hb, 2));
            scv[g] = _mm256_set_m128i(_mm_set1_epi16((int16_t)sc[2 * g + 1]),
                                      _mm_set1_epi16((int16_t)sc[2 * g]));
        }
        float d = avx2__f16(w[i].d);
        UNROLL
        for (int j = 0; j < nc; j++) {
            const kern_block_q8_K *xb = &x[j][i];
            __m256i isum = _mm256_setzero_si256();
            UNROLL
            for (int g = 0; g < 8; g++) {
                __m256i bx = _mm256_loadu_si256((const __m256i *)(const void *)(xb->qs + 32 * g));
                isum = _mm256_add_epi32(isum,
                                        _mm256_madd_epi16(_mm256_maddubs_epi16(q[g], bx), scv[g]));
            }
            int32_t bias = 0; // sum sc*bsum: the -4 offset, exact
            UNROLL
            for (int s = 0; s < 16; s++)
                bias += sc[s] * xb->bsums[s];
            isum = _mm256_sub_epi32(isum, _mm256_setr_epi32(4 * bias, 0, 0, 0, 0, 0, 0, 0));
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(isum), acc[j]);
        }
    }
    UNROLL
    for (int j = 0; j < nc; j++)
        out[j] = avx2__hsum(acc[j]);
}

KERN_INLINE void avx2__tile_iq4_xs(int64_t K, const uint8_t *const *wr, int nr,
                                   const kern_block_q8_K *const *x, int nc, float *out) {
    const kern_block_iq4_xs *w = (const kern_block_iq4_xs *)(const void *)wr[0]; // nr == 1
    (void)nr;
    __m256 acc[NCQ];
    UNROLL
    for (int j = 0; j < nc; j++)
        acc[j] = _mm256_setzero_ps();
    const __m256i tab = _mm256_broadcastsi128_si256(
        _mm_loadu_si128((const __m128i *)(const void *)kern_iq4nl_values));
    for (int64_t i = 0; i < K / KERN_QK_K; i++) {
        __m256i aw[8], bw[8], scv[8]; // sub-block s: |values|, values, int16 scale
        UNROLL
        for (int s = 0; s < 8; s++) {
            bw[s] = _mm256_shuffle_epi8(tab, avx2__nibbles(w[i].qs + 16 * s));
            aw[s] = _mm256_sign_epi8(bw[s], bw[s]);
            scv[s] = _mm256_set1_epi16((int16_t)(kern__iq4xs_scale(&w[i], s) - 32));
        }
        float d = avx2__f16(w[i].d);
        UNROLL
        for (int j = 0; j < nc; j++) {
            const kern_block_q8_K *xb = &x[j][i];
            __m256i isum = _mm256_setzero_si256();
            UNROLL
            for (int s = 0; s < 8; s++) {
                __m256i bx = _mm256_loadu_si256((const __m256i *)(const void *)(xb->qs + 32 * s));
                __m256i p = _mm256_maddubs_epi16(aw[s], _mm256_sign_epi8(bx, bw[s]));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scv[s]));
            }
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(isum), acc[j]);
        }
    }
    UNROLL
    for (int j = 0; j < nc; j++)
        out[j] = avx2__hsum(acc[j]);
}

AVX2_MATMUL(q5_K, 1, NCQ, avx2__tile_q5_K, kern_block_q8_K)
AVX2_MATMUL(q3_K, 1, NCQ, avx2__tile_q3_K, kern_block_q8_K)
AVX2_MATMUL(q2_K, 1, NCQ, avx2__tile_q2_K, kern_block_q8_K)
AVX2_MATMUL(iq4_xs, 1, NCQ, avx2__tile_iq4_xs, kern_block_q8_K)

// TQ1_0 / TQ2_0 (ternary) weights x Q8_K activations: one weight row per
// tile, decoded once into eight 32-element steps of unsigned digits u = t + 1
// (0..2; TQ2_0 0..3), which maddubs multiplies by x exactly (|u*x| pairs <=
// 762, 8 steps <= 6096: no int16 saturation); the "- 1" goes out through the
// bsums (sum x, exact). So the integer sum per super-block is ref's; only the
// f32 scaling and the cross-block sum round (MATMUL_REL of sum|w*x|).

/* v * 3 (mod 256) per byte. */
KERN_INLINE __m256i avx2__x3(__m256i v) { return _mm256_add_epi8(_mm256_add_epi8(v, v), v); }

/* The TQ1_0 digit of bytes b already multiplied by 3^n (mod 256):
 * (b * 3) >> 8 = [b > 85] + [b > 170] (kern__tq1_digit), 0..2. */
KERN_INLINE __m256i avx2__tq1_digit(__m256i b) {
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    __m256i s = _mm256_xor_si256(b, flip); // unsigned order as signed
    __m256i g1 = _mm256_cmpgt_epi8(s, _mm256_set1_epi8((char)(85 ^ 0x80)));
    __m256i g2 = _mm256_cmpgt_epi8(s, _mm256_set1_epi8((char)(170 ^ 0x80)));
    return _mm256_sub_epi8(_mm256_sub_epi8(_mm256_setzero_si256(), g1), g2);
}

/* The digits (0..2) of a TQ1_0 block, elements 32g .. 32g+31 in u[g]
 * (layout: kern_int.h): steps 0-4 digit g of qs[0..31]; step 5 digits 0 and
 * 1 of qs[32..47] (128-bit halves), step 6 digits 2 and 3; step 7 digit 4 of
 * qs[32..47], then digits 0..3 of qh[0..3] (one 32-bit word each). */
KERN_INLINE void avx2__tq1_decode(const kern_block_tq1_0 *b, __m256i u[8]) {
    __m256i p = _mm256_loadu_si256((const __m256i *)(const void *)b->qs);
    UNROLL
    for (int n = 0; n < 5; n++) {
        u[n] = avx2__tq1_digit(p);
        p = avx2__x3(p);
    }
    __m256i q1 =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(b->qs + 32)));
    __m256i q3 = avx2__x3(q1), q9 = avx2__x3(q3), q27 = avx2__x3(q9), q81 = avx2__x3(q27);
    int32_t h;
    memcpy(&h, b->qh, 4);
    __m256i h1 = _mm256_set1_epi32(h), h3 = avx2__x3(h1), h9 = avx2__x3(h3), h27 = avx2__x3(h9);
    __m256i t = _mm256_blend_epi32(q81, h1, 0x10);
    t = _mm256_blend_epi32(t, h3, 0x20);
    t = _mm256_blend_epi32(t, h9, 0x40);
    t = _mm256_blend_epi32(t, h27, 0x80);
    u[5] = avx2__tq1_digit(_mm256_blend_epi32(q1, q3, 0xF0));
    u[6] = avx2__tq1_digit(_mm256_blend_epi32(q9, q27, 0xF0));
    u[7] = avx2__tq1_digit(t);
}

/* A TQ1_0 (T1 = 1) or TQ2_0 tile. */
KERN_INLINE void avx2__tile_tq(int T1, int64_t K, const uint8_t *const *wr,
                               const kern_block_q8_K *const *x, int nc, float *out) {
    const int bs = T1 ? (int)sizeof(kern_block_tq1_0) : (int)sizeof(kern_block_tq2_0);
    __m256 acc[NCQ];
    UNROLL
    for (int j = 0; j < nc; j++)
        acc[j] = _mm256_setzero_ps();
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < K / KERN_QK_K; i++) {
        const uint8_t *wb = wr[0] + i * bs;
        __m256i u[8];
        float d;
        if (T1) {
            const kern_block_tq1_0 *b = (const kern_block_tq1_0 *)(const void *)wb;
            avx2__tq1_decode(b, u);
            d = avx2__f16(b->d);
        } else {
            const kern_block_tq2_0 *b = (const kern_block_tq2_0 *)(const void *)wb;
            UNROLL
            for (int g = 0; g < 8; g++)
                u[g] = avx2__q2(b->qs, g);
            d = avx2__f16(b->d);
        }
        UNROLL
        for (int j = 0; j < nc; j++) {
            const kern_block_q8_K *xb = &x[j][i];
            __m256i p16 = _mm256_setzero_si256();
            UNROLL
            for (int g = 0; g < 8; g++) {
                __m256i bx = _mm256_loadu_si256((const __m256i *)(const void *)(xb->qs + 32 * g));
                p16 = _mm256_add_epi16(p16, _mm256_maddubs_epi16(u[g], bx));
            }
            __m256i bsum = _mm256_loadu_si256((const __m256i *)(const void *)xb->bsums);
            __m256i isum = _mm256_sub_epi32(_mm256_madd_epi16(p16, ones16),
                                            _mm256_madd_epi16(bsum, ones16)); // sum (u - 1) * x
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(isum), acc[j]);
        }
    }
    UNROLL
    for (int j = 0; j < nc; j++)
        out[j] = avx2__hsum(acc[j]);
}

KERN_INLINE void avx2__tile_tq1_0(int64_t K, const uint8_t *const *wr, int nr,
                                  const kern_block_q8_K *const *x, int nc, float *out) {
    (void)nr; // nr == 1
    avx2__tile_tq(1, K, wr, x, nc, out);
}
KERN_INLINE void avx2__tile_tq2_0(int64_t K, const uint8_t *const *wr, int nr,
                                  const kern_block_q8_K *const *x, int nc, float *out) {
    (void)nr; // nr == 1
    avx2__tile_tq(0, K, wr, x, nc, out);
}

AVX2_MATMUL(tq1_0, 1, NCQ, avx2__tile_tq1_0, kern_block_q8_K)
AVX2_MATMUL(tq2_0, 1, NCQ, avx2__tile_tq2_0, kern_block_q8_K)

// The codebook types (IQ1_*, IQ2_*, IQ3_*) x Q8_K: one weight row per tile,
// each sub-block decoded once (iq_simd.h) into 32 signed int8 weights w
// (|w| <= 62) and the int16 scales of its halves; per column
// madd(maddubs(|w|, sign(x, w)), scales), exact (pairs <= 15748), then one
// fma by d * factor * d_x per super-block. Integer sums are ref's; error as
// the other Q8_K kernels' (MATMUL_REL of sum|w*x|).

KERN_INLINE void avx2__tile_iq(ks_dtype T, int64_t K, const uint8_t *const *wr,
                               const kern_block_q8_K *const *x, int nc, float *out) {
    const int64_t bs = ks_dtype_block_bytes(T);
    __m256 acc[NCQ];
    UNROLL
    for (int j = 0; j < nc; j++)
        acc[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < K / KERN_QK_K; i++) {
        const uint8_t *b = wr[0] + i * bs;
        __m256i w[8], scv[8]; // sub-block s: signed weights; int16 scales (halves)
        UNROLL
        for (int s = 0; s < 8; s++) {
            int l0, l1;
            w[s] = iqs__decode(T, b, s, &l0, &l1);
            scv[s] = _mm256_set_m128i(_mm_set1_epi16((short)l1), _mm_set1_epi16((short)l0));
        }
        float d = iqs__d(T, b);
        UNROLL
        for (int j = 0; j < nc; j++) {
            const kern_block_q8_K *xb = &x[j][i];
            __m256i isum = _mm256_setzero_si256();
            UNROLL
            for (int s = 0; s < 8; s++) {
                __m256i bx = _mm256_loadu_si256((const __m256i *)(const void *)(xb->qs + 32 * s));
                __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w[s], w[s]), _mm256_sign_epi8(bx, w[s]));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scv[s]));
            }
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(isum), acc[j]);
        }
    }
    UNROLL
    for (int j = 0; j < nc; j++)
        out[j] = avx2__hsum(acc[j]);
}

KERN_INLINE void avx2__tile_iq2_xxs(int64_t K, const uint8_t *const *wr, int nr,
                                   const kern_block_q8_K *const *x, int nc, float *out) {
    (void)nr; // nr == 1
    avx2__tile_iq(KS_DTYPE_IQ2_XXS, K, wr, x, nc, out);
}
AVX2_MATMUL(iq2_xxs, 1, NCQ, avx2__tile_iq2_xxs, kern_block_q8_K)
KERN_INLINE void avx2__tile_iq2_xs(int64_t K, const uint8_t *const *wr, int nr,
                                   const kern_block_q8_K *const *x, int nc, float *out) {
    (void)nr; // nr == 1
    avx2__tile_iq(KS_DTYPE_IQ2_XS, K, wr, x, nc, out);
}
AVX2_MATMUL(iq2_xs, 1, NCQ, avx2__tile_iq2_xs, kern_block_q8_K)
KERN_INLINE void avx2__tile_iq2_s(int64_t K, const uint8_t *const *wr, int nr,
                                   const kern_block_q8_K *const *x, int nc, float *out) {
    (void)nr; // nr == 1
    avx2__tile_iq(KS_DTYPE_IQ2_S, K, wr, x, nc, out);
}
AVX2_MATMUL(iq2_s, 1, NCQ, avx2__tile_iq2_s, kern_block_q8_K)
KERN_INLINE void avx2__tile_iq3_xxs(int64_t K, const uint8_t *const *wr, int nr,
                                   const kern_block_q8_K *const *x, int nc, float *out) {
    (void)nr; // nr == 1
    avx2__tile_iq(KS_DTYPE_IQ3_XXS, K, wr, x, nc, out);
}
AVX2_MATMUL(iq3_xxs, 1, NCQ, avx2__tile_iq3_xxs, kern_block_q8_K)
KERN_INLINE void avx2__tile_iq3_s(int64_t K, const uint8_t *const *wr, int nr,
                                   const kern_block_q8_K *const *x, int nc, float *out) {
    (void)nr; // nr == 1
    avx2__tile_iq(KS_DTYPE_IQ3_S, K, wr, x, nc, out);
}
AVX2_MATMUL(iq3_s, 1, NCQ, avx2__tile_iq3_s, kern_block_q8_K)
KERN_INLINE void avx2__tile_iq1_s(int64_t K, const uint8_t *const *wr, int nr,
                                   const kern_block_q8_K *const *x, int nc, float *out) {
    (void)nr; // nr == 1
    avx2__tile_iq(KS_DTYPE_IQ1_S, K, wr, x, nc, out);
}
AVX2_MATMUL(iq1_s, 1, NCQ, avx2__tile_iq1_s, kern_block_q8_K)
KERN_INLINE void avx2__tile_iq1_m(int64_t K, const uint8_t *const *wr, int nr,
                                   const kern_block_q8_K *const *x, int nc, float *out) {
    (void)nr; // nr == 1
    avx2__tile_iq(KS_DTYPE_IQ1_M, K, wr, x, nc, out);
}
AVX2_MATMUL(iq1_m, 1, NCQ, avx2__tile_iq1_m, kern_block_q8_K)

// ----------------------------------------------------------------------------
// Activation quantizers: must produce the same bytes as
// kern__quantize_q8_0_ref / kern__quantize_q8_K_ref (tolerance: exact). The
// max is order-independent, d and 1/d are computed by the same scalar code,
// x*id is one f32 multiply, and cvtps2dq rounds half-to-even like lrintf.

/* 32 floats -> 32 int8 = clamp(round(x*id), -127, 127), in element order. */
KERN_INLINE __m256i avx2__q8x32(const float *x, __m256 id) {
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    __m256i v[4];
    UNROLL
    for (int a = 0; a < 4; a++) {
        __m256i t = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * a), id));
        v[a] = _mm256_min_epi32(_mm256_max_epi32(t, lo), hi);
    }
    __m256i p01 = _mm256_packs_epi32(v[0], v[1]), p23 = _mm256_packs_epi32(v[2], v[3]);
    __m256i p = _mm256_packs_epi16(p01, p23);
    // packs interleaves the 128-bit lanes: dwords come out as 0,2,4,6,1,3,5,7
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

KERN_INLINE float avx2__amax(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int a = 0; a < n; a += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + a)));
    return avx2__hmax(m);
}

static void avx2__quantize_q8_0(const float *x, void *y, int64_t n) {
    kern_block_q8_0 *b = y;
    for (int64_t i = 0; i < n / KERN_QK8_0; i++) {
        const float *xb = x + 32 * i;
        uint16_t d16 = ks_f32_to_f16(avx2__amax(xb, 32) / 127.0f);
        float d = ks_f16_to_f32(d16);
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = d16;
        _mm256_storeu_si256((__m256i *)(void *)b[i].qs, avx2__q8x32(xb, _mm256_set1_ps(id)));
    }
}

static void avx2__quantize_q8_K(const float *x, void *y, int64_t n) {
    kern_block_q8_K *b = y;
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        const float *xb = x + KERN_QK_K * i;
        float d = avx2__amax(xb, KERN_QK_K) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = d;
        __m256i one = _mm256_set1_epi8(1);
        int16_t bs[16];
        for (int a = 0; a < 8; a++) {
            __m256i q = avx2__q8x32(xb + 32 * a, _mm256_set1_ps(id));
            _mm256_storeu_si256((__m256i *)(void *)(b[i].qs + 32 * a), q);
            // pairwise int16 sums, then 8 per 128-bit lane -> the two bsums
            __m256i s16 = _mm256_maddubs_epi16(one, q);
            __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
            __m128i l = _mm256_castsi256_si128(s32), h = _mm256_extracti128_si256(s32, 1);
            l = _mm_hadd_epi32(l, h);   // l0+l1, l2+l3, h0+h1, h2+h3
            l = _mm_hadd_epi32(l, l);   // lo16, hi16, ...
            bs[2 * a] = (int16_t)_mm_cvtsi128_si32(l);
            bs[2 * a + 1] = (int16_t)_mm_extract_epi32(l, 1);
        }
        memcpy(b[i].bsums, bs, sizeof bs);
    }
}

// ----------------------------------------------------------------------------
// Vector ops

/* Must match kern__dot_f32_ref within relative 1e-5 of sum|a*b| (same
 * accumulation as the F32 matmul). */
static float avx2__dot_f32(int64_t n, const float *a, const float *b) {
    float out[NC_MAX];
    const float *xp[1] = {b};
    const uint8_t *wp[1] = {(const uint8_t *)a};
    avx2__tile_f32(n, wp, 1, xp, 1, out);
    return out[0];
}

/* Must match kern__axpy_f32_ref exactly: the same fma per element. */
static void avx2__axpy_f32(int64_t n, float a, const float *x, float *y) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] = fmaf(a, x[i], y[i]);
}

// KV attention ops (kern.h): rows in the pool's KV type, strides in bytes.
// dot_rows must match kern__dot_rows_<type>_ref within relative 1e-5 of
// sum|q*k| (the F32 matmul's accumulation); the typed ones compute exactly
// what avx2__dot_rows_f32 computes on the dequantized rows (their loaders
// produce the dequantized floats, and fma(k, q) = fma(q, k)). axpy_rows
// match kern__axpy_rows_<type>_ref exactly (the same fma). Heads one by one.

/* avx2__dot_f32 per head and row: the same values. */
static void avx2__dot_rows_f32(int64_t n, int G, const float *q, const void *k, size_t k_stride,
                               int rows, float scale, float *out, size_t o_stride) {
    for (int g = 0; g < G; g++)
        for (int j = 0; j < rows; j++)
            out[(size_t)g * o_stride + (size_t)j] =
                avx2__dot_f32(
                    n, q + (size_t)g * (size_t)n,
                    (const float *)(const void *)((const uint8_t *)k + (size_t)j * k_stride)) *
                scale;
}

#define AVX2_DOT_ROWS(T)                                                                           \
    static void avx2__dot_rows_##T(int64_t n, int G, const float *q, const void *k,                \
                                   size_t k_stride, int rows, float scale, float *out,             \
                                   size_t o_stride) {                                              \
        for (int g = 0; g < G; g++) {                                                              \
            const float *xp[1] = {q + (size_t)g * (size_t)n};                                      \
            for (int j = 0; j < rows; j++) {                                                       \
                const uint8_t *wp[1] = {(const uint8_t *)k + (size_t)j * k_stride};                \
                float o[NC_MAX];                                                                   \
                avx2__tile_##T(n, wp, 1, xp, 1, o);                                                \
                out[(size_t)g * o_stride + (size_t)j] = o[0] * scale;                              \
            }                                                                                      \
        }                                                                                          \
    }
AVX2_DOT_ROWS(f16)
AVX2_DOT_ROWS(kvq8)

/* avx2__axpy_f32 per head and row: matches kern__axpy_rows_f32_ref exactly. */
static void avx2__axpy_rows_f32(int64_t n, int G, const float *s, size_t s_stride, const void *v,
                                size_t v_stride, int rows, float *y) {
    for (int g = 0; g < G; g++)
        for (int j = 0; j < rows; j++)
            avx2__axpy_f32(n, s[(size_t)g * s_stride + (size_t)j],
                           (const float *)(const void *)((const uint8_t *)v + (size_t)j * v_stride),
                           y + (size_t)g * (size_t)n);
}

/* y_g += s_g[j] * row j per 8 elements with the typed loader (n % 8 tail
 * scalar, F16 only: Q8_0 rows are whole blocks); the same fma as ref. */
#define AVX2_AXPY_ROWS(T)                                                                          \
    static void avx2__axpy_rows_##T(int64_t n, int G, const float *s, size_t s_stride,             \
                                    const void *v, size_t v_stride, int rows, float *y) {          \
        for (int g = 0; g < G; g++)                                                                \
            for (int j = 0; j < rows; j++) {                                                       \
                const uint8_t *r = (const uint8_t *)v + (size_t)j * v_stride;                      \
                const float a = s[(size_t)g * s_stride + (size_t)j];                               \
                const __m256 va = _mm256_set1_ps(a);                                               \
                float *yg = y + (size_t)g * (size_t)n;                                             \
                int64_t i = 0;                                                                     \
                for (; i + 8 <= n; i += 8)                                                         \
                    _mm256_storeu_ps(                                                              \
                        yg + i, _mm256_fmadd_ps(va, avx2__ld_##T(r, i), _mm256_loadu_ps(yg + i))); \
                if (i < n) {                                                                       \
                    float t[8];                                                                    \
                    _mm256_storeu_ps(t, avx2__ldn_##T(r, i, n - i));                               \
                    for (int64_t l = 0; i + l < n; l++)                                            \
                        yg[i + l] = fmaf(a, t[l], yg[i + l]);                                      \
                }                                                                                  \
            }                                                                                      \
    }
AVX2_AXPY_ROWS(f16)
AVX2_AXPY_ROWS(kvq8)

/* F16 store: vcvtps2ph with round-to-nearest-even writes the bytes of
 * kern__quantize_f16_ref (ks_f32_to_f16) for every non-NaN input. */
static void avx2__kv_store_f16(const float *x, void *y, int64_t n) {
    uint8_t *o = y;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(
            (__m128i *)(void *)(o + 2 * i),
            _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) kern__quantize_f16_ref(x + i, o + 2 * i, n - i);
}

/* Must match kern__rmsnorm_ref within relative 1e-5: only the sum of squares
 * differs (f32 lanes vs double); the per-element (x*scale)*w is the same. */
static void avx2__rmsnorm(int64_t n, const float *x, const float *w, float eps, float *y) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 v0 = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
    }
    if (i < n) {
        __m256 v0 = _mm256_maskload_ps(x + i, avx2__mask(n - i));
        a0 = _mm256_fmadd_ps(v0, v0, a0);
    }
    float ss = avx2__hsum(_mm256_add_ps(a0, a1));
    float scale = (float)(1.0 / sqrt((double)ss / (double)n + (double)eps));
    __m256 vs = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs),
                                              _mm256_loadu_ps(w + i)));
    for (; i < n; i++) y[i] = (x[i] * scale) * w[i];
}

/* Must match kern__silu_mul_ref within relative 1e-5 (avx2__exp is ~2 ulp
 * from expf; the rest is the same f32 ops). */
static void avx2__silu_mul(int64_t n, const float *g, const float *u, float *y) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n; i += 8) {
        int64_t m = n - i < 8 ? n - i : 8;
        __m256i msk = avx2__mask(m);
        __m256 vg = _mm256_maskload_ps(g + i, msk), vu = _mm256_maskload_ps(u + i, msk);
        __m256 e = avx2__exp(_mm256_xor_ps(vg, sign));
        __m256 s = _mm256_div_ps(vg, _mm256_add_ps(one, e));
        _mm256_maskstore_ps(y + i, msk, _mm256_mul_ps(s, vu));
    }
}

/* Must match kern__gelu_mul_ref within relative 1e-5: the same f32 ops in
 * the same order, no fma (kern_int.h KERN_GELU_C), avx2__exp ~2 ulp from
 * expf. Masked loads handle the tail, so no scalar code can be contracted. */
static void avx2__gelu_mul(int64_t n, const float *g, const float *u, float *y) {
    const __m256 one = _mm256_set1_ps(1.0f), m2 = _mm256_set1_ps(-2.0f);
    const __m256 c = _mm256_set1_ps(KERN_GELU_C), a = _mm256_set1_ps(KERN_GELU_A);
    for (int64_t i = 0; i < n; i += 8) {
        int64_t m = n - i < 8 ? n - i : 8;
        __m256i msk = avx2__mask(m);
        __m256 x = _mm256_maskload_ps(g + i, msk), vu = _mm256_maskload_ps(u + i, msk);
        __m256 in = _mm256_add_ps(one, _mm256_mul_ps(_mm256_mul_ps(a, x), x));
        __m256 z2 = _mm256_mul_ps(m2, _mm256_mul_ps(_mm256_mul_ps(c, x), in));
        __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, avx2__exp(z2)));
        _mm256_maskstore_ps(y + i, msk, _mm256_mul_ps(s, vu));
    }
}

/* Must match kern__softmax_ref within relative 1e-5 per element: the max is
 * exact, exp ~2 ulp, the sum is f32 lanes instead of double. */
static void avx2__softmax(int64_t n, float *x) {
    if (n <= 0) return;
    __m256 vm = _mm256_set1_ps(x[0]);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + i));
    float mx = avx2__hmax(vm);
    for (; i < n; i++) mx = fmaxf(mx, x[i]);
    __m256 vmx = _mm256_set1_ps(mx), acc = _mm256_setzero_ps();
    for (i = 0; i < n; i += 8) {
        int64_t m = n - i < 8 ? n - i : 8;
        __m256i msk = avx2__mask(m);
        __m256 e = avx2__exp(_mm256_sub_ps(_mm256_maskload_ps(x + i, msk), vmx));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(msk));
        _mm256_maskstore_ps(x + i, msk, e);
        acc = _mm256_add_ps(acc, e);
    }
    __m256 inv = _mm256_set1_ps((float)(1.0 / (double)avx2__hsum(acc)));
    for (i = 0; i < n; i += 8) {
        int64_t m = n - i < 8 ? n - i : 8;
        __m256i msk = avx2__mask(m);
        _mm256_maskstore_ps(x + i, msk, _mm256_mul_ps(_mm256_maskload_ps(x + i, msk), inv));
    }
}

// ----------------------------------------------------------------------------
// Vtab

/* r16 weights (kern.h) through the plain kernels: their results, bit for bit. */
KERN_R16_VIA(avx2__matmul_r16_q8_0, avx2__matmul_q8_0, KS_DTYPE_Q8_0)
KERN_R16_VIA(avx2__matmul_r16_q4_0, avx2__matmul_q4_0, KS_DTYPE_Q4_0)
KERN_R16_VIA(avx2__matmul_r16_q4_K, avx2__matmul_q4_K, KS_DTYPE_Q4_K)
KERN_R16_VIA(avx2__matmul_r16_q6_K, avx2__matmul_q6_K, KS_DTYPE_Q6_K)
KERN_R16_VIA(avx2__matmul_r16_q5_0, avx2__matmul_q5_0, KS_DTYPE_Q5_0)
KERN_R16_VIA(avx2__matmul_r16_q5_K, avx2__matmul_q5_K, KS_DTYPE_Q5_K)
KERN_R16_VIA(avx2__matmul_r16_q3_K, avx2__matmul_q3_K, KS_DTYPE_Q3_K)
KERN_R16_VIA(avx2__matmul_r16_q2_K, avx2__matmul_q2_K, KS_DTYPE_Q2_K)
KERN_R16_VIA(avx2__matmul_r16_iq4_xs, avx2__matmul_iq4_xs, KS_DTYPE_IQ4_XS)
KERN_R16_VIA(avx2__matmul_r16_mxfp4, avx2__matmul_mxfp4, KS_DTYPE_MXFP4)

const kern_vtab kern__vtab_avx2 = {
    .name = "avx2",
    .matmul =
        {
            [KS_DTYPE_F32] = avx2__matmul_f32,
            [KS_DTYPE_F16] = avx2__matmul_f16,
            [KS_DTYPE_BF16] = avx2__matmul_bf16,
            [KS_DTYPE_Q8_0] = avx2__matmul_q8_0,
            [KS_DTYPE_Q4_0] = avx2__matmul_q4_0,
            [KS_DTYPE_Q4_K] = avx2__matmul_q4_K,
            [KS_DTYPE_Q6_K] = avx2__matmul_q6_K,
            [KS_DTYPE_Q4_1] = avx2__matmul_q4_1,
            [KS_DTYPE_Q5_0] = avx2__matmul_q5_0,
            [KS_DTYPE_Q5_1] = avx2__matmul_q5_1,
            [KS_DTYPE_IQ4_NL] = avx2__matmul_iq4_nl,
            [KS_DTYPE_Q5_K] = avx2__matmul_q5_K,
            [KS_DTYPE_Q3_K] = avx2__matmul_q3_K,
            [KS_DTYPE_Q2_K] = avx2__matmul_q2_K,
            [KS_DTYPE_IQ4_XS] = avx2__matmul_iq4_xs,
            [KS_DTYPE_TQ1_0] = avx2__matmul_tq1_0,
            [KS_DTYPE_TQ2_0] = avx2__matmul_tq2_0,
            [KS_DTYPE_MXFP4] = avx2__matmul_mxfp4,
            [KS_DTYPE_IQ2_XXS] = avx2__matmul_iq2_xxs,
            [KS_DTYPE_IQ2_XS] = avx2__matmul_iq2_xs,
            [KS_DTYPE_IQ2_S] = avx2__matmul_iq2_s,
            [KS_DTYPE_IQ3_XXS] = avx2__matmul_iq3_xxs,
            [KS_DTYPE_IQ3_S] = avx2__matmul_iq3_s,
            [KS_DTYPE_IQ1_S] = avx2__matmul_iq1_s,
            [KS_DTYPE_IQ1_M] = avx2__matmul_iq1_m,
        },
    .matmul_r16 =
        {
            [KS_DTYPE_Q8_0] = avx2__matmul_r16_q8_0,
            [KS_DTYPE_Q4_0] = avx2__matmul_r16_q4_0,
            [KS_DTYPE_Q4_K] = avx2__matmul_r16_q4_K,
            [KS_DTYPE_Q6_K] = avx2__matmul_r16_q6_K,
            [KS_DTYPE_Q5_0] = avx2__matmul_r16_q5_0,
            [KS_DTYPE_Q5_K] = avx2__matmul_r16_q5_K,
            [KS_DTYPE_Q3_K] = avx2__matmul_r16_q3_K,
            [KS_DTYPE_Q2_K] = avx2__matmul_r16_q2_K,
            [KS_DTYPE_IQ4_XS] = avx2__matmul_r16_iq4_xs,
            [KS_DTYPE_MXFP4] = avx2__matmul_r16_mxfp4,
        },
    .quantize_act =
        {
            [KS_DTYPE_F32] = kern__quantize_f32_ref, /* a copy: nothing to vectorize */
            [KS_DTYPE_Q8_0] = avx2__quantize_q8_0,
            [KS_DTYPE_Q8_K] = avx2__quantize_q8_K,
        },
    .dot_f32 = avx2__dot_f32,
    .axpy_f32 = avx2__axpy_f32,
    .dot_rows =
        {
            [KS_DTYPE_F32] = avx2__dot_rows_f32,
            [KS_DTYPE_F16] = avx2__dot_rows_f16,
            [KS_DTYPE_Q8_0] = avx2__dot_rows_kvq8,
        },
    .axpy_rows =
        {
            [KS_DTYPE_F32] = avx2__axpy_rows_f32,
            [KS_DTYPE_F16] = avx2__axpy_rows_f16,
            [KS_DTYPE_Q8_0] = avx2__axpy_rows_kvq8,
        },
    .kv_store =
        {
            [KS_DTYPE_F32] = kern__quantize_f32_ref, /* a copy */
            [KS_DTYPE_F16] = avx2__kv_store_f16,
            [KS_DTYPE_Q8_0] = avx2__quantize_q8_0,
        },
    .rmsnorm = avx2__rmsnorm,
    .silu_mul = avx2__silu_mul,
    .gelu_mul = avx2__gelu_mul,
    .softmax = avx2__softmax,
    .attn_block = kern__attn_block_ref, // the reference: long-context speed is the AVX-512 path's
    .attn_block_bf16 = kern__attn_block_ref_bf16,
    .gdn_step = kern__avx2_gdn_step,
};
