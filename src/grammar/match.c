/* match.c — the per-sequence matcher (see grammar.h): parse stacks, their
 * closure after each character, accepting bytes, and the compile-time check
 * that one character cannot open more parses than the bounds
 * (grammar__check_bounded). Layout: grammar_int.h.
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
 * The mask (mask.c) walks the vocabulary trie with grammar__advance. */
#include "grammar_int.h"

#include <string.h>

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

/* A new node: 0, 1 when the stack would pass GRAMMAR_MAX_DEPTH (that path
 * dies), -1 when the arena is full or out of memory (the advance fails). */
int grammar__node_new(grammar_matcher *m, uint32_t pos, int32_t parent, int32_t *out) {
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

bool grammar__top_add(grammar_matcher *m, gm_state *st, int32_t idx) {
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
            int rc = grammar__node_new(m, pos, parent, &idx);
            if (rc < 0 || (rc == 0 && !grammar__top_add(m, st, idx)))
                return m->bound_hit = true, false;
        } else {
            int32_t np = parent;
            if (g->elems[pos + 1].kind != GM_END) {
                int rc = grammar__node_new(m, pos + 1, parent, &np);
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
bool grammar__advance(grammar_matcher *m, const gm_state *in, uint8_t b, gm_state *out) {
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

#define GM__CHECK_WORK 4000000 // closure steps grammar__check_bounded spends at most

/* Refuses, at compile time, a grammar in which one character opens more
 * parses than the matcher's bounds allow, whatever surrounds it: for each
 * character position, the closure after it from that rule alone (popping
 * past the rule ends the parse there) must stay within GRAMMAR_MAX_STACKS
 * tops and GRAMMAR_MAX_WORK steps. Such a grammar could only ever refuse
 * that character (every parse dropped), so it is refused with a reason
 * instead. What depends on the context (ambiguity that builds up over
 * several characters, through several rules) is caught while matching
 * (grammar_matcher_ambiguous, and grammar_sample's error). */
ks_err grammar__check_bounded(grammar_matcher *m, ks_errbuf *eb) {
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
        if (!grammar__advance(m, &st, (uint8_t)bytes[i], &nx)) {
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
