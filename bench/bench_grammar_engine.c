/* bench_grammar_engine.c — the decode cost of constrained sampling (grammar.h):
 * time per generated token of one request on the engine (no HTTP), without
 * a constraint (none) and with one (string: a JSON schema whose string
 * field keeps the model inside a string, the mask's most permissive state;
 * records: an array of at least 40 small objects, the mixed case), all
 * sampled at temperature 1
 * (a mask every step), plus the string schema greedy (greedy-string: the
 * argmax is tried before any mask), alternated so machine noise hits every
 * variant alike; prints each round, the medians and their ratio to none,
 * in wall time and in process CPU time (on a shared machine the wall time
 * mostly measures the neighbours; CPU time much less so). Then, since the
 * machine may be too noisy for a few percent, the grammar's own work alone:
 * each constrained variant's tokens of one run replayed through a fresh
 * matcher (mask + advance per token, one thread, no model), in us per
 * token, against the fastest unconstrained ms/token seen (tg).
 *
 * usage: bench_grammar_engine [-m MODEL] [-t THREADS] [-n TOKENS] [-r ROUNDS]
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
#include <time.h>

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One request; returns wall ms per token after the first (-1 on error) and
 * the process CPU ms per token over the same span in *cpu_ms. */
static int32_t g_out[4096]; // the last run's tokens
static int g_n_out;

static double run(engine *e, const int32_t *toks, int32_t n_toks, int max_tokens, grammar *g,
                  float temp, uint64_t seed, int *n_gen, double *cpu_ms) {
    engine_params p = {.tenant = "bench",
                       .prompt = toks,
                       .n_prompt = n_toks,
                       .max_tokens = max_tokens,
                       .ignore_eos = g == NULL,
                       .grammar = g};
    sample_params_default(&p.sp);
    p.sp.temperature = temp;
    p.sp.seed = seed;
    ks_errbuf eb;
    engine_req *r = NULL;
    *cpu_ms = -1;
    if (engine_submit(e, &p, &r, &eb)) {
        fprintf(stderr, "submit: %s\n", eb.msg);
        return -1;
    }
    engine_event ev;
    uint64_t t_first = 0, t_last = 0, c_first = 0, c_last = 0;
    int n = 0;
    do {
        ks_err ne = engine_req_next(r, &ev, 1000);
        if (ne == KS_ERR_TIMEOUT) continue;
        if (ne) break;
        if (ev.token >= 0) {
            t_last = ks_now_ns();
            c_last = cpu_ns();
            if (!t_first) t_first = t_last, c_first = c_last;
            if (n < 4096) g_out[n] = ev.token;
            n++;
        }
    } while (!ev.done);
    engine_req_release(r);
    *n_gen = n;
    g_n_out = n < 4096 ? n : 4096;
    if (ev.state != ENGINE_FINISHED || n < 2) {
        fprintf(stderr, "request ended: %s %s (%d tokens)\n", engine_state_name(ev.state),
                ev.errmsg, n);
        return -1;
    }
    *cpu_ms = (double)(c_last - c_first) / 1e6 / (n - 1);
    return (double)(t_last - t_first) / 1e6 / (n - 1);
}

int main(int argc, char **argv) {
    const char *path = "models/kjv-mini.gguf";
    int threads = 2, n_tokens = 200, rounds = 7;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m"))
            path = argv[i + 1];
        else if (!strcmp(argv[i], "-t"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-n"))
            n_tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r"))
            rounds = atoi(argv[i + 1]);
    }
    ks_errbuf eb;
    model *m = NULL;
    engine *e = NULL;
    if (kern_init(NULL, &eb) || model_load(path, &m, &eb)) {
        fprintf(stderr, "bench_grammar_engine: %s\n", eb.msg);
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
        fprintf(stderr, "bench_grammar_engine: %s\n", eb.msg);
        return 1;
    }
    const char *prompt = "In the beginning";
    int32_t *toks = NULL;
    size_t n_toks = 0;
    if (tok_encode(model_vocab(m), prompt, strlen(prompt), true, false, &toks, &n_toks, &eb))
        return 1;
    json_t *s1 = json_loads("{\"type\":\"object\",\"properties\":{\"text\":{\"type\":\"string\"}},"
                            "\"required\":[\"text\"]}",
                            0, NULL);
    json_t *s2 = json_loads("{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":"
                            "{\"k\":{\"type\":\"string\",\"maxLength\":8},\"v\":{\"type\":"
                            "\"number\"},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"k\","
                            "\"v\",\"ok\"]},\"minItems\":40}",
                            0, NULL);
    grammar *g1 = NULL, *g2 = NULL;
    if (grammar_from_schema(s1, &g1, &eb) || grammar_from_schema(s2, &g2, &eb)) {
        fprintf(stderr, "bench_grammar_engine: %s\n", eb.msg);
        return 1;
    }
    enum { NV = 4 };
    static const char *const names[NV] = {"none", "string", "records", "greedy-string"};
    grammar *gs[NV] = {NULL, g1, g2, g1};
    const float temps[NV] = {1.0f, 1.0f, 1.0f, 0.0f};
    double *t[NV], *cpu[NV];
    for (int v = 0; v < NV; v++) {
        t[v] = calloc((size_t)rounds, sizeof **t);
        cpu[v] = calloc((size_t)rounds, sizeof **cpu);
    }
    printf("vocabulary: %d tokens\n", tok_n_vocab(model_vocab(m)));
    printf("model %s, %d threads, up to %d tokens, %d rounds (wall/CPU ms per generated token)\n",
           path, threads, n_tokens, rounds);
    int ng;
    double cm;
    for (int v = 0; v < NV; v++)
        (void)run(e, toks, (int32_t)n_toks, 16, gs[v], temps[v], 1, &ng, &cm);
    for (int i = 0; i < rounds; i++) {
        printf("round %d:", i);
        for (int v = 0; v < NV; v++) {
            t[v][i] = run(e, toks, (int32_t)n_toks, n_tokens, gs[v], temps[v], 1000 + (uint64_t)i,
                          &ng, &cpu[v][i]);
            printf("  %s %.3f/%.3f (%d tok)", names[v], t[v][i], cpu[v][i], ng);
        }
        printf("\n");
    }
    for (int k = 0; k < 2; k++) {
        double **x = k ? cpu : t;
        double m0 = median(x[0], rounds);
        printf("median %s ms/token: none %.3f", k ? "CPU" : "wall", m0);
        for (int v = 1; v < NV; v++) {
            double mv = median(x[v], rounds);
            printf(", %s %.3f (x%.3f)", names[v], mv, mv / m0);
        }
        printf("\n");
    }
    // the grammar's work alone, replayed
    double tg = t[0][0];
    for (int i = 1; i < rounds; i++)
        tg = t[0][i] < tg ? t[0][i] : tg;
    grammar_vocab *gv = NULL;
    if (grammar_vocab_create(model_vocab(m), &gv, &eb)) return 1;
    uint32_t *bits = malloc(((size_t)grammar_vocab_n(gv) + 31) / 32 * sizeof *bits);
    for (int v = 1; v < NV; v++) {
        (void)run(e, toks, (int32_t)n_toks, n_tokens, gs[v], temps[v], 1000, &ng, &cm);
        double best = -1;
        int n_last = 0;
        for (int rep = 0; rep < 5; rep++) {
            grammar_matcher *gm = NULL;
            if (grammar_matcher_create(gs[v], &gm, &eb)) return 1;
            uint64_t t0 = ks_now_ns();
            int n_done = 0;
            for (int k = 0; k < g_n_out; k++) {
                int32_t n_allowed;
                if (grammar_matcher_mask(gm, gv, bits, &n_allowed)) return 1;
                if (!grammar_matcher_accept_token(gm, gv, g_out[k])) break; // EOG
                n_done++;
            }
            double us = (double)(ks_now_ns() - t0) / 1e3 / (n_done ? n_done : 1);
            best = best < 0 || us < best ? us : best;
            n_last = n_done;
            grammar_matcher_destroy(gm);
        }
        printf("grammar work alone, %s: %.1f us/token over %d tokens (best of 5) = %.1f%% of the "
               "fastest unconstrained tg (%.3f ms/token)\n",
               names[v], best, n_last, best / 1e3 / tg * 100.0, tg);
    }
    free(bits);
    grammar_vocab_destroy(gv);
    for (int v = 0; v < NV; v++) {
        free(t[v]);
        free(cpu[v]);
    }
    free(toks);
    grammar_unref(g1);
    grammar_unref(g2);
    json_decref(s1);
    json_decref(s2);
    engine_destroy(e);
    model_free(m);
    return 0;
}
