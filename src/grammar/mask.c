/* mask.c — vocabulary tries and token masks (see grammar.h): the byte trie
 * of a vocabulary's pieces, the token classes a grammar precomputes per
 * (vocabulary, top frames), the per-matcher and per-grammar mask caches,
 * and the mask side of a constrained draw (the engine's grammar_sample
 * draws between grammar_matcher_mask_logits and
 * grammar_matcher_accept_pick). Walks the matcher of match.c; layout:
 * grammar_int.h.
 *
 * The mask (grammar_matcher_mask): most of a token's fate is decided by
 * the top few frames of one stack. For the top frames of a stack (its
 * key: the top, and the frames below it while each ends its rule at once,
 * at most GM__CTX; gm__thin), one trie walk from those frames alone, with nothing below,
 * splits the vocabulary into accepted (some parse consumes the piece
 * without popping past the last frame: true under any stack below),
 * undecided (every parse died, but one popped past the last frame on the
 * way: the stack below decides) and refused. These classes are computed
 * once per (grammar, vocabulary, key), on first use, and shared by every
 * matcher of the grammar (a table under a mutex in the grammar; building
 * happens outside the lock). A mask is then the union of its tops'
 * accepted sets plus the undecided ids that the whole state accepts,
 * checked piece by piece in trie order so common prefixes share their
 * states. For JSON, a string's characters are accepted by one class and
 * only pieces holding a quote are checked. Where the classes do not apply
 * (inside a UTF-8 character, a class whose walk passed a bound, a stack
 * too deep for a class's growth, the classes' memory cap) the mask walks
 * the whole trie from the whole state as before. Whole masks are also
 * cached per matcher, keyed by what the computation read (below). */
#include "grammar_int.h"

#include <math.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Vocabulary trie and the mask

typedef struct gv_node {
    int32_t first_child, next_sibling; // -1: none
    int32_t tok;                       // first token ending here, -1: none (more via tok_next)
    uint8_t byte;
} gv_node;

struct grammar_vocab {
    int32_t n_vocab;
    gv_node *nodes;
    uint32_t n_nodes, cap_nodes;
    int32_t *tok_next;   // (n_vocab) next token with the same piece, -1: none
    int32_t *tok_node;   // (n_vocab) trie node of each token's piece, -1: not in the trie
    uint32_t *piece_off; // (n_vocab + 1) each token's piece in pieces
    char *pieces;
    uint32_t n_pieces, cap_pieces;
    uint32_t max_len; // longest piece
    const tok_vocab *v;
    int32_t *eog; // (n_eog) the end-of-generation ids, ascending
    int32_t n_eog;
    uint64_t uid; // unique per trie ever built (keys the grammars' precomputed classes)
    // trie preorder: order[sub_lo[n] .. sub_hi[n]) are the ids of node n's subtree
    int32_t *order; // (n_order) ids in the trie, by piece
    int32_t n_order;
    uint32_t *rank; // (n_vocab) each id's index in order (ids not in the trie: UINT32_MAX)
    uint32_t *sub_lo, *sub_hi; // (n_nodes)
};

static atomic_uint_fast64_t gv__next_uid = 1;

/* Fills order, rank, sub_lo and sub_hi (iterative preorder walk). */
static bool gv__order(grammar_vocab *gv) {
    gv->order = malloc(((size_t)gv->n_vocab + 1) * sizeof *gv->order);
    gv->rank = malloc(((size_t)gv->n_vocab + 1) * sizeof *gv->rank);
    gv->sub_lo = malloc(gv->n_nodes * sizeof *gv->sub_lo);
    gv->sub_hi = malloc(gv->n_nodes * sizeof *gv->sub_hi);
    int32_t *stk = malloc(((size_t)gv->max_len + 2) * sizeof *stk);
    if (!gv->order || !gv->rank || !gv->sub_lo || !gv->sub_hi || !stk) {
        free(stk);
        return false;
    }
    for (int32_t id = 0; id < gv->n_vocab; id++)
        gv->rank[id] = UINT32_MAX;
    uint32_t n = 0, sp = 0;
    stk[sp++] = 0;
    gv->sub_lo[0] = 0;
    // a node is entered when pushed (its tokens emitted), left when popped
    // after its last child; stk holds the path, each entry's next child is
    // found from the child last left (next_sibling)
    int32_t left = -1; // the node just left, -1: none yet at this level
    while (sp) {
        int32_t u = stk[sp - 1];
        int32_t c = left < 0 ? gv->nodes[u].first_child : gv->nodes[left].next_sibling;
        if (c >= 0) {
            gv->sub_lo[c] = n;
            for (int32_t t = gv->nodes[c].tok; t >= 0; t = gv->tok_next[t]) {
                gv->rank[t] = n;
                gv->order[n++] = t;
            }
            stk[sp++] = c;
            left = -1;
            continue;
        }
        gv->sub_hi[u] = n;
        left = u;
        sp--;
    }
    gv->n_order = (int32_t)n;
    free(stk);
    return true;
}

int32_t grammar_vocab_n(const grammar_vocab *gv) { return gv->n_vocab; }

void grammar_vocab_destroy(grammar_vocab *gv) {
    if (!gv) return;
    free(gv->nodes);
    free(gv->tok_next);
    free(gv->tok_node);
    free(gv->piece_off);
    free(gv->pieces);
    free(gv->eog);
    free(gv->order);
    free(gv->rank);
    free(gv->sub_lo);
    free(gv->sub_hi);
    free(gv);
}

/* Where grammar_vocab pieces come from: a tok_vocab, or arrays. */
typedef struct gv_src {
    const tok_vocab *v;
    const char *const *pieces;
    const uint32_t *lens;
    int32_t n;
} gv_src;

static ks_err gv__create(const gv_src *src, grammar_vocab **out, ks_errbuf *eb) {
    *out = NULL;
    grammar_vocab *gv = calloc(1, sizeof *gv);
    const tok_vocab *v = src->v;
    int32_t V = v ? tok_n_vocab(v) : src->n;
    size_t cap = v ? tok_max_piece(v) + 1 : 0;
    char *buf = cap ? malloc(cap) : NULL;
    if (!gv || (cap && !buf)) goto nomem;
    gv->n_vocab = V;
    gv->tok_next = malloc(((size_t)V + 1) * sizeof *gv->tok_next);
    gv->tok_node = malloc(((size_t)V + 1) * sizeof *gv->tok_node);
    gv->piece_off = malloc(((size_t)V + 1) * sizeof *gv->piece_off);
    gv->eog = malloc(((size_t)V + 1) * sizeof *gv->eog);
    gv->v = v;
    if (!gv->tok_next || !gv->tok_node || !gv->piece_off || !gv->eog ||
        !gm__grow((void **)&gv->nodes, &gv->cap_nodes, 1024, sizeof *gv->nodes))
        goto nomem;
    gv->nodes[0] = (gv_node){-1, -1, -1, 0};
    gv->n_nodes = 1;
    for (int32_t id = 0; id < V; id++) {
        gv->tok_next[id] = -1;
        gv->tok_node[id] = -1;
        gv->piece_off[id] = gv->n_pieces;
        gv->piece_off[id + 1] = gv->n_pieces;
        if (v && tok_is_eog(v, id)) {
            gv->eog[gv->n_eog++] = id;
            continue;
        }
        const char *pc;
        size_t n;
        if (v) {
            n = tok_piece(v, id, false, buf, cap);
            if (n == 0 || n > cap) continue;
            pc = buf;
        } else {
            pc = src->pieces[id];
            n = src->lens[id];
            if (n == 0 || n > 4096) continue;
        }
        if (!gm__grow((void **)&gv->pieces, &gv->cap_pieces, gv->n_pieces + (uint32_t)n,
                      sizeof *gv->pieces))
            goto nomem;
        memcpy(gv->pieces + gv->n_pieces, pc, n);
        gv->n_pieces += (uint32_t)n;
        gv->piece_off[id + 1] = gv->n_pieces;
        int32_t cur = 0;
        for (size_t i = 0; i < n; i++) {
            uint8_t b = (uint8_t)pc[i];
            int32_t c = gv->nodes[cur].first_child, prev = -1;
            while (c >= 0 && gv->nodes[c].byte < b)
                prev = c, c = gv->nodes[c].next_sibling;
            if (c < 0 || gv->nodes[c].byte != b) {
                if (!gm__grow((void **)&gv->nodes, &gv->cap_nodes, gv->n_nodes + 1,
                              sizeof *gv->nodes))
                    goto nomem;
                int32_t nn = (int32_t)gv->n_nodes++;
                gv->nodes[nn] = (gv_node){-1, c, -1, b};
                if (prev < 0)
                    gv->nodes[cur].first_child = nn;
                else
                    gv->nodes[prev].next_sibling = nn;
                c = nn;
            }
            cur = c;
        }
        gv->tok_next[id] = gv->nodes[cur].tok;
        gv->nodes[cur].tok = id;
        gv->tok_node[id] = cur;
        if (n > gv->max_len) gv->max_len = (uint32_t)n;
    }
    if (!gv__order(gv)) goto nomem;
    gv->uid = atomic_fetch_add(&gv__next_uid, 1);
    free(buf);
    *out = gv;
    return KS_OK;
nomem:
    free(buf);
    grammar_vocab_destroy(gv);
    return ks_seterr(eb, KS_ERR_NOMEM, "grammar vocabulary trie: out of memory");
}

ks_err grammar_vocab_create(const tok_vocab *v, grammar_vocab **out, ks_errbuf *eb) {
    KS_ASSERT(v && out);
    gv_src src = {.v = v};
    return gv__create(&src, out, eb);
}

ks_err grammar_vocab_create_pieces(const char *const *pieces, const uint32_t *lens, int32_t n,
                                   grammar_vocab **out, ks_errbuf *eb) {
    KS_ASSERT(out && n >= 0 && (pieces || !n) && (lens || !n));
    gv_src src = {.pieces = pieces, .lens = lens, .n = n};
    return gv__create(&src, out, eb);
}

bool grammar_matcher_accept_token(grammar_matcher *m, const grammar_vocab *gv, int32_t id) {
    if (id < 0 || id >= gv->n_vocab || gv->tok_node[id] < 0) return false;
    return grammar_matcher_accept(m, gv->pieces + gv->piece_off[id],
                                  gv->piece_off[id + 1] - gv->piece_off[id]);
}

/* Cache keys. A mask walk reads the state's tops (their positions) and,
 * below them, only the frames some path popped into (touched); nodes
 * under the first untouched frame of a stack are never reached. So the
 * mask of another state whose stacks agree on those positions is the same
 * (its walk makes exactly the same steps), wherever the stacks continue
 * below: a string inside any object shares one entry. Key layout: pending
 * bits and their count, number of tops, then per top its length L, L
 * positions from the top down, and a marker (1: the stack ends there, at
 * the bottom, and the walk popped past it; 0: what lies below was never
 * read). The depth bound is the one thing below that still matters: an
 * entry records how far its walk grew past its shallowest read frame, and
 * is used only where that growth stays within GRAMMAR_MAX_DEPTH. Returns
 * the key's length in m->keybuf, 0 when too long to cache. */
static uint32_t gm__key_build(grammar_matcher *m, const gm_state *st, uint32_t *min_depth) {
    uint32_t *k = m->keybuf, n = 0;
    *min_depth = UINT32_MAX;
    k[n++] = (uint32_t)st->need | ((uint32_t)st->len << 4);
    k[n++] = st->cp;
    k[n++] = st->n;
    for (uint32_t i = 0; i < st->n; i++) {
        uint32_t at = n++, len = 0;
        int32_t y = m->tops[st->off + i];
        bool bottom = false;
        for (;;) {
            if (n + 3 >= GM__KEY_MAX) return 0;
            k[n++] = m->nodes[y].pos;
            len++;
            if (m->nodes[y].depth < *min_depth) *min_depth = m->nodes[y].depth;
            int32_t pa = m->nodes[y].parent;
            if (pa < 0) {
                bottom = m->touched_bottom;
                break;
            }
            if (!m->touched[pa]) break;
            y = pa;
        }
        k[at] = len;
        k[n++] = bottom;
    }
    return n;
}

/* True when state st matches key k (see gm__key_build). */
static bool gm__key_match(const grammar_matcher *m, const gm_state *st, const uint32_t *k) {
    if (k[0] != ((uint32_t)st->need | ((uint32_t)st->len << 4)) || k[1] != st->cp || k[2] != st->n)
        return false;
    uint32_t n = 3;
    for (uint32_t i = 0; i < st->n; i++) {
        uint32_t len = k[n++];
        int32_t y = m->tops[st->off + i];
        for (uint32_t j = 0; j < len; j++) {
            if (y < 0 || m->nodes[y].pos != k[n++]) return false;
            if (j + 1 < len) y = m->nodes[y].parent;
        }
        if (k[n++] && m->nodes[y].parent >= 0) return false; // the walk popped past the bottom
    }
    return true;
}

struct gm_frame {
    int32_t node, child; // trie node and its next child to try
    gm_state st;         // matcher state after node's bytes
    uint32_t mn, mt;     // arena marks to rewind to before each child
    bool esc;            // (gm__pmask_build) some parse escaped on node's bytes
};

/* The full walk: every trie node advanced from the whole state (the
 * arena past its end is scratch). Sets bits, returns the ids set; *visits
 * counts the advances. */
static int32_t gm__walk(grammar_matcher *m, const grammar_vocab *gv, uint32_t *bits,
                        uint32_t *visits) {
    struct gm_frame *fr = m->frames;
    uint32_t sp = 0;
    int32_t count = 0;
    fr[sp++] = (struct gm_frame){0, gv->nodes[0].first_child, m->cur, m->n_nodes, m->n_tops, false};
    while (sp) {
        struct gm_frame *f = &fr[sp - 1];
        int32_t c = f->child;
        if (c < 0) {
            sp--;
            continue;
        }
        const gv_node *cn = &gv->nodes[c];
        f->child = cn->next_sibling;
        m->n_nodes = f->mn;
        m->n_tops = f->mt;
        (*visits)++;
        gm_state ns;
        if (!grammar__advance(m, &f->st, cn->byte, &ns)) continue;
        for (int32_t t = cn->tok; t >= 0; t = gv->tok_next[t]) {
            bits[t >> 5] |= 1u << (t & 31);
            count++;
        }
        if (cn->first_child >= 0 && sp < m->cap_frames)
            fr[sp++] = (struct gm_frame){c, cn->first_child, ns, m->n_nodes, m->n_tops, false};
    }
    return count;
}

/* Appends x to a growing array; false on out-of-memory. */
static bool gm__push_u32(uint32_t **a, uint32_t *n, uint32_t *cap, uint32_t x) {
    if (!gm__grow((void **)a, cap, *n + 1, sizeof **a)) return false;
    (*a)[(*n)++] = x;
    return true;
}

/* Classifies every token for the stack of frames key->pos (top first; what
 * lies below is unknown, and a parse that pops past the last frame
 * "escapes"): accepted when some parse consumes the whole piece without
 * escaping (the stack below is never read: accepted under any stack,
 * depth permitting); undecided when none does but some escaped on the way
 * (the stack below decides); refused otherwise. One trie walk, pruned
 * where every parse died without escaping. Uses m's arena past its end
 * and its closure scratch (not its walk's bookkeeping, which is saved).
 * NULL: out of memory. */
static gm_pmask *gm__pmask_build(grammar_matcher *m, const grammar_vocab *gv, const gm_pkey *key) {
    const uint32_t words = ((uint32_t)gv->n_vocab + 31) / 32;
    gm_pmask *pm = calloc(1, sizeof *pm);
    uint32_t *acc = calloc(words ? words : 1, sizeof *acc);
    uint32_t *unc = NULL, n_unc = 0, cap_unc = 0;
    const uint32_t base_nodes = m->n_nodes, base_tops = m->n_tops;
    const bool walking = m->walking, hit_depth = m->walk_hit_depth, bound = m->bound_hit;
    const uint32_t max_depth = m->walk_max_depth;
    bool ok = pm && acc;
    int32_t idx = -1;
    for (uint32_t j = key->k; ok && j-- > 0;)
        ok = grammar__node_new(m, key->pos[j], idx, &idx) == 0;
    gm_state st0 = {.off = m->n_tops};
    if (ok) ok = grammar__top_add(m, &st0, idx);
    m->walking = false;
    m->bound_hit = false;
    m->walk_max_depth = key->k;
    struct gm_frame *fr = m->frames;
    uint32_t sp = 0;
    if (ok)
        fr[sp++] =
            (struct gm_frame){0, gv->nodes[0].first_child, st0, m->n_nodes, m->n_tops, false};
    while (ok && sp) {
        struct gm_frame *f = &fr[sp - 1];
        int32_t c = f->child;
        if (c < 0) {
            sp--;
            continue;
        }
        const gv_node *cn = &gv->nodes[c];
        f->child = cn->next_sibling;
        m->n_nodes = f->mn;
        m->n_tops = f->mt;
        gm_state ns;
        const bool adv = grammar__advance(m, &f->st, cn->byte, &ns);
        const bool esc = f->esc || (adv && ns.complete), alive = adv && ns.n > 0;
        if (alive) {
            for (int32_t t = cn->tok; t >= 0; t = gv->tok_next[t]) {
                acc[t >> 5] |= 1u << (t & 31);
                pm->n_acc++;
            }
            if (cn->first_child >= 0 && sp < m->cap_frames)
                fr[sp++] = (struct gm_frame){c, cn->first_child, ns, m->n_nodes, m->n_tops, esc};
        } else if (esc) { // dead here, but a parse left the frames on the way
            for (uint32_t k = gv->sub_lo[c]; k < gv->sub_hi[c] && ok; k++)
                ok = gm__push_u32(&unc, &n_unc, &cap_unc, k);
        }
    }
    m->n_nodes = base_nodes;
    m->n_tops = base_tops;
    if (pm) {
        pm->inexact = m->bound_hit;
        pm->growth = m->walk_max_depth;
    }
    m->walking = walking;
    m->walk_hit_depth = hit_depth;
    m->bound_hit = bound;
    m->walk_max_depth = max_depth;
    if (ok && (uint32_t)pm->n_acc < words) { // sparse: as ids
        pm->acc_ids = malloc(((size_t)pm->n_acc + 1) * sizeof *pm->acc_ids);
        ok = pm->acc_ids != NULL;
        for (uint32_t w = 0, n = 0; ok && w < words; w++)
            for (uint32_t b = acc[w]; b; b &= b - 1)
                pm->acc_ids[n++] = (int32_t)(w * 32 + (uint32_t)__builtin_ctz(b));
        free(acc);
        acc = NULL;
    }
    if (!ok) {
        free(acc);
        free(unc);
        grammar__pmask_free(pm);
        return NULL;
    }
    pm->acc = acc;
    pm->unc = unc;
    pm->n_unc = (int32_t)n_unc;
    pm->bytes = sizeof *pm + (acc ? words * sizeof *acc : (size_t)pm->n_acc * sizeof(int32_t)) +
                n_unc * sizeof(uint32_t);
    return pm;
}

/* The vocabulary's table in g, created on first use; NULL on out-of-memory. */
static gm_vtab *gm__vtab(grammar *g, uint64_t uid) {
    gm_vtab *head = atomic_load_explicit(&g->vtabs, memory_order_acquire);
    for (gm_vtab *t = head; t; t = t->next)
        if (t->uid == uid) return t;
    gm_vtab *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->uid = uid;
    if (pthread_mutex_init(&t->mu, NULL)) {
        free(t);
        return NULL;
    }
    for (;;) {
        t->next = head;
        if (atomic_compare_exchange_weak_explicit(&g->vtabs, &head, t, memory_order_acq_rel,
                                                  memory_order_acquire))
            return t;
        for (gm_vtab *u = head; u; u = u->next) // another thread pushed one meanwhile
            if (u->uid == uid) {
                pthread_mutex_destroy(&t->mu);
                free(t);
                return u;
            }
    }
}

static uint32_t gm__pkey_hash(const gm_pkey *k) {
    uint32_t h = k->k * 0x9E3779B1u;
    for (uint32_t j = 0; j < k->k; j++)
        h = (h ^ k->pos[j]) * 0x85EBCA6Bu;
    return h ^ (h >> 15);
}

static bool gm__pkey_eq(const gm_pkey *a, const gm_pkey *b) {
    return a->k == b->k && !memcmp(a->pos, b->pos, a->k * sizeof *a->pos);
}

/* The slot of key in vt's table (vt->mu held): its entry or the empty slot
 * where it goes. */
static gm_pkey *gm__pkey_slot(gm_vtab *vt, const gm_pkey *key) {
    uint32_t h = gm__pkey_hash(key) & (vt->cap - 1);
    while (vt->ht[h].k && !gm__pkey_eq(&vt->ht[h], key))
        h = (h + 1) & (vt->cap - 1);
    return &vt->ht[h];
}

/* key's classes, built and published on first use; NULL when out of
 * memory or when g's classes reached GM__PM_MAX_BYTES. */
static const gm_pmask *gm__pmask(grammar_matcher *m, const grammar_vocab *gv, gm_vtab *vt,
                                 const gm_pkey *key) {
    gm_pmask *pm = NULL;
    pthread_mutex_lock(&vt->mu);
    if (vt->cap) pm = gm__pkey_slot(vt, key)->pm;
    pthread_mutex_unlock(&vt->mu);
    if (pm) return pm;
    if (atomic_load_explicit(&m->g->pm_bytes, memory_order_relaxed) > GM__PM_MAX_BYTES ||
        atomic_load_explicit(&grammar__pm_total, memory_order_relaxed) > GM__PM_TOTAL_BYTES)
        return NULL;
    pm = gm__pmask_build(m, gv, key);
    if (!pm) return NULL;
    pthread_mutex_lock(&vt->mu);
    gm_pmask *have = vt->cap ? gm__pkey_slot(vt, key)->pm : NULL;
    bool ok = have != NULL;
    if (!have && (vt->n + 1) * 2 > vt->cap) { // grow (rehash)
        uint32_t cap = vt->cap ? vt->cap * 2 : 64;
        gm_pkey *ht = calloc(cap, sizeof *ht), *old = vt->ht;
        uint32_t old_cap = vt->cap;
        if (ht) {
            vt->ht = ht;
            vt->cap = cap;
            for (uint32_t i = 0; i < old_cap; i++)
                if (old[i].k) *gm__pkey_slot(vt, &old[i]) = old[i];
            free(old);
        }
    }
    if (!have && (vt->n + 1) * 2 <= vt->cap) {
        gm_pkey *slot = gm__pkey_slot(vt, key);
        *slot = *key;
        slot->pm = pm;
        vt->n++;
        ok = true;
        atomic_fetch_add_explicit(&m->g->pm_bytes, pm->bytes, memory_order_relaxed);
        atomic_fetch_add_explicit(&grammar__pm_total, pm->bytes, memory_order_relaxed);
    }
    pthread_mutex_unlock(&vt->mu);
    if (have || !ok) grammar__pmask_free(pm); // another matcher was first, or no memory
    return have ? have : ok ? pm : NULL;
}

/* True when the frame at pos (the top's CHAR when top, else a return
 * position) ends its rule at once: a CHAR or a tail call then END. Its
 * classes alone would leave nearly every token undecided (JSON's `char`
 * rule), so the key takes the frame below too. A frame with more of its
 * rule to come (x ::= [a-z] x, a literal's next character) decides most
 * tokens alone, and a key of fewer frames is shared by more stacks. */
static bool gm__thin(const grammar *g, uint32_t pos, bool top) {
    if (top) return g->elems[pos + 1].kind == GM_END;
    return g->elems[pos].kind == GM_END || g->elems[pos + 1].kind == GM_END;
}

static int gm__cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (const gm_pmask *const *)a,
              y = (uintptr_t) * (const gm_pmask *const *)b;
    return x < y ? -1 : x > y;
}

/* The mask from the tops' precomputed classes: the union of what each top
 * (with up to GM__CTX - 1 frames below it) accepts alone, plus the
 * undecided ids that a check against the whole state accepts (in trie
 * order, sharing the states of common prefixes). Returns 1 when done
 * (bits, *count), 0 when it does not apply (a pending character, classes
 * that passed a bound or the memory cap, a stack too deep for a class's
 * growth: the caller walks), -1 on out-of-memory. *visits counts the
 * advances, *max_new the deepest stack the classes imply. The frames each
 * class read are marked touched (the cache key). */
static int gm__mask_fast(grammar_matcher *m, const grammar_vocab *gv, uint32_t *bits,
                         int32_t *count, uint32_t *visits, uint32_t *max_new) {
    const gm_state cur = m->cur;
    const uint32_t words = ((uint32_t)gv->n_vocab + 31) / 32;
    if (cur.need || !cur.n) return 0;
    gm_vtab *vt = gm__vtab(m->g, gv->uid);
    if (!vt || !gm__grow((void **)&m->tpm, &m->cap_tpm, cur.n, sizeof *m->tpm) ||
        !gm__grow((void **)&m->pstk, &m->cap_pstk, gv->max_len + 1, sizeof *m->pstk) ||
        !gm__grow((void **)&m->pmn, &m->cap_pmn, gv->max_len + 1, sizeof *m->pmn) ||
        !gm__grow((void **)&m->pmt, &m->cap_pmt, gv->max_len + 1, sizeof *m->pmt))
        return -1;
    *max_new = 0;
    for (uint32_t i = 0; i < cur.n; i++) {
        int32_t y = m->tops[cur.off + i];
        const uint32_t d = m->nodes[y].depth;
        gm_pkey key = {0};
        for (;;) {
            key.pos[key.k++] = m->nodes[y].pos;
            int32_t pa = m->nodes[y].parent;
            if (pa < 0) {
                m->touched_bottom = true; // the class saw the bottom
                break;
            }
            if (key.k == GM__CTX || !gm__thin(m->g, m->nodes[y].pos, key.k == 1)) break;
            if ((uint32_t)pa < m->walk_base) m->touched[pa] = 1;
            y = pa;
        }
        const gm_pmask *pm = gm__pmask(m, gv, vt, &key);
        if (!pm || pm->inexact) return 0; // (out of memory: the walk reports it)
        const uint32_t dn = d - key.k + pm->growth;
        if (dn > GRAMMAR_MAX_DEPTH) return 0;
        if (dn > *max_new) *max_new = dn;
        m->tpm[i] = pm;
    }
    uint32_t n_pm = cur.n;
    if (n_pm > 1) {
        qsort(m->tpm, n_pm, sizeof *m->tpm, gm__cmp_ptr);
        uint32_t u = 0;
        for (uint32_t i = 0; i < n_pm; i++)
            if (!u || m->tpm[u - 1] != m->tpm[i]) m->tpm[u++] = m->tpm[i];
        n_pm = u;
    }
    memset(bits, 0, words * sizeof *bits);
    uint32_t n_cand = 0;
    for (uint32_t i = 0; i < n_pm; i++) {
        const gm_pmask *pm = m->tpm[i];
        if (pm->acc)
            for (uint32_t w = 0; w < words; w++)
                bits[w] |= pm->acc[w];
        else
            for (int32_t k = 0; k < pm->n_acc; k++)
                bits[pm->acc_ids[k] >> 5] |= 1u << (pm->acc_ids[k] & 31);
        // merge the undecided ranks (each list ascending) into cand
        if (!pm->n_unc) continue;
        if (!gm__grow((void **)&m->cand2, &m->cap_cand2, n_cand + (uint32_t)pm->n_unc,
                      sizeof *m->cand2))
            return -1;
        uint32_t a = 0, b = 0, n = 0;
        while (a < n_cand || b < (uint32_t)pm->n_unc) {
            uint32_t x;
            if (b >= (uint32_t)pm->n_unc || (a < n_cand && m->cand[a] <= pm->unc[b])) {
                x = m->cand[a++];
                if (b < (uint32_t)pm->n_unc && pm->unc[b] == x) b++;
            } else {
                x = pm->unc[b++];
            }
            m->cand2[n++] = x;
        }
        uint32_t *t = m->cand;
        m->cand = m->cand2;
        m->cand2 = t;
        uint32_t tc = m->cap_cand;
        m->cap_cand = m->cap_cand2;
        m->cap_cand2 = tc;
        n_cand = n;
    }
    // check each against the whole state; pstk[k] is the state after k
    // bytes of the previous piece, valid for k <= have (dead: the byte at
    // have was refused there)
    const char *prev = NULL;
    uint32_t have = 0;
    bool dead = false;
    m->pstk[0] = cur;
    m->pmn[0] = m->n_nodes;
    m->pmt[0] = m->n_tops;
    for (uint32_t i = 0; i < n_cand; i++) {
        const int32_t id = gv->order[m->cand[i]];
        if (bits[id >> 5] >> (id & 31) & 1u) continue; // another top accepts it
        const char *pc = gv->pieces + gv->piece_off[id];
        const uint32_t L = gv->piece_off[id + 1] - gv->piece_off[id];
        uint32_t l = 0;
        const uint32_t lim = dead ? have + 1 : have; // bytes of prev known
        if (prev)
            while (l < L && l < lim && pc[l] == prev[l])
                l++;
        if (dead && l > have) continue; // the same refused prefix
        m->n_nodes = m->pmn[l];
        m->n_tops = m->pmt[l];
        prev = pc;
        dead = false;
        have = l;
        for (uint32_t k = l; k < L; k++) {
            (*visits)++;
            if (!grammar__advance(m, &m->pstk[k], (uint8_t)pc[k], &m->pstk[k + 1])) {
                dead = true;
                break;
            }
            m->pmn[k + 1] = m->n_nodes;
            m->pmt[k + 1] = m->n_tops;
            have = k + 1;
        }
        if (!dead) bits[id >> 5] |= 1u << (id & 31);
    }
    int32_t n = 0;
    for (uint32_t w = 0; w < words; w++)
        n += __builtin_popcount(bits[w]);
    *count = n;
    return 1;
}

/* Copies entry c into vt's shared masks (the least recently used slot);
 * dropped on out-of-memory. */
static void gm__shared_put(gm_vtab *vt, const gm_cache_ent *c, uint32_t words) {
    if (!vt) return;
    gm_cache_ent e = *c;
    e.key = malloc(c->key_len * sizeof *e.key);
    e.bits = malloc(words * sizeof *e.bits);
    if (!e.key || !e.bits) {
        free(e.key);
        free(e.bits);
        return;
    }
    memcpy(e.key, c->key, c->key_len * sizeof *e.key);
    memcpy(e.bits, c->bits, words * sizeof *e.bits);
    pthread_mutex_lock(&vt->mu);
    int v = 0;
    for (int i = 1; i < GM__SHARED && vt->shared[v].bits; i++)
        if (!vt->shared[i].bits || vt->shared[i].used < vt->shared[v].used) v = i;
    gm_cache_ent old = vt->shared[v];
    e.used = ++vt->clock;
    vt->shared[v] = e;
    pthread_mutex_unlock(&vt->mu);
    free(old.key);
    free(old.bits);
}

ks_err grammar_matcher_mask(grammar_matcher *m, const grammar_vocab *gv, uint32_t *bits,
                            int32_t *n_allowed) {
    const uint32_t words = ((uint32_t)gv->n_vocab + 31) / 32;
    *n_allowed = 0;
    if (m->words != words) { // another vocabulary: drop the cache
        for (int i = 0; i < GM__CACHE; i++) {
            free(m->cache[i].key);
            free(m->cache[i].bits);
            memset(&m->cache[i], 0, sizeof m->cache[i]);
        }
        m->words = words;
    }
    m->clock++;
    uint32_t max_top_depth = 0;
    for (uint32_t i = 0; i < m->cur.n; i++) {
        uint32_t d = m->nodes[m->tops[m->cur.off + i]].depth;
        if (d > max_top_depth) max_top_depth = d;
    }
    for (int i = 0; i < GM__CACHE; i++) {
        gm_cache_ent *c = &m->cache[i];
        if (c->bits && max_top_depth + c->growth <= GRAMMAR_MAX_DEPTH &&
            gm__key_match(m, &m->cur, c->key)) {
            memcpy(bits, c->bits, words * sizeof *bits);
            *n_allowed = c->n_allowed;
            m->ambiguous = false;
            c->used = m->clock;
            return KS_OK;
        }
    }
    gm_vtab *vt = gm__vtab(m->g, gv->uid); // then the grammar's, shared
    if (vt) {
        bool hit = false;
        pthread_mutex_lock(&vt->mu);
        for (int i = 0; i < GM__SHARED && !hit; i++) {
            gm_cache_ent *c = &vt->shared[i];
            if (c->bits && max_top_depth + c->growth <= GRAMMAR_MAX_DEPTH &&
                gm__key_match(m, &m->cur, c->key)) {
                memcpy(bits, c->bits, words * sizeof *bits);
                *n_allowed = c->n_allowed;
                c->used = ++vt->clock;
                hit = true;
            }
        }
        pthread_mutex_unlock(&vt->mu);
        if (hit) {
            m->ambiguous = false;
            return KS_OK;
        }
    }
    if (!gm__grow((void **)&m->frames, &m->cap_frames, gv->max_len + 2, sizeof *m->frames))
        return KS_ERR_NOMEM;
    const uint32_t base_nodes = m->n_nodes, base_tops = m->n_tops;
    if (!gm__grow((void **)&m->touched, &m->cap_touched, base_nodes + 1, 1)) return KS_ERR_NOMEM;
    memset(m->touched, 0, base_nodes);
    m->walking = true;
    m->walk_base = base_nodes;
    m->touched_bottom = m->walk_hit_depth = m->bound_hit = false;
    m->walk_max_depth = 0;
    uint32_t visits = 0, max_new = 0, min_visits = GM__CACHE_MIN_VISITS / 8;
    int32_t count = 0;
    int rc = gm__mask_fast(m, gv, bits, &count, &visits, &max_new);
    if (rc == 0) { // the full walk
        memset(bits, 0, words * sizeof *bits);
        m->n_nodes = base_nodes;
        m->n_tops = base_tops;
        visits = 0;
        count = gm__walk(m, gv, bits, &visits);
        min_visits = GM__CACHE_MIN_VISITS;
    }
    m->n_nodes = base_nodes;
    m->n_tops = base_tops;
    m->walking = false;
    m->ambiguous = m->bound_hit;
    if (rc < 0) return KS_ERR_NOMEM;
    if (m->walk_max_depth < max_new) m->walk_max_depth = max_new;
    *n_allowed = count;
    uint32_t min_depth = 0, klen = 0;
    if (visits >= min_visits && !m->walk_hit_depth && !m->bound_hit)
        klen = gm__key_build(m, &m->cur, &min_depth);
    if (klen) {
        int v = 0; // the empty or least recently used entry
        for (int i = 1; i < GM__CACHE; i++)
            if (m->cache[v].bits && (!m->cache[i].bits || m->cache[i].used < m->cache[v].used))
                v = i;
        gm_cache_ent *c = &m->cache[v];
        uint32_t *key = malloc(klen * sizeof *key);
        uint32_t *cb = c->bits ? c->bits : malloc(words * sizeof *cb);
        if (key && cb) {
            free(c->key);
            memcpy(key, m->keybuf, klen * sizeof *key);
            memcpy(cb, bits, words * sizeof *cb);
            uint32_t growth = m->walk_max_depth > min_depth ? m->walk_max_depth - min_depth : 0;
            *c = (gm_cache_ent){key, klen, cb, count, m->clock, growth};
            gm__shared_put(vt, c, words);
        } else {
            free(key);
            if (cb != c->bits) free(cb);
        }
    }
    return KS_OK;
}

// ----------------------------------------------------------------------------
// The mask side of a constrained draw (the engine's step and a prefill
// worker's first token; the draw itself is src/engine/grammar_sample.c)

/* The error of a matcher that dropped every parse at a bound: a refusal
 * of the grammar (400 where nothing was sent yet), not an end of output. */
static ks_err gm__too_ambiguous(ks_errbuf *eb) {
    return ks_seterr(eb, KS_ERR_INVAL,
                     "grammar: too ambiguous: every continuation passes the matcher's bounds (%d "
                     "parses, %d steps per byte)",
                     GRAMMAR_MAX_STACKS, GRAMMAR_MAX_WORK);
}

bool grammar_vocab_is_eog(const grammar_vocab *gv, int32_t id) {
    return gv->v && tok_is_eog(gv->v, id);
}

/* The mask, then the row: EOG ids join the allowed set when complete;
 * every other token gets -inf. */
ks_err grammar_matcher_mask_logits(grammar_matcher *m, const grammar_vocab *gv, bool complete,
                                   float *logits, uint32_t *mask, bool *end, ks_errbuf *eb) {
    const int32_t V = gv->n_vocab;
    int32_t n_allowed = 0;
    *end = false;
    if (grammar_matcher_mask(m, gv, mask, &n_allowed) != KS_OK)
        return ks_seterr(eb, KS_ERR_NOMEM, "out of memory");
    if (n_allowed == 0) {
        if (grammar_matcher_ambiguous(m)) return gm__too_ambiguous(eb);
        if (complete) {
            *end = true;
            return KS_OK;
        }
        return ks_seterr(eb, KS_ERR_INVAL,
                         "grammar: no token of the vocabulary can continue the output");
    }
    if (complete)
        for (int32_t k = 0; k < gv->n_eog; k++)
            mask[gv->eog[k] >> 5] |= 1u << (gv->eog[k] & 31);
    // mask: word w bit b = id 32w + b; whole words of allowed ids are skipped
    for (int32_t w = 0; w < (V + 31) / 32; w++) {
        uint32_t bits = mask[w];
        if (bits == UINT32_MAX) continue;
        int32_t i1 = (w + 1) * 32 < V ? (w + 1) * 32 : V;
        for (int32_t i = w * 32; i < i1; i++)
            if (!(bits >> (i & 31) & 1u)) logits[i] = -INFINITY;
    }
    return KS_OK;
}

/* If the sampler still picked a masked id (only when no allowed logit
 * beats them, a row of NaN) the lowest allowed non-EOG id stands in, as
 * greedy ties go; then the matcher takes it (an EOG id needs no advance). */
ks_err grammar_matcher_accept_pick(grammar_matcher *m, const grammar_vocab *gv,
                                   const uint32_t *mask, int32_t *token, ks_errbuf *eb) {
    const int32_t V = gv->n_vocab;
    bool eog = grammar_vocab_is_eog(gv, *token);
    if (!(mask[*token >> 5] >> (*token & 31) & 1u)) {
        int32_t pick = -1;
        for (int32_t i = 0; i < V && pick < 0; i++)
            if ((mask[i >> 5] >> (i & 31) & 1u) && !grammar_vocab_is_eog(gv, i)) pick = i;
        *token = pick;
        eog = false;
    }
    if (!eog && !grammar_matcher_accept_token(m, gv, *token))
        return grammar_matcher_ambiguous(m)
                   ? gm__too_ambiguous(eb)
                   : ks_seterr(eb, KS_ERR_INTERNAL, "grammar: the chosen token was not accepted");
    return KS_OK;
}
