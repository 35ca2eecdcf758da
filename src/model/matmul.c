/* matmul.c — the forward pass's matmul floor (model_int.h): Y = X @ W^T
 * for every weight of a run in one ks_pool run, its 16-row units cut into a
 * contiguous range per thread with stealing from the back; the activations
 * quantized once per input into the kernels' type and reused; the idle
 * prefetch of a one-token pass. forward.c calls down into it; it calls
 * nothing of forward.c. Every output row is one kernel call whatever the
 * split (kern.h), so no value depends on the thread count. */
#include "model_int.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Matmul: Y (T, N) = X (T, K) @ W^T, W (N, K) in its GGUF type

/* Weights in one pool run: a decode step hands work to the threads ~16
 * times per layer, and each hand-off (and the wait for the slowest thread)
 * cost about a fifth of decode time; a MoE layer runs all its experts'
 * gate and up matmuls in one run, and all their down matmuls in another.
 *
 * The run's 16-row units are cut into one contiguous range per thread
 * (the first FWD_MM_SEGS threads), which it claims from the front; a thread
 * whose range is done takes from the back of the range with the most left.
 * So each thread streams one run of consecutive weight bytes, and its
 * prefetches run on from one claim into the next. */
#define FWD_MM_SEGS 64

typedef struct {
    // [front:32 | back:32]: the units [front, back) of one range not yet claimed
    _Alignas(64) atomic_ullong fb;
} fwd__mm_seg;

typedef struct {
    model__mm_part *p;
    int n_parts;
    int n_segs;
    int64_t n_units; // 16-row units over the parts, in order
    fwd__mm_seg seg[FWD_MM_SEGS];
} fwd__mm;

/* Weight units (16 rows) per claim at most: about two claims per thread.
 * Long runs of rows let each thread stream its weights (the kernels prefetch
 * the next tile's rows) and reuse the activations from L2; 32-row claims
 * were 25-30% slower in decode on the TinyLlama shape. Each claim restarts
 * the kernel's weight streams, whose first lines then wait a whole DRAM
 * round trip: against four claims a thread, Q4_0 / Q4_K_M tg128 was ahead
 * in 8 of 8 alternated rounds (0.2-1.5%; the qkv run 1-4%; Zen 5,
 * 2026-12-04); one claim a thread was not. */
static int64_t fwd__units_per_claim(int64_t N, int nth) {
    int64_t n = (N / (2 * (int64_t)nth) + 15) / 16;
    return n < 1 ? 1 : n;
}

/* The part that unit u of the run lies in (parts are in unit order). */
static int fwd__mm_part_of(const fwd__mm *a, int64_t u) {
    int lo = 0, hi = a->n_parts - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (a->p[mid].u0 <= u)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static int64_t fwd__mm_part_end(const fwd__mm *a, int pi) {
    return pi + 1 < a->n_parts ? a->p[pi + 1].u0 : a->n_units;
}

/* Claims units [*u0, *u1) of range s, within one part (*pi): from the front
 * (own range) or from the back (another's). A claim takes at most its
 * part's chunk and at most half of what the range has left, so claims
 * shrink to one unit at the end and the threads finish within a unit of
 * each other. */
static bool fwd__mm_take(fwd__mm *a, int s, bool front, int *pi, int64_t *u0, int64_t *u1) {
    atomic_ullong *fb = &a->seg[s].fb;
    unsigned long long v = atomic_load_explicit(fb, memory_order_relaxed); // atomic_ullong's type
    for (;;) {
        const int64_t f = (int64_t)(v >> 32), b = (int64_t)(v & 0xffffffffu);
        if (f >= b) return false;
        const int i = fwd__mm_part_of(a, front ? f : b - 1);
        int64_t n = (b - f) / 2;
        n = n < 1 ? 1 : n > a->p[i].chunk ? a->p[i].chunk : n;
        int64_t lo = front ? f : b - n, hi = front ? f + n : b;
        if (front && hi > fwd__mm_part_end(a, i)) hi = fwd__mm_part_end(a, i);
        if (!front && lo < a->p[i].u0) lo = a->p[i].u0;
        const unsigned long long nv = front ? (unsigned long long)hi << 32 | (unsigned long long)b
                                            : (unsigned long long)f << 32 | (unsigned long long)lo;
        if (atomic_compare_exchange_weak_explicit(fb, &v, nv, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *pi = i;
            *u0 = lo;
            *u1 = hi;
            return true;
        }
    }
}

/* Claims the next units of the run for thread ith: its own range first,
 * then the back of whichever range has the most left. */
static bool fwd__mm_claim(fwd__mm *a, int ith, int *pi, int64_t *u0, int64_t *u1) {
    if (ith < a->n_segs && fwd__mm_take(a, ith, true, pi, u0, u1)) return true;
    for (;;) {
        int best = -1;
        int64_t most = 0;
        for (int s = 0; s < a->n_segs; s++) {
            const unsigned long long v = atomic_load_explicit(&a->seg[s].fb, memory_order_relaxed);
            const int64_t left = (int64_t)(v & 0xffffffffu) - (int64_t)(v >> 32);
            if (left > most) most = left, best = s;
        }
        if (best < 0) return false;
        if (fwd__mm_take(a, best, best == ith, pi, u0, u1)) return true;
    }
}

/* Every output row is computed by one kernel call whatever claim it falls
 * in (kern.h), so the split changes no value. */
static void fwd__mm_task(void *arg, int ith, int nth) {
    fwd__mm *a = arg;
    (void)nth;
    int64_t k, k1;
    int i;
    while (fwd__mm_claim(a, ith, &i, &k, &k1)) {
        const model__mm_part *p = &a->p[i];
        const model__mat *w = p->w;
        const int64_t r = (k - p->u0) * 16,
                      r1 = (k1 - p->u0) * 16 < w->N ? (k1 - p->u0) * 16 : w->N;
        p->fn(w->K, (int)(r1 - r), p->T,
              (const char *)w->data +
                  (w->packed ? (size_t)(r / 16) * w->group_bytes : (size_t)r * w->row_bytes),
              w->row_bytes, p->X, p->x_stride, p->Y + r, p->ldy);
    }
}

/* Runs the n parts (X, Y, T and w set) in one pool run. */
void model__mm_run(model_ctx *c, model__mm_part *parts, int n) {
    const int nth = ks_pool_nth(c->threads);
    fwd__mm a = {.p = parts, .n_parts = n, .n_segs = nth < FWD_MM_SEGS ? nth : FWD_MM_SEGS};
    for (int i = 0; i < n; i++) {
        model__mm_part *p = &parts[i];
        KS_ASSERT(p->T >= 1);
        p->fn = p->w->packed ? c->kv->matmul_r16[p->w->type] : c->kv->matmul[p->w->type];
        KS_ASSERT(p->fn);
        p->chunk = fwd__units_per_claim(p->w->N, nth);
        if (!p->ldy) p->ldy = (size_t)p->w->N;
        p->u0 = a.n_units;
        a.n_units += (p->w->N + 15) / 16;
    }
    KS_ASSERT(a.n_units < ((int64_t)1 << 32));
    if (c->pf_i >= 0 && c->pf_i < MODEL__PF_RUNS) { // a one-token pass: the next one's guess
        model__pf_run *r = &c->pf_runs[c->pf_i++];
        r->n = n < MODEL__PF_PARTS ? n : MODEL__PF_PARTS;
        r->units = a.n_units;
        for (int i = 0; i < r->n; i++) {
            const model__mat *w = parts[i].w;
            r->p[i].data = w->data;
            r->p[i].unit_bytes = w->packed ? w->group_bytes : 16 * w->row_bytes;
            r->p[i].units = (w->N + 15) / 16;
        }
        if (c->pf_i > c->pf_n) c->pf_n = c->pf_i;
    }
    for (int s = 0; s < a.n_segs; s++) {
        const unsigned long long f = (unsigned long long)(a.n_units * s / a.n_segs),
                                 b = (unsigned long long)(a.n_units * (s + 1) / a.n_segs);
        atomic_init(&a.seg[s].fb, f << 32 | b);
    }
    ks_pool_run(c->threads, fwd__mm_task, &a);
}

/* Bytes of its next range a thread idle in a one-token op asks for at most:
 * what a thread streams in ~20 us, well within L2. */
#define FWD_PF_BYTES (192u << 10)

/* For a thread with nothing left to do in a one-token pass's op while
 * another works (*left > 0): prefetches into L2 the head of the range
 * model__mm_run will give it in the next matmul run, as the last one-token
 * pass ran it, until *left drops to 0 or FWD_PF_BYTES are asked for. The
 * memory bus idles through a one-token op, and the run then starts with
 * that part of the thread's range cached. A wrong guess (another model
 * shape, the first pass) costs only the reads; no value depends on it. */
void model__idle_prefetch(const model_ctx *c, int ith, int nth, const atomic_llong *left) {
    if (c->pf_i < 0 || c->pf_i >= c->pf_n) return;
    const model__pf_run *r = &c->pf_runs[c->pf_i];
    const int segs = nth < FWD_MM_SEGS ? nth : FWD_MM_SEGS;
    if (ith >= segs) return;
    int64_t u = r->units * ith / segs; // the range's first unit, as model__mm_run cuts them
    int i = 0;
    while (i < r->n && u >= r->p[i].units)
        u -= r->p[i++].units;
    if (i == r->n) return;
    const char *p = r->p[i].data + (size_t)u * r->p[i].unit_bytes;
    size_t len = (size_t)(r->p[i].units - u) * r->p[i].unit_bytes;
    if (len > FWD_PF_BYTES) len = FWD_PF_BYTES;
    for (size_t off = 0; off < len; off += 4096) {
        if (atomic_load_explicit(left, memory_order_relaxed) <= 0) return;
        for (size_t o = off; o < off + 4096 && o < len; o += 64)
            __builtin_prefetch(p + o, 0, 2); // into L2 (prefetcht1 on x86)
    }
}

typedef struct {
    const kern_vtab *kv;
    kern_quant_fn fn;
    const float *src;  // (T, K)
    int64_t K;
    void *dst;         // (T, dst_stride)
    size_t dst_stride;
    int T;
    atomic_llong next; // next token row to claim
} fwd__quant;

/* One-token passes quantize on the calling thread alone (model__run_rows),
 * so no thread here idles in a one-token pass: no idle prefetch. */
static void fwd__quant_task(void *arg, int ith, int nth) {
    fwd__quant *a = arg;
    (void)ith, (void)nth;
    int64_t t0, t1;
    while (ks_pool_claim(&a->next, a->T, 4, &t0, &t1))
        for (int64_t t = t0; t < t1; t++)
            a->fn(a->src + (size_t)t * (size_t)a->K, (char *)a->dst + (size_t)t * a->dst_stride,
                  a->K);
}

/* Runs a row op's task over n rows: on the calling thread alone for one
 * row (one thread would do it all anyway; this saves the hand-off), else
 * in a pool run. */
void model__run_rows(model_ctx *c, int64_t n, ks_pool_fn fn, void *arg) {
    if (n == 1)
        fn(arg, 0, 1);
    else
        ks_pool_run(c->threads, fn, arg);
}

/* The act slot of weight w's activation type (Q8_0 or Q8_K; w's is not
 * F32) and the bytes of one of its rows of w->K elements. */
int model__act_slot(const model_ctx *c, const model__mat *w, size_t *rb) {
    const ks_dtype at = kern_act_type(w->type);
    KS_ASSERT(at == KS_DTYPE_Q8_0 || at == KS_DTYPE_Q8_K);
    const int slot = at == KS_DTYPE_Q8_0 ? 0 : 1;
    uint64_t n = 0;
    KS_ASSERT(ks_dtype_row_bytes(at, (uint64_t)w->K, &n) && n <= c->act[slot].cap_row);
    *rb = (size_t)n;
    return slot;
}

/* T rows of X (K floats each) in the activation type weight w multiplies
 * against: X itself for F32, else quantized once into an act slot and reused
 * for other weights reading the same X. Sets *Xa and its row stride. */
void model__act(model_ctx *c, const model__mat *w, const float *X, int T, const void **Xa,
                size_t *stride) {
    const ks_dtype at = kern_act_type(w->type);
    if (at == KS_DTYPE_F32) {
        *Xa = X;
        *stride = (size_t)w->K * sizeof(float);
        return;
    }
    size_t rb = 0;
    const int slot = model__act_slot(c, w, &rb);
    if (c->act[slot].src != X || c->act[slot].K != w->K) {
        fwd__quant q = {.kv = c->kv,
                        .fn = c->kv->quantize_act[at],
                        .src = X,
                        .K = w->K,
                        .dst = c->act[slot].buf,
                        .dst_stride = (size_t)rb,
                        .T = T};
        atomic_init(&q.next, 0);
        KS_ASSERT(q.fn);
        model__run_rows(c, T, fwd__quant_task, &q);
        c->act[slot].src = X;
        c->act[slot].K = w->K;
    }
    *Xa = c->act[slot].buf;
    *stride = (size_t)rb;
}

/* Ys[i] = X @ ws[i]^T for T rows of X (K floats each), i < n (<= 4), in one
 * pool run; then the LoRA deltas of the pass's adapters (lora.c). */
void model__matmuls(model_ctx *c, int n, const model__mat *const *ws, const float *X, int T,
                    float *const *Ys) {
    model__mm_part p[4] = {0};
    KS_ASSERT(n >= 1 && n <= 4);
    for (int i = 0; i < n; i++) {
        p[i].w = ws[i];
        p[i].Y = Ys[i];
        p[i].T = T;
        model__act(c, ws[i], X, T, &p[i].X, &p[i].x_stride);
    }
    model__mm_run(c, p, n);
    for (int i = 0; c->lora_b && T == c->lora_b->n_tokens && i < n; i++)
        model__lora_apply(c, ws[i], X, Ys[i]);
}

/* Y = X @ W^T for T rows of X: model__matmuls of one weight. */
void model__matmul(model_ctx *c, const model__mat *w, const float *X, int T, float *Y) {
    model__matmuls(c, 1, &w, X, T, &Y);
}
