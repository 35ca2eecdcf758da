/* pool.c — KV page pool and block tables (see include/kvseal/kv.h).
 *
 * Pages live in one 64-byte-aligned slab; the free list is a stack of page
 * ids. Every page is zeroed on free (I3), so allocation hands out clean
 * pages; a debug check (KS_KV_CHECK_CLEAN) verifies that on allocation. */
#include "kvseal/kv.h"

#include <stdlib.h>
#include <string.h>

struct kv_pool {
    kv_geom g;
    uint32_t n_pages;
    size_t page_floats;  // n_layer * 2 * page_tokens * kv_dim
    float *slab;         // (n_pages, page_floats)
    uint32_t *free_ids;  // stack of free page ids
    uint32_t n_free;
    uint8_t *in_use;     // (n_pages) 1 while owned by a sequence
};

static size_t kv__page_floats(const kv_geom *g) {
    return (size_t)g->n_layer * 2 * (size_t)g->page_tokens * (size_t)g->kv_dim;
}

uint32_t kv_pages_for_bytes(const kv_geom *g, uint64_t mem_bytes) {
    uint64_t pb = kv__page_floats(g) * sizeof(float);
    uint64_t n = pb ? mem_bytes / pb : 0;
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

ks_err kv_pool_create(const kv_geom *g, uint32_t n_pages, kv_pool **out, ks_errbuf *eb) {
    *out = NULL;
    if (g->n_layer <= 0 || g->kv_dim <= 0 || g->page_tokens <= 0 || n_pages == 0)
        return ks_seterr(eb, KS_ERR_INVAL, "kv pool: bad geometry (layers %d, kv_dim %d, page %d, pages %u)",
                         g->n_layer, g->kv_dim, g->page_tokens, n_pages);
    kv_pool *p = calloc(1, sizeof *p);
    if (!p) goto fail;
    p->g = *g;
    p->n_pages = n_pages;
    p->page_floats = kv__page_floats(g);
    uint64_t bytes;
    if (!ks_mul_ok(p->page_floats * sizeof(float), n_pages, &bytes) || bytes > SIZE_MAX) goto fail;
    p->slab = ks_alloc_aligned((size_t)bytes);
    p->free_ids = malloc(sizeof *p->free_ids * n_pages);
    p->in_use = calloc(n_pages, 1);
    if (!p->slab || !p->free_ids || !p->in_use) goto fail;
    memset(p->slab, 0, (size_t)bytes);
    for (uint32_t i = 0; i < n_pages; i++) p->free_ids[i] = n_pages - 1 - i;  // pop low ids first
    p->n_free = n_pages;
    *out = p;
    return KS_OK;
fail:
    kv_pool_destroy(p);
    return ks_seterr(eb, KS_ERR_NOMEM, "kv pool: cannot allocate %u pages of %zu bytes", n_pages,
                     kv__page_floats(g) * sizeof(float));
}

void kv_pool_destroy(kv_pool *p) {
    if (!p) return;
    ks_free_aligned(p->slab);
    free(p->free_ids);
    free(p->in_use);
    free(p);
}

const kv_geom *kv_pool_geom(const kv_pool *p) { return &p->g; }
uint32_t kv_pool_n_pages(const kv_pool *p) { return p->n_pages; }
uint32_t kv_pool_n_free(const kv_pool *p) { return p->n_free; }
size_t kv_pool_page_bytes(const kv_pool *p) { return p->page_floats * sizeof(float); }

static float *kv__page_base(kv_pool *p, uint32_t id) { return p->slab + (size_t)id * p->page_floats; }

// ----------------------------------------------------------------------------
// Block tables

void kv_seq_init(kv_seq *s) { memset(s, 0, sizeof *s); }

ks_err kv_seq_reserve(kv_pool *p, kv_seq *s, uint32_t n_tokens, ks_errbuf *eb) {
    uint32_t pt = (uint32_t)p->g.page_tokens;
    uint32_t need = (uint32_t)(((uint64_t)n_tokens + pt - 1) / pt);
    if (need <= s->n_pages) return KS_OK;
    uint32_t more = need - s->n_pages;
    if (more > p->n_free)
        return ks_seterr(eb, KS_ERR_NOSPACE, "kv pool: need %u more pages for %u tokens, %u free", more,
                         n_tokens, p->n_free);
    if (need > s->cap) {
        uint32_t cap = s->cap ? s->cap : 8;
        while (cap < need) cap *= 2;
        uint32_t *np = realloc(s->pages, sizeof *np * cap);
        if (!np) return ks_seterr(eb, KS_ERR_NOMEM, "kv pool: block table of %u entries", cap);
        s->pages = np;
        s->cap = cap;
    }
    while (s->n_pages < need) {
        uint32_t id = p->free_ids[--p->n_free];
        KS_ASSERT(!p->in_use[id]);
        p->in_use[id] = 1;
#ifdef KS_KV_CHECK_CLEAN
        const float *b = kv__page_base(p, id);
        for (size_t i = 0; i < p->page_floats; i++) KS_ASSERT(b[i] == 0.0f);
#endif
        s->pages[s->n_pages++] = id;
    }
    return KS_OK;
}

void kv_seq_set_filled(kv_seq *s, uint32_t n_tokens) { s->n_tokens = n_tokens; }

void kv_seq_release(kv_pool *p, kv_seq *s) {
    for (uint32_t i = 0; i < s->n_pages; i++) {
        uint32_t id = s->pages[i];
        KS_ASSERT(id < p->n_pages && p->in_use[id]);
        memset(kv__page_base(p, id), 0, p->page_floats * sizeof(float));  // I3: scrub on free
        p->in_use[id] = 0;
        p->free_ids[p->n_free++] = id;
    }
    free(s->pages);
    kv_seq_init(s);
}

ks_err kv_seq_span(kv_pool *p, const kv_seq *s, uint32_t page_idx, int layer, float **k, float **v) {
    if (page_idx >= s->n_pages || layer < 0 || layer >= p->g.n_layer) return KS_ERR_INTERNAL;
    uint32_t id = s->pages[page_idx];
    if (id >= p->n_pages || !p->in_use[id]) return KS_ERR_INTERNAL;
    size_t plane = (size_t)p->g.page_tokens * (size_t)p->g.kv_dim;
    float *base = kv__page_base(p, id) + (size_t)layer * 2 * plane;
    *k = base;
    *v = base + plane;
    return KS_OK;
}
