/* bert.c — the BERT encoders (model_hparams.encoder), as llama.cpp's
 * LLM_ARCH_BERT graph computes them (nomic-bert's differences in brackets):
 *
 *   x = LayerNorm(token_embd[tok] + token_types[0] + position_embd[pos])
 *                                      [no position_embd: RoPE on q, k]
 *   per layer:
 *     q, k, v = x Wq + bq, x Wk + bk, x Wv + bv   [no biases; NEOX RoPE]
 *     a = softmax(q k^T / sqrt(D)) v   per head, over every position of the
 *                                      token's own sequence (no causal mask)
 *     x = LayerNorm(x + a Wo + bo)                 (attn_output_norm)
 *     x = LayerNorm(x + gelu(x Wup + bup) Wdown + bdown)  (layer_output_norm)
 *                                      [silu(x Wgate) * (x Wup), no biases]
 *
 * The hidden rows handed out are the last layer's x (no output norm, no LM
 * head). Keys and values are never stored: a sequence is encoded whole in
 * one pass, so its K/V rows are this pass's k, v, and no page is read or
 * written (the pages the engine reserved for the input stay as reserved).
 * The engine gives an encoder every input whole (engine.c); a batch with a
 * sequence that does not start at position 0 is refused here. */
#include "model_int.h"

#include <math.h>
#include <string.h>

typedef enum {
    BERT_EMBED,    // x[t] = LN(token + type 0 + position rows)
    BERT_QKV_BIAS, // q[t] += bq, k[t] += bk, v[t] += bv; RoPE on q[t], k[t] (nomic-bert)
    BERT_ATTN,     // att[t] = every head's attention over t's sequence
    BERT_ADD_LN1,  // x[t] = LN(x[t] + tmp[t] + bo) with attn_output_norm
    BERT_GELU,     // g[t] = gelu(g[t] + bup); nomic-bert: g[t] = silu(g[t]) * u[t]
    BERT_ADD_LN2,  // x[t] = LN(x[t] + tmp[t] + bdown) with layer_output_norm
} bert__op;

typedef struct {
    model_ctx *c;
    const model_batch *b;
    const model__layer *L;
    bert__op op;
    atomic_llong next; // next token to claim
} bert__run;

/* x = (x + a + bias - mean) / sqrt(var + eps) * w + wb over n floats (a or
 * bias NULL: none), sums in double. */
static void bert__add_ln(int64_t n, float *x, const float *a, const float *bias, const float *w,
                         const float *wb, float eps) {
    double sum = 0.0, sq = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (a) x[i] += a[i];
        if (bias) x[i] += bias[i];
        sum += x[i];
    }
    const float mean = (float)(sum / (double)n);
    for (int64_t i = 0; i < n; i++) {
        x[i] -= mean;
        sq += (double)x[i] * x[i];
    }
    const float scale = 1.0f / sqrtf((float)(sq / (double)n) + eps);
    for (int64_t i = 0; i < n; i++)
        x[i] = x[i] * scale * w[i] + wb[i];
}

/* Token t's attention, every head: rows of q, k, v are (H*D) floats, head h
 * at h*D; the keys are the tokens ord[o0..o1) of t's sequence. sc is
 * (o1 - o0) floats of scratch. */
static void bert__attn(model_ctx *c, int t, int32_t o0, int32_t o1, float *sc) {
    const model_hparams *hp = &c->m->hp;
    const int H = hp->n_head, D = hp->head_dim;
    const size_t HD = (size_t)H * (size_t)D;
    const float scale = hp->attn_scale;
    for (int h = 0; h < H; h++) {
        const float *q = c->q + (size_t)t * HD + (size_t)h * (size_t)D;
        float mx = -INFINITY;
        for (int32_t j = o0; j < o1; j++) {
            const float *k = c->k + (size_t)c->ord[j] * HD + (size_t)h * (size_t)D;
            float s = c->kv->dot_f32(D, q, k) * scale;
            sc[j - o0] = s;
            if (s > mx) mx = s;
        }
        double sum = 0.0;
        for (int32_t j = o0; j < o1; j++) {
            sc[j - o0] = expf(sc[j - o0] - mx);
            sum += sc[j - o0];
        }
        float *o = c->att + (size_t)t * HD + (size_t)h * (size_t)D;
        memset(o, 0, sizeof(float) * (size_t)D);
        const float inv = (float)(1.0 / sum);
        for (int32_t j = o0; j < o1; j++) { // in position order: the sum's order is fixed
            const float *v = c->v + (size_t)c->ord[j] * HD + (size_t)h * (size_t)D;
            const float p = sc[j - o0] * inv;
            for (int d = 0; d < D; d++)
                o[d] += p * v[d];
        }
    }
}

static void bert__task(void *arg, int ith, int nth) {
    (void)nth;
    bert__run *a = arg;
    model_ctx *c = a->c;
    const model *m = c->m;
    const model_hparams *hp = &m->hp;
    const model__layer *L = a->L;
    const int64_t E = hp->n_embd, F = hp->n_ff, HD = (int64_t)hp->n_head * hp->head_dim;
    const float eps = hp->norm_eps;
    int64_t t0, t1;
    while (ks_pool_claim(&a->next, a->b->n_tokens, 1, &t0, &t1)) {
        const int t = (int)t0;
        float *x = c->x + (size_t)t * (size_t)E, *tmp = c->tmp + (size_t)t * (size_t)E;
        switch (a->op) {
        case BERT_EMBED: { // (token + type 0) + position, in llama.cpp's order
            const model__mat *w = &m->tok_embd, *p = &m->pos_embd, *ty = &m->type_embd;
            kern_dequantize_row(
                w->type, (const char *)w->data + (size_t)a->b->tokens[t] * w->row_bytes, x, E);
            kern_dequantize_row(ty->type, ty->data, tmp, E);
            for (int64_t i = 0; i < E; i++)
                x[i] += tmp[i];
            if (p->data) // bert's learned positions (nomic-bert turns q, k instead)
                kern_dequantize_row(
                    p->type, (const char *)p->data + (size_t)a->b->pos[t] * p->row_bytes, tmp, E);
            bert__add_ln(E, x, p->data ? tmp : NULL, NULL, m->embd_norm, m->embd_norm_b, eps);
            break;
        }
        case BERT_QKV_BIAS: {
            float *q = c->q + (size_t)t * (size_t)HD, *k = c->k + (size_t)t * (size_t)HD,
                  *v = c->v + (size_t)t * (size_t)HD;
            for (int64_t i = 0; L->bq && i < HD; i++) {
                q[i] += L->bq[i];
                k[i] += L->bk[i];
                v[i] += L->bv[i];
            }
            if (hp->n_rot > 0) { // every head of q and k, one angle table per position
                float cs[MODEL_MAX_HEAD_DIM];
                const kern_rope_cfg rc = {.n_rot = hp->n_rot,
                                          .freq_base = hp->rope_base,
                                          .freq_scale = hp->rope_scale,
                                          .ext_factor = hp->rope_ext_factor,
                                          .attn_factor = hp->rope_attn_factor,
                                          .corr_lo = hp->rope_corr[0],
                                          .corr_hi = hp->rope_corr[1]};
                kern_rope_table_cfg(cs, &rc, a->b->pos[t]);
                for (int h = 0; h < hp->n_head; h++) {
                    kern_rope_apply(q + (size_t)h * (size_t)hp->head_dim, hp->n_rot, cs, true);
                    kern_rope_apply(k + (size_t)h * (size_t)hp->head_dim, hp->n_rot, cs, true);
                }
            }
            break;
        }
        case BERT_ATTN: {
            const int s = a->b->seq[t];
            float *sc = c->scores + (size_t)ith * (size_t)c->max_ctx;
            bert__attn(c, t, c->ord_off[s], c->ord_off[s + 1], sc);
            break;
        }
        case BERT_ADD_LN1:
            bert__add_ln(E, x, tmp, L->bo, L->ln_attn, L->ln_attn_b, eps);
            break;
        case BERT_GELU: {
            float *g = c->g + (size_t)t * (size_t)F;
            if (L->w_gate.data) { // nomic-bert's SwiGLU
                c->kv->silu_mul(F, g, c->u + (size_t)t * (size_t)F, g);
                break;
            }
            for (int64_t i = 0; i < F; i++) { // the tanh approximation, as ggml_gelu
                const float z = g[i] + L->b_up[i];
                g[i] =
                    0.5f * z * (1.0f + tanhf(0.7978845608028654f * z * (1.0f + 0.044715f * z * z)));
            }
            break;
        }
        case BERT_ADD_LN2:
            bert__add_ln(E, x, tmp, L->b_down, L->ln_out, L->ln_out_b, eps);
            break;
        }
    }
}

static void bert__rows(model_ctx *c, const model_batch *b, const model__layer *L, bert__op op) {
    bert__run a = {.c = c, .b = b, .L = L, .op = op};
    atomic_init(&a.next, 0);
    ks_pool_run(c->threads, bert__task, &a);
}

ks_err model__bert_forward(model_ctx *c, const model_batch *b, const model_hidden *h,
                           ks_errbuf *eb) {
    const model *m = c->m;
    const model_hparams *hp = &m->hp;
    const int T = b->n_tokens;
    const int64_t E = hp->n_embd;
    if (b->n_out > 0)
        return ks_seterr(eb, KS_ERR_UNSUPPORTED, "%s is an encoder: it has no LM head (no logits)",
                         hp->arch_name);
    for (int s = 0; s < b->n_seqs; s++)
        if (c->seq_first[s] > 0)
            return ks_seterr(eb, KS_ERR_INVAL,
                             "sequence %d starts at position %d: an encoder takes an input whole "
                             "in one batch",
                             s, c->seq_first[s]);
    model__order_tokens(c, b); // each sequence's tokens, for its attention
    for (int32_t s = 0; s < b->n_seqs; s++)
        if (c->ord_off[s + 1] - c->ord_off[s] > c->max_ctx || c->seq_next[s] > hp->n_ctx_train)
            return ks_seterr(eb, KS_ERR_INVAL, "sequence %d: %d positions (the model has %d)", s,
                             c->seq_next[s], hp->n_ctx_train);
    bert__rows(c, b, NULL, BERT_EMBED);
    for (int il = 0; il < hp->n_layer; il++) {
        const model__layer *L = &m->layers[il];
        const model__mat *qkv[] = {&L->wq, &L->wk, &L->wv};
        float *const qkv_out[] = {c->q, c->k, c->v};
        model__act_reset(c); // x changed
        model__matmuls(c, 3, qkv, c->x, T, qkv_out);
        bert__rows(c, b, L, BERT_QKV_BIAS);
        bert__rows(c, b, L, BERT_ATTN);
        model__act_reset(c);
        model__matmul(c, &L->wo, c->att, T, c->tmp);
        bert__rows(c, b, L, BERT_ADD_LN1);
        model__act_reset(c);
        if (L->w_gate.data) { // nomic-bert: gate into g, up into u
            const model__mat *gu[] = {&L->w_gate, &L->w_up};
            float *const gu_out[] = {c->g, c->u};
            model__matmuls(c, 2, gu, c->x, T, gu_out);
        } else {
            model__matmul(c, &L->w_up, c->x, T, c->g);
        }
        bert__rows(c, b, L, BERT_GELU);
        model__act_reset(c);
        model__matmul(c, &L->w_down, c->g, T, c->tmp);
        bert__rows(c, b, L, BERT_ADD_LN2);
    }
    model__act_reset(c);
    // the pass's positions count as filled, as any prompt pass's (the pages
    // stay as reserved: nothing is stored in them)
    for (int s = 0; s < b->n_seqs; s++)
        kv_seq_set_filled(c->pool, b->seqs[s], (uint32_t)c->seq_next[s]);
    for (int t = 0; h && h->n_rows > 0 && t < T; t++)
        if (h->row[t] >= 0)
            memcpy(h->out + (size_t)h->row[t] * (size_t)E, c->x + (size_t)t * (size_t)E,
                   sizeof(float) * (size_t)E);
    if (b->seq_err)
        for (int s = 0; s < b->n_seqs; s++)
            b->seq_err[s] = KS_OK;
    return KS_OK;
}
