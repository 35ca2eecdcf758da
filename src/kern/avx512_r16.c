/* avx512_r16.c — the AVX-512 matmuls over the r16 layout (kern.h: 16
 * weight rows interleaved, so that lane l of a vector is row l of the group
 * and a vpdpbusd does 64 useful products with no reduction): Q8_0, Q4_0,
 * Q5_0, Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, IQ4_XS and MXFP4, their activation
 * preparation, and the matvec drivers that stream the groups. Built with
 * the flags of avx512.c, whose header states the rules these kernels keep
 * too (batch invariance, exact integer lanes, VNNI and plain forms
 * bit-identical, KS_AVX512_NO_VNNI); the Q6_K matvec uses GFNI where the
 * CPU has it (KS_AVX512_NO_GFNI=1 forces the shift form). avx512.c's vtab
 * calls these; they call nothing of avx512.c (the helpers they share are
 * avx512_int.h's, inline). */
#include "kern/avx512_int.h"

#include <math.h>

/* A512_FOR_C for tiles of up to 8 columns (the wide tiles). */
#define A512_FOR_C8 _Pragma("GCC unroll 8") for (int c = 0; c < C; c++)

// ----------------------------------------------------------------------------
// Q8_0 / Q4_0 weights in the r16 layout (kern.h) x Q8_0 activations
// Lane l of a row vector is row l of a 16-row group, so one vpdpbusd does 64
// useful products and no reduction is needed. Per block and element: isum =
// corr + the products of the unsigned weight bytes (Q8_0: w + 128; Q4_0: the
// nibble q) with the signed activations, exact; corr takes the offset back
// out (-128 * sum(x), or -8 * sum(x) for Q4_0's q - 8), so isum equals
// ref.c's block sum. Then acc = fma((float)isum, d_w * d_x, acc), blocks in
// order: one cvt, mul and fma per 8 vpdpbusd, where the row-major tiles
// spend them per 2.

/* One block of an activation row, prepared for the r16 tiles. */
typedef struct a512_r16x {
    float d;      /* the block's scale */
    int32_t corr; /* -128 * sum(qs) (Q8_0 weights), -8 * (Q4_0) or -16 * (Q5_0) */
    int8_t qs[32];
} a512_r16x;

/* The 4 activation bytes at p in every int32 lane. */
A512_INLINE __m512i a512__bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* Bit s of every byte of h moved to bit 4 of the same byte (the other bits
 * garbage, masked by the caller): Q5's fifth bit, stored at bit s by the
 * r16 layouts (kern.h). One rotate of each dword by 4 - s (mod 32). */
A512_INLINE __m512i a512__bit_to4(__m512i h, int s) {
    return _mm512_rolv_epi32(h, _mm512_set1_epi32((4 - s) & 31));
}

/* The 5-bit values q = nib | (bit 4 of h') of a Q5 step: nib the masked
 * nibbles, h' from a512__bit_to4 (one vpternlogd: A | (B & C)). */
A512_INLINE __m512i a512__or_bit4(__m512i nib, __m512i h4) {
    return _mm512_ternarylogic_epi32(nib, h4, _mm512_set1_epi8(0x10), 0xF8);
}

/* A scheduling fence: GCC's scheduler moves nothing across it. Without the
 * fences below GCC 12 hoisted a whole super-block's prefetches and loads of
 * the Q6_K matvec to its top and its sub-block products to its end, 16
 * accumulators live and zmm spills in the loop; with them each 64-byte
 * step's prefetches, loads and arithmetic stay together, and the matvec
 * keeps 0.93-0.96 of a read-only loop's rate over the same bytes where it
 * kept 0.89-0.91 (bench_stream, 2026-12-03). No value changes. */
A512_INLINE void a512__sched_fence(void) { __asm__ volatile(""); }

/* As a512__sched_fence, and *v is materialized here: the adds into it
 * cannot be reassociated past this point. */
A512_INLINE void a512__sched_pin(__m512i *v) { __asm__ volatile("" : "+v"(*v)); }

/* The Rx1 (matvec, R = 1 to 4 groups) r16 Q8_0 (T = 0) or Q4_0 (T = 1)
 * tile: the same exact integer sums and f32 steps per block as
 * a512__r16_tile, walked a pair of blocks at a time (no per-block parity
 * branch and address arithmetic) and fenced per block, the R groups' blocks
 * interleaved (R weight streams, the activations loaded once). K is a
 * multiple of 64 (kern_r16_group_bytes), so every pair is whole. Q4_0
 * kernel / read-only rate 0.93-0.94 -> 0.95-0.97 (bench_stream, 3
 * alternated runs of 21 rounds, 2026-12-03). Each stream prefetches 1/R of
 * A512_AHEAD_Q4 ahead, of A512_AHEAD_Q4X when R > 2. */
A512_INLINE void a512__r16_vec(int T, int R, const a512_tile *t, int V) {
    const int qb = T == 0 ? 512 : 256, ahead = (R > 2 ? A512_AHEAD_Q4X : A512_AHEAD_Q4) / R;
    const size_t pb = 64 + 2 * (size_t)qb;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    const int64_t nb = t->K / 32;
    for (int64_t b = 0; b < nb; b += 2) {
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            const a512_r16x *x = (const a512_r16x *)(const void *)t->X + b + h;
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                const uint8_t *p = t->W + (size_t)r * t->ws + (size_t)(b / 2) * pb;
                if (h == 0) a512__pf_ahead(t->nta, p, ahead);
                const uint8_t *wq = p + 64 + h * qb;
                __m512i s[4];
                s[0] = _mm512_set1_epi32(x->corr);
                s[1] = s[2] = s[3] = _mm512_setzero_si512();
                if (T) {
                    // s[0..1]: low nibbles; s[2..3]: high nibbles left in
                    // place (16 q), so their sum is 16 times the true one,
                    // exactly, and one arithmetic shift per block replaces
                    // a shift per 64 bytes (|16 q x| sums stay far below 2^31)
                    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
                        a512__pf_ahead(t->nta, wq + 64 * j, ahead);
                        __m512i z = _mm512_loadu_si512(wq + 64 * j);
                        a512__sched_pin(&z); // one load for both nibbles
                        __m512i lo = _mm512_and_si512(z, m4), hi16 = _mm512_andnot_si512(m4, z);
                        s[j & 1] = a512__dpbusd_v(V, s[j & 1], lo, a512__bcast4(x->qs + 4 * j));
                        s[2 + (j & 1)] = a512__dpbusd_v(V, s[2 + (j & 1)], hi16,
                                                        a512__bcast4(x->qs + 16 + 4 * j));
                    }
                    s[2] = _mm512_srai_epi32(_mm512_add_epi32(s[2], s[3]), 4);
                    s[3] = _mm512_setzero_si512();
                } else {
                    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
                        a512__pf_ahead(t->nta, wq + 64 * j, ahead);
                        __m512i w = _mm512_loadu_si512(wq + 64 * j);
                        s[j % 4] = a512__dpbusd_v(V, s[j % 4], w, a512__bcast4(x->qs + 4 * j));
                    }
                }
                __m512i is =
                    _mm512_add_epi32(_mm512_add_epi32(s[0], s[1]), _mm512_add_epi32(s[2], s[3]));
                __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32 * h)));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is),
                                         _mm512_mul_ps(wd, _mm512_set1_ps(x->d)), acc[r]);
                a512__sched_fence();
            }
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _mm512_storeu_ps(t->Y + t->yr * r, acc[r]);
}

/* An r16 tile of R groups (16 rows each) x C columns (C up to 8 with R = 1:
 * a512__run_r16's wide tiles). t->W: group 0 (t->ws
 * bytes between groups); t->X: column 0's a512_r16x array (t->xs bytes
 * between columns); t->Y: (row 0, column 0). T: 0 Q8_0, 1 Q4_0, 2 Q5_0
 * weights. Per pair of blocks (kern.h): 64 bytes of scales, then per block
 * its steps of 16 rows x 4 bytes (Q5_0: and its reordered qh, 64 bytes). */
A512_INLINE void a512__r16_tile(int T, int R, int C, const a512_tile *t, int V) {
    if (T < 2 && C == 1) {
        a512__r16_vec(T, R, t, V);
        return;
    }
    const int qb = T == 0 ? 512 : T == 1 ? 256 : 320; /* quant bytes per block and group */
    const size_t pb = 64 + 2 * (size_t)qb;            /* bytes per pair of blocks */
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    // small tiles and the wide ones (a single weight stream) prefetch
    const bool PF = C <= 2 || C > 4;
    __m512 acc[4][8];
    A512_FOR_R A512_FOR_C8 acc[r][c] = _mm512_setzero_ps();
    const int64_t nb = t->K / 32;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wq[4];
        __m512 wd[4];
        const a512_r16x *x[8];
        // small tiles prefetch A512_R16_AHEAD ahead, one line per line
        // loaded, spread as the loads are (not a pair's 9-17 lines at once)
        A512_FOR_R {
            const uint8_t *p = t->W + r * t->ws + (size_t)(b / 2) * pb;
            if (PF && b % 2 == 0) a512__pf_ahead(t->nta, p, A512_R16_AHEAD);
            wd[r] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + (b % 2) * 32)));
            wq[r] = p + 64 + (b % 2) * qb;
        }
        A512_FOR_C8 x[c] = (const a512_r16x *)(const void *)(t->X + c * t->xs) + b;
        // NS partial sums per output vector, so a small tile (a matvec's
        // 1x1) has independent vpdpbusd chains in flight, not one chain of 8
        // (latency-bound: from L2 the Q8_0 matvec ran 54 GB/s a core with
        // one chain, 82 with four); int32 sums are exact: no value changes
        // (a wide tile, one group x 5..8 columns: two per column, its
        // 2C chains then cover the vpdpbusd latency as a 4x4 tile's 16 do)
        const int NS = R == 1 && C > 4 ? 2 : R * C >= 4 ? 1 : R * C == 1 ? 4 : 2;
        __m512i is[4][8], ip[3][4][8];
        A512_FOR_R A512_FOR_C8 {
            is[r][c] = _mm512_set1_epi32(x[c]->corr);
            _Pragma("GCC unroll 3") for (int k = 0; k < NS - 1; k++) ip[k][r][c] =
                _mm512_setzero_si512();
        }
#define A512_R16_IS(k) (*((k) % NS ? &ip[(k) % NS - 1][r][c] : &is[r][c]))
        if (T) {
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) A512_FOR_R {
                if (PF) a512__pf_ahead(t->nta, wq[r] + 64 * j, A512_R16_AHEAD);
                if (PF && T == 2 && j == 0) a512__pf_ahead(t->nta, wq[r] + 256, A512_R16_AHEAD);
                __m512i z = _mm512_loadu_si512(wq[r] + 64 * j);
                __m512i lo = _mm512_and_si512(z, m4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
                if (T == 2) { // bit 4: bit j (low nibbles) or 4 + j (high) of qh's bytes
                    __m512i h = _mm512_loadu_si512(wq[r] + 256);
                    lo = a512__or_bit4(lo, a512__bit_to4(h, j));
                    hi = a512__or_bit4(hi, a512__bit_to4(h, 4 + j));
                }
                A512_FOR_C8 {
                    A512_R16_IS(j) =
                        a512__dpbusd_v(V, A512_R16_IS(j), lo, a512__bcast4(x[c]->qs + 4 * j));
                    A512_R16_IS(j) =
                        a512__dpbusd_v(V, A512_R16_IS(j), hi, a512__bcast4(x[c]->qs + 16 + 4 * j));
                }
            }
        } else {
            _Pragma("GCC unroll 8") for (int s = 0; s < 8; s++) A512_FOR_R {
                if (PF) a512__pf_ahead(t->nta, wq[r] + 64 * s, A512_R16_AHEAD);
                __m512i w = _mm512_loadu_si512(wq[r] + 64 * s);
                A512_FOR_C8 A512_R16_IS(s) =
                    a512__dpbusd_v(V, A512_R16_IS(s), w, a512__bcast4(x[c]->qs + 4 * s));
            }
        }
#undef A512_R16_IS
        A512_FOR_R A512_FOR_C8 _Pragma("GCC unroll 3") for (int k = 0; k < NS - 1; k++) is[r][c] =
            _mm512_add_epi32(is[r][c], ip[k][r][c]);
        A512_FOR_C8 {
            __m512 xd = _mm512_set1_ps(x[c]->d);
            A512_FOR_R acc[r][c] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[r][c]), _mm512_mul_ps(wd[r], xd), acc[r][c]);
        }
    }
    A512_FOR_R A512_FOR_C8 _mm512_storeu_ps(t->Y + c * t->ys + 16 * r, acc[r][c]);
}

#define a512__r16q8_tile(R, C, t, V) a512__r16_tile(0, R, C, t, V)
#define a512__r16q4_tile(R, C, t, V) a512__r16_tile(1, R, C, t, V)
#define a512__r16q5_tile(R, C, t, V) a512__r16_tile(2, R, C, t, V)
A512_TILES_V(a512__r16q8_tile)
A512_TILES_V(a512__r16q4_tile)
A512_TILES_V(a512__r16q5_tile)

/* Wide tiles: one group x 5..8 columns, body##_wide[V][C - 5]. A pass of
 * 5..8 tokens (a decode step with speculative drafts, a few requests
 * decoding) then reads and unpacks each weight once for all its columns;
 * with tiles of at most 4 columns the fifth column read every weight
 * again, unpacked again (a 5-token Q4_0 pass cost 2.3x a one-token one).
 * One weight stream, so it prefetches as the matvec does, and two partial
 * sums per column keep enough vpdpbusd chains in flight. 1.1B Q4_0, 2
 * threads, Zen 5, alternated with the 4 + 1 column split (2026-12-06):
 * `kvseal bench --spec 4` 2.38-2.40x -> 2.72-2.75x, 6 streams' decode
 * 212-213 -> 254-257 tokens/s. Without the prefetch it was slower than
 * the split (190 against 216 tokens/s). */
#define A512_WIDE_V1(body, V)                                                                      \
    static void body##_##V##_w5(const a512_tile *t) { body(1, 5, t, V); }                          \
    static void body##_##V##_w6(const a512_tile *t) { body(1, 6, t, V); }                          \
    static void body##_##V##_w7(const a512_tile *t) { body(1, 7, t, V); }                          \
    static void body##_##V##_w8(const a512_tile *t) { body(1, 8, t, V); }                          \
    static const a512_tile_fn body##_wide##V[4] = {body##_##V##_w5, body##_##V##_w6,              \
                                                   body##_##V##_w7, body##_##V##_w8};
#define A512_WIDE_V(body)                                                                          \
    A512_WIDE_V1(body, 0)                                                                          \
    A512_WIDE_V1(body, 1)                                                                          \
    static const a512_tile_fn *const body##_wide[2] = {body##_wide0, body##_wide1};
A512_WIDE_V(a512__r16q8_tile)
A512_WIDE_V(a512__r16q4_tile)
A512_WIDE_V(a512__r16q5_tile)

/* One Q8_K super-block of an activation row, prepared for the r16 Q4_K
 * tiles: bs[j] = the sum of sub-block j's 32 quants (|bs| <= 4064). */
typedef struct a512_r16k {
    float d;
    int16_t bs[8];
    int8_t qs[256];
    int32_t pad[3]; /* 288 bytes: rows of these stay 32-byte aligned */
} a512_r16k;

/* The r16 Q4_K (Q5 = 0) or Q5_K tile: t->W group 0 (t->ws bytes between
 * groups), t->X column 0's a512_r16k array. Super-blocks of SB bytes
 * (kern.h): d, dmin, byte scales and mins, then qs as pairs x steps k x 16
 * rows x 4 bytes; Q5_K's qh after them, bit j of step k's bytes being bit 4
 * of sub-block j's values. Per super-block and element, exact in int32:
 * isum = sum_j sc_j * (the 8 vpdpbusd of sub-block j's nibbles with its
 * activations), msum = sum_j m_j * bs_j (4 vpdpwssd over pairs); then
 * acc = fma((float)isum, d * dx, acc) and acc = fnmadd((float)msum,
 * dmin * dx, acc), super-blocks in order. */
/* One 64-byte qs step of an r16 Q4_K (Q5 = 0) or Q5_K matvec: pair q,
 * step k of the super-block at p (the line pf prefetched), both its
 * sub-blocks (low and high nibbles, Q5_K's bit 4 from h, step k's qh) into
 * *s0 and *s1. Q4_K's high nibbles stay in place (16 q): *s1 is 16 times
 * the true sum, exactly, shifted back by a512__r16k_fold. */
A512_INLINE void a512__r16k_step(int Q5, int V, int nta, const uint8_t *p, const char *pf,
                                 const a512_r16k *x, int q, int k, __m512i h, __m512i *s0,
                                 __m512i *s1) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i z = _mm512_loadu_si512(p + 320 + 512 * q + 64 * k);
    a512__pf(nta, pf + 320 + 512 * q + 64 * k);
    a512__sched_pin(&z); // one load for both nibbles
    __m512i lo = _mm512_and_si512(z, m4);
    __m512i hi = Q5 ? _mm512_and_si512(_mm512_srli_epi16(z, 4), m4) : _mm512_andnot_si512(m4, z);
    if (Q5) {
        lo = a512__or_bit4(lo, a512__bit_to4(h, 2 * q));
        hi = a512__or_bit4(hi, a512__bit_to4(h, 2 * q + 1));
    }
    *s0 = a512__dpbusd_v(V, *s0, lo, a512__bcast4(x->qs + 64 * q + 4 * k));
    *s1 = a512__dpbusd_v(V, *s1, hi, a512__bcast4(x->qs + 64 * q + 32 + 4 * k));
}

/* it + sc_2q * s0 + sc_2q+1 * s1 (Q4_K: s1 / 16): pair q's sub-block sums
 * with their byte scales, exact in int32. */
A512_INLINE __m512i a512__r16k_fold(int Q5, const uint8_t *p, int q, __m512i s0, __m512i s1,
                                    __m512i it) {
    __m512i sc0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 64 + 32 * q)));
    __m512i sc1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 80 + 32 * q)));
    if (!Q5) s1 = _mm512_srai_epi32(s1, 4);
    return _mm512_add_epi32(
        it, _mm512_add_epi32(_mm512_mullo_epi32(s0, sc0), _mm512_mullo_epi32(s1, sc1)));
}

/* The Rx1 (matvec, R = 1 or 2 groups, their steps interleaved) r16 Q4_K
 * (Q5 = 0) or Q5_K tile: the same integer sums and f32 steps as the
 * general tile, each 64-byte qs load (pair q, step k) feeding both its
 * sub-blocks; the integer sums are exact, so their order is free. Q4_K
 * walks pair by pair in memory order, two accumulators a group folded
 * after each pair's eight steps; against the step-major walk (every pair's
 * step k in turn, sixteen accumulators live), Q4_K_M tg128 ahead in 21 of
 * 21 alternated rounds (median +9%; Zen 5, 2026-12-04, `kvseal bench`),
 * bench_stream Q4_K kernel / read-only 0.98-1.12 -> 1.19-1.27. Q5_K stays
 * step-major (each qh load feeds all eight sub-blocks): pair by pair it was
 * behind in 4 of 4 bench_stream runs (about 4%). Three or four Q4_K
 * streams were slower than two. Layout as a512__r16k_tile_q's (kern.h). */
A512_INLINE void a512__r16k_vec(int Q5, int R, const a512_tile *t, int V) {
    const size_t SB = Q5 ? KERN_R16_Q5K_SB : KERN_R16_Q4K_SB;
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t i = 0; i < t->K / 256; i++) {
        const uint8_t *p[2];
        const char *pf[2];
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
            p[r] = t->W + (size_t)r * t->ws + (size_t)i * SB;
            // as a512__prefetch_ahead, spread over the loads: the 320 header
            // bytes here, the rest per step
            pf[r] = (const char *)p[r] + A512_AHEAD_K4 / R;
            for (int b = 0; b < 320; b += 64)
                a512__pf(t->nta, pf[r] + b);
        }
        const a512_r16k *x = (const a512_r16k *)(const void *)t->X + i;
        const __m512i z0 = _mm512_setzero_si512();
        __m512i it[2] = {z0, z0};
        if (!Q5) {
            for (int q = 0; q < 4; q++) {
                __m512i s0[2] = {z0, z0}, s1[2] = {z0, z0};
                _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
                    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
                        a512__r16k_step(0, V, t->nta, p[r], pf[r], x, q, k, z0, &s0[r], &s1[r]);
                _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) it[r] =
                    a512__r16k_fold(0, p[r], q, s0[r], s1[r], it[r]);
            }
        } else {
            __m512i sub[2][8];
            _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
                _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) sub[r][j] = z0;
            _Pragma("GCC unroll 2") for (int k = 0; k < 8; k++) {
                _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
                    __m512i h = _mm512_loadu_si512(p[r] + KERN_R16_Q4K_SB + 64 * k);
                    a512__pf(t->nta, pf[r] + KERN_R16_Q4K_SB + 64 * k);
                    _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) a512__r16k_step(
                        1, V, t->nta, p[r], pf[r], x, q, k, h, &sub[r][2 * q], &sub[r][2 * q + 1]);
                }
            }
            _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
                _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) it[r] =
                    a512__r16k_fold(1, p[r], q, sub[r][2 * q], sub[r][2 * q + 1], it[r]);
        }
        const __m512 dx = _mm512_set1_ps(x->d);
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
            __m512i ms = _mm512_setzero_si512();
            _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
                __m512i m = _mm512_cvtepu8_epi16(
                    _mm256_loadu_si256((const __m256i *)(p[r] + 192 + 32 * q)));
                int32_t bp;
                memcpy(&bp, x->bs + 2 * q, 4);
                ms = a512__madd_acc(V, ms, m, _mm512_set1_epi32(bp));
            }
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p[r]));
            __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p[r] + 32)));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(it[r]), _mm512_mul_ps(d, dx), acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(dm, dx), acc[r]);
        }
    }
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) _mm512_storeu_ps(t->Y + t->yr * r, acc[r]);
}

A512_INLINE void a512__r16k_tile_q(int Q5, int R, int C, const a512_tile *t, int V) {
    if (R <= 2 && C == 1) {
        a512__r16k_vec(Q5, R, t, V);
        return;
    }
    const size_t SB = Q5 ? KERN_R16_Q5K_SB : KERN_R16_Q4K_SB;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[4][8];
    A512_FOR_R A512_FOR_C8 acc[r][c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < t->K / 256; i++) {
        const uint8_t *p[4];
        const a512_r16k *x[8];
        if (C <= 2 || C > 4) A512_FOR_R a512__prefetch_ahead(t, r, i * (int64_t)SB, (int)SB);
        A512_FOR_R p[r] = t->W + r * t->ws + (size_t)i * SB;
        A512_FOR_C8 x[c] = (const a512_r16k *)(const void *)(t->X + c * t->xs) + i;
        __m512i it[4][8], ms[4][8];
        A512_FOR_R A512_FOR_C8 it[r][c] = ms[r][c] = _mm512_setzero_si512();
        _Pragma("GCC unroll 2") for (int j = 0; j < 8; j++) {
            __m512i sub[4][8];
            A512_FOR_R A512_FOR_C8 sub[r][c] = _mm512_setzero_si512();
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) A512_FOR_R {
                __m512i z = _mm512_loadu_si512(p[r] + 320 + 512 * (j / 2) + 64 * k);
                z = _mm512_and_si512(j & 1 ? _mm512_srli_epi16(z, 4) : z, m4);
                if (Q5)
                    z = a512__or_bit4(
                        z, a512__bit_to4(_mm512_loadu_si512(p[r] + KERN_R16_Q4K_SB + 64 * k), j));
                A512_FOR_C8 sub[r][c] =
                    a512__dpbusd_v(V, sub[r][c], z, a512__bcast4(x[c]->qs + 32 * j + 4 * k));
            }
            A512_FOR_R {
                __m512i sc =
                    _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p[r] + 64 + 16 * j)));
                A512_FOR_C8 it[r][c] = _mm512_add_epi32(it[r][c], _mm512_mullo_epi32(sub[r][c], sc));
            }
        }
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) A512_FOR_R {
            __m512i m =
                _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(p[r] + 192 + 32 * q)));
            A512_FOR_C8 {
                int32_t bp;
                memcpy(&bp, x[c]->bs + 2 * q, 4);
                ms[r][c] = a512__madd_acc(V, ms[r][c], m, _mm512_set1_epi32(bp));
            }
        }
        A512_FOR_R {
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p[r]));
            __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p[r] + 32)));
            A512_FOR_C8 {
                __m512 dx = _mm512_set1_ps(x[c]->d);
                acc[r][c] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(it[r][c]), _mm512_mul_ps(d, dx), acc[r][c]);
                acc[r][c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms[r][c]), _mm512_mul_ps(dm, dx),
                                             acc[r][c]);
            }
        }
    }
    A512_FOR_R A512_FOR_C8 _mm512_storeu_ps(t->Y + c * t->ys + 16 * r, acc[r][c]);
}
#define a512__r16k_tile(R, C, t, V) a512__r16k_tile_q(0, R, C, t, V)
#define a512__r16k5_tile(R, C, t, V) a512__r16k_tile_q(1, R, C, t, V)
A512_TILES_V(a512__r16k_tile)
A512_TILES_V(a512__r16k5_tile)
/* Q4_K's wide tiles: its sub-block sums live one sub-block at a time, so
 * one group x 8 columns keeps 3 x 8 accumulators (the mins' sums come
 * after). 1.1B Q4_K_M, `kvseal bench --spec 4`, alternated with the 4 + 1
 * split: 179-182 -> 205-208 tokens/s (2.86-2.94x -> 3.34-3.38x). */
A512_WIDE_V(a512__r16k_tile)

/* Prepares the nsb super-blocks of one Q8_K activation row. */
static void a512__r16k_prep_x(const uint8_t *X, int64_t nsb, void *out) {
    a512_r16k *o = out;
    for (int64_t i = 0; i < nsb; i++, X += 292) {
        const kern_block_q8_K *b = (const kern_block_q8_K *)(const void *)X;
        memset(&o[i], 0, sizeof o[i]);
        memcpy(&o[i].d, &b->d, 4);
        memcpy(o[i].qs, b->qs, 256);
        for (int j = 0; j < 8; j++) {
            int16_t b0, b1;
            memcpy(&b0, (const uint8_t *)X + 260 + 4 * j, 2);
            memcpy(&b1, (const uint8_t *)X + 262 + 4 * j, 2);
            o[i].bs[j] = (int16_t)(b0 + b1);
        }
    }
}

/* One Q8_K super-block of an activation row, prepared for the r16 Q6_K
 * tiles: corr[j] = -32 * the sum of sub-block j's 16 quants (Q6_K's q - 32). */
typedef struct a512_r16k6 {
    int32_t corr[16];
    int8_t qs[256];
    float d;
    int32_t pad[15]; /* 384 bytes */
} a512_r16k6;

/* The r16 Q6_K tile: t->W group 0 (t->ws bytes between groups), t->X
 * column 0's a512_r16k6 array. Per super-block and element, exact in int32:
 * isum = sum_j sc_j * (corr_j + the 4 vpdpbusd of sub-block j's 6-bit
 * values, rebuilt from ql and qh, with its activations); then
 * acc = fma((float)isum, d * dx, acc), super-blocks in order. */
/* The Rx1 (matvec, R = 1 or 2 groups, their steps interleaved as
 * a512__r16k_vec's) r16 Q6_K tile: the same integer sums as the general tile,
 * but each 64-byte ql/qh load feeds all four 2-bit groups g (four sub-block
 * accumulators live at once), where the general tile reloads and reshifts
 * them per g: about 2/3 of the instructions per weight byte. With G, the
 * 6-bit values are rebuilt by vgf2p8affineqb, which moves each field to its
 * place within the byte with zero fill: 9 instructions per 64-byte step
 * where shifts and masks take 13, and the same bytes. Two groups at once
 * (two streams, a512__run_vecn) against one, under NTA prefetches on the
 * Zen 5 host (2026-12-04, bench_stream Q6_K, 4 alternated runs of 9
 * rounds): 57.8-61.6 GB/s against 54.6-60.4, ahead in 4 of 4 (0-9%); it
 * had lost under T0 prefetches. A step's three lines are adjacent
 * (KERN_R16_Q6K_STEP), so each stream reads in memory order, where they
 * lay 512 and 2048 bytes apart: bench_stream Q6_K 60-64 -> 69-73 GB/s
 * (kernel / read-only 1.14-1.15 -> 1.27-1.33, 4 alternated runs), Q4_K_M
 * tg128 ahead in 4 of 4 alternated rounds (+4-6%; Zen 5, 2026-12-05). */
A512_INLINE void a512__r16k6_vec(int R, const a512_tile *t, int V, int G) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    // GFNI matrices (one qword, broadcast): bits 0-1, 2-3 or 6-7 to bits
    // 4-5, and bits 4-7 to bits 0-3; all other result bits 0
    const __m512i g0 = _mm512_set1_epi64(0x0000000001020000ll);
    const __m512i g1 = _mm512_set1_epi64(0x0000000004080000ll);
    const __m512i g3 = _mm512_set1_epi64(0x0000000040800000ll);
    const __m512i hi = _mm512_set1_epi64(0x1020408000000000ll);
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t i = 0; i < t->K / 256; i++) {
        const uint8_t *p[2];
        const char *pf[2];
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
            p[r] = t->W + (size_t)r * t->ws + (size_t)i * KERN_R16_Q6K_SB;
            // as a512__prefetch_ahead, spread over the loads below: the 288
            // header bytes here, the rest per k
            pf[r] = (const char *)p[r] + A512_AHEAD_K6 / R;
            for (int b = 0; b < 288; b += 64)
                a512__pf(t->nta, pf[r] + b);
        }
        const a512_r16k6 *x = (const a512_r16k6 *)(const void *)t->X + i;
        __m512i it[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        // sub-block j = 8n + 2g + kk: elements 128n + 32g + 16kk + 0..15
        _Pragma("GCC unroll 1") for (int n = 0; n < 2; n++) {
            _Pragma("GCC unroll 2") for (int kk = 0; kk < 2; kk++) {
                __m512i sub[2][4];
                _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
                    _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) sub[r][g] =
                        _mm512_set1_epi32(x->corr[8 * n + 2 * g + kk]);
                _Pragma("GCC unroll 4") for (int k4 = 0; k4 < 4; k4++) {
                    const int k = 4 * kk + k4;
                    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
                        const int st = KERN_R16_Q6K_STEP(n, k);
                        __m512i l0 = _mm512_loadu_si512(p[r] + st);
                        __m512i l1 = _mm512_loadu_si512(p[r] + st + 64);
                        __m512i h = _mm512_loadu_si512(p[r] + st + 128);
                        a512__pf(t->nta, pf[r] + st);
                        a512__pf(t->nta, pf[r] + st + 64);
                        a512__pf(t->nta, pf[r] + st + 128);
                        __m512i q[4];
                        if (G) {
                            // 0xF8 = A | (B & C): the moved h bits or'd with the low
                            // nibble (the GF2 result is the operand overwritten, so l0
                            // and l1 stay in registers, not reloaded), then the high
                            // nibble moved down or'd with h bits 4-5 in place
                            q[0] = _mm512_ternarylogic_epi32(a512__gf2affine(h, g0), l0, m4, 0xF8);
                            q[1] = _mm512_ternarylogic_epi32(a512__gf2affine(h, g1), l1, m4, 0xF8);
                            q[2] = _mm512_ternarylogic_epi32(a512__gf2affine(l0, hi), h, m30, 0xF8);
                            q[3] = _mm512_or_si512(a512__gf2affine(l1, hi), a512__gf2affine(h, g3));
                        } else {
                            // 0xF8 = A | (B & C): the nibble, or'd with bits 2g, 2g+1
                            // of h at 4, 5
                            q[0] = _mm512_ternarylogic_epi32(_mm512_and_si512(l0, m4),
                                                             _mm512_slli_epi16(h, 4), m30, 0xF8);
                            q[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(l1, m4),
                                                             _mm512_slli_epi16(h, 2), m30, 0xF8);
                            q[2] = _mm512_ternarylogic_epi32(
                                _mm512_and_si512(_mm512_srli_epi16(l0, 4), m4), h, m30, 0xF8);
                            q[3] = _mm512_ternarylogic_epi32(
                                _mm512_and_si512(_mm512_srli_epi16(l1, 4), m4),
                                _mm512_srli_epi16(h, 2), m30, 0xF8);
                        }
                        _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) sub[r][g] =
                            a512__dpbusd_v(V, sub[r][g], q[g],
                                           a512__bcast4(x->qs + 128 * n + 32 * g + 4 * k));
                        a512__sched_fence();
                    }
                }
                _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
                    _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
                        __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(
                            (const __m128i *)(p[r] + 32 + 16 * (8 * n + 2 * g + kk))));
                        it[r] = _mm512_add_epi32(it[r], _mm512_mullo_epi32(sub[r][g], sc));
                    }
                    a512__sched_pin(&it[r]);
                }
            }
        }
        const __m512 dx = _mm512_set1_ps(x->d);
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p[r]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(it[r]), _mm512_mul_ps(d, dx), acc[r]);
        }
    }
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) _mm512_storeu_ps(t->Y + t->yr * r, acc[r]);
}

A512_INLINE void a512__r16k6_tile_g(int G, int R, int C, const a512_tile *t, int V) {
    if (R <= 2 && C == 1) {
        a512__r16k6_vec(R, t, V, G);
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    __m512 acc[4][4];
    A512_FOR_R A512_FOR_C acc[r][c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < t->K / 256; i++) {
        const uint8_t *p[4];
        const a512_r16k6 *x[4];
        if (C <= 2) A512_FOR_R a512__prefetch_ahead(t, r, i * KERN_R16_Q6K_SB, KERN_R16_Q6K_SB);
        A512_FOR_R p[r] = t->W + r * t->ws + (size_t)i * KERN_R16_Q6K_SB;
        A512_FOR_C x[c] = (const a512_r16k6 *)(const void *)(t->X + c * t->xs) + i;
        __m512i it[4][4];
        A512_FOR_R A512_FOR_C it[r][c] = _mm512_setzero_si512();
        // sub-block j = 8n + 2g + kk: elements 128n + 32g + 16kk + 0..15
        _Pragma("GCC unroll 1") for (int j = 0; j < 16; j++) {
            const int n = j / 8, g = (j / 2) % 4, kk = j % 2;
            __m512i sub[4][4];
            A512_FOR_R A512_FOR_C sub[r][c] = _mm512_set1_epi32(x[c]->corr[j]);
            _Pragma("GCC unroll 4") for (int k4 = 0; k4 < 4; k4++) {
                const int k = 4 * kk + k4;
                A512_FOR_R {
                    __m512i l = _mm512_loadu_si512(p[r] + KERN_R16_Q6K_STEP(n, k) + 64 * (g & 1));
                    __m512i h = _mm512_loadu_si512(p[r] + KERN_R16_Q6K_STEP(n, k) + 128);
                    l = g >= 2 ? _mm512_srli_epi16(l, 4) : l;
                    // bits 2g, 2g+1 of h to bits 4, 5
                    h = g <= 2 ? _mm512_slli_epi16(h, 4 - 2 * g) : _mm512_srli_epi16(h, 2);
                    __m512i q = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(h, m30));
                    A512_FOR_C sub[r][c] = a512__dpbusd_v(
                        V, sub[r][c], q, a512__bcast4(x[c]->qs + 128 * n + 32 * g + 4 * k));
                }
            }
            A512_FOR_R {
                __m512i sc =
                    _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p[r] + 32 + 16 * j)));
                A512_FOR_C it[r][c] = _mm512_add_epi32(it[r][c], _mm512_mullo_epi32(sub[r][c], sc));
            }
        }
        A512_FOR_R {
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p[r]));
            A512_FOR_C acc[r][c] = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(it[r][c]), _mm512_mul_ps(d, _mm512_set1_ps(x[c]->d)), acc[r][c]);
        }
    }
    A512_FOR_R A512_FOR_C _mm512_storeu_ps(t->Y + c * t->ys + 16 * r, acc[r][c]);
}
/* The r16 Q6_K tiles without GFNI (a512__r16k6_tile_tab) and with it, for
 * the matvec only (a512__r16k6g_tile_tab). */
A512_INLINE void a512__r16k6_tile(int R, int C, const a512_tile *t, int V) {
    a512__r16k6_tile_g(0, R, C, t, V);
}
A512_INLINE void a512__r16k6g_tile(int R, int C, const a512_tile *t, int V) {
    a512__r16k6_tile_g(1, R, C, t, V);
}
A512_TILES_V(a512__r16k6_tile)
A512_TILES_V(a512__r16k6g_tile)

/* The r16 Q3_K (Q2 = 0) and Q2_K tiles: t->W group 0 (t->ws bytes between
 * groups), t->X column 0's a512_r16k6 array (corr = -4 * the sub-block's
 * quant sum for Q3_K, the sum itself for Q2_K). Super-blocks (kern.h):
 *   Q3_K (KERN_R16_Q3K_SB): d, int8 scales - 32 at 32 + 16s + r, qs as
 *     n x k x 16 rows x 4 bytes at 288, hmask as k x 16 rows x 4 at 1312;
 *   Q2_K (KERN_R16_Q2K_SB): d, dmin, the scale | min << 4 bytes at
 *     64 + 16s + r, qs as Q3_K's at 320.
 * Per super-block and element, exact in int32: isum = sum_s sc_s * (Q3_K:
 * corr_s +) the 4 vpdpbusd of sub-block s's values with its activations;
 * Q2_K also msum = sum_s m_s * bsum_s. Then acc = fma((float)isum, d * dx,
 * acc) (and acc = fnmadd((float)msum, dmin * dx, acc)), super-blocks in
 * order (as the Q6_K / Q4_K tiles). Sub-block s = 8n + 2g + kk holds
 * elements 128n + 32g + 16kk + 0..15: bits 2g, 2g+1 of qs[32n + l] and
 * (Q3_K) bit 4n + g of hmask[l]. */

/* Step k's 2- or 3-bit values of group g (n given): bits 2g.. of the qs
 * vector l, for Q3_K or'd with bit 4n + g of the hmask vector h moved to
 * bit 2. */
A512_INLINE __m512i a512__q3_vals(int Q2, __m512i l, __m512i h, int n, int g) {
    const __m512i m3 = _mm512_set1_epi8(3), m04 = _mm512_set1_epi8(4);
    __m512i lo = _mm512_and_si512(g ? _mm512_srli_epi16(l, (unsigned)(2 * g)) : l, m3);
    if (Q2) return lo;
    __m512i hb = _mm512_rolv_epi32(h, _mm512_set1_epi32((2 - (4 * n + g)) & 31));
    return _mm512_ternarylogic_epi32(lo, hb, m04, 0xF8);
}

/* Sub-block s's scale (and Q2_K's min) lanes of super-block p. */
A512_INLINE __m512i a512__q23_sc(int Q2, const uint8_t *p, int s, __m512i *mn) {
    __m128i b = _mm_loadu_si128((const __m128i *)(p + (Q2 ? 64 : 32) + 16 * s));
    if (!Q2) return _mm512_cvtepi8_epi32(b);
    __m512i v = _mm512_cvtepu8_epi32(b);
    *mn = _mm512_srli_epi32(v, 4);
    return _mm512_and_si512(v, _mm512_set1_epi32(15));
}

/* The float step of a super-block (see above). */
A512_INLINE __m512 a512__q23_acc(int Q2, const uint8_t *p, float dx, __m512i it, __m512i ms,
                                 __m512 acc) {
    __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(it), _mm512_mul_ps(d, _mm512_set1_ps(dx)), acc);
    if (Q2) {
        __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
        acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(dm, _mm512_set1_ps(dx)), acc);
    }
    return acc;
}

/* The 1x1 (matvec) tile: each qs / hmask load feeds all four groups g (four
 * sub-block accumulators at once), as a512__r16k6_vec; the same sums. */
A512_INLINE void a512__r16k3_vec(int Q2, const a512_tile *t, int V) {
    const size_t SB = Q2 ? KERN_R16_Q2K_SB : KERN_R16_Q3K_SB;
    const int QS = Q2 ? 320 : 288, HM = 1312; /* offsets of qs and hmask */
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < t->K / 256; i++) {
        const uint8_t *p = t->W + (size_t)i * SB;
        const char *pf = (const char *)p + A512_AHEAD_K3;
        for (int b = 0; b < QS; b += 64)
            a512__pf(t->nta, pf + b);
        const a512_r16k6 *x = (const a512_r16k6 *)(const void *)t->X + i;
        __m512i it = _mm512_setzero_si512(), ms = _mm512_setzero_si512();
        _Pragma("GCC unroll 1") for (int n = 0; n < 2; n++) {
            _Pragma("GCC unroll 2") for (int kk = 0; kk < 2; kk++) {
                __m512i sub[4];
                _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) sub[g] =
                    Q2 ? _mm512_setzero_si512() : _mm512_set1_epi32(x->corr[8 * n + 2 * g + kk]);
                _Pragma("GCC unroll 4") for (int k4 = 0; k4 < 4; k4++) {
                    const int k = 4 * kk + k4;
                    __m512i l = _mm512_loadu_si512(p + QS + 512 * n + 64 * k);
                    __m512i h = Q2 ? l : _mm512_loadu_si512(p + HM + 64 * k);
                    a512__pf(t->nta, pf + QS + 512 * n + 64 * k);
                    if (!Q2 && n == 0) a512__pf(t->nta, pf + HM + 64 * k);
                    _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) sub[g] =
                        a512__dpbusd_v(V, sub[g], a512__q3_vals(Q2, l, h, n, g),
                                       a512__bcast4(x->qs + 128 * n + 32 * g + 4 * k));
                    a512__sched_fence();
                }
                _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
                    const int s = 8 * n + 2 * g + kk;
                    __m512i mn = _mm512_setzero_si512();
                    __m512i sc = a512__q23_sc(Q2, p, s, &mn);
                    it = _mm512_add_epi32(it, _mm512_mullo_epi32(sub[g], sc));
                    if (Q2)
                        ms = _mm512_add_epi32(
                            ms, _mm512_mullo_epi32(mn, _mm512_set1_epi32(x->corr[s])));
                }
                a512__sched_pin(&it);
                if (Q2) a512__sched_pin(&ms);
            }
        }
        acc = a512__q23_acc(Q2, p, x->d, it, ms, acc);
    }
    _mm512_storeu_ps(t->Y, acc);
}

A512_INLINE void a512__r16k3_tile_q(int Q2, int R, int C, const a512_tile *t, int V) {
    if (R == 1 && C == 1) {
        a512__r16k3_vec(Q2, t, V);
        return;
    }
    const size_t SB = Q2 ? KERN_R16_Q2K_SB : KERN_R16_Q3K_SB;
    const int QS = Q2 ? 320 : 288, HM = 1312;
    __m512 acc[4][4];
    A512_FOR_R A512_FOR_C acc[r][c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < t->K / 256; i++) {
        const uint8_t *p[4];
        const a512_r16k6 *x[4];
        if (C <= 2) A512_FOR_R a512__prefetch_ahead(t, r, i * (int64_t)SB, (int)SB);
        A512_FOR_R p[r] = t->W + r * t->ws + (size_t)i * SB;
        A512_FOR_C x[c] = (const a512_r16k6 *)(const void *)(t->X + c * t->xs) + i;
        __m512i it[4][4], ms[4][4];
        A512_FOR_R A512_FOR_C it[r][c] = ms[r][c] = _mm512_setzero_si512();
        _Pragma("GCC unroll 1") for (int j = 0; j < 16; j++) {
            const int n = j / 8, g = (j / 2) % 4, kk = j % 2;
            __m512i sub[4][4];
            A512_FOR_R A512_FOR_C sub[r][c] =
                Q2 ? _mm512_setzero_si512() : _mm512_set1_epi32(x[c]->corr[j]);
            _Pragma("GCC unroll 4") for (int k4 = 0; k4 < 4; k4++) {
                const int k = 4 * kk + k4;
                A512_FOR_R {
                    __m512i l = _mm512_loadu_si512(p[r] + QS + 512 * n + 64 * k);
                    __m512i h = Q2 ? l : _mm512_loadu_si512(p[r] + HM + 64 * k);
                    __m512i q = a512__q3_vals(Q2, l, h, n, g);
                    A512_FOR_C sub[r][c] = a512__dpbusd_v(
                        V, sub[r][c], q, a512__bcast4(x[c]->qs + 128 * n + 32 * g + 4 * k));
                }
            }
            A512_FOR_R {
                __m512i mn = _mm512_setzero_si512();
                __m512i sc = a512__q23_sc(Q2, p[r], j, &mn);
                A512_FOR_C {
                    it[r][c] = _mm512_add_epi32(it[r][c], _mm512_mullo_epi32(sub[r][c], sc));
                    if (Q2)
                        ms[r][c] = _mm512_add_epi32(
                            ms[r][c], _mm512_mullo_epi32(mn, _mm512_set1_epi32(x[c]->corr[j])));
                }
            }
        }
        A512_FOR_R A512_FOR_C acc[r][c] =
            a512__q23_acc(Q2, p[r], x[c]->d, it[r][c], ms[r][c], acc[r][c]);
    }
    A512_FOR_R A512_FOR_C _mm512_storeu_ps(t->Y + c * t->ys + 16 * r, acc[r][c]);
}
#define a512__r16k3_tile(R, C, t, V) a512__r16k3_tile_q(0, R, C, t, V)
#define a512__r16k2_tile(R, C, t, V) a512__r16k3_tile_q(1, R, C, t, V)
A512_TILES_V(a512__r16k3_tile)
A512_TILES_V(a512__r16k2_tile)

/* The r16 IQ4_XS tile: t->W group 0 (t->ws bytes between groups), t->X
 * column 0's a512_r16k6 array with corr[j] = -128 * sub-block j's sum (32
 * quants). Super-blocks of KERN_R16_IQ4XS_SB bytes (kern.h): d, int8
 * scales - 32 at 32 + 16j + r, then j < 8, k < 4 x 16 rows x 4 bytes of
 * qs[16j + 4k ..] at 160 (low nibbles elements 32j + 4k.., high 32j + 16 +
 * 4k..). Per super-block and element, exact in int32: isum = sum_j sc_j *
 * (corr_j + the 8 vpdpbusd of codebook + 128 (unsigned) with the
 * activations); then acc = fma((float)isum, d * dx, acc), super-blocks in
 * order. */
A512_INLINE void a512__r16x4_tile(int R, int C, const a512_tile *t, int V) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i cb = _mm512_broadcast_i32x4(
        _mm_xor_si128(_mm_loadu_si128((const __m128i *)(const void *)kern_iq4nl_values),
                      _mm_set1_epi8((char)0x80))); /* codebook + 128 */
    __m512 acc[4][4];
    A512_FOR_R A512_FOR_C acc[r][c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < t->K / 256; i++) {
        const uint8_t *p[4];
        const a512_r16k6 *x[4];
        if (C <= 2) A512_FOR_R a512__prefetch_ahead(t, r, i * KERN_R16_IQ4XS_SB, KERN_R16_IQ4XS_SB);
        A512_FOR_R p[r] = t->W + r * t->ws + (size_t)i * KERN_R16_IQ4XS_SB;
        A512_FOR_C x[c] = (const a512_r16k6 *)(const void *)(t->X + c * t->xs) + i;
        __m512i it[4][4];
        A512_FOR_R A512_FOR_C it[r][c] = _mm512_setzero_si512();
        _Pragma("GCC unroll 2") for (int j = 0; j < 8; j++) {
            __m512i sub[4][4];
            A512_FOR_R A512_FOR_C sub[r][c] = _mm512_set1_epi32(x[c]->corr[j]);
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) A512_FOR_R {
                __m512i z = _mm512_loadu_si512(p[r] + 160 + 256 * j + 64 * k);
                __m512i lo = _mm512_shuffle_epi8(cb, _mm512_and_si512(z, m4));
                __m512i hi = _mm512_shuffle_epi8(cb, _mm512_and_si512(_mm512_srli_epi16(z, 4), m4));
                A512_FOR_C {
                    sub[r][c] =
                        a512__dpbusd_v(V, sub[r][c], lo, a512__bcast4(x[c]->qs + 32 * j + 4 * k));
                    sub[r][c] = a512__dpbusd_v(V, sub[r][c], hi,
                                               a512__bcast4(x[c]->qs + 32 * j + 16 + 4 * k));
                }
            }
            A512_FOR_R {
                __m512i sc =
                    _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p[r] + 32 + 16 * j)));
                A512_FOR_C it[r][c] = _mm512_add_epi32(it[r][c], _mm512_mullo_epi32(sub[r][c], sc));
            }
        }
        A512_FOR_R {
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p[r]));
            A512_FOR_C acc[r][c] = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(it[r][c]), _mm512_mul_ps(d, _mm512_set1_ps(x[c]->d)), acc[r][c]);
        }
    }
    A512_FOR_R A512_FOR_C _mm512_storeu_ps(t->Y + c * t->ys + 16 * r, acc[r][c]);
}
A512_TILES_V(a512__r16x4_tile)

/* The halved E8M0 scales 2^(e - 128) of one block's 16 rows (its exponent
 * bytes at e), exactly kern__e8m0_half's: vscalefps gives the subnormals
 * of e = 0, 1 and 2^127 for e = 255. */
A512_INLINE __m512 a512__r16m_scale(const uint8_t *e) {
    __m512i ei = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)e));
    return _mm512_scalef_ps(_mm512_set1_ps(1.0f),
                            _mm512_cvtepi32_ps(_mm512_sub_epi32(ei, _mm512_set1_epi32(128))));
}

/* The r16 MXFP4 tile: t->W group 0 (t->ws bytes between groups), t->X
 * column 0's a512_r16x array with corr = -128 * the block's sum. Quads of
 * KERN_R16_MXFP4_QUAD bytes (kern.h): 64 exponent bytes (block i, row r at
 * 16i + r), then per block 4 steps j x 16 rows x 4 bytes of qs[4j ..]
 * (low nibbles elements 4j.., high 16 + 4j..). Per block and element,
 * exact in int32: isum = corr + the 8 vpdpbusd of codebook + 128
 * (unsigned, doubled E2M1 values) with the activations, which is ref.c's
 * block sum; then acc = fma((float)isum, 2^(e - 128) * dx, acc), blocks in
 * order, as the Q4_0 tile. Group r's rows go to t->Y + t->yr * r, so the
 * R x 1 tiles also serve a512__run_vecn's R streams. */
A512_INLINE void a512__r16m_tile(int R, int C, const a512_tile *t, int V) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i cb = _mm512_broadcast_i32x4(
        _mm_xor_si128(_mm_loadu_si128((const __m128i *)(const void *)kern_mxfp4_values),
                      _mm_set1_epi8((char)0x80))); /* codebook + 128 */
    __m512 acc[4][4];
    A512_FOR_R A512_FOR_C acc[r][c] = _mm512_setzero_ps();
    const int64_t nb = t->K / 32;
    for (int64_t b = 0; b < nb; b++) {
        const size_t qo = (size_t)(b / 4) * KERN_R16_MXFP4_QUAD;
        const int i = (int)(b % 4);
        const uint8_t *wq[4];
        __m512 wd[4];
        const a512_r16x *x[4];
        A512_FOR_R {
            const uint8_t *p = t->W + r * t->ws + qo;
            if (C <= 2 && i == 0) a512__pf_ahead(t->nta, p, A512_R16_AHEAD);
            wd[r] = a512__r16m_scale(p + 16 * i);
            wq[r] = p + 64 + 256 * i;
        }
        A512_FOR_C x[c] = (const a512_r16x *)(const void *)(t->X + c * t->xs) + b;
        // independent partial sums for small tiles, as a512__r16_tile's
        const int NS = R * C >= 4 ? 1 : R * C == 1 ? 4 : 2;
        __m512i is[4][4], ip[3][4][4];
        A512_FOR_R A512_FOR_C {
            is[r][c] = _mm512_set1_epi32(x[c]->corr);
            _Pragma("GCC unroll 3") for (int k = 0; k < NS - 1; k++) ip[k][r][c] =
                _mm512_setzero_si512();
        }
#define A512_R16_IS(k) (*((k) % NS ? &ip[(k) % NS - 1][r][c] : &is[r][c]))
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) A512_FOR_R {
            if (C <= 2) a512__pf_ahead(t->nta, wq[r] + 64 * j, A512_R16_AHEAD);
            __m512i z = _mm512_loadu_si512(wq[r] + 64 * j);
            // the nibble decode runs once per R group and serves C columns;
            // vpermb (VBMI, no nibble masks) in place of vpshufb gained
            // nothing measurable (bench_kern 2048: 645-660 vs 662-671 GFLOP/s)
            __m512i lo = _mm512_shuffle_epi8(cb, _mm512_and_si512(z, m4));
            __m512i hi = _mm512_shuffle_epi8(cb, _mm512_and_si512(_mm512_srli_epi16(z, 4), m4));
            A512_FOR_C {
                A512_R16_IS(j) =
                    a512__dpbusd_v(V, A512_R16_IS(j), lo, a512__bcast4(x[c]->qs + 4 * j));
                A512_R16_IS(j) =
                    a512__dpbusd_v(V, A512_R16_IS(j), hi, a512__bcast4(x[c]->qs + 16 + 4 * j));
            }
        }
#undef A512_R16_IS
        A512_FOR_R A512_FOR_C _Pragma("GCC unroll 3") for (int k = 0; k < NS - 1; k++) is[r][c] =
            _mm512_add_epi32(is[r][c], ip[k][r][c]);
        A512_FOR_C {
            __m512 xd = _mm512_set1_ps(x[c]->d);
            A512_FOR_R acc[r][c] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[r][c]), _mm512_mul_ps(wd[r], xd), acc[r][c]);
        }
    }
    A512_FOR_R A512_FOR_C _mm512_storeu_ps(t->Y + c * t->ys + t->yr * r, acc[r][c]);
}
A512_TILES_V(a512__r16m_tile)

/* Prepares the nsb super-blocks of one Q8_K activation row for the IQ4_XS
 * tiles: corr[j] = -128 * the sum of sub-block j's 32 quants (j < 8). */
static void a512__r16x4_prep_x(const uint8_t *X, int64_t nsb, void *out) {
    a512_r16k6 *o = out;
    for (int64_t i = 0; i < nsb; i++, X += 292) {
        memset(&o[i], 0, sizeof o[i]);
        memcpy(&o[i].d, X, 4);
        memcpy(o[i].qs, X + 4, 256);
        for (int j = 0; j < 8; j++) {
            int16_t b0, b1;
            memcpy(&b0, X + 260 + 4 * j, 2);
            memcpy(&b1, X + 262 + 4 * j, 2);
            o[i].corr[j] = -128 * ((int32_t)b0 + (int32_t)b1);
        }
    }
}

/* Prepares the nsb super-blocks of one Q8_K activation row for the Q6_K
 * (off 32) or Q3_K (off 4) tiles: corr[j] = -off * sub-block j's sum. */
static void a512__r16k6_prep_off(int32_t off, const uint8_t *X, int64_t nsb, void *out) {
    a512_r16k6 *o = out;
    for (int64_t i = 0; i < nsb; i++, X += 292) {
        memset(&o[i], 0, sizeof o[i]);
        memcpy(&o[i].d, X, 4);
        memcpy(o[i].qs, X + 4, 256);
        for (int j = 0; j < 16; j++) {
            int16_t b;
            memcpy(&b, X + 260 + 2 * j, 2);
            o[i].corr[j] = -off * (int32_t)b;
        }
    }
}

/* The nsb super-blocks of one Q8_K activation row, for Q6_K, Q3_K or Q2_K
 * (off -1: corr = the sub-block sum) tiles. */
static void a512__r16k6_prep_x(const uint8_t *X, int64_t nsb, void *out) {
    a512__r16k6_prep_off(32, X, nsb, out);
}
static void a512__r16k3_prep_x(const uint8_t *X, int64_t nsb, void *out) {
    a512__r16k6_prep_off(4, X, nsb, out);
}
static void a512__r16k2_prep_x(const uint8_t *X, int64_t nsb, void *out) {
    a512__r16k6_prep_off(-1, X, nsb, out);
}

/* Prepares the nb blocks of one Q8_0 activation row for the r16 tiles of
 * weights offset by off (128 Q8_0's w + 128, 8 Q4_0, 16 Q5_0). */
static void a512__r16_prep_x(int32_t off, const uint8_t *X, int64_t nb, a512_r16x *out) {
    for (int64_t b = 0; b < nb; b++, X += 34) {
        int32_t sum = 0;
        memcpy(out[b].qs, X + 2, 32);
        for (int i = 0; i < 32; i++)
            sum += out[b].qs[i];
        out[b].d = a512__f16(X);
        out[b].corr = -off * sum;
    }
}

/* The nb blocks of one Q8_0 activation row, for Q8_0, Q4_0 or Q5_0 r16 tiles. */
static void a512__r16q8_prep_x(const uint8_t *X, int64_t nb, void *out) {
    a512__r16_prep_x(128, X, nb, out);
}
static void a512__r16q4_prep_x(const uint8_t *X, int64_t nb, void *out) {
    a512__r16_prep_x(8, X, nb, out);
}
static void a512__r16q5_prep_x(const uint8_t *X, int64_t nb, void *out) {
    a512__r16_prep_x(16, X, nb, out);
}

/* Each thread's last prepared activation column: a decode step's matmul
 * run calls a matvec once per claim (~10 per thread), every call on the
 * same activation row, and preparing it again each time cost ~1% of
 * decode. Keyed by the raw bytes themselves, so a hit is exactly what prep
 * would write. */
static _Thread_local struct {
    void (*prep)(const uint8_t *X, int64_t nu, void *out);
    int64_t nu;
    size_t n_raw;
    uint8_t raw[16384]; // the row prep read (Q8_0 or Q8_K of K <= 14336)
    _Alignas(64) uint8_t xp[20480];
} a512__xcache;

/* The prepared form of activation row X (n_raw bytes, nu units), from the
 * thread's cache when X's bytes are the ones it was prepared from. */
static uint8_t *a512__xcache_get(void (*prep)(const uint8_t *X, int64_t nu, void *out), int64_t nu,
                                 const void *X, size_t n_raw) {
    if (a512__xcache.prep != prep || a512__xcache.nu != nu || a512__xcache.n_raw != n_raw ||
        memcmp(a512__xcache.raw, X, n_raw) != 0) {
        prep(X, nu, a512__xcache.xp);
        memcpy(a512__xcache.raw, X, n_raw);
        a512__xcache.prep = prep;
        a512__xcache.nu = nu;
        a512__xcache.n_raw = n_raw;
    }
    return a512__xcache.xp;
}

/* A matvec over ng r16 groups (us bytes each) with R-group vec tiles (R =
 * 2..4) that read R contiguous streams: the groups cut into R runs of
 * q = ceil(ng / R), the u-th group of each run in one tile (the last runs
 * shorter or empty, so the last tiles read fewer streams). Pairing
 * adjacent groups instead (u, u + 1) made each stream skip every other
 * group, so the hardware prefetcher retrained at every group: `kvseal
 * bench` Q4_0 tg / roofline 0.80-0.92 (median 0.845) -> 0.82-1.02 (0.95),
 * tg ahead in 5 of 6 alternated rounds; Q4_K_M 0.73-0.83 -> 0.77-0.87,
 * Q8_0 tg ahead in 4 of 4 (Zen 5, 2026-12-04). Each row is still one
 * tile's, so no value changes. */
static void a512__run_vecn(const a512_tile_fn tab[4][4], int R, int64_t K, int64_t ng,
                           const void *W, size_t us, const uint8_t *xp, float *Y) {
    const int64_t q = (ng + R - 1) / R;
    const int nta = a512__pf_nta();
    for (int64_t u = 0; u < q; u++) {
        int n = 1; // streams with a u-th group
        while (n < R && u + n * q < ng)
            n++;
        a512_tile t = {.K = K,
                       .W = (const uint8_t *)W + (size_t)u * us,
                       .ws = (size_t)q * us,
                       .X = xp,
                       .Y = Y + 16 * u,
                       .yr = 16 * (size_t)q,
                       .nta = nta};
        tab[n - 1][0](&t);
    }
}

/* Columns prepared at once, at most: a pass of 8192 tokens prepared every
 * column for every claim of rows (tens of MB allocated, faulted in and
 * read back from DRAM per claim: bench -p 8192 spent 20% in prep and 14%
 * in the kernel's page faults); 64 columns' prepared rows stay in L2. A
 * multiple of 4, so the 4-column tiles fall as before. */
#define A512_R16_XCOLS 64

/* Runs r16 tiles: prepares the columns' activation units (nu of xunit
 * bytes, by prep), then a512__run_tiles over the groups. Without memory
 * for the prepared columns, falls back to unpacking (plain, the same
 * tolerance). More than A512_R16_XCOLS columns run a slice at a time. */
static void a512__run_r16(ks_dtype wt, const a512_tile_fn tab[4][4], const a512_tile_fn *wide,
                          void (*prep)(const uint8_t *X, int64_t nu, void *out), int64_t nu,
                          size_t xunit, kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                          const void *W, size_t ws, const void *X, size_t xs, float *Y, size_t ys) {
    const size_t xps = (size_t)nu * xunit;
    if (n_cols > A512_R16_XCOLS) { // a long prompt's batch: a slice of columns at a time
        for (int c0 = 0; c0 < n_cols; c0 += A512_R16_XCOLS)
            a512__run_r16(wt, tab, wide, prep, nu, xunit, plain, K, n_rows,
                          n_cols - c0 < A512_R16_XCOLS ? n_cols - c0 : A512_R16_XCOLS, W, ws,
                          (const uint8_t *)X + (size_t)c0 * xs, xs, Y + (size_t)c0 * ys, ys);
        return;
    }
    uint64_t raw = 0;
    KS_ASSERT(ks_dtype_row_bytes(kern_act_type(wt), (uint64_t)K, &raw));
    _Alignas(64) uint8_t small[20480];
    uint8_t *xp;
    if (n_cols == 1 && xps <= sizeof a512__xcache.xp && raw <= sizeof a512__xcache.raw) {
        xp = a512__xcache_get(prep, nu, X, (size_t)raw);
    } else {
        xp = (size_t)n_cols * xps <= sizeof small ? small : ks_alloc_aligned((size_t)n_cols * xps);
        if (!xp) {
            kern__matmul_r16_via(plain, wt, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
            return;
        }
        for (int c = 0; c < n_cols; c++)
            prep((const uint8_t *)X + (size_t)c * xs, nu, xp + (size_t)c * xps);
    }
    // a matvec reads one group at a time: one sequential stream, which the
    // hardware prefetcher follows (four adjacent groups at once were slower
    // from DRAM); Q8_0, Q4_0 and Q4_K two contiguous streams at once
    // (A512_VEC_RB, a512__run_vecn), and Q6_K where the prefetches are NTA
    // (with T0 its two-group tile was behind on the Zen 5 host). Q4_0 reads
    // four where they are NTA: Zen 5 (2026-12-04, `kvseal bench` tg128
    // against two, alternated rounds) ahead in 19 of 22 rounds of a build
    // switching at run time, tg / roofline 0.89-0.92 -> 0.96-0.98 by run, and
    // 7 of 8 by tg / roofline in the final build (5 of 8 by tg, +2%); four
    // at a total distance of 4096 or three streams were no better than two,
    // Q8_0 even. MXFP4 two: against one, tg64 34-35 -> 40-47 tokens/s in 3
    // of 3 alternated rounds on the 1.1B shape; four no better than two
    // (Zen 5, 2026-12-06).
    int vec_rb = 1;
    if (wt == KS_DTYPE_Q8_0 || wt == KS_DTYPE_Q4_0 || wt == KS_DTYPE_Q4_K || wt == KS_DTYPE_MXFP4 ||
        (wt == KS_DTYPE_Q6_K && a512__pf_nta()))
        vec_rb = A512_VEC_RB;
    if (wt == KS_DTYPE_Q4_0 && a512__pf_nta() && vec_rb == 2) vec_rb = 4;
    const size_t us = kern_r16_group_bytes(wt, K);
    if (n_cols == 1 && vec_rb > 1) {
        a512__run_vecn(tab, vec_rb, K, n_rows / 16, W, us, xp, Y);
    } else if (wide && n_cols >= 5 && n_cols <= 8) { // each group once, every column
        const int nta = a512__pf_nta();
        for (int64_t u = 0; u < n_rows / 16; u++) {
            a512_tile t = {.K = K, .W = (const uint8_t *)W + (size_t)u * us, .ws = us, .X = xp,
                           .xs = xps, .Y = Y + 16 * u, .ys = ys, .yr = 16, .nta = nta};
            wide[n_cols - 5](&t);
        }
    } else
        a512__run_tiles(tab, n_cols == 1 ? 1 : 4, 16, K, n_rows / 16, n_cols, W,
                        kern_r16_group_bytes(wt, K), xp, xps, Y, ys);
    if (xp != small && xp != a512__xcache.xp) ks_free_aligned(xp);
}

/* Matches kern__matmul_q8_0_ref over r16 groups; integer block sums exact,
 * the error as a512__matmul_q8_0's. */
void kern__a512_matmul_r16_q8_0(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                size_t ys) {
    a512__run_r16(KS_DTYPE_Q8_0, a512__r16q8_tile_tab[a512__use_vnni()],
                  a512__r16q8_tile_wide[a512__use_vnni()], a512__r16q8_prep_x, K / 32,
                  sizeof(a512_r16x), plain, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

/* Matches kern__matmul_q4_0_ref over r16 groups; as a512__matmul_r16_q8_0. */
void kern__a512_matmul_r16_q4_0(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                size_t ys) {
    a512__run_r16(KS_DTYPE_Q4_0, a512__r16q4_tile_tab[a512__use_vnni()],
                  a512__r16q4_tile_wide[a512__use_vnni()], a512__r16q4_prep_x, K / 32,
                  sizeof(a512_r16x), plain, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

/* Matches kern__matmul_q5_0_ref over r16 groups; integer block sums exact,
 * the error as a512__matmul_q5_0's. */
void kern__a512_matmul_r16_q5_0(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                size_t ys) {
    a512__run_r16(KS_DTYPE_Q5_0, a512__r16q5_tile_tab[a512__use_vnni()],
                  a512__r16q5_tile_wide[a512__use_vnni()], a512__r16q5_prep_x, K / 32,
                  sizeof(a512_r16x), plain, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

/* Matches kern__matmul_q4_K_ref over r16 groups; integer sums exact, the
 * error as a512__matmul_q4_K's. */
void kern__a512_matmul_r16_q4_K(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                size_t ys) {
    a512__run_r16(KS_DTYPE_Q4_K, a512__r16k_tile_tab[a512__use_vnni()],
                  a512__r16k_tile_wide[a512__use_vnni()], a512__r16k_prep_x, K / 256,
                  sizeof(a512_r16k), plain, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

/* Matches kern__matmul_q6_K_ref over r16 groups; integer sums exact, the
 * error as a512__matmul_q6_K's. */
void kern__a512_matmul_r16_q6_K(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                size_t ys) {
    const int V = a512__use_vnni();
    a512__run_r16(KS_DTYPE_Q6_K,
                  a512__use_gfni() ? a512__r16k6g_tile_tab[V] : a512__r16k6_tile_tab[V], NULL,
                  a512__r16k6_prep_x, K / 256, sizeof(a512_r16k6), plain, K, n_rows, n_cols, W, ws,
                  X, xs, Y, ys);
}

/* Matches kern__matmul_q5_K_ref over r16 groups; integer sums exact, the
 * error as a512__matmul_q5_K's. */
void kern__a512_matmul_r16_q5_K(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                size_t ys) {
    a512__run_r16(KS_DTYPE_Q5_K, a512__r16k5_tile_tab[a512__use_vnni()], NULL, a512__r16k_prep_x, K / 256,
                  sizeof(a512_r16k), plain, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

/* Matches kern__matmul_q2_K_ref over r16 groups; integer sums exact, the
 * error as a512__matmul_q2_K's. */
void kern__a512_matmul_r16_q2_K(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                size_t ys) {
    a512__run_r16(KS_DTYPE_Q2_K, a512__r16k2_tile_tab[a512__use_vnni()], NULL, a512__r16k2_prep_x,
                  K / 256, sizeof(a512_r16k6), plain, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

/* Matches kern__matmul_q3_K_ref over r16 groups; integer sums exact, the
 * error as a512__matmul_q3_K's. */
void kern__a512_matmul_r16_q3_K(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                size_t ys) {
    a512__run_r16(KS_DTYPE_Q3_K, a512__r16k3_tile_tab[a512__use_vnni()], NULL, a512__r16k3_prep_x,
                  K / 256, sizeof(a512_r16k6), plain, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

/* Matches kern__matmul_iq4_xs_ref over r16 groups; integer sums exact, the
 * error as a512__matmul_iq4_xs's. */
void kern__a512_matmul_r16_iq4_xs(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                  const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                  size_t ys) {
    a512__run_r16(KS_DTYPE_IQ4_XS, a512__r16x4_tile_tab[a512__use_vnni()], NULL, a512__r16x4_prep_x,
                  K / 256, sizeof(a512_r16k6), plain, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

/* Matches kern__matmul_mxfp4_ref over r16 groups; integer block sums exact,
 * the error as a512__matmul_mxfp4's. */
void kern__a512_matmul_r16_mxfp4(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                 const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                 size_t ys) {
    a512__run_r16(KS_DTYPE_MXFP4, a512__r16m_tile_tab[a512__use_vnni()], NULL, a512__r16q8_prep_x, K / 32,
                  sizeof(a512_r16x), plain, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}
