/* kern_int.h — private to src/kern: the ggml quant block layouts shared by
 * ref.c, avx2.c and avx512*.c, the three vtabs, the scalar reference
 * functions (kern__*_ref) that SIMD files may call for tails, and the r16
 * layout's helpers in common.c, the floor every kernel file stands on.
 *
 * Blocks are declared packed (alignment 1) because kern.h promises that no
 * pointer needs alignment: a block may start at any byte of an mmapped GGUF
 * or a caller's scratch buffer, and member access through a packed struct is
 * well defined there (plain casts would be UB for the f16/f32/i16 fields).
 * Layouts follow ggml's ggml-common.h exactly (element order documented per
 * block below). */
#ifndef KS_KERN_INT_H
#define KS_KERN_INT_H

#include "kvseal/kern.h"

#include <string.h>

#define KERN_QK8_0 32 /* elements per Q8_0 / Q4_0 block */
#define KERN_QK_K 256 /* elements per K-quant super-block */
/* GELU (kern.h gelu_mul): every ISA computes -2z as
 * -2 * ((C * x) * (1 + (A * x) * x)), these f32 operations in this order
 * with no fma, because exp(-2z) amplifies z's rounding by 2|z|. */
#define KERN_GELU_C 0.7978845608028654f /* sqrt(2/pi) */
#define KERN_GELU_A 0.044715f

// ----------------------------------------------------------------------------
// Block layouts

/* Q8_0: value[i] = d * qs[i]. qs in [-127, 127] when written by us
 * (avx2 matmul relies on activations never being -128). */
typedef struct __attribute__((packed)) kern_block_q8_0 {
    uint16_t d;     /* f16 scale */
    int8_t qs[32];  /* element i */
} kern_block_q8_0;
_Static_assert(sizeof(kern_block_q8_0) == 34, "q8_0 block is 34 bytes");

/* Q4_0: value[i] = d * (q[i] - 8); qs[j] low nibble = element j, high nibble
 * = element j+16. */
typedef struct __attribute__((packed)) kern_block_q4_0 {
    uint16_t d;     /* f16 scale */
    uint8_t qs[16]; /* nibbles, see above */
} kern_block_q4_0;
_Static_assert(sizeof(kern_block_q4_0) == 18, "q4_0 block is 18 bytes");

/* Q4_1: value[i] = d * q[i] + m, q in [0, 15]; nibbles as Q4_0. Its
 * matmul needs sum(x) of the activation block (llama.cpp carries it in a
 * Q8_1 block); kvseal keeps Q8_0 activations and sums their qs exactly in
 * the kernel, so one activation format serves every 32-element type. */
typedef struct __attribute__((packed)) kern_block_q4_1 {
    uint16_t d;     /* f16 scale */
    uint16_t m;     /* f16 offset (the block minimum) */
    uint8_t qs[16]; /* nibbles, as Q4_0 */
} kern_block_q4_1;
_Static_assert(sizeof(kern_block_q4_1) == 20, "q4_1 block is 20 bytes");

/* Q5_0: value[i] = d * (q[i] - 16), q in [0, 31]: the low 4 bits are the
 * nibbles of qs (as Q4_0), bit 4 of element i is bit i of qh read as a
 * little-endian u32. */
typedef struct __attribute__((packed)) kern_block_q5_0 {
    uint16_t d;     /* f16 scale */
    uint8_t qh[4];  /* high bits, u32 LE, bit i = element i */
    uint8_t qs[16]; /* low nibbles, as Q4_0 */
} kern_block_q5_0;
_Static_assert(sizeof(kern_block_q5_0) == 22, "q5_0 block is 22 bytes");

/* Q5_1: value[i] = d * q[i] + m, q in [0, 31] packed as Q5_0. */
typedef struct __attribute__((packed)) kern_block_q5_1 {
    uint16_t d;     /* f16 scale */
    uint16_t m;     /* f16 offset */
    uint8_t qh[4];  /* high bits, as Q5_0 */
    uint8_t qs[16]; /* low nibbles, as Q4_0 */
} kern_block_q5_1;
_Static_assert(sizeof(kern_block_q5_1) == 24, "q5_1 block is 24 bytes");

/* IQ4_NL: value[i] = d * kern_iq4nl_values[q[i]], q a nibble packed as
 * Q4_0 (low nibble element j, high nibble element j + 16). */
typedef struct __attribute__((packed)) kern_block_iq4_nl {
    uint16_t d;     /* f16 scale */
    uint8_t qs[16]; /* codebook indices, as Q4_0 */
} kern_block_iq4_nl;
_Static_assert(sizeof(kern_block_iq4_nl) == 18, "iq4_nl block is 18 bytes");

/* The fixed non-linear codebook of IQ4_NL and IQ4_XS (GGUF spec). */
static const int8_t kern_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1,    13,   25,  38,  53,  69,  89,  113};

/* MXFP4 (OCP microscaling FP4): value[i] = 2^(e - 128) * kern_mxfp4_values[q[i]],
 * q a nibble packed as Q4_0. The codebook is the E2M1 values doubled, so the
 * E8M0 scale 2^(e - 127) is halved (kern__e8m0_half). */
typedef struct __attribute__((packed)) kern_block_mxfp4 {
    uint8_t e;      /* E8M0 exponent */
    uint8_t qs[16]; /* E2M1 codes, as Q4_0 */
} kern_block_mxfp4;
_Static_assert(sizeof(kern_block_mxfp4) == 17, "mxfp4 block is 17 bytes");

/* Twice the E2M1 values (sign bit 3, then 0 0.5 1 1.5 2 3 4 6). */
static const int8_t kern_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e - 128), exactly (e 0 and 1 give f32 subnormals); e = 255 is 2^127,
 * not NaN, as in ggml. */
static inline float kern__e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Q4_K: 256 elements in 8 sub-blocks of 32; sub-block j has a 6-bit scale
 * sc[j] and 6-bit min m[j]; value = d*sc[j]*q - dmin*m[j], q in [0,15].
 * Elements 64c..64c+31 are the low nibbles of qs[32c..32c+31] (sub-block
 * 2c), elements 64c+32..64c+63 the high nibbles (sub-block 2c+1).
 * scales[12] packing (kern__q4k_scale_min decodes it):
 *   j<4:  sc[j] = scales[j] & 63,           m[j] = scales[j+4] & 63
 *   j>=4: sc[j] = (scales[j+4] & 15) | (scales[j-4] >> 6) << 4,
 *         m[j]  = (scales[j+4] >> 4) | (scales[j]   >> 6) << 4 */
typedef struct __attribute__((packed)) kern_block_q4_K {
    uint16_t d;          /* f16 super-scale of the scales */
    uint16_t dmin;       /* f16 super-scale of the mins */
    uint8_t scales[12];  /* 6-bit scales and mins, see above */
    uint8_t qs[128];     /* nibbles, see above */
} kern_block_q4_K;
_Static_assert(sizeof(kern_block_q4_K) == 144, "q4_K block is 144 bytes");

/* Q6_K: 256 elements in 16 sub-blocks of 16; value[e] = d * scales[e/16] *
 * (q - 32), q in [0,63]. For e = 128n + 32g + i (n<2, g<4, i<32):
 *   low 4 bits: g=0 ql[64n+i] & 15, g=1 ql[64n+32+i] & 15,
 *               g=2 ql[64n+i] >> 4, g=3 ql[64n+32+i] >> 4
 *   high 2 bits: (qh[32n+i] >> 2g) & 3 */
typedef struct __attribute__((packed)) kern_block_q6_K {
    uint8_t ql[128];    /* low 4 bits, see above */
    uint8_t qh[64];     /* high 2 bits, see above */
    int8_t scales[16];  /* signed 8-bit sub-block scales */
    uint16_t d;         /* f16 super-scale */
} kern_block_q6_K;
_Static_assert(sizeof(kern_block_q6_K) == 210, "q6_K block is 210 bytes");

/* Q5_K: as Q4_K (same d, dmin and scales[12] packing), q in [0, 31]: the
 * low 4 bits as Q4_K's qs, bit 4 of element 32j + l (sub-block j) is bit j
 * of qh[l]. */
typedef struct __attribute__((packed)) kern_block_q5_K {
    uint16_t d;         /* f16 super-scale of the scales */
    uint16_t dmin;      /* f16 super-scale of the mins */
    uint8_t scales[12]; /* 6-bit scales and mins, as Q4_K */
    uint8_t qh[32];     /* high bits, see above */
    uint8_t qs[128];    /* low nibbles, as Q4_K */
} kern_block_q5_K;
_Static_assert(sizeof(kern_block_q5_K) == 176, "q5_K block is 176 bytes");

/* Q3_K: 256 elements in 16 sub-blocks of 16; value[e] = d * (sc[e/16] - 32)
 * * (q - 4), q in [0, 7]. For e = 128n + 32j + l (n<2, j<4, l<32): low 2
 * bits (qs[32n + l] >> 2j) & 3, bit 2 = bit (4n + j) of hmask[l]. The 6-bit
 * sc[s] (kern__q3k_scale decodes it): low 4 bits scales[s] & 15 (s < 8) or
 * scales[s-8] >> 4 (s >= 8), high 2 bits (scales[8 + s%4] >> 2(s/4)) & 3. */
typedef struct __attribute__((packed)) kern_block_q3_K {
    uint8_t hmask[32];  /* bit 2 of q, see above */
    uint8_t qs[64];     /* low 2 bits, see above */
    uint8_t scales[12]; /* 6-bit scales, see above */
    uint16_t d;         /* f16 super-scale */
} kern_block_q3_K;
_Static_assert(sizeof(kern_block_q3_K) == 110, "q3_K block is 110 bytes");

/* Q2_K: 256 elements in 16 sub-blocks of 16; value[e] = d * (scales[s] &
 * 15) * q - dmin * (scales[s] >> 4), s = e/16, q in [0, 3] laid out as
 * Q3_K's low 2 bits: e = 128n + 32j + l -> (qs[32n + l] >> 2j) & 3. */
typedef struct __attribute__((packed)) kern_block_q2_K {
    uint8_t scales[16]; /* low nibble scale, high nibble min */
    uint8_t qs[64];     /* 2-bit values, see above */
    uint16_t d;         /* f16 super-scale of the scales */
    uint16_t dmin;      /* f16 super-scale of the mins */
} kern_block_q2_K;
_Static_assert(sizeof(kern_block_q2_K) == 84, "q2_K block is 84 bytes");

/* IQ4_XS: 256 elements in 8 sub-blocks of 32; value = d * (ls[j] - 32) *
 * kern_iq4nl_values[q], ls[j] = ((scales_l[j/2] >> 4(j%2)) & 15) |
 * ((scales_h >> 2j) & 3) << 4. Sub-block j's indices are qs[16j .. 16j+15]:
 * low nibble element 32j + i, high nibble 32j + 16 + i. */
typedef struct __attribute__((packed)) kern_block_iq4_xs {
    uint16_t d;          /* f16 super-scale */
    uint16_t scales_h;   /* high 2 bits of the 8 scales */
    uint8_t scales_l[4]; /* low 4 bits, two per byte */
    uint8_t qs[128];     /* codebook indices, see above */
} kern_block_iq4_xs;
_Static_assert(sizeof(kern_block_iq4_xs) == 136, "iq4_xs block is 136 bytes");

/* TQ2_0 (ternary): 256 elements, value = d * (q - 1), q in [0, 3] (3 is
 * never written by a ternary quantizer, but decodes to 2d) laid out as
 * Q2_K's qs: element 128n + 32j + l -> (qs[32n + l] >> 2j) & 3. */
typedef struct __attribute__((packed)) kern_block_tq2_0 {
    uint8_t qs[64]; /* 2-bit values, see above */
    uint16_t d;     /* f16 scale */
} kern_block_tq2_0;
_Static_assert(sizeof(kern_block_tq2_0) == 66, "tq2_0 block is 66 bytes");

/* TQ1_0 (ternary, 1.6875 bits): 256 elements, value = d * (t - 1), t in
 * [0, 2] the base-3 digits of a byte b read as a fraction of 256: digit n
 * of b (n = 0 the most significant) is ((uint8_t)(b * 3^n) * 3) >> 8.
 * Element 32n + m (n < 5, m < 32): digit n of qs[m]; element 160 + 16n + m
 * (n < 5, m < 16): digit n of qs[32 + m]; element 240 + 4n + j (n < 4,
 * j < 4): digit n of qh[j]. */
typedef struct __attribute__((packed)) kern_block_tq1_0 {
    uint8_t qs[48]; /* 5 digits per byte, see above */
    uint8_t qh[4];  /* 4 digits per byte, see above */
    uint16_t d;     /* f16 scale */
} kern_block_tq1_0;
_Static_assert(sizeof(kern_block_tq1_0) == 54, "tq1_0 block is 54 bytes");

/* The codebook types IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and
 * IQ3_S: 256 elements in 8 sub-blocks of 32, each of groups of 8 (or 4)
 * elements that one grid entry (iq_grids.c) gives the magnitudes of, signs
 * apart; scales are odd integers ls = 2s + 1 of a 3- or 4-bit s, per 32 or
 * per 16 elements. kern__iq_decode (ref_iq.c) spells out every layout:
 * value = d * KERN_IQ_FACTOR(t) * ls * w, w a small signed integer. */
typedef struct __attribute__((packed)) kern_block_iq2_xxs {
    uint16_t d;     /* f16 super-scale */
    uint8_t qs[64]; /* per sub-block 8 bytes: 4 grid indices, then a u32 of
                       4 x 7 sign bits and the 4-bit scale in bits 28-31 */
} kern_block_iq2_xxs;
_Static_assert(sizeof(kern_block_iq2_xxs) == 66, "iq2_xxs block is 66 bytes");

typedef struct __attribute__((packed)) kern_block_iq2_xs {
    uint16_t d;        /* f16 super-scale */
    uint8_t qs[64];    /* 32 u16: 9-bit grid index | 7 sign bits << 9 */
    uint8_t scales[8]; /* sub-block j: low nibble elements 0-15, high 16-31 */
} kern_block_iq2_xs;
_Static_assert(sizeof(kern_block_iq2_xs) == 74, "iq2_xs block is 74 bytes");

typedef struct __attribute__((packed)) kern_block_iq2_s {
    uint16_t d;         /* f16 super-scale */
    uint8_t qs[32];     /* low 8 bits of the 10-bit grid indices */
    uint8_t signs[32];  /* one sign byte per group of 8 */
    uint8_t qh[8];      /* sub-block j: bits 2l, 2l+1 = index bits 8, 9 of group l */
    uint8_t scales[8];  /* as IQ2_XS */
} kern_block_iq2_s;
_Static_assert(sizeof(kern_block_iq2_s) == 82, "iq2_s block is 82 bytes");

typedef struct __attribute__((packed)) kern_block_iq3_xxs {
    uint16_t d;      /* f16 super-scale */
    uint8_t qs[64];  /* grid indices, one per group of 4 */
    uint8_t ss[32];  /* per sub-block a u32: 4 x 7 sign bits, scale in 28-31 */
} kern_block_iq3_xxs;
_Static_assert(sizeof(kern_block_iq3_xxs) == 98, "iq3_xxs block is 98 bytes");

typedef struct __attribute__((packed)) kern_block_iq3_s {
    uint16_t d;         /* f16 super-scale */
    uint8_t qs[64];     /* low 8 bits of the 9-bit grid indices (groups of 4) */
    uint8_t qh[8];      /* sub-block j: bit g = index bit 8 of its group g */
    uint8_t signs[32];  /* one sign byte per 8 elements */
    uint8_t scales[4];  /* sub-blocks 2k (low nibble) and 2k+1 (high) */
} kern_block_iq3_s;
_Static_assert(sizeof(kern_block_iq3_s) == 110, "iq3_s block is 110 bytes");

typedef struct __attribute__((packed)) kern_block_iq1_s {
    uint16_t d;     /* f16 super-scale */
    uint8_t qs[32]; /* low 8 bits of the 11-bit grid indices */
    uint8_t qh[16]; /* 8 u16: index bits 8-10 of group l at 3l, scale in
                       12-14, delta sign in 15 */
} kern_block_iq1_s;
_Static_assert(sizeof(kern_block_iq1_s) == 50, "iq1_s block is 50 bytes");

typedef struct __attribute__((packed)) kern_block_iq1_m {
    uint8_t qs[32];     /* low 8 bits of the 11-bit grid indices */
    uint8_t qh[16];     /* per pair of groups: index bits 8-10, delta sign bit 3 (x2) */
    uint8_t scales[8];  /* 4 u16: 3-bit scales, and the f16 d in their top nibbles */
} kern_block_iq1_m;
_Static_assert(sizeof(kern_block_iq1_m) == 56, "iq1_m block is 56 bytes");

extern const uint64_t kern_iq2xxs_grid[256], kern_iq2xs_grid[512], kern_iq2s_grid[1024],
    kern_iq1s_grid[2048];
extern const uint32_t kern_iq3xxs_grid[256], kern_iq3s_grid[512];

/* The sign byte of a 7-bit sign index: bit 7 makes the count of minus signs
 * even (ggml's ksigns_iq2xs). */
static inline uint8_t kern__iq_signs7(uint32_t s7) {
    uint32_t p = s7 ^ (s7 >> 4); // parity without popcnt (no -mpopcnt here)
    p ^= p >> 2;
    p ^= p >> 1;
    return (uint8_t)(s7 | (p & 1) << 7);
}

/* Whether t is one of the codebook types above. */
static inline bool kern__is_iq_grid(ks_dtype t) {
    return t == KS_DTYPE_IQ2_XXS || t == KS_DTYPE_IQ2_XS || t == KS_DTYPE_IQ2_S ||
           t == KS_DTYPE_IQ3_XXS || t == KS_DTYPE_IQ3_S || t == KS_DTYPE_IQ1_S ||
           t == KS_DTYPE_IQ1_M;
}

/* The power of 2 a codebook type's d * ls * w is scaled by (value above). */
#define KERN_IQ_FACTOR(t)                                                                          \
    ((t) == KS_DTYPE_IQ3_S ? 1.0f : (t) == KS_DTYPE_IQ3_XXS ? 0.25f : 0.125f)

/* Decodes super-block b of codebook type t: w[e] the signed integer of
 * element e (|w| <= 62: grid magnitudes with their signs, or 8g +- 1 for
 * IQ1_*, whose +-1/8 delta is folded in), ls[h] the odd scale of elements
 * 16h .. 16h+15, and the f16 bits of d. Can't fail. In ref_iq.c. */
void kern__iq_decode(ks_dtype t, const uint8_t *b, int8_t *w, int16_t *ls, uint16_t *d);

/* Digit n (0..4, most significant first) of a TQ1_0 byte: 0, 1 or 2. */
static inline int kern__tq1_digit(uint8_t b, int n) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    return ((uint8_t)(b * pow3[n]) * 3) >> 8;
}

/* Q8_K (activations for the K-quants, IQ4_XS and TQ1_0 / TQ2_0): value[i] = d * qs[i];
 * bsums[j] = sum of qs[16j .. 16j+15] (exact). */
typedef struct __attribute__((packed)) kern_block_q8_K {
    float d;            /* f32 scale */
    int8_t qs[256];     /* element i, in [-127, 127] when written by us */
    int16_t bsums[16];  /* per-16 sums of qs */
} kern_block_q8_K;
_Static_assert(sizeof(kern_block_q8_K) == 292, "q8_K block is 292 bytes");

/* Decodes the 6-bit scale and min of Q4_K sub-block j (0..7). */
static inline void kern__q4k_scale_min(const uint8_t *scales, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = scales[j] & 63;
        *m = scales[j + 4] & 63;
    } else {
        *sc = (scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4);
        *m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
    }
}

/* Decodes the 6-bit scale of Q3_K sub-block s (0..15), still offset by 32. */
static inline int kern__q3k_scale(const uint8_t *scales, int s) {
    int lo = s < 8 ? scales[s] & 15 : scales[s - 8] >> 4;
    return lo | ((scales[8 + s % 4] >> (2 * (s / 4))) & 3) << 4;
}

/* The 6-bit scale of IQ4_XS sub-block j (0..7), still offset by 32. */
static inline int kern__iq4xs_scale(const kern_block_iq4_xs *b, int j) {
    return ((b->scales_l[j / 2] >> (4 * (j % 2))) & 15) | ((b->scales_h >> (2 * j)) & 3) << 4;
}

// ----------------------------------------------------------------------------
// Vtabs (ref.c, avx2.c, avx512.c)

/* Bytes of one Q4_K super-block of a 16-row r16 group (kern.h). */
#define KERN_R16_Q4K_SB 2368
/* Bytes of one Q6_K super-block of a 16-row r16 group (16 x 210). */
#define KERN_R16_Q6K_SB 3360
/* Offset in an r16 Q6_K super-block of step (n, k)'s 192 bytes (kern.h):
 * ql's low-h line, its high-h line, then qh's, in the order a matvec reads
 * them. */
#define KERN_R16_Q6K_STEP(n, k) (288 + 192 * (8 * (n) + (k)))
/* Bytes of one Q5_K super-block of a 16-row r16 group (Q4_K's + 512 qh). */
#define KERN_R16_Q5K_SB 2880
/* Bytes of one Q3_K super-block of a 16-row r16 group (kern.h). */
#define KERN_R16_Q3K_SB 1824
/* Bytes of one Q2_K super-block of a 16-row r16 group (16 x 84). */
#define KERN_R16_Q2K_SB 1344
/* Bytes of one IQ4_XS super-block of a 16-row r16 group (kern.h). */
#define KERN_R16_IQ4XS_SB 2208
/* Bytes of one quad (4 blocks) of an MXFP4 r16 group (16 x 4 x 17). */
#define KERN_R16_MXFP4_QUAD 1088

/* A kern_matmul_fn over r16 groups (kern.h) through fn, the plain matmul of
 * type t: each group's 16 rows are unpacked into scratch, then fn runs on
 * them; so the results are fn's, bit for bit. For vtabs without a native
 * r16 kernel (and the native one's fallback). In common.c. */
void kern__matmul_r16_via(kern_matmul_fn fn, ks_dtype t, int64_t K, int n_rows, int n_cols,
                          const void *W, size_t ws, const void *X, size_t xs, float *Y, size_t ys);

/* Defines name, a kern_matmul_fn over r16 groups of type t through fn. */
#define KERN_R16_VIA(name, fn, t)                                                                  \
    static void name(int64_t K, int n_rows, int n_cols, const void *W, size_t ws, const void *X,   \
                     size_t xs, float *Y, size_t ys) {                                             \
        kern__matmul_r16_via(fn, t, K, n_rows, n_cols, W, ws, X, xs, Y, ys);                       \
    }

extern const kern_vtab kern__vtab_ref;
extern const kern_vtab kern__vtab_avx2;
extern const kern_vtab kern__vtab_avx512;

// ----------------------------------------------------------------------------
// Reference functions (ref.c). Every f32 reduction accumulates in double, in
// increasing k (or block) order, and rounds to float once at the end; each
// term is exact (products of two floats, integer block sums) or rounded once.
// This is the most accurate order that is still cheap, so a SIMD kernel's
// tolerance is just its own rounding (tests/unit/test_kern.c).

/* One output element: dot of a weight row and an activation row of K
 * elements (same formats as kern_matmul_fn). */
float kern__dot_row_f32_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_f16_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_bf16_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_q8_0_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_q4_0_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_q4_K_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_q6_K_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_q4_1_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_q5_0_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_q5_1_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_q5_K_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_q3_K_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_q2_K_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_iq4_nl_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_iq4_xs_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_tq1_0_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_tq2_0_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_mxfp4_ref(int64_t K, const void *w, const void *x);
/* The codebook types (ref_iq.c) */
float kern__dot_row_iq2_xxs_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_iq2_xs_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_iq2_s_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_iq3_xxs_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_iq3_s_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_iq1_s_ref(int64_t K, const void *w, const void *x);
float kern__dot_row_iq1_m_ref(int64_t K, const void *w, const void *x);

void kern__matmul_f32_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
                          const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_f16_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
                          const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_bf16_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
                           const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_q8_0_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
                           const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_q4_0_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
                           const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_q4_K_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
                           const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_q6_K_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
                           const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_q4_1_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
                           const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_q5_0_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
                           const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_q5_1_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
                           const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_q5_K_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
                           const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_q3_K_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
                           const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_q2_K_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
                           const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_iq4_nl_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
                             const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_iq4_xs_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
                             const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_tq1_0_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
                            const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_tq2_0_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
                            const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_mxfp4_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
                            const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_iq2_xxs_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
    const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_iq2_xs_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
    const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_iq2_s_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
    const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_iq3_xxs_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
    const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_iq3_s_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
    const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_iq1_s_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
    const void *X, size_t x_stride, float *Y, size_t y_stride);
void kern__matmul_iq1_m_ref(int64_t K, int n_rows, int n_cols, const void *W, size_t w_stride,
    const void *X, size_t x_stride, float *Y, size_t y_stride);

/* Activation quantizers (kern_quant_fn). Q8_0 and Q8_K use d = amax/127
 * (Q8_0: d rounded to f16 first), q = round-half-even(x * (1/d)); SIMD
 * versions must produce the same bytes. */
void kern__quantize_f32_ref(const float *x, void *y, int64_t n);
void kern__quantize_q8_0_ref(const float *x, void *y, int64_t n);
void kern__quantize_q8_K_ref(const float *x, void *y, int64_t n);

/* Weight quantizers and dequantizers (used by kern_quantize_row /
 * kern_dequantize_row). n is a multiple of the block size. */
void kern__quantize_f16_ref(const float *x, void *y, int64_t n);
void kern__quantize_bf16_ref(const float *x, void *y, int64_t n);
void kern__quantize_q4_0_ref(const float *x, void *y, int64_t n);
void kern__quantize_q4_K_ref(const float *x, void *y, int64_t n);
void kern__quantize_q6_K_ref(const float *x, void *y, int64_t n);
void kern__quantize_q4_1_ref(const float *x, void *y, int64_t n);
void kern__quantize_q5_0_ref(const float *x, void *y, int64_t n);
void kern__quantize_q5_1_ref(const float *x, void *y, int64_t n);
void kern__quantize_q5_K_ref(const float *x, void *y, int64_t n);
void kern__quantize_q3_K_ref(const float *x, void *y, int64_t n);
void kern__quantize_q2_K_ref(const float *x, void *y, int64_t n);
void kern__quantize_iq4_nl_ref(const float *x, void *y, int64_t n);
void kern__quantize_iq4_xs_ref(const float *x, void *y, int64_t n);
void kern__quantize_tq1_0_ref(const float *x, void *y, int64_t n);
void kern__quantize_tq2_0_ref(const float *x, void *y, int64_t n);
void kern__quantize_mxfp4_ref(const float *x, void *y, int64_t n);
void kern__dequantize_f32_ref(const void *x, float *y, int64_t n);
void kern__dequantize_f16_ref(const void *x, float *y, int64_t n);
void kern__dequantize_bf16_ref(const void *x, float *y, int64_t n);
void kern__dequantize_q8_0_ref(const void *x, float *y, int64_t n);
void kern__dequantize_q4_0_ref(const void *x, float *y, int64_t n);
void kern__dequantize_q4_K_ref(const void *x, float *y, int64_t n);
void kern__dequantize_q6_K_ref(const void *x, float *y, int64_t n);
void kern__dequantize_q8_K_ref(const void *x, float *y, int64_t n);
void kern__dequantize_q4_1_ref(const void *x, float *y, int64_t n);
void kern__dequantize_q5_0_ref(const void *x, float *y, int64_t n);
void kern__dequantize_q5_1_ref(const void *x, float *y, int64_t n);
void kern__dequantize_q5_K_ref(const void *x, float *y, int64_t n);
void kern__dequantize_q3_K_ref(const void *x, float *y, int64_t n);
void kern__dequantize_q2_K_ref(const void *x, float *y, int64_t n);
void kern__dequantize_iq4_nl_ref(const void *x, float *y, int64_t n);
void kern__dequantize_iq4_xs_ref(const void *x, float *y, int64_t n);
void kern__dequantize_tq1_0_ref(const void *x, float *y, int64_t n);
void kern__dequantize_tq2_0_ref(const void *x, float *y, int64_t n);
void kern__dequantize_mxfp4_ref(const void *x, float *y, int64_t n);
void kern__dequantize_iq2_xxs_ref(const void *x, float *y, int64_t n);
void kern__dequantize_iq2_xs_ref(const void *x, float *y, int64_t n);
void kern__dequantize_iq2_s_ref(const void *x, float *y, int64_t n);
void kern__dequantize_iq3_xxs_ref(const void *x, float *y, int64_t n);
void kern__dequantize_iq3_s_ref(const void *x, float *y, int64_t n);
void kern__dequantize_iq1_s_ref(const void *x, float *y, int64_t n);
void kern__dequantize_iq1_m_ref(const void *x, float *y, int64_t n);

/* Vector ops (kern_vtab fields of the same names). */
float kern__dot_f32_ref(int64_t n, const float *a, const float *b);
void kern__axpy_f32_ref(int64_t n, float a, const float *x, float *y);
/* KV attention ops (kern_vtab.dot_rows / axpy_rows / kv_store[type]): the
 * typed ones dequantize each element exactly, then do what the F32 one does. */
void kern__dot_rows_f32_ref(int64_t n, int G, const float *q, const void *k, size_t k_stride,
                            int rows, float scale, float *out, size_t o_stride);
void kern__dot_rows_f16_ref(int64_t n, int G, const float *q, const void *k, size_t k_stride,
                            int rows, float scale, float *out, size_t o_stride);
void kern__dot_rows_q8_0_ref(int64_t n, int G, const float *q, const void *k, size_t k_stride,
                             int rows, float scale, float *out, size_t o_stride);
void kern__axpy_rows_f32_ref(int64_t n, int G, const float *s, size_t s_stride, const void *v,
                             size_t v_stride, int rows, float *y);
void kern__axpy_rows_f16_ref(int64_t n, int G, const float *s, size_t s_stride, const void *v,
                             size_t v_stride, int rows, float *y);
void kern__axpy_rows_q8_0_ref(int64_t n, int G, const float *s, size_t s_stride, const void *v,
                              size_t v_stride, int rows, float *y);
void kern__rmsnorm_ref(int64_t n, const float *x, const float *w, float eps, float *y);
/* The gated delta rule's step (kern.h gdn_step): reference, AVX2, AVX-512. */
void kern__gdn_step_ref(int S, float *const *rows, const float *q, const float *k, const float *v,
                        float decay, float beta, float *out);
void kern__avx2_gdn_step(int S, float *const *rows, const float *q, const float *k,
                         const float *v, float decay, float beta, float *out);
void kern__a512_gdn_step(int S, float *const *rows, const float *q, const float *k,
                         const float *v, float decay, float beta, float *out);
/* n rounds of 16 independent vpdpbusd (AVX512-VNNI) chains on registers;
 * returns their lanes' sum (avx512_vec.c; for kern_int8_peak_ops). */
uint64_t kern__a512_vnni_spin(int64_t n);
void kern__silu_mul_ref(int64_t n, const float *g, const float *u, float *y);
void kern__gelu_mul_ref(int64_t n, const float *g, const float *u, float *y);
void kern__softmax_ref(int64_t n, float *x);
void kern__attn_block_ref(const kern_attn_blk *a);
void kern__attn_block_ref_bf16(const kern_attn_blk *a);

#endif /* KS_KERN_INT_H */
