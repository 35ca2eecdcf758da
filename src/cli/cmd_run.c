/* cmd_run.c — `kvseal run`: one-shot generation. Only the generated text
 * goes to stdout (streamed as whole UTF-8 characters, stop strings held
 * back until they can be ruled out), so scripts can compare outputs; logs
 * and timings go to stderr. */
#include "cli_int.h"

#include "kvseal/sample.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RUN_MAX_STOPS 16

static void run__usage(void) {
    fprintf(stderr,
            "usage: kvseal run [-m MODEL] -p PROMPT [-n N] [--temp T] [--seed S] [--top-k K]\n"
            "                  [--top-p P] [--min-p P] [--repeat-penalty R] [--repeat-last-n N]\n"
            "                  [--frequency-penalty F] [--presence-penalty F] [--stop STR]...\n"
            "                  [--ignore-eos] [--special] [-c CTX] [-t THREADS]\n"
            "  defaults: -n 128, --temp 0.8, --top-k 40, --top-p 0.95, --min-p 0.05, random seed;\n"
            "  --temp 0 is greedy. The model defaults to the shipped kjv-mini.\n");
}

/* Writes what the stop matcher allows; returns true when a stop matched. */
static bool run__emit(const stop_result *r) {
    if (r->len) {
        fwrite(r->text, 1, r->len, stdout);
        fflush(stdout);
    }
    return r->matched;
}

int cli_run(int argc, char **argv) {
    const char *path = cli_default_model(), *prompt = NULL;
    const char *stops[RUN_MAX_STOPS];
    int n_stops = 0;
    long n_predict = 128, threads = 0, ctx = 0;
    bool ignore_eos = false, special = false, seeded = false;
    sample_params sp;
    sample_params_default(&sp);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long lv;
        double dv;
#define FLOATOPT(name, field)                                                  \
    else if (!strcmp(a, name) && v) {                                          \
        if (!cli__parse_float(name, argv[++i], &dv)) return 2;                 \
        sp.field = (float)dv;                                                  \
    }
        if (!strcmp(a, "-m") && v) path = argv[++i];
        else if (!strcmp(a, "-p") && v) prompt = argv[++i];
        else if (!strcmp(a, "-n") && v) { if (!cli__parse_int("-n", argv[++i], 0, 1 << 24, &n_predict)) return 2; }
        else if (!strcmp(a, "-t") && v) { if (!cli__parse_int("-t", argv[++i], 1, 256, &threads)) return 2; }
        else if (!strcmp(a, "-c") && v) { if (!cli__parse_int("-c", argv[++i], 1, 1 << 24, &ctx)) return 2; }
        else if (!strcmp(a, "--seed") && v) {
            char *end;
            sp.seed = strtoull(argv[++i], &end, 10);
            if (*end || !*argv[i]) { fprintf(stderr, "kvseal: --seed expects an integer\n"); return 2; }
            seeded = true;
        }
        else if (!strcmp(a, "--top-k") && v) { if (!cli__parse_int("--top-k", argv[++i], -1, 1 << 30, &lv)) return 2; sp.top_k = (int32_t)lv; }
        else if (!strcmp(a, "--repeat-last-n") && v) { if (!cli__parse_int("--repeat-last-n", argv[++i], 0, SAMPLE_MAX_LAST_N, &lv)) return 2; sp.repeat_last_n = (int32_t)lv; }
        FLOATOPT("--temp", temperature)
        FLOATOPT("--top-p", top_p)
        FLOATOPT("--min-p", min_p)
        FLOATOPT("--repeat-penalty", repeat_penalty)
        FLOATOPT("--frequency-penalty", frequency_penalty)
        FLOATOPT("--presence-penalty", presence_penalty)
        else if (!strcmp(a, "--stop") && v) {
            if (n_stops == RUN_MAX_STOPS) { fprintf(stderr, "kvseal: at most %d --stop strings\n", RUN_MAX_STOPS); return 2; }
            stops[n_stops++] = argv[++i];
        }
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = true;
        else if (!strcmp(a, "--special")) special = true;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { run__usage(); return 0; }
        else { run__usage(); return 2; }
#undef FLOATOPT
    }
    if (!prompt) {
        fprintf(stderr, "kvseal run: -p PROMPT is required\n");
        run__usage();
        return 2;
    }
    if (sp.temperature < 0) sp.temperature = 0;
    if (!seeded) sp.seed = (uint64_t)time(NULL) ^ ks_now_ns();
    ks_errbuf eb = {0};
    if (sample_params_validate(&sp, &eb)) {
        fprintf(stderr, "kvseal run: %s\n", eb.msg);
        return 2;
    }
    cli__session s;
    if (cli__session_open(&s, path, (int)threads, (int32_t)ctx, 0)) return 1;
    const tok_vocab *vocab = model_vocab(s.m);
    const int32_t V = model_hp(s.m)->n_vocab;
    int32_t *toks = NULL;
    size_t n_toks = 0;
    float *logits = malloc(sizeof(float) * (size_t)V);
    size_t cap = tok_stream_bound(vocab);
    char *piece = malloc(cap);
    sampler *smp = NULL;
    stop_matcher *stop = NULL;
    int rc = 1;
    if (!logits || !piece) goto done;
    if (tok_encode(vocab, prompt, strlen(prompt), true, special, &toks, &n_toks, &eb)) goto fail;
    if (n_toks == 0) {
        fprintf(stderr, "kvseal run: the prompt has no tokens\n");
        goto done;
    }
    if ((int64_t)n_toks >= s.n_ctx) {
        fprintf(stderr, "kvseal run: prompt of %zu tokens does not fit the context of %d\n", n_toks, s.n_ctx);
        goto done;
    }
    if (sampler_create(&sp, V, &smp, &eb) || stop_matcher_create(stops, n_stops, &stop, &eb)) goto fail;
    sampler_accept_n(smp, toks, (int64_t)n_toks);
    ks_log(KS_LOG_INFO, "prompt: %zu tokens, seed %llu", n_toks, (unsigned long long)sp.seed);
    uint64_t t0 = ks_now_ns();
    if (cli__session_eval(&s, toks, (int32_t)n_toks, 0, NULL, logits, &eb)) goto fail;
    uint64_t t1 = ks_now_ns();
    tok_stream ts;
    tok_stream_init(&ts);
    stop_result sr;
    long n_gen = 0;
    bool stopped = false;
    for (; n_gen < n_predict && !stopped; n_gen++) {
        sample_result r;
        sampler_sample(smp, logits, &r);
        if (!ignore_eos && tok_is_eog(vocab, r.token)) break;
        sampler_accept(smp, r.token);
        size_t n = tok_stream_push(&ts, vocab, r.token, piece, cap);
        if (stop_matcher_push(stop, piece, n, &sr)) goto fail;
        stopped = run__emit(&sr);
        if (stopped || n_gen + 1 == n_predict) { n_gen++; break; }
        if ((int32_t)s.seq.n_tokens >= s.n_ctx) {
            ks_log(KS_LOG_WARN, "context of %d tokens is full; stopping", s.n_ctx);
            n_gen++;
            break;
        }
        if (cli__session_eval(&s, &r.token, 1, 0, NULL, logits, &eb)) goto fail;
    }
    if (!stopped) {
        size_t n = tok_stream_flush(&ts, piece, cap);
        if (stop_matcher_push(stop, piece, n, &sr)) goto fail;
        if (!run__emit(&sr)) {
            stop_matcher_flush(stop, &sr);
            run__emit(&sr);
        }
    }
    fflush(stdout);
    uint64_t t2 = ks_now_ns();
    fprintf(stderr, "\nkvseal: prompt %zu tokens in %.1f ms (%.1f t/s), generated %ld tokens in %.1f ms (%.1f t/s)\n",
            n_toks, (double)(t1 - t0) / 1e6, (double)n_toks / ((double)(t1 - t0) / 1e9), n_gen,
            (double)(t2 - t1) / 1e6, n_gen ? (double)n_gen / ((double)(t2 - t1) / 1e9) : 0.0);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "kvseal run: %s\n", eb.msg[0] ? eb.msg : "failed");
done:
    stop_matcher_destroy(stop);
    sampler_destroy(smp);
    free(piece);
    free(logits);
    free(toks);
    cli__session_close(&s);
    return rc;
}
