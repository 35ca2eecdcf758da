/* attn.c — attention of one layer over paged KV (model_int.h model__attn):
 * for every (token t, head h), softmax(q·K^T * scale) · V over the
 * positions [0, pos[t]] of t's sequence (on a sliding-window layer only the
 * last n_swa of them: j > pos[t] - n_swa, llama.cpp's rule), read page by
 * page through kv; gemma2 soft-caps the scores before the softmax. The
 * G = n_head / n_head_kv query heads that share a KV head go together, so
 * each K/V row is read (and dequantized) once for all of them; a head's
 * values are the same for every G (kern.h). */
#include "model_int.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    model_ctx *c;
    const model_batch *b;
    int layer;
    bool tiled;        // attn__tile (kern attn_block) rather than attn__one
    int n_items;       // tokens, or tiles (c->attn_tile) when tiled
    int nch, nkv;      // parts a KV head's group is cut into; KV heads an item takes
    bool chunked;      // items are (decode tile, chunk) pairs (attn__chunks)
    atomic_llong next; // next (token or tile, KV head) pair to claim
    atomic_llong left; // pairs not yet done
} attn__ctx;

/* softmax of x[0..n) in place with one more logit, sink, in the
 * denominator only (gpt-oss's attention sinks: the weights sum to less than
 * 1, the rest goes to no position). As ggml: the max over x and the sink,
 * exp(x - max) summed in double, then each scaled by 1/sum. A sink of
 * -inf is the plain softmax. */
static void attn__softmax_sink(uint32_t n, float *x, float sink) {
    float mx = sink;
    for (uint32_t j = 0; j < n; j++)
        mx = x[j] > mx ? x[j] : mx;
    double sum = 0.0;
    for (uint32_t j = 0; j < n; j++)
        sum += (double)(x[j] = expf(x[j] - mx));
    sum += (double)expf(sink - mx);
    const float inv = (float)(1.0 / sum);
    for (uint32_t j = 0; j < n; j++)
        x[j] *= inv;
}

/* Attention of G query heads h, h+1, ... (all of one KV head's or a part)
 * for batch token t, into att[t][h*D..]. scores has room for G rows of
 * max_ctx floats. K/V pages come from the per-layer table that forward.c's fwd__resolve
 * filled through kv's tag check (I1). */
static void attn__one(attn__ctx *a, int t, int h, int G, float *scores) {
    model_ctx *c = a->c;
    const model_hparams *hp = &c->m->hp;
    const kern_vtab *kv = c->kv;
    const model__layer *L = &c->m->layers[a->layer];
    // the layer's heads (gemma4's differ per layer); MLA: V is the latent, head_dim_v
    const int D = L->head_dim, Dv = hp->kv_lora ? hp->head_dim_v : D, H = hp->n_head;
    const int kh = h / (H / L->n_head_kv);
    uint64_t hrb = c->head_row;
    if (D != hp->head_dim) KS_ASSERT(ks_dtype_row_bytes((uint32_t)c->kv_type, (uint64_t)D, &hrb));
    const size_t S = (size_t)c->max_ctx;  // scores row stride
    const size_t koff = (size_t)kh * hrb; // this KV head's bytes
    const kern_dot_rows_fn dot_rows = kv->dot_rows[c->kv_type];
    const kern_axpy_rows_fn axpy_rows = kv->axpy_rows[c->kv_type];
    const uint32_t P = (uint32_t)kv_pool_geom(c->pool)->page_tokens;
    const float scale = hp->attn_scale;
    const int si = a->b->seq[t];
    const void *const *kp = c->kp + (size_t)si * (size_t)c->max_pages;
    // MLA: V is the first Dv elements of the K row
    const void *const *vp = hp->kv_lora ? kp : c->vp + (size_t)si * (size_t)c->max_pages;
    const uint32_t n_ctx = (uint32_t)a->b->pos[t] + 1;
    const uint32_t W = (uint32_t)hp->n_swa;
    // first position read: n_ctx - W on a sliding layer past its window
    const uint32_t j_lo = c->m->layers[a->layer].swa && n_ctx > W ? n_ctx - W : 0;
    const float *q = c->q + (size_t)t * (size_t)(H * D) + (size_t)h * (size_t)D;
    float *out = c->att + (size_t)t * (size_t)(H * Dv) + (size_t)h * (size_t)Dv;
    if (c->dsa_n && c->dsa_n[t]) { // sparse: only the indexer's picks, ascending
        const int n = c->dsa_n[t];
        const int32_t *sel = c->dsa_sel + (size_t)t * (size_t)hp->idx_topk;
        for (int i = 0; i < n; i++) {
            const uint32_t j = (uint32_t)sel[i];
            dot_rows(D, G, q, (const uint8_t *)kp[j / P] + (size_t)(j % P) * c->kv_row + koff,
                     c->kv_row, 1, scale, scores + i, S);
        }
        for (int g = 0; g < G; g++)
            kv->softmax(n, scores + (size_t)g * S);
        memset(out, 0, sizeof(float) * (size_t)Dv * (size_t)G);
        for (int i = 0; i < n; i++) {
            const uint32_t j = (uint32_t)sel[i];
            axpy_rows(Dv, G, scores + i, S,
                      (const uint8_t *)vp[j / P] + (size_t)(j % P) * c->kv_row + koff, c->kv_row, 1,
                      out);
        }
        return;
    }
    // page rows are (P, kv_row bytes): position j lives in page j/P, row j%P;
    // scores[g*S + j] is position j's (with j_lo = 0 the same calls as
    // page-at-a-time)
    for (uint32_t j = j_lo; j < n_ctx;) {
        const uint32_t r = j % P, nj = n_ctx - j < P - r ? n_ctx - j : P - r;
        dot_rows(D, G, q, (const uint8_t *)kp[j / P] + (size_t)r * c->kv_row + koff, c->kv_row,
                 (int)nj, scale, scores + j, S);
        j += nj;
    }
    if (hp->attn_softcap > 0.0f) { // c * tanh(s / c), as llama.cpp: s * (1/c), tanh, * c
        const float cap = hp->attn_softcap, inv = 1.0f / cap;
        for (int g = 0; g < G; g++)
            for (uint32_t j = j_lo; j < n_ctx; j++) {
                float *s = scores + (size_t)g * S + j;
                *s = tanhf(*s * inv) * cap;
            }
    }
    const float *sinks = c->m->layers[a->layer].attn_sinks; // gpt-oss
    for (int g = 0; g < G; g++)
        if (sinks)
            attn__softmax_sink(n_ctx - j_lo, scores + (size_t)g * S + j_lo, sinks[h + g]);
        else
            kv->softmax(n_ctx - j_lo, scores + (size_t)g * S + j_lo);
    memset(out, 0, sizeof(float) * (size_t)Dv * (size_t)G);
    for (uint32_t j = j_lo; j < n_ctx;) {
        const uint32_t r = j % P, nj = n_ctx - j < P - r ? n_ctx - j : P - r;
        axpy_rows(Dv, G, scores + j, S, (const uint8_t *)vp[j / P] + (size_t)r * c->kv_row + koff,
                  c->kv_row, (int)nj, out);
        j += nj;
    }
}

/* Whether layer il's attention takes the tiled online-softmax kernel: not
 * with soft-capping (gemma2) or DSA's sparse selection, nor head sizes the
 * kernel does not take; a function of the model and layer only, so decode
 * and prefill of a token always take the same arithmetic. */
static bool attn__tiled(const model_ctx *c, int il) {
    const model_hparams *hp = &c->m->hp;
    const model__layer *L = &c->m->layers[il];
    const int D = L->head_dim, Dv = hp->kv_lora ? hp->head_dim_v : D;
    const int q = c->kv_type == KS_DTYPE_Q8_0 ? 32 : 16;
    // gemma4 stays on the old path: with the tiled kernel its Q4_K_M
    // perplexity against llama.cpp moved from within 0.5% to 0.55%
    // (e2e_test_arch_gemma4); not yet understood
    return c->attn_block && hp->arch != MODEL_ARCH_GEMMA4 && hp->attn_softcap <= 0.0f &&
           !hp->idx_topk && D % q == 0 && Dv % q == 0 && D > 0 && Dv > 0;
}

/* Cuts the batch into tiles of up to KERN_ATTN_ROWS consecutive tokens of
 * one sequence at consecutive positions (c->attn_tile: first token of each,
 * then T); returns their number. How a batch is tiled never changes a
 * token's values (kern.h attn_block). */
static int attn__tiles(model_ctx *c, const model_batch *b) {
    int n = 0;
    for (int t = 0; t < b->n_tokens; t++)
        if (t == 0 || b->seq[t] != b->seq[t - 1] || b->pos[t] != b->pos[t - 1] + 1 ||
            t - c->attn_tile[n - 1] >= KERN_ATTN_ROWS)
            c->attn_tile[n++] = t;
    c->attn_tile[n] = b->n_tokens;
    return n;
}

/* A = merge(A, B) for one (token, head) state (running maximum m, sum l and
 * Dv unnormalised outputs o), the step that joins a token's chunks
 * (MODEL_ATTN_CHUNK): each chunk's online softmax starts empty (or from
 * gpt-oss's sink, in the chunk that holds the token's first position) and
 * the chunks merge in order, whether one thread walks them (a prefill tile)
 * or several take one each (a decode step of few sequences, attn__join), so
 * batch invariance holds and a context within one chunk gives the one-pass
 * values. An empty B (m == -inf: no key yet, weight 0)
 * leaves A, an empty A becomes B, else both scale to the larger maximum.
 * One scalar order for every caller. */
static void attn__merge(int Dv, float *m, float *l, float *o, float m2, float l2, const float *o2) {
    if (m2 == -INFINITY) return;
    if (*m == -INFINITY) {
        *m = m2, *l = l2;
        memcpy(o, o2, sizeof(float) * (size_t)Dv);
        return;
    }
    const float M = *m > m2 ? *m : m2, a = expf(*m - M), b = expf(m2 - M);
    *l = *l * a + l2 * b;
    for (int i = 0; i < Dv; i++)
        o[i] = o[i] * a + o2[i] * b;
    *m = M;
}

/* Attention of nkv KV heads' G query heads each (heads h .. h + nkv G - 1;
 * nkv > 1 only with the whole group, G = n_head / n_head_kv) for the
 * tile's R tokens over the chunks [ck_lo, ck_hi) (MODEL_ATTN_CHUNK), block
 * by block of KERN_ATTN_BLOCK positions aligned to absolute positions
 * (kern.h attn_block: a token's result is the same whatever its tile).
 * part NULL: the chunks are all the tokens read, and the result goes to
 * att[t][h*Dv..]. Else (R == 1) the merged state of query head q goes to
 * part + q (Dv + 2): m, l, then o. The KV heads of one block go one after
 * another (xs of them a pass), so a thread reads adjacent head slices of
 * each cached row together; each head's arithmetic is as alone. scr: this
 * thread's c->attn_scr. Pages come from the table forward.c's fwd__resolve filled
 * through kv's tag check (I1). */
static void attn__tile(attn__ctx *a, int ti, int h, int G, int nkv, float *scr, uint32_t ck_lo,
                       uint32_t ck_hi, float *part) {
    model_ctx *c = a->c;
    const model_hparams *hp = &c->m->hp;
    const model__layer *L = &c->m->layers[a->layer];
    const int D = L->head_dim, Dv = hp->kv_lora ? hp->head_dim_v : D, H = hp->n_head;
    const int kh = h / (H / L->n_head_kv);
    uint64_t hrb = c->head_row;
    if (D != hp->head_dim) KS_ASSERT(ks_dtype_row_bytes((uint32_t)c->kv_type, (uint64_t)D, &hrb));
    const size_t koff = (size_t)kh * hrb;
    const uint32_t P = (uint32_t)kv_pool_geom(c->pool)->page_tokens, W = (uint32_t)hp->n_swa;
    const int t0 = c->attn_tile[ti], R = c->attn_tile[ti + 1] - t0, si = a->b->seq[t0];
    const int S = R * G; // states per KV head
    const void *const *kp = c->kp + (size_t)si * (size_t)c->max_pages;
    const void *const *vp = hp->kv_lora ? kp : c->vp + (size_t)si * (size_t)c->max_pages;
    // scratch: the kernel's, then the chunk's states m, l (nkv R G) and o
    // (nkv R G, Dv), then the merged ones ma, la, oa
    const size_t NS = (size_t)(nkv * S);
    float *ks = scr, *m = scr + KERN_ATTN_SCRATCH(D, Dv), *l = m + NS, *o = l + NS;
    float *ma = o + NS * (size_t)Dv, *la = ma + NS, *oa = la + NS;
    uint32_t lo[KERN_ATTN_ROWS], hi[KERN_ATTN_ROWS], j_min = UINT32_MAX, j_max = 0;
    const float *sinks = L->attn_sinks; // gpt-oss: a logit in the denominator only
    for (int r = 0; r < R; r++) {
        hi[r] = (uint32_t)a->b->pos[t0 + r] + 1; // positions [lo, hi) of token t0 + r
        lo[r] = L->swa && hi[r] > W ? hi[r] - W : 0;
        j_min = lo[r] < j_min ? lo[r] : j_min;
        j_max = hi[r] > j_max ? hi[r] : j_max;
    }
    for (size_t st = 0; st < NS; st++)
        ma[st] = -INFINITY, la[st] = 0.0f;
    const uint64_t CH = MODEL_ATTN_CHUNK;
    if ((uint64_t)ck_lo * CH > j_min) j_min = (uint32_t)((uint64_t)ck_lo * CH);
    if ((uint64_t)ck_hi * CH < j_max) j_max = (uint32_t)((uint64_t)ck_hi * CH);
    const uint8_t *kb[KERN_ATTN_BLOCK], *vb[KERN_ATTN_BLOCK]; // rows' starts, then head slices
    const uint8_t *krow[KERN_ATTN_BLOCK], *vrow[KERN_ATTN_BLOCK];
    const uint8_t *pk[KERN_ATTN_BLOCK], *pv[KERN_ATTN_BLOCK]; // the next block's, to prefetch
    int blo[KERN_ATTN_ROWS], bhi[KERN_ATTN_ROWS];
    kern_attn_blk k = {.D = D,
                       .Dv = Dv,
                       .G = G,
                       .R = R,
                       .kv_type = (ks_dtype)c->kv_type,
                       .q_stride = (size_t)(H * D),
                       .krow = krow,
                       .vrow = vrow,
                       .lo = blo,
                       .hi = bhi,
                       .scale = hp->attn_scale,
                       .scratch = ks};
    const uint32_t B = KERN_ATTN_BLOCK;
    // a kernel that spreads the next block's prefetches over its arithmetic
    // reads whole rows best (one thread streaming a decode row's blocks from
    // memory: about 2 800 cycles a head's block, against 4 700 one 128-byte
    // slice a pass with a burst of prefetches; docs/perf-log.md); with a
    // burst, one row (decode) takes its heads one pass each (together: tg64
    // at depth 4096 53 -> 48 tokens/s), where 8192-token prefill gained
    // from whole rows (pp4096 239-243 -> 258-261)
    const bool spread = c->kv->attn_prefetch;
    const int xs = R == 1 && !spread ? 1 : nkv;
    const size_t span = (size_t)xs * hrb; // the bytes of a row one pass reads
    for (uint32_t c0 = j_min / MODEL_ATTN_CHUNK * MODEL_ATTN_CHUNK; c0 < j_max;
         c0 += MODEL_ATTN_CHUNK) {
        const uint32_t ce = j_max - c0 < MODEL_ATTN_CHUNK ? j_max : c0 + MODEL_ATTN_CHUNK;
        const uint32_t jb = j_min > c0 ? j_min : c0; // this chunk's first position read
        for (int r = 0; r < R; r++) {
            const bool first = lo[r] / MODEL_ATTN_CHUNK == c0 / MODEL_ATTN_CHUNK;
            // the sink as the state before any key: m = sink, l = 1
            for (int x = 0; x < nkv; x++)
                for (int g = 0; g < G; g++) {
                    m[x * S + r * G + g] = sinks && first ? sinks[h + x * G + g] : -INFINITY;
                    l[x * S + r * G + g] = sinks && first ? 1.0f : 0.0f;
                }
        }
        memset(o, 0, sizeof(float) * NS * (size_t)Dv);
        for (int x0 = 0; x0 < nkv; x0 += xs) {
            const size_t xoff = koff + (size_t)x0 * hrb; // this pass's first head slice
            for (uint32_t j0 = jb / B * B; j0 < ce; j0 += B) {
                const uint32_t n = ce - j0 < B ? ce - j0 : B;
                for (uint32_t i = 0; i < n; i++) { // layout: position j in page j/P, row j%P
                    const uint32_t j = j0 + i;
                    kb[i] = (const uint8_t *)kp[j / P] + (size_t)(j % P) * c->kv_row + xoff;
                    vb[i] = (const uint8_t *)vp[j / P] + (size_t)(j % P) * c->kv_row + xoff;
                }
                // the next block's rows of these heads, while this one
                // computes (decode reads each row once: the hardware
                // prefetcher alone trails)
                kern_attn_pf pf = {.k = pk, .v = pv, .lines = (int)((span + 63) / 64)};
                for (uint32_t j = j0 + B; j < j0 + 2 * B && j < j_max; j++) {
                    const size_t off = (size_t)(j % P) * c->kv_row + xoff;
                    const uint8_t *kr = (const uint8_t *)kp[j / P] + off;
                    const uint8_t *vr = (const uint8_t *)vp[j / P] + off;
                    if (spread) {
                        pk[pf.n] = kr, pv[pf.n++] = vr;
                        continue;
                    }
                    for (size_t x = 0; x < span; x += 64) {
                        __builtin_prefetch(kr + x);
                        if (vr != kr) __builtin_prefetch(vr + x);
                    }
                }
                if (kp == vp) pf.v = pf.k;
                k.pf = spread ? &pf : NULL;
                for (int r = 0; r < R; r++) {
                    blo[r] = lo[r] > j0 ? (int)(lo[r] - j0 < n ? lo[r] - j0 : n) : 0;
                    bhi[r] = hi[r] > j0 ? (int)(hi[r] - j0 < n ? hi[r] - j0 : n) : 0;
                }
                k.n = (int)n;
                for (int x = x0; x < x0 + xs; x++) {
                    for (uint32_t i = 0; i < n; i++) {
                        krow[i] = kb[i] + (size_t)(x - x0) * hrb;
                        vrow[i] = vb[i] + (size_t)(x - x0) * hrb;
                    }
                    k.q = c->q + (size_t)t0 * (size_t)(H * D) + (size_t)(h + x * G) * (size_t)D;
                    k.m = m + x * S, k.l = l + x * S, k.o = o + (size_t)(x * S) * (size_t)Dv;
                    c->attn_block(&k);
                }
                for (; pf.row < pf.n; pf.row++, pf.line = 0) // what the kernel left
                    for (; pf.line < pf.lines; pf.line++) {
                        __builtin_prefetch(pk[pf.row] + 64 * pf.line);
                        if (pf.v != pf.k) __builtin_prefetch(pv[pf.row] + 64 * pf.line);
                    }
            }
        }
        for (size_t st = 0; st < NS; st++)
            attn__merge(Dv, ma + st, la + st, oa + st * (size_t)Dv, m[st], l[st],
                        o + st * (size_t)Dv);
    }
    for (int x = 0; x < nkv; x++)
        for (int r = 0; r < R; r++)
            for (int g = 0; g < G; g++) {
                const int st = x * S + r * G + g, q = h + x * G + g;
                const float *src = oa + (size_t)st * (size_t)Dv;
                if (part) { // R == 1: the state, for attn__join
                    float *dst = part + (size_t)q * (size_t)(Dv + 2);
                    dst[0] = ma[st], dst[1] = la[st];
                    memcpy(dst + 2, src, sizeof(float) * (size_t)Dv);
                    continue;
                }
                const float inv = 1.0f / la[st]; // softmax . V = o / l
                float *out = c->att + (size_t)(t0 + r) * (size_t)(H * Dv) + (size_t)q * (size_t)Dv;
                for (int i = 0; i < Dv; i++)
                    out[i] = src[i] * inv;
            }
}

/* The chunks' states of decode tile ti (attn__tile's parts, every
 * query head) merged in order into att: run by the thread that finished
 * the tile's last chunk. */
static void attn__join(attn__ctx *a, int ti) {
    model_ctx *c = a->c;
    const model_hparams *hp = &c->m->hp;
    const int Dv = hp->kv_lora ? hp->head_dim_v : c->m->layers[a->layer].head_dim, H = hp->n_head;
    const int nck = c->attn_ck[ti + 1] - c->attn_ck[ti];
    const size_t hs = (size_t)(Dv + 2);
    const float *part = c->attn_part + (size_t)c->attn_ck[ti] * (size_t)H * hs;
    for (int q = 0; q < H; q++) {
        float m = -INFINITY, l = 0.0f;
        float *out = c->att + (size_t)c->attn_tile[ti] * (size_t)(H * Dv) + (size_t)q * (size_t)Dv;
        for (int ck = 0; ck < nck; ck++) {
            const float *p = part + ((size_t)ck * (size_t)H + (size_t)q) * hs;
            attn__merge(Dv, &m, &l, out, p[0], p[1], p + 2);
        }
        const float inv = 1.0f / l; // softmax . V = o / l
        for (int i = 0; i < Dv; i++)
            out[i] *= inv;
    }
}

/* Whether layer il's attention over the batch's n tiles runs as (tile,
 * chunk) items: a decode step (every tile one token) of too few tiles to
 * keep the threads busy reading whole rows, whose contexts make at least
 * an item per thread. Fills c->attn_ck (item prefix sums), attn_ck0 (each
 * tile's first chunk) and attn_left (chunks to go). */
static bool attn__chunks(model_ctx *c, const model_batch *b, int il, int n, int nth) {
    if (!c->kv->attn_prefetch || n > c->attn_slots || n >= 2 * nth || c->attn_tile[n] != n)
        return false;
    const model__layer *L = &c->m->layers[il];
    const uint32_t W = (uint32_t)c->m->hp.n_swa;
    c->attn_ck[0] = 0;
    for (int t = 0; t < n; t++) {
        const uint32_t hi = (uint32_t)b->pos[t] + 1, lo = L->swa && hi > W ? hi - W : 0;
        c->attn_ck0[t] = lo / MODEL_ATTN_CHUNK;
        const int nck = (int)((hi - 1) / MODEL_ATTN_CHUNK - lo / MODEL_ATTN_CHUNK + 1);
        c->attn_ck[t + 1] = c->attn_ck[t] + nck;
        atomic_init(&c->attn_left[t], nck);
    }
    // every chunk's state is kept for the join: items past the buffer walk
    // their tiles whole instead (the same arithmetic)
    const size_t hs = (size_t)(c->m->hp.kv_lora ? c->m->hp.head_dim_v : L->head_dim) + 2;
    return c->attn_ck[n] >= nth && c->attn_ck[n] > n &&
           (size_t)c->attn_ck[n] * (size_t)c->m->hp.n_head * hs <= c->attn_part_n;
}

/* The parts a KV head's G query heads are cut into: more than one when
 * there are too few (token, KV head) pairs to keep every thread busy (a
 * decode step of an MQA model, or many threads); the same for every thread,
 * and a head's values do not depend on its group (kern.h). */
static int attn__nch(int64_t T, int Hkv, int G, int nth) {
    int nch = 1;
    while (T * Hkv * nch < 2 * (int64_t)nth && G % (2 * nch) == 0)
        nch *= 2;
    return nch;
}

/* The KV heads one tiled work item takes together: the most (a divisor of
 * Hkv) that still leaves an item per thread. */
static int attn__nkv(int64_t T, int Hkv, int nth) {
    int nkv = Hkv;
    while (nkv > 1 && (Hkv % nkv || T * (Hkv / nkv) < (int64_t)nth))
        nkv--;
    return nkv;
}

static void attn__task(void *arg, int ith, int nth) {
    attn__ctx *a = arg;
    const int Hkv = a->c->m->layers[a->layer].n_head_kv, G = a->c->m->hp.n_head / Hkv;
    float *scores = a->c->scores + (size_t)ith * (size_t)G * (size_t)a->c->max_ctx;
    float *scr = a->c->attn_scr + (size_t)ith * a->c->attn_scr_n;
    const int nch = a->nch, nkv = a->nkv, Gs = G / nch, per_t = Hkv * nch / nkv;
    int64_t p0, p1;
    model_ctx *c = a->c;
    if (a->chunked) { // items: (decode tile, chunk), every head; the last one joins
        const int nt = a->n_items;
        const model__layer *L = &c->m->layers[a->layer];
        const size_t hs = (size_t)(c->m->hp.kv_lora ? c->m->hp.head_dim_v : L->head_dim) + 2;
        while (ks_pool_claim(&a->next, c->attn_ck[nt], 1, &p0, &p1)) {
            for (int64_t pi = p0; pi < p1; pi++) {
                int t = 0;
                while (c->attn_ck[t + 1] <= pi)
                    t++;
                const int ck = (int)(pi - c->attn_ck[t]);
                if (atomic_load_explicit(&c->seq_bad[a->b->seq[c->attn_tile[t]]],
                                         memory_order_relaxed))
                    continue;
                const uint32_t k0 = c->attn_ck0[t] + (uint32_t)ck;
                attn__tile(a, t, 0, G, Hkv, scr, k0, k0 + 1,
                           c->attn_part + (size_t)pi * (size_t)(G * Hkv) * hs);
                if (atomic_fetch_sub_explicit(&c->attn_left[t], 1, memory_order_acq_rel) == 1)
                    attn__join(a, t);
            }
            atomic_fetch_sub_explicit(&a->left, p1 - p0, memory_order_relaxed);
        }
        model__idle_prefetch(c, ith, nth, &a->left);
        return;
    }
    while (ks_pool_claim(&a->next, (int64_t)a->n_items * per_t, 1, &p0, &p1)) {
        for (int64_t pi = p0; pi < p1; pi++) {
            const int t = (int)(pi / per_t);
            const int si = a->b->seq[a->tiled ? c->attn_tile[t] : t];
            if (atomic_load_explicit(&c->seq_bad[si], memory_order_relaxed)) continue;
            if (a->tiled)
                attn__tile(a, t, (int)(pi % per_t) * Gs * nkv, Gs, nkv, scr, 0, UINT32_MAX, NULL);
            else
                attn__one(a, t, (int)(pi % per_t) * Gs, Gs, scores);
        }
        atomic_fetch_sub_explicit(&a->left, p1 - p0, memory_order_relaxed);
    }
    model__idle_prefetch(a->c, ith, nth, &a->left);
}

void model__attn(model_ctx *c, const model_batch *b, int il) {
    const model__layer *L = &c->m->layers[il];
    attn__ctx at = {.c = c, .b = b, .layer = il, .tiled = attn__tiled(c, il)};
    at.n_items = at.tiled ? attn__tiles(c, b) : b->n_tokens;
    atomic_init(&at.next, 0);
    const int nth = ks_pool_nth(c->threads), Hkv = L->n_head_kv;
    at.nch = attn__nch(at.n_items, Hkv, c->m->hp.n_head / Hkv, nth);
    at.nkv = at.tiled && at.nch == 1 ? attn__nkv(at.n_items, Hkv, nth) : 1;
    at.chunked = at.tiled && attn__chunks(c, b, il, at.n_items, nth);
    atomic_init(&at.left, at.chunked ? (int64_t)c->attn_ck[at.n_items]
                                     : (int64_t)at.n_items * Hkv * at.nch / at.nkv);
    ks_pool_run(c->threads, attn__task, &at);
}
