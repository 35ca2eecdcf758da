/* compile.c — GBNF text -> a compiled grammar (grammar_parse; see
 * grammar.h), and the checks that refuse, at compile time, what the
 * matcher could not bound: left recursion, and (grammar__check_bounded,
 * match.c) a character that opens too many parses.
 *
 * Compiled form (layout in grammar_int.h): a flat array of elements; each
 * alternative of a rule is a run of CHAR (a character set) and RULE (a
 * reference) elements ended by END. Groups and repetitions become
 * generated rules (x* is R ::= x R | , right-recursive so it needs no
 * stack; x{m,n} is m copies then a chain of optionals), so the matcher
 * only knows these three kinds. */
#include "grammar_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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
        if (!err) err = grammar__check_bounded(m, eb);
        grammar_matcher_destroy(m);
    }
    if (!err && !(g->text = malloc(len + 1)))
        err = ks_seterr(eb, KS_ERR_NOMEM, "grammar: out of memory");
    if (err) {
        grammar__free(g);
        return err;
    }
    if (len) memcpy(g->text, text, len);
    g->text[len] = 0;
    g->text_len = len;
    *out = g;
    return KS_OK;
}
