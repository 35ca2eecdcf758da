/* iq_simd.h — private to avx2.c and avx512.c (both built with -mavx2): the
 * AVX2 decoder of the codebook types (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
 * IQ3_XXS, IQ3_S; layouts in kern_int.h, the scalar spelling in ref_iq.c's
 * kern__iq_decode). It turns one 32-element sub-block into 32 signed int8
 * weights w and the odd scales of its two halves, so that a kernel's dot is
 * sum ls * sum w * x with exact integer lanes, then d * KERN_IQ_FACTOR once
 * per super-block: the same integers as kern__iq_decode's, so the same sums
 * as the reference. Grid entries are gathered by scalar loads (a vpgather
 * costs more on AMD cores), signs applied with a byte mask. */
#ifndef KS_KERN_IQ_SIMD_H
#define KS_KERN_IQ_SIMD_H

#include "kern/kern_int.h"

#include <immintrin.h>

#define IQS_INLINE static inline __attribute__((always_inline))

/* 0xFF in byte i where bit i of s is set (i < 32). */
IQS_INLINE __m256i iqs__bits32(uint32_t s) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)s), shuf);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bits), bits);
}

/* Bytes g negated where bit i of s is set: (g ^ m) - m. */
IQS_INLINE __m256i iqs__signed(__m256i g, uint32_t s) {
    __m256i m = iqs__bits32(s);
    return _mm256_sub_epi8(_mm256_xor_si256(g, m), m);
}

IQS_INLINE __m256i iqs__g64(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
    return _mm256_set_epi64x((long long)d, (long long)c, (long long)b, (long long)a);
}

IQS_INLINE uint32_t iqs__u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
IQS_INLINE uint16_t iqs__u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* d * KERN_IQ_FACTOR(T) of the super-block at b (exact: a power of 2). */
IQS_INLINE float iqs__d(ks_dtype T, const uint8_t *b) {
    uint16_t h;
    if (T == KS_DTYPE_IQ1_M) { // the top nibbles of the four u16 scales (kern_int.h)
        const uint8_t *sc = b + 48;
        h = (uint16_t)((iqs__u16(sc) >> 12) | ((iqs__u16(sc + 2) >> 8) & 0x00f0) |
                       ((iqs__u16(sc + 4) >> 4) & 0x0f00) | (iqs__u16(sc + 6) & 0xf000));
    } else {
        h = iqs__u16(b);
    }
    return _cvtsh_ss(h) * KERN_IQ_FACTOR(T);
}

/* IQ1_*: 8 * (grid value -1, 0, 1) + sgn, sgn the delta's sign per group of 8
 * (a byte mask: 0 for +1, 0xFF.. for -1). */
IQS_INLINE __m256i iqs__iq1(uint64_t a, uint64_t b, uint64_t c, uint64_t d, __m256i neg) {
    __m256i g = iqs__g64(a, b, c, d);
    g = _mm256_add_epi8(g, g);
    g = _mm256_add_epi8(g, g);
    g = _mm256_add_epi8(g, g);
    return _mm256_add_epi8(g, _mm256_or_si256(neg, _mm256_set1_epi8(1)));
}

/* Sub-block j (0..7) of the type-T super-block at b: the 32 signed weights
 * in element order, and the scales of elements 0-15 (*l0) and 16-31 (*l1). */
IQS_INLINE __m256i iqs__decode(ks_dtype T, const uint8_t *b, int j, int *l0, int *l1) {
    if (T == KS_DTYPE_IQ2_XXS) { // qs at +2: 4 indices, then u32 signs | scale << 28
        const uint8_t *q = b + 2 + 8 * j;
        uint32_t a = iqs__u32(q + 4);
        *l0 = *l1 = (int)(2 * (a >> 28) + 1);
        uint32_t s = kern__iq_signs7(a & 127) | (uint32_t)kern__iq_signs7((a >> 7) & 127) << 8 |
                     (uint32_t)kern__iq_signs7((a >> 14) & 127) << 16 |
                     (uint32_t)kern__iq_signs7((a >> 21) & 127) << 24;
        return iqs__signed(iqs__g64(kern_iq2xxs_grid[q[0]], kern_iq2xxs_grid[q[1]],
                                    kern_iq2xxs_grid[q[2]], kern_iq2xxs_grid[q[3]]),
                           s);
    }
    if (T == KS_DTYPE_IQ2_XS) { // qs at +2: u16 index | signs << 9; scales at +66
        const uint8_t *q = b + 2 + 8 * j;
        uint16_t v[4];
        memcpy(v, q, 8);
        *l0 = 2 * (b[66 + j] & 15) + 1;
        *l1 = 2 * (b[66 + j] >> 4) + 1;
        uint32_t s = kern__iq_signs7(v[0] >> 9) | (uint32_t)kern__iq_signs7(v[1] >> 9) << 8 |
                     (uint32_t)kern__iq_signs7(v[2] >> 9) << 16 |
                     (uint32_t)kern__iq_signs7(v[3] >> 9) << 24;
        return iqs__signed(iqs__g64(kern_iq2xs_grid[v[0] & 511], kern_iq2xs_grid[v[1] & 511],
                                    kern_iq2xs_grid[v[2] & 511], kern_iq2xs_grid[v[3] & 511]),
                           s);
    }
    if (T == KS_DTYPE_IQ2_S) { // qs +2, signs +34, qh +66, scales +74
        const uint8_t *q = b + 2 + 4 * j;
        const int h = b[66 + j];
        *l0 = 2 * (b[74 + j] & 15) + 1;
        *l1 = 2 * (b[74 + j] >> 4) + 1;
        return iqs__signed(iqs__g64(kern_iq2s_grid[q[0] | (h & 3) << 8],
                                    kern_iq2s_grid[q[1] | (h & 12) << 6],
                                    kern_iq2s_grid[q[2] | (h & 48) << 4],
                                    kern_iq2s_grid[q[3] | (h & 192) << 2]),
                           iqs__u32(b + 34 + 4 * j));
    }
    if (T == KS_DTYPE_IQ3_XXS) { // qs +2 (8 indices of 4), u32 signs | scale << 28 at +66
        const uint8_t *q = b + 2 + 8 * j;
        uint32_t a = iqs__u32(b + 66 + 4 * j);
        *l0 = *l1 = (int)(2 * (a >> 28) + 1);
        uint32_t s = kern__iq_signs7(a & 127) | (uint32_t)kern__iq_signs7((a >> 7) & 127) << 8 |
                     (uint32_t)kern__iq_signs7((a >> 14) & 127) << 16 |
                     (uint32_t)kern__iq_signs7((a >> 21) & 127) << 24;
        const uint32_t *g = kern_iq3xxs_grid;
        __m256i v = _mm256_setr_epi32((int)g[q[0]], (int)g[q[1]], (int)g[q[2]], (int)g[q[3]],
                                      (int)g[q[4]], (int)g[q[5]], (int)g[q[6]], (int)g[q[7]]);
        return iqs__signed(v, s);
    }
    if (T == KS_DTYPE_IQ3_S) { // qs +2, qh +66, signs +74, scales +106
        const uint8_t *q = b + 2 + 8 * j;
        const int h = b[66 + j];
        *l0 = *l1 = 2 * ((b[106 + j / 2] >> (4 * (j % 2))) & 15) + 1;
        const uint32_t *g = kern_iq3s_grid;
        __m256i v = _mm256_setr_epi32(
            (int)g[q[0] | (h & 1) << 8], (int)g[q[1] | (h & 2) << 7], (int)g[q[2] | (h & 4) << 6],
            (int)g[q[3] | (h & 8) << 5], (int)g[q[4] | (h & 16) << 4], (int)g[q[5] | (h & 32) << 3],
            (int)g[q[6] | (h & 64) << 2], (int)g[q[7] | (h & 128) << 1]);
        return iqs__signed(v, iqs__u32(b + 74 + 4 * j));
    }
    if (T == KS_DTYPE_IQ1_S) { // qs +2, u16 qh at +34: index bits 3l, scale 12, sign 15
        const uint8_t *q = b + 2 + 4 * j;
        const uint32_t h = iqs__u16(b + 34 + 2 * j);
        *l0 = *l1 = (int)(2 * ((h >> 12) & 7) + 1);
        const uint64_t *g = kern_iq1s_grid;
        __m256i neg = _mm256_set1_epi8(h & 0x8000 ? -1 : 0);
        return iqs__iq1(g[q[0] | (h & 7) << 8], g[q[1] | (h & 56) << 5], g[q[2] | (h & 448) << 2],
                        g[q[3] | (h & 3584) >> 1], neg);
    }
    // IQ1_M: qs +0, qh +32 (2 bytes a sub-block), u16 scales +48
    const uint8_t *q = b + 4 * j;
    const int h0 = b[32 + 2 * j], h1 = b[33 + 2 * j];
    const int sc = iqs__u16(b + 48 + 2 * (j / 2)) >> (6 * (j % 2));
    *l0 = 2 * (sc & 7) + 1;
    *l1 = 2 * ((sc >> 3) & 7) + 1;
    const uint64_t *g = kern_iq1s_grid;
    __m256i neg = _mm256_set_epi64x(h1 & 0x80 ? -1 : 0, h1 & 0x08 ? -1 : 0, h0 & 0x80 ? -1 : 0,
                                    h0 & 0x08 ? -1 : 0);
    return iqs__iq1(g[q[0] | (h0 & 7) << 8], g[q[1] | (h0 & 0x70) << 4], g[q[2] | (h1 & 7) << 8],
                    g[q[3] | (h1 & 0x70) << 4], neg);
}

#endif /* KS_KERN_IQ_SIMD_H */
