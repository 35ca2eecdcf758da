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

/* Adds -log softmax(logits)[target] (double precision) to *nll. */
static void ppl__score(const float *logits, int32_t V, int32_t target, double *nll) {
    float mx = logits[0];
    for (int32_t i = 1; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0.0;
    for (int32_t i = 0; i < V; i++) sum += exp((double)logits[i] - (double)mx);
    *nll += log(sum) - ((double)logits[target] - (double)mx);
}

int cli_perplexity(int argc, char **argv) {
    const char *path = cli_default_model(), *file = NULL;
    long ctx = 512, threads = 0, batch = 0;
    engine_opts d; // the engine's default KV type is the only copy of it
    engine_opts_default(&d);
    int kv_type = d.kv_type;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-m") && v) path = argv[++i];
        else if (!strcmp(a, "-f") && v) file = argv[++i];
        else if (!strcmp(a, "-c") && v) { if (!cli__parse_int("-c", argv[++i], 8, 1 << 20, &ctx)) return 2; }
        else if (!strcmp(a, "-t") && v) { if (!cli__parse_int("-t", argv[++i], 1, 256, &threads)) return 2; }
        else if (!strcmp(a, "-b") && v) { if (!cli__parse_int("-b", argv[++i], 1, 1 << 20, &batch)) return 2;
        } else if (!strcmp(a, "--kv-type") && v) {
            if (!cli__parse_kv_type(argv[++i], &kv_type)) return 2;
        } else {
            fprintf(
                stderr,
                "usage: kvseal perplexity [-m MODEL] -f TEXTFILE [-c CTX] [-t THREADS] [-b BATCH]\n"
                "                         [--kv-type f32|f16|q8_0 (f16)]\n");
            return 2;
        }
    }
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
    double nll = 0.0;
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
            ppl__score(logits + (size_t)j * (size_t)V, V, chunk[first + j + 1], &nll);
        fprintf(stderr, "[%zu] %.4f\n", ci + 1, exp(nll / (double)count));
    }
    free(chunk);
    double secs = (double)(ks_now_ns() - t0) / 1e9;
    fprintf(stderr, "kvseal: %.2f s, %.1f tokens/s\n", secs, (double)(n_chunk * (size_t)C) / secs);
    printf("perplexity: %.4f\n", exp(nll / (double)count));
    rc = 0;
done:
    free(logits);
    free(toks);
    free(text);
    cli__session_close(&s);
    return rc;
}
