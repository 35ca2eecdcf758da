/* avx512_vec.c — the AVX-512 vector and attention ops of the vtab (kern.h):
 * dot and axpy over f32, the KV attention ops over rows in the pool's KV
 * type (dot_rows, axpy_rows, kv_store), rmsnorm, the gated activations and
 * softmax. Built with the flags of avx512.c, whose vtab points here; each
 * function names the ref it matches and its expected error. */
#include "kern/avx512_int.h"

#include <math.h>

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

float kern__a512_dot_f32(int64_t n, const float *a, const float *b) { return a512__dot(n, a, b); }

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

/* Lanes 0-7 of the result: x[h]'s 16 lanes reduced by addition (max where
 * mx) bit for bit as _mm512_reduce_add_ps (_max_) does it: GCC's tree, lane
 * i plus lane i + 8, then + 4, + 2, + 1, the same for every h, so a row's
 * result never depends on its place or on the others. By 128-bit and
 * in-lane shuffles: a quarter of the shuffles of 8 reductions one at a
 * time. Lanes 8-15 undefined. */
A512_INLINE __m512 a512__reduce8(const __m512 x[8], bool mx) {
#define A512__OP(a, b) (mx ? _mm512_max_ps((a), (b)) : _mm512_add_ps((a), (b)))
    __m512 t[4], u[2];
    // t[k]: lanes 0-7 row 2k's i and i + 8, lanes 8-15 row 2k + 1's
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) t[k] =
        A512__OP(_mm512_shuffle_f32x4(x[2 * k], x[2 * k + 1], 0x44),
                 _mm512_shuffle_f32x4(x[2 * k], x[2 * k + 1], 0xEE));
    // u[k]: 128-bit lane c row 4k + c's i and i + 4
    _Pragma("GCC unroll 2") for (int k = 0; k < 2; k++) u[k] =
        A512__OP(_mm512_shuffle_f32x4(t[2 * k], t[2 * k + 1], 0x88),
                 _mm512_shuffle_f32x4(t[2 * k], t[2 * k + 1], 0xDD));
    // 128-bit lane c: rows c and c + 4, lanes i and i + 2 (i < 2), then i and i + 1
    const __m512 v =
        A512__OP(_mm512_shuffle_ps(u[0], u[1], 0x44), _mm512_shuffle_ps(u[0], u[1], 0xEE));
    const __m512 w = A512__OP(_mm512_shuffle_ps(v, v, 0x88), _mm512_shuffle_ps(v, v, 0xDD));
#undef A512__OP
    // lane 4c: row c, lane 4c + 1: row c + 4
    return _mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 13, 9, 5, 1, 12, 8, 4, 0),
                                 w);
}

/* Lane j = _mm512_reduce_add_ps(v[j]), bit for bit (a512__reduce8). */
A512_INLINE __m512 a512__reduce16(const __m512 v[16]) {
    return _mm512_shuffle_f32x4(a512__reduce8(v, false), a512__reduce8(v + 8, false), 0x44);
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
    void kern__a512_dot_rows_##name(int64_t n, int G, const float *q, const void *k,               \
                                    size_t k_stride, int rows, float scale, float *out,            \
                                    size_t o_stride) {                                             \
        a512__dot_rows_t(T, n, G, q, k, k_stride, rows, scale, out, o_stride);                     \
    }                                                                                              \
    void kern__a512_axpy_rows_##name(int64_t n, int G, const float *s, size_t s_stride,            \
                                     const void *v, size_t v_stride, int rows, float *y) {         \
        a512__axpy_rows_t(T, n, G, s, s_stride, v, v_stride, rows, y);                             \
    }

/* Matches kern__axpy_f32_ref exactly (one fma per element). */
void kern__a512_axpy_f32(int64_t n, float a, const float *x, float *y) {
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
void kern__a512_kv_store_f16(const float *x, void *y, int64_t n) {
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
void kern__a512_rmsnorm(int64_t n, const float *x, const float *w, float eps, float *y) {
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
void kern__a512_silu_mul(int64_t n, const float *g, const float *u, float *y) {
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
void kern__a512_gelu_mul(int64_t n, const float *g, const float *u, float *y) {
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
void kern__a512_softmax(int64_t n, float *x) {
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
// Tiled online-softmax attention (kern.h attn_block). Matches
// kern__attn_block_ref within f32 rounding of the scores (fma over d in
// increasing order per key lane vs a double sum) and a512__exp vs expf. A
// (row, head)'s operations never depend on R, G, n or the other rows: key
// lanes outside its [lo, hi) are masked to -inf and weight 0, and its value
// loop runs over its own [lo, hi) only, so decode (R = 1) and every tiling of
// a prompt give the same bits.

/* In place: lane c of v[r] becomes lane r of v[c] (a 16 x 16 transpose by
 * 32-bit unpacks, 64-bit unpacks and two rounds of 128-bit shuffles). */
A512_INLINE void a512__tr16(__m512 v[16]) {
    __m512 a[16], b[16], c[16];
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
        a[2 * k] = _mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]);
        a[2 * k + 1] = _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]);
    }
    // b[4m + e], 128-bit lane l: rows 4m..4m+3 of column 4l + e
    _Pragma("GCC unroll 4") for (int m = 0; m < 4; m++) {
        const __m512d x0 = _mm512_castps_pd(a[4 * m]), x1 = _mm512_castps_pd(a[4 * m + 1]),
                      x2 = _mm512_castps_pd(a[4 * m + 2]), x3 = _mm512_castps_pd(a[4 * m + 3]);
        b[4 * m] = _mm512_castpd_ps(_mm512_unpacklo_pd(x0, x2));
        b[4 * m + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x0, x2));
        b[4 * m + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(x1, x3));
        b[4 * m + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(x1, x3));
    }
    // c[e] (rows 0-7) and c[8 + e] (rows 8-15): lanes (l0, l2), (l1, l3) pairs
    _Pragma("GCC unroll 4") for (int e = 0; e < 4; e++) {
        c[2 * e] = _mm512_shuffle_f32x4(b[e], b[4 + e], 0x88);
        c[2 * e + 1] = _mm512_shuffle_f32x4(b[e], b[4 + e], 0xDD);
        c[8 + 2 * e] = _mm512_shuffle_f32x4(b[8 + e], b[12 + e], 0x88);
        c[8 + 2 * e + 1] = _mm512_shuffle_f32x4(b[8 + e], b[12 + e], 0xDD);
    }
    _Pragma("GCC unroll 4") for (int e = 0; e < 4; e++) {
        v[e] = _mm512_shuffle_f32x4(c[2 * e], c[8 + 2 * e], 0x88);         // column e
        v[8 + e] = _mm512_shuffle_f32x4(c[2 * e], c[8 + 2 * e], 0xDD);     // column 8 + e
        v[4 + e] = _mm512_shuffle_f32x4(c[2 * e + 1], c[8 + 2 * e + 1], 0x88); // 4 + e
        v[12 + e] = _mm512_shuffle_f32x4(c[2 * e + 1], c[8 + 2 * e + 1], 0xDD); // 12 + e
    }
}

/* The block's key lanes [j0, j1) (j0 % 16 == 0) as f32: kt is (D, 64),
 * kt[d * 64 + j] = K_j[d], so one vector holds 16 keys' element d; vt is
 * (64, Dv) row-major. Lanes past j1 in j1's group of 16 are zero. */
A512_INLINE void a512__attn_load(ks_dtype t, const kern_attn_blk *a, int j0, int j1, float *kt,
                                 float *vt) { // vt NULL: keys only
    const size_t Dv = (size_t)a->Dv;
    for (int jg = j0; jg < j1; jg += 16) {
        const int nr = j1 - jg < 16 ? j1 - jg : 16;
        for (int d0 = 0; d0 < a->D; d0 += 16) {
            __m512 v[16];
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++)
                v[i] = i < nr ? a512__kv_ld(t, a->krow[jg + i], d0, 0xFFFF) : _mm512_setzero_ps();
            a512__tr16(v);
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++)
                _mm512_store_ps(kt + (size_t)(d0 + i) * KERN_ATTN_BLOCK + (size_t)jg, v[i]);
        }
        for (int i = 0; i < nr && vt; i++)
            for (int d0 = 0; d0 < a->Dv; d0 += 16)
                _mm512_store_ps(vt + (size_t)(jg + i) * Dv + (size_t)d0,
                                a512__kv_ld(t, a->vrow[jg + i], d0, 0xFFFF));
    }
}

/* Issues the next of a->pf's prefetches, if any are left. */
A512_INLINE void a512__pf_step(const kern_attn_blk *a) {
    kern_attn_pf *f = a->pf;
    if (!f || f->row >= f->n) return;
    _mm_prefetch((const char *)(f->side ? f->v : f->k)[f->row] + 64 * f->line, _MM_HINT_T0);
    if (++f->line < f->lines) return;
    f->line = 0;
    if (f->v != f->k && !f->side) {
        f->side = 1;
        return;
    }
    f->side = 0;
    f->row++;
}

/* Scores of NH (1 or 2) heads against all 64 key lanes: acc[h][v] lane i =
 * sum_d q_h[d] * kt[d][16v + i]: one fma per d in increasing order within
 * each run of 16 d, the runs' sums added in order (closer to a512__dot than
 * one chain of D fmas on large unscaled scores). D % 16 == 0. */
A512_INLINE void a512__attn_qk(const kern_attn_blk *a, int NH, int D, const float *kt,
                               const float *q0, const float *q1, __m512 acc[2][4]) {
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
        _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++)
            acc[h][v] = _mm512_setzero_ps();
    for (int d0 = 0; d0 < D; d0 += 16) {
        __m512 r[2][4];
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
            _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++)
                r[h][v] = _mm512_setzero_ps();
        for (int d = d0; d < d0 + 16; d++) {
            a512__pf_step(a);
            const float *kr = kt + (size_t)d * KERN_ATTN_BLOCK;
            __m512 k0 = _mm512_load_ps(kr), k1 = _mm512_load_ps(kr + 16),
                   k2 = _mm512_load_ps(kr + 32), k3 = _mm512_load_ps(kr + 48);
            // in registers: GCC would fold each load into both heads' fmas,
            // 10 loads for 8 fmas, and the load ports would set the pace
            __asm__("" : "+v"(k0), "+v"(k1), "+v"(k2), "+v"(k3));
            const __m512 b0 = _mm512_set1_ps(q0[d]);
            r[0][0] = _mm512_fmadd_ps(b0, k0, r[0][0]);
            r[0][1] = _mm512_fmadd_ps(b0, k1, r[0][1]);
            r[0][2] = _mm512_fmadd_ps(b0, k2, r[0][2]);
            r[0][3] = _mm512_fmadd_ps(b0, k3, r[0][3]);
            if (NH == 2) {
                const __m512 b1 = _mm512_set1_ps(q1[d]);
                r[1][0] = _mm512_fmadd_ps(b1, k0, r[1][0]);
                r[1][1] = _mm512_fmadd_ps(b1, k1, r[1][1]);
                r[1][2] = _mm512_fmadd_ps(b1, k2, r[1][2]);
                r[1][3] = _mm512_fmadd_ps(b1, k3, r[1][3]);
            }
        }
        _Pragma("GCC unroll 2") for (int h = 0; h < NH; h++)
            _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++)
                acc[h][v] = _mm512_add_ps(acc[h][v], r[h][v]);
    }
}

/* The first half of ng (1..8) heads' softmax update: their running maxima
 * m[0..ng) against the block's score maxima mx[h]. Writes M = max(m, the
 * block's) to m and exp(m_old - M), the factor o and l are scaled by, to
 * alpha; returns M (lane h). mx[ng..8) are overwritten. */
A512_INLINE __m512 a512__attn_newmax(int ng, __m512 mx[8], float *m, float *alpha) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int h = ng; h < 8; h++)
        mx[h] = ninf;
    const __mmask16 k = (__mmask16)((1u << ng) - 1);
    const __m512 mo = _mm512_mask_loadu_ps(ninf, k, m);
    const __m512 M = _mm512_max_ps(mo, a512__reduce8(mx, true)); // mo - M <= 0
    _mm512_mask_storeu_ps(alpha, k, a512__exp(_mm512_sub_ps(mo, M)));
    _mm512_mask_storeu_ps(m, k, M);
    return M;
}

/* The second half: l[h] = l[h] alpha[h] + the sum of u[h]'s lanes (the
 * block's weights, ng heads; u[ng..8) overwritten). */
A512_INLINE void a512__attn_newsum(int ng, __m512 u[8], const float *alpha, float *l) {
    for (int h = ng; h < 8; h++)
        u[h] = _mm512_setzero_ps();
    const __mmask16 k = (__mmask16)((1u << ng) - 1);
    const __m512 lo = _mm512_maskz_loadu_ps(k, l), al = _mm512_maskz_loadu_ps(k, alpha);
    _mm512_mask_storeu_ps(l, k, _mm512_add_ps(_mm512_mul_ps(lo, al), a512__reduce8(u, false)));
}

/* A head's scores acc (key lanes 0-63) scaled, -inf outside [lo, hi),
 * stored to s; returns their lanewise maximum over the four vectors. */
A512_INLINE __m512 a512__attn_scale(const __m512 acc[4], float scale, uint64_t live, float *s) {
    const __m512 sc = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    __m512 x[4];
    _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) {
        x[v] = _mm512_mask_mul_ps(ninf, (__mmask16)(live >> (16 * v)), acc[v], sc);
        _mm512_store_ps(s + 16 * v, x[v]);
    }
    return _mm512_max_ps(_mm512_max_ps(x[0], x[1]), _mm512_max_ps(x[2], x[3]));
}

/* The weights exp(s - M) of a head's 64 lanes (0 outside live) into e. */
A512_INLINE void a512__attn_weights(const float *s, float M, uint64_t live, __m512 e[4]) {
    const __m512 vM = _mm512_set1_ps(M);
    _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) e[v] = _mm512_maskz_mov_ps(
        (__mmask16)(live >> (16 * v)), a512__exp(_mm512_sub_ps(_mm512_load_ps(s + 16 * v), vM)));
}

/* The key lanes [lo, hi) as a 64-bit mask. */
A512_INLINE uint64_t a512__attn_live(int lo, int hi) {
    return (hi >= 64 ? ~0ull : (1ull << hi) - 1) & ~((1ull << lo) - 1);
}

/* o_h = o_h * alpha_h + sum_{j in [lo, hi)} p_h[j] * V_j for NH (1..8)
 * heads h (weights p + 64 h, outputs o + h Dv), NC (1 or 2) vectors of
 * columns [c0, c0 + 16 NC); j in order, so a (head, column)'s arithmetic is
 * the same whatever NH, NC or where V_j comes from: vt (the block's values
 * as f32, row j at vt + j Dv) or, vt NULL, converted from a->vrow[j] here
 * (decode: each value is converted once for all NH heads, never stored). */
A512_INLINE void a512__attn_pv(ks_dtype t, int NH, int NC, const kern_attn_blk *a, const float *vt,
                               int c0, int lo, int hi, const float *p, const float *alpha,
                               float *o) {
    const size_t Dv = (size_t)a->Dv;
    __m512 y[8][2];
    _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++)
        _Pragma("GCC unroll 2") for (int c = 0; c < NC; c++)
            y[h][c] = _mm512_mul_ps(_mm512_loadu_ps(o + h * Dv + c0 + 16 * c),
                                    _mm512_set1_ps(alpha[h]));
    for (int j = lo; j < hi; j++) {
        a512__pf_step(a);
        __m512 x[2];
        _Pragma("GCC unroll 2") for (int c = 0; c < NC; c++)
            x[c] = vt ? _mm512_load_ps(vt + (size_t)j * Dv + (size_t)(c0 + 16 * c))
                      : a512__kv_ld(t, a->vrow[j], c0 + 16 * c, 0xFFFF);
        _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) {
            const __m512 b = _mm512_set1_ps(p[KERN_ATTN_BLOCK * h + j]);
            _Pragma("GCC unroll 2") for (int c = 0; c < NC; c++)
                y[h][c] = _mm512_fmadd_ps(b, x[c], y[h][c]);
        }
    }
    _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++)
        _Pragma("GCC unroll 2") for (int c = 0; c < NC; c++)
            _mm512_storeu_ps(o + h * Dv + c0 + 16 * c, y[h][c]);
}

/* P.V for NH (1..8) heads of one row, all columns, two vectors at a time. */
A512_INLINE void a512__attn_pv_cols(ks_dtype t, int NH, const kern_attn_blk *a, const float *vt,
                                    int lo, int hi, const float *p, const float *alpha, float *o) {
    int c0 = 0;
    for (; c0 + 32 <= a->Dv; c0 += 32)
        a512__attn_pv(t, NH, 2, a, vt, c0, lo, hi, p, alpha, o);
    if (c0 < a->Dv) a512__attn_pv(t, NH, 1, a, vt, c0, lo, hi, p, alpha, o);
}

/* Heads [g0, g0 + ng) (ng <= 8) of query row r: scores two heads at a
 * time, their softmax updates, then P.V of all ng heads together. */
A512_INLINE void a512__attn_heads(ks_dtype t, const kern_attn_blk *a, int r, int g0, int ng,
                                  const float *kt, const float *vt) {
    const size_t x0 = (size_t)r * (size_t)a->G + (size_t)g0, Dv = (size_t)a->Dv;
    const float *q = a->q + (size_t)r * a->q_stride + (size_t)g0 * (size_t)a->D;
    const int lo = a->lo[r], hi = a->hi[r];
    _Alignas(64) float p[8 * KERN_ATTN_BLOCK];
    float al[8];
    const uint64_t live = a512__attn_live(lo, hi);
    __m512 mx[8], u[8];
    // scores two heads at a time into p, then the heads' maxima together,
    // then the weights over p and the heads' sums together
    for (int h = 0; h < ng; h += 2) {
        const int nh = ng - h >= 2 ? 2 : 1;
        __m512 acc[2][4];
        const float *qh = q + (size_t)h * (size_t)a->D;
        if (nh == 2)
            a512__attn_qk(a, 2, a->D, kt, qh, qh + a->D, acc);
        else
            a512__attn_qk(a, 1, a->D, kt, qh, qh, acc);
        for (int i = 0; i < nh; i++)
            mx[h + i] = a512__attn_scale(acc[i], a->scale, live, p + KERN_ATTN_BLOCK * (h + i));
    }
    _Alignas(64) float M[16];
    _mm512_store_ps(M, a512__attn_newmax(ng, mx, a->m + x0, al));
    for (int h = 0; h < ng; h++) {
        float *ph = p + KERN_ATTN_BLOCK * h;
        __m512 e[4];
        a512__attn_weights(ph, M[h], live, e);
        _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) _mm512_store_ps(ph + 16 * v, e[v]);
        u[h] = _mm512_add_ps(_mm512_add_ps(e[0], e[1]), _mm512_add_ps(e[2], e[3]));
    }
    a512__attn_newsum(ng, u, al, a->l + x0);
    float *o = a->o + x0 * Dv;
    int h = 0; // heads in runs of 8, 4, 2, 1
    for (; h + 8 <= ng; h += 8)
        a512__attn_pv_cols(t, 8, a, vt, lo, hi, p + KERN_ATTN_BLOCK * h, al + h, o + h * Dv);
    if (h + 4 <= ng) {
        a512__attn_pv_cols(t, 4, a, vt, lo, hi, p + KERN_ATTN_BLOCK * h, al + h, o + h * Dv);
        h += 4;
    }
    if (h + 2 <= ng) {
        a512__attn_pv_cols(t, 2, a, vt, lo, hi, p + KERN_ATTN_BLOCK * h, al + h, o + h * Dv);
        h += 2;
    }
    if (h < ng)
        a512__attn_pv_cols(t, 1, a, vt, lo, hi, p + KERN_ATTN_BLOCK * h, al + h, o + h * Dv);
}

/* The lanes [*j0, *j1) any row of the tile reads; returns how many rows
 * read any (0: none, the block is skipped). */
A512_INLINE int a512__attn_lanes(const kern_attn_blk *a, int *j0, int *j1) {
    int rows = 0;
    *j0 = a->n, *j1 = 0;
    for (int r = 0; r < a->R; r++)
        if (a->lo[r] < a->hi[r]) {
            *j0 = a->lo[r] < *j0 ? a->lo[r] : *j0;
            *j1 = a->hi[r] > *j1 ? a->hi[r] : *j1;
            rows++;
        }
    return rows;
}

A512_INLINE void a512__attn_block_t(ks_dtype t, const kern_attn_blk *a) {
    int j0, j1;
    const int rows = a512__attn_lanes(a, &j0, &j1);
    if (rows == 0) return;
    // scratch: kt (D, 64), then vt (64, Dv) when more than one row reads the
    // values (one row converts them as it goes)
    float *kt = a->scratch, *vt = rows > 1 ? kt + (size_t)a->D * KERN_ATTN_BLOCK : NULL;
    a512__attn_load(t, a, j0 & ~15, j1, kt, vt);
    for (int r = 0; r < a->R; r++) {
        if (a->lo[r] >= a->hi[r]) continue;
        for (int g = 0; g < a->G; g += 8)
            a512__attn_heads(t, a, r, g, a->G - g < 8 ? a->G - g : 8, kt, vt);
    }
}

void kern__a512_attn_block(const kern_attn_blk *a) {
    switch (a->kv_type) {
    case KS_DTYPE_F16: a512__attn_block_t(KS_DTYPE_F16, a); break;
    case KS_DTYPE_Q8_0: a512__attn_block_t(KS_DTYPE_Q8_0, a); break;
    default: a512__attn_block_t(KS_DTYPE_F32, a); break;
    }
}

// ----------------------------------------------------------------------------
// The same block with BF16 dot products (kern.h attn_block_bf16). vdpbf16ps
// adds two products a lane, each exact in f32 (8-bit mantissas), at about
// 1.8x the multiply-adds per cycle of f32 fmas on these cores: q and K are
// rounded to bf16 (RNE) for the scores, the weights p and V for P.V. m, l,
// the exponentials and o stay f32, and l sums the rounded weights, so o / l
// is a true average of the rounded values. Pairs: a dword holds elements
// (2i, 2i + 1), the lower one in its low half: keys pair along d, values
// along the block's lanes (rows 2i and 2i + 1, whatever a row's lo and hi,
// so the pairing never depends on the tile). A pair's row outside the lanes
// read is a zero value with weight 0. Batch invariance as above.

// the BF16 instructions for these functions alone (kern_attn_block runs
// them only where the CPU has them); GCC and clang both take the attribute
#define A512_BF16 __attribute__((target("avx512bf16")))

/* 32 floats (lo: elements 0-15, hi: 16-31) as 16 bf16 pairs, in order. */
A512_INLINE A512_BF16 __m512i a512__bf_pairs(__m512 lo, __m512 hi) {
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* Columns [c0, c0 + 16) of value rows j and j + 1 as 16 bf16 pairs (row j
 * low); a row at or past jend, or NULL, is zero. */
A512_INLINE A512_BF16 __m512i a512__bf_vpair(ks_dtype t, const kern_attn_blk *a, int j, int jlo,
                                             int jend, int c0) {
    const __m512i ix = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                        8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512 x0 =
        j >= jlo && j < jend ? a512__kv_ld(t, a->vrow[j], c0, 0xFFFF) : _mm512_setzero_ps();
    const __m512 x1 = j + 1 >= jlo && j + 1 < jend ? a512__kv_ld(t, a->vrow[j + 1], c0, 0xFFFF)
                                                   : _mm512_setzero_ps();
    return _mm512_permutexvar_epi16(ix, a512__bf_pairs(x0, x1));
}

/* The block's lanes [j0, j1) (j0 % 16 == 0) as bf16 pairs: kb is (D / 2,
 * 64) dwords, kb[i * 64 + j] = K_j[2i], K_j[2i + 1], zero past j1 in j1's
 * group of 16; vb (optional) is (32, Dv) dwords, vb[i * Dv + c] = V_2i[c],
 * V_2i+1[c] for the pairs that meet [j0, j1). */
A512_INLINE A512_BF16 void a512__attn_load_bf(ks_dtype t, const kern_attn_blk *a, int j0, int j1,
                                              uint32_t *kb, uint32_t *vb) {
    const int D = a->D, Dv = a->Dv;
    for (int jg = j0; jg < j1; jg += 16) {
        const int nr = j1 - jg < 16 ? j1 - jg : 16;
        for (int d0 = 0; d0 < D; d0 += 32) {
            const bool two = d0 + 16 < D; // D % 32 == 16: the last run has 8 pairs
            __m512 v[16];
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {
                if (i >= nr) {
                    v[i] = _mm512_setzero_ps();
                    continue;
                }
                const __m512 lo = a512__kv_ld(t, a->krow[jg + i], d0, 0xFFFF);
                const __m512 hi =
                    two ? a512__kv_ld(t, a->krow[jg + i], d0 + 16, 0xFFFF) : _mm512_setzero_ps();
                v[i] = _mm512_castsi512_ps(a512__bf_pairs(lo, hi));
            }
            a512__tr16(v);
            const int np = two ? 16 : 8;
            for (int i = 0; i < np; i++)
                _mm512_store_ps((float *)kb + (size_t)(d0 / 2 + i) * KERN_ATTN_BLOCK + jg, v[i]);
        }
    }
    for (int j = j0; j < j1 && vb; j += 2)
        for (int c0 = 0; c0 < Dv; c0 += 16)
            _mm512_store_si512(vb + (size_t)(j / 2) * (size_t)Dv + (size_t)c0,
                               a512__bf_vpair(t, a, j, j0, j1, c0));
}

/* Scores of NH (1..4) heads against the 64 lanes: acc[h][v] lane i = the
 * sum over the pairs of q_h's pair times key 16v + i's, one vdpbf16ps chain
 * per (head, vector) over the D / 2 pairs in increasing order (products of
 * bf16 are exact in f32, so the runs a512__attn_qk sums apart buy nothing
 * here). Four heads make 16 independent chains and share each key load
 * (about 4% faster a block than two heads' 8 chains). A head's chain is
 * the same whatever NH. */
A512_INLINE A512_BF16 void a512__attn_qk_bf(const kern_attn_blk *a, int NH, int D,
                                            const uint32_t *kb, const uint32_t *qh,
                                            __m512 acc[4][4]) {
    _Pragma("GCC unroll 4") for (int h = 0; h < 4; h++)
        _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++) acc[h][v] = _mm512_setzero_ps();
    const size_t qs = (size_t)D / 2; // a head's pairs
    for (int i = 0; i < D / 2; i++) {
        a512__pf_step(a);
        a512__pf_step(a);
        const uint32_t *kr = kb + (size_t)i * KERN_ATTN_BLOCK;
        __m512i k0 = _mm512_load_si512(kr), k1 = _mm512_load_si512(kr + 16),
                k2 = _mm512_load_si512(kr + 32), k3 = _mm512_load_si512(kr + 48);
        __asm__("" : "+v"(k0), "+v"(k1), "+v"(k2), "+v"(k3)); // as a512__attn_qk
        _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++) {
            const __m512bh b = (__m512bh)_mm512_set1_epi32((int)qh[(size_t)h * qs + (size_t)i]);
            acc[h][0] = _mm512_dpbf16_ps(acc[h][0], b, (__m512bh)k0);
            acc[h][1] = _mm512_dpbf16_ps(acc[h][1], b, (__m512bh)k1);
            acc[h][2] = _mm512_dpbf16_ps(acc[h][2], b, (__m512bh)k2);
            acc[h][3] = _mm512_dpbf16_ps(acc[h][3], b, (__m512bh)k3);
        }
    }
}

/* A head's weights e (64 lanes) rounded to bf16: stored as 32 pairs to pb;
 * returns the rounded values' lanewise sums (a pair's high half masked,
 * its low half shifted up), so l sums what P.V multiplies. */
A512_INLINE A512_BF16 __m512 a512__attn_round_bf(const __m512 e[4], uint32_t *pb) {
    const __m512i w0 = a512__bf_pairs(e[0], e[1]), w1 = a512__bf_pairs(e[2], e[3]);
    _mm512_store_si512(pb, w0);
    _mm512_store_si512(pb + 16, w1);
    const __m512i hm = _mm512_set1_epi32((int)0xFFFF0000u);
    return _mm512_add_ps(_mm512_add_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w0, 16)),
                                       _mm512_castsi512_ps(_mm512_and_si512(w0, hm))),
                         _mm512_add_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w1, 16)),
                                       _mm512_castsi512_ps(_mm512_and_si512(w1, hm))));
}

/* a512__attn_pv with bf16 pairs: o_h = o_h * alpha_h + sum over the pairs
 * meeting [lo, hi) of the pair's two weights times its two values, pairs in
 * order; values from vb or, vb NULL, converted from a->vrow here. */
A512_INLINE A512_BF16 void a512__attn_pv_bf(ks_dtype t, int NH, int NC, const kern_attn_blk *a,
                                            const uint32_t *vb, int c0, int lo, int hi,
                                            const uint32_t *pb, const float *alpha, float *o) {
    const size_t Dv = (size_t)a->Dv;
    __m512 y[8][2];
    _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++)
        _Pragma("GCC unroll 2") for (int c = 0; c < NC; c++) y[h][c] =
            _mm512_mul_ps(_mm512_loadu_ps(o + h * Dv + c0 + 16 * c), _mm512_set1_ps(alpha[h]));
    for (int i = lo / 2; i < (hi + 1) / 2; i++) {
        a512__pf_step(a);
        a512__pf_step(a);
        __m512i x[2];
        _Pragma("GCC unroll 2") for (int c = 0; c < NC; c++) x[c] =
            vb ? _mm512_load_si512(vb + (size_t)i * Dv + (size_t)(c0 + 16 * c))
               : a512__bf_vpair(t, a, 2 * i, lo, hi, c0 + 16 * c);
        _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) {
            const __m512bh b = (__m512bh)_mm512_set1_epi32((int)pb[32 * h + i]);
            _Pragma("GCC unroll 2") for (int c = 0; c < NC; c++) y[h][c] =
                _mm512_dpbf16_ps(y[h][c], b, (__m512bh)x[c]);
        }
    }
    _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++)
        _Pragma("GCC unroll 2") for (int c = 0; c < NC; c++)
            _mm512_storeu_ps(o + h * Dv + c0 + 16 * c, y[h][c]);
}

A512_INLINE A512_BF16 void a512__attn_pv_cols_bf(ks_dtype t, int NH, const kern_attn_blk *a,
                                                 const uint32_t *vb, int lo, int hi,
                                                 const uint32_t *pb, const float *alpha, float *o) {
    int c0 = 0;
    for (; c0 + 32 <= a->Dv; c0 += 32)
        a512__attn_pv_bf(t, NH, 2, a, vb, c0, lo, hi, pb, alpha, o);
    if (c0 < a->Dv) a512__attn_pv_bf(t, NH, 1, a, vb, c0, lo, hi, pb, alpha, o);
}

/* a512__attn_heads in bf16; qb and pb: scratch for the heads' q pairs
 * (8 x D / 2 dwords) and weights (8 x 32 dwords). */
A512_INLINE A512_BF16 void a512__attn_heads_bf(ks_dtype t, const kern_attn_blk *a, int r, int g0,
                                               int ng, const uint32_t *kb, const uint32_t *vb,
                                               uint32_t *qb, uint32_t *pb) {
    const size_t x0 = (size_t)r * (size_t)a->G + (size_t)g0, Dv = (size_t)a->Dv;
    const int D = a->D, lo = a->lo[r], hi = a->hi[r];
    const float *q = a->q + (size_t)r * a->q_stride + (size_t)g0 * (size_t)D;
    for (int h = 0; h < ng; h++) // D % 32 == 16: the last run is 8 pairs
        for (int d0 = 0; d0 < D; d0 += 32)
            _mm512_mask_storeu_epi32(
                qb + (size_t)h * (size_t)(D / 2) + d0 / 2, d0 + 16 < D ? 0xFFFF : 0xFF,
                a512__bf_pairs(_mm512_loadu_ps(q + (size_t)h * D + d0),
                               d0 + 16 < D ? _mm512_loadu_ps(q + (size_t)h * D + d0 + 16)
                                           : _mm512_setzero_ps()));
    _Alignas(64) float p[8 * KERN_ATTN_BLOCK];
    float al[8];
    const uint64_t live = a512__attn_live(lo, hi);
    __m512 mx[8], u[8];
    for (int h = 0; h < ng; h += 4) { // as a512__attn_heads, four heads a pass
        const int nh = ng - h >= 4 ? 4 : ng - h;
        __m512 acc[4][4];
        const uint32_t *qh = qb + (size_t)h * (size_t)(D / 2);
        if (nh == 4)
            a512__attn_qk_bf(a, 4, D, kb, qh, acc);
        else if (nh == 3)
            a512__attn_qk_bf(a, 3, D, kb, qh, acc);
        else if (nh == 2)
            a512__attn_qk_bf(a, 2, D, kb, qh, acc);
        else
            a512__attn_qk_bf(a, 1, D, kb, qh, acc);
        for (int i = 0; i < nh; i++)
            mx[h + i] = a512__attn_scale(acc[i], a->scale, live, p + KERN_ATTN_BLOCK * (h + i));
    }
    _Alignas(64) float M[16];
    _mm512_store_ps(M, a512__attn_newmax(ng, mx, a->m + x0, al));
    for (int h = 0; h < ng; h++) {
        __m512 e[4];
        a512__attn_weights(p + KERN_ATTN_BLOCK * h, M[h], live, e);
        u[h] = a512__attn_round_bf(e, pb + 32 * h);
    }
    a512__attn_newsum(ng, u, al, a->l + x0);
    float *o = a->o + x0 * Dv;
    int h = 0; // heads in runs of 8, 4, 2, 1
    for (; h + 8 <= ng; h += 8)
        a512__attn_pv_cols_bf(t, 8, a, vb, lo, hi, pb + 32 * h, al + h, o + h * Dv);
    if (h + 4 <= ng) {
        a512__attn_pv_cols_bf(t, 4, a, vb, lo, hi, pb + 32 * h, al + h, o + h * Dv);
        h += 4;
    }
    if (h + 2 <= ng) {
        a512__attn_pv_cols_bf(t, 2, a, vb, lo, hi, pb + 32 * h, al + h, o + h * Dv);
        h += 2;
    }
    if (h < ng) a512__attn_pv_cols_bf(t, 1, a, vb, lo, hi, pb + 32 * h, al + h, o + h * Dv);
}

A512_INLINE A512_BF16 void a512__attn_block_bf_t(ks_dtype t, const kern_attn_blk *a) {
    int j0, j1;
    const int rows = a512__attn_lanes(a, &j0, &j1);
    if (rows == 0) return;
    // scratch (floats): kb 32 D, vb 32 Dv (more than one row), then the q
    // pairs 4 D and the weights 256: within KERN_ATTN_SCRATCH's 64 (D + Dv)
    uint32_t *kb = (uint32_t *)a->scratch, *vbuf = kb + (size_t)a->D * 32;
    uint32_t *qb = vbuf + (size_t)a->Dv * 32, *pb = qb + (size_t)a->D * 4;
    const uint32_t *vb = rows > 1 ? vbuf : NULL;
    a512__attn_load_bf(t, a, j0 & ~15, j1, kb, rows > 1 ? vbuf : NULL);
    for (int r = 0; r < a->R; r++) {
        if (a->lo[r] >= a->hi[r]) continue;
        for (int g = 0; g < a->G; g += 8)
            a512__attn_heads_bf(t, a, r, g, a->G - g < 8 ? a->G - g : 8, kb, vb, qb, pb);
    }
}

A512_BF16 void kern__a512_attn_block_bf16(const kern_attn_blk *a) {
    switch (a->kv_type) {
    case KS_DTYPE_F16:
        a512__attn_block_bf_t(KS_DTYPE_F16, a);
        break;
    case KS_DTYPE_Q8_0:
        a512__attn_block_bf_t(KS_DTYPE_Q8_0, a);
        break;
    default:
        a512__attn_block_bf_t(KS_DTYPE_F32, a);
        break;
    }
}

// ----------------------------------------------------------------------------
// The int8 dot-product peak (kern_int8_peak_ops)

/* Runs n rounds of 16 independent vpdpbusd chains on zmm registers (no
 * memory operand, so only the multiply-add ports limit it) and returns the
 * lanes' sum so the work cannot be dropped. 16 chains cover the latency
 * (about 4 cycles) times the issue width (2 per cycle) of current cores. */
uint64_t kern__a512_vnni_spin(int64_t n) {
    // sixteen named accumulators, so they stay in registers (an array spills)
    const __m512i u = _mm512_set1_epi8(1), s = _mm512_set1_epi8(-1);
    __m512i a0 = _mm512_set1_epi32(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
            a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
#define A512__DP4(x, y, z, w)                                                                      \
    __asm__ volatile("vpdpbusd %4, %5, %0\n\tvpdpbusd %4, %5, %1\n\t"                              \
                     "vpdpbusd %4, %5, %2\n\tvpdpbusd %4, %5, %3"                                  \
                     : "+v"(x), "+v"(y), "+v"(z), "+v"(w)                                          \
                     : "v"(s), "v"(u))
    for (int64_t it = 0; it < n; it++) {
        A512__DP4(a0, a1, a2, a3);
        A512__DP4(a4, a5, a6, a7);
        A512__DP4(a8, a9, a10, a11);
        A512__DP4(a12, a13, a14, a15);
    }
#undef A512__DP4
    __m512i t = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), a2), a3);
    t = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(t, a4), a5), a6), a7);
    t = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(t, a8), a9), a10), a11);
    t = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(t, a12), a13), a14),
                         a15);
    // the chains wrap (vpdpbusd does not saturate): sum the lanes unsigned,
    // since _mm512_reduce_add_epi32 adds as signed int and may overflow
    uint32_t lane[16], sum = 0;
    _mm512_storeu_si512(lane, t);
    for (int i = 0; i < 16; i++) sum += lane[i];
    return sum;
}
