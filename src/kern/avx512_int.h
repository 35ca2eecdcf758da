/* avx512_int.h — private to kern/avx512.c, avx512_r16.c and avx512_vec.c
 * (all built with the AVX-512 flags, and only they include it): the small
 * helpers, the tiling driver and the integer dot steps their kernels are
 * built from, all inline so that none of them calls another for these; and
 * the r16 matmuls (avx512_r16.c) and vector ops (avx512_vec.c) that
 * avx512.c's vtab points at. The rules every kernel keeps (batch
 * invariance, exact integer lanes, VNNI and plain forms bit-identical) are
 * in avx512.c's header. */
#ifndef KS_KERN_AVX512_INT_H
#define KS_KERN_AVX512_INT_H

#include "kern/kern_int.h"

#include <immintrin.h>
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
static inline int a512__pf_nta(void) {
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
 * tile shape never changes any element's value (see avx512.c's header). */
static inline void a512__run_tiles(const a512_tile_fn tab[4][4], int RB, int ry, int64_t K,
                                   int n_units, int n_cols, const void *W, size_t us, const void *X,
                                   size_t xs, float *Y, size_t ys) {
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
static inline void a512__run(const a512_tile_fn tab[4][4], int64_t K, int n_rows, int n_cols,
                             const void *W, size_t ws, const void *X, size_t xs, float *Y,
                             size_t ys) {
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
// Integer dot steps, with and without AVX512-VNNI
// The VNNI forms are inline asm, so these files need no -mavx512vnni and the
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
static inline bool a512__use_vnni(void) {
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
static inline bool a512__use_gfni(void) {
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv("KS_AVX512_NO_GFNI");
        v = ks_cpu_get()->gfni && !(e && *e && strcmp(e, "0") != 0);
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v != 0;
}

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

// ----------------------------------------------------------------------------
// The r16 matmuls (avx512_r16.c): kern_matmul_fn over r16 groups of their
// type (kern.h), each falling back to plain, the row-major matmul of the
// type, over unpacked groups where it has no memory for the prepared
// activations. The error bounds are plain's.

void kern__a512_matmul_r16_q8_0(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                size_t ys);
void kern__a512_matmul_r16_q4_0(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                size_t ys);
void kern__a512_matmul_r16_q5_0(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                size_t ys);
void kern__a512_matmul_r16_q4_K(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                size_t ys);
void kern__a512_matmul_r16_q6_K(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                size_t ys);
void kern__a512_matmul_r16_q5_K(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                size_t ys);
void kern__a512_matmul_r16_q2_K(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                size_t ys);
void kern__a512_matmul_r16_q3_K(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                size_t ys);
void kern__a512_matmul_r16_iq4_xs(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                  const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                  size_t ys);
void kern__a512_matmul_r16_mxfp4(kern_matmul_fn plain, int64_t K, int n_rows, int n_cols,
                                 const void *W, size_t ws, const void *X, size_t xs, float *Y,
                                 size_t ys);

// ----------------------------------------------------------------------------
// The vector and attention ops (avx512_vec.c), as the vtab's entries of the
// same names (kern.h)

float kern__a512_dot_f32(int64_t n, const float *a, const float *b);
void kern__a512_axpy_f32(int64_t n, float a, const float *x, float *y);
void kern__a512_dot_rows_f32(int64_t n, int G, const float *q, const void *k, size_t k_stride,
                             int rows, float scale, float *out, size_t o_stride);
void kern__a512_dot_rows_f16(int64_t n, int G, const float *q, const void *k, size_t k_stride,
                             int rows, float scale, float *out, size_t o_stride);
void kern__a512_dot_rows_q8_0(int64_t n, int G, const float *q, const void *k, size_t k_stride,
                              int rows, float scale, float *out, size_t o_stride);
void kern__a512_axpy_rows_f32(int64_t n, int G, const float *s, size_t s_stride, const void *v,
                              size_t v_stride, int rows, float *y);
void kern__a512_axpy_rows_f16(int64_t n, int G, const float *s, size_t s_stride, const void *v,
                              size_t v_stride, int rows, float *y);
void kern__a512_axpy_rows_q8_0(int64_t n, int G, const float *s, size_t s_stride, const void *v,
                               size_t v_stride, int rows, float *y);
void kern__a512_kv_store_f16(const float *x, void *y, int64_t n);
void kern__a512_rmsnorm(int64_t n, const float *x, const float *w, float eps, float *y);
void kern__a512_silu_mul(int64_t n, const float *g, const float *u, float *y);
void kern__a512_gelu_mul(int64_t n, const float *g, const float *u, float *y);
void kern__a512_softmax(int64_t n, float *x);
void kern__a512_attn_block(const kern_attn_blk *a);
void kern__a512_attn_block_bf16(const kern_attn_blk *a);

#endif /* KS_KERN_AVX512_INT_H */
