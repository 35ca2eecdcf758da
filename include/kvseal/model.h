/* model.h — hyper-parameters, weights and the batched forward pass of
 * Llama-family models (llama, qwen2, qwen3, phi3, gemma2, gemma3, gemma4, glm4;
 * mixture-of-experts llama, qwen3moe, glm4moe and gpt-oss) from GGUF.
 *
 * The forward pass takes a batch of tokens from any number of sequences at
 * any positions; each sequence reads and writes its K/V through its kv_seq
 * block table in a kv_pool. Batch invariance: a token's logits are
 * bit-identical whatever else shares the batch, however the prompt was
 * chunked, and however many threads run (kern.h states the kernel contract;
 * attention and norms here are per-row with a fixed reduction order). */
#ifndef KS_MODEL_H
#define KS_MODEL_H

#include "kvseal/base.h"
#include "kvseal/gguf.h"
#include "kvseal/kv.h"
#include "kvseal/tok.h"

typedef enum model_arch {
    MODEL_ARCH_LLAMA = 0,
    MODEL_ARCH_QWEN2 = 1,
    MODEL_ARCH_QWEN3 = 2,
    MODEL_ARCH_QWEN3MOE = 3,
    MODEL_ARCH_PHI3 = 4,
    MODEL_ARCH_GEMMA2 = 5,
    MODEL_ARCH_GEMMA3 = 6,
    MODEL_ARCH_GLM4 = 7,
    MODEL_ARCH_GLM4MOE = 8,
    MODEL_ARCH_DEEPSEEK2 = 9,
    MODEL_ARCH_DEEPSEEK32 = 10, /* deepseek2 + the sparse-attention indexer */
    MODEL_ARCH_GLM_DSA = 11,    /* GLM-5: the same attention under its own name */
    MODEL_ARCH_QWEN35 = 12,     /* Qwen3.5: Gated DeltaNet layers between gated attention */
    MODEL_ARCH_QWEN35MOE = 13,  /* the same layers with a MoE FFN and a gated shared expert */
    MODEL_ARCH_MISTRAL3 = 20,   /* Ministral 3 / Mistral Small 3.x: llama's layers, its own YaRN
                                   magnitude and a per-position query temperature */
    MODEL_ARCH_NEMOTRON_H = 15, /* Nemotron-H: per layer Mamba2, attention or a squared-ReLU MLP */
    MODEL_ARCH_GPT_OSS = 14,    /* gpt-oss: attention sinks, biases, clamped SwiGLU experts */
    MODEL_ARCH_BERT = 16,       /* an encoder for embeddings: bidirectional, no LM head */
    MODEL_ARCH_NOMIC_BERT = 17, /* bert with RoPE (no learned positions), SwiGLU, no biases */
    MODEL_ARCH_GEMMA4 = 21,     /* Gemma 4: per-layer head sizes and K/V heads, V from K where
                                   attn_v is absent, a scale on each layer's output */
} model_arch;

/* How a mixture-of-experts router turns logits into expert weights. */
typedef enum model_gating {
    MODEL_GATING_SOFTMAX = 0, /* softmax over all experts, then top-k */
    MODEL_GATING_SIGMOID = 1, /* sigmoid per expert, then top-k */
    MODEL_GATING_SOFTMAX_WEIGHT = 2, /* top-k of the logits, then softmax over those k
                                        (gpt-oss; llama.cpp's SOFTMAX_WEIGHT) */
} model_gating;

/* Most experts a token may use (<arch>.expert_used_count). */
#define MODEL_MAX_EXPERTS_USED 16
/* Most expert groups a router may have (<arch>.expert_group_count). */
#define MODEL_MAX_EXPERT_GROUPS 64
/* Most shared experts a MoE layer may have (<arch>.expert_shared_count). */
#define MODEL_MAX_SHARED_EXPERTS 8

/* The architectures model_load runs, as its refusal lists them. */
#define MODEL_ARCHS                                                                                \
    "llama, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3, gemma4, glm4, glm4moe, deepseek2, "      \
    "deepseek32, glm-dsa, qwen35, qwen35moe, mistral3, nemotron_h, gpt-oss, bert, nomic-bert"

/* Largest head size (attention.key_length) a model may have. */
#define MODEL_MAX_HEAD_DIM 1024

typedef struct model_hparams {
    model_arch arch;
    char arch_name[16];
    int32_t n_vocab;     /* rows of token_embd */
    int32_t n_ctx_train; /* <arch>.context_length */
    int32_t n_embd;      /* E */
    int32_t n_layer;     /* layers the forward pass runs (and K/V is kept for):
                            block_count less the n_layer_nextn trailing ones */
    int32_t n_layer_nextn; /* glm4moe's nextn_predict_layers: trailing NextN (multi-token
                              prediction) blocks, counted in block_count, never run */
    int32_t n_head;      /* query heads */
    int32_t n_head_kv;   /* K/V heads (GQA when < n_head) */
    int32_t head_dim;    /* D: K elements per KV head (MLA: kv_lora + n_rot, the latent row) */
    int32_t head_dim_v;  /* V elements per KV head attention reads (MLA: kv_lora) [head_dim] */
    int32_t n_ff;        /* FFN hidden size */
    int32_t n_rot;       /* rotary dims (<= head_dim) */
    float rope_base;     /* rope.freq_base */
    float rope_scale;    /* freq_scale = 1/factor of linear or YaRN scaling (1 = none) */
    float rope_ext_factor;   /* YaRN: 0 = off (kern_rope_cfg) */
    float rope_attn_factor;  /* YaRN magnitude factor (1 = none) */
    float rope_corr[2];      /* YaRN correction range (kern_rope_yarn_corr) */
    const float *rope_freqs; /* rope_freqs.weight: n_rot/2 angle divisors (Llama 3), or
                                phi3's rope_factors_short, or NULL */
    const float *rope_freqs_long; /* phi3's rope_factors_long (LongRoPE), used instead of
                                     rope_freqs when the context exceeds rope_orig_ctx */
    int32_t rope_orig_ctx;        /* rope.scaling.original_context_length (n_ctx_train if absent) */
    float norm_eps;      /* attention.layer_norm_rms_epsilon */
    bool rope_neox;      /* pairs (i, i+n_rot/2) instead of (2i, 2i+1) */
    bool tied_output;    /* output = token_embd */
    /* mixture of experts (n_expert 0: a dense FFN of n_ff) */
    int32_t n_expert;      /* <arch>.expert_count */
    int32_t n_expert_used; /* experts per token (top-k) */
    int32_t n_ff_exp;      /* each expert's FFN hidden size */
    model_gating gating;   /* <arch>.expert_gating_func (softmax unless given; glm4moe sigmoid) */
    bool expert_norm;      /* top-k weights renormalized to sum 1 (glm4moe: expert_weights_norm) */
    float expert_scale;    /* top-k weights multiplied by this (1 = none; glm4moe:
                              expert_weights_scale) */
    int32_t n_layer_dense; /* leading_dense_block_count: layers [0, n) have a dense FFN of n_ff */
    int32_t n_expert_shared; /* glm4moe, MLA: 0, or S shared experts every token runs, stored
                                as one FFN of S * n_ff_exp, added to the routed sum unweighted */
    int32_t n_expert_groups; /* expert_group_count: n_expert in this many groups (0, 1: none) */
    int32_t n_group_used;    /* expert_group_used_count: the top-k is drawn from the groups
                                whose two best (biased) scores sum highest */
    /* Gemma 2/3 (the neutral value for other architectures in brackets) */
    int32_t n_swa;        /* attention.sliding_window: on a sliding layer the token at
                             position p sees positions j > p - n_swa (0: no sliding layers) */
    int32_t swa_period;   /* with n_swa > 0, layer il slides when il % swa_period <
                             swa_period - 1 (gemma2 2, gemma3 6), every layer when 0 */
    float rope_base_swa;  /* RoPE base of sliding layers (gemma3 10000) [rope_base] */
    float rope_scale_swa; /* RoPE freq_scale of sliding layers (gemma3 1) [rope_scale] */
    float attn_scale;     /* attention scores are q.k * attn_scale [1/sqrt(head_dim)] */
    float attn_softcap;   /* scores = c * tanh(scores / c) before the softmax [0: none] */
    float final_softcap;  /* logits = c * tanh(logits / c) [0: none] */
    float embd_scale;     /* token embeddings are multiplied by this (sqrt(n_embd)) [1] */
    float attn_temp_scale;    /* mistral3: after RoPE the query at position p is multiplied by
                                 1 + attn_temp_scale * log(floor(p / attn_temp_floor) + 1) [0] */
    int32_t attn_temp_floor;  /* its length: rope.scaling.original_context_length [0] */
    bool ffn_gelu;        /* FFN is GELU(gate) * up (tanh approximation) [false: SiLU] */
    bool post_norms;      /* RMSNorm of each sublayer's output before its residual add */
    /* gpt-oss's experts (0: the plain SwiGLU silu(g) * u): with alpha > 0 an
     * expert's hidden value is min(g, limit) * sigmoid(alpha * min(g, limit))
     * * (clamp(u, -limit, limit) + 1), g and u with their biases */
    float swiglu_alpha; /* 1.702 */
    float swiglu_limit; /* 7.0 */
    /* BERT-family encoders (bert): bidirectional attention within a sequence,
     * learned positions, LayerNorms with biases after each sublayer's
     * residual add, GELU FFN, no LM head: embeddings only, and a sequence's
     * whole input in one batch [false] */
    bool encoder;
    /* Multi-head latent attention (deepseek2; kv_lora 0: none). The KV row of
     * a position is [rmsnorm(latent) (kv_lora) | RoPE key (n_rot)], one per
     * layer (n_head_kv 1, head_dim kv_lora + n_rot): K is the whole row, V
     * its first kv_lora elements; queries are absorbed into latent space. */
    int32_t kv_lora;      /* attention.kv_lora_rank */
    int32_t q_lora;       /* attention.q_lora_rank (0: one attn_q matrix) */
    int32_t mla_qk;       /* attention.key_length_mla: a query head's nope + rope dims */
    int32_t mla_v;        /* attention.value_length_mla: a head's output dims after attn_v_b */
    /* DeepSeek sparse attention (deepseek32, glm-dsa; idx_topk 0: none): an
     * indexer scores every past position per token, sum over idx_heads of
     * relu(q_h . k_j) * w_h, and attention reads only the idx_topk best. Its
     * keys (idx_dim) follow the rope key in the KV row. */
    int32_t idx_heads; /* attention.indexer.head_count */
    int32_t idx_dim;   /* attention.indexer.key_length */
    int32_t idx_topk;  /* attention.indexer.top_k */
    float ln_eps;      /* attention.layer_norm_epsilon: the indexer key's LayerNorm */
    /* Hybrid recurrent models (qwen35; ssm_state 0: none). Layer il attends
     * when (il + 1) % attn_interval == 0; the others are Gated DeltaNet
     * layers: a causal convolution of width ssm_conv over the q|k|v channels,
     * then per value head a state of ssm_state x ssm_state decayed, updated
     * by the delta rule and read by the query. Only the attention layers
     * keep K/V; each sequence's recurrent state lives in its state pages
     * (kv.h g.state_pages). */
    int32_t n_layer_attn;  /* layers that keep K/V (the KV geometry's n_layer): n_layer
                              without the recurrent ones */
    int32_t ssm_conv;      /* ssm.conv_kernel */
    int32_t ssm_state;     /* ssm.state_size: S, a head's key and value size */
    int32_t ssm_k_heads;   /* ssm.group_count: query/key heads */
    int32_t ssm_v_heads;   /* ssm.time_step_rank: value heads, a multiple of ssm_k_heads;
                              value head h reads key head h % ssm_k_heads */
    int32_t attn_interval; /* full_attention_interval */
    /* Mamba2 (nemotron_h): each layer is one block x + mixer(norm(x)), the
     * mixer a Mamba2 layer (head_count_kv and feed_forward_length 0 in the
     * file's per-layer arrays), attention without RoPE (head_count_kv > 0)
     * or an MLP of relu(up x)^2 (feed_forward_length > 0). A Mamba2 layer:
     * ssm_in gives z | x B C | dt; x B C pass a causal convolution (with
     * bias, then SiLU); per head h of ssm_head_dim elements, a state of
     * ssm_head_dim x ssm_state decays by exp(softplus(dt + dt_bias) A_h)
     * and takes in B x dt (B, C of group h / (heads / groups)); y = state C
     * + D_h x, times silu(z), RMS-normed per group. Here ssm_k_heads is
     * ssm.group_count, ssm_v_heads the heads (ssm.time_step_rank). */
    int32_t ssm_inner;     /* ssm.inner_size: d_inner (qwen35: ssm_v_heads x ssm_state) */
    int32_t ssm_head_dim;  /* state rows per head: d_inner / heads (qwen35: ssm_state) */
    int32_t n_layer_rec;   /* recurrent layers (they keep state rows, no K/V) */
    bool attn_out_gate;    /* attn_q's rows are per head [query (D) | gate (D)]; the
                              attention output is multiplied by sigmoid(gate) */
    /* Elements of one position's KV row in a layer's pages: the most any
     * layer keeps (n_head_kv * head_dim everywhere but gemma4, whose layers
     * differ), plus the indexer key (idx_dim). Every layer's row is this
     * long; a layer with fewer K/V elements uses the front of it. */
    int32_t kv_dim;
    /* Gemma 4 (gemma4; neutral values elsewhere). Layers differ: a sliding
     * layer (attention.sliding_window_pattern, one bool per layer) has heads
     * of head_dim_swa and rotates n_rot_swa dims at rope_base_swa without
     * rope_freqs; a full layer has heads of key_length (head_dim above),
     * rotates n_rot dims with rope_freqs ("proportional" RoPE: unrotated pairs have a divisor
     * of 1e30). head_count_kv and feed_forward_length may be per-layer
     * arrays (n_head_kv and n_ff above: their largest values). Scores are
     * q.k unscaled (attn_scale 1) after the Q/K norms; V is rms-normed
     * without a weight, and is the K projection where a layer has no attn_v;
     * layer_output_scale multiplies each layer's output. */
    int32_t head_dim_swa; /* attention.key_length_swa [head_dim] */
    int32_t n_rot_swa;    /* rope.dimension_count_swa [n_rot] */
    bool rope_freqs_full; /* rope_freqs apply to the full layers only [false: every layer] */
    bool v_norm;          /* V rms-normed per head, no weight [false] */
    /* Gemma 4 E2B / E4B: the last attention.shared_kv_layers layers keep no
     * K/V: a sliding one reads layer n_layer_attn - 2's, a full one layer
     * n_layer_attn - 1's (llama.cpp's rule; those two must be of the two
     * kinds), so n_layer_attn = n_layer - shared. Per-layer embeddings
     * (embedding_length_per_layer_input n_embd_pl > 0): each token has
     * n_layer inputs of n_embd_pl, ((rmsnorm(per_layer_model_proj x / sqrt
     * (n_embd)) * per_layer_proj_norm) + per_layer_token_embd[tok] *
     * sqrt(n_embd_pl)) / sqrt(2), x the scaled embedding; layer il ends
     * with x += rmsnorm(proj (gelu(inp_gate x) * input[il])) * post_norm,
     * before its layer_output_scale. */
    int32_t n_embd_pl;    /* embedding_length_per_layer_input [0: none] */
} model_hparams;

typedef struct model model;

/* Loads (mmaps) a GGUF model and its vocabulary, validating every tensor's
 * presence, shape and type. Errors: those of gguf_open, KS_ERR_UNSUPPORTED
 * (architecture or weight type, named), KS_ERR_FORMAT (missing key or
 * tensor, wrong shape, named), KS_ERR_NOMEM. Caller owns *out. Blocks. */
ks_err model_load(const char *path, model **out /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* model_load without repacking the weights into the kernels' layout: the
 * matrices stay in the file's mapped rows (correct, slower; nothing is
 * copied). For holders of a model's tokenizer, chat template and shape
 * only (a catalog entry that is not loaded yet). Same errors. */
ks_err model_load_unpacked(const char *path, model **out /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* What model_load would say of path (every check, no weight repacking):
 * KS_OK when kvseal can run it. */
ks_err model_check(const char *path, ks_errbuf *eb) KS_MUST_USE;
/* model_check of an open file (gguf_open_mem for the fuzz harness), which it
 * takes over: f is closed on return, whatever the result. */
ks_err model_check_file(gguf_file *f, ks_errbuf *eb) KS_MUST_USE;
/* Frees the model and unmaps the file; accepts NULL. A NextN head
 * (model_mtp_create) frees only what is its own. */
void model_free(model *m);

/* Whether m carries a NextN (multi-token prediction) block that
 * model_mtp_create can run: GLM-4.5+'s and DeepSeek-V3's files
 * (<arch>.nextn_predict_layers > 0), not a hybrid's. */
bool model_has_mtp(const model *m);
/* The first NextN block of base as a one-layer model of its own (its KV
 * geometry: one layer; model_ctx_create and model_forward_mtp run it). It
 * borrows base's file, vocabulary, embedding and output matrix (unless the
 * block has its own): base must outlive it. Errors: KS_ERR_INVAL (no
 * block: model_has_mtp), KS_ERR_FORMAT (a tensor missing or misshapen),
 * KS_ERR_NOMEM. */
ks_err model_mtp_create(const model *base, model **out /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* Read-only views; can't fail. */
const model_hparams *model_hp(const model *m);
const tok_vocab *model_vocab(const model *m);
const gguf_file *model_gguf(const model *m);
/* Bytes of weights read to produce one token (all matmul weights once plus
 * one embedding row; of a mixture of experts, the router and the
 * n_expert_used experts a token runs), for the roofline in `kvseal bench`. */
uint64_t model_bytes_per_token(const model *m);
/* Matmul weight elements one prompt token runs through (as
 * model_bytes_per_token, but elements, and without the embedding row and the
 * output, which a prompt runs for its last token only): 2 x this x tokens is
 * a prefill's matmul ops. Can't fail. */
uint64_t model_params_per_token(const model *m);

/* K/V geometry for a pool serving this model (page_tokens and the KV
 * element type as given; model_kv_type_check says whether the type fits). */
kv_geom model_kv_geom(const model *m, int page_tokens, int kv_type);
/* Rows of ssm_state floats of one sequence's recurrent state (hybrid
 * models; 0 otherwise): per recurrent layer, its convolution window (conv
 * - 1 inputs of every channel, cut into rows) and each value head's S x S
 * state. model_kv_geom packs them into g.state_pages pages (-1 when a row
 * does not fit a page). Can't fail. */
int64_t model_state_rows(const model_hparams *hp);

/* Whether this model's K/V can be kept in kv_type (kv.h: F32, F16, Q8_0):
 * Q8_0 needs head_dim % 32 == 0, because attention reads K/V per head and a
 * 32-element block must not straddle two heads. Errors: KS_ERR_INVAL with
 * the reason in eb. Can be called from any thread. */
ks_err model_kv_type_check(const model *m, int kv_type, ks_errbuf *eb) KS_MUST_USE;

/* One forward batch. Token i of sequence seqs[seq[i]] sits at position
 * pos[i]; its K/V is written there, and it attends to positions
 * [0, pos[i]] of its sequence — all of which must be written by now or in
 * this batch. out_row[i] >= 0 asks for its logits in row out_row[i] of the
 * output (rows must be distinct and < n_out); -1 skips them. */
typedef struct model_batch {
    int32_t n_tokens;
    const int32_t *tokens;  /* (n_tokens) */
    const int32_t *pos;     /* (n_tokens) */
    const int32_t *seq;     /* (n_tokens) index into seqs */
    const int32_t *out_row; /* (n_tokens) */
    int32_t n_out;          /* rows of logits produced */
    int32_t n_seqs;         /* entries in seqs (<= the context's max_tokens) */
    kv_seq *const *seqs;    /* (n_seqs) block tables, reserved for every pos in the batch */
    ks_err *seq_err;        /* OUT (n_seqs) or NULL: per-sequence result, see model_forward */
    const struct model_lora *const *lora; /* (n_seqs) or NULL: each sequence's LoRA adapter
                                             (model_lora_load against this model; a NULL
                                             entry: none) */
} model_batch;

/* Hidden rows a pass hands out (embeddings, model_forward_hidden): row[i]
 * >= 0 asks for token i's final hidden state (after the output norm, before
 * the LM head) in that row of out; rows distinct and < n_rows. A token may
 * ask for a logits row and a hidden row both. */
typedef struct model_hidden {
    const int32_t *row; /* (n_tokens of the batch) */
    int32_t n_rows;
    float *out; /* OUT (n_rows, n_embd) */
} model_hidden;

typedef struct model_ctx model_ctx;

/* Scratch for batches of up to max_tokens tokens attending to up to max_ctx
 * positions, computed on n_threads threads (a persistent pool). The model
 * and pool must outlive the context. Errors: KS_ERR_NOMEM, KS_ERR_INVAL. */
ks_err model_ctx_create(const model *m, kv_pool *pool, int n_threads, int32_t max_tokens,
                        int32_t max_ctx, model_ctx **out /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* Frees the context and stops its threads; accepts NULL. */
void model_ctx_free(model_ctx *c);

/* Runs the batch and writes n_out * n_vocab logits (row-major) to logits.
 * Updates each sequence's filled-token count. Errors: KS_ERR_INVAL (batch
 * larger than the context, token id or position out of range, page not
 * reserved; nothing ran). A block-table entry that fails kv's page check
 * (I1) stops only its own sequence: with seq_err set, that sequence gets
 * KS_ERR_INTERNAL there (its logits rows must be discarded) and the others
 * complete normally; without seq_err the call returns KS_ERR_INTERNAL.
 * Blocks for the duration of the pass; not concurrently on one context. */
ks_err model_forward(model_ctx *c, const model_batch *b, float *logits /* OUT */,
                     ks_errbuf *eb) KS_MUST_USE;
/* model_forward that also writes the hidden rows h asks for (h NULL: none;
 * logits may be NULL when b->n_out is 0). The rows are bit-identical
 * whatever else shares the batch (model.h's batch invariance). Errors as
 * model_forward's, and KS_ERR_INVAL for a bad row map (nothing ran). */
ks_err model_forward_hidden(model_ctx *c, const model_batch *b, float *logits /* OUT */,
                            const model_hidden *h, ks_errbuf *eb) KS_MUST_USE;
/* A NextN head's pass (c made for a model_mtp_create head): token i's input
 * is [enorm(embedding of tokens[i]) | hnorm(h_in row i)] through eh_proj,
 * where h_in (n_tokens, n_embd) holds the model's final hidden rows
 * (model_forward_hidden's) or the head's own; the logits are the head's
 * (shared_head_norm, then the output matrix). The hidden rows h asks for
 * are the block's output before shared_head_norm, the h_in of the next
 * draft. Errors as model_forward_hidden's; KS_ERR_INVAL on a model that is
 * not a head. */
ks_err model_forward_mtp(model_ctx *c, const model_batch *b, const float *h_in,
                         float *logits /* OUT */, const model_hidden *h,
                         ks_errbuf *eb) KS_MUST_USE;

// ----------------------------------------------------------------------------
// LoRA adapters (lora.c): y = W x + scale * B (A x) for the matrices an
// adapter targets, per sequence of a batch (model_batch.lora)
//
// The file is llama.cpp's (convert_lora_to_gguf.py): general.type "adapter",
// adapter.type "lora", general.architecture the base's, adapter.lora.alpha
// (float32; absent or 0: scale 1), and per targeted matrix W of ne [K, N]
// `<W's name>.lora_a` of ne [K, r] and `.lora_b` of ne [r, N] in F32, F16
// or Q8_0. The scale is user_scale * alpha / r (user_scale * 1 without
// alpha), as llama.cpp's --lora-scaled. Targets now: attn_q, attn_k,
// attn_v, attn_output, ffn_gate, ffn_up, ffn_down of the dense layers
// (attention with its own Q/K/V projections; a dense FFN).

typedef struct model_lora model_lora;

/* Most rank an adapter may have. */
#define MODEL_LORA_MAX_RANK 256

/* Loads the adapter at path for base (which must outlive it), checking its
 * type keys, architecture, every tensor's name, shape and type (each
 * names an existing base matrix of matching dims; A and B both present,
 * of one rank, which may differ between matrices as llama.cpp allows;
 * each matrix is scaled by alpha over its own rank). A and B are kept as
 * f32. Errors: those of
 * gguf_open, KS_ERR_FORMAT (malformed or not matching base, named),
 * KS_ERR_UNSUPPORTED (a tensor type other than F32, F16, Q8_0, or a base
 * whose layers it cannot apply to), KS_ERR_NOMEM. Caller owns *out
 * (model_lora_free). Blocks. */
ks_err model_lora_load(const model *base, const char *path, model_lora **out /* OUT */,
                       ks_errbuf *eb) KS_MUST_USE;
/* model_lora_load of an open file (gguf_open_mem for tests and fuzzing),
 * which it takes over: f is closed on return, whatever the result. */
ks_err model_lora_load_file(const model *base, gguf_file *f, model_lora **out /* OUT */,
                            ks_errbuf *eb) KS_MUST_USE;
/* Scrubs (zeroes) the adapter's factors and frees it; accepts NULL. */
void model_lora_free(model_lora *l);
/* Bytes its factors hold (f32 A and B of every targeted matrix). Can't fail. */
size_t model_lora_bytes(const model_lora *l);
/* Sets the user's scale (default 1): the delta is user_scale * alpha / r
 * times B A x. Not while a pass uses the adapter. Can't fail. */
void model_lora_set_scale(model_lora *l, float user_scale);
/* The delta's whole multiplier (user_scale * alpha / r, or user_scale
 * without alpha; r the largest rank), that rank, and the number of
 * targeted matrices. Can't fail. */
float model_lora_scale(const model_lora *l);
int32_t model_lora_rank(const model_lora *l);
int32_t model_lora_n_mats(const model_lora *l);
/* The memory of the factors of slot i (0 .. n_layer * 7 - 1, layer-major,
 * attn_q .. ffn_down): A at *a (*na bytes) and B^T at *bt (*nb bytes), all
 * NULL and 0 for an untargeted matrix; for checks that model_lora_free
 * scrubs them. Returns the number of slots. Can't fail. */
int32_t model_lora_factors(const model_lora *l, int32_t i, const void **a /* OUT */,
                           size_t *na /* OUT */, const void **bt /* OUT */, size_t *nb /* OUT */);

// ----------------------------------------------------------------------------
// Embeddings: pooling of the final hidden state (model_forward_hidden)
//
// An embedding is computed as a prompt-only pass (the engine's embedding
// requests, engine_embed_submit; a prefill worker's EMBED): every position
// asks for its hidden row, and the rows are pooled here in position order,
// so the vector depends only on the input's tokens (batch invariance: the
// rows are bit-identical however the input was batched or chunked, and the
// pooling's summation order is fixed), then L2-normalized.

/* How an input's hidden rows become one vector; the values are GGUF's
 * <arch>.pooling_type numbers (append-only). */
typedef enum model_pooling {
    MODEL_POOL_DEFAULT = 0, /* not chosen: the model's (model_pooling_default) */
    MODEL_POOL_MEAN = 1,    /* mean over every position */
    MODEL_POOL_CLS = 2,     /* the first position's row (BERT's [CLS]) */
    MODEL_POOL_LAST = 3,    /* the last position's row */
} model_pooling;

/* The model's pooling: <arch>.pooling_type when the GGUF has it and it is
 * mean, cls or last, else mean. Can't fail. */
model_pooling model_pooling_default(const model *m);
/* "mean" / "cls" / "last" (NULL for anything else); static storage. */
const char *model_pooling_name(model_pooling p);
/* Parses "mean", "cls" or "last"; false (out untouched) otherwise. */
bool model_pooling_parse(const char *s, model_pooling *out /* OUT */);

/* Running pooled state of one input, computed by the caller's thread.
 * acc is (n_embd) doubles the caller owns; zero it (model_embd_begin). */
typedef struct model_embd_acc {
    model_pooling pooling; /* MEAN, CLS or LAST */
    int32_t n_embd;
    int32_t n_rows; /* rows added */
    double *acc;    /* (n_embd) MEAN: the running sum; CLS: the first row; LAST: the last */
} model_embd_acc;

/* Resets a to an empty state for pooling p (MEAN, CLS or LAST) over n_embd
 * values, acc (n_embd) borrowed. Can't fail. */
void model_embd_begin(model_embd_acc *a, model_pooling p, int32_t n_embd, double *acc);
/* Adds the hidden rows of the next n positions, in position order (rows
 * (n, n_embd), row-major). CLS keeps only the first, LAST the newest. Can't fail. */
void model_embd_add(model_embd_acc *a, const float *rows, int32_t n);
/* Writes the pooled, L2-normalized vector (n_embd floats; a zero vector
 * stays zero). Errors: KS_ERR_INVAL when no row was added. */
ks_err model_embd_finish(const model_embd_acc *a, float *out /* OUT (n_embd) */) KS_MUST_USE;

#endif /* KS_MODEL_H */
