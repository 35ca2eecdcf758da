/* value.c — the floor under the renderer: the arena, the render state's
 * failure and step accounting, the values (constructors, lists, dicts,
 * truthiness, equality, ordering), the output buffers and the taint of
 * request data, and iteration. Values follow Python's semantics as jinja2
 * sees them (int, float, str, list, tuple, dict, None, bool, Undefined).
 * parse.c, eval.c, builtin.c and print.c all call down into it; it calls
 * none of them. */
#include "jinja_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Arena

struct jinja__chunk {
    jinja__chunk *next;
    size_t cap, used;
    _Alignas(16) unsigned char data[];
};

void *jinja__alloc(jinja__arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    jinja__chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->cap_bytes && a->used_bytes + cap > a->cap_bytes) return NULL;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = a->head;
        a->head = c;
        a->used_bytes += cap;
    }
    void *p = c->data + c->used;
    c->used += n;
    return p;
}

void jinja__arena_free(jinja__arena *a) {
    jinja__chunk *c = a->head;
    while (c) {
        jinja__chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->used_bytes = 0;
}

// ----------------------------------------------------------------------------
// Render state helpers

void jr_fail(jr *r, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->err = ks_seterr(r->eb, KS_ERR_INVAL, "template line %d: %s", r->line, msg);
    longjmp(r->jmp, 1);
}

void *jr_alloc(jr *r, size_t n) {
    void *p = jinja__alloc(&r->arena, n);
    if (!p) {
        if (r->arena.cap_bytes && r->arena.used_bytes + n + 65536 > r->arena.cap_bytes)
            jr_fail(r, "template limit: more than %zu bytes of memory", r->arena.cap_bytes);
        r->err = ks_seterr(r->eb, KS_ERR_NOMEM, "template: out of memory");
        longjmp(r->jmp, 1);
    }
    return p;
}

void jr_step(jr *r, size_t n) {
    r->steps += n;
    if (r->steps > r->t->lim.max_steps)
        jr_fail(r, "template limit: more than %zu evaluation steps", r->t->lim.max_steps);
}

// ----------------------------------------------------------------------------
// Values

jv jv_undef(const char *name) {
    jv v = {.t = JV_UNDEF};
    v.uname = name;
    return v;
}
jv jv_none(void) { return (jv){.t = JV_NONE}; }
jv jv_bool(bool b) {
    jv v = {.t = JV_BOOL};
    v.u.b = b;
    return v;
}
jv jv_int(int64_t i) {
    jv v = {.t = JV_INT};
    v.u.i = i;
    return v;
}
jv jv_float(double f) {
    jv v = {.t = JV_FLOAT};
    v.u.f = f;
    return v;
}
jv jv_str(jr *r, const char *s, size_t n) {
    jstr *js = jr_alloc(r, sizeof *js + n + 1);
    js->n = n;
    js->taint = NULL;
    if (n) memcpy(js->s, s, n);
    js->s[n] = 0;
    jv v = {.t = JV_STR};
    v.u.s = js;
    return v;
}
jv jv_cstr(jr *r, const char *s) { return jv_str(r, s, strlen(s)); }
jv jv_list(jr *r, size_t cap) {
    jlist *l = jr_alloc(r, sizeof *l);
    l->n = 0;
    l->cap = cap;
    l->a = cap ? jr_alloc(r, cap * sizeof *l->a) : NULL;
    jv v = {.t = JV_LIST};
    v.u.l = l;
    return v;
}
jv jv_dict(jr *r) {
    jdict *d = jr_alloc(r, sizeof *d);
    memset(d, 0, sizeof *d);
    jv v = {.t = JV_DICT};
    v.u.d = d;
    return v;
}

void jl_push(jr *r, jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv *a = jr_alloc(r, cap * sizeof *a);
        if (l->n) memcpy(a, l->a, l->n * sizeof *a);
        l->a = a;
        l->cap = cap;
    }
    l->a[l->n++] = v;
}

jv *jd_get(const jdict *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].u.s->n == n && memcmp(d->k[i].u.s->s, k, n) == 0)
            return &d->v[i];
    return NULL;
}

jv *jd_getv(const jdict *d, jv k) {
    if (k.t == JV_STR) return jd_get(d, k.u.s->s, k.u.s->n);
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(NULL, &d->k[i], &k)) return &d->v[i];
    return NULL;
}

/* Appends k -> v without looking for k (the caller knows it is new). */
void jd_push(jr *r, jdict *d, jv k, jv v) {
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        jv *nk = jr_alloc(r, cap * sizeof *nk), *nv = jr_alloc(r, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
}

void jd_set(jr *r, jdict *d, jv k, jv v) {
    jr_step(r, 1 + d->n / 8); /* the lookup is linear: charge it */
    jv *old = jd_getv(d, k);
    if (old) {
        *old = v;
        return;
    }
    jd_push(r, d, k, v);
}

/* A string of the context: request data (tainted whole) while mark_data,
 * unless it is one of data_plain. */
static jv jr_data_str(jr *r, const char *s, size_t n) {
    jv v = jv_str(r, s, n);
    if (!r->mark_data || n == 0) return v;
    for (const char *const *p = r->data_plain; p && *p; p++)
        if (strlen(*p) == n && !memcmp(*p, s, n)) return v;
    v.u.s->taint = JSPANS_ALL;
    return v;
}

jv jv_from_json(jr *r, const json_t *j, int depth) {
    jr_step(r, 1);
    if (depth > 512) jr_fail(r, "context nested too deeply");
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jv d = jv_dict(r);
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) {
            /* JSON object keys are unique (jansson keeps one of each) */
            jd_push(r, d.u.d, jr_data_str(r, k, strlen(k)), jv_from_json(r, v, depth + 1));
        }
        return d;
    }
    case JSON_ARRAY: {
        jv l = jv_list(r, json_array_size(j));
        for (size_t i = 0; i < json_array_size(j); i++)
            jl_push(r, l.u.l, jv_from_json(r, json_array_get(j, i), depth + 1));
        return l;
    }
    case JSON_STRING:
        return jr_data_str(r, json_string_value(j), json_string_length(j));
    case JSON_INTEGER:
        return jv_int(json_integer_value(j));
    case JSON_REAL:
        return jv_float(json_real_value(j));
    case JSON_TRUE:
        return jv_bool(true);
    case JSON_FALSE:
        return jv_bool(false);
    default:
        return jv_none();
    }
}

bool jv_truthy(const jv *v) {
    switch (v->t) {
    case JV_UNDEF:
    case JV_NONE:
        return false;
    case JV_BOOL:
        return v->u.b;
    case JV_INT:
        return v->u.i != 0;
    case JV_FLOAT:
        return v->u.f != 0;
    case JV_STR:
        return v->u.s->n != 0;
    case JV_LIST:
        return v->u.l->n != 0 || (v->flags & JV_F_GEN);
    case JV_DICT:
        return v->u.d->n != 0;
    default:
        return true;
    }
}

bool jv_eq(jr *r, const jv *a, const jv *b) {
    if (r) jr_step(r, 1); /* deep comparisons cost one step per element */
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a->t != JV_FLOAT && b->t != JV_FLOAT) return jv_inum(a) == jv_inum(b);
        return jv_num(a) == jv_num(b);
    }
    if (a->t != b->t) return false;
    switch (a->t) {
    case JV_UNDEF:
    case JV_NONE:
        return true;
    case JV_STR:
        return a->u.s->n == b->u.s->n && memcmp(a->u.s->s, b->u.s->s, a->u.s->n) == 0;
    case JV_LIST:
        if ((a->flags | b->flags) & JV_F_GEN) return a->u.l == b->u.l;
        if ((a->flags & JV_F_TUPLE) != (b->flags & JV_F_TUPLE) || a->u.l->n != b->u.l->n)
            return false;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!jv_eq(r, &a->u.l->a[i], &b->u.l->a[i])) return false;
        return true;
    case JV_DICT:
        if (a->u.d->n != b->u.d->n) return false;
        for (size_t i = 0; i < a->u.d->n; i++) {
            if (r) jr_step(r, b->u.d->n / 8);
            jv *o = jd_getv(b->u.d, a->u.d->k[i]);
            if (!o || !jv_eq(r, &a->u.d->v[i], o)) return false;
        }
        return true;
    case JV_NS:
        return a->u.d == b->u.d;
    case JV_MACRO:
        return a->u.m == b->u.m;
    case JV_FUNC:
        return a->u.fn == b->u.fn;
    case JV_LOOP:
        return a->u.lp == b->u.lp;
    default:
        return false;
    }
}

const char *jv_type_name(const jv *v) {
    switch (v->t) {
    case JV_UNDEF:
        return "Undefined";
    case JV_NONE:
        return "NoneType";
    case JV_BOOL:
        return "bool";
    case JV_INT:
        return "int";
    case JV_FLOAT:
        return "float";
    case JV_STR:
        return "str";
    case JV_LIST:
        return v->flags & JV_F_GEN ? "generator" : v->flags & JV_F_TUPLE ? "tuple" : "list";
    case JV_DICT:
        return "dict";
    case JV_NS:
        return "Namespace";
    case JV_MACRO:
        return "Macro";
    case JV_FUNC:
        return "function";
    default:
        return "LoopContext";
    }
}

_Noreturn void jr_undef_fail(jr *r, const jv *v) {
    if (v->uname) jr_fail(r, "'%s' is undefined", v->uname);
    jr_fail(r, "a value is undefined");
}

int jv_cmp(jr *r, const jv *a, const jv *b) {
    if (a->t == JV_UNDEF) jr_undef_fail(r, a);
    if (b->t == JV_UNDEF) jr_undef_fail(r, b);
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a->t != JV_FLOAT && b->t != JV_FLOAT)
            return jv_inum(a) < jv_inum(b) ? -1 : jv_inum(a) > jv_inum(b);
        double x = jv_num(a), y = jv_num(b);
        return x < y ? -1 : x > y;
    }
    if (a->t == JV_STR && b->t == JV_STR) {
        size_t n = a->u.s->n < b->u.s->n ? a->u.s->n : b->u.s->n;
        int c = memcmp(a->u.s->s, b->u.s->s, n);
        if (c) return c < 0 ? -1 : 1;
        return a->u.s->n < b->u.s->n ? -1 : a->u.s->n > b->u.s->n;
    }
    if (a->t == JV_LIST && b->t == JV_LIST) {
        for (size_t i = 0; i < a->u.l->n && i < b->u.l->n; i++) {
            if (jv_eq(r, &a->u.l->a[i], &b->u.l->a[i])) continue;
            return jv_cmp(r, &a->u.l->a[i], &b->u.l->a[i]);
        }
        return a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n;
    }
    jr_fail(r, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a),
            jv_type_name(b));
}

// ----------------------------------------------------------------------------
// Output buffers

void jb_put(jr *r, jbuf *b, const char *s, size_t n) {
    if (n == 0) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        if (cap > r->t->lim.max_out_bytes * 2 + 1024)
            jr_fail(r, "template limit: more than %zu bytes of output", r->t->lim.max_out_bytes);
        char *p = jr_alloc(r, cap);
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void jb_puts(jr *r, jbuf *b, const char *s) { jb_put(r, b, s, strlen(s)); }

// ----------------------------------------------------------------------------
// Taint (jinja_int.h, jspans)

const jspans jspans_all = {0};

bool js_tainted(const jstr *s) {
    return s->taint && s->n && (s->taint == JSPANS_ALL || s->taint->n);
}

bool jv_tainted(jr *r, const jv *v, int depth) {
    jr_step(r, 1);
    if (depth > 64) return true; /* deeper than any chat message: assume so */
    switch (v->t) {
    case JV_STR:
        return js_tainted(v->u.s);
    case JV_LIST:
        for (size_t i = 0; i < v->u.l->n; i++)
            if (jv_tainted(r, &v->u.l->a[i], depth + 1)) return true;
        return false;
    case JV_DICT:
    case JV_NS:
        for (size_t i = 0; i < v->u.d->n; i++)
            if (jv_tainted(r, &v->u.d->k[i], depth + 1) || jv_tainted(r, &v->u.d->v[i], depth + 1))
                return true;
        return false;
    case JV_FUNC:
        return jv_tainted(r, &v->u.fn->self, depth + 1);
    default:
        return false;
    }
}

jv jv_taint_all(jr *r, jv v) {
    if (v.t != JV_STR || v.u.s->n == 0 || v.u.s->taint == JSPANS_ALL) return v;
    jr_step(r, 1 + v.u.s->n / 4096);
    jv c = jv_str(r, v.u.s->s, v.u.s->n);
    c.flags = v.flags;
    c.u.s->taint = JSPANS_ALL;
    return c;
}

void jb_mark(jr *r, jbuf *b, size_t lo, size_t hi) {
    if (lo >= hi) return;
    if (b->n_sp && b->sp[2 * b->n_sp - 1] >= lo) { /* touches the last range: extend it */
        if (hi > b->sp[2 * b->n_sp - 1]) b->sp[2 * b->n_sp - 1] = hi;
        return;
    }
    if (b->n_sp == b->cap_sp) {
        size_t cap = b->cap_sp ? b->cap_sp * 2 : 8;
        size_t *p = jr_alloc(r, 2 * cap * sizeof *p);
        if (b->n_sp) memcpy(p, b->sp, 2 * b->n_sp * sizeof *p);
        b->sp = p;
        b->cap_sp = cap;
    }
    b->sp[2 * b->n_sp] = lo;
    b->sp[2 * b->n_sp + 1] = hi;
    b->n_sp++;
}

/* Marks in b the taint of s, whose bytes start at b's offset at. */
void jb_mark_str(jr *r, jbuf *b, const jstr *s, size_t at) {
    if (!js_tainted(s)) return;
    if (s->taint == JSPANS_ALL) {
        jb_mark(r, b, at, at + s->n);
        return;
    }
    for (size_t i = 0; i < s->taint->n; i++)
        jb_mark(r, b, at + s->taint->a[2 * i], at + s->taint->a[2 * i + 1]);
}

void jb_put_str(jr *r, jbuf *b, const jstr *s) {
    size_t at = b->n;
    jb_put(r, b, s->s, s->n);
    jb_mark_str(r, b, s, at);
}

/* The taint of b's ranges as a string's (NULL when none). */
const jspans *jb_spans(jr *r, const jbuf *b) {
    if (!b->n_sp) return NULL;
    if (b->n_sp == 1 && b->sp[0] == 0 && b->sp[1] == b->n) return JSPANS_ALL;
    jspans *t = jr_alloc(r, sizeof *t + 2 * b->n_sp * sizeof t->a[0]);
    t->n = b->n_sp;
    memcpy(t->a, b->sp, 2 * b->n_sp * sizeof t->a[0]);
    return t;
}

jv jv_from_buf(jr *r, const jbuf *b) {
    jv v = jv_str(r, b->p ? b->p : "", b->n);
    v.u.s->taint = jb_spans(r, b);
    return v;
}

/* res, a substring of the tainted string in (strip and the like), with
 * in's taint over the bytes it took. */
static jv jr_taint_sub(jr *r, jv res, const jstr *in) {
    size_t off = 0;
    const jstr *rs = res.u.s;
    while (off + rs->n <= in->n && memcmp(in->s + off, rs->s, rs->n))
        off++;
    if (off + rs->n > in->n) return jv_taint_all(r, res);
    jr_step(r, 1 + off / 4096);
    jbuf b = {0};
    b.n = rs->n;
    if (in->taint == JSPANS_ALL) {
        jb_mark(r, &b, 0, rs->n);
    } else {
        for (size_t i = 0; i < in->taint->n; i++) {
            size_t lo = in->taint->a[2 * i], hi = in->taint->a[2 * i + 1];
            lo = lo < off ? 0 : lo - off;
            hi = hi < off ? 0 : hi - off;
            jb_mark(r, &b, lo, hi < rs->n ? hi : rs->n);
        }
    }
    jv c = jv_str(r, rs->s, rs->n);
    c.flags = res.flags;
    c.u.s->taint = jb_spans(r, &b);
    return c;
}

jv jr_taint_result(jr *r, jv res, const jv *in, size_t n, bool substring) {
    if (res.t == JV_STR) {
        if (res.u.s->taint == JSPANS_ALL || res.u.s->n == 0) return res;
        for (size_t i = 0; i < n; i++) /* an input itself, as it was (default, first...) */
            if (in[i].t == JV_STR && in[i].u.s == res.u.s) return res;
        if (substring && n && in[0].t == JV_STR && js_tainted(in[0].u.s))
            return jr_taint_sub(r, res, in[0].u.s);
        for (size_t i = 0; i < n; i++)
            if (jv_tainted(r, &in[i], 0)) return jv_taint_all(r, res);
        return res;
    }
    if (res.t != JV_LIST) return res;
    for (size_t i = 0; i < n; i++) /* an input list itself, as it was (default) */
        if (in[i].t == JV_LIST && in[i].u.l == res.u.l) return res;
    bool need = false; /* new clean strings directly in the list (split...) */
    for (size_t i = 0; i < res.u.l->n && !need; i++)
        need = res.u.l->a[i].t == JV_STR && !js_tainted(res.u.l->a[i].u.s);
    if (!need) return res;
    bool t = false;
    for (size_t i = 0; i < n && !t; i++)
        t = jv_tainted(r, &in[i], 0);
    if (!t) return res;
    jv l = jv_list(r, res.u.l->n);
    l.flags = res.flags;
    jr_step(r, res.u.l->n);
    for (size_t i = 0; i < res.u.l->n; i++)
        jl_push(r, l.u.l, jv_taint_all(r, res.u.l->a[i]));
    return l;
}

jlist *jv_iter(jr *r, const jv *v) {
    switch (v->t) {
    case JV_UNDEF: {
        jv l = jv_list(r, 0);
        return l.u.l;
    }
    case JV_LIST:
        return v->u.l;
    case JV_DICT: {
        jv l = jv_list(r, v->u.d->n);
        jr_step(r, v->u.d->n);
        for (size_t i = 0; i < v->u.d->n; i++)
            jl_push(r, l.u.l, v->u.d->k[i]);
        return l.u.l;
    }
    case JV_STR: {
        jv l = jv_list(r, v->u.s->n);
        jr_step(r, v->u.s->n);
        const unsigned char *s = (const unsigned char *)v->u.s->s;
        size_t n = v->u.s->n;
        for (size_t i = 0; i < n;) {
            size_t k = 1;
            if (s[i] >= 0xF0)
                k = 4;
            else if (s[i] >= 0xE0)
                k = 3;
            else if (s[i] >= 0xC0)
                k = 2;
            if (i + k > n) k = n - i;
            jv c = jv_str(r, (const char *)s + i, k);
            if (js_tainted(v->u.s)) c.u.s->taint = JSPANS_ALL;
            jl_push(r, l.u.l, c);
            i += k;
        }
        return l.u.l;
    }
    default:
        jr_fail(r, "'%s' object is not iterable", jv_type_name(v));
    }
}
