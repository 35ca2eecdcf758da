/* jinja_int.h — the jinja module's private types: arena, values, AST.
 *
 * value.c is the floor the others stand on: the arena, the values (jv),
 * the output buffers and taint, the render's failure and step accounting;
 * parse.c turns source into an AST (jnode nodes on the template's arena);
 * eval.c walks it against values allocated on a per-render arena;
 * builtin.c holds filters, tests and methods; print.c the value printers. Errors
 * inside a render unwind with longjmp to jinja_render: every allocation of a
 * render lives on its arena, so unwinding leaks nothing and the evaluator
 * needs no error plumbing at each of its hundreds of call sites. */
#ifndef KS_JINJA_INT_H
#define KS_JINJA_INT_H

#include "kvseal/jinja.h"

#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>

// ----------------------------------------------------------------------------
// Arena: bump allocation in chunks, freed at once, with a byte cap.

typedef struct jinja__chunk jinja__chunk;

typedef struct jinja__arena {
    jinja__chunk *head;
    size_t used_bytes; /* total of all chunks */
    size_t cap_bytes;  /* 0: unbounded */
} jinja__arena;

/* NULL when out of memory or over the cap. */
void *jinja__alloc(jinja__arena *a, size_t n);
void jinja__arena_free(jinja__arena *a);

// ----------------------------------------------------------------------------
// Values

typedef enum jv_type {
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST, /* also tuples (flag JV_F_TUPLE) */
    JV_DICT,
    JV_NS,    /* namespace(): a dict with attribute assignment */
    JV_MACRO, /* a macro or a caller */
    JV_FUNC,  /* a builtin global or a bound method */
    JV_LOOP,  /* the loop variable */
} jv_type;

#define JV_F_TUPLE 1 /* JV_LIST: a tuple */
#define JV_F_GEN 2   /* JV_LIST: a generator (map, select...): no len, always true, not JSON */
#define JV_F_SAFE 4  /* JV_STR: markupsafe's Markup (|safe, |e): '+' escapes plain strings */

/* Taint: which bytes of a string came from request data (jinja_opts.data),
 * as sorted, disjoint, non-empty [a[2i], a[2i+1]) ranges. JSPANS_ALL: the
 * whole string. Strings the template writes are clean (taint NULL);
 * concatenation and output keep the ranges exactly; any other string made
 * from a tainted value (filters, methods, slicing, ~ of non-strings) is
 * tainted whole. */
typedef struct jspans {
    size_t n;
    size_t a[];
} jspans;
extern const jspans jspans_all;
#define JSPANS_ALL (&jspans_all)

typedef struct jstr {
    size_t n;
    const jspans *taint; /* NULL: clean */
    char s[];            /* NUL-terminated */
} jstr;

typedef struct jv jv;
typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jmacro jmacro;
typedef struct jfunc jfunc;
typedef struct jloop jloop;

struct jv {
    uint8_t t;     /* jv_type */
    uint8_t flags; /* JV_F_* */
    union {
        bool b;
        int64_t i;
        double f;
        jstr *s;
        jlist *l;
        jdict *d;
        jmacro *m;
        jfunc *fn;
        jloop *lp;
    } u;
    const char *uname; /* JV_UNDEF: the name that was missing (for messages), may be NULL */
};

struct jlist {
    size_t n, cap;
    jv *a;
};

struct jdict {
    size_t n, cap;
    jv *k, *v;
};

typedef struct jnode jnode;
typedef struct jframe jframe;

struct jmacro {
    const jnode *def; /* N_MACRO, or N_CALLBLOCK for a caller */
    jframe *closure;  /* scope it was defined in */
    jv caller;        /* a call block's caller, else UNDEF */
};

struct jfunc {
    int id;  /* builtin id (builtin.c) */
    jv self; /* bound object, or UNDEF for globals */
};

struct jloop {
    jlist *items;
    size_t i;
    size_t depth;
};

// ----------------------------------------------------------------------------
// AST

typedef enum jn_kind {
    /* expressions */
    N_LIT,
    N_NAME,
    N_LIST,
    N_TUPLE,
    N_DICT,   /* kids: k0 v0 k1 v1 ... */
    N_ATTR,   /* a.name */
    N_ITEM,   /* a[b] */
    N_SLICE,  /* a[kids0:kids1:kids2], NULL parts absent */
    N_CALL,   /* a(kids; names[i] non-NULL for keyword args) */
    N_FILTER, /* name(a, kids...); a NULL in a filter block's chain */
    N_TEST,   /* a is [not] name(kids); op 1 = negated */
    N_BIN,    /* a op b */
    N_UNARY,  /* op a */
    N_AND,
    N_OR,
    N_NOT,
    N_COND, /* b if a else c (c NULL: undefined) */
    /* statements */
    N_BODY,    /* kids */
    N_TEXT,    /* lit */
    N_OUT,     /* {{ a }} */
    N_IF,      /* kids: cond0 body0 cond1 body1 ...; c else body */
    N_FOR,     /* names targets, a iter, b filter, c body, d else */
    N_SET,     /* a target, b value */
    N_SETBLK,  /* a target, c body, b filter chain (or NULL) */
    N_MACRO,   /* name; names params, kids defaults (NULL: required); c body */
    N_CALLBLK, /* a the call; names/kids caller params; c body */
    N_FILTBLK, /* b filter chain; c body */
    N_BREAK,
    N_CONTINUE,
} jn_kind;

typedef enum jn_op {
    OP_ADD = 1,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_CONCAT,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_IN,
    OP_NOTIN,
    OP_NEG,
    OP_POS,
} jn_op;

struct jnode {
    uint8_t kind; /* jn_kind */
    uint8_t op;   /* jn_op, or a flag */
    int line;
    const char *name; /* NUL-terminated, on the template arena */
    jv lit;
    jnode *a, *b, *c, *d;
    jnode **kids;
    const char **names; /* parallel to kids where used */
    size_t n_kids;
};

struct jinja_tmpl {
    jinja__arena arena;
    jinja_limits lim;
    jnode *root;
};

/* parse.c: compiles src into t->root. */
ks_err jinja__parse(jinja_tmpl *t, const char *src, size_t len, ks_errbuf *eb);

// ----------------------------------------------------------------------------
// Render state (eval.c), the value helpers under it (value.c), the printers
// (print.c) and the builtins (builtin.c)

typedef struct jbuf {
    char *p;
    size_t n, cap;
    size_t *sp; /* tainted ranges of p, as jspans.a */
    size_t n_sp, cap_sp;
} jbuf;

struct jframe {
    jframe *parent;
    jdict vars;
};

typedef struct jr {
    const jinja_tmpl *t;
    jinja__arena arena;
    jmp_buf jmp;
    ks_errbuf *eb;
    ks_err err;
    size_t steps;
    size_t calls;
    int line;         /* line being evaluated, for messages */
    jbuf *out;        /* where output goes now */
    size_t out_total; /* bytes written to the final output */
    jframe *globals;
    time_t now;
    bool mark_data;                /* jv_from_json: strings are request data */
    const char *const *data_plain; /* request strings that stay clean */
    int brk;    /* 1 break, 2 continue pending */
    int pdepth; /* nesting of the value being printed (namespaces can hold themselves) */
    const void *pstack[201]; /* (pdepth) the containers being printed, for Python's "{...}" */
} jr;

_Noreturn void jr_fail(jr *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void *jr_alloc(jr *r, size_t n);
void jr_step(jr *r, size_t n);

jv jv_undef(const char *name);
jv jv_none(void);
jv jv_bool(bool b);
jv jv_int(int64_t i);
jv jv_float(double f);
jv jv_str(jr *r, const char *s, size_t n);
jv jv_cstr(jr *r, const char *s);
jv jv_list(jr *r, size_t cap);
jv jv_dict(jr *r);
void jl_push(jr *r, jlist *l, jv v);
void jd_set(jr *r, jdict *d, jv k, jv v);
void jd_push(jr *r, jdict *d, jv k, jv v); /* appends k -> v; the caller knows k is new */
jv *jd_get(const jdict *d, const char *k, size_t n);
jv *jd_getv(const jdict *d, jv k);
jv jv_from_json(jr *r, const json_t *j, int depth);

bool jv_truthy(const jv *v);
/* numbers: int, float and bool compare and add as Python's do */
static inline bool jv_is_num(const jv *v) { return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL; }
static inline double jv_num(const jv *v) {
    return v->t == JV_FLOAT ? v->u.f : v->t == JV_INT ? (double)v->u.i : (double)v->u.b;
}
static inline int64_t jv_inum(const jv *v) { return v->t == JV_INT ? v->u.i : (int64_t)v->u.b; }
bool jv_eq(jr *r, const jv *a, const jv *b); /* r NULL: uncharged */
int jv_cmp(jr *r, const jv *a, const jv *b); /* fails on incomparable */
const char *jv_type_name(const jv *v);
_Noreturn void jr_undef_fail(jr *r, const jv *v); /* fails naming the undefined v */
void jb_put(jr *r, jbuf *b, const char *s, size_t n);
/* taint */
bool js_tainted(const jstr *s);
bool jv_tainted(jr *r, const jv *v, int depth); /* any tainted string in v (depth-bounded) */
jv jv_taint_all(jr *r, jv v);                   /* a string tainted whole (others as they are) */
void jb_mark(jr *r, jbuf *b, size_t lo, size_t hi);
void jb_put_str(jr *r, jbuf *b, const jstr *s); /* bytes and taint */
void jb_mark_str(jr *r, jbuf *b, const jstr *s, size_t at); /* s's taint, s's bytes at b's offset at */
const jspans *jb_spans(jr *r, const jbuf *b);                  /* b's taint as a string's (NULL: none) */
jv jv_from_buf(jr *r, const jbuf *b);           /* a string of b's bytes and taint */
/* The result of a filter, method or function call on inputs in[0..n): a
 * new string made from tainted inputs is tainted whole, and so are new
 * strings directly in a list it returns; precise for substrings (strip). */
jv jr_taint_result(jr *r, jv res, const jv *in, size_t n, bool substring);
void jb_puts(jr *r, jbuf *b, const char *s);
/* markupsafe.escape of s appended to b */
void jv_escape_to(jr *r, jbuf *b, const char *s, size_t n);
/* str(v) / repr(v) as Python prints them, appended to b */
void jv_str_to(jr *r, jbuf *b, const jv *v);
void jv_repr_to(jr *r, jbuf *b, const jv *v);
jv jv_tostr(jr *r, const jv *v); /* str(v) as a JV_STR value */
/* json.dumps(v, ...) with these options (HF's tojson: ensure_ascii off) */
typedef struct json_fmt {
    const char *indent; /* NULL: no newlines */
    const char *item_sep, *key_sep;
    bool ascii, sort_keys;
} json_fmt;
void jv_json_to(jr *r, jbuf *b, const jv *v, const json_fmt *f);
/* materializes an iterable as a list (dict: keys; str: characters; undefined: empty) */
jlist *jv_iter(jr *r, const jv *v);

/* builtins */
jv jinja__global(jr *r, const char *name); /* UNDEF when not a builtin global */
jv jinja__getattr(jr *r, const jv *obj, const char *name);
jv jinja__getitem(jr *r, const jv *obj, const jv *key);
jv jinja__call_func(jr *r, jfunc *fn, jv *args, const char **names, size_t n);
bool jinja__is_strip(int id); /* a str method whose result is a substring of self */
jv jinja__filter(jr *r, const char *name, jv in, jv *args, const char **names, size_t n);
bool jinja__test(jr *r, const char *name, const jv *in, jv *args, size_t n);
jv jinja__call_macro(jr *r, jmacro *m, jv *args, const char **names, size_t n);

#endif /* KS_JINJA_INT_H */
