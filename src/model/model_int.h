/* model_int.h — private model structures shared by load.c, forward.c and
 * matmul.c: the weights, and the forward pass's context with the matmul
 * floor (matmul.c) that forward.c calls down into. */
#ifndef KS_MODEL_INT_H
#define KS_MODEL_INT_H

#include "kvseal/kern.h"
#include "kvseal/model.h"

#include <stdatomic.h>

/* A weight matrix of N rows of K elements: GGUF rows in the file mapping,
 * or the model's r16 copy of them (kern.h) when the kernels want that
 * layout. GGUF/ggml shape is ne = [K, N]. */
typedef struct model__mat {
    const void *data;   // (N, row_bytes) raw GGUF rows, or N/16 r16 groups
    void *packed;       // data when it is the r16 copy (in model.arena), else NULL
    size_t group_bytes; // bytes per r16 group of 16 rows when packed
    ks_dtype type;
    int64_t K, N;
    size_t row_bytes;
} model__mat;

/* True for the architectures with multi-head latent attention. */
static inline bool model__is_mla(model_arch a) {
    return a == MODEL_ARCH_DEEPSEEK2 || a == MODEL_ARCH_DEEPSEEK32 || a == MODEL_ARCH_GLM_DSA;
}

typedef struct model__layer {
    const float *attn_norm;           // (E)
    model__mat wq, wk, wv, wo;        // wq: (H*D, E); wk, wv: (Hkv*D, E); wo: (E, H*D)
    const float *bq, *bk, *bv;        // (H*D), (Hkv*D), (Hkv*D) or NULL (qwen2, gpt-oss, glm4)
    const float *q_norm, *k_norm;     // (D) or NULL (qwen3, gemma3; glm4moe where present)
    const float *ffn_norm;            // (E) (glm4moe: its post_attention_norm)
    model__mat w_gate, w_up, w_down;  // (F, E), (F, E), (E, F); unused in a MoE layer
    // mixture of experts (NULL arrays in a dense layer): the router and each
    // expert's slice of the 3-D GGUF tensors [K, N, n_expert]
    model__mat gate_inp;             // (n_expert, E) router
    model__mat *gate_exps, *up_exps; // (n_expert) of (F_exp, E)
    model__mat *down_exps;           // (n_expert) of (E, F_exp)
    const float *exp_probs_b;        // (n_expert) or NULL (glm4moe): selection bias
    model__mat gate_sh, up_sh;       // (F_exp, E) the shared expert (data NULL: none)
    model__mat down_sh;              // (E, F_exp)
    const float *post_attn_norm;     // (E) or NULL (gemma2/3 only): post_attention_norm
    const float *post_ffn_norm;      // (E) or NULL (gemma2/3 only): post_ffw_norm
    bool swa;                        // sliding-window layer (model_hparams.n_swa)
    // the layer's attention shape: the model's everywhere but gemma4, whose
    // sliding and full layers differ (model_hparams' gemma4 comment)
    int32_t head_dim;                // D of this layer's heads (Q, K and V alike)
    int32_t n_head_kv;               // its K/V heads
    int32_t n_rot;                   // dims RoPE turns in each head
    const float *out_scale;          // (1) layer_output_scale: the layer's output times it,
                                     // or NULL (1)
    // gemma4's per-layer embedding (NULL data: none): x += rmsnorm(ple_proj
    // (gelu(ple_gate x) * the token's input for this layer)) * ple_norm
    model__mat ple_gate;             // (n_embd_pl, E) inp_gate
    model__mat ple_proj;             // (E, n_embd_pl) proj
    const float *ple_norm;           // (E) post_norm
    // gemma4's MoE layers (26B-A4B; NULL elsewhere): the dense FFN above runs
    // beside the experts. Its output normed by moe_post_norm1; the experts'
    // input is rmsnorm(x) * moe_pre_norm, the router's rmsnorm(x) / sqrt(E)
    // * gate_inp_s; their weighted sum (each expert's output times
    // down_exps_s[e] first) normed by moe_post_norm2; the two added.
    const float *gate_inp_s;         // (E) ffn_gate_inp.scale
    const float *moe_pre_norm;       // (E) pre_ffw_norm_2
    const float *moe_post_norm1;     // (E) post_ffw_norm_1
    const float *moe_post_norm2;     // (E) post_ffw_norm_2
    const float *down_exps_s;        // (n_expert) ffn_down_exps.scale, or NULL (1)
    // multi-head latent attention (deepseek2; wk/wv unused): Q through the
    // q_lora bottleneck (wq_a, q_a_norm, wq_b) or wq alone; the latent and
    // RoPE key from wkv_a; per-head absorption matrices from the 3-D tensors
    model__mat wq_a, wq_b;  // (q_lora, E), (H*mla_qk, q_lora); wq (H*mla_qk, E) if none
    const float *q_a_norm;  // (q_lora)
    model__mat wkv_a;       // (kv_lora + n_rot, E): attn_kv_a_mqa
    const float *kv_a_norm; // (kv_lora)
    model__mat *wk_b;       // (H) of (kv_lora, nope): q_nope -> latent space
    model__mat *wv_b;       // (H) of (mla_v, kv_lora): latent -> a head's output
    // the sparse-attention indexer (deepseek32, glm-dsa)
    model__mat idx_q_b;                     // (idx_heads * idx_dim, q_lora): indexer.attn_q_b
    model__mat idx_k;                       // (idx_dim, E): indexer.attn_k
    model__mat idx_proj;                    // (idx_heads, E): indexer.proj, the per-head weights
    const float *idx_k_norm, *idx_k_norm_b; // (idx_dim) LayerNorm of the key
    int kv_layer;   // this layer's index in the KV pages (-1: a recurrent layer keeps none)
    // Gated DeltaNet (qwen35's recurrent layers; model.h). C = 2 * Hk * S + Hv * S
    // convolution channels (q | k | v), VD = Hv * S
    bool recurrent;
    int rec_layer;               // index among the recurrent layers (its state rows' block)
    model__mat ssm_qkv;          // (C, E) attn_qkv
    model__mat ssm_z;            // (VD, E) attn_gate: the output norm's gate
    model__mat ssm_beta;         // (Hv, E)
    model__mat ssm_alpha;        // (Hv, E)
    const float *ssm_dt, *ssm_a; // (Hv) the decay's bias, and -exp(A_log)
    const float *ssm_conv1d;     // (K, C) tap r of every channel in row r (transposed)
    const float *ssm_norm;       // (S) the gated RMSNorm of a head's output
    model__mat ssm_out;          // (E, VD)
    // bert (model_hparams.encoder): the biases of attn_output, ffn_up and
    // ffn_down, and the LayerNorms after each residual add (w_up / w_down
    // are the FFN; attn_norm / ffn_norm unused)
    const float *b_up, *b_down;       // (F), (E): ffn_up / ffn_down biases (bo: below)
    const float *ln_attn, *ln_attn_b; // (E) attn_output_norm: after the attention's add
    const float *ln_out, *ln_out_b;   // (E) layer_output_norm: after the FFN's add
    const float *shexp_gate;     // (E) qwen35moe: the shared expert's output is weighted by
                                 // sigmoid(shexp_gate . x) per token (NULL: unweighted)
    // nemotron_h: one mixer per layer (the FFN of an attention or Mamba2
    // layer is absent; an MLP layer has no attention). A Mamba2 layer binds
    // ssm_in's row ranges: z to ssm_z, x|B|C to ssm_qkv, dt to ssm_alpha;
    // C = ssm_inner + 2 G N convolution channels
    bool no_ffn, ffn_only;
    bool mamba2;
    const float *ssm_conv_b; // (C) the convolution's bias
    const float *ssm_d;      // (heads) the skip: y += D_h x
    // gpt-oss (NULL elsewhere): attn_output's bias, the per-head sink logits,
    // the router's bias and each expert's biases (expert e's row at e * width)
    const float *bo;          // (E) attn_output.bias
    const float *attn_sinks;  // (H) a logit per query head that joins its softmax denominator
    const float *gate_inp_b;  // (n_expert) ffn_gate_inp.bias
    const float *gate_exps_b; // (n_expert, F_exp) ffn_gate_exps.bias
    const float *up_exps_b;   // (n_expert, F_exp) ffn_up_exps.bias
    const float *down_exps_b; // (n_expert, E) ffn_down_exps.bias
} model__layer;

struct model {
    gguf_file *gguf;
    tok_vocab *vocab;
    model_hparams hp;
    model__mat tok_embd;  // (V, E)
    model__mat output;    // (V, E); = tok_embd when tied
    const float *output_norm;  // (E)
    // gemma4's per-layer embeddings (model_hparams.n_embd_pl; NULL data: none)
    model__mat ple_tok;        // (V, n_layer * n_embd_pl) per_layer_token_embd, rows by token
    model__mat ple_in;         // (n_layer * n_embd_pl, E) per_layer_model_proj
    const float *ple_in_norm;  // (n_embd_pl) per_layer_proj_norm
    // bert: learned positions, token types, the embeddings' LayerNorm
    model__mat pos_embd;                  // (n_ctx_train, E) position_embd
    model__mat type_embd;                 // (n_types, E) token_types (type 0 is used)
    const float *embd_norm, *embd_norm_b; // (E) token_embd_norm
    model__layer *layers;      // (n_layer)
    const float *ones;         // (MODEL_MAX_HEAD_DIM) 1.0f: the weight of an unweighted norm
    int32_t *suppress;         // (n_suppress) gemma4: token ids whose logits are -inf
    int32_t n_suppress;        //   (tokenizer.ggml.suppress_tokens, as llama.cpp's graph)
    float **owned;             // f32 copies of non-F32 vectors (norms, biases)
    int n_owned;
    void *arena; // every matrix's r16 copy, one huge-page buffer (ks_alloc_huge)
    // a NextN (multi-token prediction) head (model_mtp_create): a one-layer
    // model that borrows base's file, vocabulary, embedding and output
    const model *base;                  // NULL: a model of its own
    model__mat mtp_eh;                  // (E, 2E) eh_proj: [enorm(embd) | hnorm(hidden)] -> E
    const float *mtp_enorm, *mtp_hnorm; // (E)
    bool own_output;                    // output is the block's shared_head_head, not base's
};

// ----------------------------------------------------------------------------
// The forward pass's context (forward.c) and its matmul floor (matmul.c)

/* One weight of a matmul run: Y (T, w->N) = X @ w^T. */
typedef struct model__mm_part {
    const model__mat *w;
    const void *X; // (T, x_stride bytes) in kern_act_type(w->type)
    size_t x_stride;
    float *Y;   // (T, ldy), the part's N columns at the front of each row
    size_t ldy; // Y's row stride in floats (0: N)
    int T;
    kern_matmul_fn fn;
    int64_t chunk; // most 16-row units per claim
    int64_t u0;    // the part's first 16-row unit in the run
} model__mm_part;

/* A decode step's matmul run as model__idle_prefetch reads it: its first
 * MODEL__PF_PARTS parts' weights, and the units of the whole run. */
#define MODEL__PF_RUNS 1024
#define MODEL__PF_PARTS 4
typedef struct {
    struct {
        const char *data;  // the part's first unit
        size_t unit_bytes; // bytes of one 16-row unit (rows are back to back)
        int64_t units;
    } p[MODEL__PF_PARTS];
    int n;
    int64_t units; // over all the run's parts
} model__pf_run;

/* Positions per attention chunk (attn.c): a token's attention state is
 * computed chunk by chunk at absolute multiples of it and the chunks'
 * states merged in order. A multiple of KERN_ATTN_BLOCK. */
#define MODEL_ATTN_CHUNK 512u

struct model_ctx {
    const model *m;
    kv_pool *pool;
    ks_pool *threads;
    const kern_vtab *kv;  // kernels
    kern_attn_block_fn attn_block; // kern_attn_block(kv): the tiled attention's kernel
    int32_t max_tokens, max_ctx;
    const float *rope_freqs; // RoPE angle divisors: LongRoPE's long ones past rope_orig_ctx
    // activations, all (T, ...) row-major
    float *x;     // (T, E) residual stream
    float *xn;    // (T, max(E, H*D)) normed input / gathered output rows
    float *q;     // (T, H*D)
    float *k;     // (T, Hkv*D); MLA: the KV row [latent | rope key]
    float *v;     // (T, Hkv*D)
    float *att;   // (T, H*Dv) attention output, Dv = head_dim_v
    float *tmp;   // (T, E)
    float *ple;   // (T, n_layer * n_embd_pl) gemma4's per-layer inputs (NULL: none)
    float *ple_sel; // (nth, n_embd_pl) scratch: a token's per_layer_token_embd part
    float *tmp2;  // (T, E) gemma4's MoE layers: the dense FFN's normed output (NULL: none)
    float *mtp_cat;     // (T, 2E) a NextN head's eh_proj input (NULL: not a head)
    const float *mtp_in; // (T, E) this pass's hidden input rows (model_forward_mtp)
    float *g;     // (T, F), or (T*(k+s), F_exp) rows of a MoE layer in expert order
    float *u;     // the same
    // mixture of experts (NULL in a dense model); k = n_expert_used, s =
    // n_expert_shared (0 or 1): a MoE layer's T*k routed rows in expert order,
    // then (when s) the shared expert's T rows in token order
    float *router;       // (T, n_expert) router logits
    int32_t *sel;        // (T, k) each token's experts, best first
    float *sel_w;        // (T, k) their weights
    int32_t *slot_row;   // (T, k) the row of (token, slot) in expert order
    int32_t *row_tok;    // (T*(k+s)) the token of each row
    int32_t *row_exp;    // (T*(k+s)) the expert of each row (-1: the shared expert's)
    int32_t *x_off;      // (n_expert + 1) first row of each expert's run, then
                         // (n_expert) rows placed so far (fwd__route)
    float *xe;           // (T*(k+s), E) expert inputs gathered, then their outputs
    int32_t sh_row0;     // this layer's first shared-expert row (T*k), or -1: none
    model__mm_part *parts; // (max(2 * (n_expert + s), n_head)) one matmul run's parts
    // multi-head latent attention (NULL without it)
    float *mla_qa; // (T, q_lora) the query bottleneck
    float *mla_qf; // (T, H * mla_qk) queries before absorption: per head nope, then rope
    float *mla_qn; // (T, H * nope) the nope parts, a (T*H)-row matrix the absorption reads
    // the sparse-attention indexer (NULL without it)
    float *dsa_q;       // (T, idx_heads * idx_dim) indexer queries, rope part first
    float *dsa_k;       // (T, idx_dim) indexer keys, stored behind the rope key in the KV row
    float *dsa_w;       // (T, idx_heads) per-head weights
    int32_t *dsa_sel;   // (T, idx_topk) the positions a token attends to, ascending
    int32_t *dsa_n;     // (T) how many (0: every position, the context is within top_k)
    float *dsa_score;   // (nth, max_ctx) a decode step's scores, several threads per token
    size_t dsa_off;     // byte offset of the indexer key in a KV row
    float *scores;      // (nth, G, max_ctx) attention scratch per thread, G query heads per KV head
    float *attn_scr;    // (nth, attn_scr_n) tiled attention's scratch (kern.h attn_block) and states
    size_t attn_scr_n;  // floats per thread, a multiple of 16
    float *attn_part;  // (attn_part_n) decode chunks' states, by item (attn.c attn__join)
    size_t attn_part_n;      // floats: 3 contexts' MODEL_ATTN_CHUNKs x n_head x (Dv + 2) at most
    int attn_slots;          // decode tiles that can run chunk by chunk: 2 nth - 1
    int32_t *attn_ck;        // (attn_slots + 1) first (tile, chunk) item of each tile
    uint32_t *attn_ck0;      // (attn_slots) each tile's first chunk
    atomic_int *attn_left;   // (attn_slots) chunks of each tile not yet done
    int32_t *attn_tile; // (max_tokens + 1) the batch's attention tiles: first token of each
    int32_t *seq_next;  // (max_tokens) per-sequence next position, for validation
    atomic_int *seq_bad; // (max_tokens) per-sequence: a page failed to resolve this pass
    int32_t *seq_first;  // (max_tokens) per-sequence n_tokens before this pass (-1: not in it)
    int32_t max_pages;   // pages covering max_ctx
    const void **kp, **vp;   // (max_tokens, max_pages) this layer's resolved K/V pages per sequence
    int kv_type;             // the pool's KV element type (kv.h): rows of kv_row bytes
    size_t kv_row, head_row; // bytes of one K/V row (kv_dim elements), of one head's part (D)
    // quantized activations: one slot per act type, tagged with its source
    struct {
        void *buf;            // (T, row_bytes)
        size_t cap_row;       // bytes per row available
        const float *src;     // which input it holds (NULL = none)
        int64_t K;
    } act[2]; // [0] Q8_0, [1] Q8_K; (T*max(1, k+s)) rows each
    // one-token passes: the matmul runs of the last one, in order (pf_n of
    // them), and the index of the next run in this one (-1: not one token)
    model__pf_run *pf_runs; // (MODEL__PF_RUNS)
    int pf_n, pf_i;
    // attention with an output gate (qwen35; NULL without)
    float *qg;   // (T, 2 H D) attn_q's rows: per head query, then gate
    float *gate; // (T, H D) the gates, taken out of qg
    // Gated DeltaNet layers (recur.c; NULL without): C = 2 Hk S + Hv S channels
    float *ssm_x;        // (T, C) attn_qkv's rows, then convolved: q | k | v heads
    float *ssm_z;        // (T, Hv S) the output norm's gate
    float *ssm_b;        // (T, Hv) beta (raw, then sigmoid)
    float *ssm_a;        // (T, Hv) alpha (raw, then the decay exp(g))
    float *ssm_o;        // (T, Hv S) the heads' outputs, then normed and gated
    int32_t *ord;        // (T) the batch's tokens grouped by sequence, each in position order
    int32_t *ord_off;    // (max_tokens + 1) sequence s's tokens are ord[ord_off[s] .. [s+1])
    int32_t *ord_fill;   // (max_tokens) scratch of model__order_tokens
    void **st_pg;        // (max_tokens, st_pages) each sequence's state pages this pass
    int st_pages;        // state pages a sequence holds (kv_geom.state_pages)
    int64_t st_rpp;      // state rows (S floats) per page
    int64_t st_rows_layer; // state rows of one recurrent layer
    const model_batch *lora_b; // this pass's batch when it carries adapters (NULL: none)
};

/* Most ssm.state_size (S) a hybrid model may have (stack scratch per head). */
#define MODEL_MAX_SSM_STATE 256

/* Resolves the state pages of every sequence in the batch through kv's tag
 * check (I1) into st_pg; a sequence that fails is marked bad (its tokens
 * then skip the recurrence). Returns false when one failed. */
bool model__state_resolve(model_ctx *c, const model_batch *b);
/* Fills ord / ord_off: the batch's tokens grouped by sequence. */
void model__order_tokens(model_ctx *c, const model_batch *b);
/* A Gated DeltaNet layer: its input in xn (normed), its output into tmp. */
void model__gdn_layer(model_ctx *c, const model_batch *b, const model__layer *L);
/* A Mamba2 layer (nemotron_h): its input in xn (normed), its output into tmp. */
void model__mamba2_layer(model_ctx *c, const model_batch *b, const model__layer *L);

/* load_hp.c: m->hp from m->gguf's `<arch>.*` keys, every architecture's,
 * checked (errors name the file and the key). */
ks_err model__load_hparams(model *m, ks_errbuf *eb);
/* Value il of per-layer key `<arch>.suffix` (an array of block_count
 * integers, or one integer for every layer), or -1 where it is malformed. */
int64_t model__layer_val(const gguf_file *f, const char *arch, const char *suffix, int il);
/* nemotron_h layer il's kind: 'M' Mamba2, '*' attention, '-' MLP; 0 neither. */
char model__nh_kind(const gguf_file *f, const char *arch, int il);
/* Layer il's value of the bool-per-layer key `<arch>.suffix`: 1, 0, or -1
 * where it is absent or malformed. */
int model__layer_flag(const gguf_file *f, const char *arch, const char *suffix, int il);

/* The bert encoder's pass over batch b (model_forward_hidden's, once the
 * batch is validated): each sequence's whole input, every position reading
 * every other of its sequence; hidden rows to h. No logits (no LM head). */
ks_err model__bert_forward(model_ctx *c, const model_batch *b, const model_hidden *h,
                           ks_errbuf *eb);

/* The matrices a LoRA adapter may target (lora.c), in a layer's order. */
typedef enum model__lora_tgt {
    MODEL__LORA_Q, MODEL__LORA_K, MODEL__LORA_V, MODEL__LORA_O,
    MODEL__LORA_GATE, MODEL__LORA_UP, MODEL__LORA_DOWN, MODEL__LORA_N
} model__lora_tgt;

/* Adds each token's LoRA delta to Y (T, N) after the matmul Y = X @ w^T
 * when w is matrix tgt of a layer (wq, wk, wv, wo, w_gate, w_up, w_down):
 * Y[t] += scale * B (A X[t]) for the tokens of the pass's batch whose
 * sequence has an adapter targeting it (c->lora_b). Per token, a fixed
 * reduction order: batch invariant. No-op otherwise (model__matmuls calls
 * it after every run). */
void model__lora_apply(model_ctx *c, const model__mat *w, const float *X, float *Y);
/* Starts a pass over b: checks that b's adapters all belong to c's model
 * (KS_ERR_INVAL otherwise) and sets c->lora_b (NULL: no adapters). */
ks_err model__lora_begin(model_ctx *c, const model_batch *b, ks_errbuf *eb);

/* Forgets cached quantized activations (call when an input buffer changes). */
static inline void model__act_reset(model_ctx *c) { c->act[0].src = c->act[1].src = NULL; }


/* Runs the n parts (X, Y, T and w set) in one pool run. */
void model__mm_run(model_ctx *c, model__mm_part *parts, int n);
/* For a thread idle in a one-token pass's op while *left > 0: prefetches
 * into L2 the head of its range in the next matmul run (no value depends
 * on it). */
void model__idle_prefetch(const model_ctx *c, int ith, int nth, const atomic_llong *left);
/* Layer il's attention for the batch into c->att (attn.c), once the layer's
 * K/V rows are stored and its page tables resolved (c->kp, c->vp); a
 * sequence marked bad (c->seq_bad) is skipped. */
void model__attn(model_ctx *c, const model_batch *b, int il);
/* Runs a row op's task over n rows: on the calling thread alone for one
 * row, else in a pool run. */
void model__run_rows(model_ctx *c, int64_t n, ks_pool_fn fn, void *arg);
/* The act slot of weight w's activation type (Q8_0 or Q8_K; w's is not
 * F32) and the bytes of one of its rows of w->K elements. */
int model__act_slot(const model_ctx *c, const model__mat *w, size_t *rb);
/* T rows of X (K floats each) in the activation type weight w multiplies
 * against (X itself for F32, else quantized once into an act slot and
 * reused); sets *Xa and its row stride. */
void model__act(model_ctx *c, const model__mat *w, const float *X, int T, const void **Xa,
                size_t *stride);
/* Ys[i] = X @ ws[i]^T for T rows of X (K floats each), i < n (<= 4), in one
 * pool run; then the LoRA deltas of the pass's adapters (model__lora_apply). */
void model__matmuls(model_ctx *c, int n, const model__mat *const *ws, const float *X, int T,
                    float *const *Ys);
/* Y = X @ W^T for T rows of X: model__matmuls of one weight. */
void model__matmul(model_ctx *c, const model__mat *w, const float *X, int T, float *Y);

#endif
