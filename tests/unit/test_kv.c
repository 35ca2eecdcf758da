/* test_kv.c — the sealed KV pool: reservation and exhaustion, identities
 * (I2), tag and state checks at resolution (I1), scrub on free (I3),
 * refcounted sharing, quarantine, and the tenant-scoped prefix cache (I7).
 *
 * Each case names the safeguard it would catch missing; `test_kv NAME` runs
 * one case (used to confirm which cases fail in the KS_BROKEN builds). The
 * defence-in-depth case pokes a page header through src/kv/kv_int.h.
 * Cases marked per_planes run twice: on 2-plane pages (a K row then a V row,
 * every dense model) and on 1-plane pages (one row per position, MLA). */
#include "kvseal/kv.h"
#include "kv/kv_fault.h"
#include "kv/kv_int.h"

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../check.h"
#include "free_watch.h"

/* The geometry of mkpool; main sets G.planes for each run of a per_planes case. */
static kv_geom G = {.n_layer = 2, .kv_dim = 8, .page_tokens = 4};
#define P 4u
/* Rows per position per layer of G, and the marker kind V rows carry: with
 * one plane there is no V row, and V reads back K's row. */
#define NP kv_geom_planes(&G)
#define VKIND (NP == 2 ? 1 : 0)

// ----------------------------------------------------------------------------
// Helpers

typedef struct {
    int n;
    uint64_t seq_uid;
    uint32_t page;
    kv_tag expected, found;
    kv_page_state state;
} viol_log;

static void on_violation(void *ctx, uint64_t seq_uid, uint32_t page, kv_tag expected, kv_tag found,
                         kv_page_state state) {
    viol_log *l = ctx;
    l->n++;
    l->seq_uid = seq_uid;
    l->page = page;
    l->expected = expected;
    l->found = found;
    l->state = state;
}

static kv_pool *mkpool(uint32_t n_pages, kv_scrub scrub) {
    kv_pool *p;
    ks_errbuf eb;
    CHECK_EQ(kv_pool_create(&G, n_pages, scrub, &p, &eb), KS_OK);
    return p;
}

static uint64_t violations(const kv_pool *p) {
    kv_stats st;
    kv_pool_stats(p, &st);
    return st.violations;
}

static kv_page_info info(const kv_pool *p, uint32_t page) {
    kv_page_info pi;
    CHECK_EQ(kv_pool_page_info(p, page, &pi), KS_OK);
    return pi;
}

/* The value written at (seq marker, position, layer, K/V, column). */
static float val(int marker, uint32_t pos, int layer, int kv, int col) {
    return (float)(marker * 100000 + (int)pos * 100 + layer * 20 + kv * 10 + col) + 0.5f;
}

/* Reserves [0, n) in s, writes every row through span_write, marks it filled. */
static void fill(kv_pool *p, kv_seq *s, uint32_t n, int marker) {
    ks_errbuf eb;
    CHECK_EQ(kv_seq_reserve(p, s, n, &eb), KS_OK);
    for (uint32_t pos = s->n_tokens; pos < n; pos++)
        for (int l = 0; l < G.n_layer; l++) {
            void *kb, *vb;
            CHECK_EQ(kv_seq_span_write(p, s, pos / P, l, &kb, &vb), KS_OK);
            CHECK(NP == 2 ? vb != NULL : vb == NULL); // one plane: no V row to write
            float *k = kb, *v = vb; // G is an F32 pool: rows of kv_dim floats
            for (int c = 0; c < G.kv_dim; c++) {
                k[(pos % P) * (uint32_t)G.kv_dim + (uint32_t)c] = val(marker, pos, l, 0, c);
                if (NP == 2)
                    v[(pos % P) * (uint32_t)G.kv_dim + (uint32_t)c] = val(marker, pos, l, 1, c);
            }
        }
    kv_seq_set_filled(p, s, n);
}

/* Checks that positions [0, n) of s read back as written by `marker`. */
static void check_content(kv_pool *p, const kv_seq *s, uint32_t n, int marker) {
    for (uint32_t pos = 0; pos < n; pos++)
        for (int l = 0; l < G.n_layer; l++) {
            const void *kb, *vb;
            CHECK_EQ(kv_seq_span_read(p, s, pos / P, l, pos % P + 1, &kb, &vb), KS_OK);
            CHECK(NP == 2 ? vb != kb : vb == kb); // one plane: V is K's row
            const float *k = kb, *v = vb;
            for (int c = 0; c < G.kv_dim; c++) {
                CHECK(k[(pos % P) * (uint32_t)G.kv_dim + (uint32_t)c] == val(marker, pos, l, 0, c));
                CHECK(v[(pos % P) * (uint32_t)G.kv_dim + (uint32_t)c] ==
                      val(marker, pos, l, VKIND, c));
            }
        }
}

static void toks_make(int32_t *t, uint32_t n, int32_t base) {
    for (uint32_t i = 0; i < n; i++) t[i] = base + (int32_t)i * 7;
}

static void root_of(const char *tenant, uint8_t root[KV_ROOT_BYTES]) {
    kv_prefix_root(tenant, strlen(tenant), root);
}

/* Ends every case: nothing leaked, everything scrubbed (I3). */
static void finish(kv_pool *p) {
    kv_stats st;
    kv_pool_stats(p, &st);
    CHECK_EQ(st.pages[KV_PAGE_FREE], kv_pool_n_pages(p));
    CHECK_EQ(kv_pool_n_free(p), kv_pool_n_pages(p));
    CHECK(kv_pool_all_free_and_scrubbed(p));
    kv_pool_destroy(p);
}

// ----------------------------------------------------------------------------
// Pool and block tables

/* Reservation, page accounting, NOSPACE takes nothing, bad geometry. */
static void t_reserve(void) {
    kv_pool *p = mkpool(5, KV_SCRUB_ZERO);
    ks_errbuf eb;
    const size_t pb = 2 * (size_t)NP * 4 * 8 * sizeof(float); // layers x planes x P x row
    CHECK_EQ(kv_pool_page_bytes(p), pb);
    CHECK_EQ((uintptr_t)p->slab % 64, 0);
    kv_seq a, b;
    kv_seq_init(p, &a);
    kv_seq_init(p, &b);
    CHECK_EQ(kv_seq_reserve(p, &a, 9, &eb), KS_OK);  // 3 pages
    CHECK_EQ(a.n_pages, 3);
    CHECK_EQ(kv_seq_reserve(p, &a, 12, &eb), KS_OK);  // still 3
    CHECK_EQ(a.n_pages, 3);
    CHECK_EQ(kv_pool_n_free(p), 2);
    kv_stats st;
    kv_pool_stats(p, &st);
    CHECK_EQ(st.pages[KV_PAGE_ALLOCATED], 3);
    CHECK_EQ(st.pages[KV_PAGE_FREE], 2);
    // exhaustion: nothing is taken when the request cannot be met
    CHECK_EQ(kv_seq_reserve(p, &b, 12, &eb), KS_ERR_NOSPACE);
    CHECK_STR_HAS(eb.msg, "need 3 more pages");
    CHECK_EQ(b.n_pages, 0);
    CHECK_EQ(kv_pool_n_free(p), 2);
    kv_pool_stats(p, &st);
    CHECK_EQ(st.pages[KV_PAGE_ALLOCATED], 3);
    CHECK_EQ(st.pages[KV_PAGE_FREE], 2);
    // positions land on distinct pages; K and V planes and layers are distinct
    void *k0, *v0, *k1, *v1;
    CHECK_EQ(kv_seq_span_write(p, &a, 0, 0, &k0, &v0), KS_OK);
    CHECK_EQ(kv_seq_span_write(p, &a, 0, 1, &k1, &v1), KS_OK);
    if (NP == 2)
        CHECK(k0 != v0 && k1 != k0 && v1 != v0 && (float *)k1 == (float *)v0 + P * 8);
    else // one plane per layer: layer 1's row follows layer 0's, no V pointer to write
        CHECK(v0 == NULL && v1 == NULL && (float *)k1 == (float *)k0 + P * 8);
    CHECK_EQ(kv_seq_span_write(p, &a, 1, 0, &k1, &v1), KS_OK);
    CHECK(k1 != k0);
    kv_seq_release(p, &a);
    CHECK_EQ(a.n_pages, 0);
    CHECK(a.uid != 0);
    kv_seq_release(p, &b);  // releasing an empty table is fine
    kv_geom bad = {.n_layer = 0, .kv_dim = 8, .page_tokens = 4};
    kv_pool *q;
    CHECK_EQ(kv_pool_create(&bad, 5, KV_SCRUB_ZERO, &q, &eb), KS_ERR_INVAL);
    CHECK_EQ(kv_pool_create(&G, 0, KV_SCRUB_ZERO, &q, &eb), KS_ERR_INVAL);
    CHECK_EQ(kv_pool_create(&G, 1, (kv_scrub)7, &q, &eb), KS_ERR_INVAL);
    CHECK_EQ(kv_pages_for_bytes(&G, 10 * pb + pb - 1), 10);
    CHECK_EQ(kv_pages_for_bytes(&bad, 1 << 20), 0);
    finish(p);
}

/* I2: uids are unique and carry the boot nonce; gen grows on every
 * allocation, so a page reallocated even to the same sequence gets a new tag. */
static void t_identity(void) {
    kv_pool *p = mkpool(2, KV_SCRUB_ZERO), *p2 = mkpool(1, KV_SCRUB_ZERO);
    enum { N = 2000 };
    static uint64_t uids[N];
    for (int i = 0; i < N; i++) {
        kv_seq s;
        kv_seq_init(i % 2 ? p : p2, &s);  // one counter for the whole process
        uids[i] = s.uid;
        CHECK(s.uid != 0);
        CHECK_EQ(s.uid >> 32, uids[0] >> 32);
        for (int j = 0; j < i; j++) CHECK(uids[j] != s.uid);
    }
    ks_errbuf eb;
    kv_seq a, b;
    kv_seq_init(p, &a);
    kv_seq_init(p, &b);
    CHECK_EQ(kv_seq_reserve(p, &a, 1, &eb), KS_OK);
    uint32_t pg = a.ent[0].page;
    kv_page_info i1 = info(p, pg);
    CHECK_EQ(i1.tag.seq_uid, a.uid);
    CHECK(i1.tag.gen >= 1);
    CHECK_EQ(a.ent[0].tag.gen, i1.tag.gen);
    CHECK_EQ(i1.state, KV_PAGE_ALLOCATED);
    CHECK_EQ(i1.refcount, 1);
    kv_seq_release(p, &a);
    kv_page_info i2 = info(p, pg);
    CHECK_EQ(i2.state, KV_PAGE_FREE);
    CHECK_EQ(i2.tag.seq_uid, 0);
    CHECK_EQ(i2.refcount, 0);
    CHECK_EQ(kv_seq_reserve(p, &b, 1, &eb), KS_OK);  // LIFO: the same page again
    CHECK_EQ(b.ent[0].page, pg);
    CHECK_EQ(info(p, pg).tag.gen, i1.tag.gen + 1);
    CHECK_EQ(info(p, pg).tag.seq_uid, b.uid);
    kv_seq_release(p, &b);
    CHECK_EQ(kv_seq_reserve(p, &a, 1, &eb), KS_OK);  // same sequence, same page, new gen
    CHECK_EQ(a.ent[0].page, pg);
    CHECK_EQ(a.ent[0].tag.seq_uid, i1.tag.seq_uid);
    CHECK_EQ(a.ent[0].tag.gen, i1.tag.gen + 2);
    kv_seq_release(p, &a);
    CHECK_EQ(kv_pool_page_info(p, 2, &i1), KS_ERR_INVAL);
    finish(p);
    finish(p2);
}

/* I1: a block table whose entry points at another sequence's page (same
 * index, the victim's expected tag) must not resolve: the read and the write
 * fail, the counter counts them, the callback sees the right tags, and
 * release still frees the victim's real page and nobody else's. */
static void t_tag_swap(void) {
    kv_pool *p = mkpool(6, KV_SCRUB_ZERO);
    viol_log vl = {0};
    kv_pool_set_violation_cb(p, on_violation, &vl);
    kv_seq a, b;
    kv_seq_init(p, &a);
    kv_seq_init(p, &b);
    fill(p, &a, 8, 1);
    fill(p, &b, 8, 2);
    kv_entry a0 = a.ent[0], b0 = b.ent[0];
    CHECK_EQ(violations(p), 0);
#ifdef KS_TEST_FAULTS
    kv_fault_swap_entry(&a, &b, 0);
#else
    a.ent[0].page = b.ent[0].page;  // the same corruption, by hand
#endif
    CHECK_EQ(a.ent[0].page, b0.page);
    const void *k, *v;
    CHECK_EQ(kv_seq_span_read(p, &a, 0, 0, 1, &k, &v), KS_ERR_INTERNAL);
    CHECK_EQ(violations(p), 1);
    CHECK_EQ(vl.n, 1);
    CHECK_EQ(vl.seq_uid, a.uid);
    CHECK_EQ(vl.page, b0.page);
    CHECK_EQ(vl.expected.seq_uid, a0.tag.seq_uid);
    CHECK_EQ(vl.expected.gen, a0.tag.gen);
    CHECK_EQ(vl.found.seq_uid, b0.tag.seq_uid);
    CHECK_EQ(vl.found.gen, b0.tag.gen);
    CHECK_EQ(vl.state, KV_PAGE_READY);
    void *wk, *wv;
    CHECK_EQ(kv_seq_span_write(p, &a, 0, 1, &wk, &wv), KS_ERR_INTERNAL);
    CHECK_EQ(violations(p), 2);
    CHECK_EQ(vl.n, 2);
    const void *ks[2], *vs[2];
    CHECK_EQ(kv_seq_span_read_all(p, &a, 1, 8, ks, vs), KS_ERR_INTERNAL);
    CHECK_EQ(vl.n, 3);
    CHECK_EQ(vl.page, b0.page);
    CHECK_EQ(kv_seq_span_read_all(p, &b, 1, 8, ks, vs), KS_OK);
    // the untouched entries and the other sequence still resolve
    check_content(p, &b, 8, 2);
    CHECK_EQ(kv_seq_span_read(p, &a, 1, 0, P, &k, &v), KS_OK);
    // release reports the corrupt entry once more and frees a's real page
    kv_seq_release(p, &a);
    CHECK_EQ(vl.n, 4);
    CHECK_EQ(info(p, a0.page).state, KV_PAGE_FREE);
    CHECK_EQ(info(p, b0.page).state, KV_PAGE_READY);
    check_content(p, &b, 8, 2);
    kv_seq_release(p, &b);
    kv_stats st;
    kv_pool_stats(p, &st);
    CHECK_EQ(st.violations, 4);
    finish(p);
}

/* I1 + I2: a stale entry kept after release (use after free) never resolves,
 * neither while the page is FREE nor after it went to another sequence, nor
 * after it went back to the SAME sequence (gen differs). */
static void t_stale_entry(void) {
    kv_pool *p = mkpool(1, KV_SCRUB_ZERO);
    kv_seq a, b;
    kv_seq_init(p, &a);
    kv_seq_init(p, &b);
    fill(p, &a, 4, 1);
    kv_entry stale = a.ent[0];
    kv_seq ghost = {.ent = &stale, .n_pages = 1, .cap = 1, .n_tokens = 4, .uid = a.uid};
    const void *k, *v;
    CHECK_EQ(kv_seq_span_read(p, &ghost, 0, 0, 1, &k, &v), KS_OK);
    kv_seq_release(p, &a);
    CHECK_EQ(kv_seq_span_read(p, &ghost, 0, 0, 1, &k, &v), KS_ERR_INTERNAL);  // FREE
    fill(p, &b, 4, 2);
    CHECK_EQ(b.ent[0].page, stale.page);
    CHECK_EQ(kv_seq_span_read(p, &ghost, 0, 0, 1, &k, &v), KS_ERR_INTERNAL);  // someone else's
    void *wk, *wv;
    CHECK_EQ(kv_seq_span_write(p, &ghost, 0, 0, &wk, &wv), KS_ERR_INTERNAL);
    kv_seq_release(p, &b);
    fill(p, &a, 4, 3);  // a again, same page, next gen
    CHECK_EQ(a.ent[0].page, stale.page);
    CHECK_EQ(kv_seq_span_read(p, &ghost, 0, 0, 1, &k, &v), KS_ERR_INTERNAL);
    CHECK_EQ(violations(p), 4);
    kv_seq_release(p, &a);
    finish(p);
}

/* I1: reads need READY and filled >= n_rows; writes need an owned page in
 * ALLOCATED/READY; bad indices and layers fail. */
static void t_state(void) {
    kv_pool *p = mkpool(4, KV_SCRUB_ZERO);
    ks_errbuf eb;
    kv_seq a;
    kv_seq_init(p, &a);
    CHECK_EQ(kv_seq_reserve(p, &a, 8, &eb), KS_OK);
    const void *k, *v;
    void *wk, *wv;
    CHECK_EQ(kv_seq_span_read(p, &a, 0, 0, 1, &k, &v), KS_ERR_INTERNAL);  // ALLOCATED
    CHECK_EQ(kv_seq_span_write(p, &a, 0, 0, &wk, &wv), KS_OK);
    uint64_t nv = violations(p);
    CHECK_EQ(nv, 1);
    fill(p, &a, 5, 1);  // page 0 full, page 1 has one row
    CHECK_EQ(info(p, a.ent[0].page).state, KV_PAGE_READY);
    CHECK_EQ(info(p, a.ent[0].page).filled, P);
    CHECK_EQ(info(p, a.ent[1].page).filled, 1);
    CHECK_EQ(kv_seq_span_read(p, &a, 0, 1, P, &k, &v), KS_OK);
    CHECK_EQ(kv_seq_span_read(p, &a, 1, 1, 1, &k, &v), KS_OK);
    CHECK_EQ(kv_seq_span_read(p, &a, 1, 1, 2, &k, &v), KS_ERR_INTERNAL);  // beyond filled
    CHECK_EQ(kv_seq_span_read(p, &a, 0, 1, P + 1, &k, &v), KS_ERR_INTERNAL);
    CHECK_EQ(kv_seq_span_read(p, &a, 2, 0, 1, &k, &v), KS_ERR_INTERNAL);  // past the table
    CHECK_EQ(kv_seq_span_read(p, &a, 0, 2, 1, &k, &v), KS_ERR_INTERNAL);  // bad layer
    CHECK_EQ(kv_seq_span_read(p, &a, 0, -1, 1, &k, &v), KS_ERR_INTERNAL);
    CHECK_EQ(kv_seq_span_write(p, &a, 2, 0, &wk, &wv), KS_ERR_INTERNAL);
    CHECK_EQ(violations(p), nv + 6);
    const void *ks[2], *vs[2];
    CHECK_EQ(kv_seq_span_read_all(p, &a, 1, 5, ks, vs), KS_OK);
    CHECK_EQ(kv_seq_span_read(p, &a, 1, 1, 1, &k, &v), KS_OK);
    CHECK(ks[1] == k && vs[1] == v);
    CHECK_EQ(kv_seq_span_read_all(p, &a, 1, 6, ks, vs), KS_ERR_INTERNAL);  // row 5 unfilled
    CHECK_EQ(violations(p), nv + 7);
    check_content(p, &a, 5, 1);
    kv_seq_set_filled(p, &a, 8);
    CHECK_EQ(kv_seq_span_read(p, &a, 1, 1, P, &k, &v), KS_OK);
    kv_seq_release(p, &a);
    finish(p);
}

/* I3: freed pages are zeroed (or poisoned), checked by re-reading every
 * float of every page after reallocation; kv_pool_all_free_and_scrubbed is
 * truthful (a write into a FREE page through a stale pointer is seen). */
static void t_scrub_mode(kv_scrub mode) {
    const uint32_t N = 3;
    kv_pool *p = mkpool(N, mode);
    CHECK(kv_pool_all_free_and_scrubbed(p));  // scrubbed from the start
    kv_seq a;
    kv_seq_init(p, &a);
    fill(p, &a, N * P, 7);
    CHECK(!kv_pool_all_free_and_scrubbed(p));
    void *wk, *wv;
    CHECK_EQ(kv_seq_span_write(p, &a, 1, 1, &wk, &wv), KS_OK);
    kv_seq_release(p, &a);
    CHECK(kv_pool_all_free_and_scrubbed(p));
    // the page content, float by float, as the next owner sees it
    const uint32_t want = mode == KV_SCRUB_ZERO ? 0u : KV__POISON_WORD;
    kv_seq b;
    kv_seq_init(p, &b);
    ks_errbuf eb;
    CHECK_EQ(kv_seq_reserve(p, &b, N * P, &eb), KS_OK);
    for (uint32_t pg = 0; pg < N; pg++)
        for (int l = 0; l < G.n_layer; l++) {
            void *k, *v;
            CHECK_EQ(kv_seq_span_write(p, &b, pg, l, &k, &v), KS_OK);
            // the layer's planes are contiguous: every float of them
            for (uint32_t i = 0; i < (uint32_t)NP * P * (uint32_t)G.kv_dim; i++) {
                uint32_t w32;
                memcpy(&w32, (float *)k + i, 4);
                CHECK_EQ(w32, want);
            }
        }
    kv_seq_release(p, &b);
    // truthfulness: dirty a FREE page behind the pool's back
    float saved, *wf = wk;
    memcpy(&saved, wf + 3, sizeof saved);
    wf[3] = 1.0f;
    CHECK(!kv_pool_all_free_and_scrubbed(p));
    memcpy(wf + 3, &saved, sizeof saved);
    CHECK(kv_pool_all_free_and_scrubbed(p));
    finish(p);
}
/* I3: allocating a page that is not clean (here: written through a stale
 * pointer after free, as a late transfer would) aborts, in a child. */
static void t_dirty_alloc(void) {
#if defined(NDEBUG) && !defined(KS_KV_CHECK_CLEAN)
    printf("  dirty_alloc: skipped (NDEBUG build without KS_KV_CHECK_CLEAN)\n");
    return;
#endif
    kv_pool *p = mkpool(1, KV_SCRUB_ZERO);
    kv_seq a;
    kv_seq_init(p, &a);
    ks_errbuf eb;
    CHECK_EQ(kv_seq_reserve(p, &a, 1, &eb), KS_OK);
    void *k, *v;
    CHECK_EQ(kv_seq_span_write(p, &a, 0, 0, &k, &v), KS_OK);
    kv_seq_release(p, &a);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);  // the expected assertion message
        if (null >= 0) dup2(null, 2);
        *(float *)k = 1.0f; // write after free
        ks_err e = kv_seq_reserve(p, &a, 1, &eb);
        _exit(e == KS_OK ? 0 : 1);  // reached only if the dirty page went through
    }
    int st = 0;
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    finish(p);
}

static void t_scrub_zero(void) { t_scrub_mode(KV_SCRUB_ZERO); }
static void t_scrub_poison(void) { t_scrub_mode(KV_SCRUB_POISON); }

/* KV element types: row and page bytes, geometry checks, names; and I3 for
 * every type and both plane counts: after release, every byte of every page holds the scrub
 * pattern, and in POISON mode each f16 element and each Q8_0 block scale of
 * a page reads as NaN (so attention over it yields NaN: test_model_kvtype
 * checks that through the kernels and the forward pass). */
static void t_types(void) {
    ks_errbuf eb;
    static const struct {
        int t;
        const char *name;
        size_t row; /* bytes of a 64-element row */
    } ty[] = {{KS_DTYPE_F32, "f32", 256}, {KS_DTYPE_F16, "f16", 128}, {KS_DTYPE_Q8_0, "q8_0", 68}};
    for (size_t i = 0; i < 3; i++)
        for (int np = 1; np <= 2; np++) {
            kv_geom g = {
                .n_layer = 3, .kv_dim = 64, .page_tokens = 5, .kv_type = ty[i].t, .planes = np};
            CHECK_EQ(kv_row_bytes(&g), ty[i].row);
            CHECK_EQ(kv_page_bytes(&g), (uint64_t)3 * (uint64_t)np * 5 * ty[i].row);
            CHECK_EQ(kv_pages_for_bytes(&g, 7 * kv_page_bytes(&g) + 1), 7);
            CHECK_EQ(kv_geom_check(&g, &eb), KS_OK);
            CHECK_STR_EQ(kv_type_name(ty[i].t), ty[i].name);
            int t = -1;
            CHECK(kv_type_parse(ty[i].name, &t) && t == ty[i].t);
            for (int mode = 0; mode < 2; mode++) {
                kv_pool *p;
                CHECK_EQ(kv_pool_create(&g, 3, (kv_scrub)mode, &p, &eb), KS_OK);
                CHECK_EQ(kv_pool_page_bytes(p), kv_page_bytes(&g));
                kv_seq a;
                kv_seq_init(p, &a);
                CHECK_EQ(kv_seq_reserve(p, &a, 15, &eb), KS_OK);
                for (uint32_t pg = 0; pg < 3; pg++)
                    for (int l = 0; l < 3; l++) {
                        void *k, *v;
                        CHECK_EQ(kv_seq_span_write(p, &a, pg, l, &k, &v), KS_OK);
                        memset(k, 0x11, 5 * ty[i].row); // any content
                        if (np == 2) memset(v, 0x22, 5 * ty[i].row);
                    }
                kv_seq_set_filled(p, &a, 15);
                kv_seq_release(p, &a);
                CHECK(kv_pool_all_free_and_scrubbed(p));
                // what the next owner finds, element by element in the pool's type
                kv_seq_init(p, &a);
                CHECK_EQ(kv_seq_reserve(p, &a, 15, &eb), KS_OK);
                for (uint32_t pg = 0; pg < 3; pg++)
                    for (int l = 0; l < 3; l++) {
                        void *kv[2];
                        CHECK_EQ(kv_seq_span_write(p, &a, pg, l, &kv[0], &kv[1]), KS_OK);
                        for (int h = 0; h < np; h++)
                            for (uint32_t r = 0; r < 5; r++) {
                                const uint8_t *row = (const uint8_t *)kv[h] + r * ty[i].row;
                                if (mode == KV_SCRUB_ZERO) {
                                    for (size_t b = 0; b < ty[i].row; b++)
                                        CHECK_EQ(row[b], 0);
                                } else if (ty[i].t == KS_DTYPE_F32) {
                                    for (int e = 0; e < 64; e++) {
                                        float f;
                                        memcpy(&f, row + 4 * e, 4);
                                        CHECK(isnan(f));
                                    }
                                } else { // f16 elements, or the f16 scale of each 34-byte block
                                    size_t step = ty[i].t == KS_DTYPE_F16 ? 2 : 34;
                                    for (size_t o = 0; o < ty[i].row; o += step) {
                                        uint16_t hb;
                                        memcpy(&hb, row + o, 2);
                                        CHECK(isnan(ks_f16_to_f32(hb)));
                                    }
                                }
                            }
                    }
                kv_seq_release(p, &a);
                finish(p);
            }
        }
    // refusals, each with its reason
    kv_geom g = {.n_layer = 2, .kv_dim = 48, .page_tokens = 4, .kv_type = KS_DTYPE_Q8_0};
    kv_pool *q;
    CHECK_EQ(kv_row_bytes(&g), 0);
    CHECK_EQ(kv_pool_create(&g, 1, KV_SCRUB_ZERO, &q, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "not a multiple of the q8_0 block");
    g.kv_type = KS_DTYPE_Q4_0;
    CHECK_EQ(kv_pool_create(&g, 1, KV_SCRUB_ZERO, &q, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "f32, f16 or q8_0");
    int t = 77;
    CHECK(!kv_type_parse("q4_0", &t) && !kv_type_parse("", &t) && !kv_type_parse(NULL, &t));
    CHECK(kv_type_parse("F16", &t) && t == KS_DTYPE_F16);
    CHECK_STR_EQ(kv_type_name(KS_DTYPE_Q4_0), "?");
}

/* Fills every byte of the n_pg pages of s (planes: the pool's) with b,
 * through span_write, one layer's planes at a time. */
static void fill_bytes(kv_pool *p, const kv_seq *s, uint32_t n_pg, uint8_t b) {
    const kv_geom *g = kv_pool_geom(p);
    size_t plane = (size_t)g->page_tokens * kv_row_bytes(g);
    for (uint32_t pg = 0; pg < n_pg; pg++)
        for (int l = 0; l < g->n_layer; l++) {
            void *k, *v;
            CHECK_EQ(kv_seq_span_write(p, s, pg, l, &k, &v), KS_OK);
            memset(k, b, plane);
            if (kv_geom_planes(g) == 2) memset(v, b, plane);
        }
}

/* One plane per position (MLA): a page is half the bytes of the same
 * geometry with two planes; V resolves to K's row on reads and to nothing on
 * writes; a written row reads back; the scrub covers the whole page and
 * nothing past it, also when page_bytes is 2 mod 4 (one plane of F16 or Q8_0
 * rows) so that every other page starts off a 4-byte word; planes other than
 * 0, 1 and 2 are refused. */
static void t_planes(void) {
    ks_errbuf eb;
    kv_geom g2 = {.n_layer = 2, .kv_dim = 8, .page_tokens = 4}, g1 = g2;
    g1.planes = 1;
    CHECK_EQ(kv_geom_planes(&g2), 2); // the zero value
    CHECK_EQ(kv_geom_planes(&g1), 1);
    CHECK_EQ(kv_page_bytes(&g2), 2 * 2 * 4 * 8 * sizeof(float));
    CHECK_EQ(2 * kv_page_bytes(&g1), kv_page_bytes(&g2));
    kv_geom gx = g2;
    gx.planes = 2;
    CHECK_EQ(kv_page_bytes(&gx), kv_page_bytes(&g2));
    // the sizing arithmetic kvseal check prints (I8) names the plane count
    char d[160];
    CHECK_EQ(kv_geom_describe(&g2, d, sizeof d), (int)strlen(d));
    CHECK_STR_EQ(d,
                 "512 bytes/page = 2 layers x 2 planes (K, V) x 4 tokens x 32 B per 8-element row");
    kv_geom_describe(&g1, d, sizeof d);
    CHECK_STR_EQ(d, "256 bytes/page = 2 layers x 1 plane x 4 tokens x 32 B per 8-element row");
    kv_pool *p1, *p2;
    CHECK_EQ(kv_pool_create(&g1, 4, KV_SCRUB_ZERO, &p1, &eb), KS_OK);
    CHECK_EQ(kv_pool_create(&g2, 4, KV_SCRUB_ZERO, &p2, &eb), KS_OK);
    CHECK_EQ(2 * kv_pool_page_bytes(p1), kv_pool_page_bytes(p2));
    CHECK_EQ(kv_pool_geom(p1)->planes, 1);
    kv_pool_destroy(p2);
    // a row written through K reads back through K and V alike
    kv_seq a;
    kv_seq_init(p1, &a);
    CHECK_EQ(kv_seq_reserve(p1, &a, 6, &eb), KS_OK);
    for (int l = 0; l < 2; l++) {
        void *k, *v = &a;
        CHECK_EQ(kv_seq_span_write(p1, &a, 1, l, &k, &v), KS_OK);
        CHECK(v == NULL);
        CHECK_EQ(kv_seq_span_write(p1, &a, 1, l, &k, NULL), KS_OK); // v may be NULL
        float *row = (float *)k + 8;                                // position 5 = page 1, row 1
        for (int c = 0; c < 8; c++)
            row[c] = (float)(l * 100 + c) + 0.25f;
    }
    kv_seq_set_filled(p1, &a, 6);
    for (int l = 0; l < 2; l++) {
        const void *k, *v, *ks[2], *vs[2];
        CHECK_EQ(kv_seq_span_read(p1, &a, 1, l, 2, &k, &v), KS_OK);
        CHECK(v == k);
        CHECK_EQ(kv_seq_span_read_all(p1, &a, l, 6, ks, vs), KS_OK);
        CHECK(ks[1] == k && vs[0] == ks[0] && vs[1] == ks[1] && ks[0] != ks[1]);
        for (int c = 0; c < 8; c++) {
            CHECK(((const float *)k)[8 + c] == (float)(l * 100 + c) + 0.25f);
            CHECK(((const float *)v)[8 + c] == (float)(l * 100 + c) + 0.25f);
        }
    }
    kv_seq_release(p1, &a);
    finish(p1);
    // scrub of whole pages whose size is 2 mod 4: pages 0 and 2 start on a
    // word, page 1 two bytes after one
    static const struct {
        int t, kv_dim;
        size_t row;
    } ty[] = {{KS_DTYPE_F16, 33, 66}, {KS_DTYPE_Q8_0, 32, 34}};
    for (size_t i = 0; i < 2; i++)
        for (int mode = 0; mode < 2; mode++) {
            kv_geom g = {.n_layer = 3,
                         .kv_dim = ty[i].kv_dim,
                         .page_tokens = 5,
                         .kv_type = ty[i].t,
                         .planes = 1};
            CHECK_EQ(kv_row_bytes(&g), ty[i].row);
            CHECK_EQ(kv_page_bytes(&g), 3 * 5 * ty[i].row);
            CHECK_EQ(kv_page_bytes(&g) % 4, 2);
            kv_pool *p;
            CHECK_EQ(kv_pool_create(&g, 3, (kv_scrub)mode, &p, &eb), KS_OK);
            CHECK(kv_pool_all_free_and_scrubbed(p));
            kv_seq x, y;
            kv_seq_init(p, &x);
            kv_seq_init(p, &y);
            CHECK_EQ(kv_seq_reserve(p, &x, 10, &eb), KS_OK); // pages 0, 1
            CHECK_EQ(kv_seq_reserve(p, &y, 5, &eb), KS_OK);  // page 2, right after page 1
            fill_bytes(p, &x, 2, 0xab);
            fill_bytes(p, &y, 1, 0xcd);
            kv_seq_set_filled(p, &x, 10);
            kv_seq_set_filled(p, &y, 5);
            void *k1last, *unused; // the last layer of page 1: it ends where page 2 starts
            CHECK_EQ(kv_seq_span_write(p, &x, 1, 2, &k1last, &unused), KS_OK);
            kv_seq_release(p, &x);
            // page 2 untouched: not one byte of its start went with page 1's scrub
            for (int l = 0; l < 3; l++) {
                const void *k, *v;
                CHECK_EQ(kv_seq_span_read(p, &y, 0, l, 5, &k, &v), KS_OK);
                for (size_t b = 0; b < 5 * ty[i].row; b++)
                    CHECK_EQ(((const uint8_t *)k)[b], 0xcd);
            }
            kv_seq_release(p, &y);
            CHECK(kv_pool_all_free_and_scrubbed(p));
            // truthful to the last byte: page 1's final byte, past its last whole word
            uint8_t *last = (uint8_t *)k1last + 5 * ty[i].row - 1, saved = *last;
            *last ^= 0x5a;
            CHECK(!kv_pool_all_free_and_scrubbed(p));
            *last = saved;
            CHECK(kv_pool_all_free_and_scrubbed(p));
            // what the next owner finds, byte by byte: the pattern, in phase on every page
            kv_seq_init(p, &x);
            CHECK_EQ(kv_seq_reserve(p, &x, 15, &eb), KS_OK);
            for (uint32_t pg = 0; pg < 3; pg++)
                for (int l = 0; l < 3; l++) {
                    void *k, *v;
                    CHECK_EQ(kv_seq_span_write(p, &x, pg, l, &k, &v), KS_OK);
                    const uint8_t *b = k;
                    for (size_t o = 0; o < 5 * ty[i].row; o++)
                        CHECK_EQ(b[o], mode == KV_SCRUB_ZERO ? 0 : o % 2 ? 0x7f : 0xc0);
                    if (mode == KV_SCRUB_POISON) { // every f16 element / block scale is NaN
                        size_t step = ty[i].t == KS_DTYPE_F16 ? 2 : 34;
                        for (size_t o = 0; o < 5 * ty[i].row; o += step) {
                            uint16_t hb;
                            memcpy(&hb, b + o, 2);
                            CHECK(isnan(ks_f16_to_f32(hb)));
                        }
                    }
                }
            kv_seq_release(p, &x);
            finish(p);
        }
    // refusals, each naming the value
    static const int bad[] = {3, -1, 7};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kv_geom g = g2;
        g.planes = bad[i];
        char want[32];
        snprintf(want, sizeof want, "planes %d is not 2", bad[i]);
        CHECK_EQ(kv_geom_check(&g, &eb), KS_ERR_INVAL);
        CHECK_STR_HAS(eb.msg, want);
        CHECK_STR_HAS(eb.msg, "or 1");
        CHECK_EQ(kv_page_bytes(&g), 0);
        CHECK_EQ(kv_pages_for_bytes(&g, 1 << 20), 0);
        kv_pool *q;
        CHECK_EQ(kv_pool_create(&g, 1, KV_SCRUB_ZERO, &q, &eb), KS_ERR_INVAL);
        CHECK(q == NULL);
        CHECK_STR_HAS(eb.msg, want);
    }
}

/* I5 support: quarantined pages are neither readable nor reused until freed. */
static void t_quarantine(void) {
    kv_pool *p = mkpool(3, KV_SCRUB_ZERO);
    kv_seq a, b;
    kv_seq_init(p, &a);
    kv_seq_init(p, &b);
    fill(p, &a, 8, 1);
    kv_entry e0 = a.ent[0];
    uint64_t uid = a.uid;
    CHECK_EQ(kv_seq_quarantine(p, &a), 2);
    CHECK_EQ(a.n_pages, 0);
    kv_stats st;
    kv_pool_stats(p, &st);
    CHECK_EQ(st.pages[KV_PAGE_QUARANTINE], 2);
    CHECK_EQ(kv_pool_n_free(p), 1);
    kv_seq ghost = {.ent = &e0, .n_pages = 1, .cap = 1, .uid = uid};
    const void *k, *v;
    void *wk, *wv;
    CHECK_EQ(kv_seq_span_read(p, &ghost, 0, 0, 1, &k, &v), KS_ERR_INTERNAL);
    CHECK_EQ(kv_seq_span_write(p, &ghost, 0, 0, &wk, &wv), KS_ERR_INTERNAL);
    ks_errbuf eb;
    CHECK_EQ(kv_seq_reserve(p, &b, 8, &eb), KS_ERR_NOSPACE);  // not reused
    CHECK_EQ(kv_pool_quarantine_free(p, uid + 1), 0);
    CHECK_EQ(kv_pool_quarantine_free(p, uid), 2);
    CHECK_EQ(kv_seq_reserve(p, &b, 8, &eb), KS_OK);
    kv_seq_release(p, &b);
    finish(p);
}

// ----------------------------------------------------------------------------
// Prefix cache (I7)

/* Roots are domain-separated by tenant; same tenant hits and reads the
 * creator's K/V, another tenant never hits. */
static void t_prefix_tenant(void) {
    uint8_t ra[KV_ROOT_BYTES], ra2[KV_ROOT_BYTES], rb[KV_ROOT_BYTES], rab[KV_ROOT_BYTES];
    root_of("acme", ra);
    root_of("acme", ra2);
    root_of("globex", rb);
    kv_prefix_root("acme!", 4, rab);
    CHECK_MEM_EQ(ra, ra2, KV_ROOT_BYTES);
    CHECK_MEM_EQ(ra, rab, KV_ROOT_BYTES);  // len counts, not the NUL
    kv_pool *p = mkpool(16, KV_SCRUB_ZERO);
    kv_prefix *c;
    ks_errbuf eb;
    CHECK_EQ(kv_prefix_create(p, 8, &c, &eb), KS_OK);
    int32_t toks[14];
    toks_make(toks, 14, 100);
    kv_seq a, b, x;
    kv_seq_init(p, &a);
    kv_seq_init(p, &b);
    kv_seq_init(p, &x);
    CHECK_EQ(kv_prefix_attach(c, ra, toks, 14, &a), 0);  // empty cache
    fill(p, &a, 14, 1);
    kv_prefix_publish(c, ra, toks, 14, &a);
    CHECK_EQ(kv_prefix_n_pages(c), 3);
    kv_stats st;
    kv_pool_stats(p, &st);
    CHECK_EQ(st.prefix_cached_pages, 3);
    // another tenant, same tokens: no reuse
    CHECK_EQ(kv_prefix_attach(c, rb, toks, 14, &x), 0);
    CHECK_EQ(x.n_pages, 0);
    CHECK_EQ(x.n_shared, 0);
    // same tenant: reuse of all three full pages, same pages, same content
    CHECK_EQ(kv_prefix_attach(c, ra, toks, 14, &b), 12);
    CHECK_EQ(b.n_shared, 3);
    CHECK_EQ(b.n_pages, 3);
    CHECK_EQ(b.n_tokens, 12);
    for (uint32_t i = 0; i < 3; i++) {
        CHECK_EQ(b.ent[i].page, a.ent[i].page);
        CHECK_EQ(b.ent[i].tag.seq_uid, a.uid);  // the page keeps its creator's tag
    }
    check_content(p, &b, 12, 1);
    kv_pool_stats(p, &st);
    CHECK_EQ(st.prefix_hits_pages, 3);
    // a different prompt of the same tenant diverging in page 1 reuses page 0 only
    toks[5] ^= 1;
    kv_seq y;
    kv_seq_init(p, &y);
    CHECK_EQ(kv_prefix_attach(c, ra, toks, 14, &y), 4);
    kv_seq_release(p, &y);
    kv_seq_release(p, &a);
    kv_seq_release(p, &b);
    kv_seq_release(p, &x);
    kv_prefix_destroy(c);
    kv_pool_stats(p, &st);
    CHECK_EQ(st.prefix_cached_pages, 0);
    finish(p);
    CHECK(memcmp(ra, rb, KV_ROOT_BYTES) != 0);  // after the attach check: that one shows the leak
}

/* The page holding the last prompt token is never attached (its logits must
 * be computed); published pages are full pages only. */
static void t_prefix_last_token(void) {
    kv_pool *p = mkpool(16, KV_SCRUB_ZERO);
    kv_prefix *c;
    ks_errbuf eb;
    CHECK_EQ(kv_prefix_create(p, 8, &c, &eb), KS_OK);
    uint8_t r[KV_ROOT_BYTES];
    root_of("acme", r);
    int32_t toks[12];
    toks_make(toks, 12, 5);
    kv_seq a;
    kv_seq_init(p, &a);
    fill(p, &a, 2 * P, 1);
    kv_prefix_publish(c, r, toks, 2 * P, &a);
    CHECK_EQ(kv_prefix_n_pages(c), 2);
    kv_seq_release(p, &a);
    static const uint32_t n_in[] = {1, P - 1, P, P + 1, 2 * P - 1, 2 * P, 2 * P + 1, 12};
    static const uint32_t n_out[] = {0, 0, 0, P, P, P, 2 * P, 2 * P};
    for (size_t i = 0; i < sizeof n_in / sizeof n_in[0]; i++) {
        kv_seq s;
        kv_seq_init(p, &s);
        uint32_t got = kv_prefix_attach(c, r, toks, n_in[i], &s);
        CHECK_EQ(got, n_out[i]);
        CHECK(got < n_in[i]);
        kv_seq_release(p, &s);
    }
    // a partly filled last page is not published
    kv_seq b;
    kv_seq_init(p, &b);
    int32_t t2[7];
    toks_make(t2, 7, 900);
    fill(p, &b, 7, 2);
    kv_prefix_publish(c, r, t2, 7, &b);
    CHECK_EQ(kv_prefix_n_pages(c), 3);
    kv_seq_release(p, &b);
    kv_prefix_destroy(c);
    finish(p);
}

/* Shared pages are read-only: writes through an attaching sequence fail, and
 * so do the creator's writes into pages it published. */
static void t_prefix_shared_write(void) {
    kv_pool *p = mkpool(16, KV_SCRUB_ZERO);
    kv_prefix *c;
    ks_errbuf eb;
    CHECK_EQ(kv_prefix_create(p, 8, &c, &eb), KS_OK);
    uint8_t r[KV_ROOT_BYTES];
    root_of("acme", r);
    int32_t toks[10];
    toks_make(toks, 10, 1);
    kv_seq a, b;
    kv_seq_init(p, &a);
    kv_seq_init(p, &b);
    fill(p, &a, 10, 1);
    kv_prefix_publish(c, r, toks, 10, &a);
    void *k, *v;
    CHECK_EQ(kv_seq_span_write(p, &a, 0, 0, &k, &v), KS_ERR_INTERNAL);  // published
    CHECK_EQ(kv_seq_span_write(p, &a, 2, 0, &k, &v), KS_OK);            // its own tail page
    CHECK_EQ(kv_prefix_attach(c, r, toks, 10, &b), 8);
    CHECK_EQ(kv_seq_span_write(p, &b, 0, 0, &k, &v), KS_ERR_INTERNAL);
    CHECK_EQ(kv_seq_span_write(p, &b, 1, 1, &k, &v), KS_ERR_INTERNAL);
    CHECK_EQ(violations(p), 3);
    fill(p, &b, 10, 2);  // the rest is b's own
    CHECK_EQ(kv_seq_span_write(p, &b, 2, 0, &k, &v), KS_OK);
    check_content(p, &b, 8, 1);
    kv_seq_release(p, &a);
    kv_seq_release(p, &b);
    kv_prefix_destroy(c);
    finish(p);
}

/* Refcounts: a cached page outlives its creator, is not evicted while a
 * sequence uses it, and is FREE and scrubbed after eviction. */
static void t_prefix_refcount(void) {
    kv_pool *p = mkpool(8, KV_SCRUB_POISON);
    kv_prefix *c;
    ks_errbuf eb;
    CHECK_EQ(kv_prefix_create(p, 8, &c, &eb), KS_OK);
    uint8_t r[KV_ROOT_BYTES];
    root_of("acme", r);
    int32_t toks[9];
    toks_make(toks, 9, 3);
    kv_seq a, b;
    kv_seq_init(p, &a);
    kv_seq_init(p, &b);
    fill(p, &a, 9, 1);
    kv_prefix_publish(c, r, toks, 9, &a);
    uint32_t pg0 = a.ent[0].page, pg2 = a.ent[2].page;
    CHECK_EQ(info(p, pg0).refcount, 2);
    CHECK_EQ(info(p, pg2).refcount, 1);
    kv_prefix_publish(c, r, toks, 9, &a);  // again: already cached, no new reference
    CHECK_EQ(info(p, pg0).refcount, 2);
    kv_seq_release(p, &a);
    CHECK_EQ(info(p, pg0).refcount, 1);
    CHECK_EQ(info(p, pg0).state, KV_PAGE_READY);
    CHECK_EQ(info(p, pg2).state, KV_PAGE_FREE);  // the unpublished tail went away
    CHECK_EQ(kv_pool_n_free(p), 6);
    CHECK_EQ(kv_prefix_attach(c, r, toks, 9, &b), 8);
    CHECK_EQ(info(p, pg0).refcount, 2);
    CHECK_EQ(kv_prefix_evict(c, 10), 0);  // in use
    CHECK_EQ(kv_prefix_n_pages(c), 2);
    check_content(p, &b, 8, 1);
    kv_seq_release(p, &b);
    CHECK_EQ(info(p, pg0).refcount, 1);
    CHECK_EQ(kv_prefix_evict(c, 10), 2);
    CHECK_EQ(info(p, pg0).state, KV_PAGE_FREE);
    CHECK_EQ(kv_prefix_n_pages(c), 0);
    kv_stats st;
    kv_pool_stats(p, &st);
    CHECK_EQ(st.prefix_cached_pages, 0);
    CHECK_EQ(st.prefix_hits_pages, 2);
    kv_prefix_destroy(c);
    finish(p);
}

/* Publishes a one-page prefix (P+1 tokens from base) and releases its creator. */
static void publish_one(kv_pool *p, kv_prefix *c, const uint8_t *r, int32_t base) {
    int32_t toks[P + 1];
    toks_make(toks, P + 1, base);
    kv_seq s;
    kv_seq_init(p, &s);
    fill(p, &s, P + 1, base);
    kv_prefix_publish(c, r, toks, P + 1, &s);
    kv_seq_release(p, &s);
}

static uint32_t hits_one(kv_pool *p, kv_prefix *c, const uint8_t *r, int32_t base) {
    int32_t toks[P + 1];
    toks_make(toks, P + 1, base);
    kv_seq s;
    kv_seq_init(p, &s);
    uint32_t n = kv_prefix_attach(c, r, toks, P + 1, &s);
    if (n) check_content(p, &s, P, base);
    kv_seq_release(p, &s);
    return n;
}

/* LRU: a full cache evicts the least recently used page that no sequence
 * holds; attach refreshes; with every page in use, publish keeps fewer;
 * eviction takes a chain from its deepest page. */
static void t_prefix_lru(void) {
    kv_pool *p = mkpool(16, KV_SCRUB_ZERO);
    kv_prefix *c;
    ks_errbuf eb;
    CHECK_EQ(kv_prefix_create(p, 3, &c, &eb), KS_OK);
    uint8_t r[KV_ROOT_BYTES];
    root_of("acme", r);
    publish_one(p, c, r, 10);  // X
    publish_one(p, c, r, 20);  // Y
    publish_one(p, c, r, 30);  // Z
    CHECK_EQ(kv_prefix_n_pages(c), 3);
    CHECK_EQ(hits_one(p, c, r, 10), P);  // X is now the most recent: Y is LRU
    publish_one(p, c, r, 40);            // W evicts Y
    CHECK_EQ(kv_prefix_n_pages(c), 3);
    CHECK_EQ(hits_one(p, c, r, 20), 0);
    CHECK_EQ(hits_one(p, c, r, 10), P);
    CHECK_EQ(hits_one(p, c, r, 30), P);
    CHECK_EQ(hits_one(p, c, r, 40), P);
    CHECK_EQ(kv_pool_n_free(p), 13);
    // every cached page in use: a new page is not cached, nothing is evicted
    int32_t t[3][P + 1];
    kv_seq h[3];
    static const int32_t held[3] = {10, 30, 40};
    for (int i = 0; i < 3; i++) {
        toks_make(t[i], P + 1, held[i]);
        kv_seq_init(p, &h[i]);
    }
    for (int i = 0; i < 3; i++) CHECK_EQ(kv_prefix_attach(c, r, t[i], P + 1, &h[i]), P);
    publish_one(p, c, r, 50);
    CHECK_EQ(kv_prefix_n_pages(c), 3);
    CHECK_EQ(hits_one(p, c, r, 50), 0);
    for (int i = 0; i < 3; i++) kv_seq_release(p, &h[i]);
    CHECK_EQ(kv_prefix_evict(c, 1), 1);
    CHECK_EQ(kv_prefix_evict(c, 5), 2);
    // a three-page chain in a three-page cache: eviction trims the deepest page
    int32_t chain[13];
    toks_make(chain, 13, 77);
    kv_seq a, b;
    kv_seq_init(p, &a);
    kv_seq_init(p, &b);
    fill(p, &a, 13, 5);
    kv_prefix_publish(c, r, chain, 13, &a);
    kv_seq_release(p, &a);
    CHECK_EQ(kv_prefix_n_pages(c), 3);
    CHECK_EQ(kv_prefix_evict(c, 1), 1);
    CHECK_EQ(kv_prefix_attach(c, r, chain, 13, &b), 2 * P);
    check_content(p, &b, 2 * P, 5);
    kv_seq_release(p, &b);
    kv_prefix_destroy(c);
    finish(p);
}

/* Defence in depth: a cached entry whose page no longer carries the
 * recorded tag (a bug elsewhere) is reported and never attached. */
static void t_prefix_validate(void) {
    kv_pool *p = mkpool(8, KV_SCRUB_ZERO);
    viol_log vl = {0};
    kv_pool_set_violation_cb(p, on_violation, &vl);
    kv_prefix *c;
    ks_errbuf eb;
    CHECK_EQ(kv_prefix_create(p, 8, &c, &eb), KS_OK);
    uint8_t r[KV_ROOT_BYTES];
    root_of("acme", r);
    int32_t toks[P + 1];
    toks_make(toks, P + 1, 1);
    kv_seq a, b;
    kv_seq_init(p, &a);
    kv_seq_init(p, &b);
    fill(p, &a, P + 1, 1);
    kv_prefix_publish(c, r, toks, P + 1, &a);
    uint32_t pg = a.ent[0].page;
    kv_seq_release(p, &a);
    p->hdr[pg].tag.gen++;  // what a lost reference + reallocation would look like
    CHECK_EQ(kv_prefix_attach(c, r, toks, P + 1, &b), 0);
    CHECK_EQ(vl.n, 1);
    CHECK_EQ(vl.page, pg);
    CHECK_EQ(kv_prefix_n_pages(c), 0);  // dropped, page untouched
    CHECK_EQ(info(p, pg).refcount, 1);
    kv__page_unref(p, pg);  // clean up by hand what the "bug" left behind
    kv_prefix_destroy(c);
    finish(p);
}

// ----------------------------------------------------------------------------
// Threads and cost

typedef struct {
    kv_pool *p;
    const kv_seq *s;
    int iters;
    int fails;
} reader_arg;

static void *reader(void *arg) {
    reader_arg *a = arg;
    for (int i = 0; i < a->iters; i++)
        for (uint32_t pg = 0; pg < a->s->n_pages; pg++) {
            const void *k, *v;
            if (kv_seq_span_read(a->p, a->s, pg, 1, P, &k, &v) != KS_OK) a->fails++;
        }
    return NULL;
}

/* Concurrent readers from worker threads: every bad resolution is counted
 * exactly once, while kv_pool_stats is read from another thread. */
static void t_threads(void) {
    kv_pool *p = mkpool(8, KV_SCRUB_ZERO);
    kv_seq a, b;
    kv_seq_init(p, &a);
    kv_seq_init(p, &b);
    fill(p, &a, 4 * P, 1);
    fill(p, &b, 4 * P, 2);
    a.ent[2].page = b.ent[2].page;
    enum { NT = 4, IT = 2000 };
    pthread_t th[NT];
    reader_arg ra[NT];
    for (int i = 0; i < NT; i++) {
        ra[i] = (reader_arg){.p = p, .s = &a, .iters = IT};
        CHECK_EQ(pthread_create(&th[i], NULL, reader, &ra[i]), 0);
    }
    kv_stats st;
    for (int i = 0; i < 100; i++) kv_pool_stats(p, &st);
    int fails = 0;
    for (int i = 0; i < NT; i++) {
        CHECK_EQ(pthread_join(th[i], NULL), 0);
        fails += ra[i].fails;
    }
    CHECK_EQ(fails, NT * IT);
    CHECK_EQ(violations(p), NT * IT);
    kv_seq_release(p, &a);
    kv_seq_release(p, &b);
    finish(p);
}

/* Cost of one checked resolution against the attention work it guards
 * (one head's q·k over a page plus the V accumulation, D = 128). Prints;
 * never fails on timing (shared machine). */
static void t_cost(void) {
    const kv_geom g = {.n_layer = 1, .kv_dim = 1024, .page_tokens = 16};
    kv_pool *p;
    ks_errbuf eb;
    CHECK_EQ(kv_pool_create(&g, 64, KV_SCRUB_ZERO, &p, &eb), KS_OK);
    kv_seq a;
    kv_seq_init(p, &a);
    CHECK_EQ(kv_seq_reserve(p, &a, 64 * 16, &eb), KS_OK);
    kv_seq_set_filled(p, &a, 64 * 16);
    const int N = 4000000;
    uintptr_t sink = 0;
    uint64_t t0 = ks_now_ns();
    for (int i = 0; i < N; i++) {
        const void *k, *v;
        if (kv_seq_span_read(p, &a, (uint32_t)i & 63, 0, 16, &k, &v) == KS_OK) sink += (uintptr_t)k;
    }
    uint64_t t1 = ks_now_ns();
    float q[128] = {0}, out[128] = {0}, acc = 0;
    const int M = 200000;
    uint64_t t2 = ks_now_ns();
    for (int i = 0; i < M; i++) {
        const void *kb, *vb;
        CHECK_EQ(kv_seq_span_read(p, &a, (uint32_t)i & 63, 0, 16, &kb, &vb), KS_OK);
        const float *k = kb, *v = vb;
        for (int j = 0; j < 16; j++) {
            float d = 0;
            for (int c = 0; c < 128; c++) d += q[c] * k[j * 1024 + c];
            acc += d;
            for (int c = 0; c < 128; c++) out[c] += d * v[j * 1024 + c];
        }
    }
    uint64_t t3 = ks_now_ns();
    const void *ks[64], *vs[64];
    const int R = 100000;
    uint64_t t4 = ks_now_ns();
    for (int i = 0; i < R; i++) {
        CHECK_EQ(kv_seq_span_read_all(p, &a, 0, 64 * 16 - (uint32_t)(i & 7), ks, vs), KS_OK);
        sink += (uintptr_t)ks[i & 63];
    }
    uint64_t t5 = ks_now_ns();
    double ns_check = (double)(t1 - t0) / N, ns_page = (double)(t3 - t2) / M;
    printf("cost: span_read %.2f ns/call, span_read_all %.2f ns/page; one head over one page"
           " (16 x 128, scalar) %.1f ns: %.2f%% (sink %d)\n",
           ns_check, (double)(t5 - t4) / R / 64, ns_page, 100.0 * ns_check / ns_page,
           (int)((sink & 1) + (acc != 0) + out[0]));
    kv_seq_release(p, &a);
    finish(p);
}

// ----------------------------------------------------------------------------
// Issue 12: the choices of an n > 1 request share their prompt's pages

static void t_share_prefix(void) {
    kv_pool *p = mkpool(16, KV_SCRUB_ZERO);
    viol_log vl = {0};
    kv_pool_set_violation_cb(p, on_violation, &vl);
    ks_errbuf eb;
    kv_seq a, b, c;
    kv_seq_init(p, &a);
    kv_seq_init(p, &b);
    kv_seq_init(p, &c);
    CHECK_EQ(kv_seq_reserve(p, &a, 3 * P, &eb), KS_OK); // the prompt: 2 full pages + 1
    CHECK_EQ(kv_seq_reserve(p, &b, 2 * P, &eb), KS_OK); // a choice's own pages
    // not computed yet: refused, counted, nothing changes
    CHECK_EQ(kv_seq_share_prefix(p, &b, &a, 2, &eb), KS_ERR_INTERNAL);
    CHECK_EQ(vl.n, 1);
    CHECK_EQ(b.n_pages, 2u);
    CHECK_EQ(b.n_shared, 0u);
    kv_seq_set_filled(p, &a, 2 * P + 1);
    CHECK_EQ(kv_seq_share_prefix(p, &b, &a, 3, &eb), KS_ERR_INTERNAL); // page 2 is not full
    CHECK_EQ(kv_seq_share_prefix(p, &b, &a, 4, &eb), KS_ERR_INVAL);    // past a's table
    CHECK_EQ(kv_seq_share_prefix(p, &b, &a, 2, &eb), KS_OK);
    CHECK_EQ(b.n_pages, 4u);
    CHECK_EQ(b.n_shared, 2u);
    CHECK_EQ(b.n_tokens, 2 * P);
    for (uint32_t i = 0; i < 2; i++) {
        kv_entry ea = kv_seq_entry(&a, i), eb2 = kv_seq_entry(&b, i);
        CHECK_EQ(ea.page, eb2.page);
        CHECK_EQ(ea.tag.seq_uid, a.uid); // the owner's tag, kept (I1)
        CHECK_EQ(eb2.tag.seq_uid, a.uid);
        CHECK_EQ(info(p, ea.page).refcount, 2u);
    }
    const void *k, *v;
    void *wk, *wv;
    CHECK_EQ(kv_seq_span_read(p, &b, 1, 0, P, &k, &v), KS_OK);
    CHECK_EQ(kv_seq_span_write(p, &b, 1, 0, &wk, &wv), KS_ERR_INTERNAL); // read-only for b
    CHECK_EQ(kv_seq_span_write(p, &b, 2, 0, &wk, &wv), KS_OK);           // its own page
    // a second share into a table that already shares: refused
    CHECK_EQ(kv_seq_share_prefix(p, &b, &a, 1, &eb), KS_ERR_INVAL);
    // a table with a filled page of its own is not fresh
    CHECK_EQ(kv_seq_reserve(p, &c, P, &eb), KS_OK);
    kv_seq_set_filled(p, &c, 1);
    c.n_tokens = 0;
    CHECK_EQ(kv_seq_share_prefix(p, &c, &a, 1, &eb), KS_ERR_INTERNAL);
    // released in any order, each page exactly once
    uint32_t free0 = kv_pool_n_free(p);
    kv_seq_release(p, &a); // the owner first: the shared pages stay for b
    CHECK_EQ(kv_pool_n_free(p), free0 + 1);
    CHECK_EQ(kv_seq_span_read(p, &b, 0, 1, P, &k, &v), KS_OK);
    kv_seq_release(p, &b);
    kv_seq_release(p, &c);
    CHECK(kv_pool_all_free_and_scrubbed(p));
    kv_pool_destroy(p);
}

// ----------------------------------------------------------------------------
// Recurrent-state pages (hybrid models)

/* A hybrid geometry's sequences hold g.state_pages pages of state from their
 * first reserve: counted in the reserve (all or nothing), zeroed even in a
 * poison pool, owned and tag-checked (I1: a swapped entry fails, the other
 * sequence's state is untouched), scrubbed on release (I3), quarantined
 * with the KV pages, never shared: another sequence sharing the pages
 * before a boundary gets a copy of the state there. */
static void t_state_pages(void) {
    for (int mode = 0; mode < 2; mode++) {
        const kv_geom g0 = G;
        G.state_pages = 2;
        kv_pool *p = mkpool(9, mode ? KV_SCRUB_POISON : KV_SCRUB_ZERO);
        viol_log vl = {0};
        kv_pool_set_violation_cb(p, on_violation, &vl);
        const size_t pb = kv_pool_page_bytes(p);
        kv_seq a, b, c;
        kv_seq_init(p, &a);
        kv_seq_init(p, &b);
        kv_seq_init(p, &c);
        void *st;
        CHECK_EQ(kv_seq_state(p, &a, 0, &st), KS_ERR_INTERNAL); // none before the reserve
        CHECK_EQ(vl.n, 1);
        CHECK_EQ(kv_seq_pages_needed(p, &a, 2 * P), 4);
        ks_errbuf eb;
        CHECK_EQ(kv_seq_reserve(p, &a, 2 * P, &eb), KS_OK); // 2 KV pages + 2 state pages
        CHECK_EQ(kv_pool_n_free(p), 5);
        CHECK_EQ(kv_seq_pages_needed(p, &a, 2 * P), 0);
        CHECK_EQ(kv_seq_pages_needed(p, &a, 3 * P), 1);
        CHECK_EQ(kv_seq_reserve(p, &b, 4 * P, &eb), KS_ERR_NOSPACE); // 4 + 2 > 5: nothing taken
        CHECK_EQ(kv_pool_n_free(p), 5);
        CHECK(b.st == NULL && b.n_pages == 0);
        CHECK_EQ(kv_seq_reserve(p, &b, 2 * P, &eb), KS_OK);
        CHECK_EQ(kv_pool_n_free(p), 1);
        for (uint32_t i = 0; i < 2; i++) { // zeroed, then written with each owner's marker
            CHECK_EQ(kv_seq_state(p, &a, i, &st), KS_OK);
            for (size_t j = 0; j < pb; j++) CHECK(((uint8_t *)st)[j] == 0);
            memset(st, 0xa1, pb);
            CHECK_EQ(kv_seq_state(p, &b, i, &st), KS_OK);
            memset(st, 0xb2, pb);
        }
        CHECK_EQ(vl.n, 1);
        kv_entry a1 = a.st[1];
#ifdef KS_TEST_FAULTS
        kv_fault_swap_state(&a, &b, 1);
#else
        a.st[1].page = b.st[1].page; // the same corruption, by hand
#endif
        CHECK_EQ(kv_seq_state(p, &a, 1, &st), KS_ERR_INTERNAL);
        CHECK_EQ(vl.n, 2);
        CHECK_EQ(vl.seq_uid, a.uid);
        CHECK_EQ(vl.expected.gen, a1.tag.gen);
        CHECK_EQ(kv_seq_state(p, &a, 2, &st), KS_ERR_INTERNAL); // past the state
        CHECK_EQ(vl.n, 3);
        // the page-frame view (pd): layer l's planes are the page's bytes at
        // l * planes * P rows; the grant entry names the page and its tag
        void *sk, *sv, *whole;
        CHECK_EQ(kv_seq_state(p, &b, 0, &whole), KS_OK);
        const size_t lb = pb / (size_t)G.n_layer;
        CHECK_EQ(kv_seq_state_span(p, &b, 0, 1, &sk, &sv), KS_OK);
        CHECK(sk == (uint8_t *)whole + lb);
        CHECK(NP == 2 ? sv == (uint8_t *)sk + lb / 2 : sv == NULL);
        CHECK_EQ(kv_seq_state_span(p, &b, 0, G.n_layer, &sk, &sv), KS_ERR_INTERNAL);
        CHECK_EQ(vl.n, 4);
        CHECK_EQ(kv_seq_state_span(p, &a, 1, 0, &sk, &sv), KS_ERR_INTERNAL); // the swapped entry
        CHECK_EQ(vl.n, 5);
        CHECK_EQ(kv_seq_state_entry(&b, 1).page, b.st[1].page);
        CHECK_EQ(kv_seq_state_entry(&b, 1).tag.seq_uid, b.uid);
        // release finds a's real page by its tag, frees it scrubbed; b's is intact
        kv_seq_release(p, &a);
        CHECK_EQ(info(p, a1.page).state, KV_PAGE_FREE);
        CHECK_EQ(kv_seq_state(p, &b, 1, &st), KS_OK);
        for (size_t j = 0; j < pb; j++) CHECK(((uint8_t *)st)[j] == 0xb2);
        // pages are shared only with the state after them: b has consumed none
        fill(p, &c, 1, 3);
        CHECK_EQ(kv_seq_share_prefix(p, &c, &b, 1, &eb), KS_ERR_INVAL);
        kv_seq_release(p, &c);
        // quarantine takes the state pages with the KV pages
        uint64_t uid = b.uid;
        CHECK_EQ(kv_seq_quarantine(p, &b), 4);
        CHECK(b.st == NULL);
        CHECK_EQ(kv_pool_quarantine_free(p, uid), 4);
        // an n > 1 request's choices: x's state after exactly its full page
        // is copied into y's own state pages with the page (never shared)
        kv_seq x, y;
        kv_seq_init(p, &x);
        kv_seq_init(p, &y);
        fill(p, &x, P, 7);
        for (uint32_t i = 0; i < 2; i++) {
            CHECK_EQ(kv_seq_state(p, &x, i, &st), KS_OK);
            memset(st, 0xc3 + (int)i, pb);
        }
        CHECK_EQ(kv_seq_reserve(p, &y, 2 * P, &eb), KS_OK);
        CHECK_EQ(kv_seq_share_prefix(p, &y, &x, 1, &eb), KS_OK);
        check_content(p, &y, P, 7);
        for (uint32_t i = 0; i < 2; i++) {
            CHECK(y.st[i].page != x.st[0].page && y.st[i].page != x.st[1].page);
            CHECK_EQ(kv_seq_state(p, &y, i, &st), KS_OK);
            for (size_t j = 0; j < pb; j++) CHECK(((uint8_t *)st)[j] == 0xc3 + i);
            memset(st, 0xd4, pb); // y's own: x's stays
            CHECK_EQ(kv_seq_state(p, &x, i, &st), KS_OK);
            for (size_t j = 0; j < pb; j++) CHECK(((uint8_t *)st)[j] == 0xc3 + i);
        }
        kv_seq_release(p, &y);
        fill(p, &x, P + 1, 7); // x's state is now past the page: no share
        kv_seq_init(p, &y);
        CHECK_EQ(kv_seq_reserve(p, &y, P, &eb), KS_OK);
        CHECK_EQ(kv_seq_share_prefix(p, &y, &x, 1, &eb), KS_ERR_INVAL);
        CHECK(y.n_shared == 0 && y.n_tokens == 0);
        kv_seq_release(p, &y);
        kv_seq_release(p, &x);
        finish(p);
        G = g0;
    }
}

/* Prefix caching for a hybrid geometry: a cached prefix resumes only where
 * its recurrent state was kept. publish_state keeps a copy (the cache's own
 * pages, not the publisher's) with the entry of the last page; attach stops at
 * the deepest such entry, under the same tenant root (I7), and gives the new
 * sequence its OWN state pages holding the snapshot; snapshots count in the
 * cache's pages, within max_pages, and are scrubbed when dropped (I3). */
/* A corrupted state entry is released by the page found under its tag; a
 * tag names one page only, so that search can never pick another page of
 * the same sequence still held elsewhere (here its KV page the prefix
 * cache keeps; in a fresh pool every page's first allocation used to get
 * the same gen, so the search found that page, took the cache's reference
 * away and left the real state page ALLOCATED forever: the leak suite's
 * rare "1 page ALLOCATED" after a swap_state run). */
static void t_state_tag_unique(void) {
    const kv_geom g0 = G;
    G.state_pages = 2;
    kv_pool *p = mkpool(12, KV_SCRUB_ZERO);
    viol_log vl = {0};
    kv_pool_set_violation_cb(p, on_violation, &vl);
    kv_prefix *c;
    ks_errbuf eb;
    CHECK_EQ(kv_prefix_create(p, 4, &c, &eb), KS_OK);
    uint8_t r[KV_ROOT_BYTES];
    root_of("acme", r);
    int32_t toks[2 * P];
    toks_make(toks, 2 * P, 3);
    kv_seq a, b;
    kv_seq_init(p, &a);
    kv_seq_init(p, &b);
    fill(p, &a, 2 * P, 1); // 2 KV pages + 2 state pages
    fill(p, &b, P, 2);
    kv_prefix_publish(c, r, toks, 2 * P, &a); // the cache keeps a's KV pages
    CHECK_EQ(kv_prefix_n_pages(c), 2);
    // every page of a, KV and state, has a tag of its own
    kv_tag tags[4] = {a.ent[0].tag, a.ent[1].tag, a.st[0].tag, a.st[1].tag};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < i; j++) CHECK(tags[i].gen != tags[j].gen);
    const uint32_t real = a.st[1].page, kv0 = a.ent[0].page, kv1 = a.ent[1].page;
    a.st[1].page = b.st[1].page; // the swap_state fault, by hand
    kv_seq_release(p, &a);
    CHECK(vl.n >= 1);
    CHECK_EQ(info(p, real).state, KV_PAGE_FREE); // found by its own tag
    CHECK_EQ(info(p, real).refcount, 0);
    CHECK_EQ(info(p, kv0).refcount, 1); // the cache's, untouched
    CHECK_EQ(info(p, kv1).refcount, 1);
    kv_seq_release(p, &b);
    CHECK_EQ(kv_prefix_n_pages(c), 2); // the cache's references are intact
    kv_prefix_destroy(c);
    CHECK(kv_pool_all_free_and_scrubbed(p));
    kv_pool_destroy(p);
    G = g0;
}

static void t_prefix_state(void) {
    const kv_geom g0 = G;
    G.state_pages = 2;
    kv_pool *p = mkpool(24, KV_SCRUB_POISON);
    viol_log vl = {0};
    kv_pool_set_violation_cb(p, on_violation, &vl);
    const size_t pb = kv_pool_page_bytes(p);
    uint8_t ra[KV_ROOT_BYTES], rb[KV_ROOT_BYTES];
    root_of("tenant-a", ra);
    root_of("tenant-b", rb);
    int32_t toks[16];
    toks_make(toks, 16, 100);
    ks_errbuf eb;
    kv_prefix *c;
    CHECK_EQ(kv_prefix_create(p, 6, &c, &eb), KS_OK);
    kv_seq a, b, x;
    kv_seq_init(p, &a);
    CHECK_EQ(kv_seq_reserve(p, &a, 14, &eb), KS_OK); // 4 KV + 2 state pages
    fill(p, &a, 8, 1);
    void *st;
    for (uint32_t i = 0; i < 2; i++) {
        CHECK_EQ(kv_seq_state(p, &a, i, &st), KS_OK);
        memset(st, 0x51 + (int)i, pb);
    }
    kv_prefix_publish_state(c, ra, toks, 7, &a); // not a page boundary: no snapshot
    CHECK_EQ(kv_prefix_n_pages(c), 1);
    kv_seq_init(p, &x);
    CHECK_EQ(kv_prefix_attach(c, ra, toks, 14, &x), 0); // pages, but no state to resume from
    CHECK(x.st == NULL && x.n_pages == 0);
    kv_prefix_publish_state(c, ra, toks, 8, &a); // the state after exactly 8 tokens
    CHECK_EQ(kv_prefix_n_pages(c), 4);           // 2 pages + a 2-page snapshot
    kv_stats ks;
    kv_pool_stats(p, &ks);
    CHECK_EQ(ks.prefix_cached_pages, 4);
    CHECK_EQ(kv_pool_n_free(p), 24 - 6 - 2);
    // the publisher's state moves on; the snapshot does not
    CHECK_EQ(kv_seq_state(p, &a, 0, &st), KS_OK);
    memset(st, 0x77, pb);
    CHECK_EQ(kv_prefix_attach(c, rb, toks, 14, &x), 0); // another tenant: nothing
    CHECK(x.st == NULL);
    kv_seq_init(p, &b);
    CHECK_EQ(kv_prefix_attach(c, ra, toks, 14, &b), 8);
    CHECK(b.st != NULL && b.n_shared == 2);
    check_content(p, &b, 8, 1);
    for (uint32_t i = 0; i < 2; i++) {
        CHECK_EQ(kv_seq_state(p, &b, i, &st), KS_OK); // b's own, writable, a copy
        CHECK(b.st[i].page != a.st[i].page && b.st[i].tag.seq_uid == b.uid);
        for (size_t j = 0; j < pb; j++)
            CHECK(((uint8_t *)st)[j] == 0x51 + i);
        memset(st, 0x99, pb);
    }
    CHECK_EQ(kv_seq_pages_needed(p, &b, 14), 2); // its state pages are taken already
    // a deeper page without a snapshot does not move the resume point
    fill(p, &a, 12, 1);
    kv_prefix_publish(c, ra, toks, 12, &a);
    kv_seq y;
    kv_seq_init(p, &y);
    CHECK_EQ(kv_prefix_attach(c, ra, toks, 16, &y), 8);
    CHECK_EQ(kv_seq_state(p, &y, 1, &st), KS_OK);
    CHECK(((uint8_t *)st)[0] == 0x52); // b's writes stayed in b's pages
    kv_seq_release(p, &y);
    // no room for the state pages: nothing is attached, nothing is taken
    uint32_t nf = kv_pool_n_free(p);
    kv_seq hog;
    kv_seq_init(p, &hog);
    CHECK_EQ(kv_seq_reserve(p, &hog, (nf - 1 - 2) * P, &eb), KS_OK); // leaves 1 free
    CHECK_EQ(kv_pool_n_free(p), 1);
    CHECK_EQ(kv_prefix_attach(c, ra, toks, 14, &y), 0);
    CHECK(y.st == NULL && y.n_pages == 0 && kv_pool_n_free(p) == 1);
    // eviction takes the snapshot of an entry still in use, too
    CHECK_EQ(kv_prefix_evict(c, 2), 2);
    CHECK_EQ(kv_prefix_n_pages(c), 3);
    kv_seq_release(p, &hog);
    CHECK_EQ(kv_prefix_attach(c, ra, toks, 14, &y), 0); // the state is gone
    // the snapshot budget (max_pages) drops the least recently used one
    kv_prefix_publish_state(c, ra, toks, 8, &a); // a's state is that after 12 now: none
    CHECK_EQ(kv_prefix_n_pages(c), 3);
    kv_prefix *c2;
    CHECK_EQ(kv_prefix_create(p, 3, &c2, &eb), KS_OK);
    int32_t t2[9], t4[5];
    toks_make(t2, 9, 900);
    toks_make(t4, 5, 300);
    kv_seq d, e;
    kv_seq_init(p, &d);
    kv_seq_init(p, &e);
    CHECK_EQ(kv_seq_reserve(p, &d, 8, &eb), KS_OK);
    CHECK_EQ(kv_seq_reserve(p, &e, 4, &eb), KS_OK);
    fill(p, &d, 8, 2);
    fill(p, &e, 4, 3);
    kv_prefix_publish_state(c2, ra, t2, 8, &d);
    CHECK_EQ(kv_prefix_n_pages(c2), 4);
    kv_prefix_publish_state(c2, ra, t4, 4, &e); // 2 + 2 snapshot pages > 3: d's goes
    CHECK_EQ(kv_prefix_n_pages(c2), 5);
    kv_seq z;
    kv_seq_init(p, &z);
    CHECK_EQ(kv_prefix_attach(c2, ra, t2, 9, &z), 0);
    CHECK_EQ(kv_prefix_attach(c2, ra, t4, 5, &z), 4);
    CHECK_EQ(vl.n, 0);
    kv_seq_release(p, &z);
    kv_seq_release(p, &e);
    kv_prefix_destroy(c2);
    kv_seq_release(p, &z);
    kv_seq_release(p, &d);
    kv_seq_release(p, &b);
    kv_seq_release(p, &a);
    kv_seq_release(p, &x);
    kv_prefix_destroy(c);
    kv_pool_stats(p, &ks);
    CHECK_EQ(ks.prefix_cached_pages, 0);
    finish(p);
    G = g0;
}

/* Speculative decoding's rollback (kv_seq_truncate): the rows of rejected
 * drafts are scrubbed at once (catches a truncate that only moves the
 * counters, leaving a draft's K/V in the page), a page past the new end is
 * unreadable again, the kept rows stay, the pages stay reserved, and new
 * rows are written where the rejected ones were. Shared prefix pages are
 * never touched. */
static void t_truncate(void) {
    kv_pool *p = mkpool(8, KV_SCRUB_ZERO);
    ks_errbuf eb;
    kv_seq s;
    kv_seq_init(p, &s);
    fill(p, &s, 11, 3); // pages 0, 1 full; page 2 rows 0..2
    const uint32_t free0 = kv_pool_n_free(p);
    kv_seq_truncate(p, &s, 6); // keep page 0 and page 1's rows 0..1
    CHECK_EQ(s.n_tokens, 6u);
    CHECK_EQ(s.n_pages, 3u);                 // still reserved
    CHECK_EQ(kv_pool_n_free(p), free0);
    check_content(p, &s, 6, 3);
    const size_t rb = kv_row_bytes(&G);
    for (uint32_t pg = 1; pg < 3; pg++) {
        const kv_entry e = kv_seq_entry(&s, pg);
        CHECK_EQ(info(p, e.page).filled, pg == 1 ? 2u : 0u);
        CHECK_EQ(info(p, e.page).state, pg == 1 ? KV_PAGE_READY : KV_PAGE_ALLOCATED);
        const uint8_t *b = kv__page_base(p, e.page);
        for (int pl = 0; pl < G.n_layer * NP; pl++)
            for (uint32_t r = 0; r < P; r++) {
                const uint8_t *row = b + ((size_t)pl * P + r) * rb;
                bool zero = true;
                for (size_t i = 0; i < rb; i++)
                    zero = zero && row[i] == 0;
                // kept: page 1 rows 0..1; everything after was a rejected draft's
                CHECK(zero == (pg == 2 || r >= 2));
            }
    }
    const void *kb, *vb;
    CHECK_EQ(kv_seq_span_read(p, &s, 2, 0, 1, &kb, &vb), KS_ERR_INTERNAL); // not readable
    CHECK_EQ(kv_seq_span_read(p, &s, 1, 0, 3, &kb, &vb), KS_ERR_INTERNAL); // past filled
    fill(p, &s, 12, 4); // positions 6..11 written again, by another marker
    for (uint32_t pos = 6; pos < 12; pos++) {
        CHECK_EQ(kv_seq_span_read(p, &s, pos / P, 1, pos % P + 1, &kb, &vb), KS_OK);
        CHECK(((const float *)kb)[(pos % P) * (uint32_t)G.kv_dim] == val(4, pos, 1, 0, 0));
    }
    check_content(p, &s, 6, 3);
    // a table that shares a prefix keeps it whole: truncation stops at its end
    kv_seq t;
    kv_seq_init(p, &t);
    CHECK_EQ(kv_seq_reserve(p, &t, 3 * P, &eb), KS_OK);
    CHECK_EQ(kv_seq_share_prefix(p, &t, &s, 2, &eb), KS_OK);
    fill(p, &t, 2 * P + 3, 5);
    kv_seq_truncate(p, &t, 2 * P);
    CHECK_EQ(t.n_tokens, 2 * P);
    check_content(p, &s, 6, 3); // s's pages, shared into t, untouched
    CHECK_EQ(violations(p), 2); // the two refused reads above
    kv_seq_release(p, &t);
    kv_seq_release(p, &s);
    finish(p);
}

/* A pool destroyed with pages still held (a model unloaded while a request
 * ran) scrubs their payloads before the slab goes back to the allocator
 * (I3): the slab's free finds every held page zero. */
static void t_destroy_scrubs(void) {
    kv_pool *p = mkpool(8, KV_SCRUB_ZERO);
    ks_errbuf eb;
    kv_seq a;
    kv_seq_init(p, &a);
    CHECK_EQ(kv_seq_reserve(p, &a, 2 * P + 1, &eb), KS_OK);
    fill(p, &a, 2 * P + 1, 9);
    check_content(p, &a, 2 * P + 1, 9); // a tenant's KV is there
    for (uint32_t i = 0; i < a.n_pages; i++)
        free_watch_add(kv__page_base(p, kv_seq_entry(&a, i).page), kv_pool_page_bytes(p));
    kv_pool_destroy(p); // a is never released
    int freed, dirty;
    const int w = free_watch_end(&freed, &dirty);
    CHECK_EQ(w, (int)a.n_pages);
    CHECK_EQ(freed, w);
    CHECK_EQ(dirty, 0);
    free(a.ent); // the table is the caller's memory and outlived its pool here
    free(a.st);
}

// ----------------------------------------------------------------------------

typedef struct {
    const char *name;
    void (*fn)(void);
    bool per_planes; /* run with G.planes 2, then 1 */
} test_case;

static const test_case cases[] = {
    {"reserve", t_reserve, true},
    {"identity", t_identity, true},
    {"tag_swap", t_tag_swap, true},
    {"stale_entry", t_stale_entry, true},
    {"state", t_state, true},
    {"scrub_zero", t_scrub_zero, true},
    {"scrub_poison", t_scrub_poison, true},
    {"types", t_types, false},
    {"planes", t_planes, false},
    {"dirty_alloc", t_dirty_alloc, true},
    {"quarantine", t_quarantine, true},
    {"prefix_tenant", t_prefix_tenant, true},
    {"prefix_last_token", t_prefix_last_token, true},
    {"prefix_shared_write", t_prefix_shared_write, true},
    {"prefix_refcount", t_prefix_refcount, true},
    {"prefix_lru", t_prefix_lru, true},
    {"prefix_validate", t_prefix_validate, true},
    {"threads", t_threads, true},
    {"share_prefix", t_share_prefix, true},
    {"truncate", t_truncate, true},
    {"state_pages", t_state_pages, true},
    {"prefix_state", t_prefix_state, true},
    {"state_tag_unique", t_state_tag_unique, true},
    {"destroy_scrubs", t_destroy_scrubs, true},
    {"cost", t_cost, false},
};

int main(int argc, char **argv) {
    ks_log_set_level(KS_LOG_OFF);  // violations are expected here; they log at ERROR
    int ran = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (argc > 1 && strcmp(argv[1], cases[i].name) != 0) continue;
        for (int planes = 2; planes >= (cases[i].per_planes ? 1 : 2); planes--) {
            G.planes = planes;
            cases[i].fn();
            printf("  %s ok%s\n", cases[i].name,
                   !cases[i].per_planes ? ""
                   : planes == 2        ? " (2 planes)"
                                        : " (1 plane)");
        }
        G.planes = 0;
        ran++;
    }
    CHECK(ran > 0);
    printf("kv ok\n");
    return 0;
}
