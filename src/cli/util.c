/* util.c — shared subcommand plumbing (see cli_int.h), the default model path (cli.h) and
 * the default models directory (cli__models_dir_default: kvseal pull's --dir). */
#include "cli_int.h"

#include "kvseal/kern.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef KS_SOURCE_DIR
#define KS_SOURCE_DIR "."
#endif

const char *cli_default_model(void) {
    const char *e = getenv("KS_MODEL");
    if (e && *e) return e;
    const char *built_in = KS_SOURCE_DIR "/models/kjv-mini.gguf";
    if (access(built_in, R_OK) == 0) return built_in;
    // the source tree moved: look next to the binary (build/kvseal -> models/)
    static char path[4096];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 64);
    if (n > 0) {
        path[n] = '\0';
        char *slash = strrchr(path, '/');
        if (slash) {
            strcpy(slash, "/../models/kjv-mini.gguf");
            if (access(path, R_OK) == 0) return path;
        }
    }
    return built_in;
}

const char *cli__models_dir_default(char *buf, size_t cap) {
    const char *e = getenv("KVSEAL_MODELS_DIR");
    int n;
    if (e && *e)
        n = snprintf(buf, cap, "%s", e);
    else if ((e = getenv("HOME")) && *e)
        n = snprintf(buf, cap, "%s/.cache/kvseal/models", e);
    else
        return NULL;
    return n < 0 || (size_t)n >= cap ? NULL : buf;
}

int cli__default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

bool cli__parse_kv_type(const char *v, int *out) {
    if (kv_type_parse(v, out)) return true;
    fprintf(stderr, "kvseal: --kv-type expects " KV_TYPE_CHOICES ", got '%s'\n", v);
    return false;
}

ks_err cli__session_open(cli__session *s, const char *path, int n_threads, int32_t n_ctx,
                         int32_t n_batch, int kv_type) {
    memset(s, 0, sizeof *s);
    ks_errbuf eb = {0};
    ks_err e = kern_init(NULL, &eb);
    if (e) goto fail;
    if ((e = model_load(path, &s->m, &eb))) goto fail;
    const model_hparams *hp = model_hp(s->m);
    s->n_ctx = n_ctx > 0 ? n_ctx : hp->n_ctx_train;
    s->n_batch = n_batch > 0 ? (n_batch < s->n_ctx ? n_batch : s->n_ctx) : (s->n_ctx < 512 ? s->n_ctx : 512);
    s->n_threads = n_threads > 0 ? n_threads : cli__default_threads();
    s->kv_type = kv_type;
    if ((e = model_kv_type_check(s->m, kv_type, &eb))) goto fail;
    kv_geom g = model_kv_geom(s->m, 16, kv_type);
    // the sequence's KV pages, and its recurrent state's (hybrid models)
    uint32_t pages = (uint32_t)((s->n_ctx + g.page_tokens - 1) / g.page_tokens + g.state_pages);
    if ((e = kv_pool_create(&g, pages, KV_SCRUB_ZERO, &s->pool, &eb))) goto fail;
    kv_seq_init(s->pool, &s->seq);
    if ((e = model_ctx_create(s->m, s->pool, s->n_threads, s->n_batch, s->n_ctx, &s->ctx, &eb))) goto fail;
    ks_log(KS_LOG_INFO,
           "loaded %s: %s, %d layers, n_embd %d, vocab %d, kernels %s, %d threads, kv %s "
           "x %s: %llu bytes/token",
           path, hp->arch_name, hp->n_layer, hp->n_embd, hp->n_vocab, kern_get()->name,
           s->n_threads, kv_type_name(kv_type),
           kv_geom_planes(&g) == 1 ? "1 plane" : "2 planes (K, V)",
           (unsigned long long)(kv_page_bytes(&g) / (uint64_t)g.page_tokens));
    return KS_OK;
fail:
    fprintf(stderr, "kvseal: %s\n", eb.msg[0] ? eb.msg : ks_strerror(e));
    cli__session_close(s);
    return e;
}

ks_err cli__session_lora(cli__session *s, const char *path, double scale) {
    ks_errbuf eb = {0};
    model_lora *l = NULL;
    ks_err e = model_lora_load(s->m, path, &l, &eb);
    if (e) {
        fprintf(stderr, "kvseal: %s\n", eb.msg[0] ? eb.msg : ks_strerror(e));
        return e;
    }
    model_lora_set_scale(l, (float)scale);
    model_lora_free(s->lora);
    s->lora = l;
    ks_log(KS_LOG_INFO, "lora %s: %d matrices, rank %d, scale %g", path, model_lora_n_mats(l),
           model_lora_rank(l), (double)model_lora_scale(l));
    return KS_OK;
}

void cli__session_close(cli__session *s) {
    if (s->pool) kv_seq_release(s->pool, &s->seq);
    model_lora_free(s->lora);
    model_ctx_free(s->ctx);
    kv_pool_destroy(s->pool);
    model_free(s->m);
    memset(s, 0, sizeof *s);
}

ks_err cli__session_eval(cli__session *s, const int32_t *toks, int32_t n, int32_t first_logit,
                         float *logits, float *last_logits, ks_errbuf *eb) {
    const int32_t V = model_hp(s->m)->n_vocab;
    int32_t start = (int32_t)s->seq.n_tokens;
    if (start + n > s->n_ctx)
        return ks_seterr(eb, KS_ERR_INVAL, "%d tokens do not fit: context is %d, %d used", n, s->n_ctx, start);
    ks_err e = kv_seq_reserve(s->pool, &s->seq, (uint32_t)(start + n), eb);
    if (e) return e;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)s->n_batch * 3);
    float *tmp = NULL;
    if (!pos) return ks_seterr(eb, KS_ERR_NOMEM, "batch");
    int32_t *seqi = pos + s->n_batch, *outr = seqi + s->n_batch;
    kv_seq *seqs[1] = {&s->seq};
    const model_lora *loras[1] = {s->lora};
    for (int32_t i0 = 0; i0 < n && !e; i0 += s->n_batch) {
        int32_t nb = n - i0 < s->n_batch ? n - i0 : s->n_batch, n_out = 0;
        int32_t first_out = -1;
        for (int32_t j = 0; j < nb; j++) {
            int32_t i = i0 + j;
            pos[j] = start + i;
            seqi[j] = 0;
            bool want = (logits && i >= first_logit) || (last_logits && i == n - 1);
            outr[j] = want ? n_out++ : -1;
            if (want && first_out < 0) first_out = i;
        }
        // logits rows land directly in the caller's buffer when contiguous
        float *dst = NULL;
        if (n_out) {
            if (logits && first_out >= first_logit) dst = logits + (size_t)(first_out - first_logit) * (size_t)V;
            else {
                free(tmp);
                tmp = malloc(sizeof(float) * (size_t)V * (size_t)n_out);
                if (!tmp) { e = ks_seterr(eb, KS_ERR_NOMEM, "logits"); break; }
                dst = tmp;
            }
        }
        model_batch b = {.n_tokens = nb, .tokens = toks + i0, .pos = pos, .seq = seqi, .out_row = outr,
                         .n_out = n_out, .n_seqs = 1, .seqs = seqs,
                         .lora = s->lora ? loras : NULL};
        e = model_forward(s->ctx, &b, dst, eb);
        if (!e && last_logits && i0 + nb == n)
            memcpy(last_logits, dst + (size_t)(n_out - 1) * (size_t)V, sizeof(float) * (size_t)V);
    }
    free(tmp);
    free(pos);
    return e;
}

bool cli__parse_int(const char *opt, const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "kvseal: %s expects an integer in [%ld, %ld], got '%s'\n", opt, lo, hi, v ? v : "");
        return false;
    }
    *out = x;
    return true;
}

bool cli__parse_float(const char *opt, const char *v, double *out) {
    char *end;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || errno) {
        fprintf(stderr, "kvseal: %s expects a number, got '%s'\n", opt, v ? v : "");
        return false;
    }
    *out = x;
    return true;
}

char *cli__read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "kvseal: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *nb = realloc(buf, cap * 2 + 1);
        if (!nb) { free(buf); buf = NULL; break; }
        buf = nb;
        cap *= 2;
    }
    bool err = ferror(f);
    fclose(f);
    if (!buf || err) {
        fprintf(stderr, "kvseal: %s: read failed\n", path);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}
