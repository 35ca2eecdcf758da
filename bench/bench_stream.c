/* bench_stream.c — what decode's matvecs cost beyond reading their weights:
 * for each r16 weight type, the pool's threads (2 by default) stream a
 * matrix far larger than the caches (K = 2048, the 1.1B shape's width) as a
 * decode step does, claiming 16-row groups with shrinking claims, once with
 * the real matvec kernel and once with a loop that only reads the same
 * bytes (the bandwidth probe's prefetching loop, no arithmetic). Types and
 * the reader alternate within each round in one process, so the per-round
 * ratio kernel / reader is taken over the same minutes; a ratio below 1 is
 * what the kernel's instructions cost in memory bandwidth. Built by
 * `make bench` (target bench_stream); not run by ctest.
 * Usage: bench_stream [MB [ROUNDS [THREADS [TYPES]]]]   (MB of weights per
 * type, default 512; ROUNDS 5; THREADS 2; TYPES a comma-separated list,
 * default Q8_0,Q4_0,Q4_K,Q6_K) */
#include "kvseal/base.h"
#include "kvseal/kern.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t cli__membw_sum_pf_avx2(const void *buf, size_t n_bytes); // src/cli/membw_avx2.c

#define BS_K 2048

typedef struct {
    kern_matmul_fn fn; // NULL: read only
    const uint8_t *W;  // r16 groups, gb bytes apart
    size_t gb, ws;     // group bytes, GGUF row bytes
    const void *X;
    size_t xs;
    float *Y;
    int64_t n_groups;
    int nth;
    atomic_llong next;
    uint64_t sink[64];
} bs_run;

/* Claims as the forward pass does (fwd__mm_claim): at most an eighth of a
 * thread's share, at most 1/(2 nth) of what is left, at least one group. */
static void bs_task(void *arg, int ith, int nth) {
    bs_run *a = arg;
    (void)nth;
    const int64_t chunk =
        a->n_groups / (4 * (int64_t)a->nth) > 0 ? a->n_groups / (4 * (int64_t)a->nth) : 1;
    long long u = atomic_load_explicit(&a->next, memory_order_relaxed);
    for (;;) {
        if (u >= a->n_groups) return;
        int64_t n = (a->n_groups - u) / (2 * a->nth);
        n = n < 1 ? 1 : n > chunk ? chunk : n;
        if (!atomic_compare_exchange_weak_explicit(&a->next, &u, u + n, memory_order_relaxed,
                                                   memory_order_relaxed))
            continue;
        const uint8_t *w = a->W + (size_t)u * a->gb;
        if (a->fn)
            a->fn(BS_K, (int)(16 * n), 1, w, a->ws, a->X, a->xs, a->Y + 16 * u,
                  (size_t)(16 * a->n_groups));
        else
            a->sink[ith & 63] ^= cli__membw_sum_pf_avx2(w, (size_t)n * a->gb);
        u = atomic_load_explicit(&a->next, memory_order_relaxed);
    }
}

/* Bytes/s of one pass over the matrix. */
static double bs_pass(ks_pool *pool, bs_run *a) {
    atomic_store(&a->next, 0);
    uint64_t t0 = ks_now_ns();
    ks_pool_run(pool, bs_task, a);
    return (double)a->n_groups * (double)a->gb / ((double)(ks_now_ns() - t0) / 1e9);
}

static int bs_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double bs_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bs_cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv) {
    const long mb = argc > 1 ? atol(argv[1]) : 512, rounds = argc > 2 ? atol(argv[2]) : 5;
    const int nth = argc > 3 ? atoi(argv[3]) : 2;
    const char *list = argc > 4 ? argv[4] : "Q8_0,Q4_0,Q4_K,Q6_K";
    const kern_vtab *v = kern_vtab_for("avx512");
    if (mb < 16 || rounds < 1 || rounds > 99 || nth < 1 || nth > 64) {
        fprintf(stderr, "usage: bench_stream [MB>=16 [ROUNDS 1..99 [THREADS [TYPES]]]]\n");
        return 2;
    }
    if (!v || !ks_cpu_get()->avx2) {
        printf("bench_stream: SKIPPED: the r16 kernels need AVX-512 and the read-only loop AVX2\n");
        return 0;
    }
    enum { MAXT = 8 };
    bs_run runs[MAXT];
    const char *names[MAXT];
    int nt = 0;
    float *xf = ks_alloc_aligned(sizeof(float) * BS_K),
          *row = ks_alloc_aligned(sizeof(float) * BS_K);
    for (int k = 0; k < BS_K; k++)
        xf[k] = (float)((k * 7919) % 201 - 100) / 50.0f;
    for (uint32_t t = 0; t < KS_DTYPE__COUNT && nt < MAXT; t++) {
        const char *name = ks_dtype_name(t);
        size_t nl = strlen(name);
        bool listed = false;
        for (const char *p = list; *p && !listed;) {
            const char *e = strchr(p, ',');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            listed = len == nl && strncmp(p, name, nl) == 0;
            p = e ? e + 1 : p + len;
        }
        const size_t gb = listed ? kern_r16_group_bytes(t, BS_K) : 0;
        if (!gb || !v->matmul_r16[t]) continue;
        uint64_t ws = 0, xs = 0;
        ks_dtype at = kern_act_type(t);
        ks_dtype_row_bytes(t, BS_K, &ws);
        ks_dtype_row_bytes(at, BS_K, &xs);
        // 64 groups of quantized rows, repacked, tiled over the whole buffer:
        // the kernels' time does not depend on the values
        enum { SRC_GROUPS = 64 };
        uint8_t *src = ks_alloc_aligned(ws * 16 * SRC_GROUPS);
        uint64_t rng = 88172645463325252ull;
        for (int r = 0; r < 16 * SRC_GROUPS; r++) {
            for (int k = 0; k < BS_K; k++) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                row[k] = (float)((double)(rng >> 11) / 4503599627370496.0 - 1.0);
            }
            kern_quantize_row(t, row, src + ws * (size_t)r, BS_K);
        }
        const int64_t n_groups = ((int64_t)mb << 20) / (int64_t)gb / SRC_GROUPS * SRC_GROUPS;
        uint8_t *W = ks_alloc_huge((size_t)n_groups * gb);
        void *X = ks_alloc_aligned(xs);
        float *Y = ks_alloc_aligned(sizeof(float) * 16 * (size_t)n_groups);
        if (!src || !W || !X || !Y) {
            fprintf(stderr, "bench_stream: out of memory\n");
            return 1;
        }
        for (int g = 0; g < SRC_GROUPS; g++)
            kern_r16_pack(t, BS_K, src + ws * 16 * (size_t)g, ws, W + gb * (size_t)g);
        for (int64_t g = SRC_GROUPS; g < n_groups; g += SRC_GROUPS)
            memcpy(W + gb * (size_t)g, W, gb * SRC_GROUPS);
        kern_quantize_row(at, xf, X, BS_K);
        ks_free_aligned(src);
        runs[nt] = (bs_run){.fn = v->matmul_r16[t],
                            .W = W,
                            .gb = gb,
                            .ws = ws,
                            .X = X,
                            .xs = xs,
                            .Y = Y,
                            .n_groups = n_groups,
                            .nth = nth};
        names[nt++] = name;
    }
    ks_pool *pool = ks_pool_create(nth);
    if (!nt || !pool) {
        fprintf(stderr, "bench_stream: no r16 type in '%s' (or no memory)\n", list);
        return 1;
    }
    printf("bench_stream: %ld MB per type, K = %d, %d threads, %ld rounds; GB/s of weights\n", mb,
           BS_K, nth, rounds);
    printf("%-6s %10s %10s %8s\n", "type", "kernel", "read only", "ratio");
    double kern[MAXT][99], rd[MAXT][99], ratio[MAXT][99];
    for (long r = 0; r < rounds; r++)
        for (int i = 0; i < nt; i++) { // kernel, then reader, type after type
            kern[i][r] = bs_pass(pool, &runs[i]);
            kern_matmul_fn fn = runs[i].fn;
            runs[i].fn = NULL;
            rd[i][r] = bs_pass(pool, &runs[i]);
            runs[i].fn = fn;
            ratio[i][r] = kern[i][r] / rd[i][r];
            printf("%-6s %10.2f %10.2f %8.3f   (round %ld)\n", names[i], kern[i][r] / 1e9,
                   rd[i][r] / 1e9, ratio[i][r], r + 1);
            fflush(stdout);
        }
    printf("medians:\n");
    for (int i = 0; i < nt; i++)
        printf("%-6s %10.2f %10.2f %8.3f\n", names[i], bs_median(kern[i], (int)rounds) / 1e9,
               bs_median(rd[i], (int)rounds) / 1e9, bs_median(ratio[i], (int)rounds));
    uint64_t s = 0;
    for (int i = 0; i < nt; i++)
        s ^= runs[i].sink[0] ^ (uint64_t)runs[i].Y[0];
    if (s == 0x1234567) printf(" \n"); // keep the reads observable
    ks_pool_destroy(pool);
    return 0;
}
