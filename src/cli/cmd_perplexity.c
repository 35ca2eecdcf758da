/* cmd_perplexity.c — `kvseal perplexity`: perplexity over non-overlapping
 * windows, exactly as defined in models/kjv-mini.README.md ("Perplexity, as
 * defined here"), which is the definition llama.cpp's perplexity tool uses:
 * tokenize the whole file (BOS if the model adds it), cut n_chunk =
 * floor(n/CTX) chunks, put BOS first in each, evaluate each from an empty KV
 * cache, and score positions first+1 .. CTX-1 with first = CTX/2. */
#include "cli_int.h"

#include "kvseal/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Adds -log softmax(logits)[target] (double precision) to *nll and its
 * square to *nll2. */
static void ppl__score(const float *logits, int32_t V, int32_t target, double *nll, double *nll2) {
    float mx = logits[0];
    for (int32_t i = 1; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0.0;
    for (int32_t i = 0; i < V; i++) sum += exp((double)logits[i] - (double)mx);
    double x = log(sum) - ((double)logits[target] - (double)mx);
    *nll += x;
    *nll2 += x * x;
}

enum { PO_MODEL, PO_FILE, PO_CTX, PO_THREADS, PO_BATCH, PO_KV_TYPE, PO_LORA, PO_LORA_SCALE, PO__N };
static const cli__opt ppl__opts[PO__N] = {
    [PO_MODEL] = {"model", 'm', true, false}, [PO_FILE] = {"file", 'f', true, false},
    [PO_CTX] = {"ctx", 'c', true, false},     [PO_THREADS] = {"threads", 't', true, false},
    [PO_BATCH] = {"batch", 'b', true, false}, [PO_KV_TYPE] = {"kv-type", 0, true, false},
    [PO_LORA] = {"lora", 0, true, false},     [PO_LORA_SCALE] = {"lora-scale", 0, true, false},
};

typedef struct {
    const char *path, *file, *lora;
    double lora_scale;
    long ctx, threads, batch;
    int kv_type;
} ppl__cfg;

static void ppl__usage(const char *cmd) {
    (void)cmd;
    fprintf(
        stderr,
        "usage: kvseal perplexity [-m MODEL] -f TEXTFILE [-c CTX (512)] [-t THREADS] [-b BATCH]\n"
        "                         [--kv-type f32|f16|q8_0 (f16)] [--log-format text|json]\n"
        "                         [--lora ADAPTER.gguf [--lora-scale S (1)]]\n"
        "  prints 'perplexity: P' and, last, 'Final estimate: PPL = P +/- E' as llama.cpp's\n"
        "  llama-perplexity does (E: the standard error of the mean NLL, times P)\n");
}

static int ppl__apply(void *ctx, int id, const char *v, bool reset) {
    ppl__cfg *c = ctx;
    (void)reset;
    switch (id) {
    case PO_MODEL:
        c->path = v;
        return 0;
    case PO_FILE:
        c->file = v;
        return 0;
    case PO_CTX:
        return cli__parse_int("-c", v, 8, 1 << 20, &c->ctx) ? 0 : 2;
    case PO_THREADS:
        return cli__parse_int("-t", v, 1, 256, &c->threads) ? 0 : 2;
    case PO_BATCH:
        return cli__parse_int("-b", v, 1, 1 << 20, &c->batch) ? 0 : 2;
    case PO_KV_TYPE:
        return cli__parse_kv_type(v, &c->kv_type) ? 0 : 2;
    case PO_LORA:
        c->lora = v;
        return 0;
    case PO_LORA_SCALE:
        return cli__parse_float("--lora-scale", v, &c->lora_scale) ? 0 : 2;
    }
    return 2;
}

/* With mean m and mean square q of the count per-token NLLs, the standard
 * error of m is se = sqrt((q - m^2) / (count - 1)), and to first order
 * (d exp(m) = exp(m) dm) PPL = exp(m) +/- se * exp(m): llama.cpp's "+/-". */
double cli__ppl_stderr(double nll, double nll2, long count) {
    if (count < 2) return -1;
    double m = nll / (double)count, var = nll2 / (double)count - m * m;
    if (!(var > 0)) return -1;
    return sqrt(var / (double)(count - 1)) * exp(m);
}

int cli_perplexity(int argc, char **argv) {
    engine_opts d; // the engine's default KV type is the only copy of it
    engine_opts_default(&d);
    ppl__cfg cf = {.path = cli_default_model(), .ctx = 512, .kv_type = d.kv_type, .lora_scale = 1};
    const cli__spec sp = {"perplexity", ppl__opts, PO__N, ppl__apply, ppl__usage, false, false};
    int prc = cli__opts_parse(&sp, &cf, argc, argv, NULL);
    if (prc) return prc < 0 ? 0 : prc;
    const char *path = cf.path, *file = cf.file;
    long ctx = cf.ctx, threads = cf.threads, batch = cf.batch;
    int kv_type = cf.kv_type;
    if (!file) {
        fprintf(stderr, "kvseal perplexity: -f TEXTFILE is required\n");
        return 2;
    }
    size_t len;
    char *text = cli__read_file(file, &len);
    if (!text) return 1;
    cli__session s;
    if (cli__session_open(&s, path, (int)threads, (int32_t)ctx,
                          batch ? (int32_t)batch : (int32_t)ctx, kv_type)) {
        free(text);
        return 1;
    }
    if (cf.lora && cli__session_lora(&s, cf.lora, cf.lora_scale)) {
        cli__session_close(&s);
        free(text);
        return 1;
    }
    const tok_vocab *vocab = model_vocab(s.m);
    const int32_t V = model_hp(s.m)->n_vocab, C = (int32_t)ctx, first = C / 2;
    ks_errbuf eb = {0};
    int32_t *toks = NULL;
    size_t n_toks = 0;
    int rc = 1;
    float *logits = NULL;
    ks_err e = tok_encode(vocab, text, len, true, false, &toks, &n_toks, &eb);
    if (e) {
        fprintf(stderr, "kvseal: %s: %s\n", file, eb.msg);
        goto done;
    }
    if (n_toks < 2 * (size_t)C) {
        fprintf(stderr, "kvseal: %s: %zu tokens, need at least 2*%d\n", file, n_toks, C);
        goto done;
    }
    const size_t n_chunk = n_toks / (size_t)C;
    fprintf(stderr, "kvseal: %zu tokens, %zu chunks of %d, scoring %d per chunk\n", n_toks, n_chunk, C,
            C - 1 - first);
    logits = malloc(sizeof(float) * (size_t)V * (size_t)(C - first));
    int32_t *chunk = malloc(sizeof(int32_t) * (size_t)C);
    if (!logits || !chunk) {
        free(chunk);
        fprintf(stderr, "kvseal: out of memory\n");
        goto done;
    }
    double nll = 0.0, nll2 = 0.0;
    long count = 0;
    uint64_t t0 = ks_now_ns();
    for (size_t ci = 0; ci < n_chunk; ci++) {
        memcpy(chunk, toks + ci * (size_t)C, sizeof(int32_t) * (size_t)C);
        if (tok_add_bos(vocab)) chunk[0] = tok_bos(vocab);
        kv_seq_release(s.pool, &s.seq);  // each chunk starts from an empty cache
        if ((e = cli__session_eval(&s, chunk, C, first, logits, NULL, &eb))) {
            fprintf(stderr, "kvseal: chunk %zu: %s\n", ci, eb.msg);
            free(chunk);
            goto done;
        }
        // logits row j is position first+j and predicts token first+j+1
        for (int32_t j = 0; j + first < C - 1; j++, count++)
            ppl__score(logits + (size_t)j * (size_t)V, V, chunk[first + j + 1], &nll, &nll2);
        fprintf(stderr, "[%zu] %.4f\n", ci + 1, exp(nll / (double)count));
    }
    free(chunk);
    double secs = (double)(ks_now_ns() - t0) / 1e9;
    fprintf(stderr, "kvseal: %.2f s, %.1f tokens/s\n", secs, (double)(n_chunk * (size_t)C) / secs);
    printf("perplexity: %.4f\n", exp(nll / (double)count));
    double se = cli__ppl_stderr(nll, nll2, count);
    if (se > 0)
        printf("Final estimate: PPL = %.4f +/- %.5f\n", exp(nll / (double)count), se);
    else
        printf("Unexpected negative standard deviation of log(prob)\n");
    rc = 0;
done:
    free(logits);
    free(toks);
    free(text);
    cli__session_close(&s);
    return rc;
}
