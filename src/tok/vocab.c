/* vocab.c — loading a tokenizer vocabulary from GGUF metadata, token
 * pieces and the streaming UTF-8 detokenizer.
 *
 * Load follows llama.cpp's rules so that encodings match it: default special
 * ids per model kind, metadata overrides, EOT/EOG found by token text (those
 * tokens become CONTROL), the special-token list sorted longest first, and
 * every token's piece precomputed once (a piece is then a pointer + length,
 * which lets the stream decoder work without allocating). */
#include "tok_int.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Load

/* Reads an optional u32 token id; keeps *id when absent, warns when out of
 * range (llama.cpp keeps the default then). */
static void vocab__opt_id(const gguf_file *f, const char *key, int32_t n_vocab, int32_t *id) {
    if (!gguf_get(f, key)) return;
    uint32_t u;
    if (gguf_get_u32(f, key, &u, NULL) != KS_OK || u >= (uint32_t)n_vocab) {
        ks_log(KS_LOG_WARN, "tokenizer: bad special token %s, using default id %d", key, *id);
        return;
    }
    *id = (int32_t)u;
}

static void vocab__opt_bool(const gguf_file *f, const char *key, bool *out) {
    if (!gguf_get(f, key)) return;
    bool b;
    if (gguf_get_bool(f, key, &b, NULL) == KS_OK) *out = b;
}

/* Integer element i of a numeric array (any integer element type). */
static int64_t vocab__arr_int(const gguf_value *a, uint64_t i) {
    if (a->v.arr.elem_type == GGUF_TYPE_INT32) {
        int32_t x;
        memcpy(&x, (const char *)a->v.arr.raw + i * 4, 4);
        return x;
    }
    return gguf_arr_i64(a, i);
}

static bool vocab__arr_is_int(const gguf_value *a) {
    switch (a->v.arr.elem_type) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16:
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
        return true;
    default:
        return false;
    }
}

/* Longest text first; ties by id, for a deterministic order. */
static int vocab__cmp_special(const void *a, const void *b, void *ctx) {
    const tok_vocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (v->text_len[x] != v->text_len[y]) return v->text_len[x] > v->text_len[y] ? -1 : 1;
    return (x > y) - (x < y);
}

/* The piece of id as rendered with render_special, computed once. */
static size_t vocab__make_piece(const tok_vocab *v, int32_t id, char *out) {
    const char *t = v->pool + v->text_off[id];
    size_t n = v->text_len[id], o = 0;
    switch (v->type[id]) {
    case TOK_TYPE_CONTROL:
    case TOK_TYPE_UNKNOWN:
    case TOK_TYPE_USER_DEFINED:
        memcpy(out, t, n);
        return n;
    case TOK_TYPE_NORMAL:
        break;
    case TOK_TYPE_BYTE:
        if (v->kind == TOK_KIND_SPM || v->escape_ws) { /* "<0xXX>" */
            if (n == 6 && isxdigit((unsigned char)t[3]) && isxdigit((unsigned char)t[4])) {
                char hex[3] = {t[3], t[4], 0};
                out[0] = (char)strtol(hex, NULL, 16);
                return 1;
            }
        }
        return 0;
    default: /* unused, undefined: nothing, as llama.cpp */
        return 0;
    }
    if (v->kind != TOK_KIND_BPE || v->escape_ws) { /* SPM, WPM, gemma4: U+2581 -> space */
        for (size_t i = 0; i < n; i++) {
            if (i + 2 < n && (uint8_t)t[i] == 0xE2 && (uint8_t)t[i + 1] == 0x96 &&
                (uint8_t)t[i + 2] == 0x81) {
                out[o++] = ' ';
                i += 2;
            } else {
                out[o++] = t[i];
            }
        }
        return o;
    }
    /* BPE: each code point back to its byte; code points outside the map are
     * kept as UTF-8 (llama.cpp writes an [UNK_BYTE_..] marker instead) */
    for (size_t i = 0; i < n;) {
        uint8_t c = (uint8_t)t[i];
        size_t l = tok__utf8_len(c);
        int b = -1;
        if (l == 1)
            b = tok__cpt_to_byte(c);
        else if (l == 2 && i + 1 < n && ((uint8_t)t[i + 1] & 0xC0) == 0x80)
            b = tok__cpt_to_byte(((uint32_t)(c & 0x1F) << 6) | ((uint8_t)t[i + 1] & 0x3F));
        if (l > n - i) l = n - i;
        if (b >= 0) {
            out[o++] = (char)b;
        } else {
            memcpy(out + o, t + i, l);
            o += l;
        }
        i += l;
    }
    return o;
}

static bool vocab__ieq_contains(const char *s, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++) {
        size_t k = 0;
        while (k < m && tolower((unsigned char)s[i + k]) == needle[k])
            k++;
        if (k == m) return true;
    }
    return false;
}

// Token texts llama.cpp recognises (llama-vocab.cpp), NULL-terminated lists.
static const char *const vocab__eot_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<\xef\xbd\x9c"
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", /* DeepSeek */
    "<end_of_utterance>",
    NULL};
static const char *const vocab__eom_texts[] = {"<|eom_id|>", NULL};
enum {
    VOCAB__FIM_PRE,
    VOCAB__FIM_SUF,
    VOCAB__FIM_MID,
    VOCAB__FIM_PAD,
    VOCAB__FIM_REP,
    VOCAB__FIM_SEP,
    VOCAB__FIM_N
};
/* metadata keys of each FIM role (current name, deprecated name) */
static const char *const vocab__fim_keys[VOCAB__FIM_N][2] = {
    {"tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"},
    {"tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"},
    {"tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"},
    {"tokenizer.ggml.fim_pad_token_id", NULL},
    {"tokenizer.ggml.fim_rep_token_id", NULL},
    {"tokenizer.ggml.fim_sep_token_id", NULL}};
/* "\xef\xbd\x9c" is U+FF5C (DeepSeek's bar), "\xe2\x96\x81" U+2581 */
static const char *const vocab__fim_texts[VOCAB__FIM_N][10] = {
    {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
     "<\xef\xbd\x9c"
     "fim\xe2\x96\x81"
     "begin\xef\xbd\x9c>",
     "<PRE>", "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", NULL},
    {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
     "<\xef\xbd\x9c"
     "fim\xe2\x96\x81"
     "hole\xef\xbd\x9c>",
     "<SUF>", "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>", NULL},
    {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
     "<\xef\xbd\x9c"
     "fim\xe2\x96\x81"
     "end\xef\xbd\x9c>",
     "<MID>", "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>", NULL},
    {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL},
    {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL},
    {"<|file_sep|>", NULL}};
static const char *const vocab__eog_texts[] = {"<|eot_id|>",
                                               "<|im_end|>",
                                               "<|end|>",
                                               "<|return|>",
                                               "<|call|>",
                                               "<|flush|>",
                                               "<|calls|>",
                                               "<end_of_turn>",
                                               "<|endoftext|>",
                                               "</s>",
                                               "<|eom_id|>",
                                               "<EOT>",
                                               "_<EOT>",
                                               "[EOT]",
                                               "[EOS]",
                                               "<|end_of_text|>",
                                               "<end_of_utterance>",
                                               "<eos>",
                                               "<turn|>",
                                               "<|tool_response>",
                                               NULL};
/* GPT-OSS tokens llama.cpp always renders: USER_DEFINED whatever the file says */
static const char *const vocab__user_texts[] = {"<|channel|>", "<|message|>", "<|start|>",
                                                "<|constrain|>", NULL};

/* Id of the first text of list that is a token, made CONTROL; TOK_NULL if
 * none is. */
static int32_t vocab__find_first(tok_vocab *v, const char *const *list) {
    for (size_t i = 0; list[i]; i++) {
        int32_t id = tok_find(v, list[i], strlen(list[i]));
        if (id == TOK_NULL) continue;
        v->type[id] = TOK_TYPE_CONTROL;
        return id;
    }
    return TOK_NULL;
}

/* Id of text if it is a token marked end-of-generation, else TOK_NULL. */
static int32_t vocab__find_eog(const tok_vocab *v, const char *text) {
    int32_t id = tok_find(v, text, strlen(text));
    return id != TOK_NULL && v->eog[id] ? id : TOK_NULL;
}

ks_err tok_vocab_load(const gguf_file *f, tok_vocab **out, ks_errbuf *eb) {
    *out = NULL;
    const char *path = gguf_path(f);
    gguf_str model;
    ks_err e = gguf_get_str(f, "tokenizer.ggml.model", &model, eb);
    if (e) return e;
    tok_vocab *v = calloc(1, sizeof *v);
    if (!v) return ks_seterr(eb, KS_ERR_NOMEM, "%s: no memory for the vocabulary", path);
    if (model.len == 5 && !memcmp(model.ptr, "llama", 5)) {
        v->kind = TOK_KIND_SPM;
    } else if (model.len == 4 && !memcmp(model.ptr, "gpt2", 4)) {
        v->kind = TOK_KIND_BPE;
    } else if (model.len == 6 && !memcmp(model.ptr, "gemma4", 6)) {
        v->kind = TOK_KIND_BPE; // llama.cpp: BPE, pre-tokenizer "gemma4" whatever the file says
        v->escape_ws = true;
    } else if (model.len == 4 && !memcmp(model.ptr, "bert", 4)) {
        v->kind = TOK_KIND_WPM;
    } else {
        e = ks_seterr(eb, KS_ERR_UNSUPPORTED, "%s: tokenizer model '%.*s' is not supported", path,
                      (int)(model.len > 64 ? 64 : model.len), model.ptr);
        goto fail;
    }

    // tokens
    const gguf_value *toks;
    if ((e = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, eb))) goto fail;
    if (toks->v.arr.n == 0 || toks->v.arr.n > INT32_MAX / 2) {
        e = ks_seterr(eb, KS_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries", path,
                      (unsigned long long)toks->v.arr.n);
        goto fail;
    }
    int32_t n = v->n_vocab = (int32_t)toks->v.arr.n;
    uint64_t pool_bytes = 0;
    for (int32_t i = 0; i < n; i++)
        pool_bytes += toks->v.arr.items[i].v.str.len + 24;
    if (pool_bytes >= UINT32_MAX) {
        e = ks_seterr(eb, KS_ERR_FORMAT, "%s: token strings too large", path);
        goto fail;
    }
    v->pool = malloc(pool_bytes);
    v->text_off = malloc((size_t)n * sizeof *v->text_off);
    v->text_len = malloc((size_t)n * sizeof *v->text_len);
    v->scores = calloc((size_t)n, sizeof *v->scores);
    v->type = malloc((size_t)n);
    v->attr = calloc((size_t)n, 1);
    v->eog = calloc((size_t)n, 1);
    if (!v->pool || !v->text_off || !v->text_len || !v->scores || !v->type || !v->attr || !v->eog ||
        tok__map_init(&v->tok_map, (size_t)n)) {
        e = ks_seterr(eb, KS_ERR_NOMEM, "%s: no memory for %d tokens", path, n);
        goto fail;
    }
    uint32_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        const gguf_str *s = &toks->v.arr.items[i].v.str;
        v->text_off[i] = off;
        if (s->len == 0) { /* as llama.cpp: an empty token gets a placeholder name */
            off += (uint32_t)sprintf(v->pool + off, "[EMPTY_%d]", i);
        } else {
            memcpy(v->pool + off, s->ptr, s->len);
            off += (uint32_t)s->len;
        }
        v->text_len[i] = off - v->text_off[i];
        v->pool[off++] = '\0';
        v->type[i] = TOK_TYPE_NORMAL;
        if (v->text_len[i] > v->max_piece) v->max_piece = v->text_len[i];
    }
    for (int32_t i = 0; i < n; i++)
        tok__map_put(&v->tok_map, v->pool, v->text_off[i], v->text_len[i], 0, i, true);

    // scores, types
    const gguf_value *a = gguf_get(f, "tokenizer.ggml.scores");
    if (a) {
        if (a->type != GGUF_TYPE_ARRAY ||
            (a->v.arr.elem_type != GGUF_TYPE_FLOAT32 && a->v.arr.elem_type != GGUF_TYPE_FLOAT64) ||
            a->v.arr.n != (uint64_t)n) {
            e = ks_seterr(eb, KS_ERR_FORMAT, "%s: tokenizer.ggml.scores: expected %d floats", path,
                          n);
            goto fail;
        }
        for (int32_t i = 0; i < n; i++) {
            if (a->v.arr.elem_type == GGUF_TYPE_FLOAT32)
                memcpy(&v->scores[i], (const char *)a->v.arr.raw + (size_t)i * 4, 4);
            else
                v->scores[i] = (float)gguf_arr_f64(a, (uint64_t)i);
        }
    }
    a = gguf_get(f, "tokenizer.ggml.token_type");
    if (a) {
        if (a->type != GGUF_TYPE_ARRAY || !vocab__arr_is_int(a) || a->v.arr.n != (uint64_t)n) {
            e = ks_seterr(eb, KS_ERR_FORMAT, "%s: tokenizer.ggml.token_type: expected %d integers",
                          path, n);
            goto fail;
        }
        for (int32_t i = 0; i < n; i++) {
            int64_t t = vocab__arr_int(a, (uint64_t)i);
            v->type[i] =
                (t >= TOK_TYPE_NORMAL && t <= TOK_TYPE_BYTE) ? (uint8_t)t : TOK_TYPE_UNDEFINED;
        }
    }

    // kind-specific defaults (llama.cpp), then metadata
    if (v->kind == TOK_KIND_SPM) {
        v->bos = 1, v->eos = 2, v->unk = 0;
        v->add_bos = true;
        v->add_space_prefix = true;
        snprintf(v->pre.name, sizeof v->pre.name, "spm");
    } else if (v->kind == TOK_KIND_WPM) { /* [CLS] text [SEP]; [UNK] for a word with no cut */
        v->bos = 101, v->eos = TOK_NULL, v->unk = 100;
        v->add_bos = v->add_sep = true;
        snprintf(v->pre.name, sizeof v->pre.name, "wpm");
    } else {
        // gemma4: no default ids (llama.cpp reads them from the file)
        v->bos = v->eos = v->escape_ws ? TOK_NULL : 11;
        v->unk = TOK_NULL;
        const gguf_value *mg;
        if ((e = gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &mg, eb))) goto fail;
        uint64_t nm = mg->v.arr.n, mbytes = 1;
        for (uint64_t i = 0; i < nm; i++)
            mbytes += mg->v.arr.items[i].v.str.len + 1;
        if (mbytes >= UINT32_MAX || nm >= INT32_MAX) {
            e = ks_seterr(eb, KS_ERR_FORMAT, "%s: tokenizer.ggml.merges too large", path);
            goto fail;
        }
        v->merge_pool = malloc(mbytes);
        if (!v->merge_pool || tok__map_init(&v->merge_map, nm)) {
            e = ks_seterr(eb, KS_ERR_NOMEM, "%s: no memory for merges", path);
            goto fail;
        }
        uint32_t mo = 0;
        for (uint64_t i = 0; i < nm; i++) {
            const gguf_str *s = &mg->v.arr.items[i].v.str;
            memcpy(v->merge_pool + mo, s->ptr, s->len);
            v->merge_pool[mo + s->len] = '\0';
            /* "first second", split at the first space after position 0 */
            const char *sp = s->len > 1 ? memchr(s->ptr + 1, ' ', s->len - 1) : NULL;
            if (sp) /* aux = length of first; the first of duplicate merges wins */
                tok__map_put(&v->merge_map, v->merge_pool, mo, (uint32_t)s->len,
                             (uint32_t)(sp - s->ptr), (int32_t)i, false);
            mo += (uint32_t)s->len + 1;
        }
        gguf_str pre = {0};
        if (!v->escape_ws && gguf_get(f, "tokenizer.ggml.pre") &&
            (e = gguf_get_str(f, "tokenizer.ggml.pre", &pre, eb)))
            goto fail;
        if (!pre.len && !v->escape_ws)
            ks_log(KS_LOG_WARN, "tokenizer: %s: no pre-tokenizer type, using 'default'", path);
        if (v->escape_ws) // its split (newline runs) is encode.c's, without a regex
            snprintf(v->pre.name, sizeof v->pre.name, "gemma4");
        else if ((e = tok__pretok_init(&v->pre, pre.ptr, pre.len, &v->ignore_merges, &v->add_bos,
                                       eb)))
            goto fail;
        if (!strcmp(v->pre.name, "chatglm4")) v->bos = TOK_NULL; /* GLM: no default BOS */
    }
    v->eot = v->eom = TOK_NULL;
    v->sep = v->kind == TOK_KIND_WPM ? 102 : TOK_NULL;
    vocab__opt_id(f, "tokenizer.ggml.seperator_token_id", n, &v->sep); /* sic, as the GGUF key */
    vocab__opt_bool(f, "tokenizer.ggml.add_sep_token", &v->add_sep);
    if (v->sep >= n) v->sep = TOK_NULL;
    if (v->sep == TOK_NULL) v->add_sep = false;
    vocab__opt_id(f, "tokenizer.ggml.bos_token_id", n, &v->bos);
    vocab__opt_id(f, "tokenizer.ggml.eos_token_id", n, &v->eos);
    vocab__opt_id(f, "tokenizer.ggml.unknown_token_id", n, &v->unk);
    vocab__opt_id(f, "tokenizer.ggml.eot_token_id", n, &v->eot);
    vocab__opt_id(f, "tokenizer.ggml.eom_token_id", n, &v->eom);
    vocab__opt_bool(f, "tokenizer.ggml.add_bos_token", &v->add_bos);
    vocab__opt_bool(f, "tokenizer.ggml.add_eos_token", &v->add_eos);
    vocab__opt_bool(f, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix);
    if (v->bos >= n) v->bos = TOK_NULL;
    if (v->eos >= n) v->eos = TOK_NULL;
    if (v->unk >= n) v->unk = TOK_NULL;
    if (v->bos == TOK_NULL) v->add_bos = false;
    if (v->eos == TOK_NULL) v->add_eos = false;

    // Special tokens found by text (llama.cpp's workaround for missing
    // metadata), in its order: EOT, EOM and the FIM roles take the first
    // listed text present unless the metadata names them, then every EOG
    // text; each such token becomes CONTROL, so that it is split out only
    // with parse_special. Then the exceptions: GPT-OSS's channel tokens are
    // USER_DEFINED; with harmony's <|return|>+<|call|> (or <|calls|>+
    // <|flush|>) "<|end|>" is no EOG and USER_DEFINED; with
    // "<|tool_response>", "</s>" is no EOG and NORMAL. (llama.cpp walks a
    // hash map, so when a vocabulary holds two texts of one FIM role the one
    // it picks may differ; no known vocabulary does.)
    int32_t fim[VOCAB__FIM_N];
    for (int r = 0; r < VOCAB__FIM_N; r++) {
        fim[r] = TOK_NULL;
        vocab__opt_id(f, vocab__fim_keys[r][0], n, &fim[r]);
        if (vocab__fim_keys[r][1]) vocab__opt_id(f, vocab__fim_keys[r][1], n, &fim[r]);
    }
    if (v->eot == TOK_NULL) v->eot = vocab__find_first(v, vocab__eot_texts);
    if (v->eom == TOK_NULL) v->eom = vocab__find_first(v, vocab__eom_texts);
    for (int r = 0; r < VOCAB__FIM_N; r++)
        if (fim[r] == TOK_NULL) fim[r] = vocab__find_first(v, vocab__fim_texts[r]);
    for (size_t i = 0; vocab__eog_texts[i]; i++) {
        int32_t id = tok_find(v, vocab__eog_texts[i], strlen(vocab__eog_texts[i]));
        if (id != TOK_NULL) v->eog[id] = 1, v->type[id] = TOK_TYPE_CONTROL;
    }
    for (int r = VOCAB__FIM_PAD; r < VOCAB__FIM_N; r++) /* pad, repo, sep end generation */
        if (fim[r] != TOK_NULL) v->eog[fim[r]] = 1;
    for (size_t i = 0; vocab__user_texts[i]; i++) {
        int32_t id = tok_find(v, vocab__user_texts[i], strlen(vocab__user_texts[i]));
        if (id != TOK_NULL) v->type[id] = TOK_TYPE_USER_DEFINED;
    }
    int32_t end = vocab__find_eog(v, "<|end|>");
    if (end != TOK_NULL && ((vocab__find_eog(v, "<|return|>") != TOK_NULL &&
                             vocab__find_eog(v, "<|call|>") != TOK_NULL) ||
                            (vocab__find_eog(v, "<|calls|>") != TOK_NULL &&
                             vocab__find_eog(v, "<|flush|>") != TOK_NULL))) {
        v->eog[end] = 0;
        v->type[end] = TOK_TYPE_USER_DEFINED;
    }
    int32_t eos_s = vocab__find_eog(v, "</s>");
    if (eos_s != TOK_NULL && vocab__find_eog(v, "<|tool_response>") != TOK_NULL) {
        v->eog[eos_s] = 0;
        v->type[eos_s] = TOK_TYPE_NORMAL;
    }
    if (v->eos != TOK_NULL) v->eog[v->eos] = 1;
    if (v->eot != TOK_NULL) v->eog[v->eot] = 1;
    if (v->eom != TOK_NULL) v->eog[v->eom] = 1;

    // special tokens, longest first
    v->special = malloc((size_t)n * sizeof *v->special);
    if (!v->special) {
        e = ks_seterr(eb, KS_ERR_NOMEM, "%s: no memory", path);
        goto fail;
    }
    for (int32_t i = 0; i < n; i++) {
        uint8_t t = v->type[i];
        if (t == TOK_TYPE_CONTROL || t == TOK_TYPE_USER_DEFINED || t == TOK_TYPE_UNKNOWN)
            v->special[v->n_special++] = i;
    }
    qsort_r(v->special, (size_t)v->n_special, sizeof *v->special, vocab__cmp_special, v);

    // Phi-3 (llama.cpp, by model name): special tokens eat whitespace to their right
    gguf_str name = {0};
    if (gguf_get(f, "general.name") && gguf_get_str(f, "general.name", &name, NULL) == KS_OK &&
        (vocab__ieq_contains(name.ptr, name.len, "phi-3") ||
         vocab__ieq_contains(name.ptr, name.len, "phi3"))) {
        for (int32_t k = 0; k < v->n_special; k++)
            v->attr[v->special[k]] |= TOK__ATTR_RSTRIP;
        int32_t id = tok_find(v, "</s>", 4);
        if (id != TOK_NULL) v->attr[id] |= TOK__ATTR_RSTRIP;
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
        for (size_t i = 0; i < 3; i++)
            if ((id = tok_find(v, keep[i], strlen(keep[i]))) != TOK_NULL)
                v->attr[id] &= (uint8_t)~TOK__ATTR_RSTRIP;
    }

    // byte tokens
    for (int b = 0; b < 256; b++) {
        char s[8];
        if (v->kind == TOK_KIND_SPM || v->escape_ws) {
            snprintf(s, sizeof s, "<0x%02X>", b);
            v->byte_tok[b] = tok_find(v, s, 6);
        } else {
            s[0] = (char)b;
            v->byte_tok[b] = tok_find(v, s, 1);
        }
    }

    // pieces (placed after the texts in pool; a piece is never longer than its text)
    v->piece_off = malloc((size_t)n * sizeof *v->piece_off);
    v->piece_len = malloc((size_t)n * sizeof *v->piece_len);
    char *pp = malloc(off + 1);
    if (!v->piece_off || !v->piece_len || !pp) {
        free(pp);
        e = ks_seterr(eb, KS_ERR_NOMEM, "%s: no memory", path);
        goto fail;
    }
    v->piece_pool = pp;
    uint32_t po = 0;
    v->max_text = v->max_piece;
    v->max_piece = 1;
    for (int32_t i = 0; i < n; i++) {
        size_t pl = vocab__make_piece(v, i, pp + po);
        KS_ASSERT(pl <= v->text_len[i] + 1);
        v->piece_off[i] = po;
        v->piece_len[i] = (uint32_t)pl;
        po += (uint32_t)pl;
        if (pl > v->max_piece) v->max_piece = pl;
    }
    *out = v;
    return KS_OK;
fail:
    tok_vocab_free(v);
    return e;
}

void tok_vocab_free(tok_vocab *v) {
    if (!v) return;
    free(v->pool);
    free(v->text_off);
    free(v->text_len);
    free(v->scores);
    free(v->type);
    free(v->attr);
    free(v->eog);
    free(v->special);
    free(v->merge_pool);
    free(v->piece_pool);
    free(v->piece_off);
    free(v->piece_len);
    tok__map_free(&v->tok_map);
    tok__map_free(&v->merge_map);
    tok__pretok_free(&v->pre);
    free(v);
}

// ----------------------------------------------------------------------------
// Accessors

tok_kind tok_vocab_kind(const tok_vocab *v) { return v->kind; }
int32_t tok_n_vocab(const tok_vocab *v) { return v->n_vocab; }
int32_t tok_bos(const tok_vocab *v) { return v->bos; }
int32_t tok_eos(const tok_vocab *v) { return v->eos; }
int32_t tok_eot(const tok_vocab *v) { return v->eot; }
bool tok_add_bos(const tok_vocab *v) { return v->add_bos; }
bool tok_add_eos(const tok_vocab *v) { return v->add_eos; }
const char *tok_pre_name(const tok_vocab *v) { return v->pre.name; }

bool tok_is_eog(const tok_vocab *v, int32_t id) { return id >= 0 && id < v->n_vocab && v->eog[id]; }

const char *tok_token_text(const tok_vocab *v, int32_t id) {
    if (id < 0 || id >= v->n_vocab) return "";
    return v->pool + v->text_off[id];
}

tok_type tok_token_type(const tok_vocab *v, int32_t id) {
    if (id < 0 || id >= v->n_vocab) return TOK_TYPE_UNDEFINED;
    return (tok_type)v->type[id];
}

int32_t tok_find(const tok_vocab *v, const char *text, size_t len) {
    return tok__map_get(&v->tok_map, v->pool, text, len, 0);
}

// ----------------------------------------------------------------------------
// Pieces and detokenization

/* The piece of id (pointer into v, length in *n); n = 0 when it renders as
 * nothing. */
static const char *vocab__piece(const tok_vocab *v, int32_t id, bool render_special, size_t *n) {
    *n = 0;
    if (id < 0 || id >= v->n_vocab) return "";
    uint8_t t = v->type[id];
    if (!render_special && (t == TOK_TYPE_CONTROL || t == TOK_TYPE_UNKNOWN)) return "";
    *n = v->piece_len[id];
    return v->piece_pool + v->piece_off[id];
}

size_t tok_piece(const tok_vocab *v, int32_t id, bool render_special, char *buf, size_t cap) {
    size_t n;
    const char *p = vocab__piece(v, id, render_special, &n);
    if (buf && cap) memcpy(buf, p, n < cap ? n : cap);
    return n;
}

size_t tok_max_piece(const tok_vocab *v) { return v->max_piece; }

size_t tok_max_token_bytes(const tok_vocab *v) {
    if (v->kind == TOK_KIND_WPM) return 0; /* dropped controls, spaces: no bound */
    // A token's piece is exactly the input it covers (U+2581 is the space it
    // escaped; byte tokens, an invalid byte read as U+FFFD and <unk> cover
    // one byte each), except whitespace stripped next to a special token.
    for (int32_t i = 0; i < v->n_vocab; i++)
        if (v->attr[i] & (TOK__ATTR_LSTRIP | TOK__ATTR_RSTRIP)) return 0;
    return v->max_piece;
}

size_t tok_detokenize(const tok_vocab *v, const int32_t *ids, size_t n, bool render_special,
                      bool strip_space, char *buf, size_t cap) {
    size_t total = 0;
    bool strip = strip_space && v->add_space_prefix;
    for (size_t i = 0; i < n; i++) {
        size_t pn;
        const char *p = vocab__piece(v, ids[i], render_special, &pn);
        if (strip && pn > 0) { /* only the first non-empty piece */
            strip = false;
            if (p[0] == ' ') p++, pn--;
        }
        if (total < cap) memcpy(buf + total, p, pn < cap - total ? pn : cap - total);
        total += pn;
    }
    if (cap) buf[total < cap ? total : cap - 1] = '\0';
    return total;
}

// ----------------------------------------------------------------------------
// Streaming UTF-8

void tok_stream_init(tok_stream *s) { memset(s, 0, sizeof *s); }

size_t tok_stream_bound(const tok_vocab *v) { return 3 * (v->max_piece + 4); }

/* Length of the complete, valid UTF-8 sequence at p[0..n): > 0 if valid,
 * 0 if p is a valid but incomplete prefix, -1 if p[0] can never start one. */
static int stream__seq(const uint8_t *p, size_t n) {
    uint8_t c = p[0];
    if (c < 0x80) return 1;
    int len;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else
        return -1;
    for (int k = 1; k < len; k++) {
        if ((size_t)k >= n) return 0;
        uint8_t d = p[k];
        if (k == 1 ? (d < lo || d > hi) : (d & 0xC0) != 0x80) return -1;
    }
    return len;
}

/* Runs the decoder over pend + piece; writes to out when out != NULL.
 * Returns the output length; *n_keep / keep get the new pending tail. */
static size_t stream__run(const tok_stream *s, const char *piece, size_t pn, char *out,
                          uint8_t keep[4], uint8_t *n_keep) {
    uint8_t win[8];
    size_t o = 0, i = 0, total = s->n_pend + pn;
    *n_keep = 0;
    while (i < total) {
        size_t w = 0; /* up to 4 bytes from position i */
        for (; w < 4 && i + w < total; w++)
            win[w] = i + w < s->n_pend ? s->pend[i + w] : (uint8_t)piece[i + w - s->n_pend];
        int l = stream__seq(win, w);
        if (l > 0) {
            if (out) memcpy(out + o, win, (size_t)l);
            o += (size_t)l;
            i += (size_t)l;
        } else if (l == 0) { /* incomplete tail: hold it */
            memcpy(keep, win, w);
            *n_keep = (uint8_t)w;
            break;
        } else {
            if (out) memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    return o;
}

size_t tok_stream_push(tok_stream *s, const tok_vocab *v, int32_t id, char *out, size_t cap) {
    size_t pn;
    const char *p = vocab__piece(v, id, s->render_special, &pn);
    uint8_t keep[4], n_keep;
    size_t need = stream__run(s, p, pn, NULL, keep, &n_keep);
    if (need > cap) return need;
    stream__run(s, p, pn, out, keep, &n_keep);
    memcpy(s->pend, keep, n_keep);
    s->n_pend = n_keep;
    return need;
}

size_t tok_stream_flush(tok_stream *s, char *out, size_t cap) {
    if (s->n_pend == 0) return 0;
    if (cap < 3) return 3;
    memcpy(out, "\xEF\xBF\xBD", 3);
    s->n_pend = 0;
    return 3;
}
