/* test_base.c — errors, half-precision conversion, dtype table, thread pool,
 * huge-page allocations. */
#include "kvseal/base.h"

#include "../check.h"

#include <stdatomic.h>
#include <string.h>

static void test_errors(void) {
    CHECK_STR_EQ(ks_err_name(KS_ERR_FORMAT), "KS_ERR_FORMAT");
    CHECK_STR_EQ(ks_strerror(KS_ERR_NOSPACE), "kv cache full");
    CHECK_STR_EQ(ks_err_name(KS_OK), "KS_OK");
    ks_errbuf eb;
    ks_errbuf_clear(&eb);
    CHECK_EQ(ks_seterr(&eb, KS_ERR_INVAL, "key '%s' bad", "x"), KS_ERR_INVAL);
    CHECK_EQ(eb.code, KS_ERR_INVAL);
    CHECK_STR_EQ(eb.msg, "key 'x' bad");
    CHECK_EQ(ks_seterr(NULL, KS_ERR_IO, "dropped"), KS_ERR_IO);
}

/* Exhaustive f16 round trip: every finite half maps to a float and back to
 * itself; rounding of midpoints is to even. */
static void test_f16(void) {
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = ks_f16_to_f32((uint16_t)h);
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
            CHECK(f != f);
            continue;
        }
        CHECK_EQ(ks_f32_to_f16(f), h);
    }
    CHECK_EQ(ks_f16_to_f32(0x3c00), 1.0);
    CHECK_EQ(ks_f32_to_f16(65520.0f), 0x7c00);             // rounds to inf
    CHECK_EQ(ks_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);   // tie -> even (down)
    CHECK_EQ(ks_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);   // tie -> even (up)
    CHECK_EQ(ks_f32_to_f16(5.960464477539063e-08f), 0x0001);  // smallest subnormal
    CHECK_EQ(ks_f32_to_f16(2.98023223876953125e-08f), 0x0000);  // half of it: tie -> 0
    CHECK_EQ(ks_f32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ(ks_bf16_to_f32(0x4049), 3.140625);
}

static void test_dtype(void) {
    CHECK_EQ(ks_dtype_block_bytes(KS_DTYPE_Q8_0), 34);
    CHECK_EQ(ks_dtype_block_bytes(KS_DTYPE_Q4_K), 144);
    CHECK_EQ(ks_dtype_block_bytes(KS_DTYPE_Q6_K), 210);
    CHECK_EQ(ks_dtype_block_elems(KS_DTYPE_Q6_K), 256);
    CHECK(!ks_dtype_known(4));
    CHECK(!ks_dtype_known(31));
    CHECK(!ks_dtype_known(1000));
    uint64_t rb;
    CHECK(ks_dtype_row_bytes(KS_DTYPE_Q4_0, 64, &rb) && rb == 36);
    CHECK(!ks_dtype_row_bytes(KS_DTYPE_Q4_0, 65, &rb));
    CHECK(!ks_dtype_row_bytes(KS_DTYPE_F32, UINT64_MAX / 2, &rb));
    ks_dtype t;
    CHECK(ks_dtype_parse("q4_k", &t) && t == KS_DTYPE_Q4_K);
    CHECK(!ks_dtype_parse("q9_9", &t));
}

typedef struct {
    atomic_int seen_ith[8];  // how often each ith took part
    atomic_llong next;
    int64_t *out;            // (1000) every element must be done exactly once per op
} pool_arg;

static void pool_fn(void *arg, int ith, int nth) {
    pool_arg *a = arg;
    CHECK(ith >= 0 && ith < nth);
    atomic_fetch_add(&a->seen_ith[ith], 1);
    int64_t i0, i1;
    while (ks_pool_claim(&a->next, 1000, 7, &i0, &i1))
        for (int64_t i = i0; i < i1; i++) a->out[i] += i;
}

/* Every op completes all its chunks exactly once, whoever joins; ith values
 * are distinct within an op (checked via per-op counts <= runs). */
static void test_pool(void) {
    for (int nth = 1; nth <= 4; nth++) {
        ks_pool *p = ks_pool_create(nth);
        CHECK(p);
        CHECK_EQ(ks_pool_nth(p), nth);
        int64_t out[1000] = {0};
        pool_arg a = {.out = out};
        for (int r = 0; r < 500; r++) {
            atomic_store(&a.next, 0);
            ks_pool_run(p, pool_fn, &a);
        }
        CHECK_EQ(atomic_load(&a.seen_ith[0]), 500);  // the owner always runs
        for (int i = 1; i < nth; i++) CHECK(atomic_load(&a.seen_ith[i]) <= 500);
        for (int i = nth; i < 8; i++) CHECK_EQ(atomic_load(&a.seen_ith[i]), 0);
        for (int i = 0; i < 1000; i++) CHECK_EQ(out[i], 500LL * i);
        ks_pool_destroy(p);
    }
    ks_pool_destroy(NULL);
}

/* ks_alloc_huge: 2 MiB-aligned, every byte of the rounded-up size usable,
 * freed by ks_free_aligned; an impossible size is NULL, not a wrap. */
static void test_alloc_huge(void) {
    const size_t huge = (size_t)2 << 20;
    size_t sizes[] = {0, 1, huge - 1, huge, huge + 1, 3 * huge + 12345};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint8_t *p = ks_alloc_huge(sizes[i]);
        CHECK(p);
        CHECK_EQ((uintptr_t)p % huge, 0);
        const size_t n = sizes[i] ? sizes[i] : 1;
        memset(p, 0xa5, n);
        CHECK_EQ(p[n - 1], 0xa5);
        ks_free_aligned(p);
    }
    CHECK(ks_alloc_huge(SIZE_MAX) == NULL);
    CHECK(ks_alloc_huge(SIZE_MAX - huge + 2) == NULL);
}

/* ks_cpu's vendor flag agrees with the kernel's /proc/cpuinfo (skipped
 * where that file has no vendor_id line). */
static void test_cpu_vendor(void) {
    FILE *fp = fopen("/proc/cpuinfo", "r");
    char line[256];
    int amd = -1;
    while (fp && amd < 0 && fgets(line, sizeof line, fp))
        if (!strncmp(line, "vendor_id", 9)) amd = strstr(line, "AuthenticAMD") != NULL;
    if (fp) fclose(fp);
    if (amd < 0) {
        fprintf(stderr, "note: no vendor_id in /proc/cpuinfo; vendor check skipped\n");
        return;
    }
    CHECK_EQ(ks_cpu_get()->amd, amd);
}

int main(void) {
    test_errors();
    test_cpu_vendor();
    test_alloc_huge();
    test_f16();
    test_dtype();
    test_pool();
    const ks_cpu *c = ks_cpu_get();
    printf("base ok (avx2 %d, avx512 %d, amd %d)\n", c->avx2, c->avx512, c->amd);
    return 0;
}
