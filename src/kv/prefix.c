/* prefix.c — the tenant-scoped prefix cache (I7; see include/kvseal/kv.h).
 *
 * Key of page i = SHA-256(key of page i-1 || its page_tokens token ids as
 * int32 LE); the key of "page -1" is the tenant root, so two tenants never
 * share a key and never hit each other's pages. The table maps a 32-byte key
 * to {page id, the page's tag}; it is chained, bucketed by a SipHash of the
 * key under a random per-cache secret (so crafted prompts cannot pile keys
 * into one bucket), and at most max_pages entries long. Every entry holds one
 * reference on its page; pages are shared read-only (kv_seq_span_write
 * refuses them). LRU order keeps a chain's shallow pages more recent than its
 * deep ones, so eviction trims chains from the tail and never orphans them.
 *
 * A pool with recurrent state (hybrid models, g.state_pages > 0) can only
 * resume a cached prefix from the state at its end, so there an entry may
 * carry a snapshot: state_pages pages of the cache's own (a fresh owner uid,
 * READY, refcount 1), copied from the publishing sequence's state pages when
 * its state had consumed exactly the tokens up to the end of that entry's
 * page. Attach stops at the deepest entry with a snapshot and copies it into
 * the new sequence's own state pages (a sequence never shares its state).
 * Snapshots are scrubbed when dropped like any page, and cost state_pages
 * pages each (bounded by max_pages in all).
 * Owner thread only (the scheduler). */
#include "kv_int.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#define KV__NIL UINT32_MAX

typedef struct kv__pent {
    uint8_t key[KV_ROOT_BYTES]; /* chain key of the page */
    kv_tag tag;                 /* the page's tag when it was published */
    uint32_t page;              /* page id; KV__NIL while the slot is free */
    uint32_t hnext;             /* next in the bucket chain, or next free slot */
    uint32_t prev, next;        /* LRU list: prev is more recent */
    kv_entry *snap;             /* hybrid pools: (state_pages) the state after the page, or NULL */
} kv__pent;

struct kv_prefix {
    kv_pool *p;
    uint32_t max_pages;
    uint32_t n_used;
    uint32_t n_snap_pages; /* pages held by snapshots (hybrid pools), <= max_pages */
    kv__pent *ents;        /* (max_pages) */
    uint32_t *buckets;     /* (n_buckets) first entry of each chain, KV__NIL if empty */
    uint32_t n_buckets;    /* power of two >= 2 * max_pages */
    uint32_t free_slot;    /* head of the free-slot list (through hnext) */
    uint32_t lru_head;     /* most recently used */
    uint32_t lru_tail;     /* least recently used: evicted first */
    uint8_t sip_key[crypto_shorthash_KEYBYTES];
};

// ----------------------------------------------------------------------------
// Keys

void kv_prefix_root(const char *tenant, size_t len, uint8_t root[KV_ROOT_BYTES]) {
    static const char dom[] = "kvseal/prefix/v1/tenant";
    kv__sodium_once();
    KS_ASSERT(len <= UINT32_MAX);
#ifdef KS_BROKEN_SHARED_PREFIX  // TEST ONLY (I9): every tenant gets the same root
    len = 0;
#endif
    uint8_t le[4] = {(uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16), (uint8_t)(len >> 24)};
    crypto_hash_sha256_state st;
    crypto_hash_sha256_init(&st);
    crypto_hash_sha256_update(&st, (const uint8_t *)dom, sizeof dom - 1);
    crypto_hash_sha256_update(&st, le, sizeof le);
    if (len) crypto_hash_sha256_update(&st, (const uint8_t *)tenant, len);
    crypto_hash_sha256_final(&st, root);
}

/* key = SHA-256(key || toks[0, n) as int32 LE), in place. */
static void kv__chain(uint8_t key[KV_ROOT_BYTES], const int32_t *toks, uint32_t n) {
    crypto_hash_sha256_state st;
    crypto_hash_sha256_init(&st);
    crypto_hash_sha256_update(&st, key, KV_ROOT_BYTES);
    uint8_t buf[256];  // 64 tokens at a time
    for (uint32_t i = 0; i < n;) {
        uint32_t m = 0;
        for (; m < sizeof buf / 4 && i < n; m++, i++) {
            uint32_t t = (uint32_t)toks[i];
            buf[4 * m + 0] = (uint8_t)t;
            buf[4 * m + 1] = (uint8_t)(t >> 8);
            buf[4 * m + 2] = (uint8_t)(t >> 16);
            buf[4 * m + 3] = (uint8_t)(t >> 24);
        }
        crypto_hash_sha256_update(&st, buf, 4 * (unsigned long long)m);
    }
    crypto_hash_sha256_final(&st, key);
}

// ----------------------------------------------------------------------------
// Table and LRU list

static uint32_t kv__bucket(const kv_prefix *c, const uint8_t key[KV_ROOT_BYTES]) {
    uint8_t h[crypto_shorthash_BYTES];
    crypto_shorthash(h, key, KV_ROOT_BYTES, c->sip_key);
    uint64_t x;
    memcpy(&x, h, sizeof x);
    return (uint32_t)(x & (c->n_buckets - 1));
}

static uint32_t kv__find(const kv_prefix *c, const uint8_t key[KV_ROOT_BYTES]) {
    for (uint32_t i = c->buckets[kv__bucket(c, key)]; i != KV__NIL; i = c->ents[i].hnext)
        if (!memcmp(c->ents[i].key, key, KV_ROOT_BYTES)) return i;
    return KV__NIL;
}

static void kv__lru_unlink(kv_prefix *c, uint32_t i) {
    kv__pent *e = &c->ents[i];
    if (e->prev != KV__NIL) c->ents[e->prev].next = e->next;
    else c->lru_head = e->next;
    if (e->next != KV__NIL) c->ents[e->next].prev = e->prev;
    else c->lru_tail = e->prev;
    e->prev = e->next = KV__NIL;
}

/* Links entry i right after `after` (KV__NIL: at the head, most recent). */
static void kv__lru_link_after(kv_prefix *c, uint32_t i, uint32_t after) {
    kv__pent *e = &c->ents[i];
    e->prev = after;
    e->next = after == KV__NIL ? c->lru_head : c->ents[after].next;
    if (e->next != KV__NIL) c->ents[e->next].prev = i;
    else c->lru_tail = i;
    if (after != KV__NIL) c->ents[after].next = i;
    else c->lru_head = i;
}

/* Moves i after `after`: walking a chain root-first with after = the
 * previous page of the chain leaves the root most recent and the deepest
 * page least recent, so eviction takes chains from their tail. */
static void kv__lru_touch(kv_prefix *c, uint32_t i, uint32_t after) {
    if (i == after) return;
    kv__lru_unlink(c, i);
    kv__lru_link_after(c, i, after);
}

/* True when snapshot page k of entry e still carries its tag, is READY and
 * held by the cache alone; otherwise reports a violation. */
static bool kv__snap_page_ok(kv_prefix *c, const kv__pent *e, int k) {
    kv_pool *p = c->p;
    const kv_entry *se = &e->snap[k];
    const kv__page *h = se->page < p->n_pages ? &p->hdr[se->page] : NULL;
    if (h && kv__tag_eq(h->tag, se->tag) && h->state == KV_PAGE_READY && h->refcount == 1)
        return true;
    (void)kv__violation(p, se->tag.seq_uid, se->page, se->tag, h ? h->tag : (kv_tag){0},
                        h ? (kv_page_state)h->state : KV_PAGE_FREE);
    return false;
}

/* Drops entry e's snapshot, if any: its pages are scrubbed and FREE (a page
 * that lost its tag belongs to someone else now and is left alone). Returns
 * how many pages became FREE. */
static uint32_t kv__snap_drop(kv_prefix *c, kv__pent *e) {
    if (!e->snap) return 0;
    kv_pool *p = c->p;
    const uint32_t sp = (uint32_t)p->g.state_pages;
    uint32_t n = 0;
    for (uint32_t k = 0; k < sp; k++)
        if (e->snap[k].page != KV__NIL) {
            if (kv__snap_page_ok(c, e, (int)k)) kv__page_unref(p, e->snap[k].page), n++;
        }
    free(e->snap);
    e->snap = NULL;
    c->n_snap_pages -= sp;
    atomic_fetch_sub_explicit(&p->prefix_cached, sp, memory_order_relaxed);
    return n;
}

/* Removes entry i; drops the cache's page reference when unref is set. */
static void kv__remove(kv_prefix *c, uint32_t i, bool unref) {
    kv__pent *e = &c->ents[i];
    (void)kv__snap_drop(c, e);
    uint32_t *pp = &c->buckets[kv__bucket(c, e->key)];
    while (*pp != i) {
        KS_ASSERT(*pp != KV__NIL);
        pp = &c->ents[*pp].hnext;
    }
    *pp = e->hnext;
    kv__lru_unlink(c, i);
    if (unref) kv__page_unref(c->p, e->page);
    e->page = KV__NIL;
    e->hnext = c->free_slot;
    c->free_slot = i;
    c->n_used--;
    atomic_fetch_sub_explicit(&c->p->prefix_cached, 1, memory_order_relaxed);
}

/* True when the entry's page still carries the recorded tag, is READY, full
 * and referenced (defence in depth: the cache's reference should make this
 * always true). Otherwise reports a violation and drops the entry without
 * touching the page, which belongs to someone else now. */
static bool kv__valid(kv_prefix *c, uint32_t i) {
    const kv__pent *e = &c->ents[i];
    kv_pool *p = c->p;
    const kv__page *h = &p->hdr[e->page];
    if (kv__tag_eq(h->tag, e->tag) && h->state == KV_PAGE_READY &&
        h->filled == (uint32_t)p->g.page_tokens && h->refcount >= 1)
        return true;
    (void)kv__violation(p, e->tag.seq_uid, e->page, e->tag, h->tag, (kv_page_state)h->state);
    kv__remove(c, i, false);
    return false;
}

// ----------------------------------------------------------------------------
// Cache

ks_err kv_prefix_create(kv_pool *p, uint32_t max_pages, kv_prefix **out, ks_errbuf *eb) {
    *out = NULL;
    kv__sodium_once();
    kv_prefix *c = calloc(1, sizeof *c);
    if (!c) goto fail;
    c->p = p;
    c->max_pages = max_pages;
    c->n_buckets = 16;
    while (c->n_buckets < 2 * (uint64_t)max_pages && c->n_buckets < (1u << 30)) c->n_buckets *= 2;
    c->ents = malloc(sizeof *c->ents * (max_pages ? max_pages : 1));
    c->buckets = malloc(sizeof *c->buckets * c->n_buckets);
    if (!c->ents || !c->buckets) goto fail;
    for (uint32_t b = 0; b < c->n_buckets; b++) c->buckets[b] = KV__NIL;
    for (uint32_t i = 0; i < max_pages; i++) {
        c->ents[i].page = KV__NIL;
        c->ents[i].hnext = i + 1 < max_pages ? i + 1 : KV__NIL;
        c->ents[i].prev = c->ents[i].next = KV__NIL;
        c->ents[i].snap = NULL;
    }
    c->free_slot = max_pages ? 0 : KV__NIL;
    c->lru_head = c->lru_tail = KV__NIL;
    crypto_shorthash_keygen(c->sip_key);
    *out = c;
    return KS_OK;
fail:
    kv_prefix_destroy(c);
    return ks_seterr(eb, KS_ERR_NOMEM, "kv prefix cache: cannot allocate %u entries", max_pages);
}

void kv_prefix_destroy(kv_prefix *c) {
    if (!c) return;
    if (c->ents && c->buckets)
        while (c->lru_tail != KV__NIL) {
            uint32_t i = c->lru_tail;
            if (kv__valid(c, i)) kv__remove(c, i, true);
        }
    free(c->ents);
    free(c->buckets);
    free(c);
}

/* Hybrid pools: how many leading pages of toks an attach may take (at most
 * limit): up to the deepest matching entry that carries a snapshot, 0 when
 * none does. That entry's index goes to *snap_i. */
static uint32_t kv__snap_depth(kv_prefix *c, const uint8_t root[KV_ROOT_BYTES], const int32_t *toks,
                               uint32_t limit, uint32_t *snap_i) {
    const uint32_t P = (uint32_t)c->p->g.page_tokens;
    uint8_t key[KV_ROOT_BYTES];
    memcpy(key, root, KV_ROOT_BYTES);
    uint32_t depth = 0;
    for (uint32_t n = 0; n < limit; n++) {
        kv__chain(key, toks + (size_t)n * P, P);
        uint32_t i = kv__find(c, key);
        if (i == KV__NIL || !kv__valid(c, i)) break;
        if (c->ents[i].snap) depth = n + 1, *snap_i = i;
    }
    return depth;
}

/* Gives the empty hybrid sequence s its own state pages holding a copy of
 * entry i's snapshot. False (s untouched) when a snapshot page fails its
 * check (reported; the snapshot is dropped) or s's pages cannot be taken. */
static bool kv__snap_restore(kv_prefix *c, uint32_t i, kv_seq *s) {
    kv_pool *p = c->p;
    kv__pent *e = &c->ents[i];
    const int sp = p->g.state_pages;
    for (int k = 0; k < sp; k++)
        if (!kv__snap_page_ok(c, e, k)) {
            e->snap[k].page = KV__NIL; // not ours any more: left alone
            (void)kv__snap_drop(c, e);
            return false;
        }
    if (kv__seq_take_state(p, s, NULL) != KS_OK) return false;
    for (int k = 0; k < sp; k++)
        memcpy(kv__page_base(p, s->st[k].page), kv__page_base(p, e->snap[k].page), p->page_bytes);
    return true;
}

uint32_t kv_prefix_attach(kv_prefix *c, const uint8_t root[KV_ROOT_BYTES], const int32_t *toks,
                          uint32_t n_toks, kv_seq *s) {
    KS_ASSERT(s->n_pages == 0 && s->n_tokens == 0);
    kv_pool *p = c->p;
    const uint32_t P = (uint32_t)p->g.page_tokens;
    if (n_toks == 0 || c->n_used == 0) return 0;
    // page i covers [i*P, (i+1)*P); the last token n_toks-1 must stay outside
    uint32_t limit = (n_toks - 1) / P;
    const bool hybrid = p->g.state_pages > 0;
    if (hybrid) { // resumable only where the state was kept
        KS_ASSERT(!s->st);
        uint32_t si = KV__NIL;
        limit = kv__snap_depth(c, root, toks, limit, &si);
        if (limit == 0 || !kv__snap_restore(c, si, s)) return 0;
    }
    uint8_t key[KV_ROOT_BYTES];
    memcpy(key, root, KV_ROOT_BYTES);
    uint32_t n = 0, prev = KV__NIL;
    for (; n < limit; n++) {
        kv__chain(key, toks + (size_t)n * P, P);
        uint32_t i = kv__find(c, key);
        if (i == KV__NIL || !kv__valid(c, i)) break;
        const kv__pent *e = &c->ents[i];
        if (kv__seq_push(s, e->page, e->tag) != KS_OK) break;  // NOMEM: attach fewer
        p->hdr[e->page].refcount++;
        kv__lru_touch(c, i, prev);
        prev = i;
    }
    if (hybrid && n != limit) { // the state is that after `limit` pages: all or nothing
        kv_seq_release(p, s);
        return 0;
    }
    s->n_shared = n;
    s->n_tokens = n * P;
    atomic_fetch_add_explicit(&p->prefix_hits_pages, n, memory_order_relaxed);
    return n * P;
}

/* A slot for a new entry: a free one, else the least recently used entry
 * whose page only the cache holds (evicted). The chain being published sits
 * at the head of the LRU list, from lru_head to `stop`; the walk from the
 * tail ends there so it never evicts a page of that chain. KV__NIL when
 * nothing can be evicted. */
static uint32_t kv__take_slot(kv_prefix *c, uint32_t stop) {
    if (c->free_slot == KV__NIL) {
        for (uint32_t i = c->lru_tail; i != KV__NIL && i != stop; i = c->ents[i].prev)
            if (c->p->hdr[c->ents[i].page].refcount == 1) {
                if (kv__valid(c, i)) kv__remove(c, i, true);
                break;
            }
        if (c->free_slot == KV__NIL) return KV__NIL;
    }
    uint32_t i = c->free_slot;
    c->free_slot = c->ents[i].hnext;
    return i;
}

/* kv_prefix_publish; returns the entry of page n_toks / P - 1 when every
 * full page of toks is in the cache now, else KV__NIL. */
static uint32_t kv__publish(kv_prefix *c, const uint8_t root[KV_ROOT_BYTES], const int32_t *toks,
                            uint32_t n_toks, const kv_seq *s) {
    kv_pool *p = c->p;
    const uint32_t P = (uint32_t)p->g.page_tokens;
    uint32_t n_full = n_toks / P;
    if (n_full > s->n_tokens / P) n_full = s->n_tokens / P;
    if (n_full > s->n_pages) n_full = s->n_pages;
    if (c->max_pages == 0 || n_full == 0) return KV__NIL;
    const uint32_t want = n_toks / P;
    uint8_t key[KV_ROOT_BYTES];
    memcpy(key, root, KV_ROOT_BYTES);
    uint32_t prev = KV__NIL;
    uint32_t pg = 0;
    for (; pg < n_full; pg++) {
        kv__chain(key, toks + (size_t)pg * P, P);
        uint32_t i = kv__find(c, key);
        if (i != KV__NIL && kv__valid(c, i)) {  // already cached (perhaps another page)
            kv__lru_touch(c, i, prev);
            prev = i;
            continue;
        }
        const kv_entry *se = &s->ent[pg];
        if (se->page >= p->n_pages) break;
        kv__page *h = &p->hdr[se->page];
        if (!kv__tag_eq(h->tag, se->tag)) {  // a corrupt block table: publish nothing of it
            (void)kv__violation(p, s->uid, se->page, se->tag, h->tag, (kv_page_state)h->state);
            break;
        }
        if (h->state != KV_PAGE_READY || h->filled != P) break;
        i = kv__take_slot(c, prev);
        if (i == KV__NIL) break;  // every cached page is in use: keep fewer
        kv__pent *e = &c->ents[i];
        memcpy(e->key, key, KV_ROOT_BYTES);
        e->page = se->page;
        e->tag = se->tag;
        uint32_t b = kv__bucket(c, key);
        e->hnext = c->buckets[b];
        c->buckets[b] = i;
        kv__lru_link_after(c, i, prev);
        prev = i;
        h->refcount++;  // the cache's own reference
        c->n_used++;
        atomic_fetch_add_explicit(&p->prefix_cached, 1, memory_order_relaxed);
    }
    return pg == want ? prev : KV__NIL;
}

void kv_prefix_publish(kv_prefix *c, const uint8_t root[KV_ROOT_BYTES], const int32_t *toks,
                       uint32_t n_toks, const kv_seq *s) {
    (void)kv__publish(c, root, toks, n_toks, s);
}

/* Drops the least recently used snapshot other than entry keep's; false
 * when there is none. */
static bool kv__snap_evict_one(kv_prefix *c, uint32_t keep) {
    for (uint32_t i = c->lru_tail; i != KV__NIL; i = c->ents[i].prev)
        if (i != keep && c->ents[i].snap) {
            (void)kv__snap_drop(c, &c->ents[i]);
            return true;
        }
    return false;
}

void kv_prefix_publish_state(kv_prefix *c, const uint8_t root[KV_ROOT_BYTES], const int32_t *toks,
                             uint32_t n_toks, const kv_seq *s) {
    kv_pool *p = c->p;
    const uint32_t P = (uint32_t)p->g.page_tokens, sp = (uint32_t)p->g.state_pages;
    uint32_t i = kv__publish(c, root, toks, n_toks, s);
    if (sp == 0 || i == KV__NIL || n_toks % P || s->n_tokens != n_toks || !s->st ||
        c->ents[i].snap || sp > c->max_pages)
        return;
    // the state is read through the sequence's checked accessor (I1): a
    // table that fails it is reported and nothing is kept
    for (uint32_t k = 0; k < sp; k++) {
        void *src;
        if (kv_seq_state(p, s, k, &src) != KS_OK) return;
    }
    while (c->n_snap_pages + sp > c->max_pages)
        if (!kv__snap_evict_one(c, i)) return;
    if (p->n_free < sp) return; // only pages nobody else needs now
    kv_entry *snap = malloc(sizeof *snap * sp);
    if (!snap) return;
    const uint64_t uid = kv__next_uid(); // the snapshot's own owner: no sequence's
    for (uint32_t k = 0; k < sp; k++) {
        void *src;
        KS_ASSERT(kv_seq_state(p, s, k, &src) == KS_OK); // checked above, nothing ran since
        uint32_t id = kv__page_alloc(p, uid);
        memcpy(kv__page_base(p, id), src, p->page_bytes);
        kv__page *h = &p->hdr[id];
        h->filled = P;
        kv__set_state(p, h, KV_PAGE_READY); // read-only from now on
        snap[k] = (kv_entry){.page = id, .tag = h->tag};
    }
    c->ents[i].snap = snap;
    c->n_snap_pages += sp;
    atomic_fetch_add_explicit(&p->prefix_cached, sp, memory_order_relaxed);
}

uint32_t kv_prefix_evict(kv_prefix *c, uint32_t n_pages) {
    uint32_t n = 0;
    for (uint32_t i = c->lru_tail; i != KV__NIL && n < n_pages;) {
        uint32_t more_recent = c->ents[i].prev;
        if (c->p->hdr[c->ents[i].page].refcount == 1 && kv__valid(c, i)) {
            n += kv__snap_drop(c, &c->ents[i]);
            kv__remove(c, i, true);
            n++;
        }
        i = more_recent;
    }
    // snapshots of pages still in use are the cache's alone: they go next
    while (n < n_pages && c->n_snap_pages > 0) {
        uint32_t before = c->n_snap_pages;
        for (uint32_t i = c->lru_tail; i != KV__NIL; i = c->ents[i].prev)
            if (c->ents[i].snap) {
                n += kv__snap_drop(c, &c->ents[i]);
                break;
            }
        if (c->n_snap_pages == before) break;
    }
    return n;
}

uint32_t kv_prefix_n_pages(const kv_prefix *c) { return c->n_used + c->n_snap_pages; }
