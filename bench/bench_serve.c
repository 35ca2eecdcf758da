/* bench_serve.c — serving benchmark on the engine (continuous batching, no
 * HTTP): C concurrent clients, each sending greedy requests back to back.
 * Reports aggregate generated tokens/s, time to first token and time per
 * output token (p50, p99) for each concurrency level.
 *
 * usage: bench_serve [-m MODEL] [-t THREADS] [-c 1,4,16] [-r REQS_PER_CLIENT]
 *                    [-n MAX_TOKENS] [--ctx N]
 * Run by bench/serve.sh, which also builds the variant with tag checks and
 * scrubbing switched off and reports the cost of the safeguards as a ratio. */
#include "kvseal/cli.h"
#include "kvseal/engine.h"
#include "kvseal/kern.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *PROMPTS[] = {
    "In the beginning", "And the LORD spake unto Moses, saying,", "Blessed are the",
    "Now it came to pass", "And God said, Let there be light", "The LORD is my shepherd",
    "For God so loved the world", "And Jesus answered and said unto them,"};

typedef struct {
    engine *e;
    const tok_vocab *v;
    int id, n_req, max_tokens;
    double *ttft, *tpot;  // (n_req) per request, ms
    long n_tokens;
} client;

static void *client_main(void *arg) {
    client *c = arg;
    for (int i = 0; i < c->n_req; i++) {
        const char *p = PROMPTS[(c->id * 3 + i) % 8];
        int32_t *ids;
        size_t n;
        ks_errbuf eb;
        if (tok_encode(c->v, p, strlen(p), true, false, &ids, &n, &eb)) abort();
        engine_params ep = {.tenant = "bench", .prompt = ids, .n_prompt = (int32_t)n,
                            .max_tokens = c->max_tokens, .ignore_eos = true};
        sample_params_default(&ep.sp);
        ep.sp.temperature = 0;
        engine_req *r;
        uint64_t t0 = ks_now_ns(), t1 = 0, tl = 0;
        if (engine_submit(c->e, &ep, &r, &eb)) {
            fprintf(stderr, "submit: %s\n", eb.msg);
            abort();
        }
        free(ids);
        int got = 0;
        for (;;) {
            engine_event ev;
            if (engine_req_next(r, &ev, 600000) != KS_OK) abort();
            if (ev.token >= 0) {
                tl = ks_now_ns();
                if (!got++) t1 = tl;
            }
            if (ev.done) break;
        }
        engine_req_release(r);
        c->ttft[i] = (double)(t1 - t0) / 1e6;
        c->tpot[i] = got > 1 ? (double)(tl - t1) / 1e6 / (got - 1) : 0;
        c->n_tokens += got;
    }
    return NULL;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

int main(int argc, char **argv) {
    const char *path = cli_default_model(), *levels = "1,4,16";
    int threads = 2, n_req = 4, max_tokens = 64, ctx = 512;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m")) path = argv[i + 1];
        else if (!strcmp(argv[i], "-t")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-c")) levels = argv[i + 1];
        else if (!strcmp(argv[i], "-r")) n_req = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-n")) max_tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ctx")) ctx = atoi(argv[i + 1]);
    }
    ks_errbuf eb;
    model *m;
    if (kern_init(NULL, &eb) || model_load(path, &m, &eb)) {
        fprintf(stderr, "%s\n", eb.msg);
        return 1;
    }
    engine_opts o;
    engine_opts_default(&o);
    o.m = m;
    o.n_threads = threads;
    o.n_ctx = ctx;
    // room for 16 clients' requests at once, and at least 2x the context
    o.kv_pages = (uint32_t)(16 * ((max_tokens + 16 + 15) / 16) + 2 * ctx / 16);
    o.max_running = 16;
    o.prefix_cache = false;  // measure compute, not reuse
    engine *e;
    if (engine_create(&o, &e, &eb)) {
        fprintf(stderr, "%s\n", eb.msg);
        return 1;
    }
#ifdef KS_BROKEN_NAME
    printf("build: safeguards OFF (%s)\n", KS_BROKEN_NAME);
#else
    printf("build: normal (tag checks and scrubbing on)\n");
#endif
    printf("model %s, %d threads, kernels %s, %d tokens per request\n", path, threads, kern_get()->name,
           max_tokens);
    char lv[64];
    snprintf(lv, sizeof lv, "%s", levels);
    for (char *tokp = strtok(lv, ","); tokp; tokp = strtok(NULL, ",")) {
        int C = atoi(tokp);
        client *cs = calloc((size_t)C, sizeof *cs);
        pthread_t *th = calloc((size_t)C, sizeof *th);
        double *ttft = calloc((size_t)(C * n_req), sizeof(double));
        double *tpot = calloc((size_t)(C * n_req), sizeof(double));
        uint64_t t0 = ks_now_ns();
        for (int i = 0; i < C; i++) {
            cs[i] = (client){.e = e, .v = model_vocab(m), .id = i, .n_req = n_req,
                             .max_tokens = max_tokens, .ttft = ttft + i * n_req, .tpot = tpot + i * n_req};
            pthread_create(&th[i], NULL, client_main, &cs[i]);
        }
        long tokens = 0;
        for (int i = 0; i < C; i++) {
            pthread_join(th[i], NULL);
            tokens += cs[i].n_tokens;
        }
        double secs = (double)(ks_now_ns() - t0) / 1e9;
        int N = C * n_req;
        printf("clients %2d: %7.1f tokens/s aggregate | TTFT p50 %7.1f ms p99 %7.1f ms | TPOT p50 %6.2f ms p99 %6.2f ms\n",
               C, (double)tokens / secs, pct(ttft, N, 0.5), pct(ttft, N, 0.99), pct(tpot, N, 0.5),
               pct(tpot, N, 0.99));
        fflush(stdout);
        free(cs);
        free(th);
        free(ttft);
        free(tpot);
    }
    engine_destroy(e);

    // prefix cache: time to first token of a long prompt, cold (first time
    // for this tenant) and warm (same tenant again), median of 5 tenants
    o.prefix_cache = true;
    if (engine_create(&o, &e, &eb)) {
        fprintf(stderr, "%s\n", eb.msg);
        return 1;
    }
    char text[4096] = "";
    for (int i = 0; i < 12; i++) strcat(text, "And the LORD spake unto Moses, saying, Speak unto the children of Israel. ");
    int32_t *ids;
    size_t n;
    if (tok_encode(model_vocab(m), text, strlen(text), true, false, &ids, &n, &eb)) return 1;
    if ((int)n > ctx - 8) n = (size_t)(ctx - 8);
    double cold[5], warm[5];
    for (int t = 0; t < 5; t++) {
        char tenant[16];
        snprintf(tenant, sizeof tenant, "tenant%d", t);
        for (int pass = 0; pass < 2; pass++) {
            engine_params ep = {.tenant = tenant, .prompt = ids, .n_prompt = (int32_t)n, .max_tokens = 1};
            sample_params_default(&ep.sp);
            ep.sp.temperature = 0;
            engine_req *r;
            uint64_t t0 = ks_now_ns();
            if (engine_submit(e, &ep, &r, &eb)) return 1;
            engine_event ev;
            do
                if (engine_req_next(r, &ev, 600000)) abort();
            while (!ev.done && ev.token < 0);
            (pass ? warm : cold)[t] = (double)(ks_now_ns() - t0) / 1e6;
            while (!ev.done)
                if (engine_req_next(r, &ev, 600000)) abort();
            engine_req_release(r);
        }
    }
    double c50 = pct(cold, 5, 0.5), w50 = pct(warm, 5, 0.5);
    printf("prefix cache, %zu-token prompt: TTFT cold %.1f ms, warm (same tenant) %.1f ms: %.1fx faster\n",
           n, c50, w50, c50 / w50);
    free(ids);
    engine_destroy(e);
    model_free(m);
    return 0;
}
