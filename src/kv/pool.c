/* pool.c — the sealed KV page pool and block tables (see include/kvseal/kv.h).
 *
 * Pages live in one 64-byte-aligned slab; their headers {tag, state,
 * refcount, filled} in an array beside it (kv_int.h). The free list is a
 * stack of page ids. The contract, in docs/design.md terms:
 *   I1  kv_seq_span_read/_write are the only code that turns a block-table
 *       entry into an address, and they check the entry's tag and the page
 *       state there; any mismatch is counted, reported, and fails.
 *   I2  seq_uid = boot nonce (random, high 32 bits) + a process-wide counter;
 *       a page's gen increments on every allocation.
 *   I3  a page is scrubbed (zero or NaN-poison) when its last reference
 *       goes; allocation checks (sampled, or fully under KS_KV_CHECK_CLEAN)
 *       that the page is clean.
 * The TEST ONLY (I9) switches KS_BROKEN_NO_SCRUB / KS_BROKEN_NO_TAG_CHECK
 * each disable one of these safeguards; they are marked where they act. */
#include "kv_fault.h"
#include "kv_int.h"

#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

// ----------------------------------------------------------------------------
// Process identity (I2): boot nonce + counter, never reused in the process

static pthread_once_t kv__once = PTHREAD_ONCE_INIT;
static uint32_t kv__boot_nonce;
static atomic_ullong kv__uid_counter = 1;

static void kv__boot(void) {
    KS_ASSERT(sodium_init() >= 0);
    randombytes_buf(&kv__boot_nonce, sizeof kv__boot_nonce);
}

void kv__sodium_once(void) { KS_ASSERT(pthread_once(&kv__once, kv__boot) == 0); }

/* (nonce << 32) + counter is injective in the 64-bit counter, so uids never
 * repeat even after 2^32 sequences (the counter then carries into the nonce
 * bits). 0 is reserved for "no owner" (the tag of a FREE page). */
uint64_t kv__next_uid(void) {
    kv__sodium_once();
    for (;;) {
        uint64_t c = atomic_fetch_add_explicit(&kv__uid_counter, 1, memory_order_relaxed);
        uint64_t uid = ((uint64_t)kv__boot_nonce << 32) + c;
        if (uid != 0) return uid;
    }
}

// ----------------------------------------------------------------------------
// Pool

bool kv_type_ok(int t) { return t == KS_DTYPE_F32 || t == KS_DTYPE_F16 || t == KS_DTYPE_Q8_0; }

const char *kv_type_name(int t) {
    switch (t) {
    case KS_DTYPE_F32:
        return "f32";
    case KS_DTYPE_F16:
        return "f16";
    case KS_DTYPE_Q8_0:
        return "q8_0";
    default:
        return "?";
    }
}

bool kv_type_parse(const char *s, int *out) {
    static const int types[] = {KS_DTYPE_F32, KS_DTYPE_F16, KS_DTYPE_Q8_0};
    for (size_t i = 0; s && i < sizeof types / sizeof types[0]; i++)
        if (strcasecmp(s, kv_type_name(types[i])) == 0) {
            *out = types[i];
            return true;
        }
    return false;
}

size_t kv_row_bytes(const kv_geom *g) {
    uint64_t rb;
    if (g->kv_dim <= 0 || !kv_type_ok(g->kv_type) ||
        !ks_dtype_row_bytes((uint32_t)g->kv_type, (uint64_t)g->kv_dim, &rb))
        return 0;
    return (size_t)rb;
}

/* 0 (the zero value, meaning 2), 1 or 2: the only planes values a geometry may hold. */
static bool kv__planes_ok(int planes) { return planes >= 0 && planes <= 2; }

int kv_geom_planes(const kv_geom *g) { return g->planes == 1 ? 1 : 2; }

uint64_t kv_page_bytes(const kv_geom *g) {
    if (g->n_layer <= 0 || g->page_tokens <= 0 || !kv__planes_ok(g->planes)) return 0;
    return (uint64_t)g->n_layer * (uint64_t)kv_geom_planes(g) * (uint64_t)g->page_tokens *
           kv_row_bytes(g);
}

int kv_geom_describe(const kv_geom *g, char *buf, size_t cap) {
    int n = snprintf(buf, cap,
                     "%llu bytes/page = %d layers x %s x %d tokens x %zu B per %d-element row",
                     (unsigned long long)kv_page_bytes(g), g->n_layer,
                     kv_geom_planes(g) == 1 ? "1 plane" : "2 planes (K, V)", g->page_tokens,
                     kv_row_bytes(g), g->kv_dim);
    if (g->state_pages > 0 && n >= 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, "; recurrent state %d pages per sequence",
                      g->state_pages);
    return n;
}

ks_err kv_geom_check(const kv_geom *g, ks_errbuf *eb) {
    if (g->n_layer <= 0 || g->kv_dim <= 0 || g->page_tokens <= 0)
        return ks_seterr(eb, KS_ERR_INVAL, "kv: bad geometry (layers %d, kv_dim %d, page %d)",
                         g->n_layer, g->kv_dim, g->page_tokens);
    if (!kv_type_ok(g->kv_type))
        return ks_seterr(eb, KS_ERR_INVAL, "kv: KV type %d (%s) is not one of " KV_TYPE_CHOICES,
                         g->kv_type, ks_dtype_name((uint32_t)g->kv_type));
    if (kv_row_bytes(g) == 0)
        return ks_seterr(eb, KS_ERR_INVAL, "kv: kv_dim %d is not a multiple of the %s block (%u)",
                         g->kv_dim, kv_type_name(g->kv_type),
                         ks_dtype_block_elems((uint32_t)g->kv_type));
    if (g->state_pages < 0)
        return ks_seterr(eb, KS_ERR_INVAL,
                         "kv: a row of the recurrent state does not fit a KV page of %llu "
                         "bytes: use more tokens per page",
                         (unsigned long long)kv_page_bytes(g));
    if (!kv__planes_ok(g->planes))
        return ks_seterr(eb, KS_ERR_INVAL,
                         "kv: planes %d is not 2 (a K row then a V row; 0 also means 2) or 1 (one "
                         "row per position holds K and V)",
                         g->planes);
    return KS_OK;
}

uint32_t kv_pages_for_bytes(const kv_geom *g, uint64_t mem_bytes) {
    uint64_t pb = kv_page_bytes(g);
    if (pb == 0) return 0;
    uint64_t n = mem_bytes / pb;
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

uint8_t *kv__page_base(const kv_pool *p, uint32_t id) {
    return p->slab + (size_t)id * p->page_bytes;
}

/* Fills bytes [b0, b1) of a page's payload with the scrub pattern (I3);
 * kv__scrub: the whole payload (page_bytes).
 * The poison word is stored bytewise (memcpy). page_bytes is even but, with
 * one plane of F16 or Q8_0 rows, not always a multiple of 4 (and then every
 * other page starts 2 bytes off a word): the tail gets the word's first
 * bytes, which is right because the pattern repeats every 2 bytes. */
static void kv__scrub_range(kv_pool *p, uint32_t id, size_t b0, size_t b1) {
    KS_ASSERT(b0 % 2 == 0 && b0 <= b1 && b1 <= p->page_bytes);
    uint8_t *b = kv__page_base(p, id);
    if (p->scrub == KV_SCRUB_ZERO) {
        memset(b + b0, 0, b1 - b0);
        return;
    }
    const uint32_t w = KV__POISON_WORD;
    size_t i = b0;
    for (; i + 4 <= b1; i += 4)
        memcpy(b + i, &w, 4);
    memcpy(b + i, &w, b1 - i);
}

static void kv__scrub(kv_pool *p, uint32_t id) {
    kv__scrub_range(p, id, 0, p->page_bytes);
}

/* True when bytes [b0, b1) of page id hold the scrub pattern; b0 even (the
 * poison pattern repeats every 2 bytes, so any even start lines up). */
static bool kv__range_clean(const kv_pool *p, uint32_t id, size_t b0, size_t b1) {
    const uint8_t *b = kv__page_base(p, id);
    const uint32_t want = p->scrub == KV_SCRUB_ZERO ? 0u : KV__POISON_WORD;
    size_t i = b0;
    for (; i + 4 <= b1; i += 4) {
        uint32_t w;
        memcpy(&w, b + i, sizeof w);
        if (w != want) return false;
    }
    return memcmp(b + i, &want, b1 - i) == 0;
}

void kv__set_state(kv_pool *p, kv__page *h, kv_page_state st) {
    if (h->state == (uint32_t)st) return;
    atomic_fetch_sub_explicit(&p->n_state[h->state], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->n_state[st], 1, memory_order_relaxed);
    h->state = (uint32_t)st;
}

ks_err kv_pool_create(const kv_geom *g, uint32_t n_pages, kv_scrub scrub, kv_pool **out,
                      ks_errbuf *eb) {
    *out = NULL;
    ks_err ge = kv_geom_check(g, eb);
    if (ge) return ge;
    if (n_pages == 0 || (scrub != KV_SCRUB_ZERO && scrub != KV_SCRUB_POISON))
        return ks_seterr(eb, KS_ERR_INVAL, "kv pool: bad size or scrub mode (pages %u, scrub %d)",
                         n_pages, (int)scrub);
    kv__sodium_once();
    uint64_t bytes;
    if (!ks_mul_ok(kv_page_bytes(g), n_pages, &bytes) || bytes > SIZE_MAX)
        return ks_seterr(eb, KS_ERR_NOMEM, "kv pool: %u pages overflow the address space", n_pages);
    kv_pool *p = calloc(1, sizeof *p);
    if (!p) goto fail;
    p->g = *g;
    p->n_pages = n_pages;
    p->scrub = scrub;
    p->planes = kv_geom_planes(g);
    p->plane_bytes = (size_t)g->page_tokens * kv_row_bytes(g);
    p->layer_bytes = (size_t)p->planes * p->plane_bytes;
    p->page_bytes = (size_t)kv_page_bytes(g);
    KS_ASSERT(p->page_bytes == (size_t)g->n_layer * p->layer_bytes && p->page_bytes % 2 == 0);
    // a large pool on huge pages: attention walks pages all over it every step
    p->slab = bytes >= ((uint64_t)8 << 20) ? ks_alloc_huge((size_t)bytes)
                                           : ks_alloc_aligned((size_t)bytes);
    p->hdr = calloc(n_pages, sizeof *p->hdr);
    p->free_ids = malloc(sizeof *p->free_ids * n_pages);
    if (!p->slab || !p->hdr || !p->free_ids) goto fail;
    for (uint32_t i = 0; i < n_pages; i++) {
        kv__scrub(p, i);
        p->free_ids[i] = n_pages - 1 - i;  // pop low ids first
    }
    p->n_free = n_pages;
    for (int s = 0; s < 4; s++) atomic_init(&p->n_state[s], 0);
    atomic_init(&p->n_state[KV_PAGE_FREE], n_pages);
    atomic_init(&p->violations, 0);
    atomic_init(&p->prefix_hits_pages, 0);
    atomic_init(&p->prefix_cached, 0);
    atomic_init(&p->allocations, 0);
    *out = p;
    return KS_OK;
fail:
    kv_pool_destroy(p);
    return ks_seterr(eb, KS_ERR_NOMEM, "kv pool: cannot allocate %u pages of %llu bytes", n_pages,
                     (unsigned long long)kv_page_bytes(g));
}

void kv_pool_destroy(kv_pool *p) {
    if (!p) return;
    if (p->hdr && p->n_free != p->n_pages) {
        ks_log(KS_LOG_WARN, "kv pool: destroyed with %u of %u pages still held", p->n_pages - p->n_free,
               p->n_pages);
        // their payloads are a tenant's KV: scrubbed before the memory goes back (I3),
        // as a release would (a model unloaded from a running server frees its pool)
        for (uint32_t id = 0; p->slab && id < p->n_pages; id++)
            if (p->hdr[id].state != KV_PAGE_FREE) kv__scrub(p, id);
    }
    ks_free_aligned(p->slab);
    free(p->hdr);
    free(p->free_ids);
    free(p);
}

void kv_pool_set_violation_cb(kv_pool *p, kv_violation_fn fn, void *ctx) {
    p->on_violation = fn;
    p->on_violation_ctx = ctx;
}

const kv_geom *kv_pool_geom(const kv_pool *p) { return &p->g; }
uint32_t kv_pool_n_pages(const kv_pool *p) { return p->n_pages; }
uint32_t kv_pool_n_free(const kv_pool *p) { return p->n_free; }
size_t kv_pool_page_bytes(const kv_pool *p) { return p->page_bytes; }

void kv_pool_stats(const kv_pool *p, kv_stats *out) {
    kv_pool *q = (kv_pool *)p;  // atomic loads take non-const pointers in C11
    for (int s = 0; s < 4; s++) out->pages[s] = atomic_load_explicit(&q->n_state[s], memory_order_relaxed);
    out->violations = atomic_load_explicit(&q->violations, memory_order_relaxed);
    out->prefix_hits_pages = atomic_load_explicit(&q->prefix_hits_pages, memory_order_relaxed);
    out->prefix_cached_pages = atomic_load_explicit(&q->prefix_cached, memory_order_relaxed);
    out->allocations = atomic_load_explicit(&q->allocations, memory_order_relaxed);
}

/* Truthful in every build, KS_BROKEN_NO_SCRUB included: it reads the payload
 * itself rather than trusting that kv__page_unref scrubbed it. */
bool kv_pool_all_free_and_scrubbed(const kv_pool *p) {
    if (p->n_free != p->n_pages) return false;
    for (uint32_t i = 0; i < p->n_pages; i++)
        if (p->hdr[i].state != KV_PAGE_FREE || p->hdr[i].refcount != 0 ||
            !kv__range_clean(p, i, 0, p->page_bytes))
            return false;
    return true;
}

ks_err kv_pool_page_info(const kv_pool *p, uint32_t page, kv_page_info *out) {
    if (page >= p->n_pages) return KS_ERR_INVAL;
    const kv__page *h = &p->hdr[page];
    out->tag = h->tag;
    out->state = (kv_page_state)h->state;
    out->refcount = h->refcount;
    out->filled = h->filled;
    return KS_OK;
}

// ----------------------------------------------------------------------------
// Page ownership: allocation, references, scrub on free (I2, I3)

/* Pops a FREE page, checks it is clean, and hands it to uid with a new gen. */
uint32_t kv__page_alloc(kv_pool *p, uint64_t uid) {
    KS_ASSERT(p->n_free > 0);
    uint32_t id = p->free_ids[--p->n_free];
    kv__page *h = &p->hdr[id];
    KS_ASSERT(h->state == KV_PAGE_FREE && h->refcount == 0);
#ifndef KS_BROKEN_NO_SCRUB  // TEST ONLY (I9): the no-scrub build must let dirty pages through
#if defined(KS_KV_CHECK_CLEAN)
    KS_ASSERT(kv__range_clean(p, id, 0, p->page_bytes));
#elif !defined(NDEBUG)
    // sampled: the first and last 64 bytes of the page, cheap enough for every
    // allocation (our Release builds keep it: they don't define NDEBUG)
    size_t nb = p->page_bytes, n = nb < 64 ? nb : 64;
    KS_ASSERT(kv__range_clean(p, id, 0, n) && kv__range_clean(p, id, nb - n, nb));
#endif
#endif
    h->tag.seq_uid = uid;
    // the pool's allocation count: larger than any gen this page had, and
    // no two pages ever share one, so a tag names one page of one life (a
    // corrupted entry's page is then found by its tag alone, never another
    // page of the same sequence)
    h->tag.gen = atomic_fetch_add_explicit(&p->allocations, 1, memory_order_relaxed) + 1;
    h->refcount = 1;
    h->filled = 0;
    kv__set_state(p, h, KV_PAGE_ALLOCATED);
    return id;
}

/* Scrubs page id and returns it to the free list. */
static void kv__page_free(kv_pool *p, uint32_t id) {
    kv__page *h = &p->hdr[id];
#ifndef KS_BROKEN_NO_SCRUB  // TEST ONLY (I9): the no-scrub build leaves freed pages dirty
    kv__scrub(p, id);
#endif
    h->tag.seq_uid = 0;  // gen stays: the next allocation increments it
    h->refcount = 0;
    h->filled = 0;
    kv__set_state(p, h, KV_PAGE_FREE);
    KS_ASSERT(p->n_free < p->n_pages);
    p->free_ids[p->n_free++] = id;
}

void kv__page_unref(kv_pool *p, uint32_t id) {
    KS_ASSERT(id < p->n_pages);
    kv__page *h = &p->hdr[id];
    KS_ASSERT(h->refcount > 0 && (h->state == KV_PAGE_ALLOCATED || h->state == KV_PAGE_READY));
    if (--h->refcount == 0) kv__page_free(p, id);
}

// ----------------------------------------------------------------------------
// Violations (I1)

ks_err kv__violation(kv_pool *p, uint64_t seq_uid, uint32_t page, kv_tag expected, kv_tag found,
                     kv_page_state state) {
    uint64_t nth = atomic_fetch_add_explicit(&p->violations, 1, memory_order_relaxed) + 1;
    // an aborted sequence can fail once per (token, head): log the 1st..16th, then powers of 2
    if (nth <= 16 || (nth & (nth - 1)) == 0)
        ks_log(KS_LOG_ERROR,
               "kv: isolation violation #%llu: seq %016llx page %u expected tag %016llx/%llu, "
               "found %016llx/%llu state %d",
               (unsigned long long)nth, (unsigned long long)seq_uid, page,
               (unsigned long long)expected.seq_uid, (unsigned long long)expected.gen,
               (unsigned long long)found.seq_uid, (unsigned long long)found.gen, (int)state);
    kv_violation_fn fn = p->on_violation;
    if (fn) fn(p->on_violation_ctx, seq_uid, page, expected, found, state);
    return KS_ERR_INTERNAL;
}

/* The slow path of a failed resolution: works out what was found and
 * reports it. Kept out of line so the checks stay a few inlined compares. */
__attribute__((noinline, cold)) static ks_err kv__span_fail(kv_pool *p, const kv_seq *s,
                                                             uint32_t idx) {
    kv_tag none = {0, 0};
    if (idx >= s->n_pages) return kv__violation(p, s->uid, UINT32_MAX, none, none, KV_PAGE_FREE);
    const kv_entry *e = &s->ent[idx];
    if (e->page >= p->n_pages) return kv__violation(p, s->uid, e->page, e->tag, none, KV_PAGE_FREE);
    const kv__page *h = &p->hdr[e->page];
    return kv__violation(p, s->uid, e->page, e->tag, h->tag, (kv_page_state)h->state);
}

// ----------------------------------------------------------------------------
// Block tables

void kv_seq_init(kv_pool *p, kv_seq *s) {
    (void)p;
    memset(s, 0, sizeof *s);
    s->uid = kv__next_uid();
}

static ks_err kv__seq_grow(kv_seq *s, uint32_t need, ks_errbuf *eb) {
    if (need <= s->cap) return KS_OK;
    uint32_t cap = s->cap ? s->cap : 8;
    while (cap < need) cap = cap > UINT32_MAX / 2 ? need : cap * 2;
    kv_entry *ne = realloc(s->ent, sizeof *ne * cap);
    if (!ne) return ks_seterr(eb, KS_ERR_NOMEM, "kv: block table of %u entries", cap);
    s->ent = ne;
    s->cap = cap;
    return KS_OK;
}

kv_entry kv_seq_entry(const kv_seq *s, uint32_t i) {
    KS_ASSERT(i < s->n_pages);
    return s->ent[i];
}

ks_err kv__seq_push(kv_seq *s, uint32_t page, kv_tag tag) {
    ks_err e = kv__seq_grow(s, s->n_pages + 1, NULL);
    if (e) return e;
    s->ent[s->n_pages].page = page;
    s->ent[s->n_pages].tag = tag;
    s->n_pages++;
    return KS_OK;
}

uint32_t kv_seq_pages_needed(const kv_pool *p, const kv_seq *s, uint32_t n_tokens) {
    uint64_t pt = (uint64_t)p->g.page_tokens;
    uint32_t need = (uint32_t)(((uint64_t)n_tokens + pt - 1) / pt);
    return (need > s->n_pages ? need - s->n_pages : 0) +
           (s->st ? 0 : (uint32_t)p->g.state_pages);
}

ks_err kv__seq_take_state(kv_pool *p, kv_seq *s, ks_errbuf *eb) {
    KS_ASSERT(!s->st && p->g.state_pages > 0);
    if ((uint32_t)p->g.state_pages > p->n_free)
        return ks_seterr(eb, KS_ERR_NOSPACE, "kv pool: need %d pages of recurrent state, %u free",
                         p->g.state_pages, p->n_free);
    s->st = malloc(sizeof *s->st * (size_t)p->g.state_pages);
    if (!s->st) return ks_seterr(eb, KS_ERR_NOMEM, "kv: state table");
    for (int i = 0; i < p->g.state_pages; i++) {
        uint32_t id = kv__page_alloc(p, s->uid);
        // a recurrence starts from the zero state, whatever the scrub pattern
        if (p->scrub != KV_SCRUB_ZERO) memset(kv__page_base(p, id), 0, p->page_bytes);
        s->st[i] = (kv_entry){.page = id, .tag = p->hdr[id].tag};
    }
    return KS_OK;
}

ks_err kv_seq_reserve(kv_pool *p, kv_seq *s, uint32_t n_tokens, ks_errbuf *eb) {
    uint64_t pt = (uint64_t)p->g.page_tokens;
    uint32_t need = (uint32_t)(((uint64_t)n_tokens + pt - 1) / pt);
    uint32_t more = kv_seq_pages_needed(p, s, n_tokens);
    if (more == 0) return KS_OK;
    if (more > p->n_free)  // checked first: on NOSPACE nothing is taken
        return ks_seterr(eb, KS_ERR_NOSPACE, "kv pool: need %u more pages for %u tokens, %u free",
                         more, n_tokens, p->n_free);
    ks_err e = kv__seq_grow(s, need > s->n_pages ? need : s->n_pages, eb);
    if (e) return e;
    if (!s->st && p->g.state_pages > 0 && (e = kv__seq_take_state(p, s, eb))) return e;
    while (s->n_pages < need) {
        uint32_t id = kv__page_alloc(p, s->uid);
        s->ent[s->n_pages].page = id;
        s->ent[s->n_pages].tag = p->hdr[id].tag;
        s->n_pages++;
    }
    return KS_OK;
}

/* The header of entry i when it still carries the entry's tag, else NULL. */
static kv__page *kv__entry_hdr(kv_pool *p, const kv_seq *s, uint32_t i) {
    const kv_entry *e = &s->ent[i];
    if (e->page >= p->n_pages || !kv__tag_eq(p->hdr[e->page].tag, e->tag)) return NULL;
    return &p->hdr[e->page];
}

/* Entry i's page header if s alone owns it and it is ALLOCATED or READY
 * (published pages, refcount > 1, are full and immutable), else NULL; a
 * corrupt entry is reported as a violation and never touched. */
static kv__page *kv__owned_hdr(kv_pool *p, const kv_seq *s, uint32_t i) {
    kv__page *h = kv__entry_hdr(p, s, i);
    if (!h) {
        (void)kv__span_fail(p, s, i);
        return NULL;
    }
    if (h->refcount != 1 || (h->state != KV_PAGE_ALLOCATED && h->state != KV_PAGE_READY))
        return NULL;
    return h;
}

void kv_seq_set_filled(kv_pool *p, kv_seq *s, uint32_t n_tokens) {
    const uint32_t P = (uint32_t)p->g.page_tokens;
    KS_ASSERT((uint64_t)n_tokens <= (uint64_t)s->n_pages * P);
    KS_ASSERT((uint64_t)n_tokens >= (uint64_t)s->n_shared * P);
    for (uint32_t i = s->n_shared; i < s->n_pages; i++) {
        kv__page *h = kv__owned_hdr(p, s, i);
        if (!h) continue;
        uint64_t lo = (uint64_t)i * P;
        uint32_t f = n_tokens <= lo ? 0 : n_tokens - lo >= P ? P : (uint32_t)(n_tokens - lo);
        h->filled = f;
        kv__set_state(p, h, f ? KV_PAGE_READY : KV_PAGE_ALLOCATED);
    }
    s->n_tokens = n_tokens;
}

void kv_seq_truncate(kv_pool *p, kv_seq *s, uint32_t n_tokens) {
    const uint32_t P = (uint32_t)p->g.page_tokens, old = s->n_tokens;
    KS_ASSERT(p->g.state_pages == 0); // a recurrent state cannot be rolled back
    KS_ASSERT(n_tokens <= old && (uint64_t)n_tokens >= (uint64_t)s->n_shared * P);
    const size_t rb = p->plane_bytes / P;
    for (uint32_t i = n_tokens / P; i < s->n_pages && (uint64_t)i * P < old; i++) {
        kv__page *h = kv__owned_hdr(p, s, i);
        if (!h) continue;
        const uint64_t lo = (uint64_t)i * P;
        const uint32_t r0 = n_tokens > lo ? (uint32_t)(n_tokens - lo) : 0;
        const uint32_t r1 = old - lo >= P ? P : (uint32_t)(old - lo);
        // rows [r0, r1) of every layer's planes: [layer][plane][P][row]
        for (int pl = 0; r0 < r1 && pl < p->g.n_layer * p->planes; pl++)
            kv__scrub_range(p, (uint32_t)(h - p->hdr), (size_t)pl * p->plane_bytes + r0 * rb,
                            (size_t)pl * p->plane_bytes + r1 * rb);
    }
    kv_seq_set_filled(p, s, n_tokens);
}

ks_err kv_seq_share_prefix(kv_pool *p, kv_seq *dst, const kv_seq *src, uint32_t n_pages,
                           ks_errbuf *eb) {
    const uint32_t P = (uint32_t)p->g.page_tokens, sp = (uint32_t)p->g.state_pages;
    // a hybrid model's dst resumes from src's recurrent state: it must be the
    // state at the prefix's end, and dst must hold its own state pages
    if (sp > 0 && n_pages > 0 && (src->n_tokens != n_pages * P || !src->st || !dst->st))
        return ks_seterr(eb, KS_ERR_INVAL,
                         "kv: a hybrid recurrent model shares %u pages only while the source's "
                         "state is that after them (it has consumed %u tokens)",
                         n_pages, src->n_tokens);
    if (dst->n_shared != 0 || dst->n_tokens != 0 || n_pages > src->n_pages)
        return ks_seterr(eb, KS_ERR_INVAL,
                         "kv: share %u pages of a %u-page table into one with %u shared, %u filled",
                         n_pages, src->n_pages, dst->n_shared, dst->n_tokens);
    // every shared page must be what src expects and full: checked before any change
    for (uint32_t i = 0; i < n_pages; i++) {
        const kv__page *h = kv__entry_hdr(p, src, i);
        if (!h || h->state != KV_PAGE_READY || h->filled != P) {
            (void)kv__span_fail(p, src, i);
            return ks_seterr(eb, KS_ERR_INTERNAL,
                             "kv: page %u of the shared prefix is not a "
                             "full READY page with the expected tag",
                             i);
        }
    }
    for (uint32_t i = 0; i < dst->n_pages; i++) { // dst's own pages: fresh, still empty
        const kv__page *h = kv__entry_hdr(p, dst, i);
        if (!h || h->state != KV_PAGE_ALLOCATED || h->refcount != 1) {
            (void)kv__span_fail(p, dst, i);
            return ks_seterr(eb, KS_ERR_INTERNAL, "kv: page %u of the table is not a fresh page",
                             i);
        }
    }
    // both states through their checked accessors (I1): dst's own, src's own
    for (uint32_t k = 0; k < (n_pages ? sp : 0); k++) {
        void *a, *b;
        if (kv_seq_state(p, src, k, &a) != KS_OK || kv_seq_state(p, dst, k, &b) != KS_OK)
            return ks_seterr(eb, KS_ERR_INTERNAL,
                             "kv: recurrent-state page %u of the shared prefix fails its check", k);
    }
    ks_err e = kv__seq_grow(dst, dst->n_pages + n_pages, eb);
    if (e) return e;
    for (uint32_t k = 0; k < (n_pages ? sp : 0); k++) { // checked above; nothing ran since
        void *a, *b;
        KS_ASSERT(kv_seq_state(p, src, k, &a) == KS_OK && kv_seq_state(p, dst, k, &b) == KS_OK);
        memcpy(b, a, p->page_bytes);
    }
    memmove(dst->ent + n_pages, dst->ent, sizeof(kv_entry) * dst->n_pages);
    for (uint32_t i = 0; i < n_pages; i++) {
        dst->ent[i] = src->ent[i]; // src's tag: the page keeps its owner's identity (I1)
        p->hdr[src->ent[i].page].refcount++;
    }
    dst->n_pages += n_pages;
    dst->n_shared = n_pages;
    dst->n_tokens = n_pages * P;
    return KS_OK;
}

/* The page that entry i really refers to. A corrupt entry (its page carries
 * another tag) is reported, and the page that does carry the entry's tag —
 * the sequence's real page — is found by a scan, so the right page is
 * released and nobody else's. UINT32_MAX when no page carries the tag. */
static uint32_t kv__entry_page_for_release(kv_pool *p, const kv_seq *s, uint32_t i) {
    if (kv__entry_hdr(p, s, i)) return s->ent[i].page;
    (void)kv__span_fail(p, s, i);
    for (uint32_t id = 0; id < p->n_pages; id++) {
        const kv__page *h = &p->hdr[id];
        if (h->refcount > 0 && kv__tag_eq(h->tag, s->ent[i].tag)) return id;
    }
    return UINT32_MAX;
}

static void kv__seq_clear(kv_seq *s) {
    free(s->ent);
    s->ent = NULL;
    s->cap = s->n_pages = s->n_shared = s->n_tokens = 0;
}

/* The page state entry i of s names, checked as kv__entry_page_for_release
 * does (a corrupted entry's page found by its tag instead). */
static uint32_t kv__state_page_for_release(kv_pool *p, const kv_seq *s, uint32_t i) {
    const kv_entry *e = &s->st[i];
    if (e->page < p->n_pages && kv__tag_eq(p->hdr[e->page].tag, e->tag) &&
        p->hdr[e->page].refcount > 0)
        return e->page;
    (void)kv__violation(p, s->uid, e->page, e->tag,
                        e->page < p->n_pages ? p->hdr[e->page].tag : (kv_tag){0},
                        e->page < p->n_pages ? (kv_page_state)p->hdr[e->page].state
                                             : KV_PAGE_FREE);
    for (uint32_t id = 0; id < p->n_pages; id++)
        if (p->hdr[id].refcount > 0 && kv__tag_eq(p->hdr[id].tag, e->tag)) return id;
    return UINT32_MAX;
}

/* Releases (quarantine: quarantines) s's state pages and forgets them;
 * returns how many were quarantined. */
static uint32_t kv__state_release(kv_pool *p, kv_seq *s, bool quarantine) {
    uint32_t n = 0;
    for (uint32_t i = 0; s->st && i < (uint32_t)p->g.state_pages; i++) {
        uint32_t id = kv__state_page_for_release(p, s, i);
        if (id == UINT32_MAX) continue;
        kv__page *h = &p->hdr[id];
        if (quarantine && h->refcount == 1) {
            h->refcount = 0; // the tag stays: kv_pool_quarantine_free finds it
            kv__set_state(p, h, KV_PAGE_QUARANTINE);
            n++;
        } else {
            kv__page_unref(p, id);
        }
    }
    free(s->st);
    s->st = NULL;
    return n;
}

void kv_seq_release(kv_pool *p, kv_seq *s) {
    for (uint32_t i = 0; i < s->n_pages; i++) {
        uint32_t id = kv__entry_page_for_release(p, s, i);
        if (id != UINT32_MAX) kv__page_unref(p, id);
    }
    kv__state_release(p, s, false);
    kv__seq_clear(s);
}

kv_entry kv_seq_state_entry(const kv_seq *s, uint32_t i) {
    KS_ASSERT(s->st);
    return s->st[i];
}

ks_err kv_seq_state_span(kv_pool *p, const kv_seq *s, uint32_t i, int layer, void **k, void **v) {
    void *base;
    if ((unsigned)layer >= (unsigned)p->g.n_layer) {
        kv_tag none = {0};
        return kv__violation(p, s->uid, UINT32_MAX, none, none, KV_PAGE_FREE);
    }
    ks_err e = kv_seq_state(p, s, i, &base);
    if (e) return e;
    uint8_t *l = (uint8_t *)base + (size_t)layer * p->layer_bytes;
    *k = l;
    if (v) *v = p->planes == 2 ? l + p->plane_bytes : NULL;
    return KS_OK;
}

ks_err kv_seq_state(kv_pool *p, const kv_seq *s, uint32_t i, void **out) {
    const kv_entry *e = s->st && i < (uint32_t)p->g.state_pages ? &s->st[i] : NULL;
    if (e && e->page < p->n_pages) {
        const kv__page *h = &p->hdr[e->page];
#ifndef KS_BROKEN_NO_TAG_CHECK // TEST ONLY (I9): the no-tag-check build resolves any entry
        if (kv__tag_eq(h->tag, e->tag) && h->state == KV_PAGE_ALLOCATED && h->refcount == 1)
#else
        (void)h;
#endif
        {
            *out = kv__page_base(p, e->page);
            return KS_OK;
        }
    }
    const kv__page *h = e && e->page < p->n_pages ? &p->hdr[e->page] : NULL;
    return kv__violation(p, s->uid, e ? e->page : UINT32_MAX, e ? e->tag : (kv_tag){0},
                         h ? h->tag : (kv_tag){0}, h ? (kv_page_state)h->state : KV_PAGE_FREE);
}

uint32_t kv_seq_quarantine(kv_pool *p, kv_seq *s) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->n_pages; i++) {
        uint32_t id = kv__entry_page_for_release(p, s, i);
        if (id == UINT32_MAX) continue;
        kv__page *h = &p->hdr[id];
        if (i < s->n_shared || h->refcount > 1) {  // shared read-only: no transfer writes it
            kv__page_unref(p, id);
            continue;
        }
        KS_ASSERT(h->refcount == 1);
        h->refcount = 0;  // the tag stays: kv_pool_quarantine_free finds the pages by it
        kv__set_state(p, h, KV_PAGE_QUARANTINE);
        n++;
    }
    n += kv__state_release(p, s, true);
    kv__seq_clear(s);
    return n;
}

uint32_t kv_pool_quarantine_free(kv_pool *p, uint64_t seq_uid) {
    uint32_t n = 0;
    for (uint32_t id = 0; id < p->n_pages; id++) {
        kv__page *h = &p->hdr[id];
        if (h->state != KV_PAGE_QUARANTINE || h->tag.seq_uid != seq_uid) continue;
        kv__page_free(p, id);
        n++;
    }
    return n;
}

// ----------------------------------------------------------------------------
// Resolution (I1): the only code that computes a page address. Called per
// page per (token, head) from kernel workers, so the checks are a handful of
// loads and compares on a header the entry already points at.

static inline ks_err kv__read(kv_pool *p, const kv_seq *s, uint32_t page_idx, int layer,
                              uint32_t n_rows, const void **k, const void **v) {
    if (page_idx < s->n_pages && (unsigned)layer < (unsigned)p->g.n_layer) {
        const kv_entry *e = &s->ent[page_idx];
        if (e->page < p->n_pages) {
            const kv__page *h = &p->hdr[e->page];
#ifndef KS_BROKEN_NO_TAG_CHECK  // TEST ONLY (I9): the no-tag-check build resolves any entry
            if (kv__tag_eq(h->tag, e->tag) && h->state == KV_PAGE_READY && h->filled >= n_rows)
#else
            (void)h, (void)n_rows;
#endif
            {
                const uint8_t *base = kv__page_base(p, e->page) + (size_t)layer * p->layer_bytes;
                *k = base;
                *v = p->planes == 2 ? base + p->plane_bytes : base; // 1 plane: V is K's row
                return KS_OK;
            }
        }
    }
    return kv__span_fail(p, s, page_idx);
}

ks_err kv_seq_span_read(kv_pool *p, const kv_seq *s, uint32_t page_idx, int layer, uint32_t n_rows,
                        const void **k, const void **v) {
    return kv__read(p, s, page_idx, layer, n_rows, k, v);
}

ks_err kv_seq_span_read_all(kv_pool *p, const kv_seq *s, int layer, uint32_t n_tokens,
                            const void **k, const void **v) {
    const uint32_t P = (uint32_t)p->g.page_tokens;
    for (uint32_t i = 0, j0 = 0; j0 < n_tokens; i++, j0 += P) {
        uint32_t n_rows = n_tokens - j0 < P ? n_tokens - j0 : P;
        ks_err e = kv__read(p, s, i, layer, n_rows, &k[i], &v[i]);
        if (e) return e;
    }
    return KS_OK;
}

ks_err kv_seq_span_write(kv_pool *p, const kv_seq *s, uint32_t page_idx, int layer, void **k,
                         void **v) {
    if (page_idx < s->n_pages && (unsigned)layer < (unsigned)p->g.n_layer) {
        const kv_entry *e = &s->ent[page_idx];
        if (e->page < p->n_pages) {
            const kv__page *h = &p->hdr[e->page];
#ifndef KS_BROKEN_NO_TAG_CHECK  // TEST ONLY (I9): the no-tag-check build resolves any entry
            if (kv__tag_eq(h->tag, e->tag) &&
                (h->state == KV_PAGE_ALLOCATED || h->state == KV_PAGE_READY) &&
                page_idx >= s->n_shared && h->refcount == 1)
#else
            (void)h;
#endif
            {
                uint8_t *base = kv__page_base(p, e->page) + (size_t)layer * p->layer_bytes;
                *k = base;
                // 1 plane: no V row to write; NULL makes a stray V write fault at once
                if (v) *v = p->planes == 2 ? base + p->plane_bytes : NULL;
                return KS_OK;
            }
        }
    }
    return kv__span_fail(p, s, page_idx);
}

#ifdef KS_TEST_FAULTS
// TEST ONLY (I9): corrupts a block table the way a bug would, for the leak suite.
void kv_fault_swap_entry(kv_seq *victim, const kv_seq *other, uint32_t idx) {
    KS_ASSERT(idx < victim->n_pages && idx < other->n_pages);
    victim->ent[idx].page = other->ent[idx].page;
}

void kv_fault_swap_state(kv_seq *victim, const kv_seq *other, uint32_t idx) {
    KS_ASSERT(victim->st && other->st);
    victim->st[idx].page = other->st[idx].page;
}
#endif
