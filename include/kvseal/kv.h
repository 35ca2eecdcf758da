/* kv.h — the sealed, paged KV cache: a pool of tagged fixed-size pages,
 * per-sequence block tables, and the tenant-scoped prefix cache.
 *
 * A page holds the KV rows of page_tokens consecutive positions of a
 * sequence, for every layer, in the pool's element type (kv_geom.kv_type:
 * F32, F16 or Q8_0, GGUF layouts). Page payload layout (rows of kv_row_bytes
 * bytes):
 *   [layer][plane][page_tokens][row of kv_dim elements]
 * with kv_geom_planes(g) planes per layer: 2 (plane 0 = K, plane 1 = V; every
 * dense model) or 1 (one row per position holds everything: multi-head
 * latent attention stores the normalized KV latent then the RoPE key, and
 * the model reads K and V as prefixes of that one row).
 * A Q8_0 row is kv_dim/32 blocks of {f16 d, i8 qs[32]}; the model layer
 * refuses Q8_0 unless head_dim % 32 == 0, so no block straddles two heads.
 * Each page has a header {tag {seq_uid, gen}, state, refcount, filled} kept
 * beside the payload. A block-table entry holds a page id AND the tag the
 * sequence expects; kv_seq_span_read/_write are the only ways to turn an
 * entry into memory, and they check the tag and the state there (I1). kv is
 * the ONLY module that computes a page address.
 *
 * Invariants served: I1 (tag check at resolution; a mismatch increments the
 * violation counter, reports a security event and fails), I2 (seq_uid =
 * boot nonce + counter, never reused; gen increments on every allocation),
 * I3 (a page is scrubbed — zero, or a poison pattern — before it returns to
 * FREE; allocation of an unclean page is caught by KS_KV_CHECK_CLEAN
 * builds), I7 (prefix-cache keys are a SHA-256 chain whose root is
 * domain-separated by tenant).
 *
 * Threading: the pool, its sequences and the prefix cache are owned by one
 * thread (the scheduler). kv_seq_span_read/_write may be called from kernel
 * worker threads during a forward pass (they only read headers; the
 * violation counter is atomic). kv_pool_stats may be called from any thread. */
#ifndef KS_KV_H
#define KS_KV_H

#include "kvseal/base.h"

typedef struct kv_geom {
    int n_layer;     /* layers */
    int kv_dim;      /* elements of one row: n_head_kv * head_dim per K (or V) row; with
                      * one plane, the whole single row (MLA: latent + RoPE key) */
    int page_tokens; /* positions per page (default 16) */
    int kv_type;     /* ks_dtype of the elements: KS_DTYPE_F32 (0, the zero value), _F16 or
                      * _Q8_0 (kv_dim % 32 == 0) — kv_type_ok */
    int planes;      /* rows per position per layer: 2 = a K row then a V row (every dense
                      * model; a zero-initialized geometry's 0 means 2, so existing
                      * initializers keep working), 1 = one row that holds everything (MLA:
                      * the model reads K and V as prefixes of it). Any other value is
                      * refused by kv_geom_check. Read it through kv_geom_planes. */
    int state_pages; /* hybrid recurrent models: pages of recurrent state (convolution and
                      * SSM/delta state of every recurrent layer) each sequence holds beside its
                      * KV pages, from its first kv_seq_reserve to its release; 0: none. The
                      * model lays its state out in them (model_kv_geom); kv only owns, tags,
                      * zeroes and scrubs them like any page (I1, I3, I4, I8). */
} kv_geom;

/* Rows per position per layer of g: 1 when g->planes is 1, else 2 (0, the
 * zero value, means 2; kv_geom_check refuses anything but 0, 1 and 2). Can't fail. */
int kv_geom_planes(const kv_geom *g);

/* True for the KV element types a pool supports: F32, F16, Q8_0. */
bool kv_type_ok(int kv_type);
/* "f32", "f16", "q8_0" ("?" for others); static storage, can't fail. */
const char *kv_type_name(int kv_type);
/* Parses "f32" | "f16" | "q8_0" (case-insensitive) into *out; false for
 * anything else (the caller names the choices: KV_TYPE_CHOICES). */
bool kv_type_parse(const char *s, int *out /* OUT */);
#define KV_TYPE_CHOICES "f32, f16 or q8_0"
/* Bytes of one row of kv_dim elements of g's type (4, 2 or 34/32 bytes per
 * element); 0 when g's type is unsupported or kv_dim not a multiple of its
 * block. Can't fail. */
size_t kv_row_bytes(const kv_geom *g);
/* Bytes of one page: n_layer * kv_geom_planes * page_tokens * kv_row_bytes;
 * 0 for a bad geometry (planes other than 0, 1, 2 included). Can't fail. */
uint64_t kv_page_bytes(const kv_geom *g);
/* Writes the page arithmetic of g into buf[0..cap) (NUL-terminated, cut to
 * fit), e.g. "49152 bytes/page = 6 layers x 2 planes (K, V) x 16 tokens x
 * 256 B per 128-element row" ("x 1 plane x" for one row per position), as
 * kvseal check prints it (I8); returns the length snprintf would. Can't fail. */
int kv_geom_describe(const kv_geom *g, char *buf, size_t cap);
/* Checks g (positive sizes, a supported type, kv_dim a multiple of the
 * type's block, planes 0, 1 or 2); KS_ERR_INVAL with the reason in eb
 * otherwise. */
ks_err kv_geom_check(const kv_geom *g, ks_errbuf *eb) KS_MUST_USE;

typedef struct kv_tag {
    uint64_t seq_uid; /* the allocating sequence (I2) */
    uint64_t gen;     /* the pool's allocation count when the page was allocated: grows
                         with every life of a page, and no two pages share one (I2) */
} kv_tag;

typedef enum kv_page_state {
    KV_PAGE_FREE = 0,       /* on the free list, scrubbed */
    KV_PAGE_ALLOCATED = 1,  /* owned, no row written yet */
    KV_PAGE_READY = 2,      /* owned, rows [0, filled) readable */
    KV_PAGE_QUARANTINE = 3, /* a writer may still be live (pd): neither read nor reused */
} kv_page_state;

typedef enum kv_scrub {
    KV_SCRUB_ZERO = 0,   /* default: freed pages are zeroed */
    KV_SCRUB_POISON = 1, /* debugging: freed pages are filled with NaN-poison (NaN as f32,
                          * as every f16 and as every Q8_0 scale: a read gives NaN logits) */
} kv_scrub;

typedef struct kv_pool kv_pool;

/* Called (on the thread that found it) for every isolation violation, with
 * the page and the expected/found tags — never page content. */
typedef void (*kv_violation_fn)(void *ctx, uint64_t seq_uid, uint32_t page, kv_tag expected,
                                kv_tag found, kv_page_state state);

/* Allocates a pool of n_pages scrubbed pages. Errors: KS_ERR_INVAL (bad
 * geometry, kv_geom_check), KS_ERR_NOMEM. The caller owns *out. */
ks_err kv_pool_create(const kv_geom *g, uint32_t n_pages, kv_scrub scrub, kv_pool **out /* OUT */,
                      ks_errbuf *eb) KS_MUST_USE;
/* Frees the pool; accepts NULL. Every sequence must have been released. */
void kv_pool_destroy(kv_pool *p);
/* Installs the violation callback (NULL to remove); owner thread only. */
void kv_pool_set_violation_cb(kv_pool *p, kv_violation_fn fn, void *ctx);
/* Geometry, page count, free page count, bytes per page; can't fail. */
const kv_geom *kv_pool_geom(const kv_pool *p);
uint32_t kv_pool_n_pages(const kv_pool *p);
uint32_t kv_pool_n_free(const kv_pool *p);
size_t kv_pool_page_bytes(const kv_pool *p);

typedef struct kv_stats {
    uint32_t pages[4];   /* pages by kv_page_state */
    uint64_t violations; /* isolation violations detected since start */
    uint64_t prefix_hits_pages;   /* pages reused from the prefix cache */
    uint64_t prefix_cached_pages; /* pages held by the prefix cache now */
    uint64_t allocations;         /* page allocations since start (FREE -> ALLOCATED) */
} kv_stats;
/* Snapshot of counters; safe from any thread (values may be a step stale). */
void kv_pool_stats(const kv_pool *p, kv_stats *out /* OUT */);
/* True when every page is FREE and its payload is entirely scrubbed (zero,
 * or poison in POISON mode). O(pool bytes); for tests and shutdown checks. */
bool kv_pool_all_free_and_scrubbed(const kv_pool *p);

/* One page's header, for tests, metrics and the pd receiver. */
typedef struct kv_page_info {
    kv_tag tag;          /* seq_uid 0 while FREE; gen: the pool's allocation count at its allocation */
    kv_page_state state;
    uint32_t refcount;   /* sequences + prefix cache holding it */
    uint32_t filled;     /* rows [0, filled) readable */
} kv_page_info;
/* Copies page's header into *out. Errors: KS_ERR_INVAL (no such page).
 * Owner thread (or while no forward pass runs). */
ks_err kv_pool_page_info(const kv_pool *p, uint32_t page, kv_page_info *out /* OUT */) KS_MUST_USE;

/* Pages needed for a pool of mem_bytes; can't fail. */
uint32_t kv_pages_for_bytes(const kv_geom *g, uint64_t mem_bytes);

// ----------------------------------------------------------------------------
// Block tables

typedef struct kv_entry {
    uint32_t page; /* page id */
    kv_tag tag;    /* the tag this sequence expects to find on it */
} kv_entry;

/* A sequence's block table: logical page i holds positions
 * [i*page_tokens, (i+1)*page_tokens). Caller-allocated (kv_seq_init). */
typedef struct kv_seq {
    kv_entry *ent;     /* private: (cap) entries */
    kv_entry *st;      /* private: (g.state_pages) recurrent-state entries once reserved, or NULL */
    uint32_t n_pages;  /* read-only */
    uint32_t cap;      /* private */
    uint32_t n_shared; /* read-only: leading entries shared read-only (prefix cache) */
    uint32_t n_tokens; /* read-only: positions [0, n_tokens) hold K/V */
    uint64_t uid;      /* read-only: unique for the process lifetime (I2) */
} kv_seq;

/* Initializes an empty block table with a fresh uid; can't fail. */
void kv_seq_init(kv_pool *p, kv_seq *s);
/* Makes sure positions [0, n_tokens) have pages, allocating fresh ones
 * (FREE -> ALLOCATED, a new gen, tagged with s->uid); with g.state_pages, the
 * first reserve also takes the sequence's state pages, zeroed (the zero
 * state a recurrence starts from). Errors: KS_ERR_NOSPACE when the pool is
 * short (nothing is allocated then), KS_ERR_NOMEM. */
ks_err kv_seq_reserve(kv_pool *p, kv_seq *s, uint32_t n_tokens, ks_errbuf *eb) KS_MUST_USE;
/* Records that positions [0, n_tokens) now hold K/V for every layer: pages
 * covering them become READY with their filled counts. Can't fail. */
void kv_seq_set_filled(kv_pool *p, kv_seq *s, uint32_t n_tokens);
/* Rolls s back to positions [0, n_tokens) (n_tokens <= s->n_tokens, not
 * into its shared prefix): the rows of positions [n_tokens, old n_tokens)
 * in its own pages are scrubbed at once (I3) and their pages' filled counts
 * drop, so a page past the new end is ALLOCATED again (unreadable); the
 * pages stay reserved to s. Speculative decoding's rejected drafts. Not for
 * pools with recurrent state (asserted). Can't fail. */
void kv_seq_truncate(kv_pool *p, kv_seq *s, uint32_t n_tokens);
/* Drops the sequence's references; pages nobody else holds are scrubbed and
 * become FREE. Empties the table (the uid stays). Can't fail. */
void kv_seq_release(kv_pool *p, kv_seq *s);

/* Pages kv_seq_reserve(s, n_tokens) would take now: KV pages past those s
 * holds, plus g.state_pages while s holds none. Can't fail. */
uint32_t kv_seq_pages_needed(const kv_pool *p, const kv_seq *s, uint32_t n_tokens);

/* Recurrent-state page i (< g.state_pages) of s, for reading and writing
 * (kv_page_bytes bytes, 64-byte aligned): checks the entry's tag against
 * the page header, that the page is ALLOCATED and owned by s alone. A
 * sequence's state pages are never shared. Errors: KS_ERR_INTERNAL (no such
 * page, or any mismatch: counted as an isolation violation and reported, as
 * kv_seq_span_read). Thread-safe for the sequence's one writer. */
ks_err kv_seq_state(kv_pool *p, const kv_seq *s, uint32_t i, void **out /* OUT */) KS_MUST_USE;
/* Entry of state page i (< g.state_pages) of s, which must hold its state:
 * the page id and the tag, what a grant announces for it (pd). Can't fail
 * (asserts). */
kv_entry kv_seq_state_entry(const kv_seq *s, uint32_t i);
/* State page i of s viewed as a KV page, for moving it whole as page frames
 * do (pd): layer `layer`'s planes, exactly as kv_seq_span_write gives them
 * (*v NULL with one plane), the same bytes kv_seq_state gives from offset
 * layer * planes * page_tokens * kv_row_bytes. Checks as kv_seq_state.
 * Errors: KS_ERR_INTERNAL, counted and reported as a violation. */
ks_err kv_seq_state_span(kv_pool *p, const kv_seq *s, uint32_t i, int layer, void **k /* OUT */,
                         void **v /* OUT */) KS_MUST_USE;

/* Puts src's first n_pages entries (full READY pages: a prompt computed by
 * src) in front of dst's own pages, shared read-only: each page gains a
 * reference and keeps src's tag (I1), as a prefix-cache hit does. dst must
 * hold only fresh pages (kv_seq_reserve'd, nothing filled, none shared);
 * they become its logical pages n_pages.. . Sets dst->n_shared = n_pages
 * and dst->n_tokens = n_pages * page_tokens. In a pool with recurrent
 * state, src's state must be that after exactly those pages (src->n_tokens
 * == n_pages * page_tokens) and dst gets a copy of it in its own state pages
 * (a state is never shared). Errors: KS_ERR_INVAL (dst not fresh, n_pages
 * past src, src's state elsewhere), KS_ERR_INTERNAL (a page not full, not
 * READY or with another tag, a state page failing its check: counted as a
 * violation), KS_ERR_NOMEM; nothing changes on error. Owner thread. (Issue
 * 12: the choices of an n > 1 request.) */
ks_err kv_seq_share_prefix(kv_pool *p, kv_seq *dst, const kv_seq *src, uint32_t n_pages,
                           ks_errbuf *eb) KS_MUST_USE;

/* For a request aborted while a writer (a pd transfer) may still be live
 * (I5): the pages s owns alone go to QUARANTINE — neither readable, nor
 * writable, nor reusable — keeping their tags; shared prefix pages just lose
 * s's reference. Empties the table (the uid stays). Returns the number of
 * pages quarantined. Can't fail. */
uint32_t kv_seq_quarantine(kv_pool *p, kv_seq *s);
/* Once the writer is quiesced: scrubs every QUARANTINE page tagged with
 * seq_uid and returns it to FREE; returns how many. O(pool pages). */
uint32_t kv_pool_quarantine_free(kv_pool *p, uint64_t seq_uid);

/* Entry i (< s->n_pages) of the block table: the page id and the tag the
 * sequence expects there — what a grant announces to a remote writer. No
 * address is involved; can't fail (asserts i). */
kv_entry kv_seq_entry(const kv_seq *s, uint32_t i);

/* K and V rows of page page_idx of s for one layer, for reading rows
 * [0, n_rows): checks the entry's tag against the page header, that the page
 * is READY and that filled >= n_rows. *k and *v point at page_tokens rows of
 * kv_row_bytes bytes in the pool's kv_type (4-byte aligned for F32, 2-byte
 * for F16/Q8_0). With planes == 1, *v == *k: the same single row (the model
 * reads K and V as prefixes of it). Errors: KS_ERR_INTERNAL on any mismatch — counted as an
 * isolation violation and reported through the callback. Thread-safe for
 * concurrent readers. */
ks_err kv_seq_span_read(kv_pool *p, const kv_seq *s, uint32_t page_idx, int layer, uint32_t n_rows,
                        const void **k /* OUT */, const void **v /* OUT */) KS_MUST_USE;
/* kv_seq_span_read for every page covering positions [0, n_tokens) of s at
 * one layer (the last page needs only the rows it covers): k[i], v[i] get
 * page i's planes (v[i] == k[i] with planes == 1); both arrays have room for
 * ceil(n_tokens/page_tokens) pointers (caller-owned). Lets attention check each page once per layer
 * per step instead of once per (token, head); the pointers stay valid until
 * the owner thread next changes s or the pool. Errors: KS_ERR_INTERNAL as
 * kv_seq_span_read, for the first failing page (counted and reported once);
 * k and v are then partly filled and must not be used. Thread-safe. */
ks_err kv_seq_span_read_all(kv_pool *p, const kv_seq *s, int layer, uint32_t n_tokens,
                            const void **k /* OUT */, const void **v /* OUT */) KS_MUST_USE;
/* The same for writing: the tag must match, the page must be ALLOCATED or
 * READY, owned by s (not a shared prefix page). With planes == 1 there is no
 * V plane to write: *v is set to NULL (v itself may then be NULL), and the
 * caller writes the single row through *k — a writer that still writes a V
 * row faults at once instead of silently overwriting the row K reads.
 * Errors: KS_ERR_INTERNAL, counted and reported like a read violation. */
ks_err kv_seq_span_write(kv_pool *p, const kv_seq *s, uint32_t page_idx, int layer,
                         void **k /* OUT */, void **v /* OUT */) KS_MUST_USE;

// ----------------------------------------------------------------------------
// Prefix cache (I7): full prompt pages reused by later requests of the same
// tenant. Key of page i = SHA-256(key of page i-1 || token ids of page i as
// int32 LE), and the key of "page -1" is the tenant root. Cached pages are
// READY, shared read-only with reference counts, and keep their tags.

#define KV_ROOT_BYTES 32

/* Domain-separated root for a tenant name (from authentication, never from a
 * request body): SHA-256("kvseal/prefix/v1/tenant" || u32 LE len || name). */
void kv_prefix_root(const char *tenant, size_t len, uint8_t root[KV_ROOT_BYTES] /* OUT */);

typedef struct kv_prefix kv_prefix;

/* A prefix cache over pool holding at most max_pages pages. Errors:
 * KS_ERR_NOMEM. Owner thread only. */
ks_err kv_prefix_create(kv_pool *p, uint32_t max_pages, kv_prefix **out /* OUT */,
                        ks_errbuf *eb) KS_MUST_USE;
/* Releases every cached page; accepts NULL. */
void kv_prefix_destroy(kv_prefix *c);
/* Attaches to the EMPTY sequence s the longest run of cached full pages
 * matching toks under root, but never the page holding the last token (its
 * logits must be computed). In a pool with recurrent state (g.state_pages >
 * 0) the run ends at the deepest page that carries a state snapshot
 * (kv_prefix_publish_state), and s gets its own state pages holding a copy
 * of it; nothing is attached when the pool lacks the free pages for them.
 * Returns the number of tokens covered (a multiple of page_tokens);
 * s->n_shared and s->n_tokens are set. Can't fail. */
uint32_t kv_prefix_attach(kv_prefix *c, const uint8_t root[KV_ROOT_BYTES], const int32_t *toks,
                          uint32_t n_toks, kv_seq *s);
/* Offers the full pages of s covering toks[0, n_toks) (already computed) to
 * the cache under root; the cache takes a reference on pages it keeps. Pages
 * already cached are skipped. Can't fail (keeps fewer pages on pressure). */
void kv_prefix_publish(kv_prefix *c, const uint8_t root[KV_ROOT_BYTES], const int32_t *toks,
                       uint32_t n_toks, const kv_seq *s);
/* kv_prefix_publish of toks[0, n_toks), n_toks a multiple of page_tokens;
 * in a pool with recurrent state, when s's state has consumed exactly those
 * tokens (s->n_tokens == n_toks), the entry of their last page also keeps a
 * snapshot of it: g.state_pages pages of the cache's own (fresh owner, READY,
 * scrubbed when dropped), at most max_pages such pages in all, the least
 * recently used dropped first. Reads s's state through kv_seq_state (I1).
 * Can't fail (keeps no snapshot under pressure). */
void kv_prefix_publish_state(kv_prefix *c, const uint8_t root[KV_ROOT_BYTES], const int32_t *toks,
                             uint32_t n_toks, const kv_seq *s);
/* Frees up to n_pages cached pages that no sequence uses (least recently
 * used first: whole entries, then snapshots); returns how many became FREE. */
uint32_t kv_prefix_evict(kv_prefix *c, uint32_t n_pages);

/* Pages the cache holds now (snapshot pages included); can't fail. */
uint32_t kv_prefix_n_pages(const kv_prefix *c);

#endif /* KS_KV_H */
