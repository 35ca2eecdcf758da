/* builtin.c — jinja's globals, filters, tests and methods (printing is in
 * print.c).
 *
 * Each behaves as the jinja2 (3.x) builtin or the Python method of the same
 * name does in Hugging Face's environment (ImmutableSandboxedEnvironment:
 * methods that mutate a list or dict are refused as jinja2 refuses them).
 * map/select/reject/selectattr/rejectattr/unique/batch/items/reverse give
 * generators as in jinja2 (always true, no length, not JSON), but one can be
 * iterated more than once here. Known gaps, kept on purpose: case mapping
 * and whitespace are ASCII-only, and %-formatting of strings is not
 * implemented (no published chat template uses it). */
#include "jinja_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

// ----------------------------------------------------------------------------
// Argument helpers

typedef struct jargs {
    jv *a;
    const char **names;
    size_t n;
    size_t n_pos; /* leading positional */
} jargs;

static jargs mkargs(jv *a, const char **names, size_t n) {
    jargs g = {a, names, n, 0};
    while (g.n_pos < n && (!names || !names[g.n_pos]))
        g.n_pos++;
    return g;
}

/* The argument at position pos or named name; NULL when absent. */
static const jv *arg(const jargs *g, size_t pos, const char *name) {
    if (pos < g->n_pos) return &g->a[pos];
    if (name && g->names)
        for (size_t i = g->n_pos; i < g->n; i++)
            if (g->names[i] && !strcmp(g->names[i], name)) return &g->a[i];
    return NULL;
}

static const jstr *arg_str(jr *r, const jargs *g, size_t pos, const char *name, const char *what) {
    const jv *v = arg(g, pos, name);
    if (!v || v->t == JV_NONE) return NULL;
    if (v->t != JV_STR) jr_fail(r, "%s: expected a string argument, got %s", what, jv_type_name(v));
    return v->u.s;
}

static int64_t arg_int(jr *r, const jargs *g, size_t pos, const char *name, int64_t dflt,
                       const char *what) {
    const jv *v = arg(g, pos, name);
    if (!v || v->t == JV_NONE) return dflt;
    if (v->t == JV_INT) return v->u.i;
    if (v->t == JV_BOOL) return v->u.b;
    jr_fail(r, "%s: expected an integer argument, got %s", what, jv_type_name(v));
}

static bool arg_bool(const jargs *g, size_t pos, const char *name, bool dflt) {
    const jv *v = arg(g, pos, name);
    return v ? jv_truthy(v) : dflt;
}

static const jstr *need_str(jr *r, const jv *v, const char *what) {
    if (v->t == JV_UNDEF) {
        if (v->uname) jr_fail(r, "'%s' is undefined", v->uname);
        jr_fail(r, "%s: the value is undefined", what);
    }
    if (v->t != JV_STR) jr_fail(r, "%s: expected a string, got %s", what, jv_type_name(v));
    return v->u.s;
}

// ----------------------------------------------------------------------------
// String helpers

static bool is_ws(unsigned char c) {
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

static bool in_chars(const jstr *chars, unsigned char c) {
    return chars ? memchr(chars->s, c, chars->n) != NULL : is_ws(c);
}

static jv str_strip(jr *r, const jstr *s, const jstr *chars, bool left, bool right) {
    size_t a = 0, b = s->n;
    if (left)
        while (a < b && in_chars(chars, (unsigned char)s->s[a]))
            a++;
    if (right)
        while (b > a && in_chars(chars, (unsigned char)s->s[b - 1]))
            b--;
    return jv_str(r, s->s + a, b - a);
}

static jv str_case(jr *r, const jstr *s, int mode) { /* 0 lower 1 upper 2 capitalize 3 title */
    jv o = jv_str(r, s->s, s->n);
    char *p = o.u.s->s;
    bool start = true;
    for (size_t i = 0; i < s->n; i++) {
        unsigned char c = (unsigned char)p[i];
        switch (mode) {
        case 0:
            p[i] = (char)((c >= 'A' && c <= 'Z') ? c + 32 : c);
            break;
        case 1:
            p[i] = (char)((c >= 'a' && c <= 'z') ? c - 32 : c);
            break;
        case 2:
            if (i == 0)
                p[i] = (char)((c >= 'a' && c <= 'z') ? c - 32 : c);
            else
                p[i] = (char)((c >= 'A' && c <= 'Z') ? c + 32 : c);
            break;
        default:
            if (is_ws(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<') {
                start = true;
            } else if (start) {
                p[i] = (char)((c >= 'a' && c <= 'z') ? c - 32 : c);
                start = false;
            } else {
                p[i] = (char)((c >= 'A' && c <= 'Z') ? c + 32 : c);
            }
        }
    }
    return o;
}

static jv str_replace(jr *r, const jstr *s, const jstr *old, const jstr *new, int64_t count) {
    jbuf b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (old->n == 0) { /* Python inserts new between every character */
        jlist *cps = jv_iter(r, &(jv){.t = JV_STR, .u.s = (jstr *)s});
        for (size_t k = 0; k < cps->n; k++) {
            if (count < 0 || done < count) {
                jb_put(r, &b, new->s, new->n);
                done++;
            }
            jb_put(r, &b, cps->a[k].u.s->s, cps->a[k].u.s->n);
        }
        if (count < 0 || done < count) jb_put(r, &b, new->s, new->n);
        return jv_str(r, b.p ? b.p : "", b.n);
    }
    while (i < s->n) {
        const char *hit =
            (count < 0 || done < count) ? memmem(s->s + i, s->n - i, old->s, old->n) : NULL;
        if (!hit) break;
        size_t at = (size_t)(hit - s->s);
        jb_put(r, &b, s->s + i, at - i);
        jb_put(r, &b, new->s, new->n);
        i = at + old->n;
        done++;
        jr_step(r, 1);
    }
    jb_put(r, &b, s->s + i, s->n - i);
    return jv_str(r, b.p ? b.p : "", b.n);
}

static jv str_split(jr *r, const jstr *s, const jstr *sep, int64_t maxsplit, bool from_right) {
    jv l = jv_list(r, 0);
    if (!sep) { /* runs of whitespace, no empty strings */
        size_t i = 0;
        if (!from_right) {
            int64_t done = 0;
            while (i < s->n) {
                while (i < s->n && is_ws((unsigned char)s->s[i]))
                    i++;
                if (i >= s->n) break;
                if (maxsplit >= 0 && done >= maxsplit) {
                    size_t e = s->n;
                    while (e > i && is_ws((unsigned char)s->s[e - 1]))
                        e--;
                    jl_push(r, l.u.l, jv_str(r, s->s + i, e - i));
                    break;
                }
                size_t j = i;
                while (j < s->n && !is_ws((unsigned char)s->s[j]))
                    j++;
                jl_push(r, l.u.l, jv_str(r, s->s + i, j - i));
                done++;
                i = j;
            }
            return l;
        }
        /* rsplit(): split from the right, then reverse */
        size_t e = s->n;
        int64_t done = 0;
        jv rev = jv_list(r, 0);
        while (e > 0) {
            while (e > 0 && is_ws((unsigned char)s->s[e - 1]))
                e--;
            if (e == 0) break;
            if (maxsplit >= 0 && done >= maxsplit) {
                size_t a = 0;
                while (a < e && is_ws((unsigned char)s->s[a]))
                    a++;
                jl_push(r, rev.u.l, jv_str(r, s->s + a, e - a));
                break;
            }
            size_t a = e;
            while (a > 0 && !is_ws((unsigned char)s->s[a - 1]))
                a--;
            jl_push(r, rev.u.l, jv_str(r, s->s + a, e - a));
            done++;
            e = a;
        }
        for (size_t k = rev.u.l->n; k-- > 0;)
            jl_push(r, l.u.l, rev.u.l->a[k]);
        return l;
    }
    if (sep->n == 0) jr_fail(r, "empty separator");
    if (!from_right) {
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            jr_step(r, 1);
            const char *hit = (maxsplit < 0 || done < maxsplit)
                                  ? memmem(s->s + i, s->n - i, sep->s, sep->n)
                                  : NULL;
            if (!hit) {
                jl_push(r, l.u.l, jv_str(r, s->s + i, s->n - i));
                return l;
            }
            size_t at = (size_t)(hit - s->s);
            jl_push(r, l.u.l, jv_str(r, s->s + i, at - i));
            i = at + sep->n;
            done++;
        }
    }
    jv rev = jv_list(r, 0);
    size_t e = s->n;
    int64_t done = 0;
    for (;;) {
        jr_step(r, 1);
        size_t at = SIZE_MAX;
        if ((maxsplit < 0 || done < maxsplit) && e >= sep->n)
            for (size_t k = e - sep->n + 1; k-- > 0;)
                if (memcmp(s->s + k, sep->s, sep->n) == 0) {
                    at = k;
                    break;
                }
        if (at == SIZE_MAX) {
            jl_push(r, rev.u.l, jv_str(r, s->s, e));
            break;
        }
        jl_push(r, rev.u.l, jv_str(r, s->s + at + sep->n, e - at - sep->n));
        e = at;
        done++;
    }
    for (size_t k = rev.u.l->n; k-- > 0;)
        jl_push(r, l.u.l, rev.u.l->a[k]);
    return l;
}

static size_t utf8_len(const jstr *s) {
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++)
        n += ((unsigned char)s->s[i] & 0xC0) != 0x80;
    return n;
}

static bool str_affix(jr *r, const jstr *s, const jv *x, bool end) {
    if (x->t == JV_LIST && (x->flags & JV_F_TUPLE)) {
        for (size_t i = 0; i < x->u.l->n; i++)
            if (str_affix(r, s, &x->u.l->a[i], end)) return true;
        return false;
    }
    const jstr *a = need_str(r, x, end ? "endswith" : "startswith");
    if (a->n > s->n) return false;
    return memcmp(end ? s->s + s->n - a->n : s->s, a->s, a->n) == 0;
}

// ----------------------------------------------------------------------------
// Builtin functions (globals and bound methods)

enum {
    F_RANGE = 1,
    F_NAMESPACE,
    F_DICT,
    F_RAISE,
    F_STRFTIME,
    F_CYCLE, /* loop.cycle */
    /* str methods */
    M_STRIP,
    M_LSTRIP,
    M_RSTRIP,
    M_SPLIT,
    M_RSPLIT,
    M_STARTSWITH,
    M_ENDSWITH,
    M_REPLACE,
    M_UPPER,
    M_LOWER,
    M_TITLE,
    M_CAPITALIZE,
    M_FIND,
    M_RFIND,
    M_COUNT,
    M_JOIN,
    M_ISDIGIT,
    M_ISALPHA,
    M_ISSPACE,
    M_ISALNUM,
    M_SPLITLINES,
    /* dict methods */
    M_GET,
    M_ITEMS,
    M_KEYS,
    M_VALUES,
    /* list methods */
    M_INDEX,
    M_LCOUNT,
};

static jv mkfunc(jr *r, int id, jv self) {
    jfunc *fn = jr_alloc(r, sizeof *fn);
    fn->id = id;
    fn->self = self;
    jv v = {.t = JV_FUNC};
    v.u.fn = fn;
    return v;
}

jv jinja__global(jr *r, const char *name) {
    static const struct {
        const char *name;
        int id;
    } g[] = {{"range", F_RANGE},
             {"namespace", F_NAMESPACE},
             {"dict", F_DICT},
             {"raise_exception", F_RAISE},
             {"strftime_now", F_STRFTIME}};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
        if (!strcmp(g[i].name, name)) return mkfunc(r, g[i].id, jv_undef(NULL));
    return jv_undef(name);
}

static const struct {
    const char *name;
    int id;
} str_methods[] = {{"strip", M_STRIP},       {"lstrip", M_LSTRIP},   {"rstrip", M_RSTRIP},
                   {"split", M_SPLIT},       {"rsplit", M_RSPLIT},   {"startswith", M_STARTSWITH},
                   {"endswith", M_ENDSWITH}, {"replace", M_REPLACE}, {"upper", M_UPPER},
                   {"lower", M_LOWER},       {"title", M_TITLE},     {"capitalize", M_CAPITALIZE},
                   {"find", M_FIND},         {"rfind", M_RFIND},     {"count", M_COUNT},
                   {"join", M_JOIN},         {"isdigit", M_ISDIGIT}, {"isalpha", M_ISALPHA},
                   {"isspace", M_ISSPACE},   {"isalnum", M_ISALNUM}, {"splitlines", M_SPLITLINES}},
  dict_methods[] = {{"get", M_GET}, {"items", M_ITEMS}, {"keys", M_KEYS}, {"values", M_VALUES}},
  list_methods[] = {{"index", M_INDEX}, {"count", M_LCOUNT}};

/* Mutating methods the immutable sandbox refuses. */
static const char *const unsafe_dict[] = {"pop", "update", "setdefault", "clear", "popitem", NULL};
static const char *const unsafe_list[] = {"append", "pop",  "extend",  "insert", "remove",
                                          "clear",  "sort", "reverse", NULL};

static bool in_set(const char *s, const char *const *set) {
    for (; *set; set++)
        if (!strcmp(s, *set)) return true;
    return false;
}

static jv unsafe(const char *tname, const char *attr) {
    (void)tname;
    jv u = jv_undef(attr);
    u.flags = 1; /* calling it is a SecurityError */
    return u;
}

bool jinja__is_strip(int id) { return id == M_STRIP || id == M_LSTRIP || id == M_RSTRIP; }

jv jinja__getattr(jr *r, const jv *obj, const char *name) {
    switch (obj->t) {
    case JV_UNDEF:
        if (obj->uname) jr_fail(r, "'%s' is undefined", obj->uname);
        jr_fail(r, "'%s' of an undefined value", name);
    case JV_STR:
        for (size_t i = 0; i < sizeof str_methods / sizeof str_methods[0]; i++)
            if (!strcmp(str_methods[i].name, name)) return mkfunc(r, str_methods[i].id, *obj);
        return jv_undef(name);
    case JV_DICT: {
        jr_step(r, obj->u.d->n / 8); /* linear lookup: charge it */
        for (size_t i = 0; i < sizeof dict_methods / sizeof dict_methods[0]; i++)
            if (!strcmp(dict_methods[i].name, name)) return mkfunc(r, dict_methods[i].id, *obj);
        if (in_set(name, unsafe_dict)) return unsafe("dict", name);
        jv *v = jd_get(obj->u.d, name, strlen(name));
        return v ? *v : jv_undef(name);
    }
    case JV_NS: {
        jv *v = jd_get(obj->u.d, name, strlen(name));
        return v ? *v : jv_undef(name);
    }
    case JV_LIST:
        for (size_t i = 0; i < sizeof list_methods / sizeof list_methods[0]; i++)
            if (!strcmp(list_methods[i].name, name)) return mkfunc(r, list_methods[i].id, *obj);
        if (in_set(name, unsafe_list)) return unsafe("list", name);
        return jv_undef(name);
    case JV_LOOP: {
        jloop *lp = obj->u.lp;
        size_t n = lp->items->n, i = lp->i;
        if (!strcmp(name, "index")) return jv_int((int64_t)i + 1);
        if (!strcmp(name, "index0")) return jv_int((int64_t)i);
        if (!strcmp(name, "revindex")) return jv_int((int64_t)(n - i));
        if (!strcmp(name, "revindex0")) return jv_int((int64_t)(n - i - 1));
        if (!strcmp(name, "first")) return jv_bool(i == 0);
        if (!strcmp(name, "last")) return jv_bool(i + 1 == n);
        if (!strcmp(name, "length")) return jv_int((int64_t)n);
        if (!strcmp(name, "depth")) return jv_int((int64_t)lp->depth);
        if (!strcmp(name, "depth0")) return jv_int((int64_t)lp->depth - 1);
        if (!strcmp(name, "previtem")) return i > 0 ? lp->items->a[i - 1] : jv_undef("previtem");
        if (!strcmp(name, "nextitem"))
            return i + 1 < n ? lp->items->a[i + 1] : jv_undef("nextitem");
        if (!strcmp(name, "cycle")) return mkfunc(r, F_CYCLE, *obj);
        return jv_undef(name);
    }
    default:
        return jv_undef(name);
    }
}

jv jinja__getitem(jr *r, const jv *obj, const jv *key) {
    switch (obj->t) {
    case JV_UNDEF:
        if (obj->uname) jr_fail(r, "'%s' is undefined", obj->uname);
        jr_fail(r, "subscript of an undefined value");
    case JV_DICT:
    case JV_NS: {
        jr_step(r, obj->u.d->n / 8);
        jv *v = jd_getv(obj->u.d, *key);
        if (v) return *v;
        if (key->t == JV_STR && obj->t == JV_DICT) return jinja__getattr(r, obj, key->u.s->s);
        return jv_undef(key->t == JV_STR ? key->u.s->s : NULL);
    }
    case JV_LIST:
    case JV_STR: {
        if (key->t != JV_INT && key->t != JV_BOOL) {
            if (key->t == JV_STR) return jinja__getattr(r, obj, key->u.s->s);
            return jv_undef(NULL);
        }
        int64_t i = key->t == JV_INT ? key->u.i : key->u.b;
        if (obj->t == JV_LIST && (obj->flags & JV_F_GEN)) return jv_undef(NULL);
        if (obj->t == JV_LIST) {
            int64_t n = (int64_t)obj->u.l->n;
            if (i < 0) i += n;
            if (i < 0 || i >= n) return jv_undef(NULL);
            return obj->u.l->a[i];
        }
        jlist *cps = jv_iter(r, obj);
        int64_t n = (int64_t)cps->n;
        if (i < 0) i += n;
        if (i < 0 || i >= n) return jv_undef(NULL);
        return cps->a[i];
    }
    case JV_LOOP:
        if (key->t == JV_STR) return jinja__getattr(r, obj, key->u.s->s);
        return jv_undef(NULL);
    default:
        return jv_undef(NULL);
    }
}

static jv do_range(jr *r, const jargs *g) {
    int64_t start = 0, stop, step = 1;
    if (g->n_pos == 1) {
        stop = arg_int(r, g, 0, NULL, 0, "range");
    } else if (g->n_pos >= 2) {
        start = arg_int(r, g, 0, NULL, 0, "range");
        stop = arg_int(r, g, 1, NULL, 0, "range");
        if (g->n_pos >= 3) step = arg_int(r, g, 2, NULL, 1, "range");
    } else {
        jr_fail(r, "range expected at least 1 argument");
    }
    if (step == 0) jr_fail(r, "range() arg 3 must not be zero");
    double count = ceil(((double)stop - (double)start) / (double)step);
    if (count < 0) count = 0;
    if (count > 1e7 || count > (double)(r->t->lim.max_steps))
        jr_fail(r, "template limit: range of %.0f items is too large", count);
    jr_step(r, (size_t)count);
    jv l = jv_list(r, (size_t)count);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
        jl_push(r, l.u.l, jv_int(i));
    return l;
}

static jv do_strftime(jr *r, const jstr *fmt) {
    struct tm tm;
    gmtime_r(&r->now, &tm);
    if (fmt->n > 256) jr_fail(r, "strftime_now: format too long");
    char out[1024];
    size_t n = strftime(out, sizeof out, fmt->s, &tm);
    if (n == 0 && fmt->n) jr_fail(r, "strftime_now: result too long or empty");
    return jv_str(r, out, n);
}

jv jinja__call_func(jr *r, jfunc *fn, jv *args, const char **names, size_t n) {
    jargs g = mkargs(args, names, n);
    const jv *self = &fn->self;
    switch (fn->id) {
    case F_RANGE:
        return do_range(r, &g);
    case F_NAMESPACE:
    case F_DICT: {
        jv d = jv_dict(r);
        for (size_t i = 0; i < g.n_pos; i++) {
            if (g.a[i].t != JV_DICT)
                jr_fail(r, "%s: positional argument must be a dict",
                        fn->id == F_DICT ? "dict" : "namespace");
            for (size_t k = 0; k < g.a[i].u.d->n; k++)
                jd_set(r, d.u.d, g.a[i].u.d->k[k], g.a[i].u.d->v[k]);
        }
        for (size_t i = g.n_pos; i < n; i++)
            if (names && names[i]) jd_set(r, d.u.d, jv_cstr(r, names[i]), args[i]);
        if (fn->id == F_NAMESPACE) d.t = JV_NS;
        return d;
    }
    case F_RAISE: {
        const jv *m = arg(&g, 0, NULL);
        jbuf b = {0};
        if (m) jv_str_to(r, &b, m);
        jr_fail(r, "raise_exception: %s", b.p ? b.p : "");
    }
    case F_STRFTIME: {
        const jv *m = arg(&g, 0, NULL);
        if (!m) jr_fail(r, "strftime_now: missing format");
        return do_strftime(r, need_str(r, m, "strftime_now"));
    }
    case F_CYCLE: {
        if (n == 0) jr_fail(r, "no items for cycling given");
        return args[self->u.lp->i % n];
    }
    default:
        break;
    }
    if (fn->id >= M_STRIP && fn->id <= M_SPLITLINES) {
        const jstr *s = self->u.s;
        switch (fn->id) {
        case M_STRIP:
            return str_strip(r, s, arg_str(r, &g, 0, NULL, "strip"), true, true);
        case M_LSTRIP:
            return str_strip(r, s, arg_str(r, &g, 0, NULL, "lstrip"), true, false);
        case M_RSTRIP:
            return str_strip(r, s, arg_str(r, &g, 0, NULL, "rstrip"), false, true);
        case M_SPLIT:
        case M_RSPLIT:
            return str_split(r, s, arg_str(r, &g, 0, "sep", "split"),
                             arg_int(r, &g, 1, "maxsplit", -1, "split"), fn->id == M_RSPLIT);
        case M_STARTSWITH:
        case M_ENDSWITH: {
            const jv *x = arg(&g, 0, NULL);
            if (!x) jr_fail(r, "startswith/endswith takes one argument");
            return jv_bool(str_affix(r, s, x, fn->id == M_ENDSWITH));
        }
        case M_REPLACE: {
            const jstr *o = arg_str(r, &g, 0, NULL, "replace"),
                       *w = arg_str(r, &g, 1, NULL, "replace");
            if (!o || !w) jr_fail(r, "replace expected 2 string arguments");
            return str_replace(r, s, o, w, arg_int(r, &g, 2, "count", -1, "replace"));
        }
        case M_UPPER:
            return str_case(r, s, 1);
        case M_LOWER:
            return str_case(r, s, 0);
        case M_CAPITALIZE:
            return str_case(r, s, 2);
        case M_TITLE:
            return str_case(r, s, 3);
        case M_FIND:
        case M_RFIND:
        case M_COUNT: {
            const jstr *x = arg_str(r, &g, 0, NULL, "find");
            if (!x) jr_fail(r, "find/count expects a string");
            if (fn->id == M_COUNT) {
                if (x->n == 0) return jv_int((int64_t)utf8_len(s) + 1);
                int64_t c = 0;
                for (const char *p = s->s; (p = memmem(p, s->n - (size_t)(p - s->s), x->s, x->n));
                     p += x->n)
                    c++;
                return jv_int(c);
            }
            const char *hit = NULL;
            if (fn->id == M_FIND) {
                hit = memmem(s->s, s->n, x->s, x->n);
            } else if (x->n <= s->n) {
                for (size_t k = s->n - x->n + 1; k-- > 0;)
                    if (!memcmp(s->s + k, x->s, x->n)) {
                        hit = s->s + k;
                        break;
                    }
            }
            if (!hit) return jv_int(-1);
            jstr pre = {0};
            (void)pre;
            int64_t cp = 0;
            for (const char *p = s->s; p < hit; p++)
                cp += ((unsigned char)*p & 0xC0) != 0x80;
            return jv_int(cp);
        }
        case M_JOIN: {
            const jv *x = arg(&g, 0, NULL);
            if (!x) jr_fail(r, "join takes one argument");
            jlist *l = jv_iter(r, x);
            jbuf b = {0};
            for (size_t i = 0; i < l->n; i++) {
                if (i) jb_put(r, &b, s->s, s->n);
                jb_put(r, &b, need_str(r, &l->a[i], "join")->s, l->a[i].u.s->n);
            }
            return jv_str(r, b.p ? b.p : "", b.n);
        }
        case M_ISDIGIT:
        case M_ISALPHA:
        case M_ISSPACE:
        case M_ISALNUM: {
            if (s->n == 0) return jv_bool(false);
            for (size_t i = 0; i < s->n; i++) {
                unsigned char c = (unsigned char)s->s[i];
                bool d = c >= '0' && c <= '9', a = (c | 32) >= 'a' && (c | 32) <= 'z';
                bool ok = fn->id == M_ISDIGIT   ? d
                          : fn->id == M_ISALPHA ? a
                          : fn->id == M_ISSPACE ? is_ws(c)
                                                : d || a;
                if (!ok) return jv_bool(false);
            }
            return jv_bool(true);
        }
        case M_SPLITLINES: {
            jv l = jv_list(r, 0);
            size_t a = 0;
            for (size_t i = 0; i < s->n; i++) {
                char c = s->s[i];
                if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) {
                    jl_push(r, l.u.l, jv_str(r, s->s + a, i - a));
                    if (c == '\r' && i + 1 < s->n && s->s[i + 1] == '\n') i++;
                    a = i + 1;
                }
            }
            if (a < s->n) jl_push(r, l.u.l, jv_str(r, s->s + a, s->n - a));
            return l;
        }
        }
    }
    const jdict *d = self->t == JV_DICT ? self->u.d : NULL;
    switch (fn->id) {
    case M_GET: {
        const jv *k = arg(&g, 0, NULL);
        if (!k) jr_fail(r, "get expected at least 1 argument");
        jv *v = jd_getv(d, *k);
        if (v) return *v;
        const jv *dflt = arg(&g, 1, NULL);
        return dflt ? *dflt : jv_none();
    }
    case M_ITEMS: {
        jv l = jv_list(r, d->n);
        jr_step(r, d->n);
        for (size_t i = 0; i < d->n; i++) {
            jv t = jv_list(r, 2);
            t.flags = JV_F_TUPLE;
            jl_push(r, t.u.l, d->k[i]);
            jl_push(r, t.u.l, d->v[i]);
            jl_push(r, l.u.l, t);
        }
        return l;
    }
    case M_KEYS:
    case M_VALUES: {
        jv l = jv_list(r, d->n);
        jr_step(r, d->n);
        for (size_t i = 0; i < d->n; i++)
            jl_push(r, l.u.l, fn->id == M_KEYS ? d->k[i] : d->v[i]);
        return l;
    }
    case M_INDEX:
    case M_LCOUNT: {
        const jv *x = arg(&g, 0, NULL);
        if (!x) jr_fail(r, "index/count takes one argument");
        int64_t c = 0;
        for (size_t i = 0; i < self->u.l->n; i++)
            if (jv_eq(r, &self->u.l->a[i], x)) {
                if (fn->id == M_INDEX) return jv_int((int64_t)i);
                c++;
            }
        if (fn->id == M_INDEX) jr_fail(r, "value is not in list");
        return jv_int(c);
    }
    default:
        jr_fail(r, "unknown function");
    }
}

// ----------------------------------------------------------------------------
// Tests

static bool is_str(const jv *v) { return v->t == JV_STR; }

bool jinja__test(jr *r, const char *name, const jv *in, jv *args, size_t n) {
    const jv *a0 = n ? &args[0] : NULL;
    if (!strcmp(name, "defined")) return in->t != JV_UNDEF;
    if (!strcmp(name, "undefined")) return in->t == JV_UNDEF;
    if (!strcmp(name, "none")) return in->t == JV_NONE;
    if (!strcmp(name, "string")) return is_str(in);
    if (!strcmp(name, "mapping")) return in->t == JV_DICT;
    if (!strcmp(name, "iterable"))
        return in->t == JV_LIST || in->t == JV_DICT || in->t == JV_STR || in->t == JV_UNDEF;
    if (!strcmp(name, "sequence"))
        return (in->t == JV_LIST && !(in->flags & JV_F_GEN)) || in->t == JV_DICT ||
               in->t == JV_STR || in->t == JV_UNDEF;
    if (!strcmp(name, "number")) return in->t == JV_INT || in->t == JV_FLOAT || in->t == JV_BOOL;
    if (!strcmp(name, "integer")) return in->t == JV_INT;
    if (!strcmp(name, "float")) return in->t == JV_FLOAT;
    if (!strcmp(name, "boolean")) return in->t == JV_BOOL;
    if (!strcmp(name, "true")) return in->t == JV_BOOL && in->u.b;
    if (!strcmp(name, "false")) return in->t == JV_BOOL && !in->u.b;
    if (!strcmp(name, "callable")) /* Undefined has __call__ (which raises) */
        return in->t == JV_MACRO || in->t == JV_FUNC || in->t == JV_UNDEF;
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (in->t != JV_INT && in->t != JV_BOOL) {
            if (in->t == JV_UNDEF && in->uname) jr_fail(r, "'%s' is undefined", in->uname);
            jr_fail(r, "test '%s' needs an integer, got %s", name, jv_type_name(in));
        }
        int64_t v = in->t == JV_INT ? in->u.i : in->u.b;
        if (name[0] == 'o') return v % 2 != 0;
        if (name[0] == 'e') return v % 2 == 0;
        if (!a0 || a0->t != JV_INT) jr_fail(r, "divisibleby needs an integer argument");
        if (a0->u.i == 0) jr_fail(r, "integer division or modulo by zero");
        return v % a0->u.i == 0;
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (!is_str(in)) jr_fail(r, "test '%s' needs a string", name);
        jv c = str_case(r, in->u.s, name[0] == 'u');
        return jv_eq(r, &c, in);
    }
    // every name below compares with a0, the operator spellings and
    // lessthan / greaterthan included
    static const char *const binary[] = {"in", "eq", "equalto", "==", "sameas", "ne", "!=",
                                         "lt", "lessthan", "<", "le", "<=", "gt",
                                         "greaterthan", ">", "ge", ">="};
    for (size_t i = 0; !a0 && i < sizeof binary / sizeof binary[0]; i++)
        if (!strcmp(name, binary[i])) jr_fail(r, "test '%s' needs an argument", name);
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "=="))
        return jv_eq(r, in, a0);
    if (!strcmp(name, "sameas")) {
        if (in->t != a0->t) return false;
        if (in->t == JV_NONE || in->t == JV_UNDEF) return true;
        if (in->t == JV_BOOL) return in->u.b == a0->u.b;
        if (in->t == JV_LIST) return in->u.l == a0->u.l;
        if (in->t == JV_DICT || in->t == JV_NS) return in->u.d == a0->u.d;
        return jv_eq(r, in, a0) && in->t == JV_INT && in->u.i >= -5 && in->u.i <= 256;
    }
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !jv_eq(r, in, a0);
    if (!strcmp(name, "lt") || !strcmp(name, "lessthan") || !strcmp(name, "<"))
        return jv_cmp(r, in, a0) < 0;
    if (!strcmp(name, "le") || !strcmp(name, "<=")) return jv_cmp(r, in, a0) <= 0;
    if (!strcmp(name, "gt") || !strcmp(name, "greaterthan") || !strcmp(name, ">"))
        return jv_cmp(r, in, a0) > 0;
    if (!strcmp(name, "ge") || !strcmp(name, ">=")) return jv_cmp(r, in, a0) >= 0;
    if (!strcmp(name, "in")) {
        if (a0->t == JV_STR) {
            if (!is_str(in)) jr_fail(r, "'in <string>' requires string as left operand");
            return memmem(a0->u.s->s, a0->u.s->n, in->u.s->s, in->u.s->n) != NULL || !in->u.s->n;
        }
        if (a0->t == JV_DICT) return jd_getv(a0->u.d, *in) != NULL;
        jlist *l = jv_iter(r, a0);
        for (size_t i = 0; i < l->n; i++)
            if (jv_eq(r, &l->a[i], in)) return true;
        return false;
    }
    jr_fail(r, "no test named '%s'", name);
}

// ----------------------------------------------------------------------------
// Filters

/* Sort key comparison: strings compare case-insensitively unless cs. */
static int cmp_key(jr *r, const jv *a, const jv *b, bool cs) {
    if (!cs && a->t == JV_STR && b->t == JV_STR) {
        jv la = str_case(r, a->u.s, 0), lb = str_case(r, b->u.s, 0);
        return jv_cmp(r, &la, &lb);
    }
    return jv_cmp(r, a, b);
}

/* value.attribute, with dotted paths ("a.b") and integer parts, as
 * jinja2's make_attrgetter */
static jv attr_path(jr *r, const jv *v, const jv *attr) {
    if (attr->t == JV_INT) return jinja__getitem(r, v, attr);
    const jstr *a = need_str(r, attr, "attribute");
    jv cur = *v;
    size_t i = 0;
    while (i <= a->n) {
        const char *dot = memchr(a->s + i, '.', a->n - i);
        size_t e = dot ? (size_t)(dot - a->s) : a->n;
        jv part = jv_str(r, a->s + i, e - i);
        bool digits = e > i;
        for (size_t k = i; k < e; k++)
            digits = digits && a->s[k] >= '0' && a->s[k] <= '9';
        if (digits) part = jv_int(strtoll(part.u.s->s, NULL, 10));
        cur = jinja__getitem(r, &cur, &part);
        i = e + 1;
        if (!dot) break;
    }
    return cur;
}

static void sort_list(jr *r, jv *a, size_t n, const jv *attr, bool cs, bool rev) {
    /* stable insertion sort, bounded by the step budget */
    jr_step(r, n * (n < 64 ? n : 64));
    for (size_t i = 1; i < n; i++) {
        jv x = a[i];
        jv kx = attr ? attr_path(r, &x, attr) : x;
        size_t j = i;
        while (j > 0) {
            jv ky = attr ? attr_path(r, &a[j - 1], attr) : a[j - 1];
            int c = cmp_key(r, &ky, &kx, cs);
            if (rev ? c >= 0 : c <= 0) break;
            a[j] = a[j - 1];
            j--;
            jr_step(r, 1);
        }
        a[j] = x;
    }
}

static jv copy_list(jr *r, jlist *l) {
    jv o = jv_list(r, l->n);
    jr_step(r, l->n);
    for (size_t i = 0; i < l->n; i++)
        jl_push(r, o.u.l, l->a[i]);
    return o;
}

static jv do_select(jr *r, const char *fname, jv in, const jargs *g, bool attr, bool keep) {
    jv out = jv_list(r, 0);
    out.flags = JV_F_GEN;
    if (!jv_truthy(&in)) return out; /* jinja2: `if value:` before iterating */
    jlist *l = jv_iter(r, &in);
    size_t off = attr ? 1 : 0;
    const jv *at = attr ? arg(g, 0, NULL) : NULL;
    if (attr && !at) jr_fail(r, "%s: missing attribute", fname);
    const jv *tn = arg(g, off, NULL);
    const char *test = NULL;
    if (tn) test = need_str(r, tn, fname)->s;
    size_t nt = g->n_pos > off + 1 ? g->n_pos - off - 1 : 0;
    for (size_t i = 0; i < l->n; i++) {
        jr_step(r, 1);
        jv v = attr ? attr_path(r, &l->a[i], at) : l->a[i];
        bool ok = test ? jinja__test(r, test, &v, g->a + off + 1, nt) : jv_truthy(&v);
        if (ok == keep) jl_push(r, out.u.l, l->a[i]);
    }
    return out;
}

static jv do_indent(jr *r, const jstr *s, const jv *width, bool first, bool blank) {
    jbuf ind = {0};
    if (width && width->t == JV_STR) {
        jb_put(r, &ind, width->u.s->s, width->u.s->n);
    } else {
        int64_t w = width ? (width->t == JV_INT ? width->u.i : 4) : 4;
        if (w > 4096) jr_fail(r, "indent: width too large");
        for (int64_t i = 0; i < w; i++)
            jb_puts(r, &ind, " ");
    }
    const char *is = ind.p ? ind.p : "";
    jbuf src = {0};
    jb_put(r, &src, s->s, s->n);
    jb_puts(r, &src, "\n");
    jstr *ss = jr_alloc(r, sizeof *ss + src.n + 1);
    ss->n = src.n;
    memcpy(ss->s, src.p, src.n + 1);
    jv lines = jinja__call_func(r, &(jfunc){.id = M_SPLITLINES, .self = {.t = JV_STR, .u.s = ss}},
                                NULL, NULL, 0);
    jlist *l = lines.u.l;
    jbuf o = {0};
    if (first) jb_puts(r, &o, is);
    for (size_t i = 0; i < l->n; i++) {
        if (i) {
            jb_puts(r, &o, "\n");
            if (blank || l->a[i].u.s->n) jb_puts(r, &o, is);
        }
        jb_put(r, &o, l->a[i].u.s->s, l->a[i].u.s->n);
    }
    return jv_str(r, o.p ? o.p : "", o.n);
}

static jv do_tojson(jr *r, jv in, const jargs *g) {
    const jv *ind = arg(g, 0, "indent");
    const jv *seps = arg(g, 1, "separators");
    json_fmt f = {NULL, ", ", ": ", arg_bool(g, 99, "ensure_ascii", false),
                  arg_bool(g, 99, "sort_keys", false)};
    if (ind && ind->t != JV_NONE) {
        if (ind->t == JV_STR) {
            f.indent = ind->u.s->s;
        } else {
            int64_t w = ind->t == JV_INT ? ind->u.i : 0;
            if (w < 0) w = 0;
            if (w > 1024) jr_fail(r, "tojson: indent too large");
            char *s = jr_alloc(r, (size_t)w + 1);
            memset(s, ' ', (size_t)w);
            s[w] = 0;
            f.indent = s;
        }
        f.item_sep = ",";
    }
    if (seps && seps->t == JV_LIST && seps->u.l->n == 2) {
        f.item_sep = need_str(r, &seps->u.l->a[0], "tojson")->s;
        f.key_sep = need_str(r, &seps->u.l->a[1], "tojson")->s;
    }
    jbuf b = {0};
    jv_json_to(r, &b, &in, &f);
    return jv_str(r, b.p ? b.p : "", b.n);
}

static jv to_int(jr *r, const jv *in, const jargs *g) {
    const jv *d = arg(g, 0, "default");
    jv dflt = d ? *d : jv_int(0);
    int64_t base = arg_int(r, g, 1, "base", 10, "int");
    switch (in->t) {
    case JV_INT:
        return *in;
    case JV_BOOL:
        return jv_int(in->u.b);
    case JV_FLOAT:
        if (!isfinite(in->u.f) || fabs(in->u.f) > 9.2e18) return dflt;
        return jv_int((int64_t)in->u.f);
    case JV_STR: {
        jv t = str_strip(r, in->u.s, NULL, true, true);
        const char *s = t.u.s->s;
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, (int)base);
        if (*s && !*end && !errno) return jv_int(v);
        double f = strtod(s, &end);
        if (*s && !*end && isfinite(f) && fabs(f) < 9.2e18) return jv_int((int64_t)f);
        return dflt;
    }
    default:
        return dflt;
    }
}

static jv to_float(jr *r, const jv *in, const jargs *g) {
    const jv *d = arg(g, 0, "default");
    jv dflt = d ? *d : jv_float(0);
    switch (in->t) {
    case JV_INT:
        return jv_float((double)in->u.i);
    case JV_BOOL:
        return jv_float(in->u.b);
    case JV_FLOAT:
        return *in;
    case JV_STR: {
        jv t = str_strip(r, in->u.s, NULL, true, true);
        char *end;
        double f = strtod(t.u.s->s, &end);
        if (t.u.s->n && !*end) return jv_float(f);
        return dflt;
    }
    default:
        return dflt;
    }
}

static jv do_minmax(jr *r, jv in, const jargs *g, bool max) {
    jlist *l = jv_iter(r, &in);
    if (l->n == 0) return jv_undef(NULL);
    bool cs = arg_bool(g, 0, "case_sensitive", false);
    const jv *at = arg(g, 1, "attribute");
    jv best = l->a[0];
    for (size_t i = 1; i < l->n; i++) {
        jv a = at ? attr_path(r, &l->a[i], at) : l->a[i];
        jv b = at ? attr_path(r, &best, at) : best;
        int c = cmp_key(r, &a, &b, cs);
        if (max ? c > 0 : c < 0) best = l->a[i];
    }
    return best;
}

jv jinja__filter(jr *r, const char *name, jv in, jv *args, const char **names, size_t n) {
    jargs g = mkargs(args, names, n);
    jr_step(r, 1);
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        const jv *d = arg(&g, 0, "default_value");
        bool boolean = arg_bool(&g, 1, "boolean", false);
        if (in.t == JV_UNDEF || (boolean && !jv_truthy(&in))) return d ? *d : jv_str(r, "", 0);
        return in;
    }
    if (!strcmp(name, "tojson")) return do_tojson(r, in, &g);
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        switch (in.t) {
        case JV_UNDEF:
            return jv_int(0);
        case JV_STR:
            return jv_int((int64_t)utf8_len(in.u.s));
        case JV_LIST:
            if (!(in.flags & JV_F_GEN)) return jv_int((int64_t)in.u.l->n);
            jr_fail(r, "object of type 'generator' has no len()");
        case JV_DICT:
        case JV_NS:
            return jv_int((int64_t)in.u.d->n);
        default:
            jr_fail(r, "object of type '%s' has no len()", jv_type_name(&in));
        }
    }
    if (!strcmp(name, "string")) return jv_tostr(r, &in); /* a Markup stays one */
    if (!strcmp(name, "safe")) {
        jv m = jv_tostr(r, &in);
        m.flags = JV_F_SAFE;
        return m;
    }
    if (!strcmp(name, "list")) return copy_list(r, jv_iter(r, &in));
    if (!strcmp(name, "trim")) {
        jv s = jv_tostr(r, &in);
        jv t = str_strip(r, s.u.s, arg_str(r, &g, 0, "chars", "trim"), true, true);
        t.flags = s.flags & JV_F_SAFE;
        return t;
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper") || !strcmp(name, "capitalize") ||
        !strcmp(name, "title")) {
        jv s = jv_tostr(r, &in);
        int mode = name[0] == 'l' ? 0 : name[0] == 'u' ? 1 : name[0] == 'c' ? 2 : 3;
        return str_case(r, s.u.s, mode);
    }
    if (!strcmp(name, "replace")) {
        jv s = jv_tostr(r, &in);
        const jv *o = arg(&g, 0, "old"), *w = arg(&g, 1, "new");
        if (!o || !w) jr_fail(r, "replace expects old and new");
        jv os = jv_tostr(r, o), ws = jv_tostr(r, w);
        return str_replace(r, s.u.s, os.u.s, ws.u.s, arg_int(r, &g, 2, "count", -1, "replace"));
    }
    if (!strcmp(name, "join")) {
        jlist *l = jv_iter(r, &in);
        const jv *sep = arg(&g, 0, "d");
        const jv *at = arg(&g, 1, "attribute");
        jv ss = sep ? jv_tostr(r, sep) : jv_str(r, "", 0);
        jbuf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i) jb_put(r, &b, ss.u.s->s, ss.u.s->n);
            jv v = at ? attr_path(r, &l->a[i], at) : l->a[i];
            jv_str_to(r, &b, &v);
        }
        return jv_str(r, b.p ? b.p : "", b.n);
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        if (name[0] == 'l' && in.t == JV_LIST && (in.flags & JV_F_GEN))
            jr_fail(r, "'generator' object is not reversible");
        jlist *l = jv_iter(r, &in);
        if (l->n == 0) return jv_undef(NULL);
        return name[0] == 'f' ? l->a[0] : l->a[l->n - 1];
    }
    if (!strcmp(name, "selectattr")) return do_select(r, name, in, &g, true, true);
    if (!strcmp(name, "rejectattr")) return do_select(r, name, in, &g, true, false);
    if (!strcmp(name, "select")) return do_select(r, name, in, &g, false, true);
    if (!strcmp(name, "reject")) return do_select(r, name, in, &g, false, false);
    if (!strcmp(name, "map")) {
        jv out = jv_list(r, 0);
        out.flags = JV_F_GEN;
        if (!jv_truthy(&in)) return out; /* jinja2: `if value:` before iterating */
        jlist *l = jv_iter(r, &in);
        const jv *at = arg(&g, 99, "attribute");
        if (at) {
            const jv *dflt = arg(&g, 99, "default");
            for (size_t i = 0; i < l->n; i++) {
                jv v = attr_path(r, &l->a[i], at);
                if (v.t == JV_UNDEF && dflt) v = *dflt;
                jl_push(r, out.u.l, v);
            }
            return out;
        }
        const jv *fn = arg(&g, 0, NULL);
        if (!fn) {
            jv c = copy_list(r, l);
            c.flags = JV_F_GEN;
            return c;
        }
        const char *fname = need_str(r, fn, "map")->s;
        for (size_t i = 0; i < l->n; i++)
            jl_push(
                r, out.u.l,
                jinja__filter(r, fname, l->a[i], g.a + 1, g.names ? g.names + 1 : NULL, g.n - 1));
        return out;
    }
    if (!strcmp(name, "items")) {
        if (in.t == JV_UNDEF) {
            jv e = jv_list(r, 0);
            e.flags = JV_F_GEN;
            return e;
        }
        if (in.t != JV_DICT) jr_fail(r, "items: expected a mapping, got %s", jv_type_name(&in));
        jv it = jinja__call_func(r, &(jfunc){.id = M_ITEMS, .self = in}, NULL, NULL, 0);
        it.flags = JV_F_GEN;
        return it;
    }
    if (!strcmp(name, "dictsort")) {
        if (in.t != JV_DICT) jr_fail(r, "dictsort: expected a mapping");
        bool cs = arg_bool(&g, 0, "case_sensitive", false);
        const jstr *by = arg_str(r, &g, 1, "by", "dictsort");
        bool rev = arg_bool(&g, 2, "reverse", false);
        jv items = jinja__call_func(r, &(jfunc){.id = M_ITEMS, .self = in}, NULL, NULL, 0);
        jv idx = jv_int(by && !strcmp(by->s, "value") ? 1 : 0);
        sort_list(r, items.u.l->a, items.u.l->n, &idx, cs, rev);
        return items;
    }
    if (!strcmp(name, "sort")) {
        jv l = copy_list(r, jv_iter(r, &in));
        sort_list(r, l.u.l->a, l.u.l->n, arg(&g, 2, "attribute"),
                  arg_bool(&g, 1, "case_sensitive", false), arg_bool(&g, 0, "reverse", false));
        return l;
    }
    if (!strcmp(name, "reverse")) {
        if (in.t == JV_STR) {
            jv parts[3] = {jv_none(), jv_none(), jv_int(-1)};
            (void)parts;
            jlist *cps = jv_iter(r, &in);
            jbuf b = {0};
            for (size_t i = cps->n; i-- > 0;)
                jb_put(r, &b, cps->a[i].u.s->s, cps->a[i].u.s->n);
            return jv_str(r, b.p ? b.p : "", b.n);
        }
        jlist *l = jv_iter(r, &in);
        jv o = jv_list(r, l->n);
        for (size_t i = l->n; i-- > 0;)
            jl_push(r, o.u.l, l->a[i]);
        o.flags = JV_F_GEN; /* reversed(): an iterator, as a generator behaves */
        return o;
    }
    if (!strcmp(name, "unique")) {
        jlist *l = jv_iter(r, &in);
        bool cs = arg_bool(&g, 0, "case_sensitive", false);
        const jv *at = arg(&g, 1, "attribute");
        jv out = jv_list(r, 0), keys = jv_list(r, 0);
        for (size_t i = 0; i < l->n; i++) {
            jv k = at ? attr_path(r, &l->a[i], at) : l->a[i];
            if (!cs && k.t == JV_STR) k = str_case(r, k.u.s, 0);
            bool seen = false;
            jr_step(r, keys.u.l->n);
            for (size_t j = 0; j < keys.u.l->n && !seen; j++)
                seen = jv_eq(r, &keys.u.l->a[j], &k);
            if (!seen) {
                jl_push(r, keys.u.l, k);
                jl_push(r, out.u.l, l->a[i]);
            }
        }
        out.flags = JV_F_GEN;
        return out;
    }
    if (!strcmp(name, "min") || !strcmp(name, "max")) return do_minmax(r, in, &g, name[1] == 'a');
    if (!strcmp(name, "sum")) {
        jlist *l = jv_iter(r, &in);
        const jv *at = arg(&g, 0, "attribute");
        const jv *st = arg(&g, 1, "start");
        jv acc = st ? *st : jv_int(0);
        for (size_t i = 0; i < l->n; i++) {
            jv v = at ? attr_path(r, &l->a[i], at) : l->a[i];
            if ((acc.t != JV_INT && acc.t != JV_FLOAT) || (v.t != JV_INT && v.t != JV_FLOAT))
                jr_fail(r, "sum: unsupported operand types");
            if (acc.t == JV_INT && v.t == JV_INT)
                acc = jv_int(acc.u.i + v.u.i);
            else
                acc = jv_float((acc.t == JV_INT ? (double)acc.u.i : acc.u.f) +
                               (v.t == JV_INT ? (double)v.u.i : v.u.f));
        }
        return acc;
    }
    if (!strcmp(name, "int")) return to_int(r, &in, &g);
    if (!strcmp(name, "float")) return to_float(r, &in, &g);
    if (!strcmp(name, "abs")) {
        if (in.t == JV_INT) return jv_int(in.u.i < 0 ? -in.u.i : in.u.i);
        if (in.t == JV_FLOAT) return jv_float(fabs(in.u.f));
        if (in.t == JV_BOOL) return jv_int(in.u.b);
        jr_fail(r, "bad operand type for abs(): '%s'", jv_type_name(&in));
    }
    if (!strcmp(name, "round")) {
        int64_t prec = arg_int(r, &g, 0, "precision", 0, "round");
        const jstr *method = arg_str(r, &g, 1, "method", "round");
        if (in.t != JV_INT && in.t != JV_FLOAT && in.t != JV_BOOL)
            jr_fail(r, "round: expected a number");
        double v = in.t == JV_FLOAT ? in.u.f : (double)(in.t == JV_INT ? in.u.i : in.u.b);
        double m = pow(10.0, (double)prec);
        if (!method || !strcmp(method->s, "common"))
            v = nearbyint(v * m) / m;
        else if (!strcmp(method->s, "ceil"))
            v = ceil(v * m) / m;
        else if (!strcmp(method->s, "floor"))
            v = floor(v * m) / m;
        else
            jr_fail(r, "method must be common, ceil or floor");
        return jv_float(v);
    }
    if (!strcmp(name, "indent")) {
        jv s = jv_tostr(r, &in);
        return do_indent(r, s.u.s, arg(&g, 0, "width"), arg_bool(&g, 1, "first", false),
                         arg_bool(&g, 2, "blank", false));
    }
    if (!strcmp(name, "e") || !strcmp(name, "escape") || !strcmp(name, "forceescape")) {
        jv s = jv_tostr(r, &in);
        if ((s.flags & JV_F_SAFE) && name[0] != 'f') return s;
        jbuf b = {0};
        jv_escape_to(r, &b, s.u.s->s, s.u.s->n);
        jv o = jv_str(r, b.p ? b.p : "", b.n);
        o.flags = JV_F_SAFE;
        return o;
    }
    if (!strcmp(name, "batch")) {
        int64_t k = arg_int(r, &g, 0, "linecount", 1, "batch");
        if (k <= 0) jr_fail(r, "batch: linecount must be positive");
        const jv *fill = arg(&g, 1, "fill_with");
        jlist *l = jv_iter(r, &in);
        jv out = jv_list(r, 0);
        jv cur = jv_list(r, 0);
        for (size_t i = 0; i < l->n; i++) {
            jl_push(r, cur.u.l, l->a[i]);
            if ((int64_t)cur.u.l->n == k) {
                jl_push(r, out.u.l, cur);
                cur = jv_list(r, 0);
            }
        }
        if (cur.u.l->n) {
            if (fill)
                while ((int64_t)cur.u.l->n < k) {
                    jr_step(r, 1);
                    jl_push(r, cur.u.l, *fill);
                }
            jl_push(r, out.u.l, cur);
        }
        out.flags = JV_F_GEN;
        return out;
    }
    if (!strcmp(name, "wordcount")) {
        jv s = jv_tostr(r, &in);
        return jv_int((int64_t)str_split(r, s.u.s, NULL, -1, false).u.l->n);
    }
    if (!strcmp(name, "center")) {
        jv s = jv_tostr(r, &in);
        int64_t w = arg_int(r, &g, 0, "width", 80, "center");
        int64_t len = (int64_t)utf8_len(s.u.s);
        if (w > 65536) jr_fail(r, "center: width too large");
        if (w <= len) return s;
        int64_t pad = w - len, left = pad / 2 + (pad & w & 1);
        jbuf b = {0};
        for (int64_t i = 0; i < left; i++)
            jb_puts(r, &b, " ");
        jb_put(r, &b, s.u.s->s, s.u.s->n);
        for (int64_t i = 0; i < pad - left; i++)
            jb_puts(r, &b, " ");
        return jv_str(r, b.p, b.n);
    }
    jr_fail(r, "no filter named '%s'", name);
}
