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

static void run__usage(const char *cmd) {
    (void)cmd;
    fprintf(stderr,
            "usage: kvseal run [-m MODEL] -p PROMPT [-n N] [--temp T] [--seed S] [--top-k K]\n"
            "                  [--top-p P] [--min-p P] [--repeat-penalty R] [--repeat-last-n N]\n"
            "                  [--frequency-penalty F] [--presence-penalty F] [--min-tokens N]\n"
            "                  [--n-probs K] [--stop STR]...\n"
            "                  [--ignore-eos] [--special] [-c CTX] [-t THREADS]\n"
            "                  [--kv-type f32|f16|q8_0] [--logprobs]\n"
            "                  [--lora ADAPTER.gguf [--lora-scale S (1)]]\n"
            "  --lora applies a LoRA adapter (llama.cpp's GGUF; kvseal mklora makes one);\n"
            "    with it the text comes from one sequence outside the engine, without\n"
            "    --stop and --logprobs.\n"
            "  --logprobs prints, for each generated token, a stderr line\n"
            "    'logprobs: STEP ID OFFSET LP1 LP2': its id, the byte offset of its text in\n"
            "    the output, and the log-probabilities of the two most likely tokens.\n"
            "  defaults: -n 128, --temp 0.8, --top-k 40, --top-p 0.95, --min-p 0.05, random seed;\n"
            "  --temp 0 is greedy. The model defaults to the shipped kjv-mini.\n");
}

enum {
    RO_MODEL,
    RO_PROMPT,
    RO_N,
    RO_THREADS,
    RO_CTX,
    RO_SEED,
#define RO__SP_ENUM(f, ...) RO_SP_##f, /* the sampler's options: SAMPLE_PARAM_MAP's cli column */
    SAMPLE_PARAM_MAP(RO__SP_ENUM)
#undef RO__SP_ENUM
    RO_STOP,
    RO_KV_TYPE,
    RO_IGNORE_EOS,
    RO_SPECIAL,
    RO_LOGPROBS,
    RO_LORA,
    RO_LORA_SCALE,
    RO__N
};
static const cli__opt run__opts[RO__N] = {
    [RO_MODEL] = {"model", 'm', true, false},
    [RO_PROMPT] = {"prompt", 'p', true, false},
    [RO_N] = {"n-predict", 'n', true, false},
    [RO_THREADS] = {"threads", 't', true, false},
    [RO_CTX] = {"ctx", 'c', true, false},
    [RO_SEED] = {"seed", 0, true, false},
#define RO__SP_OPT(f, T, key, alias, def, off, lo, lo_open, hi, what, jhi, wire, cli, ...)         \
    [RO_SP_##f] = {cli, 0, true, false},
    SAMPLE_PARAM_MAP(RO__SP_OPT)
#undef RO__SP_OPT
    [RO_STOP] = {"stop", 0, true, true},
    [RO_KV_TYPE] = {"kv-type", 0, true, false},
    [RO_IGNORE_EOS] = {"ignore-eos", 0, false, false},
    [RO_SPECIAL] = {"special", 0, false, false},
    [RO_LOGPROBS] = {"logprobs", 0, false, false},
    [RO_LORA] = {"lora", 0, true, false},
    [RO_LORA_SCALE] = {"lora-scale", 0, true, false},
};

typedef struct {
    const char *path, *prompt, *lora;
    double lora_scale;
    const char *stops[RUN_MAX_STOPS];
    int n_stops;
    long n_predict, threads, ctx;
    bool ignore_eos, special, seeded, logprobs;
    sample_params sp;
    int kv_type;
} run__cfg;

static int run__apply(void *ctx, int id, const char *v, bool reset) {
    run__cfg *c = ctx;
    long lv;
    double dv;
    char name[32];
    snprintf(name, sizeof name, "--%s", run__opts[id].name);
    switch (id) {
    case RO_MODEL:
        c->path = v;
        return 0;
    case RO_PROMPT:
        c->prompt = v;
        return 0;
    case RO_N:
        return cli__parse_int("-n", v, 0, 1 << 24, &c->n_predict) ? 0 : 2;
    case RO_THREADS:
        return cli__parse_int("-t", v, 1, 256, &c->threads) ? 0 : 2;
    case RO_CTX:
        return cli__parse_int("-c", v, 1, 1 << 24, &c->ctx) ? 0 : 2;
    case RO_SEED: {
        char *end;
        c->sp.seed = strtoull(v, &end, 10);
        if (*end || !*v) {
            fprintf(stderr, "kvseal: --seed expects an integer\n");
            return 2;
        }
        c->seeded = true;
        return 0;
    }
    // the sampler's: floats as given (sample_params_validate checks them
    // later), integers in [lo, jhi] of SAMPLE_PARAM_MAP
#define RO__SP_APPLY(f, T, key, alias, def, off, lo, lo_open, hi, what, jhi, ...)                  \
    case RO_SP_##f:                                                                                \
        if (T == SAMPLE_F32) {                                                                     \
            if (!cli__parse_float(name, v, &dv)) return 2;                                         \
            c->sp.f = (SAMPLE_CTYPE_##T)dv;                                                        \
        } else {                                                                                   \
            if (!cli__parse_int(name, v, (long)(lo), (long)(jhi), &lv)) return 2;                  \
            c->sp.f = (SAMPLE_CTYPE_##T)lv;                                                        \
        }                                                                                          \
        return 0;
        SAMPLE_PARAM_MAP(RO__SP_APPLY)
#undef RO__SP_APPLY
    case RO_STOP:
        if (reset) c->n_stops = 0;
        if (c->n_stops == RUN_MAX_STOPS) {
            fprintf(stderr, "kvseal: at most %d --stop strings\n", RUN_MAX_STOPS);
            return 2;
        }
        c->stops[c->n_stops++] = v;
        return 0;
    case RO_KV_TYPE:
        return cli__parse_kv_type(v, &c->kv_type) ? 0 : 2;
    case RO_IGNORE_EOS:
        c->ignore_eos = !strcmp(v, "true");
        return 0;
    case RO_SPECIAL:
        c->special = !strcmp(v, "true");
        return 0;
    case RO_LOGPROBS:
        c->logprobs = !strcmp(v, "true");
        return 0;
    case RO_LORA:
        c->lora = v;
        return 0;
    case RO_LORA_SCALE:
        return cli__parse_float("--lora-scale", v, &c->lora_scale) ? 0 : 2;
    }
    return 2;
}

/* `run --lora`: one sequence through a session (the engine runs no
 * adapters yet): the prompt, then n_predict tokens from the sampler with the
 * prompt in its history (llama.cpp's), until an end-of-generation token. */
static int run__lora(const run__cfg *cf, const sample_params *sp) {
    cli__session s;
    ks_errbuf eb = {0};
    sampler *smp = NULL;
    int32_t *toks = NULL;
    float *logits = NULL;
    size_t n_toks = 0;
    int rc = 1;
    if (cli__session_open(&s, cf->path, (int)cf->threads, (int32_t)cf->ctx, 0, cf->kv_type)) return 1;
    if (cli__session_lora(&s, cf->lora, cf->lora_scale)) goto done;
    const tok_vocab *vocab = model_vocab(s.m);
    const int32_t V = model_hp(s.m)->n_vocab;
    if (tok_encode(vocab, cf->prompt, strlen(cf->prompt), true, cf->special, &toks, &n_toks, &eb))
        goto fail;
    if (n_toks == 0 || (int64_t)n_toks >= s.n_ctx) {
        fprintf(stderr, "kvseal run: a prompt of %zu tokens does not fit the context of %d\n",
                n_toks, s.n_ctx);
        goto done;
    }
    long n_predict = cf->n_predict;
    if (n_predict > s.n_ctx - (int64_t)n_toks) n_predict = s.n_ctx - (int64_t)n_toks;
    if (!(logits = malloc(sizeof(float) * (size_t)V))) {
        ks_seterr(&eb, KS_ERR_NOMEM, "logits");
        goto fail;
    }
    if (sampler_create(sp, V, &smp, &eb)) goto fail;
    sampler_accept_n(smp, toks, (int64_t)n_toks);
    const uint64_t t0 = ks_now_ns();
    if (cli__session_eval(&s, toks, (int32_t)n_toks, 0, NULL, logits, &eb)) goto fail;
    const uint64_t t1 = ks_now_ns();
    int n_gen = 0;
    for (; n_gen < n_predict; n_gen++) {
        sample_result r;
        sampler_sample(smp, logits, &r);
        if (!cf->ignore_eos && tok_is_eog(vocab, r.token)) break;
        char piece[256];
        const size_t n = tok_piece(vocab, r.token, cf->special, piece, sizeof piece);
        fwrite(piece, 1, n < sizeof piece ? n : sizeof piece, stdout);
        fflush(stdout);
        sampler_accept(smp, r.token);
        if (n_gen + 1 < n_predict &&
            cli__session_eval(&s, &r.token, 1, 0, NULL, logits, &eb))
            goto fail;
    }
    const double pp_ms = (double)(t1 - t0) / 1e6, tg_ms = (double)(ks_now_ns() - t1) / 1e6;
    fprintf(stderr, "\nkvseal: prompt %zu tokens in %.1f ms (%.1f t/s), generated %d tokens in "
            "%.1f ms (%.1f t/s)\n", n_toks, pp_ms, pp_ms > 0 ? (double)n_toks / (pp_ms / 1e3) : 0.0,
            n_gen, tg_ms, n_gen > 1 && tg_ms > 0 ? (n_gen - 1) / (tg_ms / 1e3) : 0.0);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "kvseal run: %s\n", eb.msg[0] ? eb.msg : "failed");
done:
    sampler_destroy(smp);
    free(logits);
    free(toks);
    cli__session_close(&s);
    return rc;
}

int cli_run(int argc, char **argv) {
    run__cfg rcf = {.path = cli_default_model(), .n_predict = 128, .lora_scale = 1};
    sample_params_default(&rcf.sp);
    engine_opts od; // the engine's default KV type is the only copy of it
    engine_opts_default(&od);
    rcf.kv_type = od.kv_type;
    const cli__spec spec = {"run", run__opts, RO__N, run__apply, run__usage, false, false};
    int prc = cli__opts_parse(&spec, &rcf, argc, argv, NULL);
    if (prc) return prc < 0 ? 0 : prc;
    const char *path = rcf.path, *prompt = rcf.prompt;
    const char **stops = rcf.stops;
    int n_stops = rcf.n_stops;
    long n_predict = rcf.n_predict, threads = rcf.threads, ctx = rcf.ctx;
    bool ignore_eos = rcf.ignore_eos, special = rcf.special, seeded = rcf.seeded,
         logprobs = rcf.logprobs;
    sample_params sp = rcf.sp;
    int kv_type = rcf.kv_type;
    if (!prompt) {
        fprintf(stderr, "kvseal run: -p PROMPT is required\n");
        run__usage("run");
        return 2;
    }
    if (sp.temperature < 0) sp.temperature = 0;
    if (logprobs && sp.n_probs < 2) sp.n_probs = 2;
    if (!seeded) sp.seed = (uint64_t)time(NULL) ^ ks_now_ns();
    ks_errbuf eb = {0};
    if (sample_params_validate(&sp, &eb)) {
        fprintf(stderr, "kvseal run: %s\n", eb.msg);
        return 2;
    }
    if (rcf.lora) {
        if (n_stops || logprobs) {
            fprintf(stderr, "kvseal run: --stop and --logprobs are not available with --lora yet\n");
            return 2;
        }
        return run__lora(&rcf, &sp);
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
