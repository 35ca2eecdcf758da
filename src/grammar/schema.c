/* schema.c — JSON schema -> GBNF (see grammar.h), then compiled by
 * grammar_parse (compile.c) for grammar_from_schema.
 *
 * Every subschema becomes one rule whose body accepts the compact JSON
 * texts valid against it, with bounded optional whitespace (`ws`: nothing,
 * one space, or a newline and up to 16 spaces) only after '{', '[', ':'
 * and ',' and before the closing bracket, so a model cannot loop on
 * whitespace. Objects emit their properties in the schema's order, as
 * OpenAI's strict mode does; optional ones may be left out (two rule chains:
 * "nothing emitted yet" and "something emitted, so a comma comes first").
 * Keywords outside the supported set are refused by name and JSON path:
 * silently ignoring one would let the output break the schema. Keywords
 * that constrain only another type (maxLength on an integer) are no-ops,
 * as JSON Schema says. `pattern` is compiled from its regex (a subset of
 * ECMA-262, refused construct by construct) into the string's body;
 * numeric bounds become digit-range rules (see the sections below). */
#include "kvseal/grammar.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SC_MAX_DEPTH 64 /* nesting of subschemas */
#define SC_MAX_REFS 256

typedef struct sc_buf {
    char *p;
    size_t n, cap;
} sc_buf;

typedef struct sc_ctx {
    const json_t *root;
    char prefix[48];
    sc_buf out;
    uint32_t n_rules;
    struct {
        char *ref;
        char name[64];
    } refs[SC_MAX_REFS];
    int n_refs;
    int depth;
    ks_errbuf *eb;
    ks_err err;
} sc_ctx;

static bool sc_fail(sc_ctx *c, ks_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool sc_fail(sc_ctx *c, ks_err code, const char *fmt, ...) {
    if (c->err) return false;
    char msg[440];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->err = ks_seterr(c->eb, code, "%s", msg);
    return false;
}

static bool sc_add(sc_ctx *c, sc_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > GRAMMAR_MAX_TEXT)
        return sc_fail(c, KS_ERR_NOSPACE, "schema: the grammar it compiles to is above %d bytes",
                       GRAMMAR_MAX_TEXT);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return sc_fail(c, KS_ERR_NOMEM, "schema: out of memory");
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

static bool sc_printf(sc_ctx *c, sc_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool sc_printf(sc_ctx *c, sc_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp)
        return sc_fail(c, KS_ERR_INTERNAL, "schema: rule too long");
    return sc_add(c, b, tmp, (size_t)n);
}

/* Appends s[0..n) as a GBNF string literal. */
static bool sc_lit(sc_ctx *c, sc_buf *b, const char *s, size_t n) {
    if (!sc_add(c, b, "\"", 1)) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char esc[8];
        if (ch == '"' || ch == '\\') {
            esc[0] = '\\', esc[1] = (char)ch;
            if (!sc_add(c, b, esc, 2)) return false;
        } else if (ch < 0x20 || ch == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", ch);
            if (!sc_add(c, b, esc, 4)) return false;
        } else if (!sc_add(c, b, (const char *)&ch, 1))
            return false;
    }
    return sc_add(c, b, "\"", 1);
}

/* Appends the compact JSON text of v as a literal. */
static bool sc_json_lit(sc_ctx *c, sc_buf *b, const json_t *v) {
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) return sc_fail(c, KS_ERR_NOMEM, "schema: out of memory");
    bool ok = sc_lit(c, b, t, strlen(t));
    free(t);
    return ok;
}

static void sc_newname(sc_ctx *c, char name[64]) {
    snprintf(name, 64, "%ss%u", c->prefix, ++c->n_rules);
}

/* Emits `name ::= body`. */
static bool sc_rule(sc_ctx *c, const char *name, const sc_buf *body) {
    return sc_printf(c, &c->out, "%s ::= ", name) &&
           sc_add(c, &c->out, body->p ? body->p : "", body->n) && sc_add(c, &c->out, "\n", 1);
}

static const char *const sc_annotations[] = {
    "title",      "description", "default",   "examples", "$schema",     "$id", "$comment",
    "deprecated", "readOnly",    "writeOnly", "$defs",    "definitions", NULL,
};
// clang-format off
static const char *const sc_keywords[] = {
    "type",      "enum",       "const",            "anyOf",            "oneOf",  "allOf",
    "$ref",      "properties", "required",         "additionalProperties",
    "items",     "minItems",   "maxItems",
    "minLength", "maxLength",  "format",           "pattern",
    "minimum",   "maximum",    "exclusiveMinimum", "exclusiveMaximum",
    NULL,
};
// clang-format on

static bool sc_in(const char *const *set, const char *k) {
    for (; *set; set++)
        if (!strcmp(*set, k)) return true;
    return false;
}

static bool sc_schema(sc_ctx *c, const json_t *s, const char *path, const char *force,
                      char name[64]);

/* Reads a non-negative integer keyword (absent: *v unchanged). */
static bool sc_count(sc_ctx *c, const json_t *s, const char *key, const char *path, long long *v) {
    const json_t *x = json_object_get(s, key);
    if (!x) return true;
    if (!json_is_integer(x) || json_integer_value(x) < 0)
        return sc_fail(c, KS_ERR_INVAL, "schema at %s: '%s' must be a non-negative integer", path,
                       key);
    if (json_integer_value(x) > GRAMMAR_MAX_REPEAT)
        return sc_fail(c, KS_ERR_UNSUPPORTED, "schema at %s: '%s' above %d is not supported", path,
                       key, GRAMMAR_MAX_REPEAT);
    *v = json_integer_value(x);
    return true;
}

/* "{m,n}" for GBNF ({m,} when n < 0). */
static void sc_rep(char *buf, size_t cap, long long m, long long n) {
    if (n < 0)
        snprintf(buf, cap, "{%lld,}", m);
    else
        snprintf(buf, cap, "{%lld,%lld}", m, n);
}

static bool sc_object(sc_ctx *c, const json_t *s, const char *path, const char *self, sc_buf *b) {
    const char *P = c->prefix;
    const json_t *props = json_object_get(s, "properties");
    const json_t *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return sc_fail(c, KS_ERR_INVAL, "schema at %s: 'properties' must be an object", path);
    if (req && !json_is_array(req))
        return sc_fail(c, KS_ERR_INVAL, "schema at %s: 'required' must be an array", path);
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return sc_fail(c, KS_ERR_INVAL,
                       "schema at %s: 'additionalProperties' must be a boolean or a schema", path);
    size_t n = props ? json_object_size(props) : 0;
    // every required name must be a declared property: only those are emitted
    size_t i;
    const json_t *r;
    json_array_foreach(req, i, r) {
        if (!json_is_string(r))
            return sc_fail(c, KS_ERR_INVAL, "schema at %s: 'required' must hold strings", path);
        if (!props || !json_object_get(props, json_string_value(r)))
            return sc_fail(c, KS_ERR_UNSUPPORTED,
                           "schema at %s: required property '%.64s' is not in 'properties' "
                           "(only declared properties are generated)",
                           path, json_string_value(r));
    }
    if (n == 0) {
        if (json_is_object(addl)) { // a map: string -> schema
            char v[64], p2[256];
            snprintf(p2, sizeof p2, "%.200s/additionalProperties", path);
            if (!sc_schema(c, addl, p2, NULL, v)) return false;
            return sc_printf(c, b,
                             "\"{\" %sws ( %sstring %sws \":\" %sws %s %sws ( \",\" %sws %sstring "
                             "%sws \":\" %sws %s %sws )* )? \"}\"",
                             P, P, P, P, v, P, P, P, P, P, v, P);
        }
        if (json_is_false(addl)) return sc_printf(c, b, "\"{\" %sws \"}\"", P);
        return sc_printf(c, b, "%sobject", P);
    }
    // one rule per property value, then the two chains
    char(*vals)[64] = malloc(n * sizeof *vals);
    bool *required = calloc(n, sizeof *required);
    const char **keys = malloc(n * sizeof *keys);
    bool ok = vals && required && keys;
    if (!ok) sc_fail(c, KS_ERR_NOMEM, "schema: out of memory");
    const char *k;
    const json_t *v;
    i = 0;
    json_object_foreach((json_t *)props, k, v) {
        if (!ok) break;
        char p2[256];
        snprintf(p2, sizeof p2, "%.160s/properties/%.64s", path, k);
        keys[i] = k;
        ok = sc_schema(c, v, p2, NULL, vals[i]);
        size_t j;
        const json_t *rr;
        json_array_foreach(req, j, rr) if (!strcmp(json_string_value(rr), k)) required[i] = true;
        i++;
    }
    // a{i}: after something was emitted; f{i}: nothing emitted yet
    for (size_t j = n; ok && j-- > 0;) {
        sc_buf kv = {0};
        ok = sc_printf(c, &kv, "%s", "");
        if (ok) {
            json_t *ks = json_string(keys[j]);
            ok = ks && sc_json_lit(c, &kv, ks);
            json_decref(ks);
        }
        char after[80] = "";
        if (j + 1 < n) snprintf(after, sizeof after, "%s-a%zu", self, j + 1);
        ok = ok && sc_printf(c, &kv, " %sws \":\" %sws %s %sws", P, P, vals[j], P);
        ok = ok && sc_printf(c, &c->out, "%s-a%zu ::= ( \",\" %sws ", self, j, P) &&
             sc_add(c, &c->out, kv.p, kv.n) &&
             sc_printf(c, &c->out, " )%s %s\n", required[j] ? "" : "?", after);
        ok = ok && sc_printf(c, &c->out, "%s-f%zu ::= ", self, j) && sc_add(c, &c->out, kv.p, kv.n);
        if (ok && required[j])
            ok = sc_printf(c, &c->out, " %s\n", after);
        else if (ok) {
            if (j + 1 < n)
                ok = sc_printf(c, &c->out, " %s | %s-f%zu\n", after, self, j + 1);
            else
                ok = sc_printf(c, &c->out, " | \"\"\n");
        }
        free(kv.p);
    }
    if (ok) ok = sc_printf(c, b, "\"{\" %sws %s-f0 \"}\"", P, self);
    free(vals);
    free(required);
    free(keys);
    return ok;
}

static bool sc_array(sc_ctx *c, const json_t *s, const char *path, sc_buf *b) {
    const char *P = c->prefix;
    const json_t *items = json_object_get(s, "items");
    char e[64];
    if (items && json_is_array(items))
        return sc_fail(c, KS_ERR_UNSUPPORTED,
                       "schema at %s: 'items' as an array (tuples) is not supported", path);
    if (items) {
        char p2[256];
        snprintf(p2, sizeof p2, "%.200s/items", path);
        if (!sc_schema(c, items, p2, NULL, e)) return false;
    } else {
        snprintf(e, sizeof e, "%svalue", P);
    }
    long long lo = 0, hi = -1;
    if (!sc_count(c, s, "minItems", path, &lo) || !sc_count(c, s, "maxItems", path, &hi))
        return false;
    if (hi >= 0 && hi < lo)
        return sc_fail(c, KS_ERR_INVAL, "schema at %s: maxItems %lld below minItems %lld", path, hi,
                       lo);
    if (hi == 0) return sc_printf(c, b, "\"[\" %sws \"]\"", P);
    char rep[48];
    sc_rep(rep, sizeof rep, lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
    if (lo == 0)
        return sc_printf(c, b, "\"[\" %sws ( %s %sws ( \",\" %sws %s %sws )%s )? \"]\"", P, e, P, P,
                         e, P, rep);
    return sc_printf(c, b, "\"[\" %sws %s %sws ( \",\" %sws %s %sws )%s \"]\"", P, e, P, P, e, P,
                     rep);
}

// ----------------------------------------------------------------------------
// pattern: a subset of ECMA-262 regular expressions -> the body of a JSON
// string. The whole string must match (anchors or not; see
// docs/structured-output.md); each character the regex allows is emitted
// as JSON spells it: '"', '\' and control characters as escapes.

#define RX_MAX_RANGES 256 /* ranges of one character set */
#define RX_MAX_DEPTH 32   /* group nesting */
#define RX_MAX_CP 0x10ffffu

typedef struct rx_range {
    uint32_t lo, hi;
} rx_range;

typedef struct rx_set {
    rx_range r[RX_MAX_RANGES];
    uint32_t n;
} rx_set;

typedef struct sc_rx {
    sc_ctx *c;
    const char *s; // the pattern (UTF-8, n bytes)
    size_t n, i;   // i: the cursor
    const char *path;
    int depth;
} sc_rx;

static bool rx_refuse(sc_rx *x, size_t at, const char *what) {
    return sc_fail(x->c, KS_ERR_UNSUPPORTED,
                   "schema at %s: pattern: %s at offset %zu is not supported", x->path, what, at);
}

static bool rx_invalid(sc_rx *x, size_t at, const char *what) {
    return sc_fail(x->c, KS_ERR_INVAL, "schema at %s: pattern: %s at offset %zu", x->path, what,
                   at);
}

static bool rx_add(sc_rx *x, rx_set *s, uint32_t lo, uint32_t hi) {
    if (s->n >= RX_MAX_RANGES) return rx_refuse(x, x->i, "a character set of more than 256 ranges");
    s->r[s->n++] = (rx_range){lo, hi};
    return true;
}

static int rx_cmp(const void *a, const void *b) {
    const rx_range *p = a, *q = b;
    return p->lo < q->lo ? -1 : p->lo > q->lo;
}

/* Sorts and merges the ranges of s. */
static void rx_norm(rx_set *s) {
    if (!s->n) return;
    qsort(s->r, s->n, sizeof *s->r, rx_cmp);
    uint32_t k = 0;
    for (uint32_t i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[k].hi + 1) {
            if (s->r[i].hi > s->r[k].hi) s->r[k].hi = s->r[i].hi;
        } else
            s->r[++k] = s->r[i];
    }
    s->n = k + 1;
}

/* s := every code point (surrogates excluded) not in s. */
static bool rx_negate(sc_rx *x, rx_set *s) {
    rx_norm(s);
    rx_set t = {.n = 0};
    uint32_t next = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        if (s->r[i].lo > next && !rx_add(x, &t, next, s->r[i].lo - 1)) return false;
        next = s->r[i].hi + 1;
    }
    if (next <= RX_MAX_CP && !rx_add(x, &t, next, RX_MAX_CP)) return false;
    *s = t;
    return true;
}

/* s minus [lo, hi]. */
static bool rx_remove(sc_rx *x, rx_set *s, uint32_t lo, uint32_t hi) {
    rx_set t = {.n = 0};
    for (uint32_t i = 0; i < s->n; i++) {
        rx_range r = s->r[i];
        if (r.hi < lo || r.lo > hi) {
            if (!rx_add(x, &t, r.lo, r.hi)) return false;
            continue;
        }
        if (r.lo < lo && !rx_add(x, &t, r.lo, lo - 1)) return false;
        if (r.hi > hi && !rx_add(x, &t, hi + 1, r.hi)) return false;
    }
    *s = t;
    return true;
}

static bool rx_has(const rx_set *s, uint32_t cp) {
    for (uint32_t i = 0; i < s->n; i++)
        if (cp >= s->r[i].lo && cp <= s->r[i].hi) return true;
    return false;
}

/* Adds the class of \d \w \s (lower case) or its complement (upper case). */
static bool rx_class_escape(sc_rx *x, rx_set *s, char e) {
    static const rx_range d[] = {{'0', '9'}};
    static const rx_range w[] = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    static const rx_range sp[] = {
        {'\t', '\r'},     {' ', ' '},       {0xa0, 0xa0},     {0x1680, 0x1680}, {0x2000, 0x200a},
        {0x2028, 0x2029}, {0x202f, 0x202f}, {0x205f, 0x205f}, {0x3000, 0x3000}, {0xfeff, 0xfeff}};
    const rx_range *r;
    uint32_t n;
    char l = (char)(e | 0x20);
    if (l == 'd')
        r = d, n = 1;
    else if (l == 'w')
        r = w, n = 4;
    else
        r = sp, n = sizeof sp / sizeof sp[0];
    rx_set t = {.n = 0};
    for (uint32_t i = 0; i < n; i++)
        if (!rx_add(x, &t, r[i].lo, r[i].hi)) return false;
    if (e != l && !rx_negate(x, &t)) return false;
    for (uint32_t i = 0; i < t.n; i++)
        if (!rx_add(x, s, t.r[i].lo, t.r[i].hi)) return false;
    return true;
}

static int rx_hex(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Reads n hex digits at the cursor into *v; false (no error set) if absent. */
static bool rx_hexn(sc_rx *x, int n, uint32_t *v) {
    if (x->n - x->i < (size_t)n) return false;
    uint32_t a = 0;
    for (int k = 0; k < n; k++) {
        int h = rx_hex(x->s[x->i + (size_t)k]);
        if (h < 0) return false;
        a = a << 4 | (uint32_t)h;
    }
    x->i += (size_t)n;
    *v = a;
    return true;
}

/* Decodes one UTF-8 character at the cursor. */
static bool rx_utf8(sc_rx *x, uint32_t *cp) {
    const unsigned char *q = (const unsigned char *)x->s + x->i;
    size_t left = x->n - x->i;
    uint32_t v, k;
    if (q[0] < 0x80)
        v = q[0], k = 1;
    else if (q[0] >= 0xc2 && q[0] <= 0xdf)
        v = q[0] & 0x1f, k = 2;
    else if (q[0] >= 0xe0 && q[0] <= 0xef)
        v = q[0] & 0x0f, k = 3;
    else if (q[0] >= 0xf0 && q[0] <= 0xf4)
        v = q[0] & 0x07, k = 4;
    else
        return rx_invalid(x, x->i, "invalid UTF-8");
    if (left < k) return rx_invalid(x, x->i, "truncated UTF-8");
    for (uint32_t j = 1; j < k; j++) {
        if ((q[j] & 0xc0) != 0x80) return rx_invalid(x, x->i, "invalid UTF-8");
        v = v << 6 | (q[j] & 0x3f);
    }
    x->i += k;
    *cp = v;
    return true;
}

/* An escape after '\' (the cursor past the backslash; at: the backslash):
 * a class escape is added to s and *cp set to UINT32_MAX, a single
 * character is returned in *cp. in_class: inside [...] (\b is backspace). */
static bool rx_escape(sc_rx *x, size_t at, bool in_class, rx_set *s, uint32_t *cp) {
    if (x->i >= x->n) return rx_invalid(x, at, "'\\' at the end");
    char e = x->s[x->i++];
    *cp = UINT32_MAX;
    switch (e) {
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S':
        return rx_class_escape(x, s, e);
    case 'n':
        *cp = '\n';
        return true;
    case 'r':
        *cp = '\r';
        return true;
    case 't':
        *cp = '\t';
        return true;
    case 'f':
        *cp = '\f';
        return true;
    case 'v':
        *cp = '\v';
        return true;
    case '0':
        if (x->i < x->n && x->s[x->i] >= '0' && x->s[x->i] <= '9')
            return rx_refuse(x, at, "an octal escape");
        *cp = 0;
        return true;
    case 'b':
        if (in_class) {
            *cp = '\b';
            return true;
        }
        return rx_refuse(x, at, "a word boundary '\\b'");
    case 'B':
        return rx_refuse(x, at, "a word boundary '\\B'");
    case 'k':
        return rx_refuse(x, at, "a named backreference '\\k'");
    case 'p':
    case 'P':
        return rx_refuse(x, at, "a Unicode property escape");
    case 'c':
        return rx_refuse(x, at, "a control escape '\\c'");
    case 'x':
        if (!rx_hexn(x, 2, cp)) return rx_invalid(x, at, "'\\x' needs two hex digits");
        return true;
    case 'u': {
        if (x->i < x->n && x->s[x->i] == '{') {
            size_t j = x->i + 1;
            uint32_t v = 0;
            int nd = 0;
            for (; j < x->n && rx_hex(x->s[j]) >= 0 && nd < 7; j++, nd++)
                v = v << 4 | (uint32_t)rx_hex(x->s[j]);
            if (!nd || j >= x->n || x->s[j] != '}' || v > RX_MAX_CP)
                return rx_invalid(x, at, "a malformed '\\u{...}'");
            x->i = j + 1;
            *cp = v;
        } else if (!rx_hexn(x, 4, cp))
            return rx_invalid(x, at, "'\\u' needs four hex digits");
        if (*cp >= 0xd800 && *cp <= 0xdbff && x->n - x->i >= 6 && x->s[x->i] == '\\' &&
            x->s[x->i + 1] == 'u') {
            size_t save = x->i;
            uint32_t lo;
            x->i += 2;
            if (rx_hexn(x, 4, &lo) && lo >= 0xdc00 && lo <= 0xdfff) {
                *cp = 0x10000 + ((*cp - 0xd800) << 10) + (lo - 0xdc00);
                return true;
            }
            x->i = save;
        }
        if (*cp >= 0xd800 && *cp <= 0xdfff) return rx_refuse(x, at, "a lone surrogate");
        return true;
    }
    default:
        break;
    }
    if (e >= '1' && e <= '9') return rx_refuse(x, at, "a backreference");
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (unsigned char)e >= 0x80)
        return rx_invalid(x, at, "an unknown escape");
    *cp = (unsigned char)e; // \. \\ \/ \- \^ \$ \| \( \) \[ \] \{ \} \* \+ \? ...
    return true;
}

/* Appends one code point to a GBNF character class. */
static bool rx_class_cp(sc_ctx *c, sc_buf *b, uint32_t cp) {
    if ((cp >= '0' && cp <= '9') || (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z'))
        return sc_printf(c, b, "%c", (char)cp);
    if (cp < 0x100) return sc_printf(c, b, "\\x%02X", cp);
    if (cp < 0x10000) return sc_printf(c, b, "\\u%04X", cp);
    return sc_printf(c, b, "\\U%08X", cp);
}

/* Emits one character of s as JSON string content spells it: a GBNF
 * term (parenthesized when it has alternatives). */
static bool rx_emit_set(sc_rx *x, sc_buf *b, rx_set *s, size_t at) {
    sc_ctx *c = x->c;
    rx_norm(s);
    if (!rx_remove(x, s, 0xd800, 0xdfff)) return false;
    rx_set raw = *s;
    if (!rx_remove(x, &raw, 0, 0x1f) || !rx_remove(x, &raw, '"', '"') ||
        !rx_remove(x, &raw, '\\', '\\'))
        return false;
    const char *alt[40];
    char esc[32][24];
    int n = 0, ne = 0;
    if (rx_has(s, '"')) alt[n++] = "\"\\\\\\\"\"";
    if (rx_has(s, '\\')) alt[n++] = "\"\\\\\\\\\"";
    bool all_ctl = true;
    for (uint32_t ch = 0; ch < 0x20; ch++)
        all_ctl = all_ctl && rx_has(s, ch);
    if (all_ctl)
        alt[n++] = "\"\\\\u00\" [01] [0-9a-fA-F] | \"\\\\\" [bfnrt]";
    else
        for (uint32_t ch = 0; ch < 0x20; ch++) {
            if (!rx_has(s, ch)) continue;
            const char *sh = ch == '\n'   ? "n"
                             : ch == '\t' ? "t"
                             : ch == '\r' ? "r"
                             : ch == '\b' ? "b"
                             : ch == '\f' ? "f"
                                          : NULL;
            if (sh)
                snprintf(esc[ne], sizeof esc[ne], "\"\\\\%s\"", sh);
            else if ((ch & 0xf) < 10) // the hex digits in either case
                snprintf(esc[ne], sizeof esc[ne], "\"\\\\u00%u%u\"", ch >> 4, ch & 0xf);
            else
                snprintf(esc[ne], sizeof esc[ne], "\"\\\\u00%u\" [%c%c]", ch >> 4,
                         'a' + (ch & 0xf) - 10, 'A' + (ch & 0xf) - 10);
            alt[n++] = esc[ne++];
        }
    if (!raw.n && !n) return rx_refuse(x, at, "a character set that matches nothing");
    int terms = n + (raw.n ? 1 : 0);
    if (terms > 1 && !sc_add(c, b, "( ", 2)) return false;
    if (raw.n == 1 && raw.r[0].lo == raw.r[0].hi) {
        char u[8];
        uint32_t cp = raw.r[0].lo;
        size_t k = 0;
        if (cp < 0x80)
            u[k++] = (char)cp;
        else if (cp < 0x800)
            u[k++] = (char)(0xc0 | cp >> 6), u[k++] = (char)(0x80 | (cp & 0x3f));
        else if (cp < 0x10000)
            u[k++] = (char)(0xe0 | cp >> 12), u[k++] = (char)(0x80 | (cp >> 6 & 0x3f)),
            u[k++] = (char)(0x80 | (cp & 0x3f));
        else
            u[k++] = (char)(0xf0 | cp >> 18), u[k++] = (char)(0x80 | (cp >> 12 & 0x3f)),
            u[k++] = (char)(0x80 | (cp >> 6 & 0x3f)), u[k++] = (char)(0x80 | (cp & 0x3f));
        if (!sc_lit(c, b, u, k)) return false;
    } else if (raw.n) {
        if (!sc_add(c, b, "[", 1)) return false;
        for (uint32_t i = 0; i < raw.n; i++) {
            if (!rx_class_cp(c, b, raw.r[i].lo)) return false;
            if (raw.r[i].hi != raw.r[i].lo &&
                (!sc_add(c, b, "-", 1) || !rx_class_cp(c, b, raw.r[i].hi)))
                return false;
        }
        if (!sc_add(c, b, "]", 1)) return false;
    }
    for (int i = 0; i < n; i++) {
        if ((i || raw.n) && !sc_add(c, b, " | ", 3)) return false;
        if (!sc_add(c, b, alt[i], strlen(alt[i]))) return false;
    }
    return terms > 1 ? sc_add(c, b, " )", 2) : true;
}

/* [...] at the cursor (on '['). */
static bool rx_class(sc_rx *x, rx_set *s) {
    size_t at = x->i++;
    bool neg = x->i < x->n && x->s[x->i] == '^';
    if (neg) x->i++;
    while (x->i < x->n && x->s[x->i] != ']') {
        size_t a0 = x->i;
        uint32_t lo, hi;
        if (x->s[x->i] == '\\') {
            x->i++;
            if (!rx_escape(x, a0, true, s, &lo)) return false;
        } else if (!rx_utf8(x, &lo))
            return false;
        if (x->i + 1 < x->n && x->s[x->i] == '-' && x->s[x->i + 1] != ']') {
            size_t a1 = ++x->i;
            if (x->s[x->i] == '\\') {
                x->i++;
                if (!rx_escape(x, a1, true, s, &hi)) return false;
            } else if (!rx_utf8(x, &hi))
                return false;
            if (lo == UINT32_MAX || hi == UINT32_MAX)
                return rx_invalid(x, a0, "a range with a class escape as an end");
            if (hi < lo) return rx_invalid(x, a0, "a range out of order");
            if (!rx_add(x, s, lo, hi)) return false;
        } else if (lo != UINT32_MAX && !rx_add(x, s, lo, lo))
            return false;
    }
    if (x->i >= x->n) return rx_invalid(x, at, "an unterminated '['");
    x->i++;
    if (!neg && !s->n) return rx_refuse(x, at, "an empty class '[]' (it matches nothing)");
    return !neg || rx_negate(x, s);
}

static bool rx_alts(sc_rx *x, sc_buf *b);

/* One atom at the cursor, as a GBNF term in b. */
static bool rx_atom(sc_rx *x, sc_buf *b) {
    sc_ctx *c = x->c;
    size_t at = x->i;
    char ch = x->s[x->i];
    rx_set s = {.n = 0};
    if (ch == '(') {
        x->i++;
        if (x->i < x->n && x->s[x->i] == '?') {
            const char *q = x->s + x->i + 1;
            size_t left = x->n - x->i - 1;
            if (left >= 1 && q[0] == ':')
                x->i += 2;
            else if (left >= 1 && (q[0] == '=' || q[0] == '!'))
                return rx_refuse(x, at, "a lookahead");
            else if (left >= 2 && q[0] == '<' && (q[1] == '=' || q[1] == '!'))
                return rx_refuse(x, at, "a lookbehind");
            else if (left >= 1 && q[0] == '<') {
                const char *e = memchr(q, '>', left);
                if (!e) return rx_invalid(x, at, "an unterminated group name");
                x->i = (size_t)(e - x->s) + 1; // a named group: just a group here
            } else
                return rx_refuse(x, at, "a group modifier '(?'");
        }
        if (++x->depth > RX_MAX_DEPTH) return rx_refuse(x, at, "groups nested deeper than 32");
        if (!sc_add(c, b, "( ", 2) || !rx_alts(x, b)) return false;
        x->depth--;
        if (x->i >= x->n || x->s[x->i] != ')') return rx_invalid(x, at, "an unclosed '('");
        x->i++;
        return sc_add(c, b, " )", 2);
    }
    if (ch == '[') {
        if (!rx_class(x, &s)) return false;
    } else if (ch == '.') {
        x->i++;
        if (!rx_add(x, &s, '\n', '\n') || !rx_add(x, &s, '\r', '\r') ||
            !rx_add(x, &s, 0x2028, 0x2029) || !rx_negate(x, &s))
            return false;
    } else if (ch == '\\') {
        x->i++;
        uint32_t cp;
        if (!rx_escape(x, at, false, &s, &cp)) return false;
        if (cp != UINT32_MAX && !rx_add(x, &s, cp, cp)) return false;
    } else if (ch == '*' || ch == '+' || ch == '?' || ch == '{') {
        return rx_invalid(x, at, "a quantifier with nothing to repeat");
    } else if (ch == '^') {
        return rx_refuse(x, at, "an anchor '^' other than at the start");
    } else if (ch == '$') {
        return rx_refuse(x, at, "an anchor '$' other than at the end");
    } else {
        uint32_t cp;
        if (!rx_utf8(x, &cp) || !rx_add(x, &s, cp, cp)) return false;
    }
    return rx_emit_set(x, b, &s, at);
}

/* Reads a decimal at the cursor (up to GRAMMAR_MAX_REPEAT); false: none. */
static bool rx_num(sc_rx *x, long long *v) {
    size_t j = x->i;
    long long a = 0;
    while (j < x->n && x->s[j] >= '0' && x->s[j] <= '9' && a <= GRAMMAR_MAX_REPEAT)
        a = a * 10 + (x->s[j++] - '0');
    if (j == x->i) return false;
    x->i = j;
    *v = a;
    return true;
}

/* A quantifier at the cursor, if any, applied to the term b[start..). */
static bool rx_quant(sc_rx *x, sc_buf *b, size_t start) {
    if (x->i >= x->n) return true;
    size_t at = x->i;
    char ch = x->s[x->i];
    char q[48];
    if (ch == '*' || ch == '+' || ch == '?') {
        x->i++;
        snprintf(q, sizeof q, "%c", ch);
    } else if (ch == '{') {
        long long lo, hi;
        x->i++;
        if (!rx_num(x, &lo)) return rx_invalid(x, at, "a malformed '{' quantifier");
        hi = lo;
        if (x->i < x->n && x->s[x->i] == ',') {
            x->i++;
            hi = -1;
            if (x->i < x->n && x->s[x->i] != '}' && !rx_num(x, &hi))
                return rx_invalid(x, at, "a malformed '{' quantifier");
        }
        if (x->i >= x->n || x->s[x->i] != '}')
            return rx_invalid(x, at, "a malformed '{' quantifier");
        x->i++;
        if (lo > GRAMMAR_MAX_REPEAT || hi > GRAMMAR_MAX_REPEAT)
            return rx_refuse(x, at, "a repetition count above 1000");
        if (hi >= 0 && hi < lo) return rx_invalid(x, at, "a quantifier {n,m} with m below n");
        sc_rep(q, sizeof q, lo, hi);
    } else
        return true;
    if (x->i < x->n && x->s[x->i] == '?') return rx_refuse(x, x->i, "a lazy quantifier");
    if (x->i < x->n && (x->s[x->i] == '*' || x->s[x->i] == '+' || x->s[x->i] == '{'))
        return rx_refuse(x, x->i, "a quantifier after a quantifier");
    // ( term )q: the term was written at b[start..)
    if (!sc_add(x->c, b, " )", 2) || !sc_add(x->c, b, q, strlen(q))) return false;
    if (!sc_add(x->c, b, "  ", 2)) return false; // room for "( " in front
    memmove(b->p + start + 2, b->p + start, b->n - 2 - start);
    memcpy(b->p + start, "( ", 2);
    return true;
}

/* Alternatives up to ')' or the end, as one GBNF term group body. */
static bool rx_alts(sc_rx *x, sc_buf *b) {
    bool first_item = true;
    for (;;) {
        if (x->i >= x->n || x->s[x->i] == ')') {
            if (first_item && !sc_add(x->c, b, "\"\"", 2)) return false; // an empty alternative
            return true;
        }
        char ch = x->s[x->i];
        if (ch == '|') {
            x->i++;
            if (first_item && !sc_add(x->c, b, "\"\"", 2)) return false;
            if (!sc_add(x->c, b, " | ", 3)) return false;
            first_item = true;
            continue;
        }
        if (!first_item && !sc_add(x->c, b, " ", 1)) return false;
        size_t start = b->n;
        if (!rx_atom(x, b) || !rx_quant(x, b, start)) return false;
        first_item = false;
    }
}

/* The body of a string rule for pattern pat: the quotes and the regex. */
static bool sc_pattern(sc_ctx *c, const char *pat, size_t n, const char *path, sc_buf *b) {
    sc_rx x = {.c = c, .s = pat, .n = n, .path = path};
    if (x.n && pat[0] == '^') x.i = 1;
    // a trailing '$' not escaped: an odd number of backslashes before it escapes it
    if (x.n > x.i && pat[x.n - 1] == '$') {
        size_t k = 0;
        while (k + 2 <= x.n && pat[x.n - 2 - k] == '\\')
            k++;
        if (k % 2 == 0) x.n--;
    }
    if (!sc_add(c, b, "\"\\\"\" ( ", 7) || !rx_alts(&x, b)) return false;
    if (x.i < x.n) return rx_invalid(&x, x.i, "an unmatched ')'");
    return sc_add(c, b, " ) \"\\\"\"", 7);
}

// ----------------------------------------------------------------------------
// minimum / maximum / exclusiveMinimum / exclusiveMaximum: digit-range
// grammars. An integer range becomes, per digit count, the decimal strings
// between two equal-length bounds (no leading zeros, no "-0"). A bounded
// number is an integer in range, or a fraction (its last digit non-zero,
// no exponent) whose whole unit interval (I, I+1) lies in range: always
// valid, complete for integers; see docs/structured-output.md.

#define SC_NUM_CAP 9999999999999999LL    /* an unbounded side: 16 digits, as `integer` */
#define SC_NUM_BIG 1000000000000000000LL /* 10^18: the largest bound accepted */

/* The decimal strings of every value in [x, y], both n digits. */
static bool sc_same_len(sc_ctx *c, sc_buf *b, const char *x, const char *y, int n) {
    int k = 0;
    while (k < n && x[k] == y[k])
        k++;
    if (k == n) return sc_lit(c, b, x, (size_t)n);
    if (k && (!sc_lit(c, b, x, (size_t)k) || !sc_add(c, b, " ", 1))) return false;
    int r = n - k - 1;
    bool xz = true, y9 = true;
    for (int i = k + 1; i < n; i++)
        xz = xz && x[i] == '0', y9 = y9 && y[i] == '9';
    int mlo = x[k] - '0' + (xz ? 0 : 1), mhi = y[k] - '0' - (y9 ? 0 : 1);
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    bool any = false;
    if (!sc_add(c, b, "( ", 2)) return false;
    if (!xz) {
        if (!sc_printf(c, b, "\"%c\" ", x[k]) || !sc_same_len(c, b, x + k + 1, nines, r))
            return false;
        any = true;
    }
    if (mlo <= mhi) {
        if (any && !sc_add(c, b, " | ", 3)) return false;
        if (!sc_printf(c, b, "[%d-%d]", mlo, mhi)) return false;
        if (r && !sc_printf(c, b, " [0-9]{%d}", r)) return false;
        any = true;
    }
    if (!y9) {
        if (any && !sc_add(c, b, " | ", 3)) return false;
        if (!sc_printf(c, b, "\"%c\" ", y[k]) || !sc_same_len(c, b, zeros, y + k + 1, r))
            return false;
    }
    return sc_add(c, b, " )", 2);
}

/* Alternatives for the decimal strings of [lo, hi] (0 <= lo <= hi): "0"
 * and numbers without leading zeros. *first: nothing emitted yet. */
static bool sc_uint_range(sc_ctx *c, sc_buf *b, unsigned long long lo, unsigned long long hi,
                          bool *first) {
    if (lo == 0) {
        if (!*first && !sc_add(c, b, " | ", 3)) return false;
        if (!sc_add(c, b, "\"0\"", 3)) return false;
        *first = false;
        if (hi == 0) return true;
        lo = 1;
    }
    unsigned long long p = 1; // 10^(d-1)
    for (int d = 1; d <= 19; d++, p *= 10) {
        unsigned long long top = p * 10 - 1; // 10^d - 1 (fits: d <= 19)
        if (top < lo) continue;
        if (p > hi) break;
        unsigned long long a = lo > p ? lo : p, z = hi < top ? hi : top;
        char xs[24], ys[24];
        snprintf(xs, sizeof xs, "%llu", a);
        snprintf(ys, sizeof ys, "%llu", z);
        if (!*first && !sc_add(c, b, " | ", 3)) return false;
        if (!sc_same_len(c, b, xs, ys, d)) return false;
        *first = false;
    }
    return true;
}

/* Alternatives for the integers of [lo, hi] (|lo|, |hi| <= 10^18). */
static bool sc_int_range(sc_ctx *c, sc_buf *b, long long lo, long long hi, bool *first) {
    if (lo > hi) return true;
    if (lo < 0) {
        unsigned long long mlo = hi < 0 ? (unsigned long long)-hi : 1;
        bool f2 = true;
        if (!*first && !sc_add(c, b, " | ", 3)) return false;
        if (!sc_add(c, b, "\"-\" ( ", 6) ||
            !sc_uint_range(c, b, mlo, (unsigned long long)-lo, &f2) || !sc_add(c, b, " )", 2))
            return false;
        *first = false;
    }
    if (hi >= 0)
        return sc_uint_range(c, b, (unsigned long long)(lo > 0 ? lo : 0), (unsigned long long)hi,
                             first);
    return true;
}

/* One bound keyword: false with the error set if malformed. *has: present
 * (as a number); v its value; is_int: an exact JSON integer (iv). */
typedef struct sc_bound {
    bool has, excl;
    bool is_int;
    long long iv;
    double v;
} sc_bound;

static bool sc_bound_read(sc_ctx *c, const json_t *s, const char *key, bool excl, const char *path,
                          sc_bound *out) {
    const json_t *x = json_object_get(s, key);
    memset(out, 0, sizeof *out);
    if (!x || (excl && json_is_boolean(x))) return true; // draft 4's form: read by the caller
    if (!json_is_number(x))
        return sc_fail(c, KS_ERR_INVAL, "schema at %s: '%s' must be a number", path, key);
    out->has = true;
    out->excl = excl;
    if (json_is_integer(x)) {
        out->is_int = true;
        out->iv = json_integer_value(x);
        if (out->iv > SC_NUM_BIG || out->iv < -SC_NUM_BIG)
            return sc_fail(c, KS_ERR_UNSUPPORTED,
                           "schema at %s: '%s' beyond +-10^18 is not supported", path, key);
        return true;
    }
    out->v = json_real_value(x);
    if (!(out->v >= -1e15 && out->v <= 1e15))
        return sc_fail(c, KS_ERR_UNSUPPORTED,
                       "schema at %s: a fractional '%s' beyond +-10^15 is not supported", path,
                       key);
    return true;
}

/* floor (up false) or ceil of a bound's value. */
static long long sc_bound_round(const sc_bound *bd, bool up) {
    if (bd->is_int) return bd->iv;
    return (long long)(up ? ceil(bd->v) : floor(bd->v));
}

/* The integer limits the bounds of s put on integers (*alo..*ahi) and on
 * the unit intervals of fractions (*flo: ceil of the lower bound, *fhi:
 * floor of the upper; *has_lo / *has_hi: a side is bounded). */
static bool sc_bounds(sc_ctx *c, const json_t *s, const char *path, long long *alo, long long *ahi,
                      long long *flo, long long *fhi, bool *has_lo, bool *has_hi) {
    sc_bound bd[4];
    static const char *const keys[] = {"minimum", "exclusiveMinimum", "maximum",
                                       "exclusiveMaximum"};
    for (int k = 0; k < 4; k++)
        if (!sc_bound_read(c, s, keys[k], k == 1 || k == 3, path, &bd[k])) return false;
    for (int k = 1; k < 4; k += 2) { // draft 4: "exclusiveMinimum": true makes minimum exclusive
        const json_t *x = json_object_get(s, keys[k]);
        if (!json_is_boolean(x)) continue;
        if (json_is_true(x) && !bd[k - 1].has)
            return sc_fail(c, KS_ERR_INVAL, "schema at %s: '%s': true needs '%s'", path, keys[k],
                           keys[k - 1]);
        bd[k - 1].excl = json_is_true(x);
    }
    *has_lo = bd[0].has || bd[1].has;
    *has_hi = bd[2].has || bd[3].has;
    *alo = *flo = -SC_NUM_BIG - 1;
    *ahi = *fhi = SC_NUM_BIG + 1;
    for (int k = 0; k < 2; k++) {
        if (!bd[k].has) continue;
        long long f = sc_bound_round(&bd[k], true);
        long long a = bd[k].excl ? sc_bound_round(&bd[k], false) + 1 : f;
        if (a > *alo) *alo = a;
        if (f > *flo) *flo = f;
    }
    for (int k = 2; k < 4; k++) {
        if (!bd[k].has) continue;
        long long f = sc_bound_round(&bd[k], false);
        long long a = bd[k].excl ? sc_bound_round(&bd[k], true) - 1 : f;
        if (a < *ahi) *ahi = a;
        if (f < *fhi) *fhi = f;
    }
    // an unbounded side stops at 16 digits, or at 10^18 past a bound that is already longer
    if (!*has_lo) *alo = *flo = *ahi < -SC_NUM_CAP ? -SC_NUM_BIG : -SC_NUM_CAP;
    if (!*has_hi) *ahi = *fhi = *alo > SC_NUM_CAP ? SC_NUM_BIG : SC_NUM_CAP;
    return true;
}

static bool sc_has_bounds(const json_t *s) {
    return json_object_get(s, "minimum") || json_object_get(s, "maximum") ||
           json_object_get(s, "exclusiveMinimum") || json_object_get(s, "exclusiveMaximum");
}

/* An integer or number schema with bounds; integer: only integers. */
static bool sc_bounded(sc_ctx *c, const json_t *s, const char *path, bool integer, sc_buf *b) {
    long long alo = 0, ahi = 0, flo = 0, fhi = 0;
    bool has_lo = false, has_hi = false;
    if (!sc_bounds(c, s, path, &alo, &ahi, &flo, &fhi, &has_lo, &has_hi)) return false;
    bool first = true;
    if (!sc_add(c, b, "( ", 2) || !sc_int_range(c, b, alo, ahi, &first)) return false;
    if (!integer) {
        // I "." f with (I, I+1) inside the bounds; "-" I "." f with (-I-1, -I) inside
        const char *frac = " \".\" [0-9]{0,15} [1-9]";
        long long blo = flo > 0 ? flo : 0, bhi = fhi - 1;
        long long chi = -flo - 1, clo = -fhi > 0 ? -fhi : 0;
        if (!has_hi) bhi = fhi;
        if (!has_lo) chi = -flo;
        if (blo <= bhi) {
            bool f2 = true;
            if (!first && !sc_add(c, b, " | ", 3)) return false;
            if (!sc_add(c, b, "( ", 2) ||
                !sc_uint_range(c, b, (unsigned long long)blo, (unsigned long long)bhi, &f2) ||
                !sc_add(c, b, " )", 2) || !sc_add(c, b, frac, strlen(frac)))
                return false;
            first = false;
        }
        if (clo <= chi) {
            bool f2 = true;
            if (!first && !sc_add(c, b, " | ", 3)) return false;
            if (!sc_add(c, b, "\"-\" ( ", 6) ||
                !sc_uint_range(c, b, (unsigned long long)clo, (unsigned long long)chi, &f2) ||
                !sc_add(c, b, " )", 2) || !sc_add(c, b, frac, strlen(frac)))
                return false;
            first = false;
        }
    }
    if (first)
        return integer ? sc_fail(c, KS_ERR_INVAL, "schema at %s: no integer lies within the bounds",
                                 path)
                       : sc_fail(c, KS_ERR_UNSUPPORTED,
                                 "schema at %s: no number within the bounds is an integer or "
                                 "lies in a whole unit interval within them (what is generated)",
                                 path);
    return sc_add(c, b, " )", 2);
}

static bool sc_string(sc_ctx *c, const json_t *s, const char *path, sc_buf *b) {
    const char *P = c->prefix;
    const json_t *f = json_object_get(s, "format");
    if (f) {
        if (!json_is_string(f))
            return sc_fail(c, KS_ERR_INVAL, "schema at %s: 'format' must be a string", path);
        const char *fs = json_string_value(f);
        static const char *const formats[] = {"date",  "time", "date-time", "uuid",
                                              "email", "ipv4", NULL};
        if (!sc_in(formats, fs))
            return sc_fail(c, KS_ERR_UNSUPPORTED,
                           "schema at %s: format '%.40s' is not supported (date, time, date-time, "
                           "uuid, email, ipv4 are)",
                           path, fs);
        // a fixed shape; minLength/maxLength/pattern are not combined with it
        if (json_object_get(s, "minLength") || json_object_get(s, "maxLength") ||
            json_object_get(s, "pattern"))
            return sc_fail(c, KS_ERR_UNSUPPORTED,
                           "schema at %s: 'minLength'/'maxLength'/'pattern' together with "
                           "'format' is not supported",
                           path);
        return sc_printf(c, b, "\"\\\"\" %s%s \"\\\"\"", P, fs);
    }
    const json_t *pat = json_object_get(s, "pattern");
    if (pat) {
        if (!json_is_string(pat))
            return sc_fail(c, KS_ERR_INVAL, "schema at %s: 'pattern' must be a string", path);
        if (json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
            return sc_fail(c, KS_ERR_UNSUPPORTED,
                           "schema at %s: 'minLength'/'maxLength' together with 'pattern' is not "
                           "supported (bound the length in the pattern)",
                           path);
        return sc_pattern(c, json_string_value(pat), json_string_length(pat), path, b);
    }
    long long lo = 0, hi = -1;
    if (!sc_count(c, s, "minLength", path, &lo) || !sc_count(c, s, "maxLength", path, &hi))
        return false;
    if (hi >= 0 && hi < lo)
        return sc_fail(c, KS_ERR_INVAL, "schema at %s: maxLength %lld below minLength %lld", path,
                       hi, lo);
    if (lo == 0 && hi < 0) return sc_printf(c, b, "%sstring", P);
    char rep[48];
    sc_rep(rep, sizeof rep, lo, hi);
    return sc_printf(c, b, "\"\\\"\" %schar%s \"\\\"\"", P, rep);
}

/* The body for schema s restricted to one type name. */
static bool sc_typed(sc_ctx *c, const json_t *s, const char *type, const char *path,
                     const char *self, sc_buf *b) {
    const char *P = c->prefix;
    if (!strcmp(type, "object")) return sc_object(c, s, path, self, b);
    if (!strcmp(type, "array")) return sc_array(c, s, path, b);
    if (!strcmp(type, "string")) return sc_string(c, s, path, b);
    if (!strcmp(type, "number") || !strcmp(type, "integer")) {
        bool integer = type[0] == 'i';
        if (sc_has_bounds(s)) return sc_bounded(c, s, path, integer, b);
        return sc_printf(c, b, "%s%s", P, type);
    }
    if (!strcmp(type, "boolean")) return sc_printf(c, b, "%sboolean", P);
    if (!strcmp(type, "null")) return sc_printf(c, b, "%snull", P);
    return sc_fail(c, KS_ERR_INVAL, "schema at %s: unknown type '%.40s'", path, type);
}

/* Resolves a local $ref to its schema; NULL (error set) if it cannot. */
static const json_t *sc_resolve(sc_ctx *c, const char *ref, const char *path) {
    if (!strcmp(ref, "#")) return c->root;
    const char *pfx[] = {"#/$defs/", "#/definitions/"};
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(pfx[i]);
        if (strncmp(ref, pfx[i], n)) continue;
        // one JSON-pointer token (~1 = '/', ~0 = '~')
        char name[256];
        size_t k = 0;
        for (const char *q = ref + n; *q; q++) {
            if (*q == '/' || k + 1 >= sizeof name) {
                sc_fail(c, KS_ERR_UNSUPPORTED,
                        "schema at %s: $ref '%.100s' is not supported "
                        "(#/$defs/NAME or #/definitions/NAME)",
                        path, ref);
                return NULL;
            }
            if (*q == '~' && (q[1] == '0' || q[1] == '1')) {
                name[k++] = q[1] == '0' ? '~' : '/';
                q++;
            } else
                name[k++] = *q;
        }
        name[k] = 0;
        const json_t *defs = json_object_get(c->root, i ? "definitions" : "$defs");
        const json_t *t = json_is_object(defs) ? json_object_get(defs, name) : NULL;
        if (!t) {
            sc_fail(c, KS_ERR_INVAL, "schema at %s: $ref '%.100s' does not resolve", path, ref);
            return NULL;
        }
        return t;
    }
    sc_fail(c, KS_ERR_UNSUPPORTED,
            "schema at %s: $ref '%.100s' is not supported (only local #/$defs/NAME, "
            "#/definitions/NAME and #)",
            path, ref);
    return NULL;
}

/* Emits the rule for schema s (named force, or a new name) and writes its
 * name to name. */
static bool sc_schema(sc_ctx *c, const json_t *s, const char *path, const char *force,
                      char name[64]) {
    const char *P = c->prefix;
    if (c->err) return false;
    if (++c->depth > SC_MAX_DEPTH) {
        c->depth--;
        return sc_fail(c, KS_ERR_NOSPACE, "schema at %s: nested deeper than %d", path,
                       SC_MAX_DEPTH);
    }
    bool ok = true;
    sc_buf b = {0};
    if (force)
        snprintf(name, 64, "%s", force);
    else
        sc_newname(c, name);
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
        ok = sc_printf(c, &b, "%svalue", P);
        goto emit;
    }
    if (!json_is_object(s)) {
        ok = sc_fail(c, KS_ERR_INVAL, "schema at %s: a schema must be an object or true", path);
        goto out;
    }
    const char *k;
    const json_t *v;
    bool any_kw = false;
    json_object_foreach((json_t *)s, k, v) {
        if (sc_in(sc_annotations, k)) continue;
        if (!sc_in(sc_keywords, k)) {
            ok = sc_fail(c, KS_ERR_UNSUPPORTED, "schema at %s: unsupported keyword '%.64s'", path,
                         k);
            goto out;
        }
        any_kw = true;
    }
    if (!any_kw) {
        ok = sc_printf(c, &b, "%svalue", P);
        goto emit;
    }
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) {
            ok = sc_fail(c, KS_ERR_INVAL, "schema at %s: '$ref' must be a string", path);
            goto out;
        }
        json_object_foreach((json_t *)s, k, v) {
            if (strcmp(k, "$ref") && !sc_in(sc_annotations, k)) {
                ok = sc_fail(c, KS_ERR_UNSUPPORTED,
                             "schema at %s: keyword '%.64s' next to '$ref' is not supported", path,
                             k);
                goto out;
            }
        }
        const char *rs = json_string_value(ref);
        int found = -1;
        for (int i = 0; i < c->n_refs; i++)
            if (!strcmp(c->refs[i].ref, rs)) found = i;
        if (found < 0) {
            const json_t *t = sc_resolve(c, rs, path);
            if (!t) {
                ok = false;
                goto out;
            }
            if (c->n_refs >= SC_MAX_REFS) {
                ok = sc_fail(c, KS_ERR_NOSPACE, "schema: more than %d distinct $refs", SC_MAX_REFS);
                goto out;
            }
            found = c->n_refs++;
            c->refs[found].ref = strdup(rs);
            if (!c->refs[found].ref) {
                c->n_refs--;
                ok = sc_fail(c, KS_ERR_NOMEM, "schema: out of memory");
                goto out;
            }
            sc_newname(c, c->refs[found].name);
            char tn[64], p2[256];
            snprintf(p2, sizeof p2, "%.200s", rs + 1);
            if (!sc_schema(c, t, p2[0] ? p2 : "/", c->refs[found].name, tn)) {
                ok = false;
                goto out;
            }
        }
        ok = sc_printf(c, &b, "%s", c->refs[found].name);
        goto emit;
    }
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (cn) {
        ok = sc_json_lit(c, &b, cn);
        goto emit;
    }
    if (en) {
        if (!json_is_array(en) || json_array_size(en) == 0) {
            ok = sc_fail(c, KS_ERR_INVAL, "schema at %s: 'enum' must be a non-empty array", path);
            goto out;
        }
        size_t i;
        json_array_foreach(en, i, v) {
            if (i && !(ok = sc_add(c, &b, " | ", 3))) goto out;
            if (!(ok = sc_json_lit(c, &b, v))) goto out;
        }
        goto emit;
    }
    const char *combo = json_object_get(s, "anyOf")   ? "anyOf"
                        : json_object_get(s, "oneOf") ? "oneOf"
                        : json_object_get(s, "allOf") ? "allOf"
                                                      : NULL;
    if (combo) {
        const json_t *arr = json_object_get(s, combo);
        if (!json_is_array(arr) || json_array_size(arr) == 0) {
            ok = sc_fail(c, KS_ERR_INVAL, "schema at %s: '%s' must be a non-empty array", path,
                         combo);
            goto out;
        }
        if (!strcmp(combo, "allOf") && json_array_size(arr) != 1) {
            ok = sc_fail(c, KS_ERR_UNSUPPORTED,
                         "schema at %s: 'allOf' with more than one schema is not supported", path);
            goto out;
        }
        json_object_foreach((json_t *)s, k, v) {
            if (strcmp(k, combo) && !sc_in(sc_annotations, k)) {
                ok = sc_fail(c, KS_ERR_UNSUPPORTED,
                             "schema at %s: keyword '%.64s' next to '%s' is not supported", path, k,
                             combo);
                goto out;
            }
        }
        size_t i;
        json_array_foreach(arr, i, v) {
            char sub[64], p2[256];
            snprintf(p2, sizeof p2, "%.200s/%s/%zu", path, combo, i);
            if (!(ok = sc_schema(c, v, p2, NULL, sub))) goto out;
            if (i && !(ok = sc_add(c, &b, " | ", 3))) goto out;
            if (!(ok = sc_printf(c, &b, "%s", sub))) goto out;
        }
        goto emit;
    }
    const json_t *ty = json_object_get(s, "type");
    if (ty && json_is_string(ty)) {
        ok = sc_typed(c, s, json_string_value(ty), path, name, &b);
    } else if (ty && json_is_array(ty) && json_array_size(ty) > 0) {
        size_t i;
        json_array_foreach(ty, i, v) {
            if (!json_is_string(v)) {
                ok = sc_fail(c, KS_ERR_INVAL, "schema at %s: 'type' must hold strings", path);
                goto out;
            }
            char sub[64];
            sc_newname(c, sub);
            sc_buf sb = {0};
            ok = sc_typed(c, s, json_string_value(v), path, sub, &sb) && sc_rule(c, sub, &sb);
            free(sb.p);
            if (!ok) goto out;
            if (i && !(ok = sc_add(c, &b, " | ", 3))) goto out;
            if (!(ok = sc_printf(c, &b, "%s", sub))) goto out;
        }
    } else if (ty) {
        ok = sc_fail(c, KS_ERR_INVAL, "schema at %s: 'type' must be a string or a non-empty array",
                     path);
    } else if (json_object_get(s, "properties") || json_object_get(s, "required") ||
               json_object_get(s, "additionalProperties")) {
        ok = sc_object(c, s, path, name, &b); // implied by the keywords: a subset is still valid
    } else if (json_object_get(s, "items") || json_object_get(s, "minItems") ||
               json_object_get(s, "maxItems")) {
        ok = sc_array(c, s, path, &b);
    } else if (sc_has_bounds(s)) {
        ok = sc_bounded(c, s, path, false, &b); // minimum / maximum: a number
    } else {
        ok = sc_string(c, s, path, &b); // minLength / maxLength / format / pattern
    }
emit:
    if (ok) ok = sc_rule(c, name, &b);
out:
    free(b.p);
    c->depth--;
    return ok;
}

/* The shared rules every schema grammar uses. */
static bool sc_primitives(sc_ctx *c) {
    const char *P = c->prefix;
    return sc_printf(c, &c->out, "%sws ::= ( \" \" | \"\\n\" \" \"{0,16} )?\n", P) &&
           sc_printf(c, &c->out, "%sstring ::= \"\\\"\" %schar* \"\\\"\"\n", P, P) &&
           sc_printf(c, &c->out,
                     "%schar ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" "
                     "[0-9a-fA-F]{4} )\n",
                     P) &&
           sc_printf(c, &c->out, "%sint ::= \"0\" | [1-9] [0-9]{0,15}\n", P) &&
           sc_printf(c, &c->out, "%sinteger ::= \"-\"? %sint\n", P, P) &&
           sc_printf(
               c, &c->out,
               "%snumber ::= \"-\"? %sint ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?\n", P,
               P) &&
           sc_printf(c, &c->out, "%sboolean ::= \"true\" | \"false\"\n", P) &&
           sc_printf(c, &c->out, "%snull ::= \"null\"\n", P) &&
           sc_printf(c, &c->out,
                     "%svalue ::= %sobject | %sarray | %sstring | %snumber | %sboolean | %snull\n",
                     P, P, P, P, P, P, P) &&
           sc_printf(c, &c->out, "%skv ::= %sstring %sws \":\" %sws %svalue %sws\n", P, P, P, P, P,
                     P) &&
           sc_printf(c, &c->out, "%sobject ::= \"{\" %sws ( %skv ( \",\" %sws %skv )* )? \"}\"\n",
                     P, P, P, P, P) &&
           sc_printf(c, &c->out,
                     "%sarray ::= \"[\" %sws ( %svalue %sws ( \",\" %sws %svalue %sws )* )? "
                     "\"]\"\n",
                     P, P, P, P, P, P, P) &&
           // days per month; 29 February only in leap years (Gregorian, RFC 3339)
           sc_printf(c, &c->out,
                     "%sdate ::= [0-9]{4} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" "
                     "[1-9] | [12] [0-9] | \"3\" [01] ) | ( \"0\" [469] | \"11\" ) \"-\" ( \"0\" "
                     "[1-9] | [12] [0-9] | \"30\" ) | \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" "
                     "[0-8] ) ) | %sleap \"-02-29\"\n",
                     P, P) &&
           sc_printf(c, &c->out,
                     "%sleap ::= [0-9]{2} ( \"0\" [48] | [2468] [048] | [13579] [26] ) | ( \"0\" "
                     "[48] | [2468] [048] | [13579] [26] | \"00\" ) \"00\"\n",
                     P) &&
           sc_printf(c, &c->out,
                     "%stime ::= ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] "
                     "( \".\" [0-9]{1,6} )? ( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" "
                     "[0-5] [0-9] )\n",
                     P) &&
           sc_printf(c, &c->out, "%sdate-time ::= %sdate \"T\" %stime\n", P, P, P) &&
           sc_printf(c, &c->out,
                     "%suuid ::= [0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" "
                     "[0-9a-f]{4} \"-\" [0-9a-f]{12}\n",
                     P) &&
           // a practical subset of RFC 5321: dot-atoms of atext, a domain of
           // at least two labels ending in a letters-only top-level label; within
           // its length limits (64 bytes of local part, 253 of domain)
           sc_printf(
               c, &c->out,
               "%semail ::= %satom ( \".\" %satom ){0,3} \"@\" %slabel ( \".\" %slabel ){0,3} "
               "\".\" [a-zA-Z]{2,24}\n",
               P, P, P, P, P) &&
           sc_printf(c, &c->out, "%satom ::= [a-zA-Z0-9!#$%%&'*+/=?^_`{|}~-]{1,15}\n", P) &&
           sc_printf(c, &c->out, "%slabel ::= [a-zA-Z0-9] ( [a-zA-Z0-9-]{0,30} [a-zA-Z0-9] )?\n",
                     P) &&
           sc_printf(c, &c->out, "%sipv4 ::= %soctet ( \".\" %soctet ){3}\n", P, P, P) &&
           sc_printf(c, &c->out,
                     "%soctet ::= \"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] "
                     "[0-9] | [0-9]\n",
                     P);
}

ks_err grammar_schema_gbnf(const json_t *schema, const char *prefix, char **gbnf, ks_errbuf *eb) {
    KS_ASSERT(gbnf);
    *gbnf = NULL;
    if (!prefix) prefix = "";
    if (strlen(prefix) > 40) return ks_seterr(eb, KS_ERR_INVAL, "schema: prefix too long");
    for (const char *q = prefix; *q; q++)
        if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') ||
              *q == '-'))
            return ks_seterr(eb, KS_ERR_INVAL, "schema: prefix '%s' is not a rule name", prefix);
    if (!schema) return ks_seterr(eb, KS_ERR_INVAL, "schema: NULL");
    sc_ctx *c = calloc(1, sizeof *c);
    if (!c) return ks_seterr(eb, KS_ERR_NOMEM, "schema: out of memory");
    c->root = schema;
    c->eb = eb;
    snprintf(c->prefix, sizeof c->prefix, "%s", prefix);
    char root[64], name[64];
    snprintf(root, sizeof root, "%sroot", prefix);
    bool ok = sc_primitives(c) && sc_schema(c, schema, "/", root, name);
    for (int i = 0; i < c->n_refs; i++)
        free(c->refs[i].ref);
    ks_err err = c->err;
    if (ok)
        *gbnf = c->out.p;
    else
        free(c->out.p);
    free(c);
    return ok ? KS_OK : (err ? err : ks_seterr(eb, KS_ERR_INTERNAL, "schema: failed"));
}

ks_err grammar_from_schema(const json_t *schema, grammar **out, ks_errbuf *eb) {
    KS_ASSERT(out);
    *out = NULL;
    char *text = NULL;
    ks_err err = grammar_schema_gbnf(schema, "", &text, eb);
    if (err) return err;
    err = grammar_parse(text, strlen(text), out, eb);
    free(text);
    return err;
}
