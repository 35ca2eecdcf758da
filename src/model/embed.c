/* embed.c — pooling of the final hidden state into embeddings (model.h,
 * "Embeddings"). The forward pass hands out hidden rows
 * (model_forward_hidden); this file pools them in position order and
 * L2-normalizes.
 * The sum runs in double, one row after another in position order, so the
 * result depends only on the rows, never on how the input was chunked or
 * batched (the rows themselves are batch-invariant, model.h). */
#include "model_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

model_pooling model_pooling_default(const model *m) {
    const model_hparams *hp = model_hp(m);
    char key[64];
    snprintf(key, sizeof key, "%s.pooling_type", hp->arch_name);
    uint32_t v = 0;
    ks_errbuf eb;
    if (gguf_get(model_gguf(m), key) && gguf_get_u32(model_gguf(m), key, &v, &eb) == KS_OK &&
        (v == MODEL_POOL_MEAN || v == MODEL_POOL_CLS || v == MODEL_POOL_LAST))
        return (model_pooling)v;
    return MODEL_POOL_MEAN;
}

const char *model_pooling_name(model_pooling p) {
    return p == MODEL_POOL_MEAN ? "mean" : p == MODEL_POOL_CLS ? "cls" : p == MODEL_POOL_LAST ? "last" : NULL;
}

bool model_pooling_parse(const char *s, model_pooling *out) {
    if (!s) return false;
    if (!strcmp(s, "mean"))
        *out = MODEL_POOL_MEAN;
    else if (!strcmp(s, "cls"))
        *out = MODEL_POOL_CLS;
    else if (!strcmp(s, "last"))
        *out = MODEL_POOL_LAST;
    else
        return false;
    return true;
}

void model_embd_begin(model_embd_acc *a, model_pooling p, int32_t n_embd, double *acc) {
    KS_ASSERT(p == MODEL_POOL_MEAN || p == MODEL_POOL_CLS || p == MODEL_POOL_LAST);
    a->pooling = p;
    a->n_embd = n_embd;
    a->n_rows = 0;
    a->acc = acc;
    memset(acc, 0, sizeof(double) * (size_t)n_embd);
}

void model_embd_add(model_embd_acc *a, const float *rows, int32_t n) {
    const size_t E = (size_t)a->n_embd;
    if (n <= 0) return;
    if (a->pooling == MODEL_POOL_CLS) {
        if (a->n_rows == 0)
            for (size_t i = 0; i < E; i++)
                a->acc[i] = (double)rows[i];
    } else if (a->pooling == MODEL_POOL_LAST) {
        const float *r = rows + (size_t)(n - 1) * E;
        for (size_t i = 0; i < E; i++)
            a->acc[i] = (double)r[i];
    } else {
        for (int32_t t = 0; t < n; t++) // position order: the summation order is fixed
            for (size_t i = 0; i < E; i++)
                a->acc[i] += (double)rows[(size_t)t * E + i];
    }
    a->n_rows += n;
}

ks_err model_embd_finish(const model_embd_acc *a, float *out) {
    const size_t E = (size_t)a->n_embd;
    if (a->n_rows < 1) return KS_ERR_INVAL;
    double div = a->pooling == MODEL_POOL_MEAN ? (double)a->n_rows : 1.0;
    double ss = 0.0;
    for (size_t i = 0; i < E; i++) {
        double v = a->acc[i] / div;
        ss += v * v;
    }
    double norm = sqrt(ss);
    for (size_t i = 0; i < E; i++)
        out[i] = norm > 0.0 ? (float)(a->acc[i] / div / norm) : 0.0f;
    return KS_OK;
}
