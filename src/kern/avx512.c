

/* avx512.c — AVX-512 (F/BW/VL/DQ) versions of every kern_vtab entry; built
 * with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c and
 * only called when ks_cpu_get()->avx512 (dispatch.c).
 *
 * Matmuls are register-blocked tiles of R weight rows x C activation rows
 * (R, C <= 4; 4x1 for a matvec). Batch invariance (kern.h): every output
 * element owns its own accumulators and sees exactly the same sequence of
 * operations whatever the tile shape, its position in the tile, n_rows,
 * n_cols or the caller's threading; the tile shape only decides which loads
 * are shared. K tails are part of that sequence (masked loads of zeros, or
 * zeroed blocks in a last partial group), so they too depend only on K.
 *
 * Quantized dots: integer lanes are exact (so block sums equal ref.c's isum),
 * then scaled and accumulated in f32; only that f32 part differs from ref.c's
 * double accumulation. Where the CPU has AVX512-VNNI, vpdpbusd / vpdpwssd
 * (inline asm, so no extra -m flag) replace maddubs/madd pairs; both forms
 * produce the same integer lanes, so results are bit-identical either way.
 * KS_AVX512_NO_VNNI=1 forces the plain form (for tests). Likewise the Q6_K
 * matvec uses GFNI's vgf2p8affineqb (inline asm) to move bit fields within
 * bytes where the CPU has it; KS_AVX512_NO_GFNI=1 forces the shift form.
 * Each function names the ref it matches and its expected error.
 *
 * The kernels over the r16 repacked layout are avx512_r16.c's, the vector
 * and attention ops avx512_vec.c's; the helpers, tiling driver and dot
 * steps they share are avx512_int.h's. This file holds the row-major
 * (plain) matmuls, the activation quantizers and the vtab. */
#include "kern/avx512_int.h"
#include "kern/iq_simd.h"

#include <math.h>

// ----------------------------------------------------------------------------
// F32 / F16 / BF16 weights x F32 activations
// Per element: 16 f32 lanes, lane l accumulates k = l (mod 16) with fma in
// increasing k; the K tail is a masked load of zeros; then one fixed
// horizontal reduction.

enum { A512_WF32, A512_WF16, A512_WBF16 };

/* 16 weights starting at element k of a row, as f32 (exact). */
A512_INLINE __m512 a512__wload(int wt, const uint8_t *row, int64_t k, __mmask16 m) {
    if (wt == A512_WF32) return _mm512_maskz_loadu_ps(m, row + 4 * k);
    __m256i h = _mm256_maskz_loadu_epi16(m, row + 2 * k);
    if (wt == A512_WF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

A512_INLINE void a512__fl_tile(int wt, int R, int C, const a512_tile *t) {
    __m512 acc[4][4];
    A512_FOR_R A512_FOR_C acc[r][c] = _mm512_setzero_ps();
    const int64_t K = t->K;
    int64_t k = 0;
    for (; k <= K - 16; k += 16) {
        __m512 x[4];
        A512_FOR_C x[c] = _mm512_loadu_ps((const float *)(t->X + c * t->xs) + k);
        A512_FOR_R {
            __m512 w = a512__wload(wt, t->W + r * t->ws, k, 0xFFFF);
            A512_FOR_C acc[r][c] = _mm512_fmadd_ps(w, x[c], acc[r][c]);
        }
    }
    if (k < K) {
        __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
        __m512 x[4];
        A512_FOR_C x[c] = _mm512_maskz_loadu_ps(m, (const float *)(t->X + c * t->xs) + k);
        A512_FOR_R {
            __m512 w = a512__wload(wt, t->W + r * t->ws, k, m);
            A512_FOR_C acc[r][c] = _mm512_fmadd_ps(w, x[c], acc[r][c]);
        }
    }
    A512_FOR_R A512_FOR_C t->Y[c * t->ys + r] = _mm512_reduce_add_ps(acc[r][c]);
}

#define a512__f32_tile(R, C, t, V) a512__fl_tile(A512_WF32, R, C, t)
#define a512__f16_tile(R, C, t, V) a512__fl_tile(A512_WF16, R, C, t)
#define a512__bf16_tile(R, C, t, V) a512__fl_tile(A512_WBF16, R, C, t)
A512_TILES_V1(a512__f32_tile, 0)
A512_TILES_V1(a512__f16_tile, 0)
A512_TILES_V1(a512__bf16_tile, 0)

/* Matches kern__matmul_f32_ref (double accumulation): relative error about
 * K * 2^-24 of sum |w*x| (f32 fma accumulation, 16 lanes). */
static void a512__matmul_f32(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                             const void *X, size_t xs, float *Y, size_t ys) {
    a512__run(a512__f32_tile_tab0, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

/* Matches kern__matmul_f16_ref; tolerance as a512__matmul_f32 (f16->f32 is
 * exact). */
static void a512__matmul_f16(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                             const void *X, size_t xs, float *Y, size_t ys) {
    a512__run(a512__f16_tile_tab0, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

/* Matches kern__matmul_bf16_ref; tolerance as a512__matmul_f32. */
static void a512__matmul_bf16(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                              const void *X, size_t xs, float *Y, size_t ys) {
    a512__run(a512__bf16_tile_tab0, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

// ----------------------------------------------------------------------------
// Q8_0 / Q4_0 weights x Q8_0 activations
// Groups of four 32-element blocks (the missing ones zeroed in a last
// partial group). Two zmm per group: "lo" holds elements 0-15 of blocks
// 0..3 (16 bytes each), "hi" elements 16-31, so int32 lanes 4k..4k+3 belong
// to block k only. Each lane gets the exact sum of the 8 products of its
// bytes in lo and hi. Per element and group: acc = fma((float)isum,
// d_w*d_x per lane, acc), groups in order, then one reduction. Scales of
// 8 full blocks are converted together (the values are the same as when
// converted one at a time, so the results are too).

/* The f16 scales of blocks 0..7 (stride bytes apart, at offset 0) as f32. */
A512_INLINE __m512 a512__d8(const uint8_t *b, int stride) {
    // eight scalar loads: a vpgatherdd costs more than they do on AMD cores
    uint16_t h[8];
    _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) memcpy(&h[i], b + i * stride, 2);
    return _mm512_castps256_ps512(
        _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)h)));
}

/* Lanes 4k..4k+3 = d[4g + k] of an 8- (or 4-) scale vector. */
A512_INLINE __m512 a512__d_group(__m512 d8, int g) {
    const __m512i i0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    return _mm512_permutexvar_ps(_mm512_add_epi32(i0, _mm512_set1_epi32(4 * g)), d8);
}

/* Scales of n (1..4) blocks stride bytes apart, one at a time, 0 for the
 * missing ones, in a512__d_group's lanes. */
A512_INLINE __m512 a512__d4(const uint8_t *b, int stride, int n) {
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k = 0; k < n; k++)
        d[k] = a512__f16(b + k * stride);
    return a512__d_group(_mm512_castps128_ps512(_mm_loadu_ps(d)), 0);
}

/* lo / hi vectors of n (1..4) Q8_0 blocks at b (qs of block k at b+34k+2). */
A512_INLINE void a512__q8_0_lohi(const uint8_t *b, int n, __m512i *lo, __m512i *hi) {
    __m512i ab, cd;
    if (n == 4) {
        ab = a512__load2x32(b + 2, b + 36);
        cd = a512__load2x32(b + 70, b + 104);
    } else {
        ab = n >= 2 ? a512__load2x32(b + 2, b + 36)
                    : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(b + 2)));
        cd = n == 3 ? _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(b + 70)))
                    : _mm512_setzero_si512();
    }
    *lo = _mm512_shuffle_i64x2(ab, cd, _MM_SHUFFLE(2, 0, 2, 0));
    *hi = _mm512_shuffle_i64x2(ab, cd, _MM_SHUFFLE(3, 1, 3, 1));
}

/* lo / hi nibble vectors (0..15) of n (1..4) Q4_0 blocks at b. */
A512_INLINE void a512__q4_0_lohi(const uint8_t *b, int n, __m512i *lo, __m512i *hi) {
    __m512i q = _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)(b + 2)));
    if (n > 1) q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(b + 20)), 1);
    if (n > 2) q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(b + 38)), 2);
    if (n > 3) q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(b + 56)), 3);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    *lo = _mm512_and_si512(q, m4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
}

typedef struct a512_xg {
    __m512i xl, xh, xs8; /* from a512__prep_group (xs8 unused for Q8_0) */
    __m512 xd;           /* the 4 blocks' scales, lanes 4k..4k+3 = block k, 0 if missing */
} a512_xg;

/* The activation side of one group (blocks ib .. ib+n-1 of a Q8_0 row at xb):
 * lo/hi bytes (x+128 for Q8_0 under VNNI, whose unsigned side x is), and for
 * Q4_0 the offset term: -8 * (sum of the lane's 8 x bytes) per int32 lane
 * with VNNI, 8 * (x pair sums of lo + hi) per int16 lane without. */
A512_INLINE void a512__prep_group(int Q4, int V, const uint8_t *xb, int n, a512_xg *g) {
    const __m512i ones8 = _mm512_set1_epi8(1), c80 = _mm512_set1_epi8((char)0x80),
                  z = _mm512_setzero_si512();
    __m512i xl, xh;
    a512__q8_0_lohi(xb, n, &xl, &xh);
    g->xs8 = z;
    if (Q4 && V)
        g->xs8 = _mm512_sub_epi32(
            z, _mm512_slli_epi32(a512__dpbusd(a512__dpbusd(z, ones8, xl), ones8, xh), 3));
    else if (Q4)
        g->xs8 = _mm512_slli_epi16(
            _mm512_add_epi16(_mm512_maddubs_epi16(ones8, xl), _mm512_maddubs_epi16(ones8, xh)), 3);
    if (!Q4 && V) {
        xl = _mm512_xor_si512(xl, c80);
        xh = _mm512_xor_si512(xh, c80);
    }
    g->xl = xl;
    g->xh = xh;
}

/* The weight side of one group: what the core needs from a row's blocks
 * (lo/hi values; for Q8_0 under VNNI, -128 * sum(w) per int32 lane) and the
 * group's scales in a512__d_group's lanes. */
typedef struct a512_wg {
    __m512i wl, wh, neg;
    __m512 wd;
} a512_wg;

/* a512_wg of blocks ib .. ib+n-1 of a row at wb (wd left to the caller). */
A512_INLINE void a512__prep_wgroup(int Q4, int V, const uint8_t *wb, int n, a512_wg *g) {
    const __m512i c80 = _mm512_set1_epi8((char)0x80), z = _mm512_setzero_si512();
    if (Q4)
        a512__q4_0_lohi(wb, n, &g->wl, &g->wh);
    else
        a512__q8_0_lohi(wb, n, &g->wl, &g->wh);
    g->neg =
        !Q4 && V ? _mm512_sub_epi32(z, a512__dpbusd(a512__dpbusd(z, c80, g->wl), c80, g->wh)) : z;
}

/* One group of an R x C tile from its weight and activation sides; Q4
 * selects Q4_0 weights. Q8_0: without VNNI the weight's sign moves onto x
 * (|w| * (sign(w) x); x is never -128, kern_int.h); with VNNI x+128 is the
 * unsigned side and 128*sum(w) is subtracted. Q4_0: sum(q*x) - 8*sum(x).
 * Per element: acc = fma((float)isum, d_w*d_x per lane, acc). */
A512_INLINE void a512__q80_core(int Q4, int R, int C, int V, const a512_wg *const wg[4],
                                const a512_xg *const xg[4], __m512 acc[4][4]) {
    const __m512i ones16 = _mm512_set1_epi16(1), z = _mm512_setzero_si512();
    A512_FOR_R {
        const __m512i wl = wg[r]->wl, wh = wg[r]->wh;
        const __m512 wd = wg[r]->wd;
        if (Q4) {
            A512_FOR_C {
                __m512i p;
                if (V) {
                    p = a512__dpbusd(a512__dpbusd(xg[c]->xs8, wl, xg[c]->xl), wh, xg[c]->xh);
                } else {
                    __m512i p16 = _mm512_add_epi16(_mm512_maddubs_epi16(wl, xg[c]->xl),
                                                   _mm512_maddubs_epi16(wh, xg[c]->xh));
                    p = _mm512_madd_epi16(_mm512_sub_epi16(p16, xg[c]->xs8), ones16);
                }
                acc[r][c] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(wd, xg[c]->xd), acc[r][c]);
            }
        } else if (V) {
            A512_FOR_C {
                __m512i p = a512__dpbusd(a512__dpbusd(wg[r]->neg, xg[c]->xl, wl), xg[c]->xh, wh);
                acc[r][c] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(wd, xg[c]->xd), acc[r][c]);
            }
        } else {
            __m512i al = _mm512_abs_epi8(wl), ah = _mm512_abs_epi8(wh);
            __mmask64 sl = _mm512_movepi8_mask(wl), sh = _mm512_movepi8_mask(wh);
            A512_FOR_C {
                __m512i pl =
                    _mm512_maddubs_epi16(al, _mm512_mask_sub_epi8(xg[c]->xl, sl, z, xg[c]->xl));
                __m512i ph =
                    _mm512_maddubs_epi16(ah, _mm512_mask_sub_epi8(xg[c]->xh, sh, z, xg[c]->xh));
                __m512i p =
                    _mm512_add_epi32(_mm512_madd_epi16(pl, ones16), _mm512_madd_epi16(ph, ones16));
                acc[r][c] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(wd, xg[c]->xd), acc[r][c]);
            }
        }
    }
}

/* One group (blocks ib .. ib+n-1) of a tile over raw weight rows: the weight
 * side prepared in registers; wd: its scales per row; xg[c]: column c's
 * prepared group (a512__prep_group, with its scales). */
A512_INLINE void a512__q80p_group(int Q4, int R, int C, const a512_tile *t, int V, int64_t ib,
                                  int n, const __m512 wd[4], const a512_xg *const xg[4],
                                  __m512 acc[4][4]) {
    const int wbs = Q4 ? 18 : 34;
    a512_wg g[4];
    const a512_wg *gp[4];
    A512_FOR_R {
        a512__prep_wgroup(Q4, V, t->W + r * t->ws + ib * wbs, n, &g[r]);
        g[r].wd = wd[r];
        gp[r] = &g[r];
    }
    a512__q80_core(Q4, R, C, V, gp, xg, acc);
}

/* A group of the plain tile: columns prepared in registers. */
A512_INLINE void a512__q80x_group(int Q4, int R, int C, const a512_tile *t, int V, int64_t ib,
                                  int n, const __m512 wd[4], const __m512 xd[4], __m512 acc[4][4]) {
    a512_xg g[4];
    const a512_xg *gp[4];
    A512_FOR_C {
        a512__prep_group(Q4, V, t->X + c * t->xs + ib * 34, n, &g[c]);
        g[c].xd = xd[c];
        gp[c] = &g[c];
    }
    a512__q80p_group(Q4, R, C, t, V, ib, n, wd, gp, acc);
}

/* A Q8_0-activation tile; Q4 selects Q4_0 weights (18-byte blocks). */
A512_INLINE void a512__q80x_tile(int Q4, int R, int C, const a512_tile *t, int V) {
    const int wbs = Q4 ? 18 : 34;
    __m512 acc[4][4];
    A512_FOR_R A512_FOR_C acc[r][c] = _mm512_setzero_ps();
    const int64_t nb = t->K / 32;
    int64_t ib = 0;
    for (; ib + 8 <= nb; ib += 8) {
        __m512 w8[4], x8[4];
        A512_FOR_R a512__prefetch_next(t, r, R, ib * wbs, 8 * wbs);
        A512_FOR_R w8[r] = a512__d8(t->W + r * t->ws + ib * wbs, wbs);
        A512_FOR_C x8[c] = a512__d8(t->X + c * t->xs + ib * 34, 34);
        _Pragma("GCC unroll 2") for (int g = 0; g < 2; g++) {
            __m512 wd[4], xd[4];
            A512_FOR_R wd[r] = a512__d_group(w8[r], g);
            A512_FOR_C xd[c] = a512__d_group(x8[c], g);
            a512__q80x_group(Q4, R, C, t, V, ib + 4 * g, 4, wd, xd, acc);
        }
    }
    for (; ib < nb; ib += 4) {
        int n = nb - ib < 4 ? (int)(nb - ib) : 4;
        __m512 wd[4], xd[4];
        A512_FOR_R wd[r] = a512__d4(t->W + r * t->ws + ib * wbs, wbs, n);
        A512_FOR_C xd[c] = a512__d4(t->X + c * t->xs + ib * 34, 34, n);
        a512__q80x_group(Q4, R, C, t, V, ib, n, wd, xd, acc);
    }
    A512_FOR_R A512_FOR_C t->Y[c * t->ys + r] = _mm512_reduce_add_ps(acc[r][c]);
}

#define a512__q8_0_tile(R, C, t, V) a512__q80x_tile(0, R, C, t, V)
#define a512__q4_0_tile(R, C, t, V) a512__q80x_tile(1, R, C, t, V)
A512_TILES_V(a512__q8_0_tile)
A512_TILES_V(a512__q4_0_tile)

// Prefill: the activation side of each group (a512__prep_group and the block
// scales), prepared once per matmul call instead of once per row tile. The
// plain tile prepares the same a512_xg in registers and both run
// a512__q80p_group, so they compute the same values bit for bit.

/* Prepares the ceil(nb/4) groups of one Q8_0 activation row. */
static void a512__prep_x(int Q4, int V, const uint8_t *X, int64_t nb, a512_xg *out) {
    for (int64_t ib = 0; ib < nb; ib += 4, out++) {
        int n = nb - ib < 4 ? (int)(nb - ib) : 4;
        a512__prep_group(Q4, V, X + ib * 34, n, out);
        out->xd = a512__d4(X + ib * 34, 34, n);
    }
}

/* a512__q80x_tile over prepared activations: t->X is column 0's a512_xg
 * array, t->xs the byte distance between columns' arrays. */
A512_INLINE void a512__q80p_tile(int Q4, int R, int C, const a512_tile *t, int V) {
    const int wbs = Q4 ? 18 : 34;
    __m512 acc[4][4];
    A512_FOR_R A512_FOR_C acc[r][c] = _mm512_setzero_ps();
    const int64_t nb = t->K / 32;
    const a512_xg *xg[4];
    A512_FOR_C xg[c] = (const a512_xg *)(const void *)(t->X + c * t->xs);
    int64_t ib = 0;
    for (; ib + 8 <= nb; ib += 8) {
        __m512 w8[4];
        A512_FOR_R w8[r] = a512__d8(t->W + r * t->ws + ib * wbs, wbs);
        _Pragma("GCC unroll 2") for (int g = 0; g < 2; g++) {
            __m512 wd[4];
            A512_FOR_R wd[r] = a512__d_group(w8[r], g);
            a512__q80p_group(Q4, R, C, t, V, ib + 4 * g, 4, wd, xg, acc);
            A512_FOR_C xg[c]++;
        }
    }
    for (; ib < nb; ib += 4) {
        int n = nb - ib < 4 ? (int)(nb - ib) : 4;
        __m512 wd[4];
        A512_FOR_R wd[r] = a512__d4(t->W + r * t->ws + ib * wbs, wbs, n);
        a512__q80p_group(Q4, R, C, t, V, ib, n, wd, xg, acc);
        A512_FOR_C xg[c]++;
    }
    A512_FOR_R A512_FOR_C t->Y[c * t->ys + r] = _mm512_reduce_add_ps(acc[r][c]);
}

/* A tile over prepared weights and activations: t->W is row 0's a512_wg
 * array (t->ws bytes between rows), t->X column 0's a512_xg array. */
A512_INLINE void a512__q80pp_tile(int Q4, int R, int C, const a512_tile *t, int V) {
    __m512 acc[4][4];
    A512_FOR_R A512_FOR_C acc[r][c] = _mm512_setzero_ps();
    const a512_wg *wg[4];
    const a512_xg *xg[4];
    A512_FOR_R wg[r] = (const a512_wg *)(const void *)(t->W + r * t->ws);
    A512_FOR_C xg[c] = (const a512_xg *)(const void *)(t->X + c * t->xs);
    for (int64_t g = 0, ng = (t->K / 32 + 3) / 4; g < ng; g++) {
        a512__q80_core(Q4, R, C, V, wg, xg, acc);
        A512_FOR_R wg[r]++;
        A512_FOR_C xg[c]++;
    }
    A512_FOR_R A512_FOR_C t->Y[c * t->ys + r] = _mm512_reduce_add_ps(acc[r][c]);
}

/* Prepares the groups of one weight row (the same values the raw tiles
 * derive, scales from a512__d4 as in their tail). */
static void a512__prep_w(int Q4, int V, const uint8_t *row, int64_t nb, a512_wg *out) {
    const int wbs = Q4 ? 18 : 34;
    for (int64_t ib = 0; ib < nb; ib += 4, out++) {
        int n = nb - ib < 4 ? (int)(nb - ib) : 4;
        a512__prep_wgroup(Q4, V, row + ib * wbs, n, out);
        out->wd = a512__d4(row + ib * wbs, wbs, n);
    }
}

#define a512__q8_0p_tile(R, C, t, V) a512__q80p_tile(0, R, C, t, V)
#define a512__q4_0p_tile(R, C, t, V) a512__q80p_tile(1, R, C, t, V)
#define a512__q8_0pp_tile(R, C, t, V) a512__q80pp_tile(0, R, C, t, V)
#define a512__q4_0pp_tile(R, C, t, V) a512__q80pp_tile(1, R, C, t, V)
A512_TILES_V(a512__q8_0p_tile)
A512_TILES_V(a512__q4_0p_tile)
A512_TILES_V(a512__q8_0pp_tile)
A512_TILES_V(a512__q4_0pp_tile)

/* A Q8_0-activation matmul of several columns: prepares the activations of
 * all columns once (a512__prep_x), then runs the prepared tiles; NULL
 * scratch (no memory) falls back to the plain tiles. */
static void a512__run_q80(int Q4, int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                          const void *X, size_t xs, float *Y, size_t ys) {
    const int V = a512__use_vnni();
    const int64_t nb = K / 32, ng = (nb + 3) / 4;
    a512_xg *p = n_cols > 1 ? ks_alloc_aligned((size_t)n_cols * (size_t)ng * sizeof *p) : NULL;
    if (!p) {
        a512__run(Q4 ? a512__q4_0_tile_tab[V] : a512__q8_0_tile_tab[V], K, n_rows, n_cols, W, ws, X,
                  xs, Y, ys);
        return;
    }
    for (int c = 0; c < n_cols; c++)
        a512__prep_x(Q4, V, (const uint8_t *)X + (size_t)c * xs, nb, p + (size_t)c * (size_t)ng);
    // With many columns (prefill), the rows' weight side is prepared too, a
    // chunk of rows (~192 KiB prepared) at a time, and reused by every column
    // tile. At 16 columns (decode of 16 streams) that was slower: the weights
    // come from DRAM once and the prepared copy costs more than it saves.
    int ch = (int)((192 * 1024) / ((size_t)ng * sizeof(a512_wg))) & ~3;
    ch = ch < 4 ? 4 : ch;
    a512_wg *w = n_cols >= 32 ? ks_alloc_aligned((size_t)ch * (size_t)ng * sizeof *w) : NULL;
    if (!w) {
        a512__run(Q4 ? a512__q4_0p_tile_tab[V] : a512__q8_0p_tile_tab[V], K, n_rows, n_cols, W, ws,
                  p, (size_t)ng * sizeof *p, Y, ys);
    } else {
        for (int r1 = 0; r1 < n_rows; r1 += ch) {
            int nr = n_rows - r1 < ch ? n_rows - r1 : ch;
            for (int r = 0; r < nr; r++)
                a512__prep_w(Q4, V, (const uint8_t *)W + (size_t)(r1 + r) * ws, nb,
                             w + (size_t)r * (size_t)ng);
            a512__run(Q4 ? a512__q4_0pp_tile_tab[V] : a512__q8_0pp_tile_tab[V], K, nr, n_cols, w,
                      (size_t)ng * sizeof *w, p, (size_t)ng * sizeof *p, Y + r1, ys);
        }
    }
    ks_free_aligned(w);
    ks_free_aligned(p);
}

/* Matches kern__matmul_q8_0_ref: block integer sums are exact; error is the
 * f32 rounding of d_w*d_x, of each lane term and of the accumulation, about
 * (K/32 + 3) * 2^-24 of sum |block terms|. */
static void a512__matmul_q8_0(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                              const void *X, size_t xs, float *Y, size_t ys) {
    a512__run_q80(0, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

/* Matches kern__matmul_q4_0_ref; tolerance as a512__matmul_q8_0. */
static void a512__matmul_q4_0(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                              const void *X, size_t xs, float *Y, size_t ys) {
    a512__run_q80(1, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

// ----------------------------------------------------------------------------
// Q4_1 / Q5_0 / Q5_1 / IQ4_NL / MXFP4 weights x Q8_0 activations
// Per pair of 32-element blocks, one zmm of 64 unsigned weight bytes u in
// element order (bytes 0-31 block b, 32-63 block b+1; a lone last block
// leaves the upper half and its scales zero) times the two activation
// blocks, with a512__dpbusd_v: int32 lanes 0-7 belong to block b, 8-15 to
// b+1, each the exact sum of 4 products. The offset of each type goes back
// out in int32, from xs = the lane's sum of x (exact): Q5_0 u = q (value
// q - 16): - 16*xs; IQ4_NL and MXFP4 u = codebook + 128: - 128*xs; Q4_1 / Q5_1 u = q
// (value d*q + m): nothing, and m's term is acc = fma(xs, m_w*d_x, acc).
// Then acc = fma((float)isum, d_w*d_x per lane, acc), pairs in order, one
// reduction at the end; the sequence depends only on K (batch invariance).

enum { A512_Q41, A512_Q50, A512_Q51, A512_IQ4NL, A512_MXFP4 };

/* Block bytes, and the offsets of qs and qh in a block, of type T. */
#define A512_Q32_BYTES(T)                                                                          \
    ((T) == A512_Q41 ? 20 : (T) == A512_Q50 ? 22 : (T) == A512_Q51 ? 24 : (T) == A512_MXFP4 ? 17 : 18)
#define A512_Q32_QS(T)                                                                             \
    ((T) == A512_Q41 ? 4 : (T) == A512_Q50 ? 6 : (T) == A512_Q51 ? 8 : (T) == A512_MXFP4 ? 1 : 2)
#define A512_Q32_QH(T) ((T) == A512_Q50 ? 2 : 4)

/* Two f16 scales (the second 0 when absent) in lanes 0-7 and 8-15. */
A512_INLINE __m512 a512__d2(const uint8_t *p0, const uint8_t *p1) {
    return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a512__f16(p0)),
                                _mm512_set1_ps(p1 ? a512__f16(p1) : 0.0f));
}

/* The same for two MXFP4 E8M0 scales (kern__e8m0_half). */
A512_INLINE __m512 a512__e2(const uint8_t *p0, const uint8_t *p1) {
    return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(kern__e8m0_half(*p0)),
                                _mm512_set1_ps(p1 ? kern__e8m0_half(*p1) : 0.0f));
}

/* The unsigned weight bytes of blocks b (at wb) and b+1 (n == 2). */
A512_INLINE __m512i a512__q32_wq(int T, const uint8_t *wb, int n) {
    const int bs = A512_Q32_BYTES(T), qo = A512_Q32_QS(T);
    __m128i q0 = _mm_loadu_si128((const __m128i *)(wb + qo));
    __m128i q1 = n > 1 ? _mm_loadu_si128((const __m128i *)(wb + bs + qo)) : _mm_setzero_si128();
    __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(q0, q0)),
                                   _mm256_set_m128i(q1, q1), 1);
    // 128-bit lanes 1 and 3: the high nibbles (elements 16..31)
    const __m512i sh = _mm512_set_epi64(0x0004000400040004, 0x0004000400040004, 0, 0,
                                        0x0004000400040004, 0x0004000400040004, 0, 0);
    q = _mm512_and_si512(_mm512_srlv_epi16(q, sh), _mm512_set1_epi8(0x0F));
    if (T == A512_Q50 || T == A512_Q51) { // bit 4 of element i: bit i of qh as a u32
        uint32_t h0, h1 = 0;
        memcpy(&h0, wb + A512_Q32_QH(T), 4);
        if (n > 1) memcpy(&h1, wb + bs + A512_Q32_QH(T), 4);
        __mmask64 k = (__mmask64)h0 | (__mmask64)h1 << 32;
        q = _mm512_mask_add_epi8(q, k, q, _mm512_set1_epi8(16));
    }
    if (T == A512_IQ4NL || T == A512_MXFP4) { // codebook + 128, the same in each 128-bit lane
        const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(
            T == A512_MXFP4 ? kern_mxfp4_values : kern_iq4nl_values));
        q = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_xor_si128(v, _mm_set1_epi8((char)0x80))),
                                q);
    }
    return q;
}

A512_INLINE void a512__q32_tile(int T, int R, int C, const a512_tile *t, int V) {
    const int bs = A512_Q32_BYTES(T);
    const bool has_m = T == A512_Q41 || T == A512_Q51;
    const int off = T == A512_Q50 ? 4 : T == A512_IQ4NL || T == A512_MXFP4 ? 7 : -1; /* log2 */
    const __m512i ones8 = _mm512_set1_epi8(1), z = _mm512_setzero_si512();
    __m512 acc[4][4];
    A512_FOR_R A512_FOR_C acc[r][c] = _mm512_setzero_ps();
    const int64_t nb = t->K / 32;
    for (int64_t ib = 0; ib < nb; ib += 2) {
        const int n = nb - ib < 2 ? 1 : 2;
        __m512i x[4], xs[4], corr[4];
        __m512 xd[4];
        A512_FOR_C {
            const uint8_t *xb = t->X + c * t->xs + ib * 34;
            x[c] = n > 1 ? a512__load2x32(xb + 2, xb + 36)
                         : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(xb + 2)));
            xs[c] = a512__dpbusd_v(V, z, ones8, x[c]);
            corr[c] = off > 0 ? _mm512_sub_epi32(z, _mm512_slli_epi32(xs[c], off)) : z;
            xd[c] = a512__d2(xb, n > 1 ? xb + 34 : NULL);
        }
        A512_FOR_R {
            const uint8_t *wb = t->W + r * t->ws + ib * bs;
            a512__prefetch_next(t, r, R, ib * bs, 2 * bs);
            __m512i u = a512__q32_wq(T, wb, n);
            __m512 wd = T == A512_MXFP4 ? a512__e2(wb, n > 1 ? wb + bs : NULL)
                                        : a512__d2(wb, n > 1 ? wb + bs : NULL);
            __m512 wm = has_m ? a512__d2(wb + 2, n > 1 ? wb + bs + 2 : NULL) : wd;
            A512_FOR_C {
                __m512i p = a512__dpbusd_v(V, corr[c], u, x[c]);
                acc[r][c] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(wd, xd[c]), acc[r][c]);
                if (has_m)
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(xs[c]), _mm512_mul_ps(wm, xd[c]),
                                                acc[r][c]);
            }
        }
    }
    A512_FOR_R A512_FOR_C t->Y[c * t->ys + r] = _mm512_reduce_add_ps(acc[r][c]);
}

#define a512__q4_1_tile(R, C, t, V) a512__q32_tile(A512_Q41, R, C, t, V)
#define a512__q5_0_tile(R, C, t, V) a512__q32_tile(A512_Q50, R, C, t, V)
#define a512__q5_1_tile(R, C, t, V) a512__q32_tile(A512_Q51, R, C, t, V)
#define a512__iq4_nl_tile(R, C, t, V) a512__q32_tile(A512_IQ4NL, R, C, t, V)
#define a512__mxfp4_tile(R, C, t, V) a512__q32_tile(A512_MXFP4, R, C, t, V)
A512_TILES_V(a512__q4_1_tile)
A512_TILES_V(a512__q5_0_tile)
A512_TILES_V(a512__q5_1_tile)
A512_TILES_V(a512__iq4_nl_tile)
A512_TILES_V(a512__mxfp4_tile)

/* Match kern__matmul_{q4_1,q5_0,q5_1,iq4_nl,mxfp4}_ref: block integer sums exact;
 * error as a512__matmul_q8_0's, of sum |block terms| (for Q4_1 / Q5_1 the
 * d and m terms counted apart: they can cancel). */
static void a512__matmul_q4_1(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                              const void *X, size_t xs, float *Y, size_t ys) {
    a512__run(a512__q4_1_tile_tab[a512__use_vnni()], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}
static void a512__matmul_q5_0(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                              const void *X, size_t xs, float *Y, size_t ys) {
    a512__run(a512__q5_0_tile_tab[a512__use_vnni()], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}
static void a512__matmul_q5_1(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                              const void *X, size_t xs, float *Y, size_t ys) {
    a512__run(a512__q5_1_tile_tab[a512__use_vnni()], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}
static void a512__matmul_iq4_nl(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                                const void *X, size_t xs, float *Y, size_t ys) {
    a512__run(a512__iq4_nl_tile_tab[a512__use_vnni()], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}
static void a512__matmul_mxfp4(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                               const void *X, size_t xs, float *Y, size_t ys) {
    a512__run(a512__mxfp4_tile_tab[a512__use_vnni()], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

// ----------------------------------------------------------------------------
// Q4_K / Q6_K weights x Q8_K activations
// Per super-block of 256 and element: four 64-element steps (Q4_K: the
// sub-blocks a and a+2, a = 0, 1, 4, 5; Q6_K: elements 64k..64k+63) each add,
// into 16 int32 lanes, madd(maddubs(q_w, x), sub-block scale) (exact, no
// saturation: q_w <= 63, |x| <= 128); the Q6_K "-32" (via bsums) is
// subtracted in int32 too. Then acc = fma((float)isum,
// d_w*d_x, acc) and, for Q4_K, acc = fnmadd((float)msum_lane, dmin*d_x, acc)
// with msum = m*bsum pairs in lanes 0-7. One reduction at the end.

/* Per-row data of one Q4_K super-block: scale vectors per 64-element step,
 * duplicated mins for the bsums madd, the two f16 scales. */
typedef struct a512_q4kw {
    __m512i sc[4];
    __m256i mins;
    float d, dmin;
} a512_q4kw;

A512_INLINE a512_q4kw a512__q4k_wprep(const uint8_t *b) {
    a512_q4kw s;
    // scales[12] as u32 words u0 u1 u2 (the 4th word read is qs, unused).
    // Bytes out: sc 0..3 = u0 & 0x3f.., sc 4..7 = (u2 & 0x0f..) | (u0 >> 6 &
    // 0x03..) << 4, m 0..3 = u1 & 0x3f.., m 4..7 = (u2 >> 4 & 0x0f..) |
    // (u1 >> 6 & 0x03..) << 4 (kern__q4k_scale_min, four bytes at a time).
    __m128i u = _mm_loadu_si128((const __m128i *)(b + 4));
    __m128i a = _mm_srlv_epi32(_mm_shuffle_epi32(u, _MM_SHUFFLE(2, 1, 2, 0)),
                               _mm_setr_epi32(0, 0, 0, 4));     // u0 u2 u1 u2>>4
    __m128i hb = _mm_shuffle_epi32(u, _MM_SHUFFLE(1, 1, 0, 0)); // u0 u0 u1 u1
    const __m128i klo = _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f);
    const __m128i khi = _mm_setr_epi32(0, 0x03030303, 0, 0x03030303);
    __m128i v = _mm_or_si128(_mm_and_si128(a, klo),
                             _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(hb, 6), khi), 4));
    __m512i scm = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(v)); // sc 0..7, m 0..7
    // step v: int16 lanes 0-15 scale a, lanes 16-31 scale a+2, a = {0,1,4,5}[v]
    const __m512i i0 = _mm512_set_epi16(2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0,
                                        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    s.sc[0] = _mm512_permutexvar_epi16(i0, scm);
    s.sc[1] = _mm512_permutexvar_epi16(_mm512_add_epi16(i0, _mm512_set1_epi16(1)), scm);
    s.sc[2] = _mm512_permutexvar_epi16(_mm512_add_epi16(i0, _mm512_set1_epi16(4)), scm);
    s.sc[3] = _mm512_permutexvar_epi16(_mm512_add_epi16(i0, _mm512_set1_epi16(5)), scm);
    const __m256i im = _mm256_set_epi16(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
    s.mins = _mm256_permutexvar_epi16(im, _mm512_castsi512_si256(scm));
    s.d = a512__f16(b);
    s.dmin = a512__f16(b + 2);
    return s;
}

/* Step v of a Q4_K super-block: the nibbles of sub-blocks a and a+2
 * (a = {0,1,4,5}[v]): one 64-byte load of qs, low (v even) or high nibbles.
 * The activation bytes are gathered to match (a512__q4k_x). */
A512_INLINE __m512i a512__q4k_wq(const uint8_t *b, int v) {
    __m512i q = _mm512_loadu_si512(b + 16 + 64 * (v >> 1));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    return (v & 1) ? _mm512_and_si512(_mm512_srli_epi16(q, 4), m4) : _mm512_and_si512(q, m4);
}

/* Activations of step v: elements of sub-blocks a and a+2. */
A512_INLINE __m512i a512__q4k_x(const uint8_t *qs, int v) {
    const uint8_t *p = qs + 128 * (v >> 1) + 32 * (v & 1);
    return a512__load2x32(p, p + 64);
}

/* A Q4_K super-block of a row with its weight side decoded once (prefill):
 * the values a512__q4k_wq and a512__q4k_wprep give. */
typedef struct a512_q4kp {
    __m512i wq[4];
    a512_q4kw w;
} a512_q4kp;

/* A Q4_K tile; P: t->W holds a512_q4kp rows (t->ws bytes apart) instead of
 * raw blocks. Both compute the same values. */
A512_INLINE void a512__q4k_tile_p(int R, int C, const a512_tile *t, int V, int P) {
    __m512 acc[4][4];
    A512_FOR_R A512_FOR_C acc[r][c] = _mm512_setzero_ps();
    const int64_t nsb = t->K / 256;
    for (int64_t i = 0; i < nsb; i++) {
        a512_q4kw wv[4];
        const a512_q4kw *w[4];
        const a512_q4kp *wp[4];
        if (P) {
            A512_FOR_R wp[r] = (const a512_q4kp *)(const void *)(t->W + r * t->ws) + i;
            A512_FOR_R w[r] = &wp[r]->w;
        } else {
            A512_FOR_R a512__prefetch_next(t, r, R, i * 144, 144);
            A512_FOR_R wv[r] = a512__q4k_wprep(t->W + r * t->ws + i * 144);
            A512_FOR_R w[r] = &wv[r];
        }
        __m512i isum[4][4];
        A512_FOR_R A512_FOR_C isum[r][c] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) {
            __m512i xq[4];
            A512_FOR_C xq[c] = a512__q4k_x(t->X + c * t->xs + i * 292 + 4, v);
            A512_FOR_R {
                __m512i wq = P ? wp[r]->wq[v] : a512__q4k_wq(t->W + r * t->ws + i * 144, v);
                A512_FOR_C isum[r][c] =
                    a512__madd_acc(V, isum[r][c], _mm512_maddubs_epi16(wq, xq[c]), w[r]->sc[v]);
            }
        }
        A512_FOR_C {
            const uint8_t *xb = t->X + c * t->xs + i * 292;
            float dx = a512__f32(xb);
            __m256i bs = _mm256_loadu_si256((const __m256i *)(xb + 260));
            A512_FOR_R {
                __m512i ms = _mm512_zextsi256_si512(_mm256_madd_epi16(bs, w[r]->mins));
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][c]),
                                            _mm512_set1_ps(w[r]->d * dx), acc[r][c]);
                acc[r][c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms),
                                             _mm512_set1_ps(w[r]->dmin * dx), acc[r][c]);
            }
        }
    }
    A512_FOR_R A512_FOR_C t->Y[c * t->ys + r] = _mm512_reduce_add_ps(acc[r][c]);
}
#define a512__q4k_tile(R, C, t, V) a512__q4k_tile_p(R, C, t, V, 0)
#define a512__q4kp_tile(R, C, t, V) a512__q4k_tile_p(R, C, t, V, 1)
A512_TILES_V(a512__q4k_tile)
A512_TILES_V(a512__q4kp_tile)

/* Matches kern__matmul_q4_K_ref: integer sums exact; error from rounding
 * d*dx, dmin*dx, the lane terms and the f32 accumulation, about
 * (K/256 + 4) * 2^-24 of sum |super-block terms| (the d and dmin terms
 * can cancel, so measure against their magnitudes, not the result's). */
/* Prefill over prepared weights: with 32 or more columns, each chunk of rows
 * (~192 KiB prepared) is decoded once by prep (a row's nsb super-blocks
 * into unit bytes each) and every column tile of tab reads it. Returns false
 * (nothing done) for fewer columns or without memory. */
static bool a512__run_prepared(const a512_tile_fn tab[4][4],
                               void (*prep)(const uint8_t *row, int64_t nsb, void *out),
                               size_t unit, int64_t K, int n_rows, int n_cols, const void *W,
                               size_t ws, const void *X, size_t xs, float *Y, size_t ys) {
    const int64_t nsb = K / 256;
    if (n_cols < 32 || nsb == 0) return false;
    int ch = (int)((192 * 1024) / ((size_t)nsb * unit)) & ~3;
    ch = ch < 4 ? 4 : ch;
    uint8_t *w = ks_alloc_aligned((size_t)ch * (size_t)nsb * unit);
    if (!w) return false;
    for (int r1 = 0; r1 < n_rows; r1 += ch) {
        int nr = n_rows - r1 < ch ? n_rows - r1 : ch;
        for (int r = 0; r < nr; r++)
            prep((const uint8_t *)W + (size_t)(r1 + r) * ws, nsb,
                 w + (size_t)r * (size_t)nsb * unit);
        a512__run(tab, K, nr, n_cols, w, (size_t)nsb * unit, X, xs, Y + r1, ys);
    }
    ks_free_aligned(w);
    return true;
}

/* A Q4_K row's super-blocks as a512_q4kp. */
static void a512__q4k_prep_row(const uint8_t *row, int64_t nsb, void *out) {
    a512_q4kp *o = out;
    for (int64_t i = 0; i < nsb; i++, o++) {
        const uint8_t *b = row + (size_t)i * 144;
        o->w = a512__q4k_wprep(b);
        for (int v = 0; v < 4; v++)
            o->wq[v] = a512__q4k_wq(b, v);
    }
}

static void a512__matmul_q4_K(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                              const void *X, size_t xs, float *Y, size_t ys) {
    const int V = a512__use_vnni();
    if (!a512__run_prepared(a512__q4kp_tile_tab[V], a512__q4k_prep_row, sizeof(a512_q4kp), K,
                            n_rows, n_cols, W, ws, X, xs, Y, ys))
        a512__run(a512__q4k_tile_tab[V], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

/* Per-row data of one Q6_K super-block. */
typedef struct a512_q6kw {
    __m512i sc[4]; /* step k: int16 lanes 8s..8s+7 = scale 4k+s */
    __m256i sc16;  /* the 16 scales as int16, for the bsums madd */
    float d;
} a512_q6kw;

A512_INLINE a512_q6kw a512__q6k_wprep(const uint8_t *b) {
    a512_q6kw s;
    s.sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
    __m512i z = _mm512_castsi256_si512(s.sc16);
    // lane l -> l/8
    const __m512i i0 = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1,
                                        1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i four = _mm512_set1_epi16(4);
    s.sc[0] = _mm512_permutexvar_epi16(i0, z);
    __m512i i1 = _mm512_add_epi16(i0, four);
    s.sc[1] = _mm512_permutexvar_epi16(i1, z);
    __m512i i2 = _mm512_add_epi16(i1, four);
    s.sc[2] = _mm512_permutexvar_epi16(i2, z);
    s.sc[3] = _mm512_permutexvar_epi16(_mm512_add_epi16(i2, four), z);
    s.d = a512__f16(b + 208);
    return s;
}

/* High-bit vector of half n: bytes 0-31 qh (groups 0/2), bytes 32-63
 * qh >> 2 (groups 1/3), masked to bits 0-1 (groups 0/1) and 4-5 (2/3). */
A512_INLINE __m512i a512__q6k_h(const uint8_t *b, int n) {
    __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n));
    __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
    return _mm512_and_si512(h, _mm512_set1_epi8(0x33));
}

/* 64 Q6_K values (0..63) of elements 64k..64k+63 in element order; h is
 * a512__q6k_h of half k/2. Bit-select: low nibble from ql, high from h. */
A512_INLINE __m512i a512__q6k_wq(const uint8_t *b, __m512i h, int k) {
    __m512i ql = _mm512_loadu_si512(b + 64 * (k >> 1));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    if ((k & 1) == 0) return _mm512_ternarylogic_epi32(ql, _mm512_slli_epi16(h, 4), m4, 0xE4);
    return _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), h, m4, 0xE4);
}

/* A Q6_K super-block of a row with its weight side decoded once (prefill):
 * the values a512__q6k_wq (with a512__q6k_h) and a512__q6k_wprep give. */
typedef struct a512_q6kp {
    __m512i wq[4];
    a512_q6kw w;
} a512_q6kp;

/* A Q6_K tile; P: t->W holds a512_q6kp rows. Both compute the same values. */
A512_INLINE void a512__q6k_tile_p(int R, int C, const a512_tile *t, int V, int P) {
    __m512 acc[4][4];
    A512_FOR_R A512_FOR_C acc[r][c] = _mm512_setzero_ps();
    const int64_t nsb = t->K / 256;
    for (int64_t i = 0; i < nsb; i++) {
        a512_q6kw wv[4];
        const a512_q6kw *w[4];
        const a512_q6kp *wp[4];
        if (P) {
            A512_FOR_R wp[r] = (const a512_q6kp *)(const void *)(t->W + r * t->ws) + i;
            A512_FOR_R w[r] = &wp[r]->w;
        } else {
            A512_FOR_R a512__prefetch_next(t, r, R, i * 210, 210);
            A512_FOR_R wv[r] = a512__q6k_wprep(t->W + r * t->ws + i * 210);
            A512_FOR_R w[r] = &wv[r];
        }
        __m512i isum[4][4];
        A512_FOR_R A512_FOR_C isum[r][c] = _mm512_setzero_si512();
        __m512i h[4];
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
            __m512i xq[4];
            A512_FOR_C xq[c] = _mm512_loadu_si512(t->X + c * t->xs + i * 292 + 4 + 64 * k);
            A512_FOR_R {
                __m512i wq;
                if (P) {
                    wq = wp[r]->wq[k];
                } else {
                    const uint8_t *wb = t->W + r * t->ws + i * 210;
                    if ((k & 1) == 0) h[r] = a512__q6k_h(wb, k >> 1);
                    wq = a512__q6k_wq(wb, h[r], k);
                }
                A512_FOR_C isum[r][c] =
                    a512__madd_acc(V, isum[r][c], _mm512_maddubs_epi16(wq, xq[c]), w[r]->sc[k]);
            }
        }
        A512_FOR_C {
            const uint8_t *xb = t->X + c * t->xs + i * 292;
            float dx = a512__f32(xb);
            __m256i bs = _mm256_loadu_si256((const __m256i *)(xb + 260));
            A512_FOR_R {
                // - 32 * sum_j sc[j] * bsum[j], in lanes 0-7
                __m256i m = _mm256_slli_epi32(_mm256_madd_epi16(bs, w[r]->sc16), 5);
                __m512i s = _mm512_sub_epi32(isum[r][c], _mm512_zextsi256_si512(m));
                acc[r][c] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(w[r]->d * dx), acc[r][c]);
            }
        }
    }
    A512_FOR_R A512_FOR_C t->Y[c * t->ys + r] = _mm512_reduce_add_ps(acc[r][c]);
}
#define a512__q6k_tile(R, C, t, V) a512__q6k_tile_p(R, C, t, V, 0)
#define a512__q6kp_tile(R, C, t, V) a512__q6k_tile_p(R, C, t, V, 1)
A512_TILES_V(a512__q6k_tile)
A512_TILES_V(a512__q6kp_tile)

/* A Q6_K row's super-blocks as a512_q6kp. */
static void a512__q6k_prep_row(const uint8_t *row, int64_t nsb, void *out) {
    a512_q6kp *o = out;
    for (int64_t i = 0; i < nsb; i++, o++) {
        const uint8_t *b = row + (size_t)i * 210;
        o->w = a512__q6k_wprep(b);
        for (int k = 0; k < 4; k++)
            o->wq[k] = a512__q6k_wq(b, a512__q6k_h(b, k >> 1), k);
    }
}

/* Matches kern__matmul_q6_K_ref: integer sums exact; error about
 * (K/256 + 3) * 2^-24 of sum |super-block terms|. */
static void a512__matmul_q6_K(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                              const void *X, size_t xs, float *Y, size_t ys) {
    const int V = a512__use_vnni();
    if (!a512__run_prepared(a512__q6kp_tile_tab[V], a512__q6k_prep_row, sizeof(a512_q6kp), K,
                            n_rows, n_cols, W, ws, X, xs, Y, ys))
        a512__run(a512__q6k_tile_tab[V], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

// ----------------------------------------------------------------------------
// Q5_K / Q3_K / Q2_K / IQ4_XS weights x Q8_K activations
// The Q4_K / Q6_K scheme (see above): per super-block four 64-element steps
// each add madd(maddubs(q_w, x), int16 scale lanes) into 16 int32 lanes
// (exact: q_w <= 31, or |codebook| <= 127 with the sign moved onto x); the
// offsets (Q3_K's -4, the Q5_K / Q2_K mins) go through the bsums, exactly;
// then one fma per super-block (plus the min fnmadd) and one reduction.
// Q5_K steps are Q4_K's (sub-blocks a and a+2), the others Q6_K's
// (elements 64k .. 64k+63).

/* Step v of a Q5_K super-block: a512__q4k_wq's nibbles (qs at +48) with
 * bit 4 from qh: bit a of qh[l] in bytes 0-31, bit a+2 in 32-63. */
A512_INLINE __m512i a512__q5k_wq(const uint8_t *b, int v) {
    __m512i q = a512__q4k_wq(b + 32, v);
    const int a = 4 * (v >> 1) + (v & 1);
    __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 16)));
    __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << a)),
                                     _mm256_set1_epi8((char)(1 << (a + 2))), 1);
    return _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(h, bit), q, _mm512_set1_epi8(16));
}

A512_INLINE void a512__q5k_tile(int R, int C, const a512_tile *t, int V) {
    __m512 acc[4][4];
    A512_FOR_R A512_FOR_C acc[r][c] = _mm512_setzero_ps();
    const int64_t nsb = t->K / 256;
    for (int64_t i = 0; i < nsb; i++) {
        a512_q4kw w[4]; // Q5_K's d, dmin and scales sit where Q4_K's do
        A512_FOR_R a512__prefetch_next(t, r, R, i * 176, 176);
        A512_FOR_R w[r] = a512__q4k_wprep(t->W + r * t->ws + i * 176);
        __m512i isum[4][4];
        A512_FOR_R A512_FOR_C isum[r][c] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) {
            __m512i xq[4];
            A512_FOR_C xq[c] = a512__q4k_x(t->X + c * t->xs + i * 292 + 4, v);
            A512_FOR_R {
                __m512i wq = a512__q5k_wq(t->W + r * t->ws + i * 176, v);
                A512_FOR_C isum[r][c] =
                    a512__madd_acc(V, isum[r][c], _mm512_maddubs_epi16(wq, xq[c]), w[r].sc[v]);
            }
        }
        A512_FOR_C {
            const uint8_t *xb = t->X + c * t->xs + i * 292;
            float dx = a512__f32(xb);
            __m256i bs = _mm256_loadu_si256((const __m256i *)(xb + 260));
            A512_FOR_R {
                __m512i ms = _mm512_zextsi256_si512(_mm256_madd_epi16(bs, w[r].mins));
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][c]),
                                            _mm512_set1_ps(w[r].d * dx), acc[r][c]);
                acc[r][c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_set1_ps(w[r].dmin * dx),
                                             acc[r][c]);
            }
        }
    }
    A512_FOR_R A512_FOR_C t->Y[c * t->ys + r] = _mm512_reduce_add_ps(acc[r][c]);
}
A512_TILES_V(a512__q5k_tile)

/* Matches kern__matmul_q5_K_ref; error as a512__matmul_q4_K's. */
static void a512__matmul_q5_K(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                              const void *X, size_t xs, float *Y, size_t ys) {
    a512__run(a512__q5k_tile_tab[a512__use_vnni()], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

/* Per-row data of one Q2_K / Q3_K super-block: step k's int16 scale lanes
 * (8s .. 8s+7 = sub-block 4k+s), the 16 scales and (Q2_K) mins as int16
 * for the bsums madd, d and dmin. */
typedef struct a512_q23w {
    __m512i sc[4];
    __m256i sc16, mins;
    float d, dmin;
} a512_q23w;

/* sc[k] lanes from 16 int16 scales (as a512__q6k_wprep). */
A512_INLINE void a512__sc16_steps(__m256i sc16, __m512i sc[4]) {
    const __m512i i0 = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1,
                                        1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512i z = _mm512_castsi256_si512(sc16);
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) sc[k] =
        _mm512_permutexvar_epi16(_mm512_add_epi16(i0, _mm512_set1_epi16((short)(4 * k))), z);
}

A512_INLINE a512_q23w a512__q2k_wprep(const uint8_t *b) {
    a512_q23w s;
    __m128i raw = _mm_loadu_si128((const __m128i *)b), m4 = _mm_set1_epi8(0x0F);
    s.sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4));
    s.mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
    a512__sc16_steps(s.sc16, s.sc);
    s.d = a512__f16(b + 80);
    s.dmin = a512__f16(b + 82);
    return s;
}

/* Q3_K scales: low nibbles from bytes 0..7 (scales 0..7: & 15, 8..15: >> 4),
 * bits 4-5 of scale s from byte 8 + s%4 >> 2(s/4), minus 32 (kern_int.h). */
A512_INLINE a512_q23w a512__q3k_wprep(const uint8_t *b) {
    a512_q23w s;
    const __m128i m4 = _mm_set1_epi8(0x0F), m2 = _mm_set1_epi8(3);
    __m128i l8 = _mm_loadl_epi64((const __m128i *)(b + 96));
    __m128i lo =
        _mm_unpacklo_epi64(_mm_and_si128(l8, m4), _mm_and_si128(_mm_srli_epi16(l8, 4), m4));
    int32_t h;
    memcpy(&h, b + 104, 4);
    __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(h), _mm_setr_epi32(0, 2, 4, 6)), m2);
    __m128i v = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
    s.sc16 = _mm256_cvtepi8_epi16(v);
    s.mins = _mm256_setzero_si256();
    a512__sc16_steps(s.sc16, s.sc);
    s.d = a512__f16(b + 108);
    s.dmin = 0.0f;
    return s;
}

/* The 2-bit values of elements 64k .. 64k+63 of a Q2_K / Q3_K qs[64]:
 * chunks 2k and 2k+1, (qs[32n + l] >> 2j) & 3 with n = k/2. */
A512_INLINE __m512i a512__q2_wq(const uint8_t *qs, int k) {
    __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * (k >> 1))));
    const int j0 = 2 * (k & 1);
    __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * j0)),
                                    _mm256_set1_epi16((short)(2 * j0 + 2)), 1);
    return _mm512_and_si512(_mm512_srlv_epi16(q, sh), _mm512_set1_epi8(3));
}

/* Q3_K values (0..7) of step k: a512__q2_wq plus bit 2 = bit 2k (bytes
 * 0-31) or 2k+1 (32-63) of hmask[l]. */
A512_INLINE __m512i a512__q3k_wq(const uint8_t *b, int k) {
    __m512i q = a512__q2_wq(b + 32, k);
    __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b));
    __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * k))),
                                     _mm256_set1_epi8((char)(1 << (2 * k + 1))), 1);
    return _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(h, bit), q, _mm512_set1_epi8(4));
}

/* A Q2_K (Q3 = 0) or Q3_K tile. */
A512_INLINE void a512__q23k_tile(int Q3, int R, int C, const a512_tile *t, int V) {
    const int bs = Q3 ? 110 : 84;
    __m512 acc[4][4];
    A512_FOR_R A512_FOR_C acc[r][c] = _mm512_setzero_ps();
    const int64_t nsb = t->K / 256;
    for (int64_t i = 0; i < nsb; i++) {
        a512_q23w w[4];
        A512_FOR_R a512__prefetch_next(t, r, R, i * bs, bs);
        A512_FOR_R w[r] = Q3 ? a512__q3k_wprep(t->W + r * t->ws + i * bs)
                             : a512__q2k_wprep(t->W + r * t->ws + i * bs);
        __m512i isum[4][4];
        A512_FOR_R A512_FOR_C isum[r][c] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
            __m512i xq[4];
            A512_FOR_C xq[c] = _mm512_loadu_si512(t->X + c * t->xs + i * 292 + 4 + 64 * k);
            A512_FOR_R {
                const uint8_t *wb = t->W + r * t->ws + i * bs;
                __m512i wq = Q3 ? a512__q3k_wq(wb, k) : a512__q2_wq(wb + 16, k);
                A512_FOR_C isum[r][c] =
                    a512__madd_acc(V, isum[r][c], _mm512_maddubs_epi16(wq, xq[c]), w[r].sc[k]);
            }
        }
        A512_FOR_C {
            const uint8_t *xb = t->X + c * t->xs + i * 292;
            float dx = a512__f32(xb);
            __m256i bsum = _mm256_loadu_si256((const __m256i *)(xb + 260));
            A512_FOR_R {
                if (Q3) { // - 4 * sum_j sc[j] * bsum[j], in lanes 0-7
                    __m256i m = _mm256_slli_epi32(_mm256_madd_epi16(bsum, w[r].sc16), 2);
                    __m512i s = _mm512_sub_epi32(isum[r][c], _mm512_zextsi256_si512(m));
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(w[r].d * dx),
                                                acc[r][c]);
                } else {
                    __m512i ms = _mm512_zextsi256_si512(_mm256_madd_epi16(bsum, w[r].mins));
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][c]),
                                                _mm512_set1_ps(w[r].d * dx), acc[r][c]);
                    acc[r][c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms),
                                                 _mm512_set1_ps(w[r].dmin * dx), acc[r][c]);
                }
            }
        }
    }
    A512_FOR_R A512_FOR_C t->Y[c * t->ys + r] = _mm512_reduce_add_ps(acc[r][c]);
}
#define a512__q2k_tile(R, C, t, V) a512__q23k_tile(0, R, C, t, V)
#define a512__q3k_tile(R, C, t, V) a512__q23k_tile(1, R, C, t, V)
A512_TILES_V(a512__q2k_tile)
A512_TILES_V(a512__q3k_tile)

/* Match kern__matmul_q2_K_ref / kern__matmul_q3_K_ref; errors as
 * a512__matmul_q4_K's (Q2_K) and a512__matmul_q6_K's (Q3_K). */
static void a512__matmul_q2_K(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                              const void *X, size_t xs, float *Y, size_t ys) {
    a512__run(a512__q2k_tile_tab[a512__use_vnni()], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}
static void a512__matmul_q3_K(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                              const void *X, size_t xs, float *Y, size_t ys) {
    a512__run(a512__q3k_tile_tab[a512__use_vnni()], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

/* IQ4_XS codebook values (signed) of step k = sub-blocks 2k and 2k+1:
 * 128-bit lanes low / high nibbles of qs[32k ..], then of qs[32k + 16 ..]. */
A512_INLINE __m512i a512__iq4xs_wq(const uint8_t *b, int k) {
    __m128i a = _mm_loadu_si128((const __m128i *)(b + 8 + 32 * k));
    __m128i c = _mm_loadu_si128((const __m128i *)(b + 24 + 32 * k));
    __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(a, a)),
                                   _mm256_set_m128i(c, c), 1);
    const __m512i sh = _mm512_set_epi64(0x0004000400040004, 0x0004000400040004, 0, 0,
                                        0x0004000400040004, 0x0004000400040004, 0, 0);
    q = _mm512_and_si512(_mm512_srlv_epi16(q, sh), _mm512_set1_epi8(0x0F));
    const __m128i tab = _mm_loadu_si128((const __m128i *)(const void *)kern_iq4nl_values);
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(tab), q);
}

A512_INLINE void a512__iq4xs_tile(int R, int C, const a512_tile *t, int V) {
    const __m512i z = _mm512_setzero_si512();
    __m512 acc[4][4];
    A512_FOR_R A512_FOR_C acc[r][c] = _mm512_setzero_ps();
    const int64_t nsb = t->K / 256;
    for (int64_t i = 0; i < nsb; i++) {
        __m512i sc[4][4]; // [row][step]: int16 lanes 0-15 scale 2k, 16-31 scale 2k+1
        float d[4];
        A512_FOR_R {
            const kern_block_iq4_xs *b =
                (const kern_block_iq4_xs *)(const void *)(t->W + r * t->ws) + i;
            a512__prefetch_next(t, r, R, i * 136, 136);
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) sc[r][k] = _mm512_inserti64x4(
                _mm512_set1_epi16((short)(kern__iq4xs_scale(b, 2 * k) - 32)),
                _mm256_set1_epi16((short)(kern__iq4xs_scale(b, 2 * k + 1) - 32)), 1);
            d[r] = a512__f16(t->W + r * t->ws + i * 136);
        }
        __m512i isum[4][4];
        A512_FOR_R A512_FOR_C isum[r][c] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
            __m512i xq[4];
            A512_FOR_C xq[c] = _mm512_loadu_si512(t->X + c * t->xs + i * 292 + 4 + 64 * k);
            A512_FOR_R {
                __m512i w = a512__iq4xs_wq(t->W + r * t->ws + i * 136, k);
                __m512i aw = _mm512_abs_epi8(w);
                __mmask64 sm = _mm512_movepi8_mask(w);
                A512_FOR_C isum[r][c] = a512__madd_acc(
                    V, isum[r][c],
                    _mm512_maddubs_epi16(aw, _mm512_mask_sub_epi8(xq[c], sm, z, xq[c])), sc[r][k]);
            }
        }
        A512_FOR_C {
            float dx = a512__f32(t->X + c * t->xs + i * 292);
            A512_FOR_R acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][c]),
                                                   _mm512_set1_ps(d[r] * dx), acc[r][c]);
        }
    }
    A512_FOR_R A512_FOR_C t->Y[c * t->ys + r] = _mm512_reduce_add_ps(acc[r][c]);
}
A512_TILES_V(a512__iq4xs_tile)

/* Matches kern__matmul_iq4_xs_ref; error as a512__matmul_q6_K's. */
static void a512__matmul_iq4_xs(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                                const void *X, size_t xs, float *Y, size_t ys) {
    a512__run(a512__iq4xs_tile_tab[a512__use_vnni()], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

// ----------------------------------------------------------------------------
// TQ1_0 / TQ2_0 (ternary) weights x Q8_K activations
// Per super-block four 64-element steps of unsigned digits u = t + 1 (0..2;
// TQ2_0's 2-bit q, 0..3) times x: vpdpbusd, or maddubs + madd (pairs <= 762,
// no saturation), into 16 exact int32 lanes; the "- 1" leaves through the
// bsums (sum x, exact); one fma per super-block (one scale), one reduction.
// The integer sum is ref's; the error is a512__matmul_q6_K's.

/* v * 3 (mod 256) per byte. */
A512_INLINE __m128i a512__x3_128(__m128i v) { return _mm_add_epi8(_mm_add_epi8(v, v), v); }
A512_INLINE __m512i a512__x3(__m512i v) { return _mm512_add_epi8(_mm512_add_epi8(v, v), v); }

/* TQ1_0 digits of bytes already multiplied by 3^n (mod 256): (b * 3) >> 8
 * = [b > 85] + [b > 170] (kern__tq1_digit), 0..2. */
A512_INLINE __m512i a512__tq1_digit(__m512i b) {
    const __m512i one = _mm512_set1_epi8(1);
    __m512i u = _mm512_maskz_mov_epi8(_mm512_cmpgt_epu8_mask(b, _mm512_set1_epi8(85)), one);
    return _mm512_mask_add_epi8(u, _mm512_cmpgt_epu8_mask(b, _mm512_set1_epi8((char)170)), u, one);
}

/* The four 64-element steps of a TQ1_0 block's digits (layout: kern_int.h):
 * step 0 digits 0 | 1 of qs[0..31], step 1 digits 2 | 3, step 2 digit 4 of
 * qs[0..31] | digits 0, 1 of qs[32..47], step 3 digits 2, 3, 4 of qs[32..47]
 * | digits 0..3 of qh (one 32-bit word each). */
A512_INLINE void a512__tq1_decode(const uint8_t *b, __m512i u[4]) {
    __m512i p = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b));
    p = _mm512_mask_blend_epi64(0xF0, p, a512__x3(p)); // x1 | x3
    u[0] = a512__tq1_digit(p);
    p = a512__x3(a512__x3(p)); // x9 | x27
    u[1] = a512__tq1_digit(p);
    __m256i p81 = _mm512_castsi512_si256(a512__x3(a512__x3(p)));
    __m128i q1 = _mm_loadu_si128((const __m128i *)(b + 32)), q3 = a512__x3_128(q1);
    __m128i q9 = a512__x3_128(q3), q27 = a512__x3_128(q9), q81 = a512__x3_128(q27);
    int32_t hw;
    memcpy(&hw, b + 48, 4);
    __m128i h1 = _mm_set1_epi32(hw), h3 = a512__x3_128(h1), h9 = a512__x3_128(h3),
            h27 = a512__x3_128(h9);
    __m128i h = _mm_blend_epi32(_mm_blend_epi32(h1, h3, 0x2), _mm_blend_epi32(h9, h27, 0x8), 0xC);
    u[2] = a512__tq1_digit(_mm512_inserti64x4(_mm512_castsi256_si512(p81), _mm256_set_m128i(q3, q1), 1));
    u[3] = a512__tq1_digit(_mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(q27, q9)),
                                              _mm256_set_m128i(h, q81), 1));
}

/* acc + sum of u * s (u <= 3 unsigned, s signed) per int32 lane, exact. */
A512_INLINE __m512i a512__dot_u2(int V, __m512i acc, __m512i u, __m512i s) {
    if (V) return a512__dpbusd(acc, u, s);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
}

/* A TQ1_0 (T1 = 1) or TQ2_0 tile. */
A512_INLINE void a512__tq_tile(int T1, int R, int C, const a512_tile *t, int V) {
    const int bs = T1 ? 54 : 66, doff = T1 ? 52 : 64;
    __m512 acc[4][4];
    A512_FOR_R A512_FOR_C acc[r][c] = _mm512_setzero_ps();
    const int64_t nsb = t->K / 256;
    for (int64_t i = 0; i < nsb; i++) {
        __m512i u[4][4]; // [row][step]
        float d[4];
        A512_FOR_R {
            const uint8_t *wb = t->W + r * t->ws + i * bs;
            a512__prefetch_next(t, r, R, i * bs, bs);
            if (T1)
                a512__tq1_decode(wb, u[r]);
            else
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) u[r][k] = a512__q2_wq(wb, k);
            d[r] = a512__f16(wb + doff);
        }
        A512_FOR_C {
            const uint8_t *xb = t->X + c * t->xs + i * 292;
            __m512i isum[4];
            // - sum x, in lanes 0-7 (bsums: 16 int16 at +260)
            __m256i xs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(xb + 260)),
                                           _mm256_set1_epi16(1));
            A512_FOR_R isum[r] = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), xs));
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                __m512i xq = _mm512_loadu_si512(xb + 4 + 64 * k);
                A512_FOR_R isum[r] = a512__dot_u2(V, isum[r], u[r][k], xq);
            }
            float dx = a512__f32(xb);
            A512_FOR_R acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]),
                                                   _mm512_set1_ps(d[r] * dx), acc[r][c]);
        }
    }
    A512_FOR_R A512_FOR_C t->Y[c * t->ys + r] = _mm512_reduce_add_ps(acc[r][c]);
}
#define a512__tq1_tile(R, C, t, V) a512__tq_tile(1, R, C, t, V)
#define a512__tq2_tile(R, C, t, V) a512__tq_tile(0, R, C, t, V)
A512_TILES_V(a512__tq1_tile)
A512_TILES_V(a512__tq2_tile)

/* Match kern__matmul_tq1_0_ref / kern__matmul_tq2_0_ref; error as
 * a512__matmul_q6_K's. */
static void a512__matmul_tq1_0(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                               const void *X, size_t xs, float *Y, size_t ys) {
    a512__run(a512__tq1_tile_tab[a512__use_vnni()], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}
static void a512__matmul_tq2_0(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                               const void *X, size_t xs, float *Y, size_t ys) {
    a512__run(a512__tq2_tile_tab[a512__use_vnni()], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

// ----------------------------------------------------------------------------
// The codebook types (IQ1_*, IQ2_*, IQ3_*) x Q8_K
// Per super-block four 64-element steps; per row and step two sub-blocks
// decoded by iq_simd.h into signed int8 weights w (|w| <= 62) and int16
// scale lanes (8 per 16 elements); per column maddubs(|w|, x negated where
// w < 0) (pairs <= 15748, exact) and madd / vpdpwssd by the scales into 16
// exact int32 lanes; one fma per super-block by d * factor * d_x, one
// reduction. Integer sums are ref's; the error is a512__matmul_q6_K's.

/* A prepared codebook super-block (a512__iq_prep_row): the decoded signed
 * weights in element order, the 16 odd scales, d * factor; 320 bytes. */
typedef struct a512_iqp {
    int8_t w[256];
    int16_t ls[16];
    float d;
    uint8_t pad[28];
} a512_iqp;
_Static_assert(sizeof(a512_iqp) == 320, "a512_iqp is 5 cache lines");

/* A codebook tile over rows of type T (P = 0), or over rows of a512_iqp
 * (P = 1, the same integers, so bit for bit the same results). */
A512_INLINE void a512__iq_tile_p(ks_dtype T, int R, int C, const a512_tile *t, int V, int P) {
    const int64_t bs = P ? (int64_t)sizeof(a512_iqp) : (int64_t)ks_dtype_block_bytes(T);
    const __m512i z = _mm512_setzero_si512();
    __m512 acc[4][4];
    A512_FOR_R A512_FOR_C acc[r][c] = _mm512_setzero_ps();
    const int64_t nsb = t->K / 256;
    for (int64_t i = 0; i < nsb; i++) {
        float d[4];
        __m512i psc[4][4]; // P: [row][step] int16 scale lanes
        A512_FOR_R {
            const uint8_t *b = t->W + r * t->ws + i * bs;
            a512__prefetch_next(t, r, R, i * bs, (int)bs);
            if (P) {
                const a512_iqp *q = (const a512_iqp *)(const void *)b;
                d[r] = q->d;
                a512__sc16_steps(_mm256_loadu_si256((const __m256i *)(const void *)q->ls), psc[r]);
            } else {
                d[r] = iqs__d(T, b);
            }
        }
        __m512i isum[4][4];
        A512_FOR_R A512_FOR_C isum[r][c] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
            __m512i xq[4];
            A512_FOR_C xq[c] = _mm512_loadu_si512(t->X + c * t->xs + i * 292 + 4 + 64 * k);
            A512_FOR_R {
                const uint8_t *b = t->W + r * t->ws + i * bs;
                __m512i w, sc;
                if (P) {
                    w = _mm512_loadu_si512(b + 64 * k);
                    sc = psc[r][k];
                } else {
                    int l0, l1, l2, l3;
                    __m256i w0 = iqs__decode(T, b, 2 * k, &l0, &l1);
                    __m256i w1 = iqs__decode(T, b, 2 * k + 1, &l2, &l3);
                    w = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
                    sc = _mm512_inserti64x4(
                        _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16((short)l1),
                                                                _mm_set1_epi16((short)l0))),
                        _mm256_set_m128i(_mm_set1_epi16((short)l3), _mm_set1_epi16((short)l2)), 1);
                }
                __m512i aw = _mm512_abs_epi8(w);
                __mmask64 neg = _mm512_movepi8_mask(w);
                A512_FOR_C isum[r][c] = a512__madd_acc(
                    V, isum[r][c], _mm512_maddubs_epi16(aw, _mm512_mask_sub_epi8(xq[c], neg, z, xq[c])),
                    sc);
            }
        }
        A512_FOR_C {
            float dx = a512__f32(t->X + c * t->xs + i * 292);
            A512_FOR_R acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][c]),
                                                   _mm512_set1_ps(d[r] * dx), acc[r][c]);
        }
    }
    A512_FOR_R A512_FOR_C t->Y[c * t->ys + r] = _mm512_reduce_add_ps(acc[r][c]);
}

/* Decodes the nsb super-blocks of a type-T row into a512_iqp at out (the
 * same w and scales as iqs__decode gives the plain tile). */
A512_INLINE void a512__iq_prep(ks_dtype T, const uint8_t *row, int64_t nsb, void *out) {
    const int64_t bs = ks_dtype_block_bytes(T);
    for (int64_t i = 0; i < nsb; i++) {
        const uint8_t *b = row + i * bs;
        a512_iqp *q = (a512_iqp *)out + i;
        for (int j = 0; j < 8; j++) {
            int l0, l1;
            _mm256_storeu_si256((__m256i *)(void *)(q->w + 32 * j), iqs__decode(T, b, j, &l0, &l1));
            q->ls[2 * j] = (int16_t)l0;
            q->ls[2 * j + 1] = (int16_t)l1;
        }
        q->d = iqs__d(T, b);
    }
}

/* The prepared tiles (rows of a512_iqp), shared by all codebook types. */
#define a512__iqp_tile(R, C, t, V) a512__iq_tile_p(KS_DTYPE_IQ2_XXS, R, C, t, V, 1)
A512_TILES_V(a512__iqp_tile)

#define a512__iq2_xxs_tile(R, C, t, V) a512__iq_tile_p(KS_DTYPE_IQ2_XXS, R, C, t, V, 0)
A512_TILES_V(a512__iq2_xxs_tile)
static void a512__iq2_xxs_prep_row(const uint8_t *row, int64_t nsb, void *out) {
    a512__iq_prep(KS_DTYPE_IQ2_XXS, row, nsb, out);
}
/* Matches kern__matmul_iq2_xxs_ref; prefill decodes each row once (a512_iqp). */
static void a512__matmul_iq2_xxs(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                             const void *X, size_t xs, float *Y, size_t ys) {
    const int V = a512__use_vnni();
    if (!a512__run_prepared(a512__iqp_tile_tab[V], a512__iq2_xxs_prep_row, sizeof(a512_iqp), K,
                            n_rows, n_cols, W, ws, X, xs, Y, ys))
        a512__run(a512__iq2_xxs_tile_tab[V], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}
#define a512__iq2_xs_tile(R, C, t, V) a512__iq_tile_p(KS_DTYPE_IQ2_XS, R, C, t, V, 0)
A512_TILES_V(a512__iq2_xs_tile)
static void a512__iq2_xs_prep_row(const uint8_t *row, int64_t nsb, void *out) {
    a512__iq_prep(KS_DTYPE_IQ2_XS, row, nsb, out);
}
/* Matches kern__matmul_iq2_xs_ref; prefill decodes each row once (a512_iqp). */
static void a512__matmul_iq2_xs(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                             const void *X, size_t xs, float *Y, size_t ys) {
    const int V = a512__use_vnni();
    if (!a512__run_prepared(a512__iqp_tile_tab[V], a512__iq2_xs_prep_row, sizeof(a512_iqp), K,
                            n_rows, n_cols, W, ws, X, xs, Y, ys))
        a512__run(a512__iq2_xs_tile_tab[V], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}
#define a512__iq2_s_tile(R, C, t, V) a512__iq_tile_p(KS_DTYPE_IQ2_S, R, C, t, V, 0)
A512_TILES_V(a512__iq2_s_tile)
static void a512__iq2_s_prep_row(const uint8_t *row, int64_t nsb, void *out) {
    a512__iq_prep(KS_DTYPE_IQ2_S, row, nsb, out);
}
/* Matches kern__matmul_iq2_s_ref; prefill decodes each row once (a512_iqp). */
static void a512__matmul_iq2_s(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                             const void *X, size_t xs, float *Y, size_t ys) {
    const int V = a512__use_vnni();
    if (!a512__run_prepared(a512__iqp_tile_tab[V], a512__iq2_s_prep_row, sizeof(a512_iqp), K,
                            n_rows, n_cols, W, ws, X, xs, Y, ys))
        a512__run(a512__iq2_s_tile_tab[V], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}
#define a512__iq3_xxs_tile(R, C, t, V) a512__iq_tile_p(KS_DTYPE_IQ3_XXS, R, C, t, V, 0)
A512_TILES_V(a512__iq3_xxs_tile)
static void a512__iq3_xxs_prep_row(const uint8_t *row, int64_t nsb, void *out) {
    a512__iq_prep(KS_DTYPE_IQ3_XXS, row, nsb, out);
}
/* Matches kern__matmul_iq3_xxs_ref; prefill decodes each row once (a512_iqp). */
static void a512__matmul_iq3_xxs(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                             const void *X, size_t xs, float *Y, size_t ys) {
    const int V = a512__use_vnni();
    if (!a512__run_prepared(a512__iqp_tile_tab[V], a512__iq3_xxs_prep_row, sizeof(a512_iqp), K,
                            n_rows, n_cols, W, ws, X, xs, Y, ys))
        a512__run(a512__iq3_xxs_tile_tab[V], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}
#define a512__iq3_s_tile(R, C, t, V) a512__iq_tile_p(KS_DTYPE_IQ3_S, R, C, t, V, 0)
A512_TILES_V(a512__iq3_s_tile)
static void a512__iq3_s_prep_row(const uint8_t *row, int64_t nsb, void *out) {
    a512__iq_prep(KS_DTYPE_IQ3_S, row, nsb, out);
}
/* Matches kern__matmul_iq3_s_ref; prefill decodes each row once (a512_iqp). */
static void a512__matmul_iq3_s(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                             const void *X, size_t xs, float *Y, size_t ys) {
    const int V = a512__use_vnni();
    if (!a512__run_prepared(a512__iqp_tile_tab[V], a512__iq3_s_prep_row, sizeof(a512_iqp), K,
                            n_rows, n_cols, W, ws, X, xs, Y, ys))
        a512__run(a512__iq3_s_tile_tab[V], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}
#define a512__iq1_s_tile(R, C, t, V) a512__iq_tile_p(KS_DTYPE_IQ1_S, R, C, t, V, 0)
A512_TILES_V(a512__iq1_s_tile)
static void a512__iq1_s_prep_row(const uint8_t *row, int64_t nsb, void *out) {
    a512__iq_prep(KS_DTYPE_IQ1_S, row, nsb, out);
}
/* Matches kern__matmul_iq1_s_ref; prefill decodes each row once (a512_iqp). */
static void a512__matmul_iq1_s(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                             const void *X, size_t xs, float *Y, size_t ys) {
    const int V = a512__use_vnni();
    if (!a512__run_prepared(a512__iqp_tile_tab[V], a512__iq1_s_prep_row, sizeof(a512_iqp), K,
                            n_rows, n_cols, W, ws, X, xs, Y, ys))
        a512__run(a512__iq1_s_tile_tab[V], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}
#define a512__iq1_m_tile(R, C, t, V) a512__iq_tile_p(KS_DTYPE_IQ1_M, R, C, t, V, 0)
A512_TILES_V(a512__iq1_m_tile)
static void a512__iq1_m_prep_row(const uint8_t *row, int64_t nsb, void *out) {
    a512__iq_prep(KS_DTYPE_IQ1_M, row, nsb, out);
}
/* Matches kern__matmul_iq1_m_ref; prefill decodes each row once (a512_iqp). */
static void a512__matmul_iq1_m(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                             const void *X, size_t xs, float *Y, size_t ys) {
    const int V = a512__use_vnni();
    if (!a512__run_prepared(a512__iqp_tile_tab[V], a512__iq1_m_prep_row, sizeof(a512_iqp), K,
                            n_rows, n_cols, W, ws, X, xs, Y, ys))
        a512__run(a512__iq1_m_tile_tab[V], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

// ----------------------------------------------------------------------------
// Activation quantizers (byte-identical to ref.c)

/* 16 floats * id, rounded half-even and clamped to [-127, 127] as int32.
 * A non-finite product (inf * 0, a NaN input, or id = inf for a block of
 * subnormals) gives 0, as ref's (int)lrintf does on x86-64. */
A512_INLINE __m512i a512__q8_round(__m512 v) {
    __mmask16 ok = _mm512_cmp_ps_mask(_mm512_abs_ps(v), _mm512_set1_ps(INFINITY), _CMP_LT_OQ);
    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
    return _mm512_maskz_cvtps_epi32(ok, v);
}

/* amax of 16*nv floats: fabs then max, NaN lanes ignored (as fmaxf). */
A512_INLINE float a512__amax(const float *x, int nv) {
    __m512 m = _mm512_setzero_ps();
    for (int v = 0; v < nv; v++)
        m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + 16 * v)), m);
    return _mm512_reduce_max_ps(m);
}

/* Matches kern__quantize_q8_0_ref byte for byte. */
static void a512__quantize_q8_0(const float *x, void *y, int64_t n) {
    uint8_t *out = y;
    for (int64_t i = 0; i < n / 32; i++, out += 34) {
        const float *xb = x + 32 * i;
        float amax = a512__amax(xb, 2);
        uint16_t d16 = ks_f32_to_f16(amax / 127.0f);
        float d = ks_f16_to_f32(d16);
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        memcpy(out, &d16, 2);
        __m512 vid = _mm512_set1_ps(id);
        for (int v = 0; v < 2; v++) {
            __m512i q = a512__q8_round(_mm512_mul_ps(_mm512_loadu_ps(xb + 16 * v), vid));
            _mm_storeu_si128((__m128i *)(out + 2 + 16 * v), _mm512_cvtepi32_epi8(q));
        }
    }
}

/* Matches kern__quantize_q8_K_ref byte for byte. */
static void a512__quantize_q8_K(const float *x, void *y, int64_t n) {
    uint8_t *out = y;
    for (int64_t i = 0; i < n / 256; i++, out += 292) {
        const float *xb = x + 256 * i;
        float amax = a512__amax(xb, 16);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        memcpy(out, &d, 4);
        __m512 vid = _mm512_set1_ps(id);
        int16_t bsums[16];
        for (int v = 0; v < 16; v++) {
            __m512i q = a512__q8_round(_mm512_mul_ps(_mm512_loadu_ps(xb + 16 * v), vid));
            _mm_storeu_si128((__m128i *)(out + 4 + 16 * v), _mm512_cvtepi32_epi8(q));
            bsums[v] = (int16_t)_mm512_reduce_add_epi32(q);
        }
        memcpy(out + 260, bsums, sizeof bsums);
    }
}

/* F32 "quantization" is a copy (kern__quantize_f32_ref; y may equal x). */
static void a512__quantize_f32(const float *x, void *y, int64_t n) {
    if ((const void *)x != y) memmove(y, x, (size_t)n * sizeof(float));
}

// ----------------------------------------------------------------------------
// r16 matmuls (avx512_r16.c), each falling back to this file's matmul of its
// type where it has no memory for the prepared activations

/* Defines name, the vtab's kern_matmul_fn over r16 groups: fn with plain. */
#define A512_R16_VIA(name, fn, plain)                                                              \
    static void name(int64_t K, int n_rows, int n_cols, const void *W, size_t ws, const void *X,   \
                     size_t xs, float *Y, size_t ys) {                                             \
        fn(plain, K, n_rows, n_cols, W, ws, X, xs, Y, ys);                                         \
    }

A512_R16_VIA(a512__matmul_r16_q8_0, kern__a512_matmul_r16_q8_0, a512__matmul_q8_0)
A512_R16_VIA(a512__matmul_r16_q4_0, kern__a512_matmul_r16_q4_0, a512__matmul_q4_0)
A512_R16_VIA(a512__matmul_r16_q5_0, kern__a512_matmul_r16_q5_0, a512__matmul_q5_0)
A512_R16_VIA(a512__matmul_r16_q4_K, kern__a512_matmul_r16_q4_K, a512__matmul_q4_K)
A512_R16_VIA(a512__matmul_r16_q6_K, kern__a512_matmul_r16_q6_K, a512__matmul_q6_K)
A512_R16_VIA(a512__matmul_r16_q5_K, kern__a512_matmul_r16_q5_K, a512__matmul_q5_K)
A512_R16_VIA(a512__matmul_r16_q2_K, kern__a512_matmul_r16_q2_K, a512__matmul_q2_K)
A512_R16_VIA(a512__matmul_r16_q3_K, kern__a512_matmul_r16_q3_K, a512__matmul_q3_K)
A512_R16_VIA(a512__matmul_r16_iq4_xs, kern__a512_matmul_r16_iq4_xs, a512__matmul_iq4_xs)
A512_R16_VIA(a512__matmul_r16_mxfp4, kern__a512_matmul_r16_mxfp4, a512__matmul_mxfp4)

// ----------------------------------------------------------------------------
// Vtab

const kern_vtab kern__vtab_avx512 = {
    .name = "avx512",
    .matmul =
        {
            [KS_DTYPE_F32] = a512__matmul_f32,
            [KS_DTYPE_F16] = a512__matmul_f16,
            [KS_DTYPE_BF16] = a512__matmul_bf16,
            [KS_DTYPE_Q8_0] = a512__matmul_q8_0,
            [KS_DTYPE_Q4_0] = a512__matmul_q4_0,
            [KS_DTYPE_Q4_K] = a512__matmul_q4_K,
            [KS_DTYPE_Q6_K] = a512__matmul_q6_K,
            [KS_DTYPE_Q4_1] = a512__matmul_q4_1,
            [KS_DTYPE_Q5_0] = a512__matmul_q5_0,
            [KS_DTYPE_Q5_1] = a512__matmul_q5_1,
            [KS_DTYPE_IQ4_NL] = a512__matmul_iq4_nl,
            [KS_DTYPE_Q5_K] = a512__matmul_q5_K,
            [KS_DTYPE_Q3_K] = a512__matmul_q3_K,
            [KS_DTYPE_Q2_K] = a512__matmul_q2_K,
            [KS_DTYPE_IQ4_XS] = a512__matmul_iq4_xs,
            [KS_DTYPE_TQ1_0] = a512__matmul_tq1_0,
            [KS_DTYPE_TQ2_0] = a512__matmul_tq2_0,
            [KS_DTYPE_MXFP4] = a512__matmul_mxfp4,
            [KS_DTYPE_IQ2_XXS] = a512__matmul_iq2_xxs,
            [KS_DTYPE_IQ2_XS] = a512__matmul_iq2_xs,
            [KS_DTYPE_IQ2_S] = a512__matmul_iq2_s,
            [KS_DTYPE_IQ3_XXS] = a512__matmul_iq3_xxs,
            [KS_DTYPE_IQ3_S] = a512__matmul_iq3_s,
            [KS_DTYPE_IQ1_S] = a512__matmul_iq1_s,
            [KS_DTYPE_IQ1_M] = a512__matmul_iq1_m,
        },
    .matmul_r16 =
        {
            [KS_DTYPE_Q8_0] = a512__matmul_r16_q8_0,
            [KS_DTYPE_Q4_0] = a512__matmul_r16_q4_0,
            [KS_DTYPE_Q4_K] = a512__matmul_r16_q4_K,
            [KS_DTYPE_Q6_K] = a512__matmul_r16_q6_K,
            [KS_DTYPE_Q5_0] = a512__matmul_r16_q5_0,
            [KS_DTYPE_Q5_K] = a512__matmul_r16_q5_K,
            [KS_DTYPE_Q3_K] = a512__matmul_r16_q3_K,
            [KS_DTYPE_Q2_K] = a512__matmul_r16_q2_K,
            [KS_DTYPE_IQ4_XS] = a512__matmul_r16_iq4_xs,
            [KS_DTYPE_MXFP4] = a512__matmul_r16_mxfp4,
        },
    .quantize_act =
        {
            [KS_DTYPE_F32] = a512__quantize_f32,
            [KS_DTYPE_Q8_0] = a512__quantize_q8_0,
            [KS_DTYPE_Q8_K] = a512__quantize_q8_K,
        },
    .dot_f32 = kern__a512_dot_f32,
    .axpy_f32 = kern__a512_axpy_f32,
    .dot_rows =
        {
            [KS_DTYPE_F32] = kern__a512_dot_rows_f32,
            [KS_DTYPE_F16] = kern__a512_dot_rows_f16,
            [KS_DTYPE_Q8_0] = kern__a512_dot_rows_q8_0,
        },
    .axpy_rows =
        {
            [KS_DTYPE_F32] = kern__a512_axpy_rows_f32,
            [KS_DTYPE_F16] = kern__a512_axpy_rows_f16,
            [KS_DTYPE_Q8_0] = kern__a512_axpy_rows_q8_0,
        },
    .kv_store =
        {
            [KS_DTYPE_F32] = a512__quantize_f32,
            [KS_DTYPE_F16] = kern__a512_kv_store_f16,
            [KS_DTYPE_Q8_0] = a512__quantize_q8_0,
        },
    .rmsnorm = kern__a512_rmsnorm,
    .silu_mul = kern__a512_silu_mul,
    .gelu_mul = kern__a512_gelu_mul,
    .softmax = kern__a512_softmax,
    .attn_block = kern__a512_attn_block,
    .attn_block_bf16 = kern__a512_attn_block_bf16, // kern_attn_block: only where the CPU has it
    .attn_prefetch = true,
    .gdn_step = kern__a512_gdn_step,
};
