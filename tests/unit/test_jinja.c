/* test_jinja.c — the Jinja template engine (src/jinja/, kvseal/jinja.h).
 *
 * The cases (jinja_cases.inc, written by jinja_cases.py) pair a template
 * and a context with the output Python's jinja2 renders in Hugging Face's
 * setup, statement by statement, filter by filter, test by test, and for
 * each whitespace rule; errors must be errors with a message that says why;
 * and each resource limit must stop a hostile template with a clear error. */
#include "../check.h"

#include "kvseal/jinja.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct jcase {
    const char *tmpl, *ctx, *want;
};

#include "jinja_cases.inc"

#define NOW 1764633600 /* jinja_oracle.py's fixed instant */

/* Renders tmpl with ctx (JSON text); returns the error code, output in *out. */
static ks_err render(const char *tmpl, const char *ctx, const jinja_limits *lim, char **out,
                     ks_errbuf *eb) {
    *out = NULL;
    jinja_tmpl *t = NULL;
    ks_err e = jinja_compile(tmpl, strlen(tmpl), lim, &t, eb);
    if (e) return e;
    json_t *c = json_loads(ctx ? ctx : "{}", 0, NULL);
    CHECK(c);
    jinja_opts o = {.now = NOW};
    e = jinja_render(t, c, &o, out, NULL, eb);
    json_decref(c);
    jinja_free(t);
    return e;
}

static void test_cases(void) {
    size_t bad = 0;
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        char *out = NULL;
        ks_errbuf eb = {0};
        ks_err e = render(k_cases[i].tmpl, k_cases[i].ctx, NULL, &out, &eb);
        if (e || strcmp(out, k_cases[i].want) != 0) {
            fprintf(stderr, "case %zu: %s\n  ctx  %s\n  want [%s]\n  got  [%s] %s\n", i,
                    k_cases[i].tmpl, k_cases[i].ctx, k_cases[i].want, out ? out : "",
                    e ? eb.msg : "");
            bad++;
        }
        free(out);
    }
    CHECK_EQ(bad, 0);
}

static void test_errors(void) {
    size_t bad = 0;
    for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; i++) {
        char *out = NULL;
        ks_errbuf eb = {0};
        ks_err e = render(k_errors[i].tmpl, k_errors[i].ctx, NULL, &out, &eb);
        if (e != KS_ERR_INVAL || !strstr(eb.msg, k_errors[i].want) || out) {
            fprintf(stderr,
                    "error case %zu: %s\n  want an error with [%s]\n  got %s [%s] out [%s]\n", i,
                    k_errors[i].tmpl, k_errors[i].want, ks_err_name(e), eb.msg,
                    out ? out : "(null)");
            bad++;
        }
        free(out);
    }
    for (size_t i = 0; i < sizeof k_syntax / sizeof k_syntax[0]; i++) {
        jinja_tmpl *t = NULL;
        ks_errbuf eb = {0};
        ks_err e = jinja_compile(k_syntax[i].tmpl, strlen(k_syntax[i].tmpl), NULL, &t, &eb);
        if (e != KS_ERR_FORMAT || !strstr(eb.msg, k_syntax[i].want) || t ||
            !strstr(eb.msg, "line ")) {
            fprintf(stderr, "syntax case %zu: %s\n  want [%s]\n  got %s [%s]\n", i,
                    k_syntax[i].tmpl, k_syntax[i].want, ks_err_name(e), eb.msg);
            bad++;
        }
        jinja_free(t);
    }
    CHECK_EQ(bad, 0);
    /* the line number is the failing one */
    char *out = NULL;
    ks_errbuf eb = {0};
    CHECK_EQ(render("a\nb\n{{ u.x }}", "{}", NULL, &out, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "line 3");
    /* the context must be an object */
    jinja_tmpl *t = NULL;
    CHECK_EQ(jinja_compile("x", 1, NULL, &t, NULL), KS_OK);
    json_t *arr = json_array();
    CHECK_EQ(jinja_render(t, arr, NULL, &out, NULL, &eb), KS_ERR_INVAL);
    CHECK(out == NULL);
    json_decref(arr);
    /* NULL context and options: no variables, the real clock */
    size_t n = 99;
    CHECK_EQ(jinja_render(t, NULL, NULL, &out, &n, &eb), KS_OK);
    CHECK_STR_EQ(out, "x");
    CHECK_EQ(n, 1);
    free(out);
    jinja_free(t);
    jinja_free(NULL);
    /* a NUL byte in the source is refused */
    CHECK_EQ(jinja_compile("a\0b", 3, NULL, &t, &eb), KS_ERR_FORMAT);
}

/* One template compiled once, rendered from several threads' worth of
 * contexts: renders do not share state. */
static void test_reuse(void) {
    const char *src = "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}";
    jinja_tmpl *t = NULL;
    CHECK_EQ(jinja_compile(src, strlen(src), NULL, &t, NULL), KS_OK);
    for (int i = 0; i < 50; i++) {
        json_t *c = json_pack("{s:[{s:s,s:i}]}", "messages", "role", "user", "content", i);
        char *out = NULL;
        CHECK_EQ(jinja_render(t, c, NULL, &out, NULL, NULL), KS_OK);
        char want[64];
        snprintf(want, sizeof want, "user:%d;", i);
        CHECK_STR_EQ(out, want);
        free(out);
        json_decref(c);
    }
    jinja_free(t);
}

static void expect_limit(const char *tmpl, const jinja_limits *lim, ks_err code, const char *has) {
    char *out = NULL;
    ks_errbuf eb = {0};
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    ks_err e = render(tmpl, "{}", lim, &out, &eb);
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (e != code || !strstr(eb.msg, has)) {
        fprintf(stderr, "limit: %s\n  want %s [%s]\n  got %s [%s]\n", tmpl, ks_err_name(code), has,
                ks_err_name(e), eb.msg);
        abort();
    }
    CHECK(out == NULL);
    double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    CHECK(s < 20.0); /* stopped by the limit, not by luck */
}

static void test_limits(void) {
    jinja_limits d;
    jinja_limits_default(&d);
    CHECK(d.max_src_bytes && d.max_depth && d.max_calls && d.max_steps && d.max_out_bytes &&
          d.max_mem_bytes);
    jinja_limits lim = {.max_src_bytes = 16};
    expect_limit("0123456789abcdefg", &lim, KS_ERR_INVAL, "bytes of source");
    /* parse nesting: expressions and blocks */
    char deep[8192];
    size_t n = 0;
    n += (size_t)snprintf(deep + n, sizeof deep - n, "{{ ");
    for (int i = 0; i < 3000; i++)
        deep[n++] = '(';
    deep[n++] = '1';
    for (int i = 0; i < 3000; i++)
        deep[n++] = ')';
    snprintf(deep + n, sizeof deep - n, " }}");
    expect_limit(deep, NULL, KS_ERR_INVAL, "nesting deeper");
    n = 0;
    for (int i = 0; i < 500; i++)
        n += (size_t)snprintf(deep + n, sizeof deep - n, "{%% if 1 %%}");
    expect_limit(deep, NULL, KS_ERR_INVAL, "nesting deeper");
    /* macro recursion */
    expect_limit("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", NULL, KS_ERR_INVAL,
                 "macro calls nested deeper");
    /* steps: nested loops that would run 10^12 times */
    jinja_limits steps = {.max_steps = 100000};
    expect_limit("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}"
                 "{% endfor %}",
                 &steps, KS_ERR_INVAL, "template limit");
    expect_limit("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}"
                 "{% endfor %}",
                 NULL, KS_ERR_INVAL, "template limit");
    expect_limit("{% set l = range(4000) | list %}{% for i in l %}{% for j in l %}{% endfor %}"
                 "{% endfor %}",
                 NULL, KS_ERR_INVAL, "evaluation steps");
    /* output */
    jinja_limits outl = {.max_out_bytes = 1000};
    expect_limit("{% for i in range(100000) %}xxxxxxxxxx{% endfor %}", &outl, KS_ERR_INVAL,
                 "bytes of output");
    /* memory: a string that doubles */
    jinja_limits mem = {.max_mem_bytes = 4 << 20};
    expect_limit("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(64) %}"
                 "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}",
                 &mem, KS_ERR_INVAL, "bytes of memory");
    expect_limit("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(64) %}"
                 "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}",
                 NULL, KS_ERR_INVAL, "template limit");
    /* one huge allocation asked for at once */
    expect_limit("{{ 'x' * 1000000000000 }}", NULL, KS_ERR_INVAL, "repetition");
    expect_limit("{{ range(1000000000000) | length }}", NULL, KS_ERR_INVAL, "range");
    expect_limit("{{ [1, 2] * 1000000000000 }}", NULL, KS_ERR_INVAL, "repetition");
    /* within the limits, the same shapes render */
    char *out = NULL;
    CHECK_EQ(render("{% for i in range(3) %}{% for j in range(3) %}.{% endfor %}{% endfor %}", "{}",
                    &steps, &out, NULL),
             KS_OK);
    CHECK_STR_EQ(out, ".........");
    free(out);
}

/* Renders tmpl with ctx (trusted) and data (request strings) and returns
 * the output with each marked span in [brackets] (caller frees). */
static char *marked(const char *tmpl, const char *ctx, const char *data) {
    static const char *const plain[] = {"user", NULL};
    jinja_tmpl *t = NULL;
    ks_errbuf eb = {0};
    CHECK_EQ(jinja_compile(tmpl, strlen(tmpl), NULL, &t, &eb), KS_OK);
    json_t *c = ctx ? json_loads(ctx, 0, NULL) : NULL, *d = json_loads(data, 0, NULL);
    CHECK(d != NULL);
    jinja_opts o = {.data = d, .data_plain = plain};
    char *out = NULL;
    size_t n = 0, n_sp = 0;
    jinja_span *sp = NULL;
    ks_err e = jinja_render_marked(t, c, &o, &out, &n, &sp, &n_sp, &eb);
    if (e) fprintf(stderr, "marked %s: %s\n", tmpl, eb.msg);
    CHECK_EQ(e, KS_OK);
    char *m = malloc(n + 2 * n_sp + 1);
    size_t k = 0, at = 0;
    for (size_t i = 0; i < n_sp; i++) {
        CHECK(sp[i].len > 0 && sp[i].off >= at && sp[i].off + sp[i].len <= n);
        memcpy(m + k, out + at, sp[i].off - at);
        k += sp[i].off - at;
        m[k++] = '[';
        memcpy(m + k, out + sp[i].off, sp[i].len);
        k += sp[i].len;
        m[k++] = ']';
        at = sp[i].off + sp[i].len;
    }
    memcpy(m + k, out + at, n - at);
    m[k + n - at] = 0;
    free(out);
    free(sp);
    json_decref(c);
    json_decref(d);
    jinja_free(t);
    return m;
}

/* Issue 38: request strings keep their marks through rendering, so the
 * tokenizer can parse control tokens only where the template wrote them. */
static void test_marked(void) {
    static const struct {
        const char *tmpl, *ctx, *data, *want;
    } k[] = {
        /* output and concatenation keep exact ranges */
        {"<a>{{ x }}</a>", NULL, "{\"x\":\"hi\"}", "<a>[hi]</a>"},
        {"{{ '<a>' + x + '</a>' }}", NULL, "{\"x\":\"hi\"}", "<a>[hi]</a>"},
        {"{{ '<a>' ~ x ~ n ~ '</a>' }}", NULL, "{\"x\":\"hi\",\"n\":3}", "<a>[hi]3</a>"},
        {"{{ x + x }}", NULL, "{\"x\":\"ab\"}", "[abab]"},
        {"{{ x * 2 }}|{{ '-' * 2 }}", NULL, "{\"x\":\"ab\"}", "[abab]|--"},
        /* macros, caller, set and filter blocks */
        {"{% macro m(v) %}<b>{{ v }}</b>{% endmacro %}{{ m(x) }}", NULL, "{\"x\":\"hi\"}",
         "<b>[hi]</b>"},
        {"{% macro m() %}<{{ caller() }}>{% endmacro %}{% call m() %}{{ x }}!{% endcall %}", NULL,
         "{\"x\":\"hi\"}", "<[hi]!>"},
        {"{% set s %}<i>{{ x }}{% endset %}{{ s }}", NULL, "{\"x\":\"hi\"}", "<i>[hi]"},
        {"{% set ns = namespace(s='<') %}{% set ns.s = ns.s + x %}{{ ns.s }}>", NULL,
         "{\"x\":\"hi\"}", "<[hi]>"},
        /* filters and methods taint their result whole, trim/strip exactly */
        {"{{ ('<a>' + x)|upper }}", NULL, "{\"x\":\"hi\"}", "[<A>HI]"},
        {"{{ ('<a>' + x)|replace('a', 'b') }}", NULL, "{\"x\":\"hi\"}", "[<b>hi]"},
        {"{{ ('  <a>' + x + ' ')|trim }}|{{ (x + '  ')|trim }}", NULL, "{\"x\":\" hi\"}",
         "<a>[ hi]|[hi]"},
        {"{{ ('<a>' + x + '  ').strip() }}", NULL, "{\"x\":\"hi\"}", "<a>[hi]"},
        {"{{ x|tojson }} {{ d|tojson }}", NULL, "{\"x\":\"hi\",\"d\":{\"k\":1}}",
         "[\"hi\"] [{\"k\": 1}]"},
        {"{{ [x, 'y']|join(',') }}|{{ ['y', 'z']|join(',') }}", NULL, "{\"x\":\"hi\"}",
         "[hi,y]|y,z"},
        {"{% for p in x.split(',') %}<{{ p }}>{% endfor %}", NULL, "{\"x\":\"a,b\"}",
         "<[a]><[b]>"},
        {"{{ x[1:] }}{{ x[0] }}{% for c in x %}.{{ c }}{% endfor %}", NULL, "{\"x\":\"ab\"}",
         "[ba].[a].[b]"},
        {"{{ x|default('d') }}{{ y|default('d') }}", NULL, "{\"x\":\"hi\"}", "[hi]d"},
        /* a list returned as it is keeps its strings as they are */
        {"{% set l = ['<a>'] %}{{ (l|default(x))[0] }}", NULL, "{\"x\":\"hi\"}", "<a>"},
        {"{{ l }}{{ 'L' ~ l }}", NULL, "{\"l\":[\"a\"]}", "[['a']]L[['a']]"},
        /* keys of request objects are request data too */
        {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", NULL, "{\"d\":{\"a\":1}}",
         "[a]=1;"},
        /* data_plain values stay clean; the template's own strings are clean */
        {"<|{{ r }}|>{{ c }}", NULL, "{\"r\":\"user\",\"c\":\"user!\"}", "<|user|>[user!]"},
        {"{% if x == 'hi' %}<yes>{% endif %}{{ 'lit'|upper }}", NULL, "{\"x\":\"hi\"}",
         "<yes>LIT"},
        /* ctx replaces data of the same name, and is never marked */
        {"{{ b }}{{ x }}", "{\"b\":\"<s>\"}", "{\"b\":\"evil\",\"x\":\"hi\"}", "<s>[hi]"},
        /* an empty string marks nothing; adjacent marks merge */
        {"<{{ e }}>{{ x }}{{ x }}", NULL, "{\"e\":\"\",\"x\":\"a\"}", "<>[aa]"},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        char *m = marked(k[i].tmpl, k[i].ctx, k[i].data);
        if (strcmp(m, k[i].want) != 0) {
            fprintf(stderr, "marked %s\n  got  %s\n  want %s\n", k[i].tmpl, m, k[i].want);
            bad++;
        }
        free(m);
    }
    CHECK_EQ(bad, 0);
    /* jinja_render: the same text, nothing reported; spans may be NULL */
    jinja_tmpl *t = NULL;
    CHECK_EQ(jinja_compile("<{{ x }}>", 9, NULL, &t, NULL), KS_OK);
    json_t *d = json_pack("{s:s}", "x", "hi");
    jinja_opts o = {.data = d};
    char *out = NULL;
    CHECK_EQ(jinja_render_marked(t, NULL, &o, &out, NULL, NULL, NULL, NULL), KS_OK);
    CHECK_STR_EQ(out, "<hi>");
    free(out);
    CHECK_EQ(jinja_render(t, d, NULL, &out, NULL, NULL), KS_OK);
    CHECK_STR_EQ(out, "<hi>");
    free(out);
    json_t *arr = json_array();
    o.data = arr;
    jinja_span *sp = (jinja_span *)&o;
    size_t n_sp = 7;
    CHECK_EQ(jinja_render_marked(t, NULL, &o, &out, NULL, &sp, &n_sp, NULL), KS_ERR_INVAL);
    CHECK(out == NULL && sp == NULL && n_sp == 0);
    json_decref(arr);
    json_decref(d);
    jinja_free(t);
}

int main(void) {
    test_cases();
    test_errors();
    test_reuse();
    test_limits();
    test_marked();
    printf("test_jinja: %zu cases, %zu error cases, %zu syntax cases OK\n",
           sizeof k_cases / sizeof k_cases[0], sizeof k_errors / sizeof k_errors[0],
           sizeof k_syntax / sizeof k_syntax[0]);
    return 0;
}
