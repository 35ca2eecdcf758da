/* grammar_int.h — private to src/grammar/: the compiled grammar's layout
 * (elements, rules, character sets, its shared token-class tables) and the
 * matcher's (parse-stack nodes, states, scratch), and the calls the module's
 * files make to one another. Files, lowest first: grammar.c (the object's
 * lifetime) <- match.c (the matcher) <- compile.c (GBNF -> grammar) <-
 * schema.c (JSON schema -> GBNF); mask.c (vocabulary tries, token classes,
 * masks) sits on match.c. Design notes: the tops of compile.c, match.c and
 * mask.c. */
#ifndef KS_GRAMMAR_INT_H
#define KS_GRAMMAR_INT_H

#include "kvseal/grammar.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

// ----------------------------------------------------------------------------
// Compiled grammar

enum { GM_END = 0, GM_CHAR = 1, GM_RULE = 2 };

typedef struct gm_elem {
    uint32_t kind : 2;
    uint32_t v : 30; // GM_CHAR: charset index; GM_RULE: rule index
} gm_elem;

typedef struct gm_range {
    uint32_t lo, hi; // inclusive code points
} gm_range;

typedef struct gm_cset {
    uint32_t first, n; // ranges[first .. first + n)
    bool neg;          // matches code points in none of the ranges
} gm_cset;

typedef struct gm_rule {
    char *name;         // owned
    uint32_t alt_first; // alts[alt_first .. alt_first + n_alts): start positions in elems
    uint32_t n_alts;
    bool defined;
    int ref_line, ref_col; // first reference (for "undefined rule" errors)
} gm_rule;

/* What the top frames of a stack alone decide about each token (see
 * gm__pmask_build): computed once per (grammar, vocabulary, frames), on
 * first use, by whichever matcher needs it. */
typedef struct gm_pmask {
    bool inexact;     // its walk passed a bound: states with this top use the full walk
    uint32_t growth;  // the deepest stack its walk built (the top alone is 1)
    int32_t n_acc;    // accepted whatever lies below the top
    uint32_t *acc;    // as a bitset (words of the vocabulary), when dense
    int32_t *acc_ids; // else as ids
    int32_t n_unc;    // decided by what lies below: checked against the whole state
    uint32_t *unc;    // their ranks in the trie order (grammar_vocab order), ascending
    size_t bytes;
} gm_pmask;

#define GM__CTX 4 // at most this many frames from the top key the precomputed classes

typedef struct gm_pkey {
    uint32_t k;            // frames (fewer than GM__CTX: the whole stack)
    uint32_t pos[GM__CTX]; // their positions, top first
    gm_pmask *pm;
} gm_pkey;

typedef struct gm_cache_ent {
    uint32_t *key, key_len; // owned (gm__key_build)
    uint32_t *bits;         // owned, the mask
    int32_t n_allowed;
    uint64_t used;
    uint32_t growth; // the walk's deepest node minus its shallowest read frame
} gm_cache_ent;

#define GM__SHARED 64 // whole masks per (grammar, vocabulary), shared by its matchers

/* The classes for one vocabulary (gv uid): a hash table under a mutex
 * (looked up a few times per mask; built outside the lock); and whole
 * masks by state key (gm__key_build), shared by every matcher of the
 * grammar under the same mutex, least recently used replaced. */
typedef struct gm_vtab {
    uint64_t uid;
    struct gm_vtab *next;
    pthread_mutex_t mu;
    gm_pkey *ht; // (cap, a power of two; k 0: empty)
    uint32_t n, cap;
    gm_cache_ent shared[GM__SHARED];
    uint64_t clock;
} gm_vtab;

#define GM__PM_MAX_BYTES ((size_t)128 << 20)   // precomputed classes of one grammar
#define GM__PM_TOTAL_BYTES ((size_t)512 << 20) // of all grammars alive
extern atomic_size_t grammar__pm_total;        // their bytes now (grammar.c)

struct grammar {
    atomic_int refs;
    _Atomic(gm_vtab *) vtabs; // precomputed token classes, per vocabulary
    atomic_size_t pm_bytes;   // their size
    gm_elem *elems;
    uint32_t n_elems, cap_elems;
    uint32_t *alts;
    uint32_t n_alts, cap_alts;
    gm_range *ranges;
    uint32_t n_ranges, cap_ranges;
    gm_cset *csets;
    uint32_t n_csets, cap_csets;
    gm_rule *rules;
    uint32_t n_rules, cap_rules;
    uint32_t root;
    // name -> rule index (open addressing; -1 empty)
    int32_t *ht;
    uint32_t ht_cap;
    char *text; // the GBNF source (grammar_text), NUL-terminated
    size_t text_len;
};

/* Grows *p (elements of sz bytes) to hold need; false on out-of-memory. */
static inline bool gm__grow(void **p, uint32_t *cap, uint32_t need, size_t sz) {
    if (need <= *cap) return true;
    uint32_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, (size_t)c * sz);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

// ----------------------------------------------------------------------------
// Matcher

typedef struct gm_node {
    uint32_t pos;   // element position: a CHAR (top) or a return position
    int32_t parent; // node index, -1: bottom
    uint32_t depth; // nodes in this stack
} gm_node;

/* A matcher state: tops in the tops arena, plus a pending UTF-8 prefix. */
typedef struct gm_state {
    uint32_t off, n; // tops[off .. off + n): node indices whose pos is a CHAR
    bool complete;   // the root can end here
    uint8_t need;    // continuation bytes still expected (0: on a character boundary)
    uint8_t len;     // bytes of the pending character (2..4), 0 when none
    uint32_t cp;     // bits of the pending character so far
} gm_state;

#define GM__TABLE 32768 // > 1.6 * GRAMMAR_MAX_WORK: the (pos, parent) dedup table
#define GM__MAX_NODES (1u << 22)
#define GM__CACHE 32
#define GM__CACHE_MIN_VISITS 2000 // walks cheaper than this are not cached
#define GM__KEY_MAX 4096
#define GM__HC 32768 // the node sharing table (lossy: a slot keeps the last node)

struct grammar_matcher {
    grammar *g;
    gm_node *nodes, *nodes2;
    uint32_t n_nodes, cap_nodes, cap_nodes2;
    int32_t *tops, *tops2;
    uint32_t n_tops, cap_tops, cap_tops2;
    int32_t *hc;  // (GM__HC) node index by hash of (pos, parent), -1: none
    int32_t *fwd; // compaction forwarding (cap_fwd)
    uint32_t cap_fwd;
    gm_state cur;
    // closure scratch
    uint64_t *tkey;
    uint32_t *tstamp;
    uint32_t stamp;
    uint64_t *work; // (GRAMMAR_MAX_WORK) pending (pos, parent) pairs
    bool overflow;
    // mask cache
    gm_cache_ent cache[GM__CACHE];
    uint64_t clock;
    uint32_t *keybuf;        // (GM__KEY_MAX)
    uint32_t words;          // mask words of the cached entries
    struct gm_frame *frames; // (cap_frames) the trie walk's stack
    uint32_t cap_frames;
    // what a mask walk read of the state below its tops (for the cache key)
    bool walking;       // inside grammar_matcher_mask's walk
    uint32_t walk_base; // nodes below this index are the state's own
    uint8_t *touched;   // (cap_touched) state nodes some path popped into
    uint32_t cap_touched;
    bool touched_bottom;     // some path popped past the bottom (the root ended)
    bool walk_hit_depth;     // some path died at GRAMMAR_MAX_DEPTH
    uint32_t walk_max_depth; // deepest node created by the walk
    bool bound_hit;          // a closure passed GRAMMAR_MAX_WORK/_STACKS or the arena's size
    bool ambiguous;          // the last accept or mask dropped parses at such a bound
    uint32_t close_steps;    // the last gm__close's steps
    // the mask's precomputed path (gm__mask_fast): scratch
    const gm_pmask **tpm; // (cap_tpm) each top's classes, then the distinct ones
    uint32_t cap_tpm;
    uint32_t *cand2; // (cap_cand2) merge scratch
    uint32_t cap_cand2;
    uint32_t *cand; // (cap_cand) ranks to check against the whole state
    uint32_t cap_cand;
    gm_state *pstk;      // (gv max_len + 1) states along the checked piece
    uint32_t *pmn, *pmt; // their arena marks
    uint32_t cap_pstk, cap_pmn, cap_pmt;
};

// ----------------------------------------------------------------------------
// Between the module's files

/* Frees g and its token classes (the last reference, or a failed compile). */
void grammar__free(grammar *g);
/* Frees one token class entry; accepts NULL. */
void grammar__pmask_free(gm_pmask *pm);
/* Refuses a grammar in which one character opens more parses than the
 * matcher's bounds (see match.c); m is a fresh matcher of it. */
ks_err grammar__check_bounded(grammar_matcher *m, ks_errbuf *eb);
/* A new parse-stack node: 0, 1 when too deep (that path dies), -1 when the
 * arena is full or out of memory. */
int grammar__node_new(grammar_matcher *m, uint32_t pos, int32_t parent, int32_t *out);
/* Adds node idx as a top of st; false past GRAMMAR_MAX_STACKS or out of memory. */
bool grammar__top_add(grammar_matcher *m, gm_state *st, int32_t idx);
/* Advances state in by one byte into *out; false: rejected. */
bool grammar__advance(grammar_matcher *m, const gm_state *in, uint8_t b, gm_state *out);

#endif /* KS_GRAMMAR_INT_H */
