/* cmd_run.c — `kvseal run`: one-shot generation through the engine, exactly
 * as `kvseal serve` runs a request (admission, sampler history, stop
 * strings: the same tokens for the same parameters). Only the generated
 * text goes to stdout (streamed as whole UTF-8 characters, stop strings
 * held back until they can be ruled out), so scripts can compare outputs;
 * logs, timings and --logprobs lines go to stderr. */
#include "cli_int.h"

#include "kvseal/engine.h"
#include "kvseal/kern.h"
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
            "                  [--kv-type f32|f16|q8_0] [--logprobs]\n"
            "  --logprobs prints, for each generated token, a stderr line\n"
            "    'logprobs: STEP ID OFFSET LP1 LP2': its id, the byte offset of its text in\n"
            "    the output, and the log-probabilities of the two most likely tokens.\n"
            "  defaults: -n 128, --temp 0.8, --top-k 40, --top-p 0.95, --min-p 0.05, random seed;\n"
            "  --temp 0 is greedy. The model defaults to the shipped kjv-mini.\n");
}

int cli_run(int argc, char **argv) {
    const char *path = cli_default_model(), *prompt = NULL;
    const char *stops[RUN_MAX_STOPS];
    int n_stops = 0;
    long n_predict = 128, threads = 0, ctx = 0;
    bool ignore_eos = false, special = false, seeded = false, logprobs = false;
    sample_params sp;
    sample_params_default(&sp);
    engine_opts od; // the engine's default KV type is the only copy of it
    engine_opts_default(&od);
    int kv_type = od.kv_type;
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
        else if (!strcmp(a, "--kv-type") && v) {
            if (!cli__parse_kv_type(argv[++i], &kv_type)) return 2;
        }
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = true;
        else if (!strcmp(a, "--special")) special = true;
        else if (!strcmp(a, "--logprobs")) logprobs = true;
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
    if (logprobs) sp.n_probs = 2;
    if (!seeded) sp.seed = (uint64_t)time(NULL) ^ ks_now_ns();
    ks_errbuf eb = {0};
    if (sample_params_validate(&sp, &eb)) {
        fprintf(stderr, "kvseal run: %s\n", eb.msg);
        return 2;
    }
    // the engine, as every front end drives it: one request, the same
    // admission, sampler history and stop strings as `kvseal serve`
    model *m = NULL;
    engine *e = NULL;
    engine_req *r = NULL;
    int32_t *toks = NULL;
    size_t n_toks = 0;
    int rc = 1;
    if (kern_init(NULL, &eb) || model_load(path, &m, &eb)) goto fail;
    const model_hparams *hp = model_hp(m);
    engine_opts o;
    engine_opts_default(&o);
    o.m = m;
    o.kv_type = kv_type;
    if (model_kv_type_check(m, kv_type, &eb)) goto fail;
    o.n_threads = threads > 0 ? (int)threads : cli__default_threads();
    o.n_ctx = ctx > 0 ? (int32_t)ctx : hp->n_ctx_train;
    o.kv_pages = (uint32_t)(2 * ((o.n_ctx + o.page_tokens - 1) / o.page_tokens));  // 2x: no sizing warning
    o.max_running = 1;
    o.prefix_cache = false;
    if (tok_encode(model_vocab(m), prompt, strlen(prompt), true, special, &toks, &n_toks, &eb)) goto fail;
    if (n_toks == 0) {
        fprintf(stderr, "kvseal run: the prompt has no tokens\n");
        goto done;
    }
    if ((int64_t)n_toks >= o.n_ctx) {
        fprintf(stderr, "kvseal run: prompt of %zu tokens does not fit the context of %d\n", n_toks, o.n_ctx);
        goto done;
    }
    if (n_predict > o.n_ctx - (int64_t)n_toks) {  // as before: generate until the context is full
        ks_log(KS_LOG_WARN, "context of %d tokens: at most %lld tokens after the prompt", o.n_ctx,
               (long long)(o.n_ctx - (int64_t)n_toks));
        n_predict = o.n_ctx - (int64_t)n_toks;
    }
    if (n_predict == 0) {
        rc = 0;
        goto done;
    }
    if (engine_create(&o, &e, &eb)) goto fail;
    engine_params p = {.tenant = "cli", .prompt = toks, .n_prompt = (int32_t)n_toks,
                       .max_tokens = (int32_t)n_predict, .sp = sp, .stops = stops,
                       .n_stops = n_stops, .ignore_eos = ignore_eos};
    ks_log(KS_LOG_INFO, "prompt: %zu tokens, seed %llu", n_toks, (unsigned long long)sp.seed);
    uint64_t t0 = ks_now_ns();
    if (engine_submit(e, &p, &r, &eb)) goto fail;
    engine_event ev;
    size_t offset = 0; // bytes of the generated tokens' pieces so far
    int step = 0;
    do {
        ks_err ne = engine_req_next(r, &ev, 1000);
        if (ne == KS_ERR_TIMEOUT) continue;
        if (ne) {
            ks_seterr(&eb, ne, "the request's events ended early");
            goto fail;
        }
        if (ev.text_len) {
            fwrite(ev.text, 1, ev.text_len, stdout);
            fflush(stdout);
        }
        if (logprobs && ev.token >= 0) {
            char piece[256];
            fprintf(stderr, "logprobs: %d %d %zu %.6f %.6f\n", step++, ev.token, offset,
                    ev.sr.n_top > 0 ? (double)ev.sr.top_logprobs[0] : 0.0,
                    ev.sr.n_top > 1 ? (double)ev.sr.top_logprobs[1] : -1e30);
            offset += tok_piece(model_vocab(m), ev.token, special, piece, sizeof piece);
        }
    } while (!ev.done);
    uint64_t t2 = ks_now_ns();
    if (ev.state != ENGINE_FINISHED) {
        ks_seterr(&eb, ev.err ? ev.err : KS_ERR_INTERNAL, "%s", ev.errmsg[0] ? ev.errmsg : "the request failed");
        goto fail;
    }
    double pp_ms = ev.ttft_ms, tg_ms = (double)(t2 - t0) / 1e6 - ev.ttft_ms;
    fprintf(stderr, "\nkvseal: prompt %d tokens in %.1f ms (%.1f t/s), generated %d tokens in %.1f ms (%.1f t/s)\n",
            ev.n_prompt, pp_ms, pp_ms > 0 ? ev.n_prompt / (pp_ms / 1e3) : 0.0, ev.n_gen, tg_ms,
            ev.n_gen > 1 && tg_ms > 0 ? (ev.n_gen - 1) / (tg_ms / 1e3) : 0.0);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "kvseal run: %s\n", eb.msg[0] ? eb.msg : "failed");
done:
    engine_req_release(r);
    engine_destroy(e);
    free(toks);
    model_free(m);
    return rc;
}
