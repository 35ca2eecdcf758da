/* bench_kern.c — kernel throughput, one thread: for every vtab this CPU
 * supports, validate each entry against the _ref oracle (the llm.c dev/cpu
 * pattern: never time a wrong kernel), then time a 4096x4096 matvec per
 * weight type (GB/s of weights streamed, GFLOP/s) and a 16-column matmul
 * (GFLOP/s). Built by `make bench` (target bench_kern); not run by ctest.
 * Usage: bench_kern [K [ISA [TYPES]]]   (K = rows = cols, default 4096,
 * multiple of 256; ISA limits the timing to ref, avx2 or avx512; TYPES, a
 * comma-separated list such as Q5_K,Q3_K, to those weight types: shorter
 * runs for alternated A/B medians) */
#include "kern/kern_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t bench_rng = 88172645463325252ull;

static float bench_randf(void) { // xorshift64, uniform [-1, 1)
    bench_rng ^= bench_rng << 13;
    bench_rng ^= bench_rng >> 7;
    bench_rng ^= bench_rng << 17;
    return (float)((double)(bench_rng >> 11) / 4503599627370496.0 - 1.0);
}

static void *bench_alloc(size_t n) {
    void *p = ks_alloc_huge(n); // as the model keeps its r16 weights
    if (!p) {
        fprintf(stderr, "bench_kern: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* Whether the type named name is in the comma-separated list (NULL: all). */
static bool bench_type_listed(const char *list, const char *name) {
    if (!list) return true;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

/* Seconds per call of one matmul, best of several runs lasting >= 0.2 s. */
static double bench_time(kern_matmul_fn fn, int64_t K, int n_rows, int n_cols, const void *W,
                         size_t ws, const void *X, size_t xs, float *Y) {
    double best = 1e30, total = 0.0;
    for (int it = 0; it < 50 && (total < 0.2 || it < 2); it++) {
        uint64_t t0 = ks_now_ns();
        fn(K, n_rows, n_cols, W, ws, X, xs, Y, (size_t)n_rows);
        double s = (double)(ks_now_ns() - t0) * 1e-9;
        total += s;
        if (s < best) best = s;
    }
    return best;
}

/* |w| per element for the tolerance: for Q4_K the two terms the kernel sums,
 * |d*sc*q| + |dmin*m| (as tests/unit/test_kern.c). */
static void bench_abs_weights(ks_dtype t, const uint8_t *row, float *out, int64_t K) {
    kern_dequantize_row(t, row, out, K);
    for (int64_t k = 0; k < K; k++) out[k] = fabsf(out[k]);
    // the other offset types: |w| + 2|offset| bounds the two terms summed
    if (t == KS_DTYPE_Q4_1 || t == KS_DTYPE_Q5_1) {
        size_t bb = ks_dtype_block_bytes(t);
        for (int64_t k = 0; k < K; k++) {
            uint16_t m;
            memcpy(&m, row + (size_t)(k / 32) * bb + 2, 2);
            out[k] += 2.0f * fabsf(ks_f16_to_f32(m));
        }
    } else if (t == KS_DTYPE_Q5_K) {
        const kern_block_q5_K *b = (const kern_block_q5_K *)(const void *)row;
        for (int64_t k = 0; k < K; k++) {
            int sc, m;
            kern__q4k_scale_min(b[k / 256].scales, (int)(k % 256) / 32, &sc, &m);
            out[k] += 2.0f * ks_f16_to_f32(b[k / 256].dmin) * (float)m;
        }
    } else if (t == KS_DTYPE_Q2_K) {
        const kern_block_q2_K *b = (const kern_block_q2_K *)(const void *)row;
        for (int64_t k = 0; k < K; k++)
            out[k] += 2.0f * ks_f16_to_f32(b[k / 256].dmin) *
                      (float)(b[k / 256].scales[k % 256 / 16] >> 4);
    }
    if (t != KS_DTYPE_Q4_K) return;
    const kern_block_q4_K *b = (const kern_block_q4_K *)(const void *)row;
    for (int64_t i = 0; i < K / 256; i++)
        for (int j = 0; j < 8; j++) {
            int sc, m;
            kern__q4k_scale_min(b[i].scales, j, &sc, &m);
            for (int l = 0; l < 32; l++) {
                int q = (b[i].qs[32 * (j / 2) + l] >> ((j & 1) ? 4 : 0)) & 15;
                out[256 * i + 32 * j + l] =
                    ks_f16_to_f32(b[i].d) * (float)(sc * q) + ks_f16_to_f32(b[i].dmin) * (float)m;
            }
        }
}

/* Validates v->matmul[wt] against ref on the first rows (relative 1e-5 of
 * sum|w*x|, the tolerance of tests/unit/test_kern.c) and 1x1 == tile
 * bit-exactness. Returns false on a mismatch. */
static bool bench_validate(const kern_vtab *v, ks_dtype wt, int64_t K, const uint8_t *W,
                           size_t ws, const uint8_t *X, size_t xs) {
    enum { R = 32, C = 5 };
    float Y[R * C], Yr[R * C], *wd = malloc(sizeof(float) * (size_t)K),
                           *xd = malloc(sizeof(float) * (size_t)K);
    if (!wd || !xd) exit(1);
    v->matmul[wt](K, R, C, W, ws, X, xs, Y, R);
    kern__vtab_ref.matmul[wt](K, R, C, W, ws, X, xs, Yr, R);
    bool ok = true;
    for (int c = 0; c < C && ok; c++) {
        kern_dequantize_row(kern_act_type(wt), X + (size_t)c * xs, xd, K);
        for (int r = 0; r < R && ok; r++) {
            bench_abs_weights(wt, W + (size_t)r * ws, wd, K);
            double S = 0.0;
            for (int64_t k = 0; k < K; k++) S += fabs((double)wd[k] * xd[k]);
            float y1;
            v->matmul[wt](K, 1, 1, W + (size_t)r * ws, ws, X + (size_t)c * xs, xs, &y1, 1);
            if (fabs((double)Y[c * R + r] - Yr[c * R + r]) > 1e-5 * S + 1e-30 ||
                memcmp(&y1, &Y[c * R + r], sizeof y1) != 0) {
                fprintf(stderr, "bench_kern: %s %s row %d col %d: %.9g vs ref %.9g (1x1 %.9g)\n",
                        v->name, ks_dtype_name(wt), r, c, Y[c * R + r], Yr[c * R + r], y1);
                ok = false;
            }
        }
    }
    free(wd);
    free(xd);
    return ok;
}

/* Validates the activation quantizers (same bytes) and vector ops. */
static bool bench_validate_vec(const kern_vtab *v, int64_t n, const float *x) {
    static const ks_dtype ats[] = {KS_DTYPE_Q8_0, KS_DTYPE_Q8_K};
    bool ok = true;
    for (int a = 0; a < 2; a++) {
        uint64_t rb = 0;
        if (!ks_dtype_row_bytes(ats[a], (uint64_t)n, &rb)) return false;
        uint8_t *q = malloc(rb), *qr = malloc(rb);
        if (!q || !qr) exit(1);
        v->quantize_act[ats[a]](x, q, n);
        kern__vtab_ref.quantize_act[ats[a]](x, qr, n);
        if (memcmp(q, qr, rb) != 0) {
            fprintf(stderr, "bench_kern: %s quantize_act %s differs from ref\n", v->name,
                    ks_dtype_name(ats[a]));
            ok = false;
        }
        free(q);
        free(qr);
    }
    float *y = malloc(sizeof(float) * (size_t)n), *yr = malloc(sizeof(float) * (size_t)n);
    if (!y || !yr) exit(1);
    memcpy(y, x, sizeof(float) * (size_t)n);
    memcpy(yr, x, sizeof(float) * (size_t)n);
    v->softmax(n, y);
    kern__softmax_ref(n, yr);
    for (int64_t i = 0; i < n; i++)
        if (fabsf(y[i] - yr[i]) > 1e-5f * fabsf(yr[i]) + 1e-37f) ok = false;
    v->silu_mul(n, x, x, y);
    kern__silu_mul_ref(n, x, x, yr);
    for (int64_t i = 0; i < n; i++)
        if (fabsf(y[i] - yr[i]) > 1e-5f * fabsf(yr[i]) + 1e-37f) ok = false;
    v->rmsnorm(n, x, x, 1e-5f, y);
    kern__rmsnorm_ref(n, x, x, 1e-5f, yr);
    for (int64_t i = 0; i < n; i++)
        if (fabsf(y[i] - yr[i]) > 1e-5f * fabsf(yr[i]) + 1e-37f) ok = false;
    if (!ok) fprintf(stderr, "bench_kern: %s vector ops differ from ref\n", v->name);
    free(y);
    free(yr);
    return ok;
}

int main(int argc, char **argv) {
    int64_t K = argc > 1 ? atoll(argv[1]) : 4096;
    if (K <= 0 || K % 256 != 0) {
        fprintf(stderr, "usage: bench_kern [K [ISA]]   (K a positive multiple of 256)\n");
        return 2;
    }
    const char *only = argc > 2 ? argv[2] : NULL, *types = argc > 3 ? argv[3] : NULL;
    int N = (int)K, NC = 16;
    static const ks_dtype wts[] = {KS_DTYPE_F32,  KS_DTYPE_F16,  KS_DTYPE_BF16,   KS_DTYPE_Q8_0,
                                   KS_DTYPE_Q4_0, KS_DTYPE_Q4_K, KS_DTYPE_Q6_K,   KS_DTYPE_Q4_1,
                                   KS_DTYPE_Q5_0, KS_DTYPE_Q5_1, KS_DTYPE_IQ4_NL, KS_DTYPE_Q2_K,
                                   KS_DTYPE_Q3_K, KS_DTYPE_Q5_K, KS_DTYPE_IQ4_XS, KS_DTYPE_MXFP4};
    static const char *const isas[] = {"ref", "avx2", "avx512"};
    float *xf = bench_alloc(sizeof(float) * (size_t)K * (size_t)NC);
    for (int64_t i = 0; i < K * NC; i++) xf[i] = bench_randf() * 2.0f;
    float *row = bench_alloc(sizeof(float) * (size_t)K), *Y = bench_alloc(sizeof(float) * (size_t)N * (size_t)NC);
    bool all_ok = true;
    printf("bench_kern: %lldx%lld, 1 thread; matvec = 1 column, matmul = %d columns\n",
           (long long)N, (long long)K, NC);
    for (int iv = 0; iv < 3; iv++) {
        const kern_vtab *v = kern_vtab_for(isas[iv]);
        if (!v) {
            printf("%-7s not supported on this CPU\n", isas[iv]);
            continue;
        }
        if (!bench_validate_vec(v, K, xf)) all_ok = false;
    }
    printf("%-7s %-6s %10s %9s %9s %12s\n", "isa", "type", "matvec ms", "GB/s", "GFLOP/s",
           "mm GFLOP/s");
    for (size_t t = 0; t < sizeof wts / sizeof wts[0]; t++) {
        ks_dtype wt = wts[t], at = kern_act_type(wt);
        if (!bench_type_listed(types, ks_dtype_name(wt))) continue;
        uint64_t ws = 0, xs = 0;
        if (!ks_dtype_row_bytes(wt, (uint64_t)K, &ws) || !ks_dtype_row_bytes(at, (uint64_t)K, &xs))
            return 1;
        uint8_t *W = bench_alloc(ws * (size_t)N), *X = bench_alloc(xs * (size_t)NC);
        for (int r = 0; r < N; r++) {
            for (int64_t k = 0; k < K; k++) row[k] = bench_randf();
            kern_quantize_row(wt, row, W + ws * (size_t)r, K);
        }
        for (int c = 0; c < NC; c++) kern_quantize_row(at, xf + K * c, X + xs * (size_t)c, K);
        for (int iv = 0; iv < 3; iv++) {
            const kern_vtab *v = kern_vtab_for(isas[iv]);
            if (!v || (only && strcmp(only, isas[iv]) != 0)) continue;
            if (!bench_validate(v, wt, K, W, ws, X, xs)) {
                all_ok = false;
                printf("%-7s %-6s INVALID (differs from ref), not timed\n", v->name,
                       ks_dtype_name(wt));
                continue;
            }
            double s1 = bench_time(v->matmul[wt], K, N, 1, W, ws, X, xs, Y);
            double sn = bench_time(v->matmul[wt], K, N, NC, W, ws, X, xs, Y);
            double flop = 2.0 * (double)K * N;
            printf("%-7s %-6s %10.3f %9.2f %9.2f %12.2f\n", v->name, ks_dtype_name(wt), s1 * 1e3,
                   (double)ws * N / s1 * 1e-9, flop / s1 * 1e-9, flop * NC / sn * 1e-9);
            fflush(stdout);
            size_t gb = kern_r16_group_bytes(wt, K);
            if (!v->matmul_r16[wt] || strcmp(v->name, "avx512") != 0 || !gb) continue;
            // the same weights repacked as model loading does (kern_r16_wanted)
            uint8_t *Wp = bench_alloc(gb * (size_t)(N / 16));
            for (int g = 0; g < N / 16; g++)
                kern_r16_pack(wt, K, W + ws * (size_t)(16 * g), ws, Wp + gb * (size_t)g);
            s1 = bench_time(v->matmul_r16[wt], K, N, 1, Wp, ws, X, xs, Y);
            sn = bench_time(v->matmul_r16[wt], K, N, NC, Wp, ws, X, xs, Y);
            printf("%-7s %-6s %10.3f %9.2f %9.2f %12.2f  (r16)\n", v->name, ks_dtype_name(wt),
                   s1 * 1e3, (double)ws * N / s1 * 1e-9, flop / s1 * 1e-9, flop * NC / sn * 1e-9);
            fflush(stdout);
            ks_free_aligned(Wp);
        }
        ks_free_aligned(W);
        ks_free_aligned(X);
    }
    ks_free_aligned(xf);
    ks_free_aligned(row);
    ks_free_aligned(Y);
    if (!all_ok) {
        fprintf(stderr, "bench_kern: some kernels differ from ref\n");
        return 1;
    }
    return 0;
}
