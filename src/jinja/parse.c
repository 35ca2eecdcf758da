/* parse.c — the template lexer and parser (include/kvseal/jinja.h).
 *
 * The lexer applies Jinja2's whitespace rules while it splits the source into
 * text and tag tokens: "{%-" / "-%}" strip all whitespace on that side,
 * lstrip_blocks removes the spaces and tabs before a block or comment tag
 * that starts its line, trim_blocks removes the newline after one, and "+"
 * turns either off for one tag. The parser is recursive descent with
 * jinja2's precedence (or < and < not < comparison < +,- < ~ < *,/,//,% <
 * ** < unary < postfix, filters and tests). Nesting is bounded by
 * max_depth so a hostile template cannot exhaust the C stack. */
#include "jinja_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Lexer

typedef enum tk_type {
    TK_EOF,
    TK_TEXT,
    TK_VAR_BEGIN,
    TK_VAR_END,
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_NAME,
    TK_STR,
    TK_INT,
    TK_FLOAT,
    TK_OP,
} tk_type;

typedef struct tk {
    uint8_t t;
    int line;
    const char *s; /* TEXT, NAME, STR, OP: NUL-terminated on the arena */
    size_t n;
    int64_t i;
    double f;
} tk;

typedef struct jp {
    jinja_tmpl *t;
    ks_errbuf *eb;
    ks_err err;
    const char *src;
    size_t len;
    tk *toks;
    size_t n_toks, cap_toks, pos;
    size_t depth;
    size_t line_pos; /* jp_line_at's cache: line is the line of byte line_pos */
    int line;
    jmp_buf jmp;
} jp;

static _Noreturn void jp_fail(jp *p, ks_err code, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static _Noreturn void jp_fail(jp *p, ks_err code, int line, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->err = ks_seterr(p->eb, code, "template line %d: %s", line, msg);
    longjmp(p->jmp, 1);
}

static void *jp_alloc(jp *p, size_t n) {
    void *m = jinja__alloc(&p->t->arena, n);
    if (!m) {
        p->err = ks_seterr(p->eb, KS_ERR_NOMEM, "template: out of memory while compiling");
        longjmp(p->jmp, 1);
    }
    memset(m, 0, n);
    return m;
}

static char *jp_strdup(jp *p, const char *s, size_t n) {
    char *d = jp_alloc(p, n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static tk *jp_push(jp *p, tk_type t, int line) {
    if (p->n_toks == p->cap_toks) {
        size_t cap = p->cap_toks ? p->cap_toks * 2 : 256;
        tk *nt = jp_alloc(p, cap * sizeof *nt);
        if (p->n_toks) memcpy(nt, p->toks, p->n_toks * sizeof *nt);
        p->toks = nt;
        p->cap_toks = cap;
    }
    tk *k = &p->toks[p->n_toks++];
    memset(k, 0, sizeof *k);
    k->t = (uint8_t)t;
    k->line = line;
    return k;
}

static bool jp_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Line of byte pos. The lexer asks in increasing order (almost always), so
 * counting resumes from the last answer: linear in the source overall. */
static int jp_line_at(jp *p, size_t pos) {
    if (pos < p->line_pos) {
        p->line_pos = 0;
        p->line = 1;
    }
    for (; p->line_pos < pos && p->line_pos < p->len; p->line_pos++)
        p->line += p->src[p->line_pos] == '\n';
    return p->line;
}

/* Appends one UTF-8 encoded code point. */
static size_t jp_utf8(char *o, uint32_t c) {
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xC0 | (c >> 6));
        o[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | (c >> 12));
        o[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (c >> 18));
    o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

static int jp_hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string literal at src[*i] (the quote); Python's unicode-escape rules. */
static void jp_lex_string(jp *p, size_t *i, int line) {
    char q = p->src[*i];
    size_t j = *i + 1;
    while (j < p->len && p->src[j] != q) {
        if (p->src[j] == '\\') j++;
        j++;
    }
    if (j >= p->len) jp_fail(p, KS_ERR_FORMAT, line, "unterminated string");
    char *o = jp_alloc(p, j - *i + 1);
    size_t n = 0;
    for (size_t k = *i + 1; k < j; k++) {
        char c = p->src[k];
        if (c != '\\') {
            o[n++] = c;
            continue;
        }
        char e = p->src[++k];
        int hexn = 0;
        switch (e) {
        case 'n':
            o[n++] = '\n';
            break;
        case 't':
            o[n++] = '\t';
            break;
        case 'r':
            o[n++] = '\r';
            break;
        case 'a':
            o[n++] = '\a';
            break;
        case 'b':
            o[n++] = '\b';
            break;
        case 'f':
            o[n++] = '\f';
            break;
        case 'v':
            o[n++] = '\v';
            break;
        case '\\':
            o[n++] = '\\';
            break;
        case '\'':
            o[n++] = '\'';
            break;
        case '"':
            o[n++] = '"';
            break;
        case '\n':
            break; /* line continuation */
        case 'x':
            hexn = 2;
            break;
        case 'u':
            hexn = 4;
            break;
        case 'U':
            hexn = 8;
            break;
        default:
            if (e >= '0' && e <= '7') {
                uint32_t c8 = 0;
                int d = 0;
                while (d < 3 && k < j && p->src[k] >= '0' && p->src[k] <= '7') {
                    c8 = c8 * 8 + (uint32_t)(p->src[k] - '0');
                    k++;
                    d++;
                }
                k--;
                n += jp_utf8(o + n, c8);
            } else {
                o[n++] = '\\';
                o[n++] = e;
            }
        }
        if (hexn) {
            uint32_t cp = 0;
            for (int d = 0; d < hexn; d++) {
                int h = k + 1 < j ? jp_hex(p->src[k + 1]) : -1;
                if (h < 0) jp_fail(p, KS_ERR_FORMAT, line, "truncated \\%c escape in a string", e);
                cp = cp * 16 + (uint32_t)h;
                k++;
            }
            if (cp > 0x10FFFF) jp_fail(p, KS_ERR_FORMAT, line, "illegal Unicode escape");
            n += jp_utf8(o + n, cp);
        }
    }
    o[n] = 0;
    tk *k = jp_push(p, TK_STR, line);
    k->s = o;
    k->n = n;
    *i = j + 1;
}

static const char *const jp_ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                     "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                     "]",  "{",  "}",  ",",  ".",  ":",  "|"};

/* Lexes the inside of a tag from *i up to its closer ("}}" or "%}");
 * returns the position after the closer and sets *strip_after for "-". */
static size_t jp_lex_tag(jp *p, size_t i, bool block, bool *strip_after, bool *keep_nl) {
    int line = jp_line_at(p, i);
    int balance = 0;
    char close = block ? '%' : '}';
    while (i < p->len) {
        char c = p->src[i];
        if (c == '\n') line++;
        if (jp_space(c)) {
            i++;
            continue;
        }
        if (balance == 0) {
            /* the closer, with an optional '-' or '+' */
            size_t k = i;
            bool minus = false, plus = false;
            if (p->src[k] == '-' || p->src[k] == '+') {
                minus = p->src[k] == '-';
                plus = p->src[k] == '+';
                k++;
            }
            if (k + 1 < p->len && p->src[k] == close && p->src[k + 1] == '}') {
                *strip_after = minus;
                *keep_nl = plus;
                jp_push(p, block ? TK_BLOCK_END : TK_VAR_END, line);
                return k + 2;
            }
        }
        if (c == '\'' || c == '"') {
            jp_lex_string(p, &i, line);
            continue;
        }
        if ((c >= '0' && c <= '9')) {
            size_t j = i;
            bool fl = false;
            while (j < p->len && ((p->src[j] >= '0' && p->src[j] <= '9') || p->src[j] == '_'))
                j++;
            if (j + 1 < p->len && p->src[j] == '.' && p->src[j + 1] >= '0' &&
                p->src[j + 1] <= '9') {
                fl = true;
                j++;
                while (j < p->len && ((p->src[j] >= '0' && p->src[j] <= '9') || p->src[j] == '_'))
                    j++;
            }
            if (j < p->len && (p->src[j] == 'e' || p->src[j] == 'E')) {
                size_t e = j + 1;
                if (e < p->len && (p->src[e] == '+' || p->src[e] == '-')) e++;
                if (e < p->len && p->src[e] >= '0' && p->src[e] <= '9') {
                    fl = true;
                    j = e;
                    while (j < p->len && p->src[j] >= '0' && p->src[j] <= '9')
                        j++;
                }
            }
            char buf[128];
            size_t n = 0;
            for (size_t k = i; k < j && n + 1 < sizeof buf; k++)
                if (p->src[k] != '_') buf[n++] = p->src[k];
            buf[n] = 0;
            tk *k = jp_push(p, fl ? TK_FLOAT : TK_INT, line);
            if (fl)
                k->f = strtod(buf, NULL);
            else {
                errno = 0;
                unsigned long long v = strtoull(buf, NULL, 10);
                if (errno || v > INT64_MAX)
                    jp_fail(p, KS_ERR_FORMAT, line, "integer literal out of range");
                k->i = (int64_t)v;
            }
            i = j;
            continue;
        }
        if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            size_t j = i;
            while (j < p->len && (p->src[j] == '_' || (p->src[j] >= 'a' && p->src[j] <= 'z') ||
                                  (p->src[j] >= 'A' && p->src[j] <= 'Z') ||
                                  (p->src[j] >= '0' && p->src[j] <= '9')))
                j++;
            tk *k = jp_push(p, TK_NAME, line);
            k->s = jp_strdup(p, p->src + i, j - i);
            k->n = j - i;
            i = j;
            continue;
        }
        size_t m = 0;
        for (; m < sizeof jp_ops / sizeof jp_ops[0]; m++) {
            size_t ol = strlen(jp_ops[m]);
            if (i + ol <= p->len && memcmp(p->src + i, jp_ops[m], ol) == 0) break;
        }
        if (m == sizeof jp_ops / sizeof jp_ops[0])
            jp_fail(p, KS_ERR_FORMAT, line, "unexpected character '%c'", c);
        const char *op = jp_ops[m];
        if (op[0] == '(' || op[0] == '[' || op[0] == '{') balance++;
        if (op[0] == ')' || op[0] == ']' || op[0] == '}') {
            if (balance == 0) jp_fail(p, KS_ERR_FORMAT, line, "unexpected '%c'", op[0]);
            balance--;
        }
        tk *k = jp_push(p, TK_OP, line);
        k->s = op;
        k->n = strlen(op);
        i += k->n;
    }
    jp_fail(p, KS_ERR_FORMAT, line, "unexpected end of template, expected '%c}'", close);
}

static void jp_lex(jp *p) {
    size_t pos = 0;
    bool strip_next = false;
    while (pos <= p->len) {
        size_t s = pos;
        while (s + 1 < p->len &&
               !(p->src[s] == '{' &&
                 (p->src[s + 1] == '{' || p->src[s + 1] == '%' || p->src[s + 1] == '#')))
            s++;
        bool tag = s + 1 < p->len;
        size_t te = tag ? s : p->len; /* text is [ts, te) */
        size_t ts = pos;
        if (strip_next)
            while (ts < te && jp_space(p->src[ts]))
                ts++;
        if (tag) {
            char kind = p->src[s + 1];
            char mod = s + 2 < p->len ? p->src[s + 2] : 0;
            if (mod == '-') {
                while (te > ts && jp_space(p->src[te - 1]))
                    te--;
            } else if ((kind == '%' || kind == '#') && mod != '+') {
                /* lstrip_blocks: spaces/tabs from the start of the line */
                size_t k = te;
                while (k > ts && (p->src[k - 1] == ' ' || p->src[k - 1] == '\t'))
                    k--;
                if ((k > ts && p->src[k - 1] == '\n') ||
                    (k == ts && (k == 0 || p->src[k - 1] == '\n')))
                    te = k;
            }
        }
        if (te > ts) {
            tk *k = jp_push(p, TK_TEXT, jp_line_at(p, ts));
            k->s = jp_strdup(p, p->src + ts, te - ts);
            k->n = te - ts;
        }
        if (!tag) break;
        char kind = p->src[s + 1];
        size_t body = s + 2;
        if (body < p->len && (p->src[body] == '-' || p->src[body] == '+')) body++;
        bool strip_after = false, keep_nl = false;
        if (kind == '#') {
            size_t e = body;
            while (e + 1 < p->len && !(p->src[e] == '#' && p->src[e + 1] == '}'))
                e++;
            if (e + 1 >= p->len) jp_fail(p, KS_ERR_FORMAT, jp_line_at(p, s), "unclosed comment");
            strip_after = e > body && p->src[e - 1] == '-';
            keep_nl = e > body && p->src[e - 1] == '+';
            pos = e + 2;
        } else {
            jp_push(p, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, jp_line_at(p, s));
            pos = jp_lex_tag(p, body, kind == '%', &strip_after, &keep_nl);
        }
        strip_next = strip_after;
        if (!strip_after && !keep_nl && kind != '{') { /* trim_blocks */
            if (pos < p->len && p->src[pos] == '\n')
                pos++;
            else if (pos + 1 < p->len && p->src[pos] == '\r' && p->src[pos + 1] == '\n')
                pos += 2;
        }
        if (pos >= p->len) break;
    }
    jp_push(p, TK_EOF, jp_line_at(p, p->len));
}

// ----------------------------------------------------------------------------
// Parser helpers

static tk *jp_cur(jp *p) { return &p->toks[p->pos]; }
static tk *jp_next(jp *p) {
    tk *k = &p->toks[p->pos];
    if (k->t != TK_EOF) p->pos++;
    return k;
}
static bool jp_is_op(jp *p, const char *op) {
    tk *k = jp_cur(p);
    return k->t == TK_OP && strcmp(k->s, op) == 0;
}
static bool jp_is_name(jp *p, const char *nm) {
    tk *k = jp_cur(p);
    return k->t == TK_NAME && strcmp(k->s, nm) == 0;
}
static bool jp_accept_op(jp *p, const char *op) {
    if (!jp_is_op(p, op)) return false;
    p->pos++;
    return true;
}
static bool jp_accept_name(jp *p, const char *nm) {
    if (!jp_is_name(p, nm)) return false;
    p->pos++;
    return true;
}
static const char *jp_tk_desc(const tk *k) {
    switch (k->t) {
    case TK_EOF:
        return "end of template";
    case TK_TEXT:
        return "text";
    case TK_VAR_BEGIN:
        return "'{{'";
    case TK_VAR_END:
        return "'}}'";
    case TK_BLOCK_BEGIN:
        return "'{%'";
    case TK_BLOCK_END:
        return "'%}'";
    case TK_NAME:
    case TK_OP:
        return k->s;
    case TK_STR:
        return "string";
    default:
        return "number";
    }
}
static void jp_expect_op(jp *p, const char *op) {
    if (!jp_accept_op(p, op))
        jp_fail(p, KS_ERR_FORMAT, jp_cur(p)->line, "expected '%s', got %s", op,
                jp_tk_desc(jp_cur(p)));
}
static const char *jp_expect_name(jp *p) {
    tk *k = jp_cur(p);
    if (k->t != TK_NAME)
        jp_fail(p, KS_ERR_FORMAT, k->line, "expected a name, got %s", jp_tk_desc(k));
    p->pos++;
    return k->s;
}
static void jp_expect(jp *p, tk_type t) {
    tk *k = jp_cur(p);
    if (k->t != t) {
        tk want = {.t = (uint8_t)t};
        jp_fail(p, KS_ERR_FORMAT, k->line, "expected %s, got %s", jp_tk_desc(&want), jp_tk_desc(k));
    }
    p->pos++;
}

static jnode *jp_node(jp *p, jn_kind kind, int line) {
    jnode *n = jp_alloc(p, sizeof *n);
    n->kind = (uint8_t)kind;
    n->line = line;
    return n;
}

/* A growable list of children (and names) being collected. */
typedef struct jp_vec {
    jnode **kids;
    const char **names;
    size_t n, cap;
} jp_vec;

static void jp_vec_push(jp *p, jp_vec *v, jnode *kid, const char *name) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        jnode **k = jp_alloc(p, cap * sizeof *k);
        const char **nm = jp_alloc(p, cap * sizeof *nm);
        if (v->n) {
            memcpy(k, v->kids, v->n * sizeof *k);
            memcpy(nm, v->names, v->n * sizeof *nm);
        }
        v->kids = k;
        v->names = nm;
        v->cap = cap;
    }
    v->kids[v->n] = kid;
    v->names[v->n] = name;
    v->n++;
}

static void jp_vec_set(jnode *n, const jp_vec *v) {
    n->kids = v->kids;
    n->names = v->names;
    n->n_kids = v->n;
}

static void jp_enter(jp *p) {
    if (++p->depth > p->t->lim.max_depth)
        jp_fail(p, KS_ERR_INVAL, jp_cur(p)->line, "template limit: nesting deeper than %zu",
                p->t->lim.max_depth);
}
static void jp_leave(jp *p) { p->depth--; }

// ----------------------------------------------------------------------------
// Expressions

static jnode *jp_expr(jp *p);
static jnode *jp_expr_noif(jp *p);
static jnode *jp_unary(jp *p, bool with_filter);
static jnode *jp_primary(jp *p);
static jnode *jp_postfix(jp *p, jnode *n);

/* Call arguments after '(' up to ')': positional, then name=value. */
static void jp_args(jp *p, jp_vec *v) {
    while (!jp_is_op(p, ")")) {
        if (v->n) {
            jp_expect_op(p, ",");
            if (jp_is_op(p, ")")) break;
        }
        const char *kw = NULL;
        if (jp_cur(p)->t == TK_NAME && p->toks[p->pos + 1].t == TK_OP &&
            strcmp(p->toks[p->pos + 1].s, "=") == 0) {
            kw = jp_cur(p)->s;
            p->pos += 2;
        } else if (v->n && v->names[v->n - 1]) {
            jp_fail(p, KS_ERR_FORMAT, jp_cur(p)->line,
                    "positional argument after keyword argument");
        }
        jp_vec_push(p, v, jp_expr(p), kw);
    }
    jp_expect_op(p, ")");
}

static jnode *jp_filter_one(jp *p, jnode *in) {
    int line = jp_cur(p)->line;
    const char *name = jp_expect_name(p);
    while (jp_accept_op(p, ".")) { /* dotted filter names: joined as "a.b" */
        const char *more = jp_expect_name(p);
        size_t n = strlen(name) + strlen(more) + 2;
        char *j = jp_alloc(p, n);
        snprintf(j, n, "%s.%s", name, more);
        name = j;
    }
    jnode *f = jp_node(p, N_FILTER, line);
    f->name = name;
    f->a = in;
    if (jp_accept_op(p, "(")) {
        jp_vec v = {0};
        jp_args(p, &v);
        jp_vec_set(f, &v);
    }
    return f;
}

static jnode *jp_filters_tests(jp *p, jnode *n) {
    for (;;) {
        if (jp_accept_op(p, "|")) {
            n = jp_filter_one(p, n);
        } else if (jp_is_name(p, "is")) {
            int line = jp_next(p)->line;
            jnode *t = jp_node(p, N_TEST, line);
            t->op = jp_accept_name(p, "not") ? 1 : 0;
            t->name = jp_expect_name(p);
            while (jp_accept_op(p, "."))
                t->name = jp_expect_name(p);
            t->a = n;
            jp_vec v = {0};
            tk *k = jp_cur(p);
            if (jp_accept_op(p, "(")) {
                jp_args(p, &v);
            } else if ((k->t == TK_NAME || k->t == TK_STR || k->t == TK_INT || k->t == TK_FLOAT ||
                        jp_is_op(p, "[") || jp_is_op(p, "{")) &&
                       !jp_is_name(p, "else") && !jp_is_name(p, "or") && !jp_is_name(p, "and")) {
                jp_vec_push(p, &v, jp_postfix(p, jp_primary(p)), NULL);
            }
            jp_vec_set(t, &v);
            n = t;
        } else if (jp_is_op(p, "(")) {
            n = jp_postfix(p, n);
        } else {
            return n;
        }
    }
}

static jnode *jp_postfix(jp *p, jnode *n) {
    for (;;) {
        int line = jp_cur(p)->line;
        if (jp_accept_op(p, ".")) {
            tk *k = jp_next(p);
            jnode *a;
            if (k->t == TK_NAME) {
                a = jp_node(p, N_ATTR, line);
                a->name = k->s;
            } else if (k->t == TK_INT) {
                a = jp_node(p, N_ITEM, line);
                a->b = jp_node(p, N_LIT, line);
                a->b->lit = jv_int(k->i);
            } else {
                jp_fail(p, KS_ERR_FORMAT, line, "expected an attribute name after '.'");
            }
            a->a = n;
            n = a;
        } else if (jp_accept_op(p, "[")) {
            jnode *parts[3] = {NULL, NULL, NULL};
            int np = 0;
            bool slice = false;
            for (;;) {
                if (jp_is_op(p, ":")) {
                    slice = true;
                    p->pos++;
                    if (++np > 2) jp_fail(p, KS_ERR_FORMAT, line, "bad slice");
                    continue;
                }
                if (jp_is_op(p, "]")) break;
                if (parts[np]) jp_fail(p, KS_ERR_FORMAT, line, "expected ']' or ':'");
                parts[np] = jp_expr(p);
                if (!slice && jp_is_op(p, ",")) { /* a[x, y]: a tuple key */
                    jnode *tp = jp_node(p, N_TUPLE, line);
                    jp_vec v = {0};
                    jp_vec_push(p, &v, parts[0], NULL);
                    while (jp_accept_op(p, ",") && !jp_is_op(p, "]"))
                        jp_vec_push(p, &v, jp_expr(p), NULL);
                    jp_vec_set(tp, &v);
                    parts[0] = tp;
                }
            }
            jp_expect_op(p, "]");
            jnode *it;
            if (slice) {
                it = jp_node(p, N_SLICE, line);
                jp_vec v = {0};
                for (int k = 0; k < 3; k++)
                    jp_vec_push(p, &v, parts[k], NULL);
                jp_vec_set(it, &v);
            } else {
                if (!parts[0]) jp_fail(p, KS_ERR_FORMAT, line, "expected a subscript");
                it = jp_node(p, N_ITEM, line);
                it->b = parts[0];
            }
            it->a = n;
            n = it;
        } else if (jp_accept_op(p, "(")) {
            jnode *c = jp_node(p, N_CALL, line);
            c->a = n;
            jp_vec v = {0};
            jp_args(p, &v);
            jp_vec_set(c, &v);
            n = c;
        } else {
            return n;
        }
    }
}

static jnode *jp_primary(jp *p) {
    tk *k = jp_next(p);
    jnode *n;
    switch (k->t) {
    case TK_NAME:
        n = jp_node(p, N_LIT, k->line);
        if (!strcmp(k->s, "true") || !strcmp(k->s, "True"))
            n->lit = jv_bool(true);
        else if (!strcmp(k->s, "false") || !strcmp(k->s, "False"))
            n->lit = jv_bool(false);
        else if (!strcmp(k->s, "none") || !strcmp(k->s, "None"))
            n->lit = jv_none();
        else {
            n->kind = N_NAME;
            n->name = k->s;
        }
        return n;
    case TK_STR: {
        size_t total = k->n;
        size_t first = p->pos - 1;
        while (jp_cur(p)->t == TK_STR) /* adjacent literals concatenate */
            total += jp_next(p)->n;
        jstr *s = jp_alloc(p, sizeof *s + total + 1);
        s->n = 0;
        s->taint = NULL;
        for (size_t i = first; i < p->pos; i++) {
            memcpy(s->s + s->n, p->toks[i].s, p->toks[i].n);
            s->n += p->toks[i].n;
        }
        s->s[s->n] = 0;
        n = jp_node(p, N_LIT, k->line);
        n->lit.t = JV_STR;
        n->lit.u.s = s;
        return n;
    }
    case TK_INT:
        n = jp_node(p, N_LIT, k->line);
        n->lit = jv_int(k->i);
        return n;
    case TK_FLOAT:
        n = jp_node(p, N_LIT, k->line);
        n->lit = jv_float(k->f);
        return n;
    case TK_OP:
        if (!strcmp(k->s, "(")) {
            if (jp_accept_op(p, ")")) {
                n = jp_node(p, N_TUPLE, k->line);
                return n;
            }
            jnode *e = jp_expr(p);
            if (!jp_is_op(p, ",")) {
                jp_expect_op(p, ")");
                return e;
            }
            n = jp_node(p, N_TUPLE, k->line);
            jp_vec v = {0};
            jp_vec_push(p, &v, e, NULL);
            while (jp_accept_op(p, ",")) {
                if (jp_is_op(p, ")")) break;
                jp_vec_push(p, &v, jp_expr(p), NULL);
            }
            jp_expect_op(p, ")");
            jp_vec_set(n, &v);
            return n;
        }
        if (!strcmp(k->s, "[")) {
            n = jp_node(p, N_LIST, k->line);
            jp_vec v = {0};
            while (!jp_is_op(p, "]")) {
                if (v.n) {
                    jp_expect_op(p, ",");
                    if (jp_is_op(p, "]")) break;
                }
                jp_vec_push(p, &v, jp_expr(p), NULL);
            }
            jp_expect_op(p, "]");
            jp_vec_set(n, &v);
            return n;
        }
        if (!strcmp(k->s, "{")) {
            n = jp_node(p, N_DICT, k->line);
            jp_vec v = {0};
            while (!jp_is_op(p, "}")) {
                if (v.n) {
                    jp_expect_op(p, ",");
                    if (jp_is_op(p, "}")) break;
                }
                jp_vec_push(p, &v, jp_expr(p), NULL);
                jp_expect_op(p, ":");
                jp_vec_push(p, &v, jp_expr(p), NULL);
            }
            jp_expect_op(p, "}");
            jp_vec_set(n, &v);
            return n;
        }
        break;
    default:
        break;
    }
    jp_fail(p, KS_ERR_FORMAT, k->line, "unexpected %s", jp_tk_desc(k));
}

static jnode *jp_unary(jp *p, bool with_filter) {
    jp_enter(p);
    int line = jp_cur(p)->line;
    jnode *n;
    if (jp_accept_op(p, "-") || (jp_is_op(p, "+") && jp_next(p))) {
        bool neg = !strcmp(p->toks[p->pos - 1].s, "-");
        n = jp_node(p, N_UNARY, line);
        n->op = neg ? OP_NEG : OP_POS;
        n->a = jp_unary(p, false);
    } else {
        n = jp_primary(p);
    }
    n = jp_postfix(p, n);
    if (with_filter) n = jp_filters_tests(p, n);
    jp_leave(p);
    return n;
}

static jnode *jp_bin(jp *p, jn_op op, jnode *a, jnode *b, int line) {
    jnode *n = jp_node(p, N_BIN, line);
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *jp_pow(jp *p) {
    jnode *n = jp_unary(p, true);
    while (jp_is_op(p, "**")) {
        int line = jp_next(p)->line;
        n = jp_bin(p, OP_POW, n, jp_unary(p, true), line);
    }
    return n;
}

static jnode *jp_math2(jp *p) {
    jnode *n = jp_pow(p);
    for (;;) {
        jn_op op = jp_is_op(p, "*")    ? OP_MUL
                   : jp_is_op(p, "/")  ? OP_DIV
                   : jp_is_op(p, "//") ? OP_FLOORDIV
                   : jp_is_op(p, "%")  ? OP_MOD
                                       : 0;
        if (!op) return n;
        int line = jp_next(p)->line;
        n = jp_bin(p, op, n, jp_pow(p), line);
    }
}

static jnode *jp_concat(jp *p) {
    jnode *n = jp_math2(p);
    while (jp_is_op(p, "~")) {
        int line = jp_next(p)->line;
        n = jp_bin(p, OP_CONCAT, n, jp_math2(p), line);
    }
    return n;
}

static jnode *jp_math1(jp *p) {
    jnode *n = jp_concat(p);
    for (;;) {
        jn_op op = jp_is_op(p, "+") ? OP_ADD : jp_is_op(p, "-") ? OP_SUB : 0;
        if (!op) return n;
        int line = jp_next(p)->line;
        n = jp_bin(p, op, n, jp_concat(p), line);
    }
}

static jnode *jp_compare(jp *p) {
    jnode *n = jp_math1(p);
    for (;;) {
        int line = jp_cur(p)->line;
        jn_op op = jp_is_op(p, "==")   ? OP_EQ
                   : jp_is_op(p, "!=") ? OP_NE
                   : jp_is_op(p, "<")  ? OP_LT
                   : jp_is_op(p, "<=") ? OP_LE
                   : jp_is_op(p, ">")  ? OP_GT
                   : jp_is_op(p, ">=") ? OP_GE
                                       : 0;
        if (op) {
            p->pos++;
        } else if (jp_accept_name(p, "in")) {
            op = OP_IN;
        } else if (jp_is_name(p, "not") && p->toks[p->pos + 1].t == TK_NAME &&
                   !strcmp(p->toks[p->pos + 1].s, "in")) {
            p->pos += 2;
            op = OP_NOTIN;
        } else {
            return n;
        }
        n = jp_bin(p, op, n, jp_math1(p), line);
    }
}

static jnode *jp_not(jp *p) {
    if (jp_is_name(p, "not")) {
        int line = jp_next(p)->line;
        jp_enter(p);
        jnode *n = jp_node(p, N_NOT, line);
        n->a = jp_not(p);
        jp_leave(p);
        return n;
    }
    return jp_compare(p);
}

static jnode *jp_and(jp *p) {
    jnode *n = jp_not(p);
    while (jp_is_name(p, "and")) {
        jnode *a = jp_node(p, N_AND, jp_next(p)->line);
        a->a = n;
        a->b = jp_not(p);
        n = a;
    }
    return n;
}

static jnode *jp_or(jp *p) {
    jnode *n = jp_and(p);
    while (jp_is_name(p, "or")) {
        jnode *a = jp_node(p, N_OR, jp_next(p)->line);
        a->a = n;
        a->b = jp_and(p);
        n = a;
    }
    return n;
}

static jnode *jp_expr_noif(jp *p) { return jp_or(p); }

static jnode *jp_expr(jp *p) {
    jp_enter(p);
    jnode *n = jp_or(p);
    while (jp_is_name(p, "if")) {
        jnode *c = jp_node(p, N_COND, jp_next(p)->line);
        c->b = n;
        c->a = jp_or(p);
        if (jp_accept_name(p, "else")) c->c = jp_expr(p);
        n = c;
    }
    jp_leave(p);
    return n;
}

/* expr [, expr ...] as a tuple when there is a comma (set x = a, b). */
static jnode *jp_tuple(jp *p, bool with_if) {
    int line = jp_cur(p)->line;
    jnode *e = with_if ? jp_expr(p) : jp_expr_noif(p);
    if (!jp_is_op(p, ",")) return e;
    jnode *t = jp_node(p, N_TUPLE, line);
    jp_vec v = {0};
    jp_vec_push(p, &v, e, NULL);
    while (jp_accept_op(p, ",")) {
        if (jp_cur(p)->t == TK_BLOCK_END || jp_cur(p)->t == TK_VAR_END) break;
        jp_vec_push(p, &v, with_if ? jp_expr(p) : jp_expr_noif(p), NULL);
    }
    jp_vec_set(t, &v);
    return t;
}

// ----------------------------------------------------------------------------
// Statements

/* Parses template content up to a block tag named in stop[] (NULL-ended);
 * returns the body and leaves the parser on that tag's name. stop NULL:
 * up to the end of the template. */
static jnode *jp_body(jp *p, const char *const *stop);

static bool jp_in(const char *s, const char *const *set) {
    for (; set && *set; set++)
        if (!strcmp(s, *set)) return true;
    return false;
}

static void jp_end_tag(jp *p, const char *name) {
    tk *k = jp_cur(p);
    if (!jp_accept_name(p, name))
        jp_fail(p, KS_ERR_FORMAT, k->line, "expected '%s', got %s", name, jp_tk_desc(k));
    jp_expect(p, TK_BLOCK_END);
}

/* name or name.attr, for set */
static jnode *jp_set_target(jp *p) {
    int line = jp_cur(p)->line;
    jnode *n = jp_node(p, N_NAME, line);
    n->name = jp_expect_name(p);
    if (jp_accept_op(p, ".")) {
        jnode *a = jp_node(p, N_ATTR, line);
        a->a = n;
        a->name = jp_expect_name(p);
        return a;
    }
    if (jp_is_op(p, ",")) {
        jnode *t = jp_node(p, N_TUPLE, line);
        jp_vec v = {0};
        jp_vec_push(p, &v, n, NULL);
        while (jp_accept_op(p, ",")) {
            jnode *m = jp_node(p, N_NAME, jp_cur(p)->line);
            m->name = jp_expect_name(p);
            jp_vec_push(p, &v, m, NULL);
        }
        jp_vec_set(t, &v);
        return t;
    }
    return n;
}

/* (a, b=default, ...) of a macro or a call block's caller */
static void jp_params(jp *p, jnode *n) {
    jp_vec v = {0};
    if (jp_accept_op(p, "(")) {
        while (!jp_is_op(p, ")")) {
            if (v.n) jp_expect_op(p, ",");
            const char *nm = jp_expect_name(p);
            jnode *def = NULL;
            if (jp_accept_op(p, "=")) def = jp_expr(p);
            jp_vec_push(p, &v, def, nm);
        }
        jp_expect_op(p, ")");
    }
    jp_vec_set(n, &v);
}

static jnode *jp_filter_chain(jp *p) {
    jnode *f = jp_filter_one(p, NULL);
    while (jp_accept_op(p, "|"))
        f = jp_filter_one(p, f);
    return f;
}

static jnode *jp_stmt(jp *p) {
    tk *k = jp_cur(p);
    int line = k->line;
    if (k->t != TK_NAME) jp_fail(p, KS_ERR_FORMAT, line, "expected a tag name");
    const char *tag = k->s;
    p->pos++;
    jnode *n;
    if (!strcmp(tag, "if")) {
        n = jp_node(p, N_IF, line);
        jp_vec v = {0};
        static const char *const stop[] = {"elif", "else", "endif", NULL};
        for (;;) {
            jnode *cond = jp_expr(p);
            jp_expect(p, TK_BLOCK_END);
            jp_vec_push(p, &v, cond, NULL);
            jp_vec_push(p, &v, jp_body(p, stop), NULL);
            const char *t = jp_next(p)->s;
            if (!strcmp(t, "elif")) continue;
            if (!strcmp(t, "else")) {
                jp_expect(p, TK_BLOCK_END);
                static const char *const stop2[] = {"endif", NULL};
                n->c = jp_body(p, stop2);
                jp_end_tag(p, "endif");
            } else {
                jp_expect(p, TK_BLOCK_END);
            }
            break;
        }
        jp_vec_set(n, &v);
        return n;
    }
    if (!strcmp(tag, "for")) {
        n = jp_node(p, N_FOR, line);
        jp_vec v = {0};
        bool paren = jp_accept_op(p, "(");
        do {
            jnode *t = jp_node(p, N_NAME, jp_cur(p)->line);
            t->name = jp_expect_name(p);
            jp_vec_push(p, &v, t, t->name);
        } while (jp_accept_op(p, ","));
        if (paren) jp_expect_op(p, ")");
        jp_vec_set(n, &v);
        if (!jp_accept_name(p, "in"))
            jp_fail(p, KS_ERR_FORMAT, jp_cur(p)->line, "expected 'in' in a for tag");
        n->a = jp_tuple(p, false);
        if (jp_accept_name(p, "if")) n->b = jp_expr(p);
        if (jp_is_name(p, "recursive"))
            jp_fail(p, KS_ERR_FORMAT, line, "recursive for loops are not supported");
        jp_expect(p, TK_BLOCK_END);
        static const char *const stop[] = {"else", "endfor", NULL};
        n->c = jp_body(p, stop);
        if (jp_accept_name(p, "else")) {
            jp_expect(p, TK_BLOCK_END);
            static const char *const stop2[] = {"endfor", NULL};
            n->d = jp_body(p, stop2);
        }
        jp_end_tag(p, "endfor");
        return n;
    }
    if (!strcmp(tag, "set")) {
        jnode *target = jp_set_target(p);
        if (jp_accept_op(p, "=")) {
            n = jp_node(p, N_SET, line);
            n->a = target;
            n->b = jp_tuple(p, true);
            jp_expect(p, TK_BLOCK_END);
            return n;
        }
        if (target->kind != N_NAME && target->kind != N_ATTR)
            jp_fail(p, KS_ERR_FORMAT, line, "a block set takes one target");
        n = jp_node(p, N_SETBLK, line);
        n->a = target;
        if (jp_accept_op(p, "|")) n->b = jp_filter_chain(p);
        jp_expect(p, TK_BLOCK_END);
        static const char *const stop[] = {"endset", NULL};
        n->c = jp_body(p, stop);
        jp_end_tag(p, "endset");
        return n;
    }
    if (!strcmp(tag, "macro")) {
        n = jp_node(p, N_MACRO, line);
        n->name = jp_expect_name(p);
        jp_params(p, n);
        jp_expect(p, TK_BLOCK_END);
        static const char *const stop[] = {"endmacro", NULL};
        n->c = jp_body(p, stop);
        jp_end_tag(p, "endmacro");
        return n;
    }
    if (!strcmp(tag, "call")) {
        n = jp_node(p, N_CALLBLK, line);
        if (jp_is_op(p, "(")) jp_params(p, n);
        n->a = jp_expr(p);
        if (n->a->kind != N_CALL) jp_fail(p, KS_ERR_FORMAT, line, "expected a call in a call tag");
        jp_expect(p, TK_BLOCK_END);
        static const char *const stop[] = {"endcall", NULL};
        n->c = jp_body(p, stop);
        jp_end_tag(p, "endcall");
        return n;
    }
    if (!strcmp(tag, "filter")) {
        n = jp_node(p, N_FILTBLK, line);
        n->b = jp_filter_chain(p);
        jp_expect(p, TK_BLOCK_END);
        static const char *const stop[] = {"endfilter", NULL};
        n->c = jp_body(p, stop);
        jp_end_tag(p, "endfilter");
        return n;
    }
    if (!strcmp(tag, "generation")) { /* transformers' assistant-mask tag: renders its body */
        jp_expect(p, TK_BLOCK_END);
        static const char *const stop[] = {"endgeneration", NULL};
        n = jp_body(p, stop);
        jp_end_tag(p, "endgeneration");
        return n;
    }
    if (!strcmp(tag, "break") || !strcmp(tag, "continue")) {
        n = jp_node(p, tag[0] == 'b' ? N_BREAK : N_CONTINUE, line);
        jp_expect(p, TK_BLOCK_END);
        return n;
    }
    jp_fail(p, KS_ERR_FORMAT, line, "unknown tag '%s'", tag);
}

static jnode *jp_body(jp *p, const char *const *stop) {
    jp_enter(p);
    jnode *body = jp_node(p, N_BODY, jp_cur(p)->line);
    jp_vec v = {0};
    for (;;) {
        tk *k = jp_cur(p);
        if (k->t == TK_EOF) {
            if (stop) {
                const char *const *last = stop;
                while (last[1])
                    last++;
                jp_fail(p, KS_ERR_FORMAT, k->line, "unexpected end of template, expected '%s'",
                        *last);
            }
            break;
        }
        if (k->t == TK_TEXT) {
            jnode *t = jp_node(p, N_TEXT, k->line);
            jstr *s = jp_alloc(p, sizeof *s + k->n + 1);
            s->n = k->n;
            s->taint = NULL;
            memcpy(s->s, k->s, k->n + 1);
            t->lit.t = JV_STR;
            t->lit.u.s = s;
            jp_vec_push(p, &v, t, NULL);
            p->pos++;
        } else if (k->t == TK_VAR_BEGIN) {
            p->pos++;
            jnode *o = jp_node(p, N_OUT, k->line);
            o->a = jp_tuple(p, true);
            jp_expect(p, TK_VAR_END);
            jp_vec_push(p, &v, o, NULL);
        } else if (k->t == TK_BLOCK_BEGIN) {
            tk *nm = &p->toks[p->pos + 1];
            if (nm->t == TK_NAME && jp_in(nm->s, stop)) {
                p->pos++;
                break;
            }
            if (nm->t == TK_NAME &&
                (!strncmp(nm->s, "end", 3) || !strcmp(nm->s, "elif") || !strcmp(nm->s, "else")))
                jp_fail(p, KS_ERR_FORMAT, nm->line, "unexpected '%s'", nm->s);
            p->pos++;
            jp_vec_push(p, &v, jp_stmt(p), NULL);
        } else {
            jp_fail(p, KS_ERR_FORMAT, k->line, "unexpected %s", jp_tk_desc(k));
        }
    }
    jp_vec_set(body, &v);
    jp_leave(p);
    return body;
}

ks_err jinja__parse(jinja_tmpl *t, const char *src, size_t len, ks_errbuf *eb) {
    jp p = {.t = t, .eb = eb, .src = src, .len = len, .line = 1};
    if (setjmp(p.jmp)) return p.err;
    jp_lex(&p);
    t->root = jp_body(&p, NULL);
    return KS_OK;
}
