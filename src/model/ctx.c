/* ctx.c — a forward context (model.h: model_ctx_create, model_ctx_free):
 * the scratch of a pass sized once for its largest batch and context, the
 * thread pool, and the per-layer views forward.c reads. */
#include "model_int.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

ks_err model_ctx_create(const model *m, kv_pool *pool, int n_threads, int32_t max_tokens,
                        int32_t max_ctx, model_ctx **out, ks_errbuf *eb) {
    *out = NULL;
    const model_hparams *hp = &m->hp;
    if (max_tokens < 1 || max_ctx < 1 || n_threads < 1)
        return ks_seterr(eb, KS_ERR_INVAL, "model context: bad sizes (tokens %d, ctx %d, threads %d)",
                         max_tokens, max_ctx, n_threads);
    const kv_geom *g = kv_pool_geom(pool);
    const kv_geom mg = model_kv_geom(m, g->page_tokens, g->kv_type);
    if (g->n_layer != hp->n_layer_attn ||
        g->kv_dim != hp->kv_dim ||
        g->state_pages != mg.state_pages)
        return ks_seterr(eb, KS_ERR_INVAL, "model context: kv pool geometry does not match the model");
    ks_err te = model_kv_type_check(m, g->kv_type, eb);
    if (te) return te;
    model_ctx *c = calloc(1, sizeof *c);
    if (!c) return ks_seterr(eb, KS_ERR_NOMEM, "model context");
    c->m = m;
    c->pool = pool;
    c->kv = kern_get();
    c->attn_block = kern_attn_block(c->kv);
    c->kv_type = g->kv_type;
    c->kv_row = kv_row_bytes(g);
    uint64_t hrb = 0;
    KS_ASSERT(ks_dtype_row_bytes((uint32_t)g->kv_type, (uint64_t)hp->head_dim, &hrb));
    c->head_row = (size_t)hrb;
    c->max_tokens = max_tokens;
    c->max_ctx = max_ctx;
    // as llama.cpp chooses: by the context the model is run at, not per position
    c->rope_freqs =
        hp->rope_freqs_long && max_ctx > hp->rope_orig_ctx ? hp->rope_freqs_long : hp->rope_freqs;
    c->threads = ks_pool_create(n_threads);
    // gemma4's layers differ: buffers fit the largest head, the most K/V
    // heads, and attention's G query heads per KV head on the layer with fewest
    const size_t DM = (size_t)(hp->head_dim > hp->head_dim_swa ? hp->head_dim : hp->head_dim_swa);
    int32_t hkv_min = hp->n_head_kv;
    for (int il = 0; il < hp->n_layer; il++)
        if (m->layers[il].n_head_kv > 0 && m->layers[il].n_head_kv < hkv_min)
            hkv_min = m->layers[il].n_head_kv;
    size_t T = (size_t)max_tokens, E = (size_t)hp->n_embd, HD = (size_t)hp->n_head * DM;
    size_t KVD = (size_t)hp->n_head_kv * DM, F = (size_t)hp->n_ff;
    size_t XN = E > HD ? E : HD;
    const size_t NX = (size_t)hp->n_expert, KX = (size_t)hp->n_expert_used;
    const size_t H = (size_t)hp->n_head, NOPE = (size_t)(hp->mla_qk - hp->n_rot);
    // expert rows per token (routed, then shared); rows of activations a matmul reads
    const size_t KS = KX + (size_t)hp->n_expert_shared;
    size_t TA = NX ? T * KS : T;
    if (hp->kv_lora && TA < T * H) TA = T * H; // MLA: per-head rows of q_nope and the output
    if (NX && KS * (size_t)hp->n_ff_exp > F) F = KS * (size_t)hp->n_ff_exp;
    const size_t PL = (size_t)hp->n_embd_pl; // gemma4: g holds the per-layer gate rows too
    if (PL > F) F = PL;
    if (PL) {
        c->ple = ks_alloc_aligned(T * (size_t)hp->n_layer * PL * sizeof(float));
        c->ple_sel = ks_alloc_aligned((size_t)n_threads * PL * sizeof(float));
    }
    c->x = ks_alloc_aligned(T * E * sizeof(float));
    c->xn = ks_alloc_aligned(T * XN * sizeof(float));
    c->q = ks_alloc_aligned(T * HD * sizeof(float));
    c->k = ks_alloc_aligned(T * KVD * sizeof(float));
    c->v = ks_alloc_aligned(T * KVD * sizeof(float));
    c->att = ks_alloc_aligned(T * HD * sizeof(float));
    c->tmp = ks_alloc_aligned(T * E * sizeof(float));
    c->g = ks_alloc_aligned(T * F * sizeof(float));
    c->u = ks_alloc_aligned(T * F * sizeof(float));
    bool moe_ok = true;
    if (NX) {
        c->router = ks_alloc_aligned(T * NX * sizeof(float));
        c->sel = malloc(T * KX * sizeof(int32_t));
        c->sel_w = malloc(T * KX * sizeof(float));
        c->slot_row = malloc(T * KX * sizeof(int32_t));
        c->row_tok = malloc(T * KS * sizeof(int32_t));
        c->row_exp = malloc(T * KS * sizeof(int32_t));
        c->x_off = malloc((2 * NX + 1) * sizeof(int32_t));
        c->xe = ks_alloc_aligned(T * KS * E * sizeof(float));
        moe_ok = c->router && c->sel && c->sel_w && c->slot_row && c->row_tok && c->row_exp &&
                 c->x_off && c->xe;
    }
    if (NX || hp->kv_lora) {
        const size_t NP = 2 * (NX + KS - KX); // every expert's gate and up, the shared one's
        c->parts = calloc(NP > H ? NP : H, sizeof *c->parts);
        moe_ok = moe_ok && c->parts;
    }
    if (hp->kv_lora) {
        c->mla_qa = ks_alloc_aligned(T * (size_t)(hp->q_lora ? hp->q_lora : 1) * sizeof(float));
        c->mla_qf = ks_alloc_aligned(T * H * (size_t)hp->mla_qk * sizeof(float));
        c->mla_qn = ks_alloc_aligned(T * H * NOPE * sizeof(float));
        moe_ok = moe_ok && c->mla_qa && c->mla_qf && c->mla_qn;
    }
    if (hp->idx_topk) {
        const size_t NI = (size_t)hp->idx_heads, I = (size_t)hp->idx_dim;
        c->dsa_q = ks_alloc_aligned(T * NI * I * sizeof(float));
        c->dsa_k = ks_alloc_aligned(T * I * sizeof(float));
        c->dsa_w = ks_alloc_aligned(T * NI * sizeof(float));
        c->dsa_sel = malloc(T * (size_t)hp->idx_topk * sizeof(int32_t));
        c->dsa_n = malloc(T * sizeof(int32_t));
        c->dsa_score = ks_alloc_aligned((size_t)n_threads * (size_t)max_ctx * sizeof(float));
        uint64_t off = 0;
        KS_ASSERT(ks_dtype_row_bytes((uint32_t)g->kv_type, (uint64_t)hp->head_dim, &off));
        c->dsa_off = (size_t)off;
        moe_ok =
            moe_ok && c->dsa_q && c->dsa_k && c->dsa_w && c->dsa_sel && c->dsa_n && c->dsa_score;
    }
    // per thread: G query heads' scores, or the indexer heads' dot products and their sum
    const size_t G = (size_t)(hp->n_head / hkv_min), GI = (size_t)hp->idx_heads + 1;
    c->scores =
        ks_alloc_aligned((size_t)n_threads * (G > GI ? G : GI) * (size_t)max_ctx * sizeof(float));
    // tiled attention: a block's keys and values, then R x n_head online-softmax states
    size_t DA = DM, DV = DM;
    for (int il = 0; il < hp->n_layer; il++)
        DA = (size_t)m->layers[il].head_dim > DA ? (size_t)m->layers[il].head_dim : DA;
    if ((size_t)hp->head_dim_v > DV) DV = (size_t)hp->head_dim_v;
    if (DA > DV) DV = DA;
    const size_t RG = (size_t)KERN_ATTN_ROWS * (size_t)hp->n_head; // every KV head's group
    // the kernel's, then a chunk's states and the merged ones (attn.c)
    c->attn_scr_n = (KERN_ATTN_SCRATCH(DA, DV) + 2 * RG * (DV + 2) + 15) / 16 * 16;
    c->attn_slots = 2 * n_threads - 1;
    // chunk states for the decode steps of up to 3 full contexts (more
    // chunks than that walk their tiles whole): bounded whatever the threads
    const size_t n_slots = c->attn_slots < 3 ? (size_t)c->attn_slots : 3;
    c->attn_part_n =
        n_slots * ((size_t)max_ctx / MODEL_ATTN_CHUNK + 2) * (size_t)hp->n_head * (DV + 2);
    c->attn_part = malloc(c->attn_part_n * sizeof(float));
    c->attn_ck = malloc(((size_t)c->attn_slots + 1) * sizeof(int32_t));
    c->attn_ck0 = malloc((size_t)c->attn_slots * sizeof(uint32_t));
    c->attn_left = malloc((size_t)c->attn_slots * sizeof(atomic_int));
    c->attn_scr = ks_alloc_aligned((size_t)n_threads * c->attn_scr_n * sizeof(float));
    if (c->attn_scr) // stale lanes of a block are masked; zero keeps them finite
        memset(c->attn_scr, 0, (size_t)n_threads * c->attn_scr_n * sizeof(float));
    c->attn_tile = malloc((T + 1) * sizeof(int32_t));
    c->seq_next = malloc(T * sizeof(int32_t));
    c->seq_bad = malloc(T * sizeof(atomic_int));
    c->seq_first = malloc(T * sizeof(int32_t));
    c->max_pages = (max_ctx + g->page_tokens - 1) / g->page_tokens;
    c->kp = malloc(T * (size_t)c->max_pages * sizeof(void *));
    c->vp = malloc(T * (size_t)c->max_pages * sizeof(void *));
    // largest activation row: K is one of E, H*D, F, q_lora
    size_t Kmax = XN > F ? XN : F;
    if ((size_t)hp->q_lora > Kmax) Kmax = (size_t)hp->q_lora;
    const size_t S = (size_t)hp->ssm_state, VD = (size_t)hp->ssm_inner;
    if (VD > Kmax) Kmax = VD; // ssm_out's input
    if (PL > Kmax) Kmax = PL; // gemma4's per-layer proj
    if (m->mtp_eh.data && 2 * E > Kmax) Kmax = 2 * E; // a NextN head's eh_proj
    uint64_t rb0 = 0, rbk = 0;
    ks_dtype_row_bytes(KS_DTYPE_Q8_0, (Kmax + 31) / 32 * 32, &rb0);
    ks_dtype_row_bytes(KS_DTYPE_Q8_K, (Kmax + 255) / 256 * 256, &rbk);
    c->act[0].cap_row = (size_t)rb0;
    c->act[1].cap_row = (size_t)rbk;
    c->act[0].buf = ks_alloc_aligned(TA * (size_t)rb0);
    c->act[1].buf = ks_alloc_aligned(TA * (size_t)rbk);
    c->pf_runs = calloc(MODEL__PF_RUNS, sizeof *c->pf_runs);
    c->pf_i = -1;
    if (hp->attn_out_gate) {
        c->qg = ks_alloc_aligned(T * 2 * HD * sizeof(float));
        c->gate = ks_alloc_aligned(T * HD * sizeof(float));
        moe_ok = moe_ok && c->qg && c->gate;
    }
    if (S) { // hybrid: the recurrent layers' scratch and the state pages' table
        const size_t C = 2 * (size_t)hp->ssm_k_heads * S + VD, HV = (size_t)hp->ssm_v_heads;
        c->st_pages = g->state_pages;
        c->st_rpp = (int64_t)(kv_page_bytes(g) / (4 * S));
        c->st_rows_layer = (int64_t)((size_t)(hp->ssm_conv - 1) * (C / S) + VD);
        c->ssm_x = ks_alloc_aligned(T * C * sizeof(float));
        c->ssm_z = ks_alloc_aligned(T * VD * sizeof(float));
        c->ssm_o = ks_alloc_aligned(T * VD * sizeof(float));
        c->ssm_b = ks_alloc_aligned(T * HV * sizeof(float));
        c->ssm_a = ks_alloc_aligned(T * HV * sizeof(float));
        c->ord = malloc(T * sizeof(int32_t));
        c->ord_off = malloc((T + 1) * sizeof(int32_t));
        c->ord_fill = malloc(T * sizeof(int32_t));
        c->st_pg = calloc(T * (size_t)c->st_pages, sizeof(void *));
        moe_ok = moe_ok && c->st_pages > 0 && c->ssm_x && c->ssm_z && c->ssm_o && c->ssm_b &&
                 c->ssm_a && c->ord && c->ord_off && c->ord_fill && c->st_pg;
    }
    if (hp->encoder) { // bert: a sequence's tokens, for its bidirectional attention
        c->ord = malloc(T * sizeof(int32_t));
        c->ord_off = malloc((T + 1) * sizeof(int32_t));
        c->ord_fill = malloc(T * sizeof(int32_t));
        moe_ok = moe_ok && c->ord && c->ord_off && c->ord_fill;
    }
    if (PL && (!c->ple || !c->ple_sel)) moe_ok = false;
    if (m->mtp_eh.data && !(c->mtp_cat = ks_alloc_aligned(T * 2 * E * sizeof(float))))
        moe_ok = false;
    if (hp->arch == MODEL_ARCH_GEMMA4 && NX && !(c->tmp2 = ks_alloc_aligned(T * E * sizeof(float))))
        moe_ok = false;
    if (!c->threads || !c->x || !c->xn || !c->q || !c->k || !c->v || !c->att || !c->tmp || !c->g ||
        !c->u || !c->scores || !c->attn_scr || !c->attn_part || !c->attn_ck ||
        !c->attn_ck0 || !c->attn_left || !c->attn_tile || !c->seq_next || !c->seq_bad || !c->seq_first || !c->kp || !c->vp ||
        !c->act[0].buf || !c->act[1].buf || !c->pf_runs || !moe_ok) {
        model_ctx_free(c);
        return ks_seterr(eb, KS_ERR_NOMEM, "model context: scratch for %d tokens", max_tokens);
    }
    *out = c;
    return KS_OK;
}

void model_ctx_free(model_ctx *c) {
    if (!c) return;
    ks_pool_destroy(c->threads);
    float *bufs[] = {c->x,      c->xn,    c->q,      c->k,      c->v,        c->att,    c->tmp,
                     c->g,      c->u,     c->scores, c->router, c->xe,       c->mla_qa, c->mla_qf,
                     c->mla_qn, c->dsa_q, c->dsa_k,  c->dsa_w,  c->dsa_score, c->qg,
                     c->gate,   c->ssm_x, c->ssm_z,  c->ssm_o,  c->ssm_b,    c->ssm_a,
                     c->ple,    c->ple_sel, c->tmp2, c->attn_scr, c->mtp_cat};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ks_free_aligned(bufs[i]);
    ks_free_aligned(c->act[0].buf);
    ks_free_aligned(c->act[1].buf);
    free(c->attn_part);
    free(c->attn_ck);
    free(c->attn_ck0);
    free(c->attn_left);
    free(c->sel);
    free(c->sel_w);
    free(c->slot_row);
    free(c->row_tok);
    free(c->row_exp);
    free(c->x_off);
    free(c->parts);
    free(c->pf_runs);
    free(c->dsa_sel);
    free(c->dsa_n);
    free(c->attn_tile);
    free(c->seq_next);
    free(c->seq_bad);
    free(c->seq_first);
    free(c->kp);
    free(c->vp);
    free(c->ord);
    free(c->ord_off);
    free(c->ord_fill);
    free(c->st_pg);
    free(c);
}
