/* dispatch.c — run-time ISA selection (kern_init / kern_get), reference
 * (de)quantization of whole rows, whether to repack into r16, and RoPE
 * (the weight type table and the r16 layout are common.c's).
 *
 * The CPU is probed once through ks_cpu_get() (CPUID + XGETBV, base/cpu.c);
 * the chosen vtab is published with release/acquire so kern_get is safe from
 * any thread after kern_init. STYLE.md section 9 has the rules. */
#include "kern/kern_int.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// ISA selection

static _Atomic(const kern_vtab *) kern__chosen = NULL;

static bool kern__isa_ok(const char *isa) {
    const ks_cpu *cpu = ks_cpu_get();
    if (strcmp(isa, "ref") == 0) return true;
    if (strcmp(isa, "avx2") == 0) return cpu->avx2;
    if (strcmp(isa, "avx512") == 0) return cpu->avx512;
    return false;
}

const kern_vtab *kern_vtab_for(const char *isa) {
    if (!isa || !kern__isa_ok(isa)) return NULL;
    if (strcmp(isa, "avx512") == 0) return &kern__vtab_avx512;
    if (strcmp(isa, "avx2") == 0) return &kern__vtab_avx2;
    return &kern__vtab_ref;
}

bool kern_attn_bf16(const kern_vtab *v) {
    const char *e = getenv("KS_ATTN");
    return e && strcmp(e, "bf16") == 0 && v->attn_block_bf16 && ks_cpu_get()->avx512bf16;
}

kern_attn_block_fn kern_attn_block(const kern_vtab *v) {
    return kern_attn_bf16(v) ? v->attn_block_bf16 : v->attn_block;
}

static const kern_vtab *kern__best(void) {
    const kern_vtab *v = kern_vtab_for("avx512");
    if (!v) v = kern_vtab_for("avx2");
    if (!v) v = &kern__vtab_ref;
    return v;
}

ks_err kern_init(const char *isa, ks_errbuf *eb) {
    const char *src = "argument";
    if (!isa) {
        isa = getenv("KS_FORCE_ISA");
        src = "KS_FORCE_ISA";
        if (isa && !*isa) isa = NULL;
    }
    const char *at = getenv("KS_ATTN");
    if (at && *at && strcmp(at, "f32") != 0 && strcmp(at, "bf16") != 0)
        return ks_seterr(eb, KS_ERR_INVAL, "kern: unknown KS_ATTN '%s'; want f32 or bf16", at);
    if (at && strcmp(at, "bf16") == 0 && !ks_cpu_get()->avx512bf16)
        return ks_seterr(eb, KS_ERR_UNSUPPORTED,
                         "kern: KS_ATTN=bf16 needs AVX512-BF16 dot products, which this CPU lacks");
    const kern_vtab *v;
    if (!isa) {
        v = kern__best();
        ks_log(KS_LOG_INFO, "kern: using %s kernels (best supported)", v->name);
    } else {
        if (strcmp(isa, "ref") != 0 && strcmp(isa, "avx2") != 0 && strcmp(isa, "avx512") != 0)
            return ks_seterr(eb, KS_ERR_INVAL, "kern: unknown ISA '%s' (%s); want ref, avx2 or avx512",
                             isa, src);
        v = kern_vtab_for(isa);
        if (!v)
            return ks_seterr(eb, KS_ERR_UNSUPPORTED,
                             "kern: ISA '%s' (%s) is not supported by this CPU/OS", isa, src);
        ks_log(KS_LOG_INFO, "kern: using %s kernels (forced by %s)", v->name, src);
    }
    atomic_store_explicit(&kern__chosen, v, memory_order_release);
    ks_errbuf_clear(eb);
    return KS_OK;
}

const kern_vtab *kern_get(void) {
    const kern_vtab *v = atomic_load_explicit(&kern__chosen, memory_order_acquire);
    return v ? v : kern__best();
}

// ----------------------------------------------------------------------------
// Rows: reference (de)quantization

void kern_quantize_row(ks_dtype t, const float *x, void *y, int64_t n) {
    KS_ASSERT(n >= 0 && ks_dtype_block_elems(t) > 0 && n % ks_dtype_block_elems(t) == 0);
    switch (t) {
    case KS_DTYPE_F32: kern__quantize_f32_ref(x, y, n); break;
    case KS_DTYPE_F16: kern__quantize_f16_ref(x, y, n); break;
    case KS_DTYPE_BF16: kern__quantize_bf16_ref(x, y, n); break;
    case KS_DTYPE_Q8_0: kern__quantize_q8_0_ref(x, y, n); break;
    case KS_DTYPE_Q4_0: kern__quantize_q4_0_ref(x, y, n); break;
    case KS_DTYPE_Q4_K: kern__quantize_q4_K_ref(x, y, n); break;
    case KS_DTYPE_Q6_K: kern__quantize_q6_K_ref(x, y, n); break;
    case KS_DTYPE_Q8_K: kern__quantize_q8_K_ref(x, y, n); break;
    case KS_DTYPE_Q4_1:
        kern__quantize_q4_1_ref(x, y, n);
        break;
    case KS_DTYPE_Q5_0:
        kern__quantize_q5_0_ref(x, y, n);
        break;
    case KS_DTYPE_Q5_1:
        kern__quantize_q5_1_ref(x, y, n);
        break;
    case KS_DTYPE_IQ4_NL:
        kern__quantize_iq4_nl_ref(x, y, n);
        break;
    case KS_DTYPE_Q5_K:
        kern__quantize_q5_K_ref(x, y, n);
        break;
    case KS_DTYPE_Q3_K:
        kern__quantize_q3_K_ref(x, y, n);
        break;
    case KS_DTYPE_Q2_K:
        kern__quantize_q2_K_ref(x, y, n);
        break;
    case KS_DTYPE_IQ4_XS:
        kern__quantize_iq4_xs_ref(x, y, n);
        break;
    case KS_DTYPE_TQ1_0: kern__quantize_tq1_0_ref(x, y, n); break;
    case KS_DTYPE_TQ2_0: kern__quantize_tq2_0_ref(x, y, n); break;
    case KS_DTYPE_MXFP4: kern__quantize_mxfp4_ref(x, y, n); break;
    default: KS_ASSERT(!"kern_quantize_row: unsupported type");
    }
}

void kern_dequantize_row(ks_dtype t, const void *x, float *y, int64_t n) {
    KS_ASSERT(n >= 0 && ks_dtype_block_elems(t) > 0 && n % ks_dtype_block_elems(t) == 0);
    switch (t) {
    case KS_DTYPE_F32: kern__dequantize_f32_ref(x, y, n); break;
    case KS_DTYPE_F16: kern__dequantize_f16_ref(x, y, n); break;
    case KS_DTYPE_BF16: kern__dequantize_bf16_ref(x, y, n); break;
    case KS_DTYPE_Q8_0: kern__dequantize_q8_0_ref(x, y, n); break;
    case KS_DTYPE_Q4_0: kern__dequantize_q4_0_ref(x, y, n); break;
    case KS_DTYPE_Q4_K: kern__dequantize_q4_K_ref(x, y, n); break;
    case KS_DTYPE_Q6_K: kern__dequantize_q6_K_ref(x, y, n); break;
    case KS_DTYPE_Q8_K: kern__dequantize_q8_K_ref(x, y, n); break;
    case KS_DTYPE_Q4_1:
        kern__dequantize_q4_1_ref(x, y, n);
        break;
    case KS_DTYPE_Q5_0:
        kern__dequantize_q5_0_ref(x, y, n);
        break;
    case KS_DTYPE_Q5_1:
        kern__dequantize_q5_1_ref(x, y, n);
        break;
    case KS_DTYPE_IQ4_NL:
        kern__dequantize_iq4_nl_ref(x, y, n);
        break;
    case KS_DTYPE_Q5_K:
        kern__dequantize_q5_K_ref(x, y, n);
        break;
    case KS_DTYPE_Q3_K:
        kern__dequantize_q3_K_ref(x, y, n);
        break;
    case KS_DTYPE_Q2_K:
        kern__dequantize_q2_K_ref(x, y, n);
        break;
    case KS_DTYPE_IQ4_XS:
        kern__dequantize_iq4_xs_ref(x, y, n);
        break;
    case KS_DTYPE_TQ1_0: kern__dequantize_tq1_0_ref(x, y, n); break;
    case KS_DTYPE_TQ2_0: kern__dequantize_tq2_0_ref(x, y, n); break;
    case KS_DTYPE_MXFP4: kern__dequantize_mxfp4_ref(x, y, n); break;
    case KS_DTYPE_IQ2_XXS: kern__dequantize_iq2_xxs_ref(x, y, n); break;
    case KS_DTYPE_IQ2_XS: kern__dequantize_iq2_xs_ref(x, y, n); break;
    case KS_DTYPE_IQ2_S: kern__dequantize_iq2_s_ref(x, y, n); break;
    case KS_DTYPE_IQ3_XXS: kern__dequantize_iq3_xxs_ref(x, y, n); break;
    case KS_DTYPE_IQ3_S: kern__dequantize_iq3_s_ref(x, y, n); break;
    case KS_DTYPE_IQ1_S: kern__dequantize_iq1_s_ref(x, y, n); break;
    case KS_DTYPE_IQ1_M: kern__dequantize_iq1_m_ref(x, y, n); break;
    default: KS_ASSERT(!"kern_dequantize_row: unsupported type");
    }
}

// ----------------------------------------------------------------------------
// r16: when to repack (the layout itself is common.c's)

bool kern_r16_wanted(ks_dtype t, int64_t K, int64_t N) {
    if (kern_r16_group_bytes(t, K) == 0 || N <= 0 || N % 16) return false;
    const char *e = getenv("KS_NO_REPACK"); // A/B benchmarks and debugging
    if (e && *e && strcmp(e, "0") != 0) return false;
    // only the AVX-512 VNNI kernel gains from the layout; the others would
    // unpack it again on every call
    return kern_get() == &kern__vtab_avx512 && ks_cpu_get()->avx512vnni;
}

// ----------------------------------------------------------------------------
// RoPE

/* Angles are computed in double (pos can be large; float pos*theta loses
 * the low bits) and applied in float. Pair i (i < n_rot/2) rotates by
 * pos * freq_scale * base^(-2i/n_rot) (freq_scale = 1/factor, kern.h). neox pairs are (x[i], x[i + n_rot/2]),
 * as llama.cpp's NEOX mode with n_dims = n_rot. */
void kern_rope_table(float *cs, int n_rot, int64_t pos, float freq_base, float freq_scale) {
    kern_rope_cfg c = {
        .n_rot = n_rot, .freq_base = freq_base, .freq_scale = freq_scale, .attn_factor = 1.0f};
    kern_rope_table_cfg(cs, &c, pos);
}

void kern_rope_yarn_corr(int n_rot, int n_ctx_orig, float freq_base, float beta_fast,
                         float beta_slow, float *lo, float *hi) {
    // pair i turns n_ctx_orig / (2 pi base^(2i/n_rot)) times: solved for i
    const double two_pi = 6.283185307179586;
    double l = floor((double)n_rot * log((double)n_ctx_orig / ((double)beta_fast * two_pi)) /
                     (2.0 * log((double)freq_base)));
    double h = ceil((double)n_rot * log((double)n_ctx_orig / ((double)beta_slow * two_pi)) /
                    (2.0 * log((double)freq_base)));
    *lo = (float)(l > 0.0 ? l : 0.0);
    *hi = (float)(h < (double)(n_rot - 1) ? h : (double)(n_rot - 1));
}

void kern_rope_table_cfg(float *cs, const kern_rope_cfg *c, int64_t pos) {
    KS_ASSERT(c->n_rot >= 0 && c->n_rot % 2 == 0);
    double mscale = c->attn_factor;
    if (c->ext_factor != 0.0f) mscale *= 1.0 + 0.1 * log(1.0 / (double)c->freq_scale);
    for (int i = 0; i < c->n_rot / 2; i++) {
        const double p = pow((double)c->freq_base, -2.0 * (double)i / (double)c->n_rot);
        const double ff = c->freq_factors ? (double)c->freq_factors[i] : 1.0;
        double theta = (double)pos * (double)c->freq_scale * p / ff;
        if (c->ext_factor != 0.0f) {
            double y = ((double)i - c->corr_lo) / fmax(0.001, (double)c->corr_hi - c->corr_lo);
            double r = (1.0 - fmin(1.0, fmax(0.0, y))) * (double)c->ext_factor;
            theta = theta * (1.0 - r) + (double)pos * p / ff * r;
        }
        cs[2 * i] = (float)(cos(theta) * mscale);
        cs[2 * i + 1] = (float)(sin(theta) * mscale);
    }
}

void kern_rope_apply(float *x, int n_rot, const float *cs, bool neox) {
    int half = n_rot / 2;
    for (int i = 0; i < half; i++) {
        float c = cs[2 * i], s = cs[2 * i + 1];
        int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        float x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * c - x1 * s;
        x[i1] = x0 * s + x1 * c;
    }
}

void kern_rope(float *x, int n_dims, int n_rot, int64_t pos, float freq_base, float freq_scale,
               bool neox) {
    KS_ASSERT(n_rot >= 0 && n_rot <= n_dims && n_rot % 2 == 0 && n_rot <= 1024);
    float cs[1024];
    kern_rope_table(cs, n_rot, pos, freq_base, freq_scale);
    kern_rope_apply(x, n_rot, cs, neox);
}

double kern_int8_peak_ops(int ms) {
    const ks_cpu *cpu = ks_cpu_get();
    if (!cpu->avx512 || !cpu->avx512vnni || ms < 5) return 0.0;
    // calibrate a round count lasting about ms / 5, then keep the best of 5
    int64_t n = 1 << 12;
    double best = 0.0, run_ns = (double)ms * 1e6 / 5.0;
    volatile uint64_t sink = 0;
    for (;;) {
        uint64_t t0 = ks_now_ns();
        sink += kern__a512_vnni_spin(n);
        double dt = (double)(ks_now_ns() - t0);
        if (dt >= run_ns / 4 || n >= ((int64_t)1 << 40)) break;
        n *= 2;
    }
    const double per_round = 16.0 * 128.0; // 16 instructions of 64 u8 x s8 multiply-adds
    for (int r = 0; r < 5; r++) {
        const int64_t nr = n * 4;
        uint64_t t0 = ks_now_ns();
        sink += kern__a512_vnni_spin(nr);
        double dt = (double)(ks_now_ns() - t0) * 1e-9;
        if (dt > 0 && (double)nr * per_round / dt > best) best = (double)nr * per_round / dt;
    }
    (void)sink;
    return best;
}
