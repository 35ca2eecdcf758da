/* kv.h — the paged KV cache: a pool of fixed-size pages and per-sequence
 * block tables.
 *
 * A page holds K and V for page_tokens consecutive positions of one
 * sequence, for every layer. Layout of one page (floats):
 *   [layer][0=K,1=V][page_tokens][kv_dim]
 * kv is the ONLY module that computes a page address (DESIGN.md, module
 * map): the forward pass asks kv_seq_span() for the K/V rows of a page and
 * never does pointer arithmetic on the pool. Freed pages are zeroed before
 * they return to the free list (I3).
 *
 * Threading: a pool and its sequences are owned by one thread (the
 * scheduler); kv_seq_span may be called from kernel worker threads while the
 * owner is inside a forward pass (it only reads). */
#ifndef KS_KV_H
#define KS_KV_H

#include "kvseal/base.h"

typedef struct kv_geom {
    int n_layer;     /* layers */
    int kv_dim;      /* n_head_kv * head_dim: floats per token per K (or V) */
    int page_tokens; /* positions per page (default 16) */
} kv_geom;

typedef struct kv_pool kv_pool;

/* Allocates a pool of n_pages zeroed pages. Errors: KS_ERR_INVAL (bad
 * geometry), KS_ERR_NOMEM. The caller owns *out. */
ks_err kv_pool_create(const kv_geom *g, uint32_t n_pages, kv_pool **out /* OUT */,
                      ks_errbuf *eb) KS_MUST_USE;
/* Frees the pool; accepts NULL. Every sequence must have been released. */
void kv_pool_destroy(kv_pool *p);
/* Geometry, page count, free page count, bytes per page; can't fail. */
const kv_geom *kv_pool_geom(const kv_pool *p);
uint32_t kv_pool_n_pages(const kv_pool *p);
uint32_t kv_pool_n_free(const kv_pool *p);
size_t kv_pool_page_bytes(const kv_pool *p);

/* Pages needed for a pool of mem_bytes; can't fail. */
uint32_t kv_pages_for_bytes(const kv_geom *g, uint64_t mem_bytes);

/* A sequence's block table: logical page i holds positions
 * [i*page_tokens, (i+1)*page_tokens). Caller-allocated (kv_seq_init). */
typedef struct kv_seq {
    uint32_t *pages;   /* private: (cap) page ids */
    uint32_t n_pages;  /* read-only */
    uint32_t cap;      /* private */
    uint32_t n_tokens; /* read-only: positions [0, n_tokens) have K/V written */
} kv_seq;

/* Initializes an empty block table; can't fail. */
void kv_seq_init(kv_seq *s);
/* Makes sure positions [0, n_tokens) have pages, allocating from the pool.
 * Errors: KS_ERR_NOSPACE when the pool is short (nothing is allocated then),
 * KS_ERR_NOMEM. */
ks_err kv_seq_reserve(kv_pool *p, kv_seq *s, uint32_t n_tokens, ks_errbuf *eb) KS_MUST_USE;
/* Records that positions [0, n_tokens) now hold K/V; n_tokens must be
 * covered by reserved pages. Can't fail. */
void kv_seq_set_filled(kv_seq *s, uint32_t n_tokens);
/* Returns every page to the pool (scrubbed) and empties the table; can't fail. */
void kv_seq_release(kv_pool *p, kv_seq *s);

/* K and V rows of one page of a sequence for one layer:
 * *k and *v point at (page_tokens, kv_dim) floats. page_idx < s->n_pages.
 * Errors: KS_ERR_INTERNAL when the block table entry is invalid. */
ks_err kv_seq_span(kv_pool *p, const kv_seq *s, uint32_t page_idx, int layer, float **k /* OUT */,
                   float **v /* OUT */) KS_MUST_USE;

#endif /* KS_KV_H */
