/* print.c — how values print: Python's str() and repr() (what {{ x }}
 * writes), markupsafe's escape, and json.dumps as Hugging Face's tojson
 * calls it (ensure_ascii off, keys in insertion order, indent, separators).
 * Floats print as Python's repr (the shortest text that reads back the same
 * double). A namespace may hold itself: printing it gives Python's "{...}"
 * for the inner occurrence, never an endless recursion. */
#include "jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Printers: str(), repr(), json.dumps()

static void py_float(char *buf, size_t cap, double d) {
    if (isnan(d)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(d)) {
        snprintf(buf, cap, d < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[64];
    for (int p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, d);
        if (strtod(tmp, NULL) == d) break;
    }
    /* tmp: [-]D[.DDD]e[+-]XX */
    const char *s = tmp;
    char *o = buf;
    if (*s == '-') *o++ = *s++;
    char dig[32];
    int nd = 0;
    while (*s && *s != 'e') {
        if (*s != '.') dig[nd++] = *s;
        s++;
    }
    int exp = atoi(s + 1);
    while (nd > 1 && dig[nd - 1] == '0')
        nd--;
    if (exp >= -4 && exp < 16) {
        if (exp >= 0) {
            for (int i = 0; i <= exp; i++)
                *o++ = i < nd ? dig[i] : '0';
            *o++ = '.';
            if (nd > exp + 1)
                for (int i = exp + 1; i < nd; i++)
                    *o++ = dig[i];
            else
                *o++ = '0';
        } else {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -exp - 1; i++)
                *o++ = '0';
            for (int i = 0; i < nd; i++)
                *o++ = dig[i];
        }
        *o = 0;
    } else {
        *o++ = dig[0];
        if (nd > 1) {
            *o++ = '.';
            for (int i = 1; i < nd; i++)
                *o++ = dig[i];
        }
        snprintf(o, (size_t)(buf + cap - o), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
}

static void py_repr_str(jr *r, jbuf *b, const char *s, size_t n) {
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    jb_put(r, b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '\\')
            jb_puts(r, b, "\\\\");
        else if (c == (unsigned char)q) {
            esc[0] = '\\';
            esc[1] = q;
            jb_put(r, b, esc, 2);
        } else if (c == '\n')
            jb_puts(r, b, "\\n");
        else if (c == '\r')
            jb_puts(r, b, "\\r");
        else if (c == '\t')
            jb_puts(r, b, "\\t");
        else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", c);
            jb_puts(r, b, esc);
        } else
            jb_put(r, b, (const char *)&c, 1);
    }
    jb_put(r, b, &q, 1);
}

/* Enters container c for printing; false when c is already being printed
 * (a namespace that holds itself): Python then prints "{...}" / "[...]". */
static bool print_enter(jr *r, const void *c) {
    for (int i = 0; i < r->pdepth; i++)
        if (r->pstack[i] == c) return false;
    if (r->pdepth >= 200) jr_fail(r, "a value nested too deeply to print");
    r->pstack[r->pdepth++] = c;
    return true;
}

static void jv_repr_seq(jr *r, jbuf *b, const jv *v) {
    bool tuple = v->flags & JV_F_TUPLE;
    if (!print_enter(r, v->u.l)) {
        jb_puts(r, b, tuple ? "(...)" : "[...]");
        return;
    }
    jb_puts(r, b, tuple ? "(" : "[");
    for (size_t i = 0; i < v->u.l->n; i++) {
        if (i) jb_puts(r, b, ", ");
        jv_repr_to(r, b, &v->u.l->a[i]);
    }
    if (tuple && v->u.l->n == 1) jb_puts(r, b, ",");
    jb_puts(r, b, tuple ? ")" : "]");
    r->pdepth--;
}

static void jv_repr_dict(jr *r, jbuf *b, const jdict *d) {
    if (!print_enter(r, d)) {
        jb_puts(r, b, "{...}");
        return;
    }
    jb_puts(r, b, "{");
    for (size_t i = 0; i < d->n; i++) {
        if (i) jb_puts(r, b, ", ");
        jv_repr_to(r, b, &d->k[i]);
        jb_puts(r, b, ": ");
        jv_repr_to(r, b, &d->v[i]);
    }
    jb_puts(r, b, "}");
    r->pdepth--;
}

void jv_escape_to(jr *r, jbuf *b, const char *s, size_t n) {
    /* markupsafe's replacements; every other byte is copied */
    static const char *const html[128] = {
        ['&'] = "&amp;", ['<'] = "&lt;", ['>'] = "&gt;", ['"'] = "&#34;", ['\''] = "&#39;"};
    size_t a = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *rep = c < 128 ? html[c] : NULL;
        if (!rep) continue;
        jb_put(r, b, s + a, i - a);
        jb_puts(r, b, rep);
        a = i + 1;
    }
    jb_put(r, b, s + a, n - a);
}

static void str_to(jr *r, jbuf *b, const jv *v);

void jv_repr_to(jr *r, jbuf *b, const jv *v) {
    jr_step(r, 1);
    if (v->t == JV_STR) {
        py_repr_str(r, b, v->u.s->s, v->u.s->n);
        return;
    }
    if (v->t == JV_UNDEF) {
        jb_puts(r, b, "Undefined");
        return;
    }
    str_to(r, b, v);
}

/* None, a bool, an int or a float as str() (json: as json.dumps) spells
 * it; false, writing nothing, for any other value. */
static bool print_scalar(jr *r, jbuf *b, const jv *v, bool json) {
    char num[64];
    switch (v->t) {
    case JV_NONE:
        jb_puts(r, b, json ? "null" : "None");
        return true;
    case JV_BOOL:
        jb_puts(r, b, v->u.b ? (json ? "true" : "True") : (json ? "false" : "False"));
        return true;
    case JV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v->u.i);
        jb_puts(r, b, num);
        return true;
    case JV_FLOAT:
        if (json && isnan(v->u.f))
            jb_puts(r, b, "NaN");
        else if (json && isinf(v->u.f))
            jb_puts(r, b, v->u.f < 0 ? "-Infinity" : "Infinity");
        else {
            py_float(num, sizeof num, v->u.f);
            jb_puts(r, b, num);
        }
        return true;
    default:
        return false;
    }
}

void jv_str_to(jr *r, jbuf *b, const jv *v) {
    if (v->t == JV_STR) {
        jb_put_str(r, b, v->u.s);
        return;
    }
    size_t at = b->n;
    str_to(r, b, v);
    /* a container's repr holds its strings: tainted whole when any is */
    if ((v->t == JV_LIST || v->t == JV_DICT || v->t == JV_NS) && jv_tainted(r, v, 0))
        jb_mark(r, b, at, b->n);
}

static void str_to(jr *r, jbuf *b, const jv *v) {
    if (print_scalar(r, b, v, false)) return;
    switch (v->t) {
    case JV_UNDEF:
        return;
    case JV_STR:
        jb_put(r, b, v->u.s->s, v->u.s->n);
        return;
    case JV_LIST:
        if (v->flags & JV_F_GEN) { /* Python prints an address here: nothing to match */
            jb_puts(r, b, "<generator object>");
            return;
        }
        jv_repr_seq(r, b, v);
        return;
    case JV_DICT:
        jv_repr_dict(r, b, v->u.d);
        return;
    case JV_NS:
        jb_puts(r, b, "<Namespace ");
        jv_repr_dict(r, b, v->u.d);
        jb_puts(r, b, ">");
        return;
    case JV_MACRO:
        jb_puts(r, b, "<Macro>");
        return;
    case JV_FUNC:
        jb_puts(r, b, "<function>");
        return;
    default:
        jb_puts(r, b, "<LoopContext>");
        return;
    }
}

jv jv_tostr(jr *r, const jv *v) {
    if (v->t == JV_STR) return *v;
    jbuf b = {0};
    jv_str_to(r, &b, v);
    return jv_from_buf(r, &b);
}

static void json_str(jr *r, jbuf *b, const char *s, size_t n, bool ascii) {
    /* the characters json.dumps writes as a backslash and a letter */
    static const char short_esc[128] = {['"'] = '"',  ['\\'] = '\\', ['\n'] = 'n', ['\r'] = 'r',
                                        ['\t'] = 't', ['\b'] = 'b',  ['\f'] = 'f'};
    jb_puts(r, b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[16];
        if (c < 128 && short_esc[c]) {
            esc[0] = '\\';
            esc[1] = short_esc[c];
            jb_put(r, b, esc, 2);
        } else if (c < 0x20 || (ascii && c == 0x7f)) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            jb_puts(r, b, esc);
        } else if (ascii && c >= 0x80) {
            uint32_t cp = 0;
            size_t k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
            if (i + k > n) k = n - i;
            cp = k == 1 ? c : (uint32_t)(c & (0x7F >> k));
            for (size_t j = 1; j < k; j++)
                cp = (cp << 6) | ((unsigned char)s[i + j] & 0x3F);
            i += k - 1;
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                         0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(esc, sizeof esc, "\\u%04x", cp);
            }
            jb_puts(r, b, esc);
        } else {
            jb_put(r, b, (const char *)&c, 1);
        }
    }
    jb_puts(r, b, "\"");
}

static void json_nl(jr *r, jbuf *b, const json_fmt *f, int level) {
    jb_puts(r, b, "\n");
    for (int i = 0; i < level; i++)
        jb_puts(r, b, f->indent);
}

static void json_val(jr *r, jbuf *b, const jv *v, const json_fmt *f, int level) {
    jr_step(r, 1);
    if (level > 256) jr_fail(r, "tojson: value nested too deeply");
    if (print_scalar(r, b, v, true)) return;
    switch (v->t) {
    case JV_STR:
        json_str(r, b, v->u.s->s, v->u.s->n, f->ascii);
        return;
    case JV_LIST: {
        if (v->flags & JV_F_GEN) jr_fail(r, "Object of type generator is not JSON serializable");
        if (v->u.l->n == 0) {
            jb_puts(r, b, "[]");
            return;
        }
        jb_puts(r, b, "[");
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i) jb_puts(r, b, f->item_sep);
            if (f->indent) json_nl(r, b, f, level + 1);
            json_val(r, b, &v->u.l->a[i], f, level + 1);
        }
        if (f->indent) json_nl(r, b, f, level);
        jb_puts(r, b, "]");
        return;
    }
    case JV_DICT: {
        const jdict *d = v->u.d;
        if (d->n == 0) {
            jb_puts(r, b, "{}");
            return;
        }
        size_t *ord = jr_alloc(r, d->n * sizeof *ord);
        for (size_t i = 0; i < d->n; i++)
            ord[i] = i;
        if (f->sort_keys) /* insertion sort: dicts in templates are small */
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0 && jv_cmp(r, &d->k[ord[j - 1]], &d->k[ord[j]]) > 0; j--) {
                    size_t t = ord[j];
                    ord[j] = ord[j - 1];
                    ord[j - 1] = t;
                }
        jb_puts(r, b, "{");
        for (size_t i = 0; i < d->n; i++) {
            const jv *k = &d->k[ord[i]];
            if (i) jb_puts(r, b, f->item_sep);
            if (f->indent) json_nl(r, b, f, level + 1);
            if (k->t == JV_STR) {
                json_str(r, b, k->u.s->s, k->u.s->n, f->ascii);
            } else if (k->t == JV_INT || k->t == JV_FLOAT || k->t == JV_BOOL || k->t == JV_NONE) {
                jbuf kb = {0};
                json_val(r, &kb, k, f, level + 1);
                json_str(r, b, kb.p, kb.n, f->ascii);
            } else {
                jr_fail(r, "keys must be str, int, float, bool or None, not %s", jv_type_name(k));
            }
            jb_puts(r, b, f->key_sep);
            json_val(r, b, &d->v[ord[i]], f, level + 1);
        }
        if (f->indent) json_nl(r, b, f, level);
        jb_puts(r, b, "}");
        return;
    }
    default:
        jr_fail(r, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
}

void jv_json_to(jr *r, jbuf *b, const jv *v, const json_fmt *f) { json_val(r, b, v, f, 0); }
