/* ref_iq.c — the reference kernels of the codebook weight types (IQ1_S,
 * IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S; blocks in kern_int.h,
 * grids in iq_grids.c): one decoder that spells out every layout
 * (kern__iq_decode), and the row dot, matmul and dequantizer built on it.
 * Accumulation as ref.c's: one exact integer sum per super-block, one double
 * term, one rounding at the end. No quantizer: these types are written by
 * llama-quantize's importance-weighted grid search. */
#include "kern/kern_int.h"

static uint32_t iq__u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint16_t iq__u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* Elements j < n of grid entry g (bytes, element j in byte j) into w with
 * the sign bits of sg (bit j set: negative). */
static void iq__put(int8_t *w, uint64_t g, uint32_t sg, int n) {
    for (int j = 0; j < n; j++) {
        int m = (int)((g >> (8 * j)) & 255);
        w[j] = (int8_t)((sg >> j) & 1 ? -m : m);
    }
}

void kern__iq_decode(ks_dtype t, const uint8_t *b, int8_t *w, int16_t *ls, uint16_t *d) {
    switch (t) {
    case KS_DTYPE_IQ2_XXS: { // sub-block j: bytes 8j..8j+3 grid indices, u32 at 8j+4
        const kern_block_iq2_xxs *x = (const kern_block_iq2_xxs *)(const void *)b;
        *d = x->d;
        for (int j = 0; j < 8; j++) {
            uint32_t a = iq__u32(x->qs + 8 * j + 4);
            ls[2 * j] = ls[2 * j + 1] = (int16_t)(2 * (a >> 28) + 1);
            for (int l = 0; l < 4; l++)
                iq__put(w + 32 * j + 8 * l, kern_iq2xxs_grid[x->qs[8 * j + l]],
                        kern__iq_signs7((a >> (7 * l)) & 127), 8);
        }
        return;
    }
    case KS_DTYPE_IQ2_XS: {
        const kern_block_iq2_xs *x = (const kern_block_iq2_xs *)(const void *)b;
        *d = x->d;
        for (int j = 0; j < 8; j++) {
            ls[2 * j] = (int16_t)(2 * (x->scales[j] & 15) + 1);
            ls[2 * j + 1] = (int16_t)(2 * (x->scales[j] >> 4) + 1);
            for (int l = 0; l < 4; l++) {
                uint16_t v = iq__u16(x->qs + 2 * (4 * j + l));
                iq__put(w + 32 * j + 8 * l, kern_iq2xs_grid[v & 511], kern__iq_signs7(v >> 9), 8);
            }
        }
        return;
    }
    case KS_DTYPE_IQ2_S: {
        const kern_block_iq2_s *x = (const kern_block_iq2_s *)(const void *)b;
        *d = x->d;
        for (int j = 0; j < 8; j++) {
            ls[2 * j] = (int16_t)(2 * (x->scales[j] & 15) + 1);
            ls[2 * j + 1] = (int16_t)(2 * (x->scales[j] >> 4) + 1);
            for (int l = 0; l < 4; l++) {
                int idx = x->qs[4 * j + l] | ((x->qh[j] >> (2 * l)) & 3) << 8;
                iq__put(w + 32 * j + 8 * l, kern_iq2s_grid[idx], x->signs[4 * j + l], 8);
            }
        }
        return;
    }
    case KS_DTYPE_IQ3_XXS: {
        const kern_block_iq3_xxs *x = (const kern_block_iq3_xxs *)(const void *)b;
        *d = x->d;
        for (int j = 0; j < 8; j++) {
            uint32_t a = iq__u32(x->ss + 4 * j);
            ls[2 * j] = ls[2 * j + 1] = (int16_t)(2 * (a >> 28) + 1);
            for (int l = 0; l < 4; l++) {
                uint8_t sg = kern__iq_signs7((a >> (7 * l)) & 127);
                iq__put(w + 32 * j + 8 * l, kern_iq3xxs_grid[x->qs[8 * j + 2 * l]], sg, 4);
                iq__put(w + 32 * j + 8 * l + 4, kern_iq3xxs_grid[x->qs[8 * j + 2 * l + 1]],
                        sg >> 4, 4);
            }
        }
        return;
    }
    case KS_DTYPE_IQ3_S: {
        const kern_block_iq3_s *x = (const kern_block_iq3_s *)(const void *)b;
        *d = x->d;
        for (int j = 0; j < 8; j++) {
            ls[2 * j] = ls[2 * j + 1] = (int16_t)(2 * ((x->scales[j / 2] >> (4 * (j % 2))) & 15) + 1);
            for (int g = 0; g < 8; g++) { // groups of 4; sign byte per pair of groups
                int idx = x->qs[8 * j + g] | ((x->qh[j] >> g) & 1) << 8;
                iq__put(w + 32 * j + 4 * g, kern_iq3s_grid[idx],
                        (uint32_t)x->signs[4 * j + g / 2] >> (4 * (g % 2)), 4);
            }
        }
        return;
    }
    case KS_DTYPE_IQ1_S: {
        const kern_block_iq1_s *x = (const kern_block_iq1_s *)(const void *)b;
        *d = x->d;
        for (int j = 0; j < 8; j++) {
            uint16_t h = iq__u16(x->qh + 2 * j);
            ls[2 * j] = ls[2 * j + 1] = (int16_t)(2 * ((h >> 12) & 7) + 1);
            int sgn = h & 0x8000 ? -1 : 1;
            for (int l = 0; l < 4; l++) {
                uint64_t g = kern_iq1s_grid[x->qs[4 * j + l] | ((h >> (3 * l)) & 7) << 8];
                for (int k = 0; k < 8; k++) // 8 * (-1, 0, 1) + the delta's sign
                    w[32 * j + 8 * l + k] = (int8_t)(8 * (int8_t)(g >> (8 * k)) + sgn);
            }
        }
        return;
    }
    case KS_DTYPE_IQ1_M: {
        const kern_block_iq1_m *x = (const kern_block_iq1_m *)(const void *)b;
        uint16_t sc[4];
        for (int k = 0; k < 4; k++)
            sc[k] = iq__u16(x->scales + 2 * k);
        *d = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                        (sc[3] & 0xf000));
        for (int j = 0; j < 8; j++) {
            int s = sc[j / 2] >> (6 * (j % 2));
            ls[2 * j] = (int16_t)(2 * (s & 7) + 1);
            ls[2 * j + 1] = (int16_t)(2 * ((s >> 3) & 7) + 1);
            for (int l = 0; l < 4; l++) { // qh byte 2j + l/2: low nibble group 2(l/2), high +1
                int h = x->qh[2 * j + l / 2] >> (4 * (l % 2));
                uint64_t g = kern_iq1s_grid[x->qs[4 * j + l] | (h & 7) << 8];
                int sgn = h & 8 ? -1 : 1;
                for (int k = 0; k < 8; k++)
                    w[32 * j + 8 * l + k] = (int8_t)(8 * (int8_t)(g >> (8 * k)) + sgn);
            }
        }
        return;
    }
    default: KS_ASSERT(!"kern__iq_decode: not a codebook type");
    }
}

/* One output element of a codebook type t x Q8_K. */
static float iq__dot(ks_dtype t, int64_t K, const void *w, const void *x) {
    const size_t bs = ks_dtype_block_bytes(t);
    const kern_block_q8_K *b = x;
    double s = 0.0;
    for (int64_t i = 0; i < K / KERN_QK_K; i++) {
        int8_t q[KERN_QK_K];
        int16_t ls[16];
        uint16_t d;
        kern__iq_decode(t, (const uint8_t *)w + (size_t)i * bs, q, ls, &d);
        int32_t isum = 0;
        for (int h = 0; h < 16; h++) {
            int32_t sub = 0;
            for (int l = 0; l < 16; l++)
                sub += q[16 * h + l] * b[i].qs[16 * h + l];
            isum += ls[h] * sub;
        }
        s += (double)ks_f16_to_f32(d) * (double)b[i].d * (double)isum;
    }
    return (float)(s * (double)KERN_IQ_FACTOR(t));
}

/* Dequantizes with ggml's float operations, so values are llama.cpp's bit
 * for bit: db = d * (0.5 + s) * 0.25 (IQ2_*; IQ3_XXS * 0.5) or d * ls
 * (IQ3_S), times the signed magnitude; IQ1_*: d * ls * (g +- 1/8). */
static void iq__dequant(ks_dtype t, const void *x, float *y, int64_t n) {
    const size_t bs = ks_dtype_block_bytes(t);
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        int8_t q[KERN_QK_K];
        int16_t ls[16];
        uint16_t dh;
        kern__iq_decode(t, (const uint8_t *)x + (size_t)i * bs, q, ls, &dh);
        float d = ks_f16_to_f32(dh);
        for (int e = 0; e < KERN_QK_K; e++) {
            int l = ls[e / 16];
            float v;
            if (t == KS_DTYPE_IQ1_S || t == KS_DTYPE_IQ1_M)
                v = (d * (float)l) * ((float)q[e] * 0.125f);
            else if (t == KS_DTYPE_IQ3_S)
                v = (d * (float)l) * (float)q[e];
            else
                v = d * (0.5f + (float)((l - 1) / 2)) * (t == KS_DTYPE_IQ3_XXS ? 0.5f : 0.25f) *
                    (float)q[e];
            y[KERN_QK_K * i + e] = v;
        }
    }
}

#define IQ_REF(name, T)                                                                            \
    float kern__dot_row_##name##_ref(int64_t K, const void *w, const void *x) {                   \
        return iq__dot(T, K, w, x);                                                                \
    }                                                                                              \
    void kern__matmul_##name##_ref(int64_t K, int n_rows, int n_cols, const void *W,               \
                                   size_t w_stride, const void *X, size_t x_stride, float *Y,      \
                                   size_t y_stride) {                                              \
        for (int c = 0; c < n_cols; c++)                                                           \
            for (int r = 0; r < n_rows; r++)                                                       \
                Y[(size_t)c * y_stride + r] =                                                      \
                    iq__dot(T, K, (const uint8_t *)W + (size_t)r * w_stride,                       \
                            (const uint8_t *)X + (size_t)c * x_stride);                            \
    }                                                                                              \
    void kern__dequantize_##name##_ref(const void *x, float *y, int64_t n) {                      \
        iq__dequant(T, x, y, n);                                                                   \
    }

IQ_REF(iq2_xxs, KS_DTYPE_IQ2_XXS)
IQ_REF(iq2_xs, KS_DTYPE_IQ2_XS)
IQ_REF(iq2_s, KS_DTYPE_IQ2_S)
IQ_REF(iq3_xxs, KS_DTYPE_IQ3_XXS)
IQ_REF(iq3_s, KS_DTYPE_IQ3_S)
IQ_REF(iq1_s, KS_DTYPE_IQ1_S)
IQ_REF(iq1_m, KS_DTYPE_IQ1_M)
