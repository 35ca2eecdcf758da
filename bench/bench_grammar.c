/* bench_grammar.c — the decode cost of constrained sampling (grammar.h):
 * time per generated token of one request on the engine (no HTTP), without
 * a constraint (none) and with one (string: a JSON schema whose string
 * field keeps the model inside a string, the mask's most permissive state;
 * object: any JSON object, the mixed case), all sampled at temperature 1
 * (a mask every step), plus the string schema greedy (greedy-string: the
 * argmax is tried before any mask), alternated so machine noise hits every
 * variant alike; prints each round, the medians and their ratio to none.
 *
 * usage: bench_grammar [-m MODEL] [-t THREADS] [-n TOKENS] [-r ROUNDS]
 * The constrained requests may end before TOKENS (the grammar completes);
 * time per token is over the tokens each one generated, after the first. */
#include "kvseal/cli.h"
#include "kvseal/engine.h"
#include "kvseal/grammar.h"
#include "kvseal/kern.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One request; returns ms per token after the first (-1 on error). */
static double run(engine *e, const int32_t *toks, int32_t n_toks, int max_tokens, grammar *g,
                  float temp, uint64_t seed, int *n_gen) {
    engine_params p = {.tenant = "bench", .prompt = toks, .n_prompt = n_toks,
                       .max_tokens = max_tokens, .ignore_eos = g == NULL, .grammar = g};
    sample_params_default(&p.sp);
    p.sp.temperature = temp;
    p.sp.seed = seed;
    ks_errbuf eb;
    engine_req *r = NULL;
    if (engine_submit(e, &p, &r, &eb)) {
        fprintf(stderr, "submit: %s\n", eb.msg);
        return -1;
    }
    engine_event ev;
    uint64_t t_first = 0, t_last = 0;
    int n = 0;
    do {
        ks_err ne = engine_req_next(r, &ev, 1000);
        if (ne == KS_ERR_TIMEOUT) continue;
        if (ne) break;
        if (ev.token >= 0) {
            t_last = ks_now_ns();
            if (!t_first) t_first = t_last;
            n++;
        }
    } while (!ev.done);
    engine_req_release(r);
    *n_gen = n;
    if (ev.state != ENGINE_FINISHED || n < 2) {
        fprintf(stderr, "request ended: %s %s (%d tokens)\n", engine_state_name(ev.state),
                ev.errmsg, n);
        return -1;
    }
    return (double)(t_last - t_first) / 1e6 / (n - 1);
}

int main(int argc, char **argv) {
    const char *path = "models/kjv-mini.gguf";
    int threads = 2, n_tokens = 200, rounds = 7;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m")) path = argv[i + 1];
        else if (!strcmp(argv[i], "-t")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-n")) n_tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r")) rounds = atoi(argv[i + 1]);
    }
    ks_errbuf eb;
    model *m = NULL;
    engine *e = NULL;
    if (kern_init(NULL, &eb) || model_load(path, &m, &eb)) {
        fprintf(stderr, "bench_grammar: %s\n", eb.msg);
        return 1;
    }
    engine_opts o;
    engine_opts_default(&o);
    o.m = m;
    o.n_threads = threads;
    o.n_ctx = 1024;
    o.kv_pages = 2 * (1024 / 16);
    o.prefix_cache = false;
    if (engine_create(&o, &e, &eb)) {
        fprintf(stderr, "bench_grammar: %s\n", eb.msg);
        return 1;
    }
    const char *prompt = "In the beginning";
    int32_t *toks = NULL;
    size_t n_toks = 0;
    if (tok_encode(model_vocab(m), prompt, strlen(prompt), true, false, &toks, &n_toks, &eb))
        return 1;
    json_t *s1 = json_loads("{\"type\":\"object\",\"properties\":{\"text\":{\"type\":\"string\"}},"
                            "\"required\":[\"text\"]}", 0, NULL);
    json_t *s2 = json_loads("{\"type\":\"object\"}", 0, NULL);
    grammar *g1 = NULL, *g2 = NULL;
    if (grammar_from_schema(s1, &g1, &eb) || grammar_from_schema(s2, &g2, &eb)) {
        fprintf(stderr, "bench_grammar: %s\n", eb.msg);
        return 1;
    }
    enum { NV = 4 };
    static const char *const names[NV] = {"none", "string", "object", "greedy-string"};
    grammar *gs[NV] = {NULL, g1, g2, g1};
    const float temps[NV] = {1.0f, 1.0f, 1.0f, 0.0f};
    double *t[NV];
    for (int v = 0; v < NV; v++)
        t[v] = calloc((size_t)rounds, sizeof **t);
    printf("model %s, %d threads, up to %d tokens, %d rounds (ms per generated token)\n", path,
           threads, n_tokens, rounds);
    int ng;
    for (int v = 0; v < NV; v++)
        (void)run(e, toks, (int32_t)n_toks, 16, gs[v], temps[v], 1, &ng);
    for (int i = 0; i < rounds; i++) {
        printf("round %d:", i);
        for (int v = 0; v < NV; v++) {
            t[v][i] =
                run(e, toks, (int32_t)n_toks, n_tokens, gs[v], temps[v], 1000 + (uint64_t)i, &ng);
            printf("  %s %.3f (%d tok)", names[v], t[v][i], ng);
        }
        printf("\n");
    }
    double m0 = median(t[0], rounds);
    printf("median ms/token: none %.3f", m0);
    for (int v = 1; v < NV; v++) {
        double mv = median(t[v], rounds);
        printf(", %s %.3f (x%.3f)", names[v], mv, mv / m0);
    }
    printf("\n");
    for (int v = 0; v < NV; v++)
        free(t[v]);
    free(toks);
    grammar_unref(g1);
    grammar_unref(g2);
    json_decref(s1);
    json_decref(s2);
    engine_destroy(e);
    model_free(m);
    return 0;
}
