/* lora.c — LoRA adapters (model.h "LoRA adapters"): loading llama.cpp's
 * adapter GGUF against a base model, and the per-token delta the forward
 * pass adds after a targeted matmul: y += scale * B (A x). model__matmuls
 * calls model__lora_apply after each run; it finds the layer and target
 * from the weight's address, so the layer loop needs no call of its own
 * and every dense path (qkv, attention output, each FFN shape) is covered.
 *
 * A (r, K) and B transposed (r, N) are kept as rows of the file's F16
 * (binary16, as llama.cpp keeps them: half the bytes each decode step
 * streams) or else as f32 (F32, and Q8_0 dequantized once: its blocks'
 * values are not all binary16 values, so f16 would round them a second
 * time). The delta is batched as punica's SGMV: the tokens of a pass
 * that share an adapter form a group, and kern_lora.h's shrink (U = X A^T)
 * and expand (Y += scale U B^T) stream each factor once per group. Every
 * element is summed in an order the kernels fix by the shapes alone, so a
 * token's result never depends on what else shares the batch. */
#include "model_int.h"

#include "kvseal/kern_lora.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

/* One targeted matrix: a (r, K) and bt = B^T (r, N) row-major (NULL: untargeted). */
typedef struct lora__mat {
    void *a, *bt; // f32, or binary16 when a16 / b16
    bool a16, b16;
    int32_t r;
    float scale; // user_scale * alpha / r (user_scale without alpha)
} lora__mat;

struct model_lora {
    const model *base;
    int32_t n_layer;
    lora__mat *mats; // (n_layer, MODEL__LORA_N)
    float alpha;     // adapter.lora.alpha (0: absent)
    float user_scale;
    int32_t rank;    // the largest
    int32_t n_mats;
};

/* The GGUF names of the targets (blk.N.<name>.weight), in model__lora_tgt order. */
static const char *const lora__names[MODEL__LORA_N] = {
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};

/* Base matrix tgt of layer L, or NULL where the forward pass has none
 * (gemma4's shared-KV layers, MoE layers' absent dense FFN). */
static const model__mat *lora__base_mat(const model__layer *L, model__lora_tgt tgt) {
    const model__mat *w = NULL;
    switch (tgt) {
    case MODEL__LORA_Q: w = &L->wq; break;
    case MODEL__LORA_K: w = &L->wk; break;
    case MODEL__LORA_V: w = &L->wv; break;
    case MODEL__LORA_O: w = &L->wo; break;
    case MODEL__LORA_GATE: w = &L->w_gate; break;
    case MODEL__LORA_UP: w = &L->w_up; break;
    case MODEL__LORA_DOWN: w = &L->w_down; break;
    default: return NULL;
    }
    return w->data ? w : NULL;
}

static void lora__rescale(model_lora *l) {
    for (int32_t i = 0; i < l->n_layer * MODEL__LORA_N; i++) {
        lora__mat *m = &l->mats[i];
        if (m->a) m->scale = l->alpha != 0.0f ? l->user_scale * l->alpha / (float)m->r : l->user_scale;
    }
}

/* Parses "blk.<il>.<target>.weight.lora_<a|b>": the layer, target and which
 * factor (0 A, 1 B). False for any other name. */
static bool lora__parse_name(const char *name, int32_t n_layer, int *il, int *tgt, int *ab) {
    if (strncmp(name, "blk.", 4) != 0) return false;
    const char *p = name + 4;
    long v = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 6) v = v * 10 + (*p++ - '0'), digits++;
    if (!digits || (digits > 1 && p[-digits] == '0') || *p++ != '.' || v >= n_layer)
        return false; // "blk.01." names no base tensor
    for (int t = 0; t < MODEL__LORA_N; t++) {
        const size_t n = strlen(lora__names[t]);
        if (strncmp(p, lora__names[t], n) != 0) continue;
        const char *s = p + n;
        if (!strcmp(s, ".weight.lora_a") || !strcmp(s, ".weight.lora_b")) {
            *il = (int)v;
            *tgt = t;
            *ab = s[13] == 'b';
            return true;
        }
    }
    return false;
}

/* Rows of tensor t (ne [cols, rows]) dequantized into a new f32 array,
 * (rows, cols) row-major, or transposed (cols, rows) when trans. */
static float *lora__to_f32(const gguf_tensor *t, bool trans) {
    const int64_t cols = t->ne[0], rows = t->ne[1];
    uint64_t rb = 0;
    if (!ks_dtype_row_bytes(t->type, (uint64_t)cols, &rb)) return NULL;
    float *y = malloc(sizeof(float) * (size_t)cols * (size_t)rows);
    float *row = trans ? malloc(sizeof(float) * (size_t)cols) : NULL;
    if (!y || (trans && !row)) {
        free(y);
        return NULL;
    }
    for (int64_t r = 0; r < rows; r++) {
        float *dst = trans ? row : y + (size_t)r * (size_t)cols;
        kern_dequantize_row((ks_dtype)t->type, (const char *)t->data + (size_t)r * rb, dst, cols);
        for (int64_t c = 0; trans && c < cols; c++) y[(size_t)c * (size_t)rows + (size_t)r] = row[c];
    }
    free(row);
    return y;
}

/* Tensor t (ne [cols, rows], F16) copied as binary16 into a new array,
 * (rows, cols) row-major, or transposed (cols, rows) when trans. */
static uint16_t *lora__to_f16(const gguf_tensor *t, bool trans) {
    const size_t cols = (size_t)t->ne[0], rows = (size_t)t->ne[1];
    uint16_t *y = malloc(sizeof *y * cols * rows);
    if (!y) return NULL;
    const uint16_t *src = t->data;
    if (!trans) memcpy(y, src, sizeof *y * cols * rows);
    for (size_t r = 0; trans && r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            y[c * rows + r] = src[r * cols + c];
    return y;
}

ks_err model_lora_load(const model *base, const char *path, model_lora **out, ks_errbuf *eb) {
    *out = NULL;
    gguf_file *f = NULL;
    ks_err e = gguf_open(path, &f, eb);
    if (e) return e;
    return model_lora_load_file(base, f, out, eb);
}

/* Whether string key of f equals want (false when absent or not a string). */
static bool lora__str_is(const gguf_file *f, const char *key, const char *want, gguf_str *got) {
    ks_errbuf tmp = {0};
    got->ptr = "";
    got->len = 0;
    if (!gguf_get(f, key) || gguf_get_str(f, key, got, &tmp)) return false;
    return got->len == strlen(want) && !memcmp(got->ptr, want, got->len);
}

ks_err model_lora_load_file(const model *base, gguf_file *f, model_lora **out, ks_errbuf *eb) {
    *out = NULL;
    const model_hparams *hp = &base->hp;
    const char *path = gguf_path(f);
    model_lora *l = NULL;
    ks_err e = KS_OK;
    gguf_str s;
    if (!lora__str_is(f, "general.type", "adapter", &s)) {
        e = ks_seterr(eb, KS_ERR_FORMAT, "%s: general.type is '%.*s', not 'adapter' (not a LoRA "
                      "adapter file)", path, (int)(s.len > 64 ? 64 : s.len), s.ptr);
        goto done;
    }
    if (!lora__str_is(f, "adapter.type", "lora", &s)) {
        e = ks_seterr(eb, KS_ERR_FORMAT, "%s: adapter.type is '%.*s', not 'lora'", path,
                      (int)(s.len > 64 ? 64 : s.len), s.ptr);
        goto done;
    }
    gguf_str want = {"", 0};
    ks_errbuf tmp = {0};
    if (gguf_get_str(base->gguf, "general.architecture", &want, &tmp) ||
        gguf_get_str(f, "general.architecture", &s, &tmp) || s.len != want.len ||
        memcmp(s.ptr, want.ptr, s.len) != 0) {
        if (!gguf_get(f, "general.architecture")) s.ptr = "", s.len = 0;
        e = ks_seterr(eb, KS_ERR_FORMAT, "%s: general.architecture '%.*s' is not the base model's "
                      "'%s'", path, (int)(s.len > 64 ? 64 : s.len), s.ptr, hp->arch_name);
        goto done;
    }
    if (hp->encoder || hp->kv_lora || base->base) {
        e = ks_seterr(eb, KS_ERR_UNSUPPORTED, "%s: LoRA adapters apply to the dense decoder "
                      "layers only, not to %s", path, hp->arch_name);
        goto done;
    }
    l = calloc(1, sizeof *l);
    if (l) l->mats = calloc((size_t)hp->n_layer * MODEL__LORA_N, sizeof *l->mats);
    if (!l || !l->mats) {
        e = ks_seterr(eb, KS_ERR_NOMEM, "%s: adapter", path);
        goto done;
    }
    l->base = base;
    l->n_layer = hp->n_layer;
    l->user_scale = 1.0f;
    if (gguf_get(f, "adapter.lora.alpha") &&
        (e = gguf_get_f32(f, "adapter.lora.alpha", &l->alpha, eb)))
        goto done;
    if (!(l->alpha >= 0.0f && l->alpha < 1e6f)) { // NaN too
        e = ks_seterr(eb, KS_ERR_FORMAT, "%s: adapter.lora.alpha %g is out of range", path,
                      (double)l->alpha);
        goto done;
    }
    // pair up A and B per matrix: [0] A's tensor, [1] B's
    const gguf_tensor **pair = calloc((size_t)hp->n_layer * MODEL__LORA_N * 2, sizeof *pair);
    if (!pair) {
        e = ks_seterr(eb, KS_ERR_NOMEM, "%s: adapter", path);
        goto done;
    }
    for (uint64_t i = 0; i < gguf_n_tensors(f) && !e; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        int il = 0, tgt = 0, ab = 0;
        if (!lora__parse_name(t->name, hp->n_layer, &il, &tgt, &ab)) {
            // a factor of a matrix the base has but the pass cannot target
            // (token_embd, output, ...) is unsupported; any other name malformed
            const char *dot = strstr(t->name, ".lora_");
            char bn[80];
            if (dot && (size_t)(dot - t->name) < sizeof bn) {
                memcpy(bn, t->name, (size_t)(dot - t->name));
                bn[dot - t->name] = 0;
                if (gguf_find_tensor(base->gguf, bn)) {
                    e = ks_seterr(eb, KS_ERR_UNSUPPORTED, "%s: tensor '%s': LoRA on '%s' is not "
                                  "supported (attn_q/k/v/output, ffn_gate/up/down only)",
                                  path, t->name, bn);
                    break;
                }
            }
            e = ks_seterr(eb, KS_ERR_FORMAT, "%s: tensor '%s' names no matrix of the base model",
                          path, t->name);
            break;
        }
        const model__mat *w = lora__base_mat(&base->layers[il], (model__lora_tgt)tgt);
        if (!w || base->layers[il].recurrent) {
            e = ks_seterr(eb, KS_ERR_FORMAT, "%s: tensor '%s' names no matrix of the base model "
                          "(layer %d has no dense %s)", path, t->name, il, lora__names[tgt]);
            break;
        }
        if (t->type != KS_DTYPE_F32 && t->type != KS_DTYPE_F16 && t->type != KS_DTYPE_Q8_0) {
            e = ks_seterr(eb, KS_ERR_UNSUPPORTED, "%s: tensor '%s' is %s (F32, F16 or Q8_0 only)",
                          path, t->name, ks_dtype_name(t->type));
            break;
        }
        if (t->ne[0] % (int64_t)ks_dtype_block_elems(t->type) != 0) {
            e = ks_seterr(eb, KS_ERR_FORMAT, "%s: tensor '%s': ne[0] %lld is not a multiple of "
                          "%s's block", path, t->name, (long long)t->ne[0], ks_dtype_name(t->type));
            break;
        }
        // A: ne [K, r]; B: ne [r, N] (llama.cpp's layout: A's rows are the rank)
        const int64_t r = ab ? t->ne[0] : t->ne[1], want0 = ab ? r : w->K, want1 = ab ? w->N : r;
        if (t->n_dims != 2 || t->ne[0] != want0 || t->ne[1] != want1 || r < 1 ||
            r > MODEL_LORA_MAX_RANK) {
            e = ks_seterr(eb, KS_ERR_FORMAT, "%s: tensor '%s' has ne [%lld, %lld] (%u dims); "
                          "%s of a [%lld, %lld] matrix needs %s with a rank of 1..%d", path,
                          t->name, (long long)t->ne[0], (long long)t->ne[1], t->n_dims,
                          ab ? "lora_b" : "lora_a", (long long)w->K, (long long)w->N,
                          ab ? "[rank, N]" : "[K, rank]", MODEL_LORA_MAX_RANK);
            break;
        }
        const size_t slot = ((size_t)il * MODEL__LORA_N + (size_t)tgt) * 2 + (size_t)ab;
        if (pair[slot]) {
            e = ks_seterr(eb, KS_ERR_FORMAT, "%s: tensor '%s' appears twice", path, t->name);
            break;
        }
        pair[slot] = t;
    }
    for (int32_t i = 0; i < hp->n_layer * MODEL__LORA_N && !e; i++) {
        const gguf_tensor *ta = pair[2 * i], *tb = pair[2 * i + 1];
        if (!ta && !tb) continue;
        if (!ta || !tb) {
            e = ks_seterr(eb, KS_ERR_FORMAT, "%s: '%s' has no %s", path, (ta ? ta : tb)->name,
                          ta ? "lora_b" : "lora_a");
            break;
        }
        if (ta->ne[1] != tb->ne[0]) {
            e = ks_seterr(eb, KS_ERR_FORMAT, "%s: '%s' has rank %lld but '%s' %lld", path,
                          ta->name, (long long)ta->ne[1], tb->name, (long long)tb->ne[0]);
            break;
        }
        lora__mat *m = &l->mats[i];
        m->r = (int32_t)ta->ne[1];
        m->a16 = ta->type == KS_DTYPE_F16;
        m->b16 = tb->type == KS_DTYPE_F16;
        // ne [K, r]: r rows of K; B ne [r, N]: N rows of r, kept as r rows of N
        m->a = m->a16 ? (void *)lora__to_f16(ta, false) : (void *)lora__to_f32(ta, false);
        m->bt = m->b16 ? (void *)lora__to_f16(tb, true) : (void *)lora__to_f32(tb, true);
        if (!m->a || !m->bt) {
            e = ks_seterr(eb, KS_ERR_NOMEM, "%s: '%s'", path, ta->name);
            break;
        }
        l->n_mats++;
        if (m->r > l->rank) l->rank = m->r;
    }
    free(pair);
    if (!e && !l->n_mats) e = ks_seterr(eb, KS_ERR_FORMAT, "%s: the adapter has no LoRA tensors", path);
    if (!e) lora__rescale(l);
done:
    gguf_close(f);
    if (e) {
        model_lora_free(l);
        return e;
    }
    *out = l;
    return KS_OK;
}

/* The bytes of matrix i's factors (A (r, K) and B transposed (r, N)), 0 when untargeted. */
static size_t lora__mat_bytes(const model_lora *l, int32_t i, size_t *na, size_t *nb) {
    const lora__mat *m = &l->mats[i];
    *na = *nb = 0;
    if (!m->a) return 0;
    const model__mat *w = lora__base_mat(&l->base->layers[i / MODEL__LORA_N],
                                         (model__lora_tgt)(i % MODEL__LORA_N));
    *na = (m->a16 ? sizeof(uint16_t) : sizeof(float)) * (size_t)m->r * (size_t)w->K;
    *nb = (m->b16 ? sizeof(uint16_t) : sizeof(float)) * (size_t)w->N * (size_t)m->r;
    return *na + *nb;
}

size_t model_lora_bytes(const model_lora *l) {
    size_t n = 0, na, nb;
    for (int32_t i = 0; l->mats && i < l->n_layer * MODEL__LORA_N; i++)
        n += lora__mat_bytes(l, i, &na, &nb);
    return n;
}

void model_lora_free(model_lora *l) {
    if (!l) return;
    for (int32_t i = 0; l->mats && i < l->n_layer * MODEL__LORA_N; i++) {
        size_t na, nb;
        lora__mat_bytes(l, i, &na, &nb);
        // the factors are a tenant's fine-tune: scrubbed before the memory is reused
        if (l->mats[i].a) explicit_bzero(l->mats[i].a, na);
        if (l->mats[i].bt) explicit_bzero(l->mats[i].bt, nb);
        free(l->mats[i].a);
        free(l->mats[i].bt);
    }
    free(l->mats);
    free(l);
}

void model_lora_set_scale(model_lora *l, float user_scale) {
    l->user_scale = user_scale;
    lora__rescale(l);
}

float model_lora_scale(const model_lora *l) {
    return l->alpha != 0.0f && l->rank ? l->user_scale * l->alpha / (float)l->rank : l->user_scale;
}

int32_t model_lora_rank(const model_lora *l) { return l->rank; }

int32_t model_lora_n_mats(const model_lora *l) { return l->n_mats; }

int32_t model_lora_factors(const model_lora *l, int32_t i, const void **a, size_t *na,
                           const void **bt, size_t *nb) {
    int32_t n = l->mats ? l->n_layer * MODEL__LORA_N : 0;
    *a = *bt = NULL;
    *na = *nb = 0;
    if (i < 0 || i >= n || !l->mats[i].a) return n;
    lora__mat_bytes(l, i, na, nb);
    *a = l->mats[i].a;
    *bt = l->mats[i].bt;
    return n;
}

ks_err model__lora_begin(model_ctx *c, const model_batch *b, ks_errbuf *eb) {
    c->lora_b = NULL;
    bool any = false;
    for (int32_t s = 0; b->lora && s < b->n_seqs; s++) {
        if (b->lora[s] && b->lora[s]->base != c->m)
            return ks_seterr(eb, KS_ERR_INVAL, "sequence %d: its LoRA adapter was loaded for "
                             "another model", s);
        any = any || b->lora[s];
    }
    c->lora_b = any ? b : NULL;
    return KS_OK;
}

// ----------------------------------------------------------------------------
// The delta

#define LORA__WIN 64        // most tokens of one window (its groups run together)
#define LORA__U_CAP 8192    // floats of U a window may use (on the stack)
#define LORA__ROWS 8        // ranks a shrink item covers
#define LORA__COLS 128      // output columns an expand item covers
#define LORA__INLINE (1 << 15) // multiply-adds under which a window runs on this thread

/* The tokens of a window that share one adapter's matrix: slots [off, off + n). */
typedef struct {
    const lora__mat *m;
    int32_t off, n;
    int32_t n_shrink;     // its shrink items
    atomic_int shrunk;    // of which done: its expand items wait for all
} lora__grp;

/* One window: its groups, each token's rows by slot, and U (slot, ldu).
 * Items: every group's shrink items (LORA__ROWS ranks each) in group order,
 * then every group's expand items (LORA__COLS columns each). */
typedef struct {
    const kern_lora *k;
    lora__grp g[LORA__WIN];
    int ng;
    const float *x[LORA__WIN];
    float *y[LORA__WIN];
    float *U;
    int64_t ldu, K, N;
    int64_t n_shrink, n_cols; // shrink items in all; expand items per group
    atomic_llong next;
} lora__run;

/* Work item it. Each U or Y element is written by one item, whole, so the
 * split never changes a value. Items are claimed in order, so every shrink
 * item is claimed (and being run) before any expand item: an expand item
 * waits only on running shrinks of its own group, never on a thread that
 * has not started. */
static void lora__item(lora__run *a, int64_t it) {
    int gi = 0;
    if (it < a->n_shrink) {
        while (it >= a->g[gi].n_shrink) it -= a->g[gi++].n_shrink;
        lora__grp *g = &a->g[gi];
        const int32_t i0 = (int32_t)it * LORA__ROWS;
        const int32_t i1 = i0 + LORA__ROWS < g->m->r ? i0 + LORA__ROWS : g->m->r;
        float *U = a->U + (size_t)g->off * (size_t)a->ldu;
        if (g->m->a16)
            a->k->shrink_f16(a->K, g->m->a, i0, i1, g->n, a->x + g->off, U, a->ldu);
        else
            a->k->shrink(a->K, g->m->a, i0, i1, g->n, a->x + g->off, U, a->ldu);
        atomic_fetch_add_explicit(&g->shrunk, 1, memory_order_release);
        return;
    }
    it -= a->n_shrink;
    gi = (int)(it / a->n_cols);
    lora__grp *g = &a->g[gi];
    for (int spins = 0; atomic_load_explicit(&g->shrunk, memory_order_acquire) < g->n_shrink; spins++)
        if (spins > 64) sched_yield(); // its shrink's thread was descheduled
    const int64_t c0 = (it % a->n_cols) * LORA__COLS;
    const int64_t c1 = c0 + LORA__COLS < a->N ? c0 + LORA__COLS : a->N;
    const float *U = a->U + (size_t)g->off * (size_t)a->ldu;
    if (g->m->b16)
        a->k->expand_f16(g->m->r, a->N, g->m->bt, c0, c1, g->n, U, a->ldu, g->m->scale,
                         a->y + g->off);
    else
        a->k->expand(g->m->r, a->N, g->m->bt, c0, c1, g->n, U, a->ldu, g->m->scale, a->y + g->off);
}

static void lora__task(void *arg, int ith, int nth) {
    lora__run *a = arg;
    (void)ith, (void)nth;
    int64_t i0, i1;
    const int64_t n = a->n_shrink + (int64_t)a->ng * a->n_cols;
    while (ks_pool_claim(&a->next, n, 1, &i0, &i1))
        for (int64_t it = i0; it < i1; it++) lora__item(a, it);
}

/* Runs a window's items: on this thread when they are few multiply-adds
 * (a pool run's hand-off would cost more; matmul.c calls down into this
 * file, never the other way), else in one pool run. */
static void lora__window(model_ctx *c, lora__run *a) {
    int64_t work = 0;
    a->n_shrink = 0;
    a->n_cols = (a->N + LORA__COLS - 1) / LORA__COLS;
    for (int gi = 0; gi < a->ng; gi++) {
        lora__grp *g = &a->g[gi];
        g->n_shrink = (g->m->r + LORA__ROWS - 1) / LORA__ROWS;
        atomic_init(&g->shrunk, 0);
        a->n_shrink += g->n_shrink;
        work += (int64_t)g->n * g->m->r * (a->K + a->N);
    }
    atomic_store_explicit(&a->next, 0, memory_order_relaxed);
    if (work < LORA__INLINE)
        lora__task(a, 0, 1);
    else
        ks_pool_run(c->threads, lora__task, a);
}

/* The layer and target of w when it is one of a layer's targetable
 * matrices (the fields lora__base_mat reads), else false. */
static bool lora__which(const model *m, const model__mat *w, int *il, model__lora_tgt *tgt) {
    const char *p = (const char *)w, *l0 = (const char *)m->layers;
    if (p < l0 || p >= l0 + sizeof(model__layer) * (size_t)m->hp.n_layer) return false;
    *il = (int)((size_t)(p - l0) / sizeof(model__layer));
    const model__layer *L = &m->layers[*il];
    for (int t = 0; t < MODEL__LORA_N; t++)
        if (lora__base_mat(L, (model__lora_tgt)t) == w) {
            *tgt = (model__lora_tgt)t;
            return true;
        }
    return false;
}

/* Token t's matrix for (il, tgt), or NULL: no adapter or it leaves w alone. */
static const lora__mat *lora__mat_of(const model_batch *b, int64_t t, int il, model__lora_tgt tgt) {
    const model_lora *l = b->lora[b->seq[t]];
    const lora__mat *m = l ? &l->mats[(size_t)il * MODEL__LORA_N + tgt] : NULL;
    return m && m->a ? m : NULL;
}

void model__lora_apply(model_ctx *c, const model__mat *w, const float *X, float *Y) {
    const model_batch *b = c->lora_b;
    int il = 0;
    model__lora_tgt tgt = MODEL__LORA_Q;
    if (!b || !lora__which(c->m, w, &il, &tgt)) return;
    int32_t rmax = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        const lora__mat *m = b->lora[s] ? &b->lora[s]->mats[(size_t)il * MODEL__LORA_N + tgt] : NULL;
        if (m && m->a && m->r > rmax) rmax = m->r;
    }
    if (!rmax) return;
    // windows of up to cap tokens in batch order, grouped by matrix
    float U[LORA__U_CAP];
    lora__run a = {.k = kern_lora_for(c->kv), .U = U, .ldu = rmax, .K = w->K, .N = w->N};
    atomic_init(&a.next, 0);
    const int cap = LORA__U_CAP / rmax < LORA__WIN ? LORA__U_CAP / rmax : LORA__WIN;
    int64_t t = 0;
    while (t < b->n_tokens) {
        int32_t tok[LORA__WIN];
        int8_t grp[LORA__WIN];
        int n = 0;
        a.ng = 0;
        for (; t < b->n_tokens && n < cap; t++) {
            const lora__mat *m = lora__mat_of(b, t, il, tgt);
            if (!m) continue;
            int gi = 0;
            while (gi < a.ng && a.g[gi].m != m) gi++;
            if (gi == a.ng) a.g[a.ng++] = (lora__grp){.m = m};
            a.g[gi].n++;
            tok[n] = (int32_t)t;
            grp[n++] = (int8_t)gi;
        }
        if (!n) break;
        for (int gi = 0, off = 0; gi < a.ng; gi++) {
            a.g[gi].off = off;
            off += a.g[gi].n;
            a.g[gi].n = 0;
        }
        for (int j = 0; j < n; j++) { // each group's tokens in batch order
            lora__grp *g = &a.g[grp[j]];
            const int slot = g->off + g->n++;
            a.x[slot] = X + (size_t)tok[j] * (size_t)w->K;
            a.y[slot] = Y + (size_t)tok[j] * (size_t)w->N;
        }
        lora__window(c, &a);
    }
}
