/* bench_attn.c — the attention block kernel of one decode row (kern.h
 * attn_block: R = 1, G = 8 query heads of D = 64, f16 KV) on one thread,
 * in cache and streaming from memory, cycles (TSC) per block of 64
 * positions for one KV head. Three ways of reading a cache of 4 KV heads
 * in token-major rows of 512 bytes, as kvseal's pages hold them:
 *   slice  one head's 128 bytes of each row a pass, the next block's
 *          rows prefetched in one burst before the block (the decode path
 *          before attn.c's chunks);
 *   rows   the 4 heads of a block one after another, so whole rows are
 *          read, the next block's rows prefetched by the kernel a line at a
 *          time as it computes (kern_attn_blk.pf; attn.c's decode chunks);
 *   burst  as rows, with the burst of prefetches instead.
 * Built by `make bench` (target bench_attn); not run by ctest.
 * Usage: bench_attn [POSITIONS (262144: 256 MiB of K and V, past any
 * cache)] [REPS (5)] — prints the median of REPS passes per way; alternate
 * runs for A/B, the host is shared. */
#include "kvseal/base.h"
#include "kvseal/kern.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>

enum { D = 64, G = 8, HKV = 4, ROW = HKV * D * 2, BLK = KERN_ATTN_BLOCK };

typedef enum { WAY_SLICE, WAY_ROWS, WAY_BURST, WAY__N } bench_way;
static const char *const way_name[WAY__N] = {"slice", "rows", "burst"};

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* One pass over npos positions of K (k) and V (v) in the given way;
 * returns TSC ticks. */
static uint64_t bench_pass(const kern_vtab *vt, bench_way way, const uint8_t *k, const uint8_t *v,
                           int npos, const float *q, float *scratch) {
    const kern_attn_block_fn fn = kern_attn_block(vt);
    float m[HKV][G], l[HKV][G], o[HKV][G * D];
    for (int x = 0; x < HKV; x++)
        for (int g = 0; g < G; g++)
            m[x][g] = -INFINITY, l[x][g] = 0.0f;
    memset(o, 0, sizeof o);
    const uint8_t *kr[BLK], *vr[BLK], *pk[BLK], *pv[BLK];
    int lo = 0, hi = BLK;
    kern_attn_blk a = {.D = D, .Dv = D, .G = G, .R = 1, .kv_type = KS_DTYPE_F16,
                       .q_stride = (size_t)(HKV * G * D), .krow = kr, .vrow = vr, .n = BLK,
                       .lo = &lo, .hi = &hi, .scale = 0.125f, .scratch = scratch};
    const int nb = npos / BLK, passes = way == WAY_SLICE ? HKV : 1;
    const uint64_t t0 = __rdtsc();
    for (int p = 0; p < passes; p++)
        for (int b = 0; b < nb; b++) {
            const int x0 = way == WAY_SLICE ? p : 0, nx = way == WAY_SLICE ? 1 : HKV;
            // the next block's rows (this pass's slice, or whole rows)
            const size_t off = (size_t)x0 * D * 2, span = (size_t)nx * D * 2;
            kern_attn_pf pf = {.k = pk, .v = pv, .lines = (int)(span / 64)};
            for (int i = 0; i < BLK && b + 1 < nb; i++) {
                pk[i] = k + (size_t)((b + 1) * BLK + i) * ROW + off;
                pv[i] = v + (size_t)((b + 1) * BLK + i) * ROW + off;
                pf.n++;
                if (way == WAY_ROWS) continue;
                for (size_t x = 0; x < span; x += 64) {
                    _mm_prefetch((const char *)pk[i] + x, _MM_HINT_T0);
                    _mm_prefetch((const char *)pv[i] + x, _MM_HINT_T0);
                }
            }
            a.pf = way == WAY_ROWS && vt->attn_prefetch ? &pf : NULL;
            for (int x = x0; x < x0 + nx; x++) {
                for (int i = 0; i < BLK; i++) {
                    kr[i] = k + (size_t)(b * BLK + i) * ROW + (size_t)x * D * 2;
                    vr[i] = v + (size_t)(b * BLK + i) * ROW + (size_t)x * D * 2;
                }
                a.q = q + (size_t)x * G * D, a.m = m[x], a.l = l[x], a.o = o[x];
                fn(&a);
            }
        }
    const uint64_t dt = __rdtsc() - t0;
    for (int x = 0; x < HKV; x++) // every head's output must be finite: never time a wrong kernel
        for (int g = 0; g < G; g++)
            if (!(l[x][g] > 0.0f) || !isfinite(o[x][g * D] / l[x][g])) {
                fprintf(stderr, "bench_attn: head %d/%d's output is not finite\n", x, g);
                exit(1);
            }
    return dt;
}

int main(int argc, char **argv) {
    const int npos = argc > 1 ? atoi(argv[1]) : 262144, reps = argc > 2 ? atoi(argv[2]) : 5;
    if (npos < 2 * BLK || npos % BLK || reps < 1 || reps > 101) {
        fprintf(stderr, "usage: bench_attn [POSITIONS (a multiple of 64, >= 128)] [REPS (1-101)]\n");
        return 2;
    }
    ks_errbuf eb;
    if (kern_init(NULL, &eb) != KS_OK) {
        fprintf(stderr, "bench_attn: %s\n", eb.msg);
        return 1;
    }
    const kern_vtab *vt = kern_get();
    const size_t bytes = (size_t)npos * ROW;
    uint8_t *k = ks_alloc_huge(bytes), *v = ks_alloc_huge(bytes);
    float *q = ks_alloc_aligned(sizeof(float) * HKV * G * D);
    float *scratch = ks_alloc_aligned(sizeof(float) * KERN_ATTN_SCRATCH(D, D));
    if (!k || !v || !q || !scratch) {
        fprintf(stderr, "bench_attn: out of memory for %d positions\n", npos);
        return 1;
    }
    uint32_t x = 88172645u; // f16 values in [0.5, 2): finite scores
    for (size_t i = 0; i < bytes / 2; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        ((uint16_t *)k)[i] = (uint16_t)(0x3800 + (x & 0x7ff));
        ((uint16_t *)v)[i] = (uint16_t)(0x3800 + ((x >> 11) & 0x7ff));
    }
    for (int i = 0; i < HKV * G * D; i++)
        q[i] = 0.01f * (float)(i % 13) - 0.06f;
    printf("bench_attn: %s kernels%s, one thread, %d positions (%.0f MiB of K and V), "
           "TSC ticks per block of %d positions for one KV head (median of %d)\n",
           vt->name, kern_attn_bf16(vt) ? " (bf16 attention)" : "", npos,
           2.0 * (double)bytes / 1048576.0, BLK, reps);
    uint64_t t[WAY__N][101];
    for (int r = 0; r < reps; r++) // ways alternated within each round
        for (int w = 0; w < WAY__N; w++)
            t[w][r] = bench_pass(vt, (bench_way)w, k, v, npos, q, scratch);
    const double blocks = (double)(npos / BLK) * HKV;
    for (int w = 0; w < WAY__N; w++) {
        qsort(t[w], (size_t)reps, sizeof(uint64_t), cmp_u64);
        printf("  %-5s %7.0f ticks a head's block\n", way_name[w], (double)t[w][reps / 2] / blocks);
    }
    ks_free_aligned(k);
    ks_free_aligned(v);
    ks_free_aligned(q);
    ks_free_aligned(scratch);
    return 0;
}
