/* ref.c — the scalar reference kernels: the spec, the fallback and the test
 * oracle for avx2.c / avx512.c (STYLE.md section 9). Plain C11, no
 * intrinsics, no -march.
 *
 * Accumulation order (the documented spec the SIMD tolerances are measured
 * against): every reduction sums in double, in increasing k (or block) order,
 * and rounds to float once at the end. Each term is exact (a product of two
 * floats, or an integer block dot product) or rounded once (a block term
 * d_w * d_x * isum). Quantizers are deterministic and round half to even
 * (lrintf under the default rounding mode, the same as cvtps2dq).
 * Block layouts: kern_int.h. */
#include "kern/kern_int.h"

#include <float.h>
#include <math.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Small helpers

/* f16 bits of the smallest f16 >= v (v >= 0, finite): scales rounded up so
 * the 6/8-bit sub-scales derived from them never overflow their range. */
static uint16_t ref__f16_ceil(float v) {
    uint16_t h = ks_f32_to_f16(v);
    if (ks_f16_to_f32(h) < v) h++;
    return h;
}

/* Loads element k of an f32 row that may be unaligned (kern.h: W and X
 * pointers need no alignment). */
static float ref__ldf(const void *p, int64_t k) {
    float v;
    memcpy(&v, (const uint8_t *)p + 4 * k, 4);
    return v;
}

static int ref__clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// ----------------------------------------------------------------------------
// Row dot products (one matmul output element each)

float kern__dot_row_f32_ref(int64_t K, const void *w, const void *x) {
    double s = 0.0;
    for (int64_t k = 0; k < K; k++) s += (double)ref__ldf(w, k) * (double)ref__ldf(x, k);
    return (float)s;
}

float kern__dot_row_f16_ref(int64_t K, const void *w, const void *x) {
    const uint8_t *a = w; // (K) f16, possibly unaligned
    double s = 0.0;
    for (int64_t k = 0; k < K; k++) {
        uint16_t h;
        memcpy(&h, a + 2 * k, 2);
        s += (double)ks_f16_to_f32(h) * (double)ref__ldf(x, k);
    }
    return (float)s;
}

float kern__dot_row_bf16_ref(int64_t K, const void *w, const void *x) {
    const uint8_t *a = w; // (K) bf16, possibly unaligned
    double s = 0.0;
    for (int64_t k = 0; k < K; k++) {
        uint16_t h;
        memcpy(&h, a + 2 * k, 2);
        s += (double)ks_bf16_to_f32(h) * (double)ref__ldf(x, k);
    }
    return (float)s;
}

float kern__dot_row_q8_0_ref(int64_t K, const void *w, const void *x) {
    const kern_block_q8_0 *a = w, *b = x;
    double s = 0.0;
    for (int64_t i = 0; i < K / KERN_QK8_0; i++) {
        int32_t isum = 0;
        for (int j = 0; j < 32; j++) isum += (int32_t)a[i].qs[j] * b[i].qs[j];
        s += (double)ks_f16_to_f32(a[i].d) * (double)ks_f16_to_f32(b[i].d) * (double)isum;
    }
    return (float)s;
}

float kern__dot_row_q4_0_ref(int64_t K, const void *w, const void *x) {
    const kern_block_q4_0 *a = w;
    const kern_block_q8_0 *b = x;
    double s = 0.0;
    for (int64_t i = 0; i < K / KERN_QK8_0; i++) {
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) {
            isum += ((a[i].qs[j] & 15) - 8) * b[i].qs[j];
            isum += ((a[i].qs[j] >> 4) - 8) * b[i].qs[j + 16];
        }
        s += (double)ks_f16_to_f32(a[i].d) * (double)ks_f16_to_f32(b[i].d) * (double)isum;
    }
    return (float)s;
}

float kern__dot_row_q4_K_ref(int64_t K, const void *w, const void *x) {
    const kern_block_q4_K *a = w;
    const kern_block_q8_K *b = x;
    double s = 0.0;
    for (int64_t i = 0; i < K / KERN_QK_K; i++) {
        int32_t isum = 0, msum = 0; // sum sc*q*x, sum m*x (exact)
        for (int j = 0; j < 8; j++) {
            int sc, m;
            kern__q4k_scale_min(a[i].scales, j, &sc, &m);
            const uint8_t *q = a[i].qs + 32 * (j / 2);
            const int8_t *y = b[i].qs + 32 * j;
            int shift = (j & 1) ? 4 : 0;
            int32_t sub = 0;
            for (int l = 0; l < 32; l++) sub += ((q[l] >> shift) & 15) * y[l];
            isum += sc * sub;
            msum += m * (b[i].bsums[2 * j] + b[i].bsums[2 * j + 1]);
        }
        double dx = b[i].d;
        s += (double)ks_f16_to_f32(a[i].d) * dx * (double)isum -
             (double)ks_f16_to_f32(a[i].dmin) * dx * (double)msum;
    }
    return (float)s;
}

/* Unpacks the 256 6-bit values of a Q6_K block to q - 32 in [-32, 31]
 * (layout: kern_int.h). */
static void ref__q6k_unpack(const kern_block_q6_K *b, int8_t *q) {
    for (int n = 0; n < 2; n++)
        for (int t = 0; t < 32; t++) {
            const uint8_t l0 = b->ql[64 * n + t], l1 = b->ql[64 * n + 32 + t], h = b->qh[32 * n + t];
            int8_t *o = q + 128 * n + t;
            o[0] = (int8_t)(((l0 & 15) | ((h >> 0) & 3) << 4) - 32);
            o[32] = (int8_t)(((l1 & 15) | ((h >> 2) & 3) << 4) - 32);
            o[64] = (int8_t)(((l0 >> 4) | ((h >> 4) & 3) << 4) - 32);
            o[96] = (int8_t)(((l1 >> 4) | ((h >> 6) & 3) << 4) - 32);
        }
}

float kern__dot_row_q6_K_ref(int64_t K, const void *w, const void *x) {
    const kern_block_q6_K *a = w;
    const kern_block_q8_K *b = x;
    double s = 0.0;
    for (int64_t i = 0; i < K / KERN_QK_K; i++) {
        int8_t q[KERN_QK_K];
        ref__q6k_unpack(&a[i], q);
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) { // sub-block j: elements 16j .. 16j+15
            int32_t sub = 0;
            for (int l = 0; l < 16; l++) sub += q[16 * j + l] * b[i].qs[16 * j + l];
            isum += a[i].scales[j] * sub;
        }
        s += (double)ks_f16_to_f32(a[i].d) * (double)b[i].d * (double)isum;
    }
    return (float)s;
}

// 32-element types beside Q8_0 / Q4_0; all multiply Q8_0 activations. The
// offset types (Q4_1, Q5_1: value = d*q + m) add m * d_x * sum(x.qs), the
// activation block sum taken exactly from the qs (kern_int.h, Q4_1).

/* The 32 values q of a Q4_0-packed nibble block, in element order. */
static void ref__nibbles(const uint8_t *qs, int *q) {
    for (int j = 0; j < 16; j++) {
        q[j] = qs[j] & 15;
        q[j + 16] = qs[j] >> 4;
    }
}

/* The 32 values of a Q5 block (nibbles plus bit 4 from qh). */
static void ref__q5(const uint8_t *qh, const uint8_t *qs, int *q) {
    uint32_t h =
        (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    ref__nibbles(qs, q);
    for (int j = 0; j < 32; j++)
        q[j] |= (int)((h >> j) & 1) << 4;
}

/* Sum of w_q[j] * x.qs[j] and of x.qs[j] over one block (exact). */
static int32_t ref__isum32(const int *wq, const kern_block_q8_0 *x, int32_t *xsum) {
    int32_t s = 0, sx = 0;
    for (int j = 0; j < 32; j++) {
        s += wq[j] * x->qs[j];
        sx += x->qs[j];
    }
    *xsum = sx;
    return s;
}

float kern__dot_row_q4_1_ref(int64_t K, const void *w, const void *x) {
    const kern_block_q4_1 *a = w;
    const kern_block_q8_0 *b = x;
    double s = 0.0;
    for (int64_t i = 0; i < K / KERN_QK8_0; i++) {
        int q[32];
        int32_t xsum;
        ref__nibbles(a[i].qs, q);
        int32_t isum = ref__isum32(q, &b[i], &xsum);
        double dx = ks_f16_to_f32(b[i].d);
        s += (double)ks_f16_to_f32(a[i].d) * dx * (double)isum +
             (double)ks_f16_to_f32(a[i].m) * dx * (double)xsum;
    }
    return (float)s;
}

float kern__dot_row_q5_0_ref(int64_t K, const void *w, const void *x) {
    const kern_block_q5_0 *a = w;
    const kern_block_q8_0 *b = x;
    double s = 0.0;
    for (int64_t i = 0; i < K / KERN_QK8_0; i++) {
        int q[32];
        int32_t xsum;
        ref__q5(a[i].qh, a[i].qs, q);
        int32_t isum = ref__isum32(q, &b[i], &xsum) - 16 * xsum; // sum (q - 16) * x
        s += (double)ks_f16_to_f32(a[i].d) * (double)ks_f16_to_f32(b[i].d) * (double)isum;
    }
    return (float)s;
}

float kern__dot_row_q5_1_ref(int64_t K, const void *w, const void *x) {
    const kern_block_q5_1 *a = w;
    const kern_block_q8_0 *b = x;
    double s = 0.0;
    for (int64_t i = 0; i < K / KERN_QK8_0; i++) {
        int q[32];
        int32_t xsum;
        ref__q5(a[i].qh, a[i].qs, q);
        int32_t isum = ref__isum32(q, &b[i], &xsum);
        double dx = ks_f16_to_f32(b[i].d);
        s += (double)ks_f16_to_f32(a[i].d) * dx * (double)isum +
             (double)ks_f16_to_f32(a[i].m) * dx * (double)xsum;
    }
    return (float)s;
}

float kern__dot_row_iq4_nl_ref(int64_t K, const void *w, const void *x) {
    const kern_block_iq4_nl *a = w;
    const kern_block_q8_0 *b = x;
    double s = 0.0;
    for (int64_t i = 0; i < K / KERN_QK8_0; i++) {
        int q[32];
        int32_t xsum;
        ref__nibbles(a[i].qs, q);
        for (int j = 0; j < 32; j++)
            q[j] = kern_iq4nl_values[q[j]];
        int32_t isum = ref__isum32(q, &b[i], &xsum);
        s += (double)ks_f16_to_f32(a[i].d) * (double)ks_f16_to_f32(b[i].d) * (double)isum;
    }
    return (float)s;
}

float kern__dot_row_mxfp4_ref(int64_t K, const void *w, const void *x) {
    const kern_block_mxfp4 *a = w;
    const kern_block_q8_0 *b = x;
    double s = 0.0;
    for (int64_t i = 0; i < K / KERN_QK8_0; i++) {
        int q[32];
        int32_t xsum;
        ref__nibbles(a[i].qs, q);
        for (int j = 0; j < 32; j++)
            q[j] = kern_mxfp4_values[q[j]];
        int32_t isum = ref__isum32(q, &b[i], &xsum);
        s += (double)kern__e8m0_half(a[i].e) * (double)ks_f16_to_f32(b[i].d) * (double)isum;
    }
    return (float)s;
}

// K-quants beside Q4_K / Q6_K, and IQ4_XS: Q8_K activations. Per super-block
// the integer sums are exact (the Q3_K "-4" and the Q2_K / Q5_K mins through
// bsums); one double term per super-block scale.

/* The 256 values q (0..31) of a Q5_K block in element order. */
static void ref__q5k_unpack(const kern_block_q5_K *b, int *q) {
    for (int j = 0; j < 8; j++) {
        const uint8_t *qs = b->qs + 32 * (j / 2);
        for (int l = 0; l < 32; l++)
            q[32 * j + l] = ((qs[l] >> (4 * (j & 1))) & 15) | ((b->qh[l] >> j) & 1) << 4;
    }
}

/* The 256 2-bit values of a Q2_K / Q3_K qs[64] in element order. */
static void ref__q2_unpack(const uint8_t *qs, int *q) {
    for (int e = 0; e < KERN_QK_K; e++) {
        int n = e / 128, j = (e % 128) / 32, l = e % 32;
        q[e] = (qs[32 * n + l] >> (2 * j)) & 3;
    }
}

/* The 256 values q - 4 (-4..3) of a Q3_K block in element order. */
static void ref__q3k_unpack(const kern_block_q3_K *b, int *q) {
    ref__q2_unpack(b->qs, q);
    for (int e = 0; e < KERN_QK_K; e++) {
        int n = e / 128, j = (e % 128) / 32, l = e % 32;
        q[e] |= ((b->hmask[l] >> (4 * n + j)) & 1) << 2;
        q[e] -= 4;
    }
}

float kern__dot_row_q5_K_ref(int64_t K, const void *w, const void *x) {
    const kern_block_q5_K *a = w;
    const kern_block_q8_K *b = x;
    double s = 0.0;
    for (int64_t i = 0; i < K / KERN_QK_K; i++) {
        int q[KERN_QK_K];
        ref__q5k_unpack(&a[i], q);
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            kern__q4k_scale_min(a[i].scales, j, &sc, &m);
            int32_t sub = 0;
            for (int l = 0; l < 32; l++)
                sub += q[32 * j + l] * b[i].qs[32 * j + l];
            isum += sc * sub;
            msum += m * (b[i].bsums[2 * j] + b[i].bsums[2 * j + 1]);
        }
        double dx = b[i].d;
        s += (double)ks_f16_to_f32(a[i].d) * dx * (double)isum -
             (double)ks_f16_to_f32(a[i].dmin) * dx * (double)msum;
    }
    return (float)s;
}

float kern__dot_row_q3_K_ref(int64_t K, const void *w, const void *x) {
    const kern_block_q3_K *a = w;
    const kern_block_q8_K *b = x;
    double s = 0.0;
    for (int64_t i = 0; i < K / KERN_QK_K; i++) {
        int q[KERN_QK_K];
        ref__q3k_unpack(&a[i], q);
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) {
            int32_t sub = 0;
            for (int l = 0; l < 16; l++)
                sub += q[16 * j + l] * b[i].qs[16 * j + l];
            isum += (kern__q3k_scale(a[i].scales, j) - 32) * sub;
        }
        s += (double)ks_f16_to_f32(a[i].d) * (double)b[i].d * (double)isum;
    }
    return (float)s;
}

float kern__dot_row_q2_K_ref(int64_t K, const void *w, const void *x) {
    const kern_block_q2_K *a = w;
    const kern_block_q8_K *b = x;
    double s = 0.0;
    for (int64_t i = 0; i < K / KERN_QK_K; i++) {
        int q[KERN_QK_K];
        ref__q2_unpack(a[i].qs, q);
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 16; j++) {
            int32_t sub = 0;
            for (int l = 0; l < 16; l++)
                sub += q[16 * j + l] * b[i].qs[16 * j + l];
            isum += (a[i].scales[j] & 15) * sub;
            msum += (a[i].scales[j] >> 4) * b[i].bsums[j];
        }
        double dx = b[i].d;
        s += (double)ks_f16_to_f32(a[i].d) * dx * (double)isum -
             (double)ks_f16_to_f32(a[i].dmin) * dx * (double)msum;
    }
    return (float)s;
}

float kern__dot_row_iq4_xs_ref(int64_t K, const void *w, const void *x) {
    const kern_block_iq4_xs *a = w;
    const kern_block_q8_K *b = x;
    double s = 0.0;
    for (int64_t i = 0; i < K / KERN_QK_K; i++) {
        int32_t isum = 0;
        for (int j = 0; j < 8; j++) {
            int q[32];
            ref__nibbles(a[i].qs + 16 * j, q);
            int32_t sub = 0;
            for (int l = 0; l < 32; l++)
                sub += kern_iq4nl_values[q[l]] * b[i].qs[32 * j + l];
            isum += (kern__iq4xs_scale(&a[i], j) - 32) * sub;
        }
        s += (double)ks_f16_to_f32(a[i].d) * (double)b[i].d * (double)isum;
    }
    return (float)s;
}

// TQ1_0 / TQ2_0 (ternary) x Q8_K: one scale per super-block, so one exact
// integer sum of (t - 1) * x per super-block and one double term.

/* The 256 values t - 1 (-1..1) of a TQ1_0 block in element order. */
static void ref__tq1_unpack(const kern_block_tq1_0 *b, int *q) {
    for (int n = 0; n < 5; n++) {
        for (int m = 0; m < 32; m++)
            q[32 * n + m] = kern__tq1_digit(b->qs[m], n) - 1;
        for (int m = 0; m < 16; m++)
            q[160 + 16 * n + m] = kern__tq1_digit(b->qs[32 + m], n) - 1;
    }
    for (int n = 0; n < 4; n++)
        for (int j = 0; j < 4; j++)
            q[240 + 4 * n + j] = kern__tq1_digit(b->qh[j], n) - 1;
}

float kern__dot_row_tq1_0_ref(int64_t K, const void *w, const void *x) {
    const kern_block_tq1_0 *a = w;
    const kern_block_q8_K *b = x;
    double s = 0.0;
    for (int64_t i = 0; i < K / KERN_QK_K; i++) {
        int q[KERN_QK_K];
        ref__tq1_unpack(&a[i], q);
        int32_t isum = 0;
        for (int e = 0; e < KERN_QK_K; e++)
            isum += q[e] * b[i].qs[e];
        s += (double)ks_f16_to_f32(a[i].d) * (double)b[i].d * (double)isum;
    }
    return (float)s;
}

float kern__dot_row_tq2_0_ref(int64_t K, const void *w, const void *x) {
    const kern_block_tq2_0 *a = w;
    const kern_block_q8_K *b = x;
    double s = 0.0;
    for (int64_t i = 0; i < K / KERN_QK_K; i++) {
        int q[KERN_QK_K];
        ref__q2_unpack(a[i].qs, q);
        int32_t isum = 0;
        for (int e = 0; e < KERN_QK_K; e++)
            isum += (q[e] - 1) * b[i].qs[e];
        s += (double)ks_f16_to_f32(a[i].d) * (double)b[i].d * (double)isum;
    }
    return (float)s;
}

// ----------------------------------------------------------------------------
// Matmuls: Y[c*y_stride + r] = dot(W row r, X row c), one element at a time.

#define REF_MATMUL(name, dotfn)                                                         \
    void kern__matmul_##name##_ref(int64_t K, int n_rows, int n_cols, const void *W,     \
                                   size_t w_stride, const void *X, size_t x_stride,     \
                                   float *Y, size_t y_stride) {                         \
        for (int c = 0; c < n_cols; c++) {                                              \
            const uint8_t *xr = (const uint8_t *)X + (size_t)c * x_stride;              \
            for (int r = 0; r < n_rows; r++)                                            \
                Y[(size_t)c * y_stride + r] =                                           \
                    dotfn(K, (const uint8_t *)W + (size_t)r * w_stride, xr);            \
        }                                                                               \
    }

REF_MATMUL(f32, kern__dot_row_f32_ref)
REF_MATMUL(f16, kern__dot_row_f16_ref)
REF_MATMUL(bf16, kern__dot_row_bf16_ref)
REF_MATMUL(q8_0, kern__dot_row_q8_0_ref)
REF_MATMUL(q4_0, kern__dot_row_q4_0_ref)
REF_MATMUL(q4_K, kern__dot_row_q4_K_ref)
REF_MATMUL(q6_K, kern__dot_row_q6_K_ref)
REF_MATMUL(q4_1, kern__dot_row_q4_1_ref)
REF_MATMUL(q5_0, kern__dot_row_q5_0_ref)
REF_MATMUL(q5_1, kern__dot_row_q5_1_ref)
REF_MATMUL(iq4_nl, kern__dot_row_iq4_nl_ref)
REF_MATMUL(q5_K, kern__dot_row_q5_K_ref)
REF_MATMUL(q3_K, kern__dot_row_q3_K_ref)
REF_MATMUL(q2_K, kern__dot_row_q2_K_ref)
REF_MATMUL(iq4_xs, kern__dot_row_iq4_xs_ref)
REF_MATMUL(tq1_0, kern__dot_row_tq1_0_ref)
REF_MATMUL(tq2_0, kern__dot_row_tq2_0_ref)
REF_MATMUL(mxfp4, kern__dot_row_mxfp4_ref)

// ----------------------------------------------------------------------------
// Activation quantizers

void kern__quantize_f32_ref(const float *x, void *y, int64_t n) {
    memmove(y, x, (size_t)n * sizeof(float));
}

void kern__quantize_q8_0_ref(const float *x, void *y, int64_t n) {
    kern_block_q8_0 *b = y;
    for (int64_t i = 0; i < n / KERN_QK8_0; i++) {
        const float *xb = x + 32 * i;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        uint16_t d16 = ks_f32_to_f16(amax / 127.0f);
        float d = ks_f16_to_f32(d16);
        float id = d != 0.0f ? 1.0f / d : 0.0f; // of the stored d: error <= d/2
        b[i].d = d16;
        for (int j = 0; j < 32; j++)
            b[i].qs[j] = (int8_t)ref__clampi((int)lrintf(xb[j] * id), -127, 127);
    }
}

void kern__quantize_q8_K_ref(const float *x, void *y, int64_t n) {
    kern_block_q8_K *b = y;
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        const float *xb = x + KERN_QK_K * i;
        float amax = 0.0f;
        for (int j = 0; j < KERN_QK_K; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = d;
        for (int j = 0; j < KERN_QK_K; j++)
            b[i].qs[j] = (int8_t)ref__clampi((int)lrintf(xb[j] * id), -127, 127);
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += b[i].qs[16 * j + l];
            b[i].bsums[j] = (int16_t)s;
        }
    }
}

// ----------------------------------------------------------------------------
// Weight quantizers. Sub-block scales are rounded *up* (ceil) so every
// element is inside the representable range: error <= step/2, except the
// one-sided symmetric formats (Q4_0, Q6_K) whose positive extreme may clamp
// (error <= step), as in ggml.

void kern__quantize_f16_ref(const float *x, void *y, int64_t n) {
    uint8_t *o = y;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = ks_f32_to_f16(x[i]);
        memcpy(o + 2 * i, &h, 2);
    }
}

void kern__quantize_bf16_ref(const float *x, void *y, int64_t n) {
    uint8_t *o = y;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = ks_f32_to_bf16(x[i]);
        memcpy(o + 2 * i, &h, 2);
    }
}

void kern__quantize_q4_0_ref(const float *x, void *y, int64_t n) {
    kern_block_q4_0 *b = y;
    for (int64_t i = 0; i < n / KERN_QK8_0; i++) {
        const float *xb = x + 32 * i;
        float amax = 0.0f, mx = 0.0f; // mx: the signed value of largest magnitude
        for (int j = 0; j < 32; j++)
            if (fabsf(xb[j]) > amax) amax = fabsf(xb[j]), mx = xb[j];
        uint16_t d16 = ks_f32_to_f16(mx / -8.0f); // mx maps to q=0, i.e. -8*d
        float d = ks_f16_to_f32(d16);
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = d16;
        for (int j = 0; j < 16; j++) {
            int lo = ref__clampi((int)lrintf(xb[j] * id) + 8, 0, 15);
            int hi = ref__clampi((int)lrintf(xb[j + 16] * id) + 8, 0, 15);
            b[i].qs[j] = (uint8_t)(lo | hi << 4);
        }
    }
}

void kern__quantize_q4_K_ref(const float *x, void *y, int64_t n) {
    kern_block_q4_K *b = y;
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        const float *xb = x + KERN_QK_K * i;
        float lo[8], hi[8], need[8], max_min = 0.0f, max_need = 0.0f;
        for (int j = 0; j < 8; j++) {
            lo[j] = 0.0f; // the offset is -dmin*m with m >= 0, so min <= 0
            hi[j] = -INFINITY;
            for (int l = 0; l < 32; l++) {
                lo[j] = fminf(lo[j], xb[32 * j + l]);
                hi[j] = fmaxf(hi[j], xb[32 * j + l]);
            }
            max_min = fmaxf(max_min, -lo[j]);
        }
        uint16_t dmin16 = ref__f16_ceil(max_min / 63.0f);
        float dmin = ks_f16_to_f32(dmin16);
        int sc[8], m[8];
        for (int j = 0; j < 8; j++) {
            m[j] = dmin > 0.0f ? ref__clampi((int)ceilf(-lo[j] / dmin), 0, 63) : 0;
            need[j] = (hi[j] + dmin * (float)m[j]) / 15.0f; // step covering [-dmin*m, hi]
            max_need = fmaxf(max_need, need[j]);
        }
        uint16_t d16 = ref__f16_ceil(max_need / 63.0f);
        float d = ks_f16_to_f32(d16);
        for (int j = 0; j < 8; j++)
            sc[j] = d > 0.0f ? ref__clampi((int)ceilf(need[j] / d), 0, 63) : 0;
        b[i].d = d16;
        b[i].dmin = dmin16;
        for (int j = 0; j < 4; j++) {
            b[i].scales[j] = (uint8_t)((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
            b[i].scales[j + 4] = (uint8_t)((m[j] & 63) | (m[j + 4] >> 4) << 6);
            b[i].scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
        }
        memset(b[i].qs, 0, sizeof b[i].qs);
        for (int j = 0; j < 8; j++) {
            float ds = d * (float)sc[j], dm = dmin * (float)m[j]; // value = ds*q - dm
            for (int l = 0; l < 32; l++) {
                int q = ds > 0.0f ? ref__clampi((int)lrintf((xb[32 * j + l] + dm) / ds), 0, 15)
                                  : 0;
                b[i].qs[32 * (j / 2) + l] |= (uint8_t)(q << ((j & 1) ? 4 : 0));
            }
        }
    }
}

void kern__quantize_q6_K_ref(const float *x, void *y, int64_t n) {
    kern_block_q6_K *b = y;
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        const float *xb = x + KERN_QK_K * i;
        float s[16], max_s = 0.0f;
        for (int j = 0; j < 16; j++) {
            float amax = 0.0f, mx = 0.0f;
            for (int l = 0; l < 16; l++)
                if (fabsf(xb[16 * j + l]) > amax) amax = fabsf(xb[16 * j + l]), mx = xb[16 * j + l];
            s[j] = mx / -32.0f; // mx maps to q-32 = -32
            max_s = fmaxf(max_s, fabsf(s[j]));
        }
        uint16_t d16 = ref__f16_ceil(max_s / 127.0f);
        float d = ks_f16_to_f32(d16);
        b[i].d = d16;
        memset(b[i].ql, 0, sizeof b[i].ql);
        memset(b[i].qh, 0, sizeof b[i].qh);
        for (int j = 0; j < 16; j++) {
            int sc = d > 0.0f ? ref__clampi((int)ceilf(fabsf(s[j]) / d), 0, 127) : 0;
            if (s[j] < 0.0f) sc = -sc;
            b[i].scales[j] = (int8_t)sc;
            float ds = d * (float)sc;
            for (int l = 0; l < 16; l++) {
                int e = 16 * j + l, nn = e / 128, g = (e % 128) / 32, t = e % 32;
                int q = ds != 0.0f ? ref__clampi((int)lrintf(xb[e] / ds), -32, 31) : 0;
                q += 32;
                b[i].ql[64 * nn + 32 * (g & 1) + t] |= (uint8_t)((q & 15) << ((g & 2) ? 4 : 0));
                b[i].qh[32 * nn + t] |= (uint8_t)((q >> 4) << (2 * g));
            }
        }
    }
}

// The types below are written by round to nearest around simple scales
// (no search, no importance weights), enough to make valid blocks for
// `kvseal mkmodel --type` and the tests; their bytes need not equal
// llama-quantize's, which searches for scales that minimize the error.

/* f16 bits of the largest f16 <= v (finite): offsets rounded down, so the
 * range they start stays at or below the block minimum. */
static uint16_t ref__f16_floor(float v) {
    uint16_t h = ks_f32_to_f16(v);
    if (ks_f16_to_f32(h) > v) h = (h & 0x8000) ? (uint16_t)(h + 1) : (uint16_t)(h - 1);
    return h;
}

/* Q4_0-packs 32 values q (0..15) into qs[16]. */
static void ref__pack_nibbles(const int *q, uint8_t *qs) {
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)(q[j] | q[j + 16] << 4);
}

/* A min-offset 32-block (Q4_1 / Q5_1): m = f16 floor of the minimum, d the
 * f16 ceiling of the step covering [m, max] with qmax steps; q[] the
 * rounded values (error <= d/2). */
static void ref__quant_min32(const float *xb, int qmax, uint16_t *d16, uint16_t *m16, int *q) {
    float lo = xb[0], hi = xb[0];
    for (int j = 1; j < 32; j++)
        lo = fminf(lo, xb[j]), hi = fmaxf(hi, xb[j]);
    *m16 = ref__f16_floor(lo);
    float m = ks_f16_to_f32(*m16);
    *d16 = ref__f16_ceil((hi - m) / (float)qmax);
    float d = ks_f16_to_f32(*d16);
    float id = d > 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++)
        q[j] = ref__clampi((int)lrintf((xb[j] - m) * id), 0, qmax);
}

void kern__quantize_q4_1_ref(const float *x, void *y, int64_t n) {
    kern_block_q4_1 *b = y;
    for (int64_t i = 0; i < n / KERN_QK8_0; i++) {
        int q[32];
        uint16_t d16, m16; // (not &b[i].d: packed members)
        ref__quant_min32(x + 32 * i, 15, &d16, &m16, q);
        b[i].d = d16;
        b[i].m = m16;
        ref__pack_nibbles(q, b[i].qs);
    }
}

/* Q5-packs 32 values (0..31): low nibbles into qs, bit 4 into qh. */
static void ref__pack_q5(const int *q, uint8_t *qh, uint8_t *qs) {
    int lo[32];
    uint32_t h = 0;
    for (int j = 0; j < 32; j++)
        lo[j] = q[j] & 15, h |= (uint32_t)(q[j] >> 4) << j;
    ref__pack_nibbles(lo, qs);
    for (int k = 0; k < 4; k++)
        qh[k] = (uint8_t)(h >> (8 * k));
}

void kern__quantize_q5_1_ref(const float *x, void *y, int64_t n) {
    kern_block_q5_1 *b = y;
    for (int64_t i = 0; i < n / KERN_QK8_0; i++) {
        int q[32];
        uint16_t d16, m16; // (not &b[i].d: packed members)
        ref__quant_min32(x + 32 * i, 31, &d16, &m16, q);
        b[i].d = d16;
        b[i].m = m16;
        ref__pack_q5(q, b[i].qh, b[i].qs);
    }
}

void kern__quantize_q5_0_ref(const float *x, void *y, int64_t n) {
    kern_block_q5_0 *b = y;
    for (int64_t i = 0; i < n / KERN_QK8_0; i++) {
        const float *xb = x + 32 * i;
        float amax = 0.0f, mx = 0.0f; // as Q4_0: mx maps to q = 0, i.e. -16*d
        for (int j = 0; j < 32; j++)
            if (fabsf(xb[j]) > amax) amax = fabsf(xb[j]), mx = xb[j];
        b[i].d = ks_f32_to_f16(mx / -16.0f);
        float d = ks_f16_to_f32(b[i].d);
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[32];
        for (int j = 0; j < 32; j++)
            q[j] = ref__clampi((int)lrintf(xb[j] * id) + 16, 0, 31);
        ref__pack_q5(q, b[i].qh, b[i].qs);
    }
}

/* Index of the codebook value nearest v (ties: the lower index). */
static int ref__iq4_nearest(float v) {
    int best = 0;
    float be = fabsf(v - (float)kern_iq4nl_values[0]);
    for (int k = 1; k < 16; k++) {
        float e = fabsf(v - (float)kern_iq4nl_values[k]);
        if (e < be) be = e, best = k;
    }
    return best;
}

void kern__quantize_iq4_nl_ref(const float *x, void *y, int64_t n) {
    kern_block_iq4_nl *b = y;
    for (int64_t i = 0; i < n / KERN_QK8_0; i++) {
        const float *xb = x + 32 * i;
        float amax = 0.0f, mx = 0.0f; // mx maps to the -127 end of the codebook
        for (int j = 0; j < 32; j++)
            if (fabsf(xb[j]) > amax) amax = fabsf(xb[j]), mx = xb[j];
        b[i].d = ks_f32_to_f16(mx / -127.0f);
        float d = ks_f16_to_f32(b[i].d);
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[32];
        for (int j = 0; j < 32; j++)
            q[j] = ref__iq4_nearest(xb[j] * id);
        ref__pack_nibbles(q, b[i].qs);
    }
}

/* Packs 8 6-bit scales and mins the Q4_K / Q5_K way (kern_int.h). */
static void ref__pack_q4k_scales(const int *sc, const int *m, uint8_t *scales) {
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
        scales[j + 4] = (uint8_t)((m[j] & 63) | (m[j + 4] >> 4) << 6);
        scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
    }
}

/* Scales and mins of a min-offset super-block of ns sub-blocks of 256/ns
 * (Q4_K, Q5_K, Q2_K): mins m[j] <= mmax of dmin and scales sc[j] <= smax
 * of d, both rounded up, so that each sub-block's range [-dmin*m, hi] fits
 * qmax steps of d*sc; the quantizers then round to nearest (error <= ds/2). */
static void ref__kq_scales(const float *xb, int ns, int qmax, int smax, int mmax, uint16_t *d16,
                           uint16_t *dmin16, int *sc, int *m) {
    const int len = KERN_QK_K / ns;
    float lo[16], hi[16], need[16], max_min = 0.0f, max_need = 0.0f;
    for (int j = 0; j < ns; j++) {
        lo[j] = 0.0f; // the offset is -dmin*m with m >= 0, so min <= 0
        hi[j] = -INFINITY;
        for (int l = 0; l < len; l++) {
            lo[j] = fminf(lo[j], xb[len * j + l]);
            hi[j] = fmaxf(hi[j], xb[len * j + l]);
        }
        max_min = fmaxf(max_min, -lo[j]);
    }
    *dmin16 = ref__f16_ceil(max_min / (float)mmax);
    float dmin = ks_f16_to_f32(*dmin16);
    for (int j = 0; j < ns; j++) {
        m[j] = dmin > 0.0f ? ref__clampi((int)ceilf(-lo[j] / dmin), 0, mmax) : 0;
        need[j] = (hi[j] + dmin * (float)m[j]) / (float)qmax;
        max_need = fmaxf(max_need, need[j]);
    }
    *d16 = ref__f16_ceil(max_need / (float)smax);
    float d = ks_f16_to_f32(*d16);
    for (int j = 0; j < ns; j++)
        sc[j] = d > 0.0f ? ref__clampi((int)ceilf(need[j] / d), 0, smax) : 0;
}

/* q = round((x + dmin*m) / (d*sc)) in [0, qmax] for element e of a block. */
static int ref__kq_value(float x, float d, float dmin, int sc, int m, int qmax) {
    float ds = d * (float)sc, dm = dmin * (float)m;
    return ds > 0.0f ? ref__clampi((int)lrintf((x + dm) / ds), 0, qmax) : 0;
}

void kern__quantize_q5_K_ref(const float *x, void *y, int64_t n) {
    kern_block_q5_K *b = y;
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        const float *xb = x + KERN_QK_K * i;
        int sc[8], m[8];
        uint16_t d16, dmin16;
        ref__kq_scales(xb, 8, 31, 63, 63, &d16, &dmin16, sc, m);
        b[i].d = d16;
        b[i].dmin = dmin16;
        ref__pack_q4k_scales(sc, m, b[i].scales);
        float d = ks_f16_to_f32(b[i].d), dmin = ks_f16_to_f32(b[i].dmin);
        memset(b[i].qs, 0, sizeof b[i].qs);
        memset(b[i].qh, 0, sizeof b[i].qh);
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < 32; l++) {
                int q = ref__kq_value(xb[32 * j + l], d, dmin, sc[j], m[j], 31);
                b[i].qs[32 * (j / 2) + l] |= (uint8_t)((q & 15) << (4 * (j & 1)));
                b[i].qh[l] |= (uint8_t)((q >> 4) << j);
            }
    }
}

void kern__quantize_q2_K_ref(const float *x, void *y, int64_t n) {
    kern_block_q2_K *b = y;
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        const float *xb = x + KERN_QK_K * i;
        int sc[16], m[16];
        uint16_t d16, dmin16;
        ref__kq_scales(xb, 16, 3, 15, 15, &d16, &dmin16, sc, m);
        b[i].d = d16;
        b[i].dmin = dmin16;
        float d = ks_f16_to_f32(b[i].d), dmin = ks_f16_to_f32(b[i].dmin);
        for (int j = 0; j < 16; j++)
            b[i].scales[j] = (uint8_t)(sc[j] | m[j] << 4);
        memset(b[i].qs, 0, sizeof b[i].qs);
        for (int e = 0; e < KERN_QK_K; e++) {
            int q = ref__kq_value(xb[e], d, dmin, sc[e / 16], m[e / 16], 3);
            int nn = e / 128, j = (e % 128) / 32, l = e % 32;
            b[i].qs[32 * nn + l] |= (uint8_t)(q << (2 * j));
        }
    }
}

void kern__quantize_q3_K_ref(const float *x, void *y, int64_t n) {
    kern_block_q3_K *b = y;
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        const float *xb = x + KERN_QK_K * i;
        float s[16], max_s = 0.0f; // as Q6_K: the largest |x| maps to q - 4 = -4
        for (int j = 0; j < 16; j++) {
            float amax = 0.0f, mx = 0.0f;
            for (int l = 0; l < 16; l++)
                if (fabsf(xb[16 * j + l]) > amax) amax = fabsf(xb[16 * j + l]), mx = xb[16 * j + l];
            s[j] = mx / -4.0f;
            max_s = fmaxf(max_s, fabsf(s[j]));
        }
        b[i].d = ref__f16_ceil(max_s / 31.0f);
        float d = ks_f16_to_f32(b[i].d);
        memset(b[i].scales, 0, sizeof b[i].scales);
        memset(b[i].qs, 0, sizeof b[i].qs);
        memset(b[i].hmask, 0, sizeof b[i].hmask);
        for (int j = 0; j < 16; j++) {
            int sc = d > 0.0f ? ref__clampi((int)ceilf(fabsf(s[j]) / d), 0, 31) : 0;
            if (s[j] < 0.0f) sc = -sc;
            int u = sc + 32; // stored 6-bit
            if (j < 8)
                b[i].scales[j] |= (uint8_t)(u & 15);
            else
                b[i].scales[j - 8] |= (uint8_t)((u & 15) << 4);
            b[i].scales[8 + j % 4] |= (uint8_t)((u >> 4) << (2 * (j / 4)));
            float ds = d * (float)sc;
            for (int l = 0; l < 16; l++) {
                int e = 16 * j + l, nn = e / 128, g = (e % 128) / 32, t = e % 32;
                int q = (ds != 0.0f ? ref__clampi((int)lrintf(xb[e] / ds), -4, 3) : 0) + 4;
                b[i].qs[32 * nn + t] |= (uint8_t)((q & 3) << (2 * g));
                b[i].hmask[t] |= (uint8_t)((q >> 2) << (4 * nn + g));
            }
        }
    }
}

void kern__quantize_iq4_xs_ref(const float *x, void *y, int64_t n) {
    kern_block_iq4_xs *b = y;
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        const float *xb = x + KERN_QK_K * i;
        float s[8], max_s = 0.0f; // sub-block scale: its largest |x| maps to -127
        for (int j = 0; j < 8; j++) {
            float amax = 0.0f, mx = 0.0f;
            for (int l = 0; l < 32; l++)
                if (fabsf(xb[32 * j + l]) > amax) amax = fabsf(xb[32 * j + l]), mx = xb[32 * j + l];
            s[j] = mx / -127.0f;
            max_s = fmaxf(max_s, fabsf(s[j]));
        }
        b[i].d = ref__f16_ceil(max_s / 31.0f);
        float d = ks_f16_to_f32(b[i].d);
        b[i].scales_h = 0;
        memset(b[i].scales_l, 0, sizeof b[i].scales_l);
        for (int j = 0; j < 8; j++) {
            int sc = d > 0.0f ? ref__clampi((int)ceilf(fabsf(s[j]) / d), 0, 31) : 0;
            if (s[j] < 0.0f) sc = -sc;
            int u = sc + 32;
            b[i].scales_l[j / 2] |= (uint8_t)((u & 15) << (4 * (j % 2)));
            b[i].scales_h |= (uint16_t)((u >> 4) << (2 * j));
            float dl = d * (float)sc, id = dl != 0.0f ? 1.0f / dl : 0.0f;
            int q[32];
            for (int l = 0; l < 32; l++)
                q[l] = ref__iq4_nearest(xb[32 * j + l] * id);
            ref__pack_nibbles(q, b[i].qs + 16 * j);
        }
    }
}

/* Ternary digits t = round(x / d) + 1 (0..2) of a TQ super-block, d the
 * f16 of its largest |x| (returned). */
static uint16_t ref__tq_digits(const float *xb, int *t) {
    float amax = 0.0f;
    for (int e = 0; e < KERN_QK_K; e++)
        amax = fmaxf(amax, fabsf(xb[e]));
    uint16_t dh = ks_f32_to_f16(amax);
    float d = ks_f16_to_f32(dh), id = d > 0.0f ? 1.0f / d : 0.0f;
    for (int e = 0; e < KERN_QK_K; e++)
        t[e] = ref__clampi((int)lrintf(xb[e] * id), -1, 1) + 1;
    return dh;
}

/* The TQ1_0 byte of n (4 or 5) digits, most significant first: the base-3
 * number over 3^5 as a fraction of 256, rounded up (kern__tq1_digit reads
 * it back); 4 digits are followed by a 0. */
static uint8_t ref__tq1_byte(const int *t, int stride, int n) {
    int v = 0;
    for (int k = 0; k < 5; k++)
        v = 3 * v + (k < n ? t[k * stride] : 0);
    return (uint8_t)((v * 256 + 242) / 243);
}

void kern__quantize_tq1_0_ref(const float *x, void *y, int64_t n) {
    kern_block_tq1_0 *b = y;
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        int t[KERN_QK_K];
        b[i].d = ref__tq_digits(x + KERN_QK_K * i, t);
        for (int m = 0; m < 32; m++)
            b[i].qs[m] = ref__tq1_byte(t + m, 32, 5);
        for (int m = 0; m < 16; m++)
            b[i].qs[32 + m] = ref__tq1_byte(t + 160 + m, 16, 5);
        for (int j = 0; j < 4; j++)
            b[i].qh[j] = ref__tq1_byte(t + 240 + j, 4, 4);
    }
}

void kern__quantize_tq2_0_ref(const float *x, void *y, int64_t n) {
    kern_block_tq2_0 *b = y;
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        int t[KERN_QK_K];
        b[i].d = ref__tq_digits(x + KERN_QK_K * i, t);
        memset(b[i].qs, 0, sizeof b[i].qs);
        for (int e = 0; e < KERN_QK_K; e++) // the Q2_K order (kern_int.h)
            b[i].qs[32 * (e / 128) + e % 32] |= (uint8_t)(t[e] << (2 * ((e % 128) / 32)));
    }
}

/* MXFP4: the OCP shared exponent, floor(log2(amax)) - 2 (E2M1's largest
 * value 6 is 1.5 * 4), so amax / 2^(e - 127) lies in [4, 8) and clamps to 6
 * above it; each element takes its nearest code (ties to the lower index). */
void kern__quantize_mxfp4_ref(const float *x, void *y, int64_t n) {
    kern_block_mxfp4 *b = y;
    for (int64_t i = 0; i < n / KERN_QK8_0; i++) {
        const float *xb = x + KERN_QK8_0 * i;
        float amax = 0.0f;
        for (int l = 0; l < 32; l++)
            amax = fmaxf(amax, fabsf(xb[l]));
        int e = 0;
        if (amax > 0.0f) {
            int ex;
            (void)frexpf(amax, &ex); // amax = m * 2^ex, m in [0.5, 1): floor(log2) = ex - 1
            e = ref__clampi(ex - 1 - 2 + 127, 0, 254);
        }
        b[i].e = (uint8_t)e;
        float d = kern__e8m0_half((uint8_t)e);
        int q[32];
        for (int l = 0; l < 32; l++) {
            float v = xb[l] / d; // exact: d is a power of 2
            int best = 0;
            for (int c = 1; c < 16; c++)
                if (fabsf(v - (float)kern_mxfp4_values[c]) < fabsf(v - (float)kern_mxfp4_values[best]))
                    best = c;
            q[l] = best;
        }
        ref__pack_nibbles(q, b[i].qs);
    }
}

// ----------------------------------------------------------------------------
// Dequantizers (float op order as ggml's dequantize_row_*)

void kern__dequantize_f32_ref(const void *x, float *y, int64_t n) {
    memmove(y, x, (size_t)n * sizeof(float));
}

void kern__dequantize_f16_ref(const void *x, float *y, int64_t n) {
    const uint8_t *p = x;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        y[i] = ks_f16_to_f32(h);
    }
}

void kern__dequantize_bf16_ref(const void *x, float *y, int64_t n) {
    const uint8_t *p = x;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        y[i] = ks_bf16_to_f32(h);
    }
}

void kern__dequantize_q8_0_ref(const void *x, float *y, int64_t n) {
    const kern_block_q8_0 *b = x;
    for (int64_t i = 0; i < n / KERN_QK8_0; i++) {
        float d = ks_f16_to_f32(b[i].d);
        for (int j = 0; j < 32; j++) y[32 * i + j] = d * (float)b[i].qs[j];
    }
}

void kern__dequantize_q4_0_ref(const void *x, float *y, int64_t n) {
    const kern_block_q4_0 *b = x;
    for (int64_t i = 0; i < n / KERN_QK8_0; i++) {
        float d = ks_f16_to_f32(b[i].d);
        for (int j = 0; j < 16; j++) {
            y[32 * i + j] = d * (float)((b[i].qs[j] & 15) - 8);
            y[32 * i + j + 16] = d * (float)((b[i].qs[j] >> 4) - 8);
        }
    }
}

void kern__dequantize_q4_K_ref(const void *x, float *y, int64_t n) {
    const kern_block_q4_K *b = x;
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        float d = ks_f16_to_f32(b[i].d), dmin = ks_f16_to_f32(b[i].dmin);
        float *yb = y + KERN_QK_K * i;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            kern__q4k_scale_min(b[i].scales, j, &sc, &m);
            float ds = d * (float)sc, dm = dmin * (float)m;
            const uint8_t *q = b[i].qs + 32 * (j / 2);
            int shift = (j & 1) ? 4 : 0;
            for (int l = 0; l < 32; l++) yb[32 * j + l] = ds * (float)((q[l] >> shift) & 15) - dm;
        }
    }
}

void kern__dequantize_q6_K_ref(const void *x, float *y, int64_t n) {
    const kern_block_q6_K *b = x;
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        float d = ks_f16_to_f32(b[i].d);
        int8_t q[KERN_QK_K];
        ref__q6k_unpack(&b[i], q);
        for (int e = 0; e < KERN_QK_K; e++)
            y[KERN_QK_K * i + e] = d * (float)b[i].scales[e / 16] * (float)q[e];
    }
}

void kern__dequantize_q8_K_ref(const void *x, float *y, int64_t n) {
    const kern_block_q8_K *b = x;
    for (int64_t i = 0; i < n / KERN_QK_K; i++)
        for (int j = 0; j < KERN_QK_K; j++) y[KERN_QK_K * i + j] = b[i].d * (float)b[i].qs[j];
}

void kern__dequantize_q4_1_ref(const void *x, float *y, int64_t n) {
    const kern_block_q4_1 *b = x;
    for (int64_t i = 0; i < n / KERN_QK8_0; i++) {
        float d = ks_f16_to_f32(b[i].d), m = ks_f16_to_f32(b[i].m);
        int q[32];
        ref__nibbles(b[i].qs, q);
        for (int j = 0; j < 32; j++)
            y[32 * i + j] = d * (float)q[j] + m;
    }
}

void kern__dequantize_q5_0_ref(const void *x, float *y, int64_t n) {
    const kern_block_q5_0 *b = x;
    for (int64_t i = 0; i < n / KERN_QK8_0; i++) {
        float d = ks_f16_to_f32(b[i].d);
        int q[32];
        ref__q5(b[i].qh, b[i].qs, q);
        for (int j = 0; j < 32; j++)
            y[32 * i + j] = d * (float)(q[j] - 16);
    }
}

void kern__dequantize_q5_1_ref(const void *x, float *y, int64_t n) {
    const kern_block_q5_1 *b = x;
    for (int64_t i = 0; i < n / KERN_QK8_0; i++) {
        float d = ks_f16_to_f32(b[i].d), m = ks_f16_to_f32(b[i].m);
        int q[32];
        ref__q5(b[i].qh, b[i].qs, q);
        for (int j = 0; j < 32; j++)
            y[32 * i + j] = d * (float)q[j] + m;
    }
}

void kern__dequantize_iq4_nl_ref(const void *x, float *y, int64_t n) {
    const kern_block_iq4_nl *b = x;
    for (int64_t i = 0; i < n / KERN_QK8_0; i++) {
        float d = ks_f16_to_f32(b[i].d);
        int q[32];
        ref__nibbles(b[i].qs, q);
        for (int j = 0; j < 32; j++)
            y[32 * i + j] = d * (float)kern_iq4nl_values[q[j]];
    }
}

void kern__dequantize_q5_K_ref(const void *x, float *y, int64_t n) {
    const kern_block_q5_K *b = x;
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        float d = ks_f16_to_f32(b[i].d), dmin = ks_f16_to_f32(b[i].dmin);
        int q[KERN_QK_K];
        ref__q5k_unpack(&b[i], q);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            kern__q4k_scale_min(b[i].scales, j, &sc, &m);
            float ds = d * (float)sc, dm = dmin * (float)m;
            for (int l = 0; l < 32; l++)
                y[KERN_QK_K * i + 32 * j + l] = ds * (float)q[32 * j + l] - dm;
        }
    }
}

void kern__dequantize_q3_K_ref(const void *x, float *y, int64_t n) {
    const kern_block_q3_K *b = x;
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        float d = ks_f16_to_f32(b[i].d);
        int q[KERN_QK_K];
        ref__q3k_unpack(&b[i], q);
        for (int e = 0; e < KERN_QK_K; e++)
            y[KERN_QK_K * i + e] =
                d * (float)(kern__q3k_scale(b[i].scales, e / 16) - 32) * (float)q[e];
    }
}

void kern__dequantize_q2_K_ref(const void *x, float *y, int64_t n) {
    const kern_block_q2_K *b = x;
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        float d = ks_f16_to_f32(b[i].d), dmin = ks_f16_to_f32(b[i].dmin);
        int q[KERN_QK_K];
        ref__q2_unpack(b[i].qs, q);
        for (int e = 0; e < KERN_QK_K; e++) {
            uint8_t s = b[i].scales[e / 16];
            y[KERN_QK_K * i + e] = d * (float)(s & 15) * (float)q[e] - dmin * (float)(s >> 4);
        }
    }
}

void kern__dequantize_iq4_xs_ref(const void *x, float *y, int64_t n) {
    const kern_block_iq4_xs *b = x;
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        float d = ks_f16_to_f32(b[i].d);
        for (int j = 0; j < 8; j++) {
            float dl = d * (float)(kern__iq4xs_scale(&b[i], j) - 32);
            int q[32];
            ref__nibbles(b[i].qs + 16 * j, q);
            for (int l = 0; l < 32; l++)
                y[KERN_QK_K * i + 32 * j + l] = dl * (float)kern_iq4nl_values[q[l]];
        }
    }
}

void kern__dequantize_tq1_0_ref(const void *x, float *y, int64_t n) {
    const kern_block_tq1_0 *b = x;
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        float d = ks_f16_to_f32(b[i].d);
        int q[KERN_QK_K];
        ref__tq1_unpack(&b[i], q);
        for (int e = 0; e < KERN_QK_K; e++)
            y[KERN_QK_K * i + e] = (float)q[e] * d;
    }
}

void kern__dequantize_tq2_0_ref(const void *x, float *y, int64_t n) {
    const kern_block_tq2_0 *b = x;
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        float d = ks_f16_to_f32(b[i].d);
        int q[KERN_QK_K];
        ref__q2_unpack(b[i].qs, q);
        for (int e = 0; e < KERN_QK_K; e++)
            y[KERN_QK_K * i + e] = (float)(q[e] - 1) * d;
    }
}

void kern__dequantize_mxfp4_ref(const void *x, float *y, int64_t n) {
    const kern_block_mxfp4 *b = x;
    for (int64_t i = 0; i < n / KERN_QK8_0; i++) {
        float d = kern__e8m0_half(b[i].e);
        int q[32];
        ref__nibbles(b[i].qs, q);
        for (int l = 0; l < 32; l++)
            y[KERN_QK8_0 * i + l] = (float)kern_mxfp4_values[q[l]] * d;
    }
}

// ----------------------------------------------------------------------------
// Vector ops

float kern__dot_f32_ref(int64_t n, const float *a, const float *b) {
    return kern__dot_row_f32_ref(n, a, b);
}

void kern__axpy_f32_ref(int64_t n, float a, const float *x, float *y) {
    for (int64_t i = 0; i < n; i++)
        y[i] = fmaf(a, x[i], y[i]);
}

// KV rows (kern.h): element i of a row in a KV type, dequantized (exactly:
// an f16, or an f16 scale times an int8, fits an f32 mantissa).

static float ref__kv_at(ks_dtype t, const uint8_t *row, int64_t i) {
    switch (t) {
    case KS_DTYPE_F16: {
        uint16_t h;
        memcpy(&h, row + 2 * i, 2);
        return ks_f16_to_f32(h);
    }
    case KS_DTYPE_Q8_0: {
        const uint8_t *b = row + (size_t)(i / KERN_QK8_0) * sizeof(kern_block_q8_0);
        uint16_t h;
        memcpy(&h, b, 2);
        return ks_f16_to_f32(h) * (float)(int8_t)b[2 + i % KERN_QK8_0];
    }
    default:
        return ref__ldf(row, i);
    }
}

/* out[g * o_stride + j] = (float)(sum_i q_g[i] * row_j[i] in double,
 * increasing i) * scale: kern__dot_f32_ref per head and row. */
static void ref__dot_rows(ks_dtype t, int64_t n, int G, const float *q, const void *k,
                          size_t k_stride, int rows, float scale, float *out, size_t o_stride) {
    for (int g = 0; g < G; g++)
        for (int j = 0; j < rows; j++) {
            const uint8_t *r = (const uint8_t *)k + (size_t)j * k_stride;
            const float *qg = q + (size_t)g * (size_t)n;
            double s = 0.0;
            for (int64_t i = 0; i < n; i++)
                s += (double)qg[i] * (double)ref__kv_at(t, r, i);
            out[(size_t)g * o_stride + (size_t)j] = (float)s * scale;
        }
}

/* kern__axpy_f32_ref per head and row, rows in order (one fma each). */
static void ref__axpy_rows(ks_dtype t, int64_t n, int G, const float *s, size_t s_stride,
                           const void *v, size_t v_stride, int rows, float *y) {
    for (int g = 0; g < G; g++)
        for (int j = 0; j < rows; j++) {
            const uint8_t *r = (const uint8_t *)v + (size_t)j * v_stride;
            float *yg = y + (size_t)g * (size_t)n;
            for (int64_t i = 0; i < n; i++)
                yg[i] = fmaf(s[(size_t)g * s_stride + (size_t)j], ref__kv_at(t, r, i), yg[i]);
        }
}

#define REF_KV_OPS(name, T)                                                                        \
    void kern__dot_rows_##name##_ref(int64_t n, int G, const float *q, const void *k,              \
                                     size_t k_stride, int rows, float scale, float *out,           \
                                     size_t o_stride) {                                            \
        ref__dot_rows(T, n, G, q, k, k_stride, rows, scale, out, o_stride);                        \
    }                                                                                              \
    void kern__axpy_rows_##name##_ref(int64_t n, int G, const float *s, size_t s_stride,           \
                                      const void *v, size_t v_stride, int rows, float *y) {        \
        ref__axpy_rows(T, n, G, s, s_stride, v, v_stride, rows, y);                                \
    }

REF_KV_OPS(f32, KS_DTYPE_F32)
REF_KV_OPS(f16, KS_DTYPE_F16)
REF_KV_OPS(q8_0, KS_DTYPE_Q8_0)

void kern__rmsnorm_ref(int64_t n, const float *x, const float *w, float eps, float *y) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
}

void kern__silu_mul_ref(int64_t n, const float *g, const float *u, float *y) {
    for (int64_t i = 0; i < n; i++) {
        float s = g[i] / (1.0f + expf(-g[i]));
        y[i] = s * u[i];
    }
}

void kern__gelu_mul_ref(int64_t n, const float *g, const float *u, float *y) {
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        const float z2 = -2.0f * ((KERN_GELU_C * x) * (1.0f + (KERN_GELU_A * x) * x));
        y[i] = (x / (1.0f + expf(z2))) * u[i];
    }
}

void kern__softmax_ref(int64_t n, float *x) {
    if (n <= 0) return;
    float mx = x[0];
    for (int64_t i = 1; i < n; i++) mx = fmaxf(mx, x[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

/* x rounded to bf16 (RNE) and back, a subnormal as 0 (vdpbf16ps reads
 * subnormal inputs as 0). */
static float ref__bf16(float x) {
    if (fabsf(x) < FLT_MIN) return 0.0f;
    union { uint32_t u; float f; } v = {.u = (uint32_t)ks_f32_to_bf16(x) << 16};
    return v.f;
}

/* kern.h attn_block, one (row, head) at a time: scores as ref__dot_rows
 * (double sum, increasing i), expf, and o's update one fma per element,
 * lanes in order; bf: attn_block_bf16, with q, K, the weights and V
 * rounded to bf16 (the products then exact) and l the sum of the rounded
 * weights. Uses no scratch. */
static void ref__attn_block(const kern_attn_blk *a, bool bf) {
    for (int r = 0; r < a->R; r++) {
        const int lo = a->lo[r], hi = a->hi[r];
        for (int g = 0; g < a->G && lo < hi; g++) {
            const float *q = a->q + (size_t)r * a->q_stride + (size_t)g * (size_t)a->D;
            const size_t x = (size_t)r * (size_t)a->G + (size_t)g;
            float s[KERN_ATTN_BLOCK], mb = -INFINITY;
            for (int j = lo; j < hi; j++) {
                double d = 0.0;
                for (int i = 0; i < a->D; i++) {
                    const float k = ref__kv_at(a->kv_type, a->krow[j], i);
                    d += bf ? (double)ref__bf16(q[i]) * (double)ref__bf16(k)
                            : (double)q[i] * (double)k;
                }
                s[j] = (float)d * a->scale;
                mb = fmaxf(mb, s[j]);
            }
            const float M = fmaxf(a->m[x], mb), alpha = expf(a->m[x] - M);
            float *o = a->o + x * (size_t)a->Dv, sum = 0.0f;
            for (int i = 0; i < a->Dv; i++) o[i] *= alpha;
            for (int j = lo; j < hi; j++) {
                const float p = bf ? ref__bf16(expf(s[j] - M)) : expf(s[j] - M);
                sum += p;
                for (int i = 0; i < a->Dv; i++) {
                    const float v = ref__kv_at(a->kv_type, a->vrow[j], i);
                    o[i] = fmaf(p, bf ? ref__bf16(v) : v, o[i]);
                }
            }
            a->l[x] = a->l[x] * alpha + sum;
            a->m[x] = M;
        }
    }
}

void kern__attn_block_ref(const kern_attn_blk *a) { ref__attn_block(a, false); }

void kern__attn_block_ref_bf16(const kern_attn_blk *a) { ref__attn_block(a, true); }

// ----------------------------------------------------------------------------
// Vtab

/* r16 weights (kern.h) through the plain kernels: their results, bit for bit. */
KERN_R16_VIA(ref__matmul_r16_q8_0, kern__matmul_q8_0_ref, KS_DTYPE_Q8_0)
KERN_R16_VIA(ref__matmul_r16_q4_0, kern__matmul_q4_0_ref, KS_DTYPE_Q4_0)
KERN_R16_VIA(ref__matmul_r16_q4_K, kern__matmul_q4_K_ref, KS_DTYPE_Q4_K)
KERN_R16_VIA(ref__matmul_r16_q6_K, kern__matmul_q6_K_ref, KS_DTYPE_Q6_K)
KERN_R16_VIA(ref__matmul_r16_q5_0, kern__matmul_q5_0_ref, KS_DTYPE_Q5_0)
KERN_R16_VIA(ref__matmul_r16_q5_K, kern__matmul_q5_K_ref, KS_DTYPE_Q5_K)
KERN_R16_VIA(ref__matmul_r16_q3_K, kern__matmul_q3_K_ref, KS_DTYPE_Q3_K)
KERN_R16_VIA(ref__matmul_r16_q2_K, kern__matmul_q2_K_ref, KS_DTYPE_Q2_K)
KERN_R16_VIA(ref__matmul_r16_iq4_xs, kern__matmul_iq4_xs_ref, KS_DTYPE_IQ4_XS)
KERN_R16_VIA(ref__matmul_r16_mxfp4, kern__matmul_mxfp4_ref, KS_DTYPE_MXFP4)

const kern_vtab kern__vtab_ref = {
    .name = "ref",
    .matmul =
        {
            [KS_DTYPE_F32] = kern__matmul_f32_ref,
            [KS_DTYPE_F16] = kern__matmul_f16_ref,
            [KS_DTYPE_BF16] = kern__matmul_bf16_ref,
            [KS_DTYPE_Q8_0] = kern__matmul_q8_0_ref,
            [KS_DTYPE_Q4_0] = kern__matmul_q4_0_ref,
            [KS_DTYPE_Q4_K] = kern__matmul_q4_K_ref,
            [KS_DTYPE_Q6_K] = kern__matmul_q6_K_ref,
            [KS_DTYPE_Q4_1] = kern__matmul_q4_1_ref,
            [KS_DTYPE_Q5_0] = kern__matmul_q5_0_ref,
            [KS_DTYPE_Q5_1] = kern__matmul_q5_1_ref,
            [KS_DTYPE_IQ4_NL] = kern__matmul_iq4_nl_ref,
            [KS_DTYPE_Q5_K] = kern__matmul_q5_K_ref,
            [KS_DTYPE_Q3_K] = kern__matmul_q3_K_ref,
            [KS_DTYPE_Q2_K] = kern__matmul_q2_K_ref,
            [KS_DTYPE_IQ4_XS] = kern__matmul_iq4_xs_ref,
            [KS_DTYPE_TQ1_0] = kern__matmul_tq1_0_ref,
            [KS_DTYPE_TQ2_0] = kern__matmul_tq2_0_ref,
            [KS_DTYPE_MXFP4] = kern__matmul_mxfp4_ref,
            [KS_DTYPE_IQ2_XXS] = kern__matmul_iq2_xxs_ref,
            [KS_DTYPE_IQ2_XS] = kern__matmul_iq2_xs_ref,
            [KS_DTYPE_IQ2_S] = kern__matmul_iq2_s_ref,
            [KS_DTYPE_IQ3_XXS] = kern__matmul_iq3_xxs_ref,
            [KS_DTYPE_IQ3_S] = kern__matmul_iq3_s_ref,
            [KS_DTYPE_IQ1_S] = kern__matmul_iq1_s_ref,
            [KS_DTYPE_IQ1_M] = kern__matmul_iq1_m_ref,
        },
    .matmul_r16 =
        {
            [KS_DTYPE_Q8_0] = ref__matmul_r16_q8_0,
            [KS_DTYPE_Q4_0] = ref__matmul_r16_q4_0,
            [KS_DTYPE_Q4_K] = ref__matmul_r16_q4_K,
            [KS_DTYPE_Q6_K] = ref__matmul_r16_q6_K,
            [KS_DTYPE_Q5_0] = ref__matmul_r16_q5_0,
            [KS_DTYPE_Q5_K] = ref__matmul_r16_q5_K,
            [KS_DTYPE_Q3_K] = ref__matmul_r16_q3_K,
            [KS_DTYPE_Q2_K] = ref__matmul_r16_q2_K,
            [KS_DTYPE_IQ4_XS] = ref__matmul_r16_iq4_xs,
            [KS_DTYPE_MXFP4] = ref__matmul_r16_mxfp4,
        },
    .quantize_act =
        {
            [KS_DTYPE_F32] = kern__quantize_f32_ref,
            [KS_DTYPE_Q8_0] = kern__quantize_q8_0_ref,
            [KS_DTYPE_Q8_K] = kern__quantize_q8_K_ref,
        },
    .dot_f32 = kern__dot_f32_ref,
    .axpy_f32 = kern__axpy_f32_ref,
    .dot_rows =
        {
            [KS_DTYPE_F32] = kern__dot_rows_f32_ref,
            [KS_DTYPE_F16] = kern__dot_rows_f16_ref,
            [KS_DTYPE_Q8_0] = kern__dot_rows_q8_0_ref,
        },
    .axpy_rows =
        {
            [KS_DTYPE_F32] = kern__axpy_rows_f32_ref,
            [KS_DTYPE_F16] = kern__axpy_rows_f16_ref,
            [KS_DTYPE_Q8_0] = kern__axpy_rows_q8_0_ref,
        },
    .kv_store =
        {
            [KS_DTYPE_F32] = kern__quantize_f32_ref,
            [KS_DTYPE_F16] = kern__quantize_f16_ref,
            [KS_DTYPE_Q8_0] = kern__quantize_q8_0_ref,
        },
    .rmsnorm = kern__rmsnorm_ref,
    .silu_mul = kern__silu_mul_ref,
    .gelu_mul = kern__gelu_mul_ref,
    .softmax = kern__softmax_ref,
    .attn_block = kern__attn_block_ref,
    .attn_block_bf16 = kern__attn_block_ref_bf16,
    .gdn_step = kern__gdn_step_ref,
};
