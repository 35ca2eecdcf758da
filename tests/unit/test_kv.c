/* test_kv.c — page pool and block tables: reservation, exhaustion, scrub on
 * free, and span resolution. */
#include "kvseal/kv.h"

#include "../check.h"

int main(void) {
    kv_geom g = {.n_layer = 2, .kv_dim = 8, .page_tokens = 4};
    kv_pool *p;
    ks_errbuf eb;
    CHECK_EQ(kv_pool_create(&g, 5, &p, &eb), KS_OK);
    CHECK_EQ(kv_pool_page_bytes(p), 2 * 2 * 4 * 8 * sizeof(float));
    kv_seq a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    CHECK_EQ(kv_seq_reserve(p, &a, 9, &eb), KS_OK);  // 3 pages
    CHECK_EQ(a.n_pages, 3);
    CHECK_EQ(kv_pool_n_free(p), 2);
    // exhaustion: nothing is taken when the request cannot be met
    CHECK_EQ(kv_seq_reserve(p, &b, 12, &eb), KS_ERR_NOSPACE);
    CHECK_STR_HAS(eb.msg, "need 3 more pages");
    CHECK_EQ(b.n_pages, 0);
    CHECK_EQ(kv_pool_n_free(p), 2);
    // spans: distinct pages, K and V planes distinct, writes land per layer
    float *k0, *v0, *k1, *v1;
    CHECK_EQ(kv_seq_span(p, &a, 0, 0, &k0, &v0), KS_OK);
    CHECK_EQ(kv_seq_span(p, &a, 0, 1, &k1, &v1), KS_OK);
    CHECK(k0 != v0 && k1 != k0 && v1 != v0);
    CHECK_EQ(kv_seq_span(p, &a, 3, 0, &k0, &v0), KS_ERR_INTERNAL);  // past the table
    CHECK_EQ(kv_seq_span(p, &a, 0, 2, &k0, &v0), KS_ERR_INTERNAL);  // bad layer
    for (uint32_t pg = 0; pg < 3; pg++)
        for (int l = 0; l < 2; l++) {
            CHECK_EQ(kv_seq_span(p, &a, pg, l, &k0, &v0), KS_OK);
            for (int i = 0; i < 32; i++) k0[i] = v0[i] = 1.0f + (float)i;
        }
    kv_seq_release(p, &a);
    CHECK_EQ(kv_pool_n_free(p), 5);
    CHECK_EQ(a.n_pages, 0);
    // I3: every page comes back zeroed
    CHECK_EQ(kv_seq_reserve(p, &b, 20, &eb), KS_OK);
    for (uint32_t pg = 0; pg < 5; pg++)
        for (int l = 0; l < 2; l++) {
            CHECK_EQ(kv_seq_span(p, &b, pg, l, &k0, &v0), KS_OK);
            for (int i = 0; i < 32; i++) CHECK(k0[i] == 0.0f && v0[i] == 0.0f);
        }
    kv_seq_release(p, &b);
    kv_pool_destroy(p);
    kv_geom bad = {.n_layer = 0, .kv_dim = 8, .page_tokens = 4};
    CHECK_EQ(kv_pool_create(&bad, 5, &p, &eb), KS_ERR_INVAL);
    CHECK_EQ(kv_pages_for_bytes(&g, 10 * 512), 10);
    printf("kv ok\n");
    return 0;
}
