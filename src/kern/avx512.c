

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
 * Each function names the ref it matches and its expected error. */
#include "kern/kern_int.h"

#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define A512_INLINE static inline __attribute__((always_inline))

// ----------------------------------------------------------------------------
// Small helpers

/* f16 bits at an unaligned address, to f32 (exact). */
A512_INLINE float a512__f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

A512_INLINE float a512__f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

/* Two 32-byte halves (unaligned) as one zmm. */
A512_INLINE __m512i a512__load2x32(const uint8_t *lo, const uint8_t *hi) {
    __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo));
    return _mm512_inserti64x4(v, _mm256_loadu_si256((const __m256i *)hi), 1);
}

// ----------------------------------------------------------------------------
// Tiling driver

typedef struct a512_tile {
    int64_t K;
    const uint8_t *W; /* weight row 0 of the tile */
    size_t ws;
    const uint8_t *X; /* activation row 0 of the tile */
    size_t xs;
    float *Y; /* Y of (row 0, col 0) */
    size_t ys;
    size_t yr; /* matvec tiles: Y floats between their R groups' outputs */
    int nta;   /* the weight prefetches' hint (a512__pf_nta) */
} a512_tile;

typedef void (*a512_tile_fn)(const a512_tile *t);

/* Prefetches bytes [off, off + n) of the weight row that follows the tile's
 * last row by r + 1 rows: the same stretch of the next tile, which a matvec
 * reads next. Rows are short (a few KB), so the hardware prefetcher retrains
 * at every tile and one core could not stream from DRAM without this. */
A512_INLINE void a512__prefetch_next(const a512_tile *t, int r, int R, int64_t off, int n) {
    const char *p = (const char *)t->W + (size_t)(R + r) * t->ws + off;
    for (int b = 0; b < n; b += 64)
        _mm_prefetch(p + b, _MM_HINT_T0);
}

/* How far ahead an r16 matvec prefetches its weight stream: a few super-
 * blocks. One whole group ahead (18-100 KB, what a512__prefetch_next gives)
 * lands outside L1: two-thread Q4_K_M tg128 ran ~55 tok/s with it, ~65 with this. */
#define A512_R16_AHEAD 12288

/* The matvecs' own distances (a512__*_vec), per weight type. Past what the
 * L2 stream prefetcher has fetched, a T0 prefetch holds an L1 miss buffer
 * for a whole DRAM round trip; short of it the line is not in L1 in time.
 * On an AMD Zen 5 core (2026-12-03, two threads reading ~77 GB/s) the
 * kernel / read-only rate of bench_stream (2 alternated runs of 15 rounds)
 * peaked at these, where 12288 for all gave Q4_0 0.91, Q4_K 0.81-0.82,
 * Q6_K 0.92-0.93: Q4_0 at 3072-4096 0.96-0.97, Q4_K at 4096-6144
 * 0.92-0.97, Q6_K at 6144-8192 0.97-1.01; Q3_K stays best at 12288.
 * `kvseal bench` tg / roofline, 4 alternated rounds: Q4_K_M 0.71-0.89 ->
 * 0.75-0.82 (tg 47-75 -> 69-83 tokens/s), Q4_0 0.70-0.82 -> 0.78-0.82;
 * Q8_0 unchanged (3 rounds, 0.82-0.88 -> 0.85-0.86). These are the bytes a
 * matvec keeps prefetched ahead in all: a tile reading R streams (two
 * groups, a512__run_vecn) prefetches 1/R of the distance ahead in each.
 * With each stream at the whole distance, `kvseal bench` tg on the same
 * host (2026-12-04, alternated rounds) was behind in 7 of 7 rounds for
 * Q4_K_M (2-8%) and 3 of 3 for Q8_0; Q4_0 within the noise. */
#ifndef A512_VEC_RB
/* r16 groups a Q8_0 / Q4_0 / Q4_K / Q6_K matvec tile reads at once (1 or 2) */
#define A512_VEC_RB 2
#endif
#define A512_AHEAD_Q4 4096  /* Q8_0, Q4_0 */
#define A512_AHEAD_Q4X 6144 /* Q4_0 over 3-4 streams (a512__run_vecn) */
#define A512_AHEAD_K4 6144  /* Q4_K, Q5_K */
#define A512_AHEAD_K6 8192  /* Q6_K */
#define A512_AHEAD_K3 12288 /* Q3_K, Q2_K */

/* Prefetches bytes [off, off + n) of r16 group r's stream, A512_R16_AHEAD
 * bytes ahead. Groups lie back to back, so this runs on into the next group,
 * which a matvec reads next. */
A512_INLINE void a512__prefetch_ahead(const a512_tile *t, int r, int64_t off, int n) {
    const char *p = (const char *)t->W + (size_t)r * t->ws + off + A512_R16_AHEAD;
    for (int b = 0; b < n; b += 64)
        _mm_prefetch(p + b, _MM_HINT_T0);
}

/* Whether the matvecs prefetch their weights non-temporally (NTA) rather
 * than into every level (T0): on AMD cores. The line comes into L1 for the
 * load that follows and is not kept beyond it (the weights are read once a
 * token). Against T0 on the Zen 5 host (2026-12-04, `kvseal bench` tg128,
 * alternated rounds): Q4_0 ahead in 4 of 4 rounds (2-7%), Q4_K_M 4 of 4
 * (1-5%), Q8_0 even (6 rounds, within 3% either way); a timing build's
 * matmul runs read 1-6% faster. On the Intel host (2026-12-03,
 * bench_stream, one-stream tiles) NTA read at 0.71-0.83 of the read-only
 * rate where T0 kept 0.94-1.01, so Intel cores keep T0. A512_PF_NTA (0 or
 * 1) forces either, for such comparisons. */
static int a512__pf_nta(void) {
#ifdef A512_PF_NTA
    return A512_PF_NTA;
#else
    return ks_cpu_get()->amd;
#endif
}

/* Prefetches the line at p of a weight stream, NTA or T0 (a512__pf_nta). */
A512_INLINE void a512__pf(int nta, const void *p) {
    if (nta)
        _mm_prefetch((const char *)p, _MM_HINT_NTA);
    else
        _mm_prefetch((const char *)p, _MM_HINT_T0);
}

/* Prefetches the line d bytes past p (an r16 weight stream). */
A512_INLINE void a512__pf_ahead(int nta, const uint8_t *p, int d) {
    a512__pf(nta, (const char *)p + d);
}

/* Runs tab's tiles of up to RB units x 4 columns over n_units units (a unit
 * is ry output rows: a weight row, or an r16 group of 16), us bytes apart,
 * and the units in chunks of about 256 KiB of weights, so a chunk stays in
 * L2 while every column tile passes over it. Edge tiles are smaller. The
 * tile shape never changes any element's value (see file header). */
static void a512__run_tiles(const a512_tile_fn tab[4][4], int RB, int ry, int64_t K, int n_units,
                            int n_cols, const void *W, size_t us, const void *X, size_t xs,
                            float *Y, size_t ys) {
    const int CB = 4, nta = a512__pf_nta();
    int chunk = us > 0 ? (int)((256u * 1024u) / us) : n_units;
    chunk = chunk < RB ? RB : chunk - chunk % RB;
    for (int u1 = 0; u1 < n_units; u1 += chunk) {
        int u1_end = n_units - u1 < chunk ? n_units : u1 + chunk;
        for (int c0 = 0; c0 < n_cols; c0 += CB) {
            int nc = n_cols - c0 < CB ? n_cols - c0 : CB;
            for (int u0 = u1; u0 < u1_end; u0 += RB) {
                int nr = u1_end - u0 < RB ? u1_end - u0 : RB;
                a512_tile t = {.K = K,
                               .W = (const uint8_t *)W + (size_t)u0 * us,
                               .ws = us,
                               .X = (const uint8_t *)X + (size_t)c0 * xs,
                               .xs = xs,
                               .Y = Y + (size_t)c0 * ys + (size_t)ry * (size_t)u0,
                               .ys = ys,
                               .yr = (size_t)ry,
                               .nta = nta};
                tab[nr - 1][nc - 1](&t);
            }
        }
    }
}

/* 4 x 4 tiles over weight rows (measured best for every type, despite some
 * register spills; 4 x 1 for a matvec). */
static void a512__run(const a512_tile_fn tab[4][4], int64_t K, int n_rows, int n_cols,
                      const void *W, size_t ws, const void *X, size_t xs, float *Y, size_t ys) {
    a512__run_tiles(tab, 4, 1, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

/* Instantiates body(R, C, t, V) for R, C in 1..4 and V in {0, 1} (VNNI off /
 * on): tables body##_tab[V][R-1][C-1]. A512_TILES_V1(body, 0) alone gives
 * body##_tab0 for bodies without a VNNI form. */
#define A512_TILES_V(body)                                                                         \
    A512_TILES_V1(body, 0)                                                                         \
    A512_TILES_V1(body, 1)                                                                         \
    static const a512_tile_fn(*const body##_tab[2])[4] = {body##_tab0, body##_tab1};

#define A512_TILES_V1(body, V)                                                                     \
    static void body##_##V##_11(const a512_tile *t) { body(1, 1, t, V); }                          \
    static void body##_##V##_12(const a512_tile *t) { body(1, 2, t, V); }                          \
    static void body##_##V##_13(const a512_tile *t) { body(1, 3, t, V); }                          \
    static void body##_##V##_14(const a512_tile *t) { body(1, 4, t, V); }                          \
    static void body##_##V##_21(const a512_tile *t) { body(2, 1, t, V); }                          \
    static void body##_##V##_22(const a512_tile *t) { body(2, 2, t, V); }                          \
    static void body##_##V##_23(const a512_tile *t) { body(2, 3, t, V); }                          \
    static void body##_##V##_24(const a512_tile *t) { body(2, 4, t, V); }                          \
    static void body##_##V##_31(const a512_tile *t) { body(3, 1, t, V); }                          \
    static void body##_##V##_32(const a512_tile *t) { body(3, 2, t, V); }                          \
    static void body##_##V##_33(const a512_tile *t) { body(3, 3, t, V); }                          \
    static void body##_##V##_34(const a512_tile *t) { body(3, 4, t, V); }                          \
    static void body##_##V##_41(const a512_tile *t) { body(4, 1, t, V); }                          \
    static void body##_##V##_42(const a512_tile *t) { body(4, 2, t, V); }                          \
    static void body##_##V##_43(const a512_tile *t) { body(4, 3, t, V); }                          \
    static void body##_##V##_44(const a512_tile *t) { body(4, 4, t, V); }                          \
    static const a512_tile_fn body##_tab##V[4][4] = {                                              \
        {body##_##V##_11, body##_##V##_12, body##_##V##_13, body##_##V##_14},                      \
        {body##_##V##_21, body##_##V##_22, body##_##V##_23, body##_##V##_24},                      \
        {body##_##V##_31, body##_##V##_32, body##_##V##_33, body##_##V##_34},                      \
        {body##_##V##_41, body##_##V##_42, body##_##V##_43, body##_##V##_44},                      \
    };

#define A512_FOR_R _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
#define A512_FOR_C _Pragma("GCC unroll 4") for (int c = 0; c < C; c++)

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
// Integer dot steps, with and without AVX512-VNNI
// The VNNI forms are inline asm, so this file needs no -mavx512vnni and the
// choice is made per call (a512__use_vnni). Both forms compute the same exact
// int32 lanes (lane l = the products of bytes 4l..4l+3), so results are
// bit-identical whichever runs.

/* acc + sum of 4 u8*s8 products per int32 lane (vpdpbusd, no saturation). */
A512_INLINE __m512i a512__dpbusd(__m512i acc, __m512i u, __m512i s) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
}

/* acc + sum of 2 s16*s16 products per int32 lane (vpdpwssd). */
A512_INLINE __m512i a512__dpwssd(__m512i acc, __m512i a, __m512i b) {
    __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}

/* acc + madd(a, b) (int16 pairs -> int32), VNNI-fused when V. */
A512_INLINE __m512i a512__madd_acc(int V, __m512i acc, __m512i a, __m512i b) {
    return V ? a512__dpwssd(acc, a, b) : _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
}

/* Whether the quantized matmuls use the VNNI forms: the CPU has it and
 * KS_AVX512_NO_VNNI is unset or "0" (a test hook; results are identical). */
static bool a512__use_vnni(void) {
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv("KS_AVX512_NO_VNNI");
        v = ks_cpu_get()->avx512vnni && !(e && *e && strcmp(e, "0") != 0);
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v != 0;
}

/* Per byte of x: bit i of the result = parity(x & byte 7-i of the same
 * qword of m) (vgf2p8affineqb, imm 0): a fixed bit permutation with zero fill
 * when each byte of m has at most one bit set. */
A512_INLINE __m512i a512__gf2affine(__m512i x, __m512i m) {
    __m512i r;
    __asm__("vgf2p8affineqb $0, %2, %1, %0" : "=v"(r) : "v"(x), "v"(m));
    return r;
}

/* Whether the CPU has GFNI and KS_AVX512_NO_GFNI is unset or "0" (a test
 * hook; results are identical). */
static bool a512__use_gfni(void) {
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv("KS_AVX512_NO_GFNI");
        v = ks_cpu_get()->gfni && !(e && *e && strcmp(e, "0") != 0);
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v != 0;
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

/* acc + 4 u8*s8 products per int32 lane, exact: vpdpbusd, or without VNNI
 * two maddubs over u's low 7 bits and its top bit (neither can saturate:
 * |s| <= 127, as activations never hold -128). */
A512_INLINE __m512i a512__dpbusd_v(int V, __m512i acc, __m512i u, __m512i s) {
    if (V) return a512__dpbusd(acc, u, s);
    const __m512i ones16 = _mm512_set1_epi16(1), m7f = _mm512_set1_epi8(0x7f);
    __m512i lo = _mm512_maddubs_epi16(_mm512_and_si512(u, m7f), s);
    __m512i hi = _mm512_maddubs_epi16(_mm512_andnot_si512(m7f, u), s);
    return _mm512_add_epi32(
        acc, _mm512_add_epi32(_mm512_madd_epi16(lo, ones16), _mm512_madd_epi16(hi, ones16)));
}

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

/* An r16 tile of R groups (16 rows each) x C columns. t->W: group 0 (t->ws
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
    __m512 acc[4][4];
    A512_FOR_R A512_FOR_C acc[r][c] = _mm512_setzero_ps();
    const int64_t nb = t->K / 32;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wq[4];
        __m512 wd[4];
        const a512_r16x *x[4];
        // small tiles prefetch A512_R16_AHEAD ahead, one line per line
        // loaded, spread as the loads are (not a pair's 9-17 lines at once)
        A512_FOR_R {
            const uint8_t *p = t->W + r * t->ws + (size_t)(b / 2) * pb;
            if (C <= 2 && b % 2 == 0) a512__pf_ahead(t->nta, p, A512_R16_AHEAD);
            wd[r] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + (b % 2) * 32)));
            wq[r] = p + 64 + (b % 2) * qb;
        }
        A512_FOR_C x[c] = (const a512_r16x *)(const void *)(t->X + c * t->xs) + b;
        // NS partial sums per output vector, so a small tile (a matvec's
        // 1x1) has independent vpdpbusd chains in flight, not one chain of 8
        // (latency-bound: from L2 the Q8_0 matvec ran 54 GB/s a core with
        // one chain, 82 with four); int32 sums are exact: no value changes
        const int NS = R * C >= 4 ? 1 : R * C == 1 ? 4 : 2;
        __m512i is[4][4], ip[3][4][4];
        A512_FOR_R A512_FOR_C {
            is[r][c] = _mm512_set1_epi32(x[c]->corr);
            _Pragma("GCC unroll 3") for (int k = 0; k < NS - 1; k++) ip[k][r][c] =
                _mm512_setzero_si512();
        }
#define A512_R16_IS(k) (*((k) % NS ? &ip[(k) % NS - 1][r][c] : &is[r][c]))
        if (T) {
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) A512_FOR_R {
                if (C <= 2) a512__pf_ahead(t->nta, wq[r] + 64 * j, A512_R16_AHEAD);
                if (C <= 2 && T == 2 && j == 0) a512__pf_ahead(t->nta, wq[r] + 256, A512_R16_AHEAD);
                __m512i z = _mm512_loadu_si512(wq[r] + 64 * j);
                __m512i lo = _mm512_and_si512(z, m4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
                if (T == 2) { // bit 4: bit j (low nibbles) or 4 + j (high) of qh's bytes
                    __m512i h = _mm512_loadu_si512(wq[r] + 256);
                    lo = a512__or_bit4(lo, a512__bit_to4(h, j));
                    hi = a512__or_bit4(hi, a512__bit_to4(h, 4 + j));
                }
                A512_FOR_C {
                    A512_R16_IS(j) =
                        a512__dpbusd_v(V, A512_R16_IS(j), lo, a512__bcast4(x[c]->qs + 4 * j));
                    A512_R16_IS(j) =
                        a512__dpbusd_v(V, A512_R16_IS(j), hi, a512__bcast4(x[c]->qs + 16 + 4 * j));
                }
            }
        } else {
            _Pragma("GCC unroll 8") for (int s = 0; s < 8; s++) A512_FOR_R {
                if (C <= 2) a512__pf_ahead(t->nta, wq[r] + 64 * s, A512_R16_AHEAD);
                __m512i w = _mm512_loadu_si512(wq[r] + 64 * s);
                A512_FOR_C A512_R16_IS(s) =
                    a512__dpbusd_v(V, A512_R16_IS(s), w, a512__bcast4(x[c]->qs + 4 * s));
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
    A512_FOR_R A512_FOR_C _mm512_storeu_ps(t->Y + c * t->ys + 16 * r, acc[r][c]);
}

#define a512__r16q8_tile(R, C, t, V) a512__r16_tile(0, R, C, t, V)
#define a512__r16q4_tile(R, C, t, V) a512__r16_tile(1, R, C, t, V)
#define a512__r16q5_tile(R, C, t, V) a512__r16_tile(2, R, C, t, V)
A512_TILES_V(a512__r16q8_tile)
A512_TILES_V(a512__r16q4_tile)
A512_TILES_V(a512__r16q5_tile)

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
    __m512 acc[4][4];
    A512_FOR_R A512_FOR_C acc[r][c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < t->K / 256; i++) {
        const uint8_t *p[4];
        const a512_r16k *x[4];
        if (C <= 2) A512_FOR_R a512__prefetch_ahead(t, r, i * (int64_t)SB, (int)SB);
        A512_FOR_R p[r] = t->W + r * t->ws + (size_t)i * SB;
        A512_FOR_C x[c] = (const a512_r16k *)(const void *)(t->X + c * t->xs) + i;
        __m512i it[4][4], ms[4][4];
        A512_FOR_R A512_FOR_C it[r][c] = ms[r][c] = _mm512_setzero_si512();
        _Pragma("GCC unroll 2") for (int j = 0; j < 8; j++) {
            __m512i sub[4][4];
            A512_FOR_R A512_FOR_C sub[r][c] = _mm512_setzero_si512();
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) A512_FOR_R {
                __m512i z = _mm512_loadu_si512(p[r] + 320 + 512 * (j / 2) + 64 * k);
                z = _mm512_and_si512(j & 1 ? _mm512_srli_epi16(z, 4) : z, m4);
                if (Q5)
                    z = a512__or_bit4(
                        z, a512__bit_to4(_mm512_loadu_si512(p[r] + KERN_R16_Q4K_SB + 64 * k), j));
                A512_FOR_C sub[r][c] =
                    a512__dpbusd_v(V, sub[r][c], z, a512__bcast4(x[c]->qs + 32 * j + 4 * k));
            }
            A512_FOR_R {
                __m512i sc =
                    _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p[r] + 64 + 16 * j)));
                A512_FOR_C it[r][c] = _mm512_add_epi32(it[r][c], _mm512_mullo_epi32(sub[r][c], sc));
            }
        }
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) A512_FOR_R {
            __m512i m =
                _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(p[r] + 192 + 32 * q)));
            A512_FOR_C {
                int32_t bp;
                memcpy(&bp, x[c]->bs + 2 * q, 4);
                ms[r][c] = a512__madd_acc(V, ms[r][c], m, _mm512_set1_epi32(bp));
            }
        }
        A512_FOR_R {
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p[r]));
            __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p[r] + 32)));
            A512_FOR_C {
                __m512 dx = _mm512_set1_ps(x[c]->d);
                acc[r][c] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(it[r][c]), _mm512_mul_ps(d, dx), acc[r][c]);
                acc[r][c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms[r][c]), _mm512_mul_ps(dm, dx),
                                             acc[r][c]);
            }
        }
    }
    A512_FOR_R A512_FOR_C _mm512_storeu_ps(t->Y + c * t->ys + 16 * r, acc[r][c]);
}
#define a512__r16k_tile(R, C, t, V) a512__r16k_tile_q(0, R, C, t, V)
#define a512__r16k5_tile(R, C, t, V) a512__r16k_tile_q(1, R, C, t, V)
A512_TILES_V(a512__r16k_tile)
A512_TILES_V(a512__r16k5_tile)

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

/* Runs r16 tiles: prepares every column's activation units (nu of xunit
 * bytes, by prep), then a512__run_tiles over the groups. Without memory
 * for the prepared columns, falls back to unpacking (plain, the same
 * tolerance). */
static void a512__run_r16(ks_dtype wt, const a512_tile_fn tab[4][4],
                          void (*prep)(const uint8_t *X, int64_t nu, void *out), int64_t nu,
                          size_t xunit, kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                          const void *W, size_t ws, const void *X, size_t xs, float *Y, size_t ys) {
    const size_t xps = (size_t)nu * xunit;
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
    // Q8_0 even.
    int vec_rb = 1;
    if (wt == KS_DTYPE_Q8_0 || wt == KS_DTYPE_Q4_0 || wt == KS_DTYPE_Q4_K ||
        (wt == KS_DTYPE_Q6_K && a512__pf_nta()))
        vec_rb = A512_VEC_RB;
    if (wt == KS_DTYPE_Q4_0 && a512__pf_nta() && vec_rb == 2) vec_rb = 4;
    if (n_cols == 1 && vec_rb > 1)
        a512__run_vecn(tab, vec_rb, K, n_rows / 16, W, kern_r16_group_bytes(wt, K), xp, Y);
    else
        a512__run_tiles(tab, n_cols == 1 ? 1 : 4, 16, K, n_rows / 16, n_cols, W,
                        kern_r16_group_bytes(wt, K), xp, xps, Y, ys);
    if (xp != small && xp != a512__xcache.xp) ks_free_aligned(xp);
}

/* Matches kern__matmul_q8_0_ref over r16 groups; integer block sums exact,
 * the error as a512__matmul_q8_0's. */
static void a512__matmul_r16_q8_0(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                                  const void *X, size_t xs, float *Y, size_t ys) {
    a512__run_r16(KS_DTYPE_Q8_0, a512__r16q8_tile_tab[a512__use_vnni()], a512__r16q8_prep_x, K / 32,
                  sizeof(a512_r16x), a512__matmul_q8_0, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

/* Matches kern__matmul_q4_0_ref over r16 groups; as a512__matmul_r16_q8_0. */
static void a512__matmul_r16_q4_0(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                                  const void *X, size_t xs, float *Y, size_t ys) {
    a512__run_r16(KS_DTYPE_Q4_0, a512__r16q4_tile_tab[a512__use_vnni()], a512__r16q4_prep_x, K / 32,
                  sizeof(a512_r16x), a512__matmul_q4_0, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}

// ----------------------------------------------------------------------------
// Q4_1 / Q5_0 / Q5_1 / IQ4_NL weights x Q8_0 activations
// Per pair of 32-element blocks, one zmm of 64 unsigned weight bytes u in
// element order (bytes 0-31 block b, 32-63 block b+1; a lone last block
// leaves the upper half and its scales zero) times the two activation
// blocks, with a512__dpbusd_v: int32 lanes 0-7 belong to block b, 8-15 to
// b+1, each the exact sum of 4 products. The offset of each type goes back
// out in int32, from xs = the lane's sum of x (exact): Q5_0 u = q (value
// q - 16): - 16*xs; IQ4_NL u = codebook + 128: - 128*xs; Q4_1 / Q5_1 u = q
// (value d*q + m): nothing, and m's term is acc = fma(xs, m_w*d_x, acc).
// Then acc = fma((float)isum, d_w*d_x per lane, acc), pairs in order, one
// reduction at the end; the sequence depends only on K (batch invariance).

enum { A512_Q41, A512_Q50, A512_Q51, A512_IQ4NL };

/* Block bytes, and the offsets of qs and qh in a block, of type T. */
#define A512_Q32_BYTES(T) ((T) == A512_Q41 ? 20 : (T) == A512_Q50 ? 22 : (T) == A512_Q51 ? 24 : 18)
#define A512_Q32_QS(T) ((T) == A512_Q41 ? 4 : (T) == A512_Q50 ? 6 : (T) == A512_Q51 ? 8 : 2)
#define A512_Q32_QH(T) ((T) == A512_Q50 ? 2 : 4)

/* Two f16 scales (the second 0 when absent) in lanes 0-7 and 8-15. */
A512_INLINE __m512 a512__d2(const uint8_t *p0, const uint8_t *p1) {
    return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a512__f16(p0)),
                                _mm512_set1_ps(p1 ? a512__f16(p1) : 0.0f));
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
    if (T == A512_IQ4NL) { // codebook + 128 (1..241), the same in each 128-bit lane
        const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)kern_iq4nl_values);
        q = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_xor_si128(v, _mm_set1_epi8((char)0x80))),
                                q);
    }
    return q;
}

A512_INLINE void a512__q32_tile(int T, int R, int C, const a512_tile *t, int V) {
    const int bs = A512_Q32_BYTES(T);
    const bool has_m = T == A512_Q41 || T == A512_Q51;
    const int off = T == A512_Q50 ? 4 : T == A512_IQ4NL ? 7 : -1; /* log2 of the offset */
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
            __m512 wd = a512__d2(wb, n > 1 ? wb + bs : NULL);
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
A512_TILES_V(a512__q4_1_tile)
A512_TILES_V(a512__q5_0_tile)
A512_TILES_V(a512__q5_1_tile)
A512_TILES_V(a512__iq4_nl_tile)

/* Match kern__matmul_{q4_1,q5_0,q5_1,iq4_nl}_ref: block integer sums exact;
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
/* Matches kern__matmul_q5_0_ref over r16 groups; integer block sums exact,
 * the error as a512__matmul_q5_0's. */
static void a512__matmul_r16_q5_0(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                                  const void *X, size_t xs, float *Y, size_t ys) {
    a512__run_r16(KS_DTYPE_Q5_0, a512__r16q5_tile_tab[a512__use_vnni()], a512__r16q5_prep_x, K / 32,
                  sizeof(a512_r16x), a512__matmul_q5_0, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}
static void a512__matmul_q5_1(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                              const void *X, size_t xs, float *Y, size_t ys) {
    a512__run(a512__q5_1_tile_tab[a512__use_vnni()], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
}
static void a512__matmul_iq4_nl(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                                const void *X, size_t xs, float *Y, size_t ys) {
    a512__run(a512__iq4_nl_tile_tab[a512__use_vnni()], K, n_rows, n_cols, W, ws, X, xs, Y, ys);
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

/* Matches kern__matmul_q4_K_ref over r16 groups; integer sums exact, the
 * error as a512__matmul_q4_K's. */
static void a512__matmul_r16_q4_K(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                                  const void *X, size_t xs, float *Y, size_t ys) {
    a512__run_r16(KS_DTYPE_Q4_K, a512__r16k_tile_tab[a512__use_vnni()], a512__r16k_prep_x, K / 256,
                  sizeof(a512_r16k), a512__matmul_q4_K, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
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

/* Matches kern__matmul_q6_K_ref over r16 groups; integer sums exact, the
 * error as a512__matmul_q6_K's. */
static void a512__matmul_r16_q6_K(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                                  const void *X, size_t xs, float *Y, size_t ys) {
    const int V = a512__use_vnni();
    a512__run_r16(KS_DTYPE_Q6_K,
                  a512__use_gfni() ? a512__r16k6g_tile_tab[V] : a512__r16k6_tile_tab[V],
                  a512__r16k6_prep_x, K / 256, sizeof(a512_r16k6), a512__matmul_q6_K, K, n_rows,
                  n_cols, W, ws, X, xs, Y, ys);
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

/* Matches kern__matmul_q5_K_ref over r16 groups; integer sums exact, the
 * error as a512__matmul_q5_K's. */
static void a512__matmul_r16_q5_K(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                                  const void *X, size_t xs, float *Y, size_t ys) {
    a512__run_r16(KS_DTYPE_Q5_K, a512__r16k5_tile_tab[a512__use_vnni()], a512__r16k_prep_x, K / 256,
                  sizeof(a512_r16k), a512__matmul_q5_K, K, n_rows, n_cols, W, ws, X, xs, Y, ys);
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

/* Matches kern__matmul_q2_K_ref over r16 groups; integer sums exact, the
 * error as a512__matmul_q2_K's. */
static void a512__matmul_r16_q2_K(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                                  const void *X, size_t xs, float *Y, size_t ys) {
    a512__run_r16(KS_DTYPE_Q2_K, a512__r16k2_tile_tab[a512__use_vnni()], a512__r16k2_prep_x,
                  K / 256, sizeof(a512_r16k6), a512__matmul_q2_K, K, n_rows, n_cols, W, ws, X, xs,
                  Y, ys);
}

/* Matches kern__matmul_q3_K_ref over r16 groups; integer sums exact, the
 * error as a512__matmul_q3_K's. */
static void a512__matmul_r16_q3_K(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                                  const void *X, size_t xs, float *Y, size_t ys) {
    a512__run_r16(KS_DTYPE_Q3_K, a512__r16k3_tile_tab[a512__use_vnni()], a512__r16k3_prep_x,
                  K / 256, sizeof(a512_r16k6), a512__matmul_q3_K, K, n_rows, n_cols, W, ws, X, xs,
                  Y, ys);
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

/* Matches kern__matmul_iq4_xs_ref over r16 groups; integer sums exact, the
 * error as a512__matmul_iq4_xs's. */
static void a512__matmul_r16_iq4_xs(int64_t K, int n_rows, int n_cols, const void *W, size_t ws,
                                    const void *X, size_t xs, float *Y, size_t ys) {
    a512__run_r16(KS_DTYPE_IQ4_XS, a512__r16x4_tile_tab[a512__use_vnni()], a512__r16x4_prep_x,
                  K / 256, sizeof(a512_r16k6), a512__matmul_iq4_xs, K, n_rows, n_cols, W, ws, X, xs,
                  Y, ys);
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
// Vector ops

/* Matches kern__dot_f32_ref (double): f32 fma in 4 x 16 lanes, relative error
 * about n * 2^-24 of sum |a*b|. */
A512_INLINE float a512__dot(int64_t n, const float *a, const float *b) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i <= n - 64; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

static float a512__dot_f32(int64_t n, const float *a, const float *b) { return a512__dot(n, a, b); }

// KV attention ops (kern.h): rows in the pool's KV type, strides in bytes.
// One always-inline body per op, specialised by a constant KV type through
// its 16-lane loader, which yields the dequantized floats exactly (an f16,
// or an f16 scale times an int8, fits an f32 mantissa); every type then runs
// the same fma / add sequence, so a typed op equals the F32 op on the
// dequantized rows bit for bit. dot_rows match kern__dot_rows_<type>_ref
// within relative 1e-5 of sum|q*k| (as a512__dot); axpy_rows match
// kern__axpy_rows_<type>_ref exactly (one fma per element, rows in order).
// Q8_0 rows are whole blocks (n % 32 == 0). For head sizes the fast paths
// take, a block of 16 rows is dequantized once into L1 and read by all G
// heads of the group, which is where grouped-query attention saves.

/* Elements [i, i+16) of a row (i % 16 == 0), lanes outside mask m zero. */
A512_INLINE __m512 a512__kv_ld(ks_dtype t, const uint8_t *row, int64_t i, __mmask16 m) {
    if (t == KS_DTYPE_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * i));
    if (t == KS_DTYPE_Q8_0) {
        const uint8_t *b = row + (size_t)(i / 32) * sizeof(kern_block_q8_0);
        __m512 q =
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, b + 2 + i % 32)));
        return _mm512_mul_ps(q, _mm512_set1_ps(a512__f16(b)));
    }
    return _mm512_maskz_loadu_ps(m, row + 4 * i);
}

/* Lane j = _mm512_reduce_add_ps(v[j]), bit for bit: GCC's tree (lane i plus
 * lane i+8, then +4, then +2, then +1) run on 16 rows at once by 128-bit
 * and in-lane shuffles, where 16 separate reductions cost ~4x the shuffles. */
A512_INLINE __m512 a512__reduce16(const __m512 v[16]) {
    __m512 l1[8], l2[4], l3[2];
    _Pragma("GCC unroll 4") for (int n = 0; n < 4; n++) {
        // rows n, n+4 | n+8, n+12: u_i = a_i + a_{i+8} in 8 lanes each
        for (int h = 0; h < 2; h++) {
            const __m512 a = v[n + 8 * h], b = v[n + 4 + 8 * h];
            l1[2 * n + h] =
                _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
        }
    }
    // 128-bit lane k of l2[n] holds row n + 4k: w_i = u_i + u_{i+4}
    _Pragma("GCC unroll 4") for (int n = 0; n < 4; n++) l2[n] =
        _mm512_add_ps(_mm512_shuffle_f32x4(l1[2 * n], l1[2 * n + 1], 0x88),
                      _mm512_shuffle_f32x4(l1[2 * n], l1[2 * n + 1], 0xDD));
    // lane k of l3[p]: x0, x1 (w0 + w2, w1 + w3) of rows 2p + 4k, 2p + 1 + 4k
    _Pragma("GCC unroll 2") for (int p = 0; p < 2; p++) l3[p] =
        _mm512_add_ps(_mm512_shuffle_ps(l2[2 * p], l2[2 * p + 1], 0x44),
                      _mm512_shuffle_ps(l2[2 * p], l2[2 * p + 1], 0xEE));
    // x0 + x1 of rows 4k + 0..3, in row order
    return _mm512_add_ps(_mm512_shuffle_ps(l3[0], l3[1], 0x88),
                         _mm512_shuffle_ps(l3[0], l3[1], 0xDD));
}

/* Rows [j0, j0 + nr) of a plane (nr <= 16, n % 16 == 0, n <= 128) as f32
 * rows *rs bytes apart: F32 rows in place, others dequantized into buf. */
A512_INLINE const uint8_t *a512__kv_block(ks_dtype t, int64_t n, const void *k, size_t k_stride,
                                          int j0, int nr, float *buf, size_t *rs) {
    const uint8_t *base = (const uint8_t *)k + (size_t)j0 * k_stride;
    if (t == KS_DTYPE_F32) {
        *rs = k_stride;
        return base;
    }
    for (int j = 0; j < nr; j++)
        for (int64_t i = 0; i < n; i += 16)
            _mm512_storeu_ps(buf + (size_t)j * (size_t)n + (size_t)i,
                             a512__kv_ld(t, base + (size_t)j * k_stride, i, 0xFFFF));
    *rs = sizeof(float) * (size_t)n;
    return (const uint8_t *)buf;
}

/* a512__dot(n, q_g, row) per head and row (the same values and order); for
 * the common head size 64, q_g in registers and rows reduced 16 at a time. */
A512_INLINE void a512__dot_rows_t(ks_dtype t, int64_t n, int G, const float *q, const void *k,
                                  size_t k_stride, int rows, float scale, float *out,
                                  size_t o_stride) {
    if (n == 64) {
        _Alignas(64) float buf[16 * 64];
        for (int j0 = 0; j0 < rows; j0 += 16) {
            const int nr = rows - j0 < 16 ? rows - j0 : 16;
            size_t rs;
            const uint8_t *kb = a512__kv_block(t, 64, k, k_stride, j0, nr, buf, &rs);
            for (int g = 0; g < G; g++) {
                const float *qg = q + (size_t)g * 64;
                const __m512 q0 = _mm512_loadu_ps(qg), q1 = _mm512_loadu_ps(qg + 16),
                             q2 = _mm512_loadu_ps(qg + 32), q3 = _mm512_loadu_ps(qg + 48);
                float *o = out + (size_t)g * o_stride + (size_t)j0;
                __m512 v[16];
                _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {
                    if (i >= nr) break;
                    const float *r = (const float *)(const void *)(kb + (size_t)i * rs);
                    __m512 s0 = _mm512_fmadd_ps(q0, _mm512_loadu_ps(r), _mm512_setzero_ps());
                    __m512 s1 = _mm512_fmadd_ps(q1, _mm512_loadu_ps(r + 16), _mm512_setzero_ps());
                    __m512 s2 = _mm512_fmadd_ps(q2, _mm512_loadu_ps(r + 32), _mm512_setzero_ps());
                    __m512 s3 = _mm512_fmadd_ps(q3, _mm512_loadu_ps(r + 48), _mm512_setzero_ps());
                    v[i] = _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
                }
                if (nr == 16)
                    _mm512_storeu_ps(o, _mm512_mul_ps(a512__reduce16(v), _mm512_set1_ps(scale)));
                else
                    for (int i = 0; i < nr; i++)
                        o[i] = _mm512_reduce_add_ps(v[i]) * scale;
            }
        }
        return;
    }
    for (int g = 0; g < G; g++)
        for (int j = 0; j < rows; j++) {
            const uint8_t *r = (const uint8_t *)k + (size_t)j * k_stride;
            const float *qg = q + (size_t)g * (size_t)n;
            __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
            int64_t i = 0;
            for (; i <= n - 64; i += 64) {
                s0 = _mm512_fmadd_ps(_mm512_loadu_ps(qg + i), a512__kv_ld(t, r, i, 0xFFFF), s0);
                s1 = _mm512_fmadd_ps(_mm512_loadu_ps(qg + i + 16),
                                     a512__kv_ld(t, r, i + 16, 0xFFFF), s1);
                s2 = _mm512_fmadd_ps(_mm512_loadu_ps(qg + i + 32),
                                     a512__kv_ld(t, r, i + 32, 0xFFFF), s2);
                s3 = _mm512_fmadd_ps(_mm512_loadu_ps(qg + i + 48),
                                     a512__kv_ld(t, r, i + 48, 0xFFFF), s3);
            }
            for (; i < n; i += 16) {
                __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
                s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, qg + i), a512__kv_ld(t, r, i, m), s0);
            }
            out[(size_t)g * o_stride + (size_t)j] =
                _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3))) *
                scale;
        }
}

#define A512_KV_WRAPPERS(name, T)                                                                  \
    static void a512__dot_rows_##name(int64_t n, int G, const float *q, const void *k,             \
                                      size_t k_stride, int rows, float scale, float *out,          \
                                      size_t o_stride) {                                           \
        a512__dot_rows_t(T, n, G, q, k, k_stride, rows, scale, out, o_stride);                     \
    }                                                                                              \
    static void a512__axpy_rows_##name(int64_t n, int G, const float *s, size_t s_stride,          \
                                       const void *v, size_t v_stride, int rows, float *y) {       \
        a512__axpy_rows_t(T, n, G, s, s_stride, v, v_stride, rows, y);                             \
    }

/* Matches kern__axpy_f32_ref exactly (one fma per element). */
static void a512__axpy_f32(int64_t n, float a, const float *x, float *y) {
    __m512 va = _mm512_set1_ps(a);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(
            y + i, m,
            _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* y_g = fma(s_g[j], row j, y_g), rows in order; y_g stays in registers
 * while a block of rows streams by when n % 16 == 0 and n <= 128. */
A512_INLINE void a512__axpy_rows_t(ks_dtype t, int64_t n, int G, const float *s, size_t s_stride,
                                   const void *v, size_t v_stride, int rows, float *y) {
    if (n % 16 || n > 128) {
        for (int g = 0; g < G; g++)
            for (int j = 0; j < rows; j++) {
                const uint8_t *r = (const uint8_t *)v + (size_t)j * v_stride;
                const __m512 a = _mm512_set1_ps(s[(size_t)g * s_stride + (size_t)j]);
                float *yg = y + (size_t)g * (size_t)n;
                for (int64_t i = 0; i < n; i += 16) {
                    __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
                    _mm512_mask_storeu_ps(yg + i, m,
                                          _mm512_fmadd_ps(a, a512__kv_ld(t, r, i, m),
                                                          _mm512_maskz_loadu_ps(m, yg + i)));
                }
            }
        return;
    }
    const int nv = (int)(n / 16);
    _Alignas(64) float buf[16 * 128];
    for (int j0 = 0; j0 < rows; j0 += 16) {
        const int nr = rows - j0 < 16 ? rows - j0 : 16;
        size_t rs;
        const uint8_t *vb = a512__kv_block(t, n, v, v_stride, j0, nr, buf, &rs);
        for (int g = 0; g < G; g++) {
            float *yg = y + (size_t)g * (size_t)n;
            const float *sg = s + (size_t)g * s_stride + (size_t)j0;
            __m512 acc[8];
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) acc[i] =
                i < nv ? _mm512_loadu_ps(yg + 16 * i) : _mm512_setzero_ps();
            for (int j = 0; j < nr; j++) {
                const __m512 a = _mm512_set1_ps(sg[j]);
                const float *r = (const float *)(const void *)(vb + (size_t)j * rs);
                _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) if (i < nv) acc[i] =
                    _mm512_fmadd_ps(a, _mm512_loadu_ps(r + 16 * i), acc[i]);
            }
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) if (i < nv)
                _mm512_storeu_ps(yg + 16 * i, acc[i]);
        }
    }
}

A512_KV_WRAPPERS(f32, KS_DTYPE_F32)
A512_KV_WRAPPERS(f16, KS_DTYPE_F16)
A512_KV_WRAPPERS(q8_0, KS_DTYPE_Q8_0)

/* Matches kern__quantize_f16_ref byte for byte for every non-NaN input
 * (vcvtps2ph rounding to nearest even, as ks_f32_to_f16). */
static void a512__kv_store_f16(const float *x, void *y, int64_t n) {
    uint8_t *o = y;
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(o + 2 * i, m, h);
    }
}

/* Matches kern__rmsnorm_ref: sum of squares in double (other order), then
 * the same float ops; results within 1 ulp, usually equal. */
static void a512__rmsnorm(int64_t n, const float *x, const float *w, float eps, float *y) {
    __m512d s0 = _mm512_setzero_pd(), s1 = s0;
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        __m512d hi =
            _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        s0 = _mm512_fmadd_pd(lo, lo, s0);
        s1 = _mm512_fmadd_pd(hi, hi, s1);
    }
    double ss = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    __m512 sc = _mm512_set1_ps((float)(1.0 / sqrt(ss / (double)n + (double)eps)));
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), sc);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
    }
}

/* e^x for 16 lanes, within about 2 ulp of expf: x = n*ln2 + r, |r| <= ln2/2,
 * degree-7 Taylor polynomial of e^r, scaled by 2^n (scalef gives inf / 0
 * for out-of-range n). */
A512_INLINE __m512 a512__exp(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(100.0f));
    __m512 nn = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(nn, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(nn, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, nn);
}

/* Matches kern__silu_mul_ref within a few ulp (a512__exp vs expf). */
static void a512__silu_mul(int64_t n, const float *g, const float *u, float *y) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 vg = _mm512_maskz_loadu_ps(m, g + i), vu = _mm512_maskz_loadu_ps(m, u + i);
        __m512 e = a512__exp(_mm512_sub_ps(_mm512_setzero_ps(), vg));
        __m512 s = _mm512_div_ps(vg, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(s, vu));
    }
}

/* Matches kern__gelu_mul_ref within a few ulp: the same f32 ops in the same
 * order, no fma (kern_int.h KERN_GELU_C), a512__exp vs expf. */
static void a512__gelu_mul(int64_t n, const float *g, const float *u, float *y) {
    const __m512 one = _mm512_set1_ps(1.0f), m2 = _mm512_set1_ps(-2.0f);
    const __m512 c = _mm512_set1_ps(KERN_GELU_C), a = _mm512_set1_ps(KERN_GELU_A);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 x = _mm512_maskz_loadu_ps(m, g + i), vu = _mm512_maskz_loadu_ps(m, u + i);
        __m512 in = _mm512_add_ps(one, _mm512_mul_ps(_mm512_mul_ps(a, x), x));
        __m512 z2 = _mm512_mul_ps(m2, _mm512_mul_ps(_mm512_mul_ps(c, x), in));
        __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, a512__exp(z2)));
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(s, vu));
    }
}

/* Matches kern__softmax_ref within a few ulp (a512__exp vs expf; the sum is
 * in double like ref's, in another order). */
static void a512__softmax(int64_t n, float *x) {
    if (n <= 0) return;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        mx = _mm512_mask_max_ps(mx, m, _mm512_maskz_loadu_ps(m, x + i), mx);
    }
    __m512 vmx = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512d s0 = _mm512_setzero_pd(), s1 = s0;
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 e = a512__exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vmx));
        e = _mm512_maskz_mov_ps(m, e);
        _mm512_mask_storeu_ps(x + i, m, e);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        s1 = _mm512_add_pd(
            s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    __m512 inv = _mm512_set1_ps((float)(1.0 / _mm512_reduce_add_pd(_mm512_add_pd(s0, s1))));
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
    }
}

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
        },
    .quantize_act =
        {
            [KS_DTYPE_F32] = a512__quantize_f32,
            [KS_DTYPE_Q8_0] = a512__quantize_q8_0,
            [KS_DTYPE_Q8_K] = a512__quantize_q8_K,
        },
    .dot_f32 = a512__dot_f32,
    .axpy_f32 = a512__axpy_f32,
    .dot_rows =
        {
            [KS_DTYPE_F32] = a512__dot_rows_f32,
            [KS_DTYPE_F16] = a512__dot_rows_f16,
            [KS_DTYPE_Q8_0] = a512__dot_rows_q8_0,
        },
    .axpy_rows =
        {
            [KS_DTYPE_F32] = a512__axpy_rows_f32,
            [KS_DTYPE_F16] = a512__axpy_rows_f16,
            [KS_DTYPE_Q8_0] = a512__axpy_rows_q8_0,
        },
    .kv_store =
        {
            [KS_DTYPE_F32] = a512__quantize_f32,
            [KS_DTYPE_F16] = a512__kv_store_f16,
            [KS_DTYPE_Q8_0] = a512__quantize_q8_0,
        },
    .rmsnorm = a512__rmsnorm,
    .silu_mul = a512__silu_mul,
    .gelu_mul = a512__gelu_mul,
    .softmax = a512__softmax,
};
