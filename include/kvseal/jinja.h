/* jinja.h — a Jinja2 template interpreter for chat templates (src/jinja/).
 *
 * Implements the subset of Jinja2 that published chat templates use, with the
 * semantics of Python's jinja2 as Hugging Face transformers sets it up
 * (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
 * its own tojson keeping non-ASCII and key order, raise_exception,
 * strftime_now, and the {% generation %} tag): statements if/for/set/macro/
 * call/filter, filters, tests, str/dict methods, default Undefined. Nothing
 * touches files or the environment: a template only sees its context.
 *
 * A template is compiled once into an immutable AST (jinja_compile) and can
 * then be rendered any number of times, from any number of threads at once
 * (jinja_render keeps all its state on its own arena). Templates are
 * untrusted input (a GGUF file's metadata): every resource is bounded by
 * jinja_limits, and exceeding one is an error, never a hang or an OOM. */
#ifndef KS_JINJA_H
#define KS_JINJA_H

#include "kvseal/base.h"

#include <jansson.h>
#include <stddef.h>
#include <time.h>

typedef struct jinja_tmpl jinja_tmpl;

/* Resource bounds. Zero fields take the defaults of jinja_limits_default. */
typedef struct jinja_limits {
    size_t max_src_bytes; /* template source size (default 1 MiB) */
    size_t max_depth;     /* nesting of expressions and blocks at parse time (default 128) */
    size_t max_calls;     /* macro / caller recursion depth at render time (default 64) */
    size_t max_steps;     /* evaluation steps per render: nodes, loop iterations,
                             elements copied (default 20M) */
    size_t max_out_bytes; /* rendered output (default 8 MiB) */
    size_t max_mem_bytes; /* memory one render may allocate (default 128 MiB) */
} jinja_limits;

/* Fills *l with the defaults. Can't fail. */
void jinja_limits_default(jinja_limits *l /* OUT */);

/* Compiles len bytes of template source (need not be NUL-terminated). lim
 * may be NULL (defaults); it is copied into the template and also bounds its
 * renders. On success *out is owned by the caller (jinja_free).
 * Errors: KS_ERR_FORMAT (syntax error: the message gives line and reason),
 * KS_ERR_INVAL (a limit exceeded: source size, nesting), KS_ERR_NOMEM.
 * Pure; thread-safe. */
ks_err jinja_compile(const char *src, size_t len, const jinja_limits *lim,
                     jinja_tmpl **out /* OUT */, ks_errbuf *eb) KS_MUST_USE;

/* Render options. */
typedef struct jinja_opts {
    time_t now; /* the clock strftime_now reads (UTC); 0: the real time */
    /* More variables (a JSON object, borrowed; NULL: none) whose strings,
     * object keys included, are request data: jinja_render_marked reports
     * where in the output they went. They are set before ctx's, so a ctx
     * variable of the same name replaces one of data. */
    const json_t *data;
    /* NULL-terminated strings (NULL: none) that stay unmarked where data
     * holds them exactly (values the caller has checked, e.g. role names). */
    const char *const *data_plain;
} jinja_opts;

/* A byte range [off, off + len) of a render's output. */
typedef struct jinja_span {
    size_t off; /* public */
    size_t len; /* public */
} jinja_span;

/* Renders t with the variables of ctx (a JSON object, borrowed; NULL: none).
 * o may be NULL. On success *out is a malloc'd NUL-terminated string (caller
 * frees) and *out_len its length (out_len may be NULL).
 * Errors: KS_ERR_INVAL (the template raised, or failed as jinja2 would:
 * undefined attribute, type error, unknown filter...; or a limit was
 * exceeded; the message names the line and reason), KS_ERR_NOMEM.
 * *out is NULL on error. Thread-safe: t is only read. */
ks_err jinja_render(const jinja_tmpl *t, const json_t *ctx, const jinja_opts *o,
                    char **out /* OUT */, size_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;

/* jinja_render that also reports which output bytes came from o->data:
 * *spans (malloc'd, caller frees; NULL when *n_spans is 0) are sorted,
 * disjoint, non-empty ranges. A string of data keeps its mark through
 * variables, concatenation (+, ~), macro and block output, and whole
 * through anything else made from it (filters such as upper, replace,
 * tojson, join; slicing; string methods), so every output byte copied or
 * computed from a data string is marked, and bytes the template writes
 * from its own literals are not (a branch taken on data marks nothing).
 * trim and strip keep the ranges exactly. spans
 * and n_spans may be NULL (then nothing is reported). Same errors and
 * ownership as jinja_render; *spans is NULL on error. Thread-safe. */
ks_err jinja_render_marked(const jinja_tmpl *t, const json_t *ctx, const jinja_opts *o,
                           char **out /* OUT */, size_t *out_len /* OUT */,
                           jinja_span **spans /* OUT */, size_t *n_spans /* OUT */,
                           ks_errbuf *eb) KS_MUST_USE;

/* Frees a template; accepts NULL. */
void jinja_free(jinja_tmpl *t);

#endif /* KS_JINJA_H */
