/* kv_int.h — private layout of the KV page pool, shared by pool.c (pages,
 * block tables, tag checks, scrub) and prefix.c (the prefix cache).
 *
 * Page headers live in an array beside the payload slab, indexed by page id:
 * the payload stays one dense 64-byte-aligned slab, and no payload write can
 * run into a header. See include/kvseal/kv.h for the contract and
 * docs/design.md I1-I3, I7 for the invariants. */
#ifndef KS_KV_INT_H
#define KS_KV_INT_H

#include "kvseal/kv.h"

#include <stdatomic.h>

/* One page's header. Written only by the owner (scheduler) thread, between
 * forward passes; kernel workers read it in kv_seq_span_read/_write. */
typedef struct kv__page {
    kv_tag tag;        /* owner sequence and allocation count (I2); seq_uid 0 while FREE */
    uint32_t state;    /* kv_page_state */
    uint32_t refcount; /* sequences + prefix cache holding the page; 0 iff FREE/QUARANTINE */
    uint32_t filled;   /* rows [0, filled) hold K/V for every layer */
    uint32_t _pad;
} kv__page;
_Static_assert(sizeof(kv__page) == 32, "two page headers per cache line");

struct kv_pool {
    kv_geom g;
    uint32_t n_pages;
    kv_scrub scrub;
    int planes;          /* kv_geom_planes(&g): 2 (K, V) or 1 (one row holds everything) */
    size_t plane_bytes;  /* page_tokens * kv_row_bytes: one plane (K, V or the single row) of
                          * one layer */
    size_t layer_bytes;  /* planes * plane_bytes: one layer of one page */
    size_t page_bytes;   /* n_layer * layer_bytes: even (a multiple of 4 with 2 planes or F32) */
    uint8_t *slab;       /* (n_pages, n_layer, planes, page_tokens, row), 64-byte aligned */
    kv__page *hdr;       /* (n_pages) */
    uint32_t *free_ids;  /* stack of FREE page ids, (n_pages) */
    uint32_t n_free;     /* owner thread */
    kv_violation_fn on_violation;
    void *on_violation_ctx;
    /* counters readable from any thread (kv_pool_stats) */
    atomic_uint n_state[4];          /* pages by kv_page_state */
    atomic_ullong violations;        /* I1 violations since start */
    atomic_ullong prefix_hits_pages; /* pages attached from the prefix cache */
    atomic_ullong prefix_cached;     /* pages held by the prefix cache now */
    atomic_ullong allocations;       /* FREE -> ALLOCATED transitions since start */
};

/* The 32-bit word freed pages are filled with in KV_SCRUB_POISON mode. It is
 * a quiet NaN as an f32, and each of its 16-bit halves is a quiet NaN as an
 * f16, so a read of poison shows up as NaN logits whatever the KV type: F32
 * rows start at multiples of 4 bytes, F16 elements and Q8_0 block scales
 * (blocks are 34 bytes) at even offsets, so each lands on a whole NaN. Its
 * bytes repeat every 2, so a page that starts 2 bytes off a word (one plane
 * of F16/Q8_0 rows can make page_bytes 2 mod 4) is poisoned the same way. */
#define KV__POISON_WORD 0x7fc07fc0u

/* A fresh sequence uid, never 0 and never reused in this process. */
uint64_t kv__next_uid(void);
/* The payload of page id: page_bytes bytes, 64-byte aligned. */
uint8_t *kv__page_base(const kv_pool *p, uint32_t id);
/* Sets h's state, keeping the per-state counters right. */
void kv__set_state(kv_pool *p, kv__page *h, kv_page_state st);
/* Pops a FREE page (n_free > 0), checks it is clean, and hands it to uid
 * with a new gen: ALLOCATED, refcount 1, nothing filled. */
uint32_t kv__page_alloc(kv_pool *p, uint64_t uid);
/* Gives s, which has none, its g.state_pages state pages, zeroed and owned
 * by s. Errors: KS_ERR_NOSPACE, KS_ERR_NOMEM; nothing is taken then. */
ks_err kv__seq_take_state(kv_pool *p, kv_seq *s, ks_errbuf *eb);
/* Drops one reference on page id; at zero the page is scrubbed and FREE. */
void kv__page_unref(kv_pool *p, uint32_t id);
/* Counts an isolation violation and reports it (callback + log); returns
 * KS_ERR_INTERNAL. Safe from any thread. */
ks_err kv__violation(kv_pool *p, uint64_t seq_uid, uint32_t page, kv_tag expected, kv_tag found,
                     kv_page_state state);
/* Appends entry {page, tag} to s's table, growing it. Errors: KS_ERR_NOMEM. */
ks_err kv__seq_push(kv_seq *s, uint32_t page, kv_tag tag);
/* Runs sodium_init once per process (pthread_once); aborts if it fails. */
void kv__sodium_once(void);

static inline bool kv__tag_eq(kv_tag a, kv_tag b) {
    return a.seq_uid == b.seq_uid && a.gen == b.gen;
}

#endif /* KS_KV_INT_H */
