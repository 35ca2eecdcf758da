/* test_pd_ucx.c — the UCX data plane's transport (pd_ucx.h) with page sealing
 * (pd_seal.h), over UCX's tcp and shared-memory transports in one process (a
 * decode worker and a prefill worker, each its own UCP context): decode maps
 * a grant's staging area, prefill puts sealed pages with the grant's key and
 * flushes, decode opens them into pool pages; a tampered page is refused; an
 * abort mid-transfer revokes the key and leaves the pool pages untouched and
 * clean, even when a late put with the revoked key still lands (UCX's tcp and
 * sm emulate puts and cannot refuse them: docs/pd-protocol.md section 11).
 * `test_pd_ucx bench [MiB]` measures seal + put + flush + open per transport. */
#include "kvseal/pd_seal.h"
#include "kvseal/pd_ucx.h"

#include "../check.h"

#include <stdlib.h>
#include <time.h>

#define PAGE (64u * 1024u)
#define SLOT (PAGE + PD_SEAL_TAG_BYTES)
#define NPG 6

static const uint8_t LINK_KEY[PD_SEAL_KEY_BYTES] = "link-key-exported-from-TLS-0123";

static uint8_t pat(uint64_t i, size_t j) { return (uint8_t)(i * 131u + j * 7u + (j >> 8)); }

typedef struct pair {
    pd_ucx *dec, *pre;
    pd_ucx_ep *ep; /* prefill -> decode */
} pair;

static bool mkpair(const char *tls, pair *p) {
    ks_errbuf eb;
    memset(p, 0, sizeof *p);
    ks_err e = pd_ucx_create(tls, &p->dec, &eb);
    if (e == KS_OK) e = pd_ucx_create(tls, &p->pre, &eb);
    if (e != KS_OK) {
        fprintf(stderr, "UCX over %s: %s\n", tls, eb.msg);
        pd_ucx_destroy(p->dec);
        return false;
    }
    size_t alen;
    const void *addr = pd_ucx_address(p->dec, &alen);  // travels over the TLS link
    CHECK_EQ(pd_ucx_connect(p->pre, addr, alen, &p->ep, &eb), KS_OK);
    return true;
}

static void rmpair(pair *p) {
    pd_ucx_ep_close(p->ep);
    pd_ucx_destroy(p->pre);
    pd_ucx_destroy(p->dec);
}

/* Progresses both workers until prefill's flush completes. */
static ks_err flush(pair *p) {
    ks_errbuf eb;
    ks_err e = pd_ucx_flush_start(p->ep, &eb);
    if (e) return e;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while ((e = pd_ucx_flush_poll(p->ep, &eb)) == KS_ERR_AGAIN) {
        pd_ucx_progress(p->pre);
        pd_ucx_progress(p->dec);
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 20) return KS_ERR_TIMEOUT;
    }
    if (e) fprintf(stderr, "flush: %s\n", eb.msg);
    return e;
}

static pd_seal_ad page_ad(uint64_t req, uint32_t gen, uint32_t i) {
    pd_seal_ad ad = {.req_id = req, .seq_uid = 77 + gen, .gen = gen, .record = i,
                     .page_id = 100 + i, .page_index = i, .n_rows = 16, .layer_lo = 0,
                     .layer_hi = 2};
    return ad;
}

/* Prefill's side of a grant: seals pages [from, to) of request req into
 * sealed[] and puts each into its slot of the granted area. */
static void put_pages(pair *p, pd_seal_grant *tx, pd_ucx_rkey *k, uint64_t raddr, uint64_t req,
                      uint32_t gen, uint8_t *sealed, uint32_t from, uint32_t to) {
    ks_errbuf eb;
    for (uint32_t i = from; i < to; i++) {
        uint8_t *s = sealed + (size_t)i * SLOT;
        for (size_t j = 0; j < PAGE; j++) s[j] = pat(req * 16 + i, j);
        pd_seal_ad ad = page_ad(req, gen, i);
        CHECK_EQ(pd_seal_page(tx, &ad, s, PAGE, s, &eb), KS_OK);
        CHECK_EQ(pd_ucx_put(p->ep, k, s, SLOT, raddr + (size_t)i * SLOT, &eb), KS_OK);
    }
}

static bool pool_is(const uint8_t *pool, uint64_t req, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        for (size_t j = 0; j < PAGE; j++)
            if (pool[(size_t)i * PAGE + j] != pat(req * 16 + i, j)) return false;
    return true;
}

static bool all_zero(const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (b[i]) return false;
    return true;
}

static int test_transport(const char *tls) {
    pair p;
    if (!mkpair(tls, &p)) return 0;
    ks_errbuf eb;
    // decode: a staging area (registered, per grant) and pool pages (never registered)
    uint8_t *staging = calloc(NPG, SLOT), *pool = calloc(NPG, PAGE);
    uint8_t *sealed = calloc(NPG, SLOT);
    CHECK(staging && pool && sealed);

    // (a) a grant: key created at GRANT, sealed pages put, flush, then DONE
    pd_ucx_region *r = NULL;
    CHECK_EQ(pd_ucx_map(p.dec, staging, (size_t)NPG * SLOT, &r, &eb), KS_OK);
    size_t klen;
    uint64_t raddr;
    const void *packed = pd_ucx_region_key(r, &klen, &raddr);  // travels with the GRANT
    pd_ucx_rkey *k = NULL;
    CHECK_EQ(pd_ucx_rkey_open(p.ep, packed, klen, &k, &eb), KS_OK);
    pd_seal_grant tx, rx;
    CHECK_EQ(pd_seal_grant_init(&tx, LINK_KEY, 1, 77 + 1, true, &eb), KS_OK);
    CHECK_EQ(pd_seal_grant_init(&rx, LINK_KEY, 1, 77 + 1, false, &eb), KS_OK);
    put_pages(&p, &tx, k, raddr, 1, 1, sealed, 0, NPG);
    CHECK_EQ(flush(&p), KS_OK);
    // DONE arrived: decode opens every page into the pool, verifying it
    for (uint32_t i = 0; i < NPG; i++) {
        pd_seal_ad ad = page_ad(1, 1, i);
        CHECK_EQ(pd_seal_open(&rx, &ad, staging + (size_t)i * SLOT, PAGE, pool + (size_t)i * PAGE,
                              &eb), KS_OK);
    }
    CHECK(pool_is(pool, 1, NPG));
    // a byte changed on the fabric: refused, the pool page never readable
    staging[SLOT + 5] ^= 0x40;
    pd_seal_ad ad1 = page_ad(1, 1, 1);
    CHECK_EQ(pd_seal_open(&rx, &ad1, staging + SLOT, PAGE, pool + PAGE, &eb), KS_ERR_PROTO);
    CHECK(all_zero(pool + PAGE, PAGE));
    pd_seal_grant_free(&tx);
    pd_seal_grant_free(&rx);
    pd_ucx_rkey_close(k);
    pd_ucx_revoke(r);  // F1: revoked before the pages go back

    // (b) abort mid-transfer: half the pages put and flushed, decode aborts
    // (revokes the key, scrubs staging and pool pages), then a late put with
    // the revoked key from a prefill that has not seen the ABORT yet
    memset(staging, 0, (size_t)NPG * SLOT);
    memset(pool, 0, (size_t)NPG * PAGE);
    CHECK_EQ(pd_ucx_map(p.dec, staging, (size_t)NPG * SLOT, &r, &eb), KS_OK);
    packed = pd_ucx_region_key(r, &klen, &raddr);
    CHECK_EQ(pd_ucx_rkey_open(p.ep, packed, klen, &k, &eb), KS_OK);
    CHECK_EQ(pd_seal_grant_init(&tx, LINK_KEY, 2, 77 + 2, true, &eb), KS_OK);
    put_pages(&p, &tx, k, raddr, 2, 2, sealed, 0, NPG / 2);
    CHECK_EQ(flush(&p), KS_OK);
    CHECK(!all_zero(staging, SLOT));
    pd_ucx_revoke(r);                       // abort: the key first
    memset(staging, 0, (size_t)NPG * SLOT); // then scrub (pool pages were never written)
    CHECK(all_zero(pool, (size_t)NPG * PAGE));
    put_pages(&p, &tx, k, raddr, 2, 2, sealed, NPG / 2, NPG);  // late puts
    ks_err late = flush(&p);
    bool landed = !all_zero(staging, (size_t)NPG * SLOT);
    printf("test_pd_ucx: %s: a put with a revoked key %s (flush: %s)\n", tls,
           landed ? "still landed in the staging area" : "did not land", ks_err_name(late));
    // whatever landed: the pool is untouched, and the late page does not open
    // under the next grant's key (the staging slot's next user)
    CHECK(all_zero(pool, (size_t)NPG * PAGE));
    if (landed) {
        CHECK_EQ(pd_seal_grant_init(&rx, LINK_KEY, 3, 77 + 3, false, &eb), KS_OK);
        pd_seal_ad ad = page_ad(3, 3, NPG / 2);
        CHECK_EQ(pd_seal_open(&rx, &ad, staging + (size_t)(NPG / 2) * SLOT, PAGE, pool, &eb),
                 KS_ERR_PROTO);
        CHECK(all_zero(pool, PAGE));
        pd_seal_grant_free(&rx);
    }
    pd_seal_grant_free(&tx);
    pd_ucx_rkey_close(k);
    rmpair(&p);
    free(staging);
    free(pool);
    free(sealed);
    return 1;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* MiB of 64 KiB pages in grants of 64 pages: map + seal + put + flush + open
 * + revoke, one thread driving both workers (as one core would). */
static void bench(const char *tls, int mib) {
    enum { GP = 64 };
    pair p;
    if (!mkpair(tls, &p)) return;
    ks_errbuf eb;
    uint8_t *staging = calloc(GP, SLOT), *pool = calloc(GP, PAGE), *sealed = calloc(GP, SLOT);
    CHECK(staging && pool && sealed);
    int grants = mib * 16 / GP;
    if (grants < 1) grants = 1;
    double t_put = 0, t0 = now_s();
    for (int g = 0; g < grants; g++) {
        pd_ucx_region *r;
        CHECK_EQ(pd_ucx_map(p.dec, staging, (size_t)GP * SLOT, &r, &eb), KS_OK);
        size_t klen;
        uint64_t raddr;
        const void *packed = pd_ucx_region_key(r, &klen, &raddr);
        pd_ucx_rkey *k;
        CHECK_EQ(pd_ucx_rkey_open(p.ep, packed, klen, &k, &eb), KS_OK);
        pd_seal_grant tx, rx;
        CHECK_EQ(pd_seal_grant_init(&tx, LINK_KEY, (uint64_t)g, 77 + 1, true, &eb), KS_OK);
        CHECK_EQ(pd_seal_grant_init(&rx, LINK_KEY, (uint64_t)g, 77 + 1, false, &eb), KS_OK);
        for (uint32_t i = 0; i < GP; i++) {
            uint8_t *s = sealed + (size_t)i * SLOT;
            pd_seal_ad ad = page_ad((uint64_t)g, 1, i);
            CHECK_EQ(pd_seal_page(&tx, &ad, pool + (size_t)i * PAGE, PAGE, s, &eb), KS_OK);
        }
        double tp = now_s();
        for (uint32_t i = 0; i < GP; i++)
            CHECK_EQ(pd_ucx_put(p.ep, k, sealed + (size_t)i * SLOT, SLOT, raddr + (size_t)i * SLOT,
                                &eb), KS_OK);
        CHECK_EQ(flush(&p), KS_OK);
        t_put += now_s() - tp;
        for (uint32_t i = 0; i < GP; i++) {
            pd_seal_ad ad = page_ad((uint64_t)g, 1, i);
            CHECK_EQ(pd_seal_open(&rx, &ad, staging + (size_t)i * SLOT, PAGE, pool + (size_t)i * PAGE,
                                  &eb), KS_OK);
        }
        pd_seal_grant_free(&tx);
        pd_seal_grant_free(&rx);
        pd_ucx_rkey_close(k);
        pd_ucx_revoke(r);
    }
    double t = now_s() - t0, mb = (double)grants * GP * PAGE / (1024.0 * 1024.0);
    printf("ucx %-4s %6.0f MiB: %7.1f MiB/s sealed end to end (seal+put+flush+open), "
           "puts alone %7.1f MiB/s\n", tls, mb, mb / t, mb / t_put);
    rmpair(&p);
    free(staging);
    free(pool);
    free(sealed);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "bench")) {
        int mib = argc > 2 ? atoi(argv[2]) : 512;
        bench("tcp", mib);
        bench("sm", mib);
        return 0;
    }
    int ran = test_transport("tcp");
    ran += test_transport("sm");
    if (!ran) {
        printf("test_pd_ucx: skipped: UCX started with neither tcp nor sm\n");
        return 77;
    }
    printf("test_pd_ucx: ok (%d transports)\n", ran);
    return 0;
}
