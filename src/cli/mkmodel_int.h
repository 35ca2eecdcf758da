/* mkmodel_int.h — `kvseal mkmodel`'s options and tensor plan, shared by
 * the command (cmd_mkmodel.c: options, keys, the weights' noise and the
 * file) and the plans of every architecture (mkmodel_plan.c). */
#ifndef KS_CLI_MKMODEL_INT_H
#define KS_CLI_MKMODEL_INT_H

#include "cli_int.h"
#include "kvseal/gguf.h"
#include "kvseal/kern.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    const char *out, *vocab, *arch, *name;
    ks_dtype type;
    long n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx, head_dim;
    long n_rot;                             /* rotary dimensions (glm4: half the head) */
    long n_expert, n_expert_used, n_ff_exp; /* mixture of experts (n_expert 0: dense) */
    long n_dense, n_nextn; /* glm4moe: leading dense layers; NextN blocks after n_layer */
    long n_shared;         /* glm4moe, MLA MoE: shared experts (one FFN n_shared * n_ff_exp) */
    bool tied, rope_freqs, longrope;
    bool qk_norm; /* glm4moe: attn_q_norm / attn_k_norm (GLM-4.5 355B has them) */
    bool nextn_head; /* NextN blocks: their own nextn.shared_head_head */
    uint64_t seed;
    double rope_base, rope_scale, eps;
    double qk_gain;        /* attn_q/k (attn_qkv) weights' std times this: sharper attention */
    const char *rope_type; /* "linear" or "yarn" when rope_scale != 1 */
    long rope_orig_ctx;    /* YaRN's original context (0: context_length) */
    long n_swa;            /* attention.sliding_window (gemma, llama) */
    long kv_lora, q_lora, qk_nope, v_head; /* deepseek2's MLA (kv_lora 0: none) */
    long idx_heads, idx_dim, idx_topk;     /* deepseek32 / glm-dsa's indexer (0: none) */
    long n_groups, n_group_used;           /* expert groups (DeepSeek-V3's routing; 0: none) */
    double attn_softcap, final_softcap; /* gemma: 0 = key not written */
    double attn_temp_scale;             /* mistral3: attention.temperature_scale (0: none) */
    double yarn_log_mul;                /* mistral3: rope.scaling.yarn_log_multiplier (0: none) */
    long ssm_state, ssm_k_heads, ssm_v_heads, ssm_conv; /* qwen35, nemotron_h: recurrent layers */
    long attn_interval; /* qwen35: every attn_interval-th layer attends */
    const char *pattern; /* nemotron_h: a layer's kind per character, M Mamba2, * attention,
                            - MLP (ssm_k_heads: groups, ssm_v_heads: heads) */
    long ssm_head_dim;   /* nemotron_h: a Mamba2 head's elements */
    long pooling;       /* bert: pooling_type (1 mean, 2 CLS) */
    /* gemma4: head_dim is the sliding layers' (HF head_dim); the full
     * layers' heads (global_head_dim) and K/V heads; layer il is full when
     * il % swa_period == swa_period - 1; k_eq_v: the full layers have no
     * attn_v (V is the K projection, HF attention_k_eq_v) */
    long head_dim_full, n_head_kv_full, swa_period;
    bool k_eq_v;
    /* gemma4 E2B / E4B: the last n_kv_shared layers keep no K/V (and have
     * FFNs twice as wide, use_double_wide_mlp); n_embd_pl: per-layer
     * embedding width (0: none) */
    long n_kv_shared, n_embd_pl;
    bool gate_up_exps; /* gemma4 MoE: the experts' gate and up in one ffn_gate_up_exps */
    int32_t suppress[64]; /* gemma4: tokenizer.ggml.suppress_tokens (n_suppress ids) */
    int n_suppress;
    long n_types;       /* bert: token types (the vocab's tokenizer.ggml.token_type_count) */
    int n_threads;
} mk__opts;

enum { MK__RAND = 0, MK__ONES = 1, MK__NEG = 2, MK__PROP = 3 };

typedef struct mk__plan mk__plan;

typedef struct {
    char name[64];
    uint32_t n_dims;
    int64_t ne[3]; /* ne[0] = row length (fastest), ne[1] = rows, ne[2] = experts */
    ks_dtype type;
    int kind; /* MK__RAND: uniform, std `scale`; MK__ONES: 1 + uniform noise; MK__NEG:
               * -0.3 + uniform noise (qwen35's ssm_a, -exp(A_log): a decay per step);
               * MK__PROP: gemma4's "proportional" rope_freqs, 1 for the first quarter
               * of the pairs (partial_rotary_factor 0.25) and 1e30 (unrotated) after */
    float scale;
    uint64_t seed; /* per-tensor stream seed */
    mk__plan *plan;
} mk__tensor;

struct mk__plan {
    mk__tensor *t; /* (n_t) */
    int n_t, cap_t;
    ks_pool *pool;
    int64_t max_row; /* longest ne[0]: per-thread float scratch */
    float *scratch;  /* (nth, max_row) */
    uint8_t *chunk;  /* (chunk_cap) quantized rows handed to the sink */
    size_t chunk_cap;
    uint64_t n_params;
};

/* splitmix64's finalizer: the noise's stream step. */
uint64_t mk__mix(uint64_t z);
/* FNV-1a of s: a tensor name's seed. */
uint64_t mk__hash_str(const char *s);
/* Whether gemma4 layer l slides (o->swa_period). */
bool mk__g4_swa(const mk__opts *o, long l);
/* gemma4 layer l's FFN width: twice n_ff on a shared KV layer. */
int64_t mk__g4_ff(const mk__opts *o, long l);
/* Every tensor of o's architecture into p, in the order llama.cpp's
 * converter writes them; false on out-of-memory or a shape it refuses. */
bool mk__build_plan(mk__plan *p, const mk__opts *o, int64_t n_vocab);

#endif
