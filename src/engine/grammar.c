/* grammar.c — GBNF grammars, the per-sequence matcher and the token mask
 * (see grammar.h).
 *
 * Compiled form: a flat array of elements; each alternative of a rule is a
 * run of CHAR (a character set) and RULE (a reference) elements ended by
 * END. Groups and repetitions become generated rules (x* is R ::= x R | ,
 * right-recursive so it needs no stack; x{m,n} is m copies then a chain of
 * optionals), so the matcher only knows these three kinds.
 *
 * Matcher: a set of parse stacks (a pushdown recognizer run on every
 * alternative at once). A stack is a linked list of nodes {element
 * position, parent}: the top points at the CHAR the next character must
 * match; the others are return positions. Stacks share their tails, so an
 * advance only allocates the new tops. Nodes live in an arena that grows
 * within one token and is compacted (copying collector) after each
 * accepted token; the mask's trie walk rewinds the arena on backtrack.
 * Closure after a character is a worklist bounded by GRAMMAR_MAX_WORK
 * steps, deduplicated on (position, parent), so ambiguous grammars cost at
 * most that per byte; depth and stack count are bounded too. Left
 * recursion (a rule reaching itself through nullable prefixes) would make
 * the closure unbounded, so it is refused at compile time.
 *
 * Nodes are shared: pushing (position, parent) when an equal node is in
 * the arena reuses it (a lossy hash table), so stacks equal in structure
 * are one stack and dedup in the closure. Without it, grammars like
 * `(x x ... x "\n")*` with nullable x multiply copies of the same stacks
 * each byte (issue 38's 43 ms/token).
 *
 * Characters are Unicode code points; bytes are decoded as UTF-8 as they
 * come, and a state inside a character keeps only the bits seen so far and
 * is alive while some top's set meets the range those bits still allow.
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
#include "kvseal/grammar.h"

#include "kvseal/admit.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
static atomic_size_t gm__pm_total;             // their bytes now

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

grammar *grammar_ref(grammar *g) {
    atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
    return g;
}

static void gm__pmask_free(gm_pmask *pm) {
    if (!pm) return;
    free(pm->acc);
    free(pm->acc_ids);
    free(pm->unc);
    free(pm);
}

static void gm__free(grammar *g) {
    if (!g) return;
    atomic_fetch_sub_explicit(&gm__pm_total, atomic_load(&g->pm_bytes), memory_order_relaxed);
    for (gm_vtab *t = atomic_load(&g->vtabs), *nx; t; t = nx) {
        nx = t->next;
        for (uint32_t i = 0; i < t->cap; i++)
            gm__pmask_free(t->ht[i].pm);
        for (int i = 0; i < GM__SHARED; i++) {
            free(t->shared[i].key);
            free(t->shared[i].bits);
        }
        free(t->ht);
        pthread_mutex_destroy(&t->mu);
        free(t);
    }
    for (uint32_t i = 0; i < g->n_rules; i++)
        free(g->rules[i].name);
    free(g->rules);
    free(g->elems);
    free(g->alts);
    free(g->ranges);
    free(g->csets);
    free(g->ht);
    free(g->text);
    free(g);
}

void grammar_unref(grammar *g) {
    if (!g) return;
    if (atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) == 1) gm__free(g);
}

/* Grows *p (elements of sz bytes) to hold need; false on out-of-memory. */
static bool gm__grow(void **p, uint32_t *cap, uint32_t need, size_t sz) {
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

static bool gm__cset_has(const grammar *g, const gm_cset *cs, uint32_t c) {
    const gm_range *r = g->ranges + cs->first;
    bool in = false;
    for (uint32_t i = 0; i < cs->n && !in; i++)
        in = c >= r[i].lo && c <= r[i].hi;
    return in != cs->neg;
}

/* True when some code point in [lo, hi] is in the set. */
static bool gm__cset_meets(const grammar *g, const gm_cset *cs, uint32_t lo, uint32_t hi) {
    const gm_range *r = g->ranges + cs->first;
    if (!cs->neg) {
        for (uint32_t i = 0; i < cs->n; i++)
            if (r[i].lo <= hi && r[i].hi >= lo) return true;
        return false;
    }
    // negated: is [lo, hi] entirely covered by the ranges?
    uint32_t c = lo;
    for (;;) {
        bool moved = false;
        for (uint32_t i = 0; i < cs->n; i++) {
            if (r[i].lo <= c && r[i].hi >= c) {
                if (r[i].hi >= hi) return false;
                c = r[i].hi + 1;
                moved = true;
            }
        }
        if (!moved) return true;
    }
}

// ----------------------------------------------------------------------------
// GBNF parser

typedef struct gm_parser {
    grammar *g;
    const char *s, *end, *line_start;
    const char *p;
    int line;
    ks_errbuf *eb;
    ks_err err;
    int depth;      // group nesting
    uint32_t n_gen; // generated rule counter
} gm_parser;

/* A sequence under construction (elements not yet committed). */
typedef struct gm_seq {
    gm_elem *e;
    uint32_t n, cap;
} gm_seq;

typedef struct gm_alts {
    gm_seq *a;
    uint32_t n, cap;
} gm_alts;

static void gm__alts_free(gm_alts *a) {
    for (uint32_t i = 0; i < a->n; i++)
        free(a->a[i].e);
    free(a->a);
    memset(a, 0, sizeof *a);
}

static bool gm__fail(gm_parser *ps, ks_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool gm__fail(gm_parser *ps, ks_err code, const char *fmt, ...) {
    if (ps->err) return false; // keep the first error
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int col = (int)(ps->p - ps->line_start) + 1;
    ps->err = ks_seterr(ps->eb, code, "grammar: line %d, column %d: %s", ps->line, col, msg);
    return false;
}

static bool gm__nomem(gm_parser *ps) { return gm__fail(ps, KS_ERR_NOMEM, "out of memory"); }

/* Skips spaces, tabs, newlines and # comments. */
static void gm__space(gm_parser *ps) {
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == ' ' || c == '\t' || c == '\r')
            ps->p++;
        else if (c == '\n') {
            ps->p++;
            ps->line++;
            ps->line_start = ps->p;
        } else if (c == '#') {
            while (ps->p < ps->end && *ps->p != '\n')
                ps->p++;
        } else
            break;
    }
}

static bool gm__name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

/* Length of the rule name at q (0 if none). */
static size_t gm__name_len(const gm_parser *ps, const char *q) {
    size_t n = 0;
    while (q + n < ps->end && gm__name_char(q[n]))
        n++;
    return n;
}

/* True when a rule definition `name ::=` starts at the cursor. */
static bool gm__at_def(const gm_parser *ps) {
    size_t n = gm__name_len(ps, ps->p);
    if (!n) return false;
    const char *q = ps->p + n;
    while (q < ps->end && (*q == ' ' || *q == '\t'))
        q++;
    return ps->end - q >= 3 && !memcmp(q, "::=", 3);
}

static uint32_t gm__hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

/* Index of rule name[0..n), created (undefined) if new; -1 on failure. */
static int32_t gm__rule(gm_parser *ps, const char *name, size_t n) {
    grammar *g = ps->g;
    if (g->n_rules * 2 + 2 > g->ht_cap) {
        uint32_t cap = g->ht_cap ? g->ht_cap * 2 : 256;
        int32_t *ht = malloc(cap * sizeof *ht);
        if (!ht) return gm__nomem(ps), -1;
        for (uint32_t i = 0; i < cap; i++)
            ht[i] = -1;
        for (uint32_t r = 0; r < g->n_rules; r++) {
            const char *nm = g->rules[r].name;
            uint32_t h = gm__hash(nm, strlen(nm)) & (cap - 1);
            while (ht[h] >= 0)
                h = (h + 1) & (cap - 1);
            ht[h] = (int32_t)r;
        }
        free(g->ht);
        g->ht = ht;
        g->ht_cap = cap;
    }
    uint32_t h = gm__hash(name, n) & (g->ht_cap - 1);
    while (g->ht[h] >= 0) {
        const char *nm = g->rules[g->ht[h]].name;
        if (strlen(nm) == n && !memcmp(nm, name, n)) return g->ht[h];
        h = (h + 1) & (g->ht_cap - 1);
    }
    if (g->n_rules >= GRAMMAR_MAX_RULES)
        return gm__fail(ps, KS_ERR_NOSPACE, "more than %d rules", GRAMMAR_MAX_RULES), -1;
    if (!gm__grow((void **)&g->rules, &g->cap_rules, g->n_rules + 1, sizeof *g->rules))
        return gm__nomem(ps), -1;
    gm_rule *r = &g->rules[g->n_rules];
    memset(r, 0, sizeof *r);
    r->name = malloc(n + 1);
    if (!r->name) return gm__nomem(ps), -1;
    memcpy(r->name, name, n);
    r->name[n] = 0;
    r->ref_line = ps->line;
    r->ref_col = (int)(ps->p - ps->line_start) + 1;
    g->ht[h] = (int32_t)g->n_rules;
    return (int32_t)g->n_rules++;
}

static bool gm__seq_add(gm_parser *ps, gm_seq *s, gm_elem e) {
    if (s->n >= GRAMMAR_MAX_ELEMS)
        return gm__fail(ps, KS_ERR_NOSPACE, "more than %d elements", GRAMMAR_MAX_ELEMS);
    if (!gm__grow((void **)&s->e, &s->cap, s->n + 1, sizeof *s->e)) return gm__nomem(ps);
    s->e[s->n++] = e;
    return true;
}

/* Commits alternatives as the body of rule r (must be undefined). */
static bool gm__define(gm_parser *ps, uint32_t r, gm_alts *a) {
    grammar *g = ps->g;
    uint64_t total = g->n_elems;
    for (uint32_t i = 0; i < a->n; i++)
        total += a->a[i].n + 1;
    if (total > GRAMMAR_MAX_ELEMS)
        return gm__fail(ps, KS_ERR_NOSPACE, "more than %d elements (after repetitions)",
                        GRAMMAR_MAX_ELEMS);
    if (!gm__grow((void **)&g->elems, &g->cap_elems, (uint32_t)total, sizeof *g->elems) ||
        !gm__grow((void **)&g->alts, &g->cap_alts, g->n_alts + a->n, sizeof *g->alts))
        return gm__nomem(ps);
    g->rules[r].alt_first = g->n_alts;
    g->rules[r].n_alts = a->n;
    g->rules[r].defined = true;
    for (uint32_t i = 0; i < a->n; i++) {
        g->alts[g->n_alts++] = g->n_elems;
        if (a->a[i].n) // an empty alternative has no array
            memcpy(g->elems + g->n_elems, a->a[i].e, a->a[i].n * sizeof *g->elems);
        g->n_elems += a->a[i].n;
        g->elems[g->n_elems++] = (gm_elem){GM_END, 0};
    }
    return true;
}

/* A new generated rule named after `base` with the given alternatives
 * (taken over); returns its index or -1. */
static int32_t gm__gen_rule(gm_parser *ps, uint32_t base, gm_alts *a) {
    char name[96];
    snprintf(name, sizeof name, "%.60s~%u", ps->g->rules[base].name, ps->n_gen++);
    int32_t r = gm__rule(ps, name, strlen(name));
    if (r < 0) return -1;
    if (ps->g->rules[r].defined) return gm__fail(ps, KS_ERR_INVAL, "rule name clash"), -1;
    bool ok = gm__define(ps, (uint32_t)r, a);
    return ok ? r : -1;
}

static bool gm__alts_add(gm_parser *ps, gm_alts *a, gm_seq s) {
    if (!gm__grow((void **)&a->a, &a->cap, a->n + 1, sizeof *a->a)) {
        free(s.e);
        return gm__nomem(ps);
    }
    a->a[a->n++] = s;
    return true;
}

static bool gm__cset_new(gm_parser *ps, const gm_range *r, uint32_t n, bool neg, gm_elem *out) {
    grammar *g = ps->g;
    if (!gm__grow((void **)&g->ranges, &g->cap_ranges, g->n_ranges + n + 1, sizeof *g->ranges) ||
        !gm__grow((void **)&g->csets, &g->cap_csets, g->n_csets + 1, sizeof *g->csets))
        return gm__nomem(ps);
    if (n) memcpy(g->ranges + g->n_ranges, r, n * sizeof *r);
    g->csets[g->n_csets] = (gm_cset){g->n_ranges, n, neg};
    g->n_ranges += n;
    *out = (gm_elem){GM_CHAR, g->n_csets++};
    return true;
}

/* Decodes one UTF-8 character at the cursor (for literals and classes). */
static bool gm__utf8(gm_parser *ps, uint32_t *cp) {
    const uint8_t *q = (const uint8_t *)ps->p;
    size_t left = (size_t)(ps->end - ps->p);
    uint8_t c = q[0];
    uint32_t n, v;
    if (c < 0x80)
        n = 1, v = c;
    else if (c >= 0xc2 && c <= 0xdf)
        n = 2, v = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3, v = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4, v = c & 0x07;
    else
        return gm__fail(ps, KS_ERR_INVAL, "invalid UTF-8");
    if (left < n) return gm__fail(ps, KS_ERR_INVAL, "truncated UTF-8");
    for (uint32_t i = 1; i < n; i++) {
        if ((q[i] & 0xc0) != 0x80) return gm__fail(ps, KS_ERR_INVAL, "invalid UTF-8");
        v = (v << 6) | (q[i] & 0x3f);
    }
    ps->p += n;
    *cp = v;
    return true;
}

static int gm__hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class, escapes included. */
static bool gm__char(gm_parser *ps, uint32_t *cp) {
    if (ps->p >= ps->end) return gm__fail(ps, KS_ERR_INVAL, "unexpected end of grammar");
    if (*ps->p != '\\') {
        if (*ps->p == '\n') return gm__fail(ps, KS_ERR_INVAL, "newline inside a literal or class");
        return gm__utf8(ps, cp);
    }
    ps->p++;
    if (ps->p >= ps->end) return gm__fail(ps, KS_ERR_INVAL, "unexpected end after '\\'");
    char c = *ps->p++;
    int nhex = 0;
    switch (c) {
    case 'n':
        *cp = '\n';
        return true;
    case 'r':
        *cp = '\r';
        return true;
    case 't':
        *cp = '\t';
        return true;
    case '0':
        *cp = 0;
        return true;
    case '\\':
    case '"':
    case '[':
    case ']':
    case '-':
    case '^':
    case '\'':
        *cp = (uint8_t)c;
        return true;
    case 'x':
        nhex = 2;
        break;
    case 'u':
        nhex = 4;
        break;
    case 'U':
        nhex = 8;
        break;
    default:
        ps->p--;
        return gm__fail(ps, KS_ERR_INVAL, "unknown escape '\\%c'", c);
    }
    uint32_t v = 0;
    for (int i = 0; i < nhex; i++) {
        int h = ps->p < ps->end ? gm__hex(*ps->p) : -1;
        if (h < 0)
            return gm__fail(ps, KS_ERR_INVAL, "expected %d hex digits after '\\%c'", nhex, c);
        v = (v << 4) | (uint32_t)h;
        ps->p++;
    }
    if (v > 0x10ffff) return gm__fail(ps, KS_ERR_INVAL, "code point above U+10FFFF");
    *cp = v;
    return true;
}

static bool gm__alternates(gm_parser *ps, uint32_t rule, gm_alts *out);

/* Reads an unsigned decimal (at most GRAMMAR_MAX_REPEAT). */
static bool gm__uint(gm_parser *ps, uint32_t *v) {
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
        return gm__fail(ps, KS_ERR_INVAL, "expected a number");
    uint64_t x = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        x = x * 10 + (uint64_t)(*ps->p++ - '0');
        if (x > GRAMMAR_MAX_REPEAT)
            return gm__fail(ps, KS_ERR_NOSPACE, "repetition count above %d", GRAMMAR_MAX_REPEAT);
    }
    *v = (uint32_t)x;
    return true;
}

/* Applies a repetition {lo, hi} (hi UINT32_MAX: unbounded) to the single
 * element x, appending the result to s. */
static bool gm__repeat(gm_parser *ps, uint32_t rule, gm_seq *s, gm_elem x, uint32_t lo,
                       uint32_t hi) {
    for (uint32_t i = 0; i < lo; i++)
        if (!gm__seq_add(ps, s, x)) return false;
    if (hi == UINT32_MAX) {
        // R ::= x R | (empty)
        char name[96];
        snprintf(name, sizeof name, "%.60s~%u", ps->g->rules[rule].name, ps->n_gen++);
        int32_t r = gm__rule(ps, name, strlen(name));
        if (r < 0) return false;
        gm_alts a = {0};
        gm_seq s1 = {0};
        if (!gm__seq_add(ps, &s1, x) || !gm__seq_add(ps, &s1, (gm_elem){GM_RULE, (uint32_t)r}) ||
            !gm__alts_add(ps, &a, s1) || !gm__alts_add(ps, &a, (gm_seq){0})) {
            free(s1.e);
            gm__alts_free(&a);
            return false;
        }
        bool ok = gm__define(ps, (uint32_t)r, &a);
        gm__alts_free(&a);
        return ok && gm__seq_add(ps, s, (gm_elem){GM_RULE, (uint32_t)r});
    }
    // hi - lo nested optionals: O1 ::= x | ; Ok ::= x O(k-1) | ;
    int32_t prev = -1;
    for (uint32_t k = lo; k < hi; k++) {
        gm_alts a = {0};
        gm_seq s1 = {0};
        bool ok = gm__seq_add(ps, &s1, x) &&
                  (prev < 0 || gm__seq_add(ps, &s1, (gm_elem){GM_RULE, (uint32_t)prev})) &&
                  gm__alts_add(ps, &a, s1) && gm__alts_add(ps, &a, (gm_seq){0});
        if (!ok) free(s1.e);
        int32_t r = ok ? gm__gen_rule(ps, rule, &a) : -1;
        gm__alts_free(&a);
        if (r < 0) return false;
        prev = r;
    }
    return prev < 0 || gm__seq_add(ps, s, (gm_elem){GM_RULE, (uint32_t)prev});
}

/* Parses one sequence (up to '|', ')', the next definition or the end). */
static bool gm__sequence(gm_parser *ps, uint32_t rule, gm_seq *s) {
    for (;;) {
        gm__space(ps);
        if (ps->p >= ps->end || *ps->p == '|' || *ps->p == ')') return true;
        if (ps->depth == 0 && gm__at_def(ps)) return true;
        uint32_t start = s->n; // the item's elements: s->e[start..n)
        char c = *ps->p;
        if (c == '"') {
            ps->p++;
            while (ps->p < ps->end && *ps->p != '"') {
                uint32_t cp;
                gm_elem e;
                gm_range r;
                if (!gm__char(ps, &cp)) return false;
                r = (gm_range){cp, cp};
                if (!gm__cset_new(ps, &r, 1, false, &e) || !gm__seq_add(ps, s, e)) return false;
            }
            if (ps->p >= ps->end) return gm__fail(ps, KS_ERR_INVAL, "unterminated string literal");
            ps->p++;
            if (s->n == start) continue; // "" matches nothing: no item to repeat
        } else if (c == '[') {
            ps->p++;
            bool neg = ps->p < ps->end && *ps->p == '^';
            if (neg) ps->p++;
            gm_range rs[256];
            uint32_t n = 0;
            while (ps->p < ps->end && *ps->p != ']') {
                uint32_t lo, hi;
                if (!gm__char(ps, &lo)) return false;
                hi = lo;
                if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
                    ps->p++;
                    if (!gm__char(ps, &hi)) return false;
                    if (hi < lo) return gm__fail(ps, KS_ERR_INVAL, "range end below its start");
                }
                if (n >= 256)
                    return gm__fail(ps, KS_ERR_NOSPACE, "more than 256 ranges in a class");
                rs[n++] = (gm_range){lo, hi};
            }
            if (ps->p >= ps->end) return gm__fail(ps, KS_ERR_INVAL, "unterminated character class");
            ps->p++;
            gm_elem e;
            if (!gm__cset_new(ps, rs, n, neg, &e) || !gm__seq_add(ps, s, e)) return false;
        } else if (c == '.') {
            ps->p++;
            gm_range r = {0, 0x10ffff};
            gm_elem e;
            if (!gm__cset_new(ps, &r, 1, false, &e) || !gm__seq_add(ps, s, e)) return false;
        } else if (c == '(') {
            ps->p++;
            if (++ps->depth > 64)
                return gm__fail(ps, KS_ERR_NOSPACE, "groups nested deeper than 64");
            gm_alts a = {0};
            bool ok = gm__alternates(ps, rule, &a);
            if (ok && (ps->p >= ps->end || *ps->p != ')'))
                ok = gm__fail(ps, KS_ERR_INVAL, "expected ')'");
            int32_t r = -1;
            if (ok) {
                ps->p++;
                r = gm__gen_rule(ps, rule, &a);
            }
            gm__alts_free(&a);
            ps->depth--;
            if (r < 0 || !gm__seq_add(ps, s, (gm_elem){GM_RULE, (uint32_t)r})) return false;
        } else if (gm__name_char(c)) {
            size_t n = gm__name_len(ps, ps->p);
            int32_t r = gm__rule(ps, ps->p, n);
            if (r < 0) return false;
            ps->p += n;
            if (!gm__seq_add(ps, s, (gm_elem){GM_RULE, (uint32_t)r})) return false;
        } else {
            return gm__fail(ps, KS_ERR_INVAL, "unexpected character '%c'", c);
        }
        // postfix operators on the item just parsed
        for (;;) {
            if (ps->p >= ps->end) break;
            char op = *ps->p;
            uint32_t lo, hi;
            if (op == '*')
                lo = 0, hi = UINT32_MAX, ps->p++;
            else if (op == '+')
                lo = 1, hi = UINT32_MAX, ps->p++;
            else if (op == '?')
                lo = 0, hi = 1, ps->p++;
            else if (op == '{') {
                ps->p++;
                gm__space(ps);
                lo = 0;
                if (ps->p < ps->end && *ps->p != ',' && !gm__uint(ps, &lo)) return false;
                gm__space(ps);
                hi = lo;
                if (ps->p < ps->end && *ps->p == ',') {
                    ps->p++;
                    gm__space(ps);
                    hi = UINT32_MAX;
                    if (ps->p < ps->end && *ps->p != '}' && !gm__uint(ps, &hi)) return false;
                    gm__space(ps);
                }
                if (ps->p >= ps->end || *ps->p != '}')
                    return gm__fail(ps, KS_ERR_INVAL, "expected '}'");
                ps->p++;
                if (hi < lo)
                    return gm__fail(ps, KS_ERR_INVAL, "repetition {%u,%u}: max below min", lo, hi);
            } else
                break;
            // the item as one element (a multi-character literal becomes a rule)
            gm_elem x;
            if (s->n - start == 1) {
                x = s->e[start];
            } else {
                gm_alts a = {0};
                gm_seq item = {0};
                bool ok = true;
                for (uint32_t i = start; ok && i < s->n; i++)
                    ok = gm__seq_add(ps, &item, s->e[i]);
                ok = ok && gm__alts_add(ps, &a, item);
                if (!ok) free(item.e);
                int32_t r = ok ? gm__gen_rule(ps, rule, &a) : -1;
                gm__alts_free(&a);
                if (r < 0) return false;
                x = (gm_elem){GM_RULE, (uint32_t)r};
            }
            s->n = start;
            if (!gm__repeat(ps, rule, s, x, lo, hi)) return false;
            // a further operator applies to the result as a whole
            if (s->n - start == 0) {
                // x{0} matched nothing; nothing left to repeat
                break;
            }
        }
    }
}

/* Parses alternatives separated by '|'. */
static bool gm__alternates(gm_parser *ps, uint32_t rule, gm_alts *out) {
    for (;;) {
        gm_seq s = {0};
        if (!gm__sequence(ps, rule, &s)) {
            free(s.e);
            return false;
        }
        if (!gm__alts_add(ps, out, s)) return false;
        gm__space(ps);
        if (ps->p < ps->end && *ps->p == '|') {
            ps->p++;
            continue;
        }
        return true;
    }
}

/* Computes which rules derive the empty string (worklist, linear time). */
static bool gm__nullable(const grammar *g, bool *nul) {
    uint32_t *cnt = calloc(g->n_alts ? g->n_alts : 1, sizeof *cnt);
    uint32_t *alt_of = malloc((g->n_elems ? g->n_elems : 1) * sizeof *alt_of);
    uint32_t *occ_first = calloc(g->n_rules + 1, sizeof *occ_first);
    uint32_t *occ = malloc((g->n_elems ? g->n_elems : 1) * sizeof *occ);
    uint32_t *queue = malloc((g->n_rules ? g->n_rules : 1) * sizeof *queue);
    bool ok = cnt && alt_of && occ_first && occ && queue;
    if (ok) {
        for (uint32_t a = 0; a < g->n_alts; a++)
            for (uint32_t p = g->alts[a]; g->elems[p].kind != GM_END; p++) {
                alt_of[p] = a;
                if (g->elems[p].kind == GM_CHAR)
                    cnt[a] = UINT32_MAX / 2;
                else {
                    cnt[a]++;
                    occ_first[g->elems[p].v + 1]++;
                }
            }
        for (uint32_t r = 0; r < g->n_rules; r++)
            occ_first[r + 1] += occ_first[r];
        uint32_t *fill = calloc(g->n_rules ? g->n_rules : 1, sizeof *fill);
        if (!fill) ok = false;
        for (uint32_t a = 0; ok && a < g->n_alts; a++)
            for (uint32_t p = g->alts[a]; g->elems[p].kind != GM_END; p++)
                if (g->elems[p].kind == GM_RULE) {
                    uint32_t r = g->elems[p].v;
                    occ[occ_first[r] + fill[r]++] = a;
                }
        free(fill);
    }
    if (ok) {
        uint32_t *rule_of = malloc((g->n_alts ? g->n_alts : 1) * sizeof *rule_of);
        if (!rule_of)
            ok = false;
        else {
            for (uint32_t r = 0; r < g->n_rules; r++)
                for (uint32_t k = 0; k < g->rules[r].n_alts; k++)
                    rule_of[g->rules[r].alt_first + k] = r;
            uint32_t qh = 0, qt = 0;
            memset(nul, 0, g->n_rules * sizeof *nul);
            for (uint32_t a = 0; a < g->n_alts; a++)
                if (cnt[a] == 0 && !nul[rule_of[a]])
                    nul[rule_of[a]] = true, queue[qt++] = rule_of[a];
            while (qh < qt) {
                uint32_t r = queue[qh++];
                for (uint32_t i = occ_first[r]; i < occ_first[r + 1]; i++) {
                    uint32_t a = occ[i];
                    if (--cnt[a] == 0 && !nul[rule_of[a]])
                        nul[rule_of[a]] = true, queue[qt++] = rule_of[a];
                }
            }
            free(rule_of);
        }
    }
    (void)alt_of;
    free(cnt);
    free(alt_of);
    free(occ_first);
    free(occ);
    free(queue);
    return ok;
}

/* Refuses left recursion that would grow a stack without consuming input.
 * Edges u -> v: v is referenced in u after only nullable elements; the
 * edge is a tail one when the reference ends its alternative (the matcher
 * then pushes no return). A cycle of tail edges only is harmless (x* with
 * x nullable: the closure meets the same (position, parent) again and
 * stops); a cycle with a non-tail edge pushes forever. So: strongly
 * connected components (iterative Tarjan), and any non-tail edge inside
 * one is refused. */
static ks_err gm__left_recursion(const grammar *g, ks_errbuf *eb) {
    const uint32_t R = g->n_rules ? g->n_rules : 1;
    bool *nul = malloc(R * sizeof *nul);
    uint32_t *efirst = calloc(R + 1, sizeof *efirst);
    ks_err err = KS_OK;
    uint32_t *eto = NULL, *idx = NULL, *low = NULL, *comp = NULL, *stk = NULL, *cs = NULL,
             *ci = NULL;
    uint8_t *etail = NULL, *on = NULL;
    if (!nul || !efirst || !gm__nullable(g, nul)) goto nomem;
    // count, then fill, the edges (CSR)
    for (int pass = 0; pass < 2; pass++) {
        uint32_t *fill = pass ? calloc(R, sizeof *fill) : NULL;
        if (pass && !fill) goto nomem;
        for (uint32_t r = 0; r < g->n_rules; r++)
            for (uint32_t k = 0; k < g->rules[r].n_alts; k++)
                for (uint32_t p = g->alts[g->rules[r].alt_first + k]; g->elems[p].kind == GM_RULE;
                     p++) {
                    if (!pass)
                        efirst[r + 1]++;
                    else {
                        uint32_t e = efirst[r] + fill[r]++;
                        eto[e] = g->elems[p].v;
                        etail[e] = g->elems[p + 1].kind == GM_END;
                    }
                    if (!nul[g->elems[p].v]) break;
                }
        if (!pass) {
            for (uint32_t r = 0; r < R; r++)
                efirst[r + 1] += efirst[r];
            eto = malloc((efirst[R] + 1) * sizeof *eto);
            etail = malloc(efirst[R] + 1);
            if (!eto || !etail) goto nomem;
        }
        free(fill);
    }
    idx = malloc(R * sizeof *idx);
    low = malloc(R * sizeof *low);
    comp = malloc(R * sizeof *comp);
    stk = malloc(R * sizeof *stk);
    cs = malloc(R * sizeof *cs); // DFS call stack: rule
    ci = malloc(R * sizeof *ci); // and its next edge
    on = calloc(R, 1);
    if (!idx || !low || !comp || !stk || !cs || !ci || !on) goto nomem;
    for (uint32_t r = 0; r < R; r++)
        idx[r] = UINT32_MAX;
    uint32_t next_idx = 0, sp = 0, n_comp = 0;
    for (uint32_t r0 = 0; r0 < g->n_rules; r0++) {
        if (idx[r0] != UINT32_MAX) continue;
        uint32_t csp = 0;
        cs[csp] = r0, ci[csp++] = efirst[r0];
        idx[r0] = low[r0] = next_idx++;
        stk[sp++] = r0, on[r0] = 1;
        while (csp) {
            uint32_t u = cs[csp - 1];
            if (ci[csp - 1] < efirst[u + 1]) {
                uint32_t v = eto[ci[csp - 1]++];
                if (idx[v] == UINT32_MAX) {
                    idx[v] = low[v] = next_idx++;
                    stk[sp++] = v, on[v] = 1;
                    cs[csp] = v, ci[csp++] = efirst[v];
                } else if (on[v] && idx[v] < low[u]) {
                    low[u] = idx[v];
                }
                continue;
            }
            if (low[u] == idx[u]) {
                uint32_t w;
                do {
                    w = stk[--sp];
                    on[w] = 0;
                    comp[w] = n_comp;
                } while (w != u);
                n_comp++;
            }
            csp--;
            if (csp && low[u] < low[cs[csp - 1]]) low[cs[csp - 1]] = low[u];
        }
    }
    for (uint32_t u = 0; u < g->n_rules && !err; u++)
        for (uint32_t e = efirst[u]; e < efirst[u + 1] && !err; e++)
            if (!etail[e] && comp[eto[e]] == comp[u])
                err = ks_seterr(eb, KS_ERR_INVAL,
                                "grammar: left recursion: rule '%.100s' can reach itself without "
                                "consuming input",
                                g->rules[u].name);
    goto done;
nomem:
    err = ks_seterr(eb, KS_ERR_NOMEM, "grammar: out of memory");
done:
    free(nul);
    free(efirst);
    free(eto);
    free(etail);
    free(idx);
    free(low);
    free(comp);
    free(stk);
    free(cs);
    free(ci);
    free(on);
    return err;
}

static ks_err gm__check_bounded(grammar_matcher *m, ks_errbuf *eb);

static ks_err gm__parse(const char *text, size_t len, grammar **out, ks_errbuf *eb);

/* Each call compiles its own grammar, even for a text seen before: the token
 * classes a grammar fills in as it is used are its request's alone, so how
 * fast a request's first masks are tells it nothing about another request
 * (another tenant's grammar or schema), as the prefix cache is scoped by
 * tenant (I7). The first masks' class building is charged to the request
 * that pays it. */
ks_err grammar_parse(const char *text, size_t len, grammar **out, ks_errbuf *eb) {
    KS_ASSERT(out);
    *out = NULL;
    if (!text && len) return ks_seterr(eb, KS_ERR_INVAL, "grammar: NULL text");
    return gm__parse(text, len, out, eb);
}

static ks_err gm__parse(const char *text, size_t len, grammar **out, ks_errbuf *eb) {
    if (len > GRAMMAR_MAX_TEXT)
        return ks_seterr(eb, KS_ERR_NOSPACE, "grammar: %zu bytes, above the limit of %d", len,
                         GRAMMAR_MAX_TEXT);
    grammar *g = calloc(1, sizeof *g);
    if (!g) return ks_seterr(eb, KS_ERR_NOMEM, "grammar: out of memory");
    atomic_init(&g->refs, 1);
    atomic_init(&g->vtabs, NULL);
    atomic_init(&g->pm_bytes, 0);
    gm_parser ps = {
        .g = g, .s = text, .end = text + len, .line_start = text, .p = text, .line = 1, .eb = eb};
    for (;;) {
        gm__space(&ps);
        if (ps.p >= ps.end) break;
        size_t n = gm__name_len(&ps, ps.p);
        if (!n || !gm__at_def(&ps)) {
            gm__fail(&ps, KS_ERR_INVAL, "expected a rule definition 'name ::= ...'");
            break;
        }
        int32_t r = gm__rule(&ps, ps.p, n);
        if (r < 0) break;
        if (g->rules[r].defined) {
            gm__fail(&ps, KS_ERR_INVAL, "rule '%.100s' is defined twice", g->rules[r].name);
            break;
        }
        ps.p += n;
        while (*ps.p != ':')
            ps.p++;
        ps.p += 3;
        gm_alts a = {0};
        bool ok = gm__alternates(&ps, (uint32_t)r, &a);
        if (ok && ps.p < ps.end && *ps.p == ')') ok = gm__fail(&ps, KS_ERR_INVAL, "unbalanced ')'");
        if (ok && g->rules[r].defined)
            ok = gm__fail(&ps, KS_ERR_INVAL, "rule '%.100s' is defined twice", g->rules[r].name);
        if (ok) ok = gm__define(&ps, (uint32_t)r, &a);
        gm__alts_free(&a);
        if (!ok) break;
    }
    ks_err err = ps.err;
    if (!err) {
        for (uint32_t r = 0; r < g->n_rules && !err; r++)
            if (!g->rules[r].defined)
                err = ks_seterr(eb, KS_ERR_INVAL,
                                "grammar: line %d, column %d: undefined rule '%.100s'",
                                g->rules[r].ref_line, g->rules[r].ref_col, g->rules[r].name);
    }
    if (!err) {
        bool found = false;
        for (uint32_t r = 0; r < g->n_rules; r++)
            if (!strcmp(g->rules[r].name, "root")) g->root = r, found = true;
        if (!found) err = ks_seterr(eb, KS_ERR_INVAL, "grammar: no 'root' rule");
    }
    if (!err) err = gm__left_recursion(g, eb);
    if (!err) { // the start state must exist (e.g. `root ::= root` has none)
        grammar_matcher *m = NULL;
        err = grammar_matcher_create(g, &m, eb);
        if (!err) err = gm__check_bounded(m, eb);
        grammar_matcher_destroy(m);
    }
    if (!err && !(g->text = malloc(len + 1)))
        err = ks_seterr(eb, KS_ERR_NOMEM, "grammar: out of memory");
    if (err) {
        gm__free(g);
        return err;
    }
    if (len) memcpy(g->text, text, len);
    g->text[len] = 0;
    g->text_len = len;
    *out = g;
    return KS_OK;
}

const char *grammar_text(const grammar *g, size_t *len) {
    *len = g->text_len;
    return g->text;
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

/* A new node: 0, 1 when the stack would pass GRAMMAR_MAX_DEPTH (that path
 * dies), -1 when the arena is full or out of memory (the advance fails). */
static int gm__node_new(grammar_matcher *m, uint32_t pos, int32_t parent, int32_t *out) {
    uint32_t d = parent >= 0 ? m->nodes[parent].depth + 1 : 1;
    if (d > GRAMMAR_MAX_DEPTH) {
        m->walk_hit_depth = true;
        return 1;
    }
    if (d > m->walk_max_depth) m->walk_max_depth = d;
    // an equal node already in the arena is shared (nodes never change):
    // stacks equal in structure stay one stack, so they dedup in closures
    const uint32_t h =
        (uint32_t)((((uint64_t)pos << 32 | (uint32_t)(parent + 1)) * 0x9E3779B97F4A7C15ull) >> 40) &
        (GM__HC - 1);
    const int32_t j = m->hc[h];
    if (j >= 0 && (uint32_t)j < m->n_nodes && m->nodes[j].pos == pos &&
        m->nodes[j].parent == parent) {
        *out = j;
        return 0;
    }
    if (m->n_nodes >= GM__MAX_NODES ||
        !gm__grow((void **)&m->nodes, &m->cap_nodes, m->n_nodes + 1, sizeof *m->nodes))
        return -1;
    m->nodes[m->n_nodes] = (gm_node){pos, parent, d};
    m->hc[h] = (int32_t)m->n_nodes;
    *out = (int32_t)m->n_nodes++;
    return 0;
}

static bool gm__top_add(grammar_matcher *m, gm_state *st, int32_t idx) {
    if (st->n >= GRAMMAR_MAX_STACKS) return false;
    if (!gm__grow((void **)&m->tops, &m->cap_tops, m->n_tops + 1, sizeof *m->tops)) return false;
    m->tops[m->n_tops++] = idx;
    st->n++;
    return true;
}

/* Closure: from the pending (pos, parent) items, reaches every CHAR top
 * (added to st) and END of the root (st->complete). Items are deduplicated
 * by (pos, parent) within the stamp. Returns false when a bound was passed
 * (the caller treats that as a rejection). */
static bool gm__close(grammar_matcher *m, gm_state *st, uint32_t n_work) {
    const grammar *g = m->g;
    uint32_t steps = 0;
    m->close_steps = 0;
    while (n_work) {
        m->close_steps = steps + 1;
        uint64_t it = m->work[--n_work];
        if (++steps > GRAMMAR_MAX_WORK) return m->bound_hit = true, false;
        uint32_t h = (uint32_t)((it * 0x9E3779B97F4A7C15ull) >> 48) & (GM__TABLE - 1);
        bool seen = false;
        while (m->tstamp[h] == m->stamp) {
            if (m->tkey[h] == it) {
                seen = true;
                break;
            }
            h = (h + 1) & (GM__TABLE - 1);
        }
        if (seen) continue;
        m->tstamp[h] = m->stamp;
        m->tkey[h] = it;
        uint32_t pos = (uint32_t)(it >> 32);
        int32_t parent = (int32_t)(uint32_t)it - 1;
        gm_elem e = g->elems[pos];
        if (e.kind == GM_END) {
            if (m->walking) { // the mask now depends on the frame popped into
                if (parent < 0)
                    m->touched_bottom = true;
                else if ((uint32_t)parent < m->walk_base)
                    m->touched[parent] = 1;
            }
            if (parent < 0)
                st->complete = true;
            else {
                const gm_node *pn = &m->nodes[parent];
                m->work[n_work++] = ((uint64_t)pn->pos << 32) | (uint32_t)(pn->parent + 1);
            }
        } else if (e.kind == GM_CHAR) {
            int32_t idx;
            int rc = gm__node_new(m, pos, parent, &idx);
            if (rc < 0 || (rc == 0 && !gm__top_add(m, st, idx))) return m->bound_hit = true, false;
        } else {
            int32_t np = parent;
            if (g->elems[pos + 1].kind != GM_END) {
                int rc = gm__node_new(m, pos + 1, parent, &np);
                if (rc < 0) return m->bound_hit = true, false;
                if (rc > 0) continue; // too deep: this path dies
            }
            const gm_rule *R = &g->rules[e.v];
            if (n_work + R->n_alts > GRAMMAR_MAX_WORK) return m->bound_hit = true, false;
            for (uint32_t k = R->n_alts; k-- > 0;)
                m->work[n_work++] =
                    ((uint64_t)g->alts[R->alt_first + k] << 32) | (uint32_t)(np + 1);
        }
    }
    return true;
}

/* Advances `in` by code point c into *out (tops appended to the arena). */
static bool gm__advance_cp(grammar_matcher *m, const gm_state *in, uint32_t c, gm_state *out) {
    const grammar *g = m->g;
    *out = (gm_state){.off = m->n_tops};
    if (++m->stamp == 0) { // wrapped: old entries would look current
        memset(m->tstamp, 0, GM__TABLE * sizeof *m->tstamp);
        m->stamp = 1;
    }
    uint32_t n_work = 0;
    for (uint32_t i = 0; i < in->n; i++) {
        const gm_node *t = &m->nodes[m->tops[in->off + i]];
        const gm_cset *cs = &g->csets[g->elems[t->pos].v];
        if (!gm__cset_has(g, cs, c)) continue;
        if (n_work >= GRAMMAR_MAX_WORK) return m->bound_hit = true, false;
        m->work[n_work++] = ((uint64_t)(t->pos + 1) << 32) | (uint32_t)(t->parent + 1);
    }
    if (!n_work) return false;
    // process in the tops' order (the worklist pops from the end)
    for (uint32_t i = 0, j = n_work - 1; i < j; i++, j--) {
        uint64_t x = m->work[i];
        m->work[i] = m->work[j];
        m->work[j] = x;
    }
    if (!gm__close(m, out, n_work)) return false;
    return out->n > 0 || out->complete;
}

/* Advances by one byte. False: rejected (arena contents past the marks
 * are garbage the caller rewinds). Only well-formed UTF-8 passes: no
 * overlong forms, surrogates or code points past U+10FFFF. */
static bool gm__advance(grammar_matcher *m, const gm_state *in, uint8_t b, gm_state *out) {
    uint32_t cp;
    uint8_t need, len;
    if (in->need) {
        if ((b & 0xc0) != 0x80) return false;
        cp = (in->cp << 6) | (b & 0x3f);
        need = (uint8_t)(in->need - 1);
        len = in->len;
    } else if (b < 0x80) {
        return gm__advance_cp(m, in, b, out);
    } else if (b >= 0xc2 && b <= 0xdf) {
        cp = b & 0x1f, need = 1, len = 2;
    } else if (b >= 0xe0 && b <= 0xef) {
        cp = b & 0x0f, need = 2, len = 3;
    } else if (b >= 0xf0 && b <= 0xf4) {
        cp = b & 0x07, need = 3, len = 4;
    } else {
        return false;
    }
    // what the character can still become: [lo, hi] within its length's range
    static const uint32_t min_of_len[5] = {0, 0, 0x80, 0x800, 0x10000};
    uint32_t lo = cp << (6 * need), hi = lo | ((1u << (6 * need)) - 1);
    if (lo < min_of_len[len]) lo = min_of_len[len];
    if (hi > 0x10ffff) hi = 0x10ffff;
    if (lo > hi || (lo >= 0xd800 && hi <= 0xdfff)) return false;
    if (!need) return gm__advance_cp(m, in, cp, out);
    // inside a character: alive while some top's set meets what it can become
    const grammar *g = m->g;
    bool any = false;
    for (uint32_t i = 0; i < in->n && !any; i++) {
        const gm_node *t = &m->nodes[m->tops[in->off + i]];
        any = gm__cset_meets(g, &g->csets[g->elems[t->pos].v], lo, hi);
    }
    if (!any) return false;
    *out = (gm_state){
        .off = in->off, .n = in->n, .complete = false, .need = need, .len = len, .cp = cp};
    return true;
}

/* Copies the stacks of the current state into fresh arenas (dropping what
 * no stack reaches). */
static bool gm__compact(grammar_matcher *m) {
    if (!gm__grow((void **)&m->fwd, &m->cap_fwd, m->n_nodes + 1, sizeof *m->fwd)) return false;
    if (!gm__grow((void **)&m->nodes2, &m->cap_nodes2, m->n_nodes + 1, sizeof *m->nodes2) ||
        !gm__grow((void **)&m->tops2, &m->cap_tops2, m->cur.n + 1, sizeof *m->tops2))
        return false;
    for (uint32_t i = 0; i < m->n_nodes; i++)
        m->fwd[i] = -1;
    uint32_t n2 = 0;
    for (uint32_t i = 0; i < m->cur.n; i++) {
        int32_t x = m->tops[m->cur.off + i];
        // copy the not-yet-copied part of the chain, bottom first
        int32_t chain[GRAMMAR_MAX_DEPTH + 1];
        int nc = 0;
        for (int32_t y = x; y >= 0 && m->fwd[y] < 0; y = m->nodes[y].parent)
            chain[nc++] = y;
        while (nc) {
            int32_t y = chain[--nc];
            gm_node nd = m->nodes[y];
            nd.parent = nd.parent >= 0 ? m->fwd[nd.parent] : -1;
            m->nodes2[n2] = nd;
            m->fwd[y] = (int32_t)n2++;
        }
        m->tops2[i] = m->fwd[x];
    }
    gm_node *tn = m->nodes;
    m->nodes = m->nodes2;
    m->nodes2 = tn;
    uint32_t tc = m->cap_nodes;
    m->cap_nodes = m->cap_nodes2;
    m->cap_nodes2 = tc;
    int32_t *tt = m->tops;
    m->tops = m->tops2;
    m->tops2 = tt;
    tc = m->cap_tops;
    m->cap_tops = m->cap_tops2;
    m->cap_tops2 = tc;
    m->n_nodes = n2;
    m->n_tops = m->cur.n;
    m->cur.off = 0;
    return true;
}

#define GM__CHECK_WORK 4000000 // closure steps gm__check_bounded spends at most

/* Refuses, at compile time, a grammar in which one character opens more
 * parses than the matcher's bounds allow, whatever surrounds it: for each
 * character position, the closure after it from that rule alone (popping
 * past the rule ends the parse there) must stay within GRAMMAR_MAX_STACKS
 * tops and GRAMMAR_MAX_WORK steps. Such a grammar could only ever refuse
 * that character (every parse dropped), so it is refused with a reason
 * instead. What depends on the context (ambiguity that builds up over
 * several characters, through several rules) is caught while matching
 * (grammar_matcher_ambiguous, and grammar_sample's error). */
static ks_err gm__check_bounded(grammar_matcher *m, ks_errbuf *eb) {
    const grammar *g = m->g;
    uint64_t spent = 0;
    const uint32_t mark_nodes = m->n_nodes, mark_tops = m->n_tops;
    for (uint32_t r = 0; r < g->n_rules && spent < GM__CHECK_WORK; r++) {
        const gm_rule *R = &g->rules[r];
        for (uint32_t k = 0; k < R->n_alts; k++)
            for (uint32_t p = g->alts[R->alt_first + k]; g->elems[p].kind != GM_END; p++) {
                if (g->elems[p].kind != GM_CHAR) continue;
                if (++m->stamp == 0) {
                    memset(m->tstamp, 0, GM__TABLE * sizeof *m->tstamp);
                    m->stamp = 1;
                }
                gm_state st = {.off = m->n_tops};
                m->work[0] = (uint64_t)(p + 1) << 32; // parent -1
                m->bound_hit = false;
                bool ok = gm__close(m, &st, 1);
                spent += m->close_steps + 1;
                m->n_nodes = mark_nodes;
                m->n_tops = mark_tops;
                if (!ok && m->bound_hit)
                    return ks_seterr(eb, KS_ERR_INVAL,
                                     "grammar: too ambiguous: in rule '%.100s', one character "
                                     "opens more than %d parses (or %d steps) at once",
                                     R->name, GRAMMAR_MAX_STACKS, GRAMMAR_MAX_WORK);
                if (!ok) return ks_seterr(eb, KS_ERR_NOMEM, "grammar: out of memory");
            }
    }
    return KS_OK;
}

/* Sets m to the start state, the closure of root's alternatives (the arena
 * emptied); false when it does not exist within the bounds. */
static bool gm__start(grammar_matcher *m) {
    const grammar *g = m->g;
    m->n_nodes = m->n_tops = 0;
    m->cur = (gm_state){0};
    m->ambiguous = false;
    if (++m->stamp == 0) {
        memset(m->tstamp, 0, GM__TABLE * sizeof *m->tstamp);
        m->stamp = 1;
    }
    const gm_rule *R = &g->rules[g->root];
    uint32_t n_work = 0;
    for (uint32_t k = R->n_alts; k-- > 0 && n_work < GRAMMAR_MAX_WORK;)
        m->work[n_work++] = (uint64_t)g->alts[R->alt_first + k] << 32; // parent -1 -> 0
    return gm__close(m, &m->cur, n_work) && (m->cur.n > 0 || m->cur.complete);
}

ks_err grammar_matcher_reset(grammar_matcher *m) {
    // it succeeded at create: the same steps again, so only memory can fail
    return gm__start(m) ? KS_OK : KS_ERR_NOMEM;
}

ks_err grammar_matcher_create(grammar *g, grammar_matcher **out, ks_errbuf *eb) {
    KS_ASSERT(g && out);
    *out = NULL;
    grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return ks_seterr(eb, KS_ERR_NOMEM, "grammar matcher: out of memory");
    m->g = grammar_ref(g);
    m->tkey = malloc(GM__TABLE * sizeof *m->tkey);
    m->tstamp = calloc(GM__TABLE, sizeof *m->tstamp);
    m->work = malloc(GRAMMAR_MAX_WORK * sizeof *m->work);
    m->keybuf = malloc(GM__KEY_MAX * sizeof *m->keybuf);
    m->hc = malloc(GM__HC * sizeof *m->hc);
    if (m->hc) memset(m->hc, 0xff, GM__HC * sizeof *m->hc);
    if (!m->tkey || !m->tstamp || !m->work || !m->keybuf || !m->hc) {
        grammar_matcher_destroy(m);
        return ks_seterr(eb, KS_ERR_NOMEM, "grammar matcher: out of memory");
    }
    m->stamp = 1;
    if (!gm__start(m)) {
        grammar_matcher_destroy(m);
        return ks_seterr(eb, KS_ERR_INVAL,
                         "grammar: the root rule matches nothing, or cannot start within the "
                         "matcher's limits (%d stacks, depth %d, %d steps)",
                         GRAMMAR_MAX_STACKS, GRAMMAR_MAX_DEPTH, GRAMMAR_MAX_WORK);
    }
    *out = m;
    return KS_OK;
}

void grammar_matcher_destroy(grammar_matcher *m) {
    if (!m) return;
    for (int i = 0; i < GM__CACHE; i++) {
        free(m->cache[i].key);
        free(m->cache[i].bits);
    }
    free(m->keybuf);
    free(m->hc);
    free(m->tpm);
    free(m->cand2);
    free(m->cand);
    free(m->pstk);
    free(m->pmn);
    free(m->pmt);
    free(m->frames);
    free(m->touched);
    free(m->nodes);
    free(m->nodes2);
    free(m->tops);
    free(m->tops2);
    free(m->fwd);
    free(m->tkey);
    free(m->tstamp);
    free(m->work);
    grammar_unref(m->g);
    free(m);
}

bool grammar_matcher_accept(grammar_matcher *m, const char *bytes, size_t n) {
    uint32_t mark_nodes = m->n_nodes, mark_tops = m->n_tops;
    gm_state st = m->cur;
    m->bound_hit = false;
    for (size_t i = 0; i < n; i++) {
        gm_state nx;
        if (!gm__advance(m, &st, (uint8_t)bytes[i], &nx)) {
            m->n_nodes = mark_nodes;
            m->n_tops = mark_tops;
            m->ambiguous = m->bound_hit;
            return false;
        }
        st = nx;
    }
    gm_state old = m->cur;
    m->cur = st;
    if (!gm__compact(m)) {
        m->cur = old;
        m->n_nodes = mark_nodes;
        m->n_tops = mark_tops;
        return false;
    }
    m->ambiguous = false;
    return true;
}

bool grammar_matcher_complete(const grammar_matcher *m) { return m->cur.complete && !m->cur.need; }

bool grammar_matcher_ambiguous(const grammar_matcher *m) { return m->ambiguous; }

bool grammar_matcher_done(const grammar_matcher *m) {
    return grammar_matcher_complete(m) && m->cur.n == 0;
}

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
        if (!gm__advance(m, &f->st, cn->byte, &ns)) continue;
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
        ok = gm__node_new(m, key->pos[j], idx, &idx) == 0;
    gm_state st0 = {.off = m->n_tops};
    if (ok) ok = gm__top_add(m, &st0, idx);
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
        const bool adv = gm__advance(m, &f->st, cn->byte, &ns);
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
        gm__pmask_free(pm);
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
        atomic_load_explicit(&gm__pm_total, memory_order_relaxed) > GM__PM_TOTAL_BYTES)
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
        atomic_fetch_add_explicit(&gm__pm_total, pm->bytes, memory_order_relaxed);
    }
    pthread_mutex_unlock(&vt->mu);
    if (have || !ok) gm__pmask_free(pm); // another matcher was first, or no memory
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
            if (!gm__advance(m, &m->pstk[k], (uint8_t)pc[k], &m->pstk[k + 1])) {
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
// Constrained sampling (the engine's step and a prefill worker's first token)

/* The error of a matcher that dropped every parse at a bound: a refusal
 * of the grammar (400 where nothing was sent yet), not an end of output. */
static ks_err gm__too_ambiguous(ks_errbuf *eb) {
    ks_seterr(eb, KS_ERR_INVAL,
              "grammar: too ambiguous: every continuation passes the matcher's bounds (%d "
              "parses, %d steps per byte)",
              GRAMMAR_MAX_STACKS, GRAMMAR_MAX_WORK);
    if (eb) eb->reason = ADMIT_INVALID;
    return KS_ERR_INVAL;
}

/* The mask, then the draw: EOG ids join the allowed set when complete;
 * every other token gets -inf; if the sampler still picks a masked id (only
 * when no allowed logit beats them, a row of NaN) the lowest allowed
 * non-EOG id stands in, as greedy ties go. */
static ks_err gm__sample_masked(grammar_matcher *m, const grammar_vocab *gv, sampler *smp,
                                float *logits, uint32_t *mask, bool complete, sample_result *out,
                                bool *end, ks_errbuf *eb) {
    const int32_t V = gv->n_vocab;
    int32_t n_allowed = 0;
    if (grammar_matcher_mask(m, gv, mask, &n_allowed) != KS_OK)
        return ks_seterr(eb, KS_ERR_NOMEM, "out of memory");
    if (n_allowed == 0) {
        if (grammar_matcher_ambiguous(m)) return gm__too_ambiguous(eb);
        if (complete) {
            *end = true;
            return KS_OK;
        }
        ks_seterr(eb, KS_ERR_INVAL, "grammar: no token of the vocabulary can continue the output");
        if (eb) eb->reason = ADMIT_INVALID;
        return KS_ERR_INVAL;
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
    sample_result sr;
    sampler_sample(smp, logits, &sr);
    bool eog = gv->v && tok_is_eog(gv->v, sr.token);
    if (!(mask[sr.token >> 5] >> (sr.token & 31) & 1u)) {
        int32_t pick = -1;
        for (int32_t i = 0; i < V && pick < 0; i++)
            if ((mask[i >> 5] >> (i & 31) & 1u) && !(gv->v && tok_is_eog(gv->v, i))) pick = i;
        sr.token = pick;
        eog = false;
    }
    if (!eog && !grammar_matcher_accept_token(m, gv, sr.token))
        return grammar_matcher_ambiguous(m)
                   ? gm__too_ambiguous(eb)
                   : ks_seterr(eb, KS_ERR_INTERNAL, "grammar: the chosen token was not accepted");
    *out = sr;
    return KS_OK;
}

ks_err grammar_sample(grammar_matcher *m, const grammar_vocab *gv, sampler *smp,
                      const sample_params *sp, float *logits, uint32_t *mask, sample_result *out,
                      bool *end, ks_errbuf *eb) {
    *end = false;
    const bool complete = grammar_matcher_complete(m);
    if (sp->temperature <= 0.0f && !sp->logprobs && sp->n_probs == 0 &&
        (sp->repeat_last_n == 0 || (sp->repeat_penalty == 1.0f && sp->frequency_penalty == 0.0f &&
                                    sp->presence_penalty == 0.0f))) {
        // Greedy without penalties or logprobs: the argmax of the full row,
        // when the grammar accepts it, is the argmax of the masked row too
        // (masking only lowers the others; ties still go to the lowest id),
        // and greedy draws nothing from the PRNG and leaves the row as it
        // was; so try it first and build the mask only when it is refused.
        sample_result sr;
        sampler_sample(smp, logits, &sr);
        if (gv->v && tok_is_eog(gv->v, sr.token) ? complete
                                                 : grammar_matcher_accept_token(m, gv, sr.token)) {
            *out = sr;
            return KS_OK;
        }
    }
    return gm__sample_masked(m, gv, smp, logits, mask, complete, out, end, eb);
}
