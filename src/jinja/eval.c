/* eval.c — the tree-walking renderer (include/kvseal/jinja.h).
 *
 * The values it works on, and their Python semantics, are value.c's.
 * Scoping follows jinja2: a for
 * loop body gets a fresh scope per iteration, macros get their own scope
 * over the scope they were defined in, if blocks share their parent's.
 * Every node evaluated and every element copied counts a step; steps,
 * output bytes, arena bytes and call depth are capped by jinja_limits. */
#include "jinja_int.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Output

static void jr_emit(jr *r, const char *s, size_t n) {
    if (r->out->n + n > r->t->lim.max_out_bytes)
        jr_fail(r, "template limit: more than %zu bytes of output", r->t->lim.max_out_bytes);
    jr_step(r, 1 + n / 4096);
    jb_put(r, r->out, s, n);
}

/* jr_emit of a string with its taint. */
static void jr_emit_str(jr *r, const jstr *s) {
    size_t at = r->out->n;
    jr_emit(r, s->s, s->n);
    jb_mark_str(r, r->out, s, at);
}

/* jr_emit of a buffer with its taint. */
static void jr_emit_buf(jr *r, const jbuf *b) {
    size_t at = r->out->n;
    jr_emit(r, b->p ? b->p : "", b->n);
    for (size_t i = 0; i < b->n_sp; i++)
        jb_mark(r, r->out, at + b->sp[2 * i], at + b->sp[2 * i + 1]);
}

// ----------------------------------------------------------------------------
// Scopes

static jframe *jr_frame(jr *r, jframe *parent) {
    jframe *f = jr_alloc(r, sizeof *f);
    memset(f, 0, sizeof *f);
    f->parent = parent;
    return f;
}

static jv jr_lookup(jr *r, jframe *f, const char *name) {
    size_t n = strlen(name);
    for (; f; f = f->parent) {
        jr_step(r, f->vars.n / 8); /* linear search: charge it */
        jv *v = jd_get(&f->vars, name, n);
        if (v) return *v;
    }
    jv g = jinja__global(r, name);
    if (g.t != JV_UNDEF) return g;
    return jv_undef(name);
}

static void jr_setvar(jr *r, jframe *f, const char *name, jv v) {
    jd_set(r, &f->vars, jv_cstr(r, name), v);
}

// ----------------------------------------------------------------------------
// Expressions

static jv jr_eval(jr *r, jframe *f, const jnode *n);
static void jr_exec(jr *r, jframe *f, const jnode *n);

static jv jr_arith(jr *r, int op, jv a, jv b) {
    if (a.t == JV_UNDEF) jr_undef_fail(r, &a);
    if (b.t == JV_UNDEF) jr_undef_fail(r, &b);
    if (op == OP_ADD && a.t == JV_STR && b.t == JV_STR && ((a.flags | b.flags) & JV_F_SAFE)) {
        /* Markup + str escapes the plain side (markupsafe) and stays Markup */
        jbuf o = {0};
        if (a.flags & JV_F_SAFE)
            jb_put(r, &o, a.u.s->s, a.u.s->n);
        else
            jv_escape_to(r, &o, a.u.s->s, a.u.s->n);
        if (b.flags & JV_F_SAFE)
            jb_put(r, &o, b.u.s->s, b.u.s->n);
        else
            jv_escape_to(r, &o, b.u.s->s, b.u.s->n);
        jv m = jv_str(r, o.p ? o.p : "", o.n);
        m.flags = JV_F_SAFE;
        if (js_tainted(a.u.s) || js_tainted(b.u.s)) m.u.s->taint = JSPANS_ALL;
        return m;
    }
    if (op == OP_ADD && a.t == JV_STR && b.t == JV_STR) {
        jr_step(r, 1 + (a.u.s->n + b.u.s->n) / 4096);
        jv s = jv_str(r, NULL, 0);
        size_t n = a.u.s->n + b.u.s->n;
        jstr *js = jr_alloc(r, sizeof *js + n + 1);
        memcpy(js->s, a.u.s->s, a.u.s->n);
        memcpy(js->s + a.u.s->n, b.u.s->s, b.u.s->n);
        js->n = n;
        js->s[n] = 0;
        js->taint = NULL;
        if (js_tainted(a.u.s) || js_tainted(b.u.s)) { /* the ranges of both, b's shifted */
            jbuf t = {0};
            t.n = n;
            jb_mark_str(r, &t, a.u.s, 0);
            jb_mark_str(r, &t, b.u.s, a.u.s->n);
            js->taint = jb_spans(r, &t);
        }
        s.u.s = js;
        return s;
    }
    if (op == OP_ADD && a.t == JV_LIST && b.t == JV_LIST && !((a.flags | b.flags) & JV_F_GEN) &&
        (a.flags & JV_F_TUPLE) == (b.flags & JV_F_TUPLE)) {
        jv l = jv_list(r, a.u.l->n + b.u.l->n);
        jr_step(r, a.u.l->n + b.u.l->n);
        for (size_t i = 0; i < a.u.l->n; i++)
            jl_push(r, l.u.l, a.u.l->a[i]);
        for (size_t i = 0; i < b.u.l->n; i++)
            jl_push(r, l.u.l, b.u.l->a[i]);
        l.flags = a.flags;
        return l;
    }
    if (op == OP_MUL && ((a.t == JV_STR || a.t == JV_LIST) && (b.t == JV_INT || b.t == JV_BOOL))) {
        jv t = a;
        a = b;
        b = t;
    }
    if (op == OP_MUL && (a.t == JV_INT || a.t == JV_BOOL) && (b.t == JV_STR || b.t == JV_LIST)) {
        int64_t k = jv_inum(&a);
        if (k < 0) k = 0;
        size_t unit = b.t == JV_STR ? b.u.s->n : b.u.l->n;
        if (unit && (uint64_t)k > r->t->lim.max_out_bytes / unit)
            jr_fail(r, "template limit: repetition of %lld is too large", (long long)k);
        jr_step(r, 1 + (size_t)k * unit / 64);
        if (b.t == JV_STR) {
            jbuf o = {0};
            for (int64_t i = 0; i < k; i++)
                jb_put_str(r, &o, b.u.s);
            return jv_from_buf(r, &o);
        }
        jv l = jv_list(r, (size_t)k * unit);
        for (int64_t i = 0; i < k; i++)
            for (size_t j = 0; j < unit; j++)
                jl_push(r, l.u.l, b.u.l->a[j]);
        l.flags = b.flags;
        return l;
    }
    if (!jv_is_num(&a) || !jv_is_num(&b)) {
        static const char *const sym[] = {"", "+", "-", "*", "/", "//", "%", "**"};
        jr_fail(r, "unsupported operand type(s) for %s: '%s' and '%s'",
                op <= OP_POW ? sym[op] : "?", jv_type_name(&a), jv_type_name(&b));
    }
    bool fl = a.t == JV_FLOAT || b.t == JV_FLOAT;
    if (!fl) {
        int64_t x = jv_inum(&a), y = jv_inum(&b), z;
        switch (op) {
        case OP_ADD:
            if (__builtin_add_overflow(x, y, &z)) jr_fail(r, "integer overflow");
            return jv_int(z);
        case OP_SUB:
            if (__builtin_sub_overflow(x, y, &z)) jr_fail(r, "integer overflow");
            return jv_int(z);
        case OP_MUL:
            if (__builtin_mul_overflow(x, y, &z)) jr_fail(r, "integer overflow");
            return jv_int(z);
        case OP_DIV:
            if (y == 0) jr_fail(r, "division by zero");
            return jv_float((double)x / (double)y);
        case OP_FLOORDIV:
        case OP_MOD: {
            if (y == 0) jr_fail(r, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) jr_fail(r, "integer overflow");
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            return jv_int(op == OP_FLOORDIV ? q : m);
        }
        case OP_POW: {
            if (y < 0) return jv_float(pow((double)x, (double)y));
            int64_t acc = 1;
            for (int64_t i = 0; i < y; i++) {
                if (__builtin_mul_overflow(acc, x, &acc)) jr_fail(r, "integer overflow");
                if (acc == 0 || acc == 1) break;
                jr_step(r, 1);
            }
            if (acc == 1 && x == -1 && (y & 1)) acc = -1;
            return jv_int(acc);
        }
        default:
            break;
        }
    }
    double x = jv_num(&a), y = jv_num(&b);
    switch (op) {
    case OP_ADD:
        return jv_float(x + y);
    case OP_SUB:
        return jv_float(x - y);
    case OP_MUL:
        return jv_float(x * y);
    case OP_DIV:
        if (y == 0) jr_fail(r, "float division by zero");
        return jv_float(x / y);
    case OP_FLOORDIV:
        if (y == 0) jr_fail(r, "float floor division by zero");
        return jv_float(floor(x / y));
    case OP_MOD: {
        if (y == 0) jr_fail(r, "float modulo");
        double m = fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return jv_float(m);
    }
    default:
        return jv_float(pow(x, y));
    }
}

static bool jr_contains(jr *r, const jv *hay, const jv *needle) {
    switch (hay->t) {
    case JV_STR:
        if (needle->t != JV_STR)
            jr_fail(r, "'in <string>' requires string as left operand, not %s",
                    jv_type_name(needle));
        return needle->u.s->n == 0 ||
               memmem(hay->u.s->s, hay->u.s->n, needle->u.s->s, needle->u.s->n) != NULL;
    case JV_LIST:
        jr_step(r, hay->u.l->n);
        for (size_t i = 0; i < hay->u.l->n; i++)
            if (jv_eq(r, &hay->u.l->a[i], needle)) return true;
        return false;
    case JV_DICT:
    case JV_NS:
        return jd_getv(hay->u.d, *needle) != NULL;
    case JV_UNDEF:
        return false;
    default:
        jr_fail(r, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
}

/* Evaluates call arguments into arrays on the arena. */
static size_t jr_args(jr *r, jframe *f, const jnode *n, jv **args, const char ***names) {
    *args = n->n_kids ? jr_alloc(r, n->n_kids * sizeof **args) : NULL;
    *names = n->names;
    for (size_t i = 0; i < n->n_kids; i++)
        (*args)[i] = jr_eval(r, f, n->kids[i]);
    return n->n_kids;
}

/* The inputs of a call or filter, first then args, for jr_taint_result. */
static jv *jr_inputs(jr *r, const jv *first, const jv *args, size_t n) {
    jv *in = jr_alloc(r, (n + 1) * sizeof *in);
    in[0] = *first;
    if (n) memcpy(in + 1, args, n * sizeof *in);
    return in;
}

/* A filter's result, tainted as its inputs say (trim/strip keep ranges). */
static jv jr_filter(jr *r, const char *name, jv in, jv *args, const char **names, size_t n) {
    jv res = jinja__filter(r, name, in, args, names, n);
    bool sub = !strcmp(name, "trim");
    return jr_taint_result(r, res, jr_inputs(r, &in, args, n), n + 1, sub);
}

static jv jr_call(jr *r, jv callee, jv *args, const char **names, size_t n) {
    if (callee.t == JV_MACRO) return jinja__call_macro(r, callee.u.m, args, names, n);
    if (callee.t == JV_FUNC) {
        jv res = jinja__call_func(r, callee.u.fn, args, names, n);
        const jv *self = &callee.u.fn->self;
        bool sub = self->t == JV_STR && jinja__is_strip(callee.u.fn->id);
        return jr_taint_result(r, res, jr_inputs(r, self, args, n), n + 1, sub);
    }
    if (callee.t == JV_UNDEF) jr_undef_fail(r, &callee);
    jr_fail(r, "'%s' object is not callable", jv_type_name(&callee));
}

/* Python's slice.indices for [parts[0]:parts[1]:step] over len items:
 * the first index taken and the one that stops the walk, clamped as CPython
 * clamps them (parts already checked: int, bool, None or Undefined). */
static void jr_slice_bounds(const jv *parts, int64_t step, int64_t len, int64_t *lo, int64_t *hi) {
    bool has_lo = parts[0].t == JV_INT || parts[0].t == JV_BOOL;
    bool has_hi = parts[1].t == JV_INT || parts[1].t == JV_BOOL;
    if (step > 0) {
        *lo = has_lo ? jv_inum(&parts[0]) : 0;
        *hi = has_hi ? jv_inum(&parts[1]) : len;
        if (*lo < 0) *lo = *lo + len < 0 ? 0 : *lo + len;
        if (*hi < 0) *hi = *hi + len < 0 ? 0 : *hi + len;
        if (*lo > len) *lo = len;
        if (*hi > len) *hi = len;
    } else {
        *lo = has_lo ? jv_inum(&parts[0]) : len - 1;
        *hi = has_hi ? jv_inum(&parts[1]) : -1 - len;
        if (*lo < 0) *lo = *lo + len < 0 ? -1 : *lo + len;
        if (*hi < 0) *hi = *hi + len < 0 ? -1 : *hi + len;
        if (*lo >= len) *lo = len - 1;
        if (*hi >= len) *hi = len - 1;
    }
}

static jv jr_slice(jr *r, jv obj, jv *parts) {
    int64_t len;
    if (obj.t == JV_STR)
        len = (int64_t)obj.u.s->n;
    else if (obj.t == JV_LIST && !(obj.flags & JV_F_GEN))
        len = (int64_t)obj.u.l->n;
    else if (obj.t == JV_UNDEF)
        jr_undef_fail(r, &obj);
    else /* the sandbox's getitem: a TypeError becomes Undefined */
        return jv_undef(NULL);
    int64_t step = 1;
    if (parts[2].t != JV_NONE && parts[2].t != JV_UNDEF) {
        if (parts[2].t != JV_INT) jr_fail(r, "slice indices must be integers");
        step = parts[2].u.i;
        if (step == 0) jr_fail(r, "slice step cannot be zero");
    }
    int64_t lo, hi;
    for (int k = 0; k < 2; k++)
        if (parts[k].t != JV_NONE && parts[k].t != JV_UNDEF && parts[k].t != JV_INT &&
            parts[k].t != JV_BOOL)
            jr_fail(r, "slice indices must be integers or None");
    jr_step(r, (size_t)len);
    if (obj.t == JV_LIST) {
        jr_slice_bounds(parts, step, len, &lo, &hi);
        jv l = jv_list(r, 0);
        l.flags = obj.flags;
        for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step)
            jl_push(r, l.u.l, obj.u.l->a[i]);
        return l;
    }
    /* strings slice by code point */
    jlist *cps = jv_iter(r, &obj);
    jbuf b = {0};
    jr_slice_bounds(parts, step, (int64_t)cps->n, &lo, &hi);
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step)
        jb_put_str(r, &b, cps->a[i].u.s);
    return jv_from_buf(r, &b);
}

static jv jr_eval(jr *r, jframe *f, const jnode *n) {
    jr_step(r, 1);
    r->line = n->line;
    switch (n->kind) {
    case N_LIT:
        return n->lit;
    case N_NAME:
        return jr_lookup(r, f, n->name);
    case N_LIST:
    case N_TUPLE: {
        jv l = jv_list(r, n->n_kids);
        for (size_t i = 0; i < n->n_kids; i++)
            jl_push(r, l.u.l, jr_eval(r, f, n->kids[i]));
        if (n->kind == N_TUPLE) l.flags = JV_F_TUPLE;
        return l;
    }
    case N_DICT: {
        jv d = jv_dict(r);
        for (size_t i = 0; i + 1 < n->n_kids; i += 2) {
            jv k = jr_eval(r, f, n->kids[i]);
            if (k.t == JV_LIST && !(k.flags & JV_F_TUPLE)) jr_fail(r, "unhashable type: 'list'");
            if (k.t == JV_DICT) jr_fail(r, "unhashable type: 'dict'");
            jd_set(r, d.u.d, k, jr_eval(r, f, n->kids[i + 1]));
        }
        return d;
    }
    case N_ATTR: {
        jv o = jr_eval(r, f, n->a);
        r->line = n->line;
        return jinja__getattr(r, &o, n->name);
    }
    case N_ITEM: {
        jv o = jr_eval(r, f, n->a);
        jv k = jr_eval(r, f, n->b);
        r->line = n->line;
        return jinja__getitem(r, &o, &k);
    }
    case N_SLICE: {
        jv o = jr_eval(r, f, n->a);
        jv parts[3];
        for (int k = 0; k < 3; k++)
            parts[k] = n->kids[k] ? jr_eval(r, f, n->kids[k]) : jv_none();
        r->line = n->line;
        return jr_slice(r, o, parts);
    }
    case N_CALL: {
        jv callee = jr_eval(r, f, n->a);
        jv *args;
        const char **names;
        size_t na = jr_args(r, f, n, &args, &names);
        r->line = n->line;
        return jr_call(r, callee, args, names, na);
    }
    case N_FILTER: {
        jv in = jr_eval(r, f, n->a);
        jv *args;
        const char **names;
        size_t na = jr_args(r, f, n, &args, &names);
        r->line = n->line;
        return jr_filter(r, n->name, in, args, names, na);
    }
    case N_TEST: {
        jv in;
        if (n->a->kind == N_NAME && !strcmp(n->name, "defined")) /* no failure on lookup */
            in = jr_lookup(r, f, n->a->name);
        else
            in = jr_eval(r, f, n->a);
        jv *args;
        const char **names;
        size_t na = jr_args(r, f, n, &args, &names);
        r->line = n->line;
        bool res = jinja__test(r, n->name, &in, args, na);
        return jv_bool(n->op ? !res : res);
    }
    case N_BIN: {
        jv a = jr_eval(r, f, n->a);
        jv b = jr_eval(r, f, n->b);
        r->line = n->line;
        switch (n->op) {
        case OP_CONCAT: {
            jbuf o = {0};
            jv_str_to(r, &o, &a);
            jv_str_to(r, &o, &b);
            return jv_from_buf(r, &o);
        }
        case OP_EQ:
            return jv_bool(jv_eq(r, &a, &b));
        case OP_NE:
            return jv_bool(!jv_eq(r, &a, &b));
        case OP_LT:
            return jv_bool(jv_cmp(r, &a, &b) < 0);
        case OP_LE:
            return jv_bool(jv_cmp(r, &a, &b) <= 0);
        case OP_GT:
            return jv_bool(jv_cmp(r, &a, &b) > 0);
        case OP_GE:
            return jv_bool(jv_cmp(r, &a, &b) >= 0);
        case OP_IN:
            return jv_bool(jr_contains(r, &b, &a));
        case OP_NOTIN:
            return jv_bool(!jr_contains(r, &b, &a));
        default:
            return jr_arith(r, n->op, a, b);
        }
    }
    case N_UNARY: {
        jv a = jr_eval(r, f, n->a);
        if (a.t == JV_UNDEF) jr_undef_fail(r, &a);
        if (!jv_is_num(&a))
            jr_fail(r, "bad operand type for unary %c: '%s'", n->op == OP_NEG ? '-' : '+',
                    jv_type_name(&a));
        if (n->op == OP_POS) return a.t == JV_BOOL ? jv_int(a.u.b) : a;
        if (a.t == JV_FLOAT) return jv_float(-a.u.f);
        if (jv_inum(&a) == INT64_MIN) jr_fail(r, "integer overflow");
        return jv_int(-jv_inum(&a));
    }
    case N_AND: {
        jv a = jr_eval(r, f, n->a);
        return jv_truthy(&a) ? jr_eval(r, f, n->b) : a;
    }
    case N_OR: {
        jv a = jr_eval(r, f, n->a);
        return jv_truthy(&a) ? a : jr_eval(r, f, n->b);
    }
    case N_NOT: {
        jv a = jr_eval(r, f, n->a);
        return jv_bool(!jv_truthy(&a));
    }
    case N_COND: {
        jv c = jr_eval(r, f, n->a);
        if (jv_truthy(&c)) return jr_eval(r, f, n->b);
        return n->c ? jr_eval(r, f, n->c) : jv_undef(NULL);
    }
    default:
        jr_fail(r, "not an expression");
    }
}

// ----------------------------------------------------------------------------
// Statements

/* Renders a body into a fresh buffer; returns the text. */
static jv jr_capture(jr *r, jframe *f, const jnode *body) {
    jbuf b = {0};
    jbuf *saved = r->out;
    r->out = &b;
    jr_exec(r, f, body);
    r->out = saved;
    return jv_from_buf(r, &b);
}

static jv jr_apply_chain(jr *r, jframe *f, const jnode *chain, jv in) {
    if (!chain) return in;
    jv v = jr_apply_chain(r, f, chain->a, in);
    jv *args;
    const char **names;
    size_t na = jr_args(r, f, chain, &args, &names);
    r->line = chain->line;
    return jr_filter(r, chain->name, v, args, names, na);
}

static void jr_assign(jr *r, jframe *f, const jnode *target, jv v) {
    if (target->kind == N_NAME) {
        jr_setvar(r, f, target->name, v);
    } else if (target->kind == N_ATTR) {
        jv ns = jr_lookup(r, f, target->a->name);
        if (ns.t != JV_NS) jr_fail(r, "cannot assign attribute on non-namespace object");
        jd_set(r, ns.u.d, jv_cstr(r, target->name), v);
    } else { /* tuple unpacking */
        jlist *l = jv_iter(r, &v);
        if (l->n != target->n_kids)
            jr_fail(r, "cannot unpack %zu values into %zu names", l->n, target->n_kids);
        for (size_t i = 0; i < l->n; i++)
            jr_setvar(r, f, target->kids[i]->name, l->a[i]);
    }
}

/* Binds a for loop's target(s) to item in the iteration scope it. */
static void jr_for_bind(jr *r, jframe *it, const jnode *n, const jv *key, jv item) {
    if (n->n_kids == 1) {
        jd_push(r, &it->vars, *key, item);
    } else {
        jnode tuple = {.kind = N_TUPLE, .kids = n->kids, .n_kids = n->n_kids};
        jr_assign(r, it, &tuple, item);
    }
}

/* Each iteration gets a fresh scope (jinja2: a set inside the body is gone
 * by the next iteration). The scope's storage is reused from one iteration
 * to the next, so a long loop costs no memory per iteration. */
static void jr_for(jr *r, jframe *f, const jnode *n) {
    jv seq = jr_eval(r, f, n->a);
    jlist *src = jv_iter(r, &seq);
    jlist *items = src;
    jv key = jv_cstr(r, n->names[0]), key_loop = jv_cstr(r, "loop");
    jframe *it = jr_frame(r, f);
    if (n->b) { /* for x in xs if cond: filter first, so loop.* counts the kept */
        jv kept = jv_list(r, 0);
        for (size_t i = 0; i < src->n; i++) {
            it->vars.n = 0;
            jr_for_bind(r, it, n, &key, src->a[i]);
            jv c = jr_eval(r, it, n->b);
            if (jv_truthy(&c)) jl_push(r, kept.u.l, src->a[i]);
        }
        items = kept.u.l;
    }
    if (items->n == 0) {
        if (n->d) jr_exec(r, f, n->d);
        return;
    }
    jloop *lp = jr_alloc(r, sizeof *lp);
    lp->items = items;
    lp->depth = 1;
    jv loopv = {.t = JV_LOOP};
    loopv.u.lp = lp;
    for (size_t i = 0; i < items->n; i++) {
        jr_step(r, 1);
        lp->i = i;
        it->vars.n = 0;
        jd_push(r, &it->vars, key_loop, loopv);
        jr_for_bind(r, it, n, &key, items->a[i]);
        jr_exec(r, it, n->c);
        if (r->brk == 1) {
            r->brk = 0;
            break;
        }
        r->brk = 0;
    }
}

/* A macro value for definition def (a macro or a call block) closing over
 * frame f; caller() is undefined until a call block passes one. */
static jv jr_macro(jr *r, const jnode *def, jframe *f) {
    jmacro *m = jr_alloc(r, sizeof *m);
    m->def = def;
    m->closure = f;
    m->caller = jv_undef("caller");
    jv v = {.t = JV_MACRO};
    v.u.m = m;
    return v;
}

static void jr_exec(jr *r, jframe *f, const jnode *n) {
    jr_step(r, 1);
    r->line = n->line;
    switch (n->kind) {
    case N_BODY:
        for (size_t i = 0; i < n->n_kids && !r->brk; i++)
            jr_exec(r, f, n->kids[i]);
        return;
    case N_TEXT:
        jr_emit(r, n->lit.u.s->s, n->lit.u.s->n);
        return;
    case N_OUT: {
        jv v = jr_eval(r, f, n->a);
        if (v.t == JV_STR) {
            jr_emit_str(r, v.u.s);
        } else {
            jbuf b = {0};
            jv_str_to(r, &b, &v);
            jr_emit_buf(r, &b);
        }
        return;
    }
    case N_IF:
        for (size_t i = 0; i + 1 < n->n_kids; i += 2) {
            jv c = jr_eval(r, f, n->kids[i]);
            if (jv_truthy(&c)) {
                jr_exec(r, f, n->kids[i + 1]);
                return;
            }
        }
        if (n->c) jr_exec(r, f, n->c);
        return;
    case N_FOR:
        jr_for(r, f, n);
        return;
    case N_SET:
        jr_assign(r, f, n->a, jr_eval(r, f, n->b));
        return;
    case N_SETBLK: {
        jv v = jr_capture(r, f, n->c);
        jr_assign(r, f, n->a, jr_apply_chain(r, f, n->b, v));
        return;
    }
    case N_MACRO:
        jr_setvar(r, f, n->name, jr_macro(r, n, f));
        return;
    case N_CALLBLK: {
        jv cv = jr_macro(r, n, f); // the block, as the callee's caller()
        const jnode *call = n->a;
        jv callee = jr_eval(r, f, call->a);
        jv *args;
        const char **names;
        size_t na = jr_args(r, f, call, &args, &names);
        if (callee.t != JV_MACRO) jr_fail(r, "a call block needs a macro");
        jmacro m2 = *callee.u.m;
        m2.caller = cv;
        jv out = jinja__call_macro(r, &m2, args, names, na);
        jr_emit_str(r, out.u.s);
        return;
    }
    case N_FILTBLK: {
        jv v = jr_capture(r, f, n->c);
        jv o = jr_apply_chain(r, f, n->b, v);
        jbuf b = {0};
        jv_str_to(r, &b, &o);
        jr_emit_buf(r, &b);
        return;
    }
    case N_BREAK:
        r->brk = 1;
        return;
    case N_CONTINUE:
        r->brk = 2;
        return;
    default:
        jr_fail(r, "not a statement");
    }
}

jv jinja__call_macro(jr *r, jmacro *m, jv *args, const char **names, size_t n) {
    const jnode *def = m->def;
    if (++r->calls > r->t->lim.max_calls)
        jr_fail(r, "template limit: macro calls nested deeper than %zu", r->t->lim.max_calls);
    jframe *f = jr_frame(r, m->closure);
    size_t np = def->n_kids;
    size_t pos = 0;
    jv varargs = jv_list(r, 0);
    varargs.flags = JV_F_TUPLE;
    jv kwargs = jv_dict(r);
    bool *set = jr_alloc(r, (np + 1) * sizeof *set);
    memset(set, 0, (np + 1) * sizeof *set);
    for (size_t i = 0; i < n; i++) {
        if (!names || !names[i]) {
            if (pos < np) {
                jr_setvar(r, f, def->names[pos], args[i]);
                set[pos] = true;
                pos++;
            } else {
                jl_push(r, varargs.u.l, args[i]);
            }
            continue;
        }
        size_t k = 0;
        while (k < np && strcmp(def->names[k], names[i]) != 0)
            k++;
        if (k < np) {
            jr_setvar(r, f, def->names[k], args[i]);
            set[k] = true;
        } else {
            jd_set(r, kwargs.u.d, jv_cstr(r, names[i]), args[i]);
        }
    }
    if (def->kind == N_MACRO && varargs.u.l->n)
        jr_fail(r, "macro '%s' takes not more than %zu argument(s)", def->name, np);
    if (def->kind == N_MACRO && kwargs.u.d->n)
        jr_fail(r, "macro '%s' takes no keyword argument '%s'", def->name, kwargs.u.d->k[0].u.s->s);
    for (size_t k = 0; k < np; k++) {
        if (set[k]) continue;
        if (def->kids[k]) {
            jr_setvar(r, f, def->names[k], jr_eval(r, f, def->kids[k]));
        } else {
            jr_setvar(r, f, def->names[k], jv_undef(def->names[k]));
        }
    }
    jr_setvar(r, f, "varargs", varargs);
    jr_setvar(r, f, "kwargs", kwargs);
    if (m->caller.t != JV_UNDEF) jr_setvar(r, f, "caller", m->caller);
    int saved_brk = r->brk;
    r->brk = 0;
    jv out = jr_capture(r, f, def->c);
    r->brk = saved_brk;
    r->calls--;
    return out;
}

// ----------------------------------------------------------------------------
// Entry points

void jinja_limits_default(jinja_limits *l) {
    l->max_src_bytes = (size_t)1 << 20;
    l->max_depth = 128;
    l->max_calls = 32; /* with max_depth, bounds the C stack a render uses (~2 MB) */
    l->max_steps = 20 * 1000 * 1000;
    l->max_out_bytes = (size_t)8 << 20;
    l->max_mem_bytes = (size_t)128 << 20;
}

ks_err jinja_compile(const char *src, size_t len, const jinja_limits *lim, jinja_tmpl **out,
                     ks_errbuf *eb) {
    *out = NULL;
    jinja_limits l;
    jinja_limits_default(&l);
    if (lim) {
        if (lim->max_src_bytes) l.max_src_bytes = lim->max_src_bytes;
        if (lim->max_depth) l.max_depth = lim->max_depth;
        if (lim->max_calls) l.max_calls = lim->max_calls;
        if (lim->max_steps) l.max_steps = lim->max_steps;
        if (lim->max_out_bytes) l.max_out_bytes = lim->max_out_bytes;
        if (lim->max_mem_bytes) l.max_mem_bytes = lim->max_mem_bytes;
    }
    if (!src) len = 0;
    if (len > l.max_src_bytes)
        return ks_seterr(eb, KS_ERR_INVAL, "template limit: %zu bytes of source, at most %zu", len,
                         l.max_src_bytes);
    if (src && memchr(src, 0, len))
        return ks_seterr(eb, KS_ERR_FORMAT, "template: NUL byte in the source");
    jinja_tmpl *t = calloc(1, sizeof *t);
    if (!t) return ks_seterr(eb, KS_ERR_NOMEM, "template: out of memory");
    t->lim = l;
    t->arena.cap_bytes = l.max_mem_bytes;
    /* as jinja2's lexer: newlines normalized to "\n", and one trailing
     * newline dropped (keep_trailing_newline is off) */
    char *norm = malloc(len + 1);
    if (!norm) {
        jinja_free(t);
        return ks_seterr(eb, KS_ERR_NOMEM, "template: out of memory");
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n && norm[n - 1] == '\n') n--;
    norm[n] = 0;
    ks_err e = jinja__parse(t, norm, n, eb);
    free(norm);
    if (e) {
        jinja_free(t);
        return e;
    }
    *out = t;
    return KS_OK;
}

void jinja_free(jinja_tmpl *t) {
    if (!t) return;
    jinja__arena_free(&t->arena);
    free(t);
}

ks_err jinja_render(const jinja_tmpl *t, const json_t *ctx, const jinja_opts *o, char **out,
                    size_t *out_len, ks_errbuf *eb) {
    return jinja_render_marked(t, ctx, o, out, out_len, NULL, NULL, eb);
}

/* Sets the variables of obj (a JSON object) in r's globals. */
static void jr_set_json(jr *r, const json_t *obj) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v) { jr_setvar(r, r->globals, k, jv_from_json(r, v, 0)); }
}

ks_err jinja_render_marked(const jinja_tmpl *t, const json_t *ctx, const jinja_opts *o,
                           char **out, size_t *out_len, jinja_span **spans, size_t *n_spans,
                           ks_errbuf *eb) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (spans) *spans = NULL;
    if (n_spans) *n_spans = 0;
    const json_t *data = o ? o->data : NULL;
    if ((ctx && !json_is_object(ctx)) || (data && !json_is_object(data)))
        return ks_seterr(eb, KS_ERR_INVAL, "template: the context must be a JSON object");
    jr *r = calloc(1, sizeof *r);
    if (!r) return ks_seterr(eb, KS_ERR_NOMEM, "template: out of memory");
    r->t = t;
    r->eb = eb;
    r->arena.cap_bytes = t->lim.max_mem_bytes;
    r->now = o && o->now ? o->now : time(NULL);
    ks_err e = KS_OK;
    jbuf b = {0};
    if (setjmp(r->jmp)) {
        e = r->err;
        goto done;
    }
    r->out = &b;
    r->globals = jr_frame(r, NULL);
    if (data) { /* request data first: ctx's variables replace its */
        r->mark_data = true;
        r->data_plain = o->data_plain;
        jr_set_json(r, data);
        r->mark_data = false;
    }
    if (ctx) jr_set_json(r, ctx);
    jr_exec(r, jr_frame(r, r->globals), t->root);
    *out = malloc(b.n + 1);
    if (spans && b.n_sp) *spans = malloc(b.n_sp * sizeof **spans);
    if (!*out || (spans && b.n_sp && !*spans)) {
        free(*out);
        *out = NULL;
        if (spans) {
            free(*spans);
            *spans = NULL;
        }
        e = ks_seterr(eb, KS_ERR_NOMEM, "template: out of memory");
        goto done;
    }
    if (b.n) memcpy(*out, b.p, b.n);
    (*out)[b.n] = 0;
    if (out_len) *out_len = b.n;
    if (spans) {
        for (size_t i = 0; i < b.n_sp; i++)
            (*spans)[i] = (jinja_span){b.sp[2 * i], b.sp[2 * i + 1] - b.sp[2 * i]};
        *n_spans = b.n_sp;
    }
done:
    jinja__arena_free(&r->arena);
    free(r);
    return e;
}
