/* tok_specials.c — TEST ONLY: `tok_specials VOCAB.gguf` prints what
 * tests/e2e/test_tokenize_oracle.sh needs to build its special-token
 * strings, read straight from the GGUF metadata (not through src/tok, so a
 * token kvseal misclassifies still gets tested):
 *   bos ID                    (tokenizer.ggml.bos_token_id, if present)
 *   TYPE ID HEX               one line per token whose tokenizer.ggml.token_type
 *                             is 2 (unknown), 3 (control) or 4 (user-defined);
 *                             TYPE is unknown/control/user, HEX its text's bytes
 * `tok_specials --pre NAME VOCAB.gguf OUT.gguf` writes OUT.gguf: VOCAB's
 * metadata (no tensors) with tokenizer.ggml.pre set to NAME, so that one
 * BPE vocabulary can try every pre-tokenizer against llama.cpp.
 * `tok_specials --gemma4 VOCAB.gguf OUT.gguf` writes OUT.gguf: a SentencePiece
 * VOCAB's metadata as a "gemma4" tokenizer (SentencePiece-style BPE: the same
 * tokens, ▁ for spaces, <0xXX> bytes) with merges made up from its tokens:
 * each normal token of two or more characters that splits into two tokens
 * (the split whose weaker part scores best) becomes the merge of those two,
 * ranked by the token's score (higher first, then id); and two more normal
 * tokens, "\n" and "\n\n" (Gemma 4's 107 and 108, which no merge makes), so
 * that kvseal's and llama.cpp's gemma4 tokenizers meet on a vocabulary of
 * realistic size.
 * Exits 2 when a file or its token arrays cannot be read or written. */
#include "kvseal/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --pre NAME IN OUT: a copy of IN's metadata with another pre-tokenizer. */
static int with_pre(const char *name, const char *in, const char *out) {
    ks_errbuf eb;
    ks_errbuf_clear(&eb);
    gguf_file *f = NULL;
    gguf_writer *w = gguf_writer_create();
    ks_err e = w ? gguf_open(in, &f, &eb) : KS_ERR_NOMEM;
    for (uint64_t i = 0; !e && i < gguf_n_kv(f); i++) {
        const char *key = gguf_kv_at(f, i)->key;
        if (strcmp(key, "tokenizer.ggml.pre")) e = gguf_writer_copy_kv(w, f, key);
    }
    if (!e) e = gguf_writer_set_str(w, "tokenizer.ggml.pre", name);
    if (!e) e = gguf_writer_write(w, out, &eb);
    if (e) fprintf(stderr, "tok_specials: %s -> %s: %s %s\n", in, out, ks_err_name(e), eb.msg);
    gguf_writer_destroy(w);
    gguf_close(f);
    return e ? 2 : 0;
}

typedef struct {
    float score;
    uint64_t id;
    size_t cut; /* bytes of the left part */
} g4_merge;

static int g4_cmp(const void *a, const void *b) {
    const g4_merge *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static const gguf_value *g4_toks; /* the tokens g4_order sorts (a test helper's global) */

/* Token texts by (length, bytes). */
static int g4_str_cmp(const char *a, size_t an, const char *b, size_t bn) {
    if (an != bn) return an < bn ? -1 : 1;
    return memcmp(a, b, an);
}
static int g4_order(const void *a, const void *b) {
    const gguf_str *x = &g4_toks->v.arr.items[*(const uint32_t *)a].v.str;
    const gguf_str *y = &g4_toks->v.arr.items[*(const uint32_t *)b].v.str;
    return g4_str_cmp(x->ptr, x->len, y->ptr, y->len);
}

/* The id of text s[0..n) by binary search over sorted (ids of g4_toks), or -1. */
static int64_t g4_find(const uint32_t *sorted, uint64_t n_tok, const char *s, size_t n) {
    uint64_t lo = 0, hi = n_tok;
    while (lo < hi) {
        const uint64_t mid = (lo + hi) / 2;
        const gguf_str *t = &g4_toks->v.arr.items[sorted[mid]].v.str;
        const int c = g4_str_cmp(t->ptr, t->len, s, n);
        if (c == 0) return sorted[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* --gemma4 IN OUT (the file comment). */
static int with_gemma4(const char *in, const char *out) {
    ks_errbuf eb;
    ks_errbuf_clear(&eb);
    gguf_file *f = NULL;
    gguf_writer *w = gguf_writer_create();
    const gguf_value *toks, *scores, *types;
    ks_err e = w ? gguf_open(in, &f, &eb) : KS_ERR_NOMEM;
    if (!e) e = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, &eb);
    if (!e) e = gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, &scores, &eb);
    if (!e) e = gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &types, &eb);
    const uint64_t n = e ? 0 : toks->v.arr.n;
    g4_merge *m = calloc(n + 1, sizeof *m);
    char **strs = calloc(n + 1, sizeof *strs);
    uint32_t *sorted = calloc(n + 1, sizeof *sorted);
    size_t nm = 0;
    if (!e && (!m || !strs || !sorted)) e = KS_ERR_NOMEM;
    for (uint64_t i = 0; !e && i < n; i++)
        sorted[i] = (uint32_t)i;
    g4_toks = toks;
    if (!e) qsort(sorted, n, sizeof *sorted, g4_order);
    for (uint64_t i = 0; !e && i < n; i++) {
        const gguf_str *t = &toks->v.arr.items[i].v.str;
        if (gguf_arr_i64(types, i) != 1 || memchr(t->ptr, ' ', t->len)) continue;
        float best = 0.0f;
        size_t cut = 0;
        for (size_t k = 1; k < t->len; k++) { // char boundaries only
            if (((unsigned char)t->ptr[k] & 0xC0) == 0x80) continue;
            const int64_t a = g4_find(sorted, n, t->ptr, k),
                          b = g4_find(sorted, n, t->ptr + k, t->len - k);
            if (a < 0 || b < 0) continue;
            float sa, sb;
            memcpy(&sa, (const char *)scores->v.arr.raw + (size_t)a * 4, 4);
            memcpy(&sb, (const char *)scores->v.arr.raw + (size_t)b * 4, 4);
            const float s = sa < sb ? sa : sb;
            if (!cut || s > best) best = s, cut = k;
        }
        if (!cut) continue;
        memcpy(&m[nm].score, (const char *)scores->v.arr.raw + (size_t)i * 4, 4);
        m[nm].id = i;
        m[nm++].cut = cut;
    }
    qsort(m, nm, sizeof *m, g4_cmp);
    for (size_t k = 0; !e && k < nm; k++) {
        const gguf_str *t = &toks->v.arr.items[m[k].id].v.str;
        if (!(strs[k] = malloc(t->len + 2))) {
            e = KS_ERR_NOMEM;
            break;
        }
        memcpy(strs[k], t->ptr, m[k].cut);
        strs[k][m[k].cut] = ' ';
        memcpy(strs[k] + m[k].cut + 1, t->ptr + m[k].cut, t->len - m[k].cut);
        strs[k][t->len + 1] = '\0';
    }
    for (uint64_t i = 0; !e && i < gguf_n_kv(f); i++) {
        const char *key = gguf_kv_at(f, i)->key;
        if (strcmp(key, "tokenizer.ggml.pre") && strcmp(key, "tokenizer.ggml.model") &&
            strcmp(key, "tokenizer.ggml.merges") && strcmp(key, "tokenizer.ggml.tokens") &&
            strcmp(key, "tokenizer.ggml.scores") && strcmp(key, "tokenizer.ggml.token_type"))
            e = gguf_writer_copy_kv(w, f, key);
    }
    // the tokens, scores and types with "\n" and "\n\n" after them
    const char **tk = e ? NULL : calloc(n + 2, sizeof *tk);
    float *sc = e ? NULL : calloc(n + 2, sizeof *sc);
    int32_t *ty = e ? NULL : calloc(n + 2, sizeof *ty);
    char **tcopy = e ? NULL : calloc(n, sizeof *tcopy);
    if (!e && (!tk || !sc || !ty || !tcopy)) e = KS_ERR_NOMEM;
    for (uint64_t i = 0; !e && i < n; i++) {
        const gguf_str *t = &toks->v.arr.items[i].v.str;
        if (!(tcopy[i] = malloc(t->len + 1))) {
            e = KS_ERR_NOMEM;
            break;
        }
        memcpy(tcopy[i], t->ptr, t->len);
        tcopy[i][t->len] = '\0';
        tk[i] = tcopy[i];
        memcpy(&sc[i], (const char *)scores->v.arr.raw + (size_t)i * 4, 4);
        ty[i] = (int32_t)gguf_arr_i64(types, i);
    }
    if (!e) {
        tk[n] = "\n", tk[n + 1] = "\n\n";
        sc[n] = sc[n + 1] = -1000.0f;
        ty[n] = ty[n + 1] = 1;
        e = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tk, n + 2);
    }
    if (!e) e = gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, sc, n + 2);
    if (!e) e = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, ty, n + 2);
    if (!e) e = gguf_writer_set_str(w, "tokenizer.ggml.model", "gemma4");
    if (!e) e = gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)strs, nm);
    if (!e) e = gguf_writer_write(w, out, &eb);
    if (e) fprintf(stderr, "tok_specials: %s -> %s: %s %s\n", in, out, ks_err_name(e), eb.msg);
    for (size_t k = 0; strs && k < nm; k++)
        free(strs[k]);
    for (uint64_t i = 0; tcopy && i < n; i++)
        free(tcopy[i]);
    free(tcopy);
    free(tk);
    free(sc);
    free(ty);
    free(strs);
    free(m);
    free(sorted);
    gguf_writer_destroy(w);
    gguf_close(f);
    return e ? 2 : 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--pre")) return with_pre(argv[2], argv[3], argv[4]);
    if (argc == 4 && !strcmp(argv[1], "--gemma4")) return with_gemma4(argv[2], argv[3]);
    if (argc != 2) {
        fprintf(stderr, "usage: tok_specials VOCAB.gguf | tok_specials --pre NAME IN OUT | "
                        "tok_specials --gemma4 IN OUT\n");
        return 2;
    }
    ks_errbuf eb;
    ks_errbuf_clear(&eb);
    gguf_file *f = NULL;
    const gguf_value *toks, *types;
    if (gguf_open(argv[1], &f, &eb) ||
        gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, &eb)) {
        fprintf(stderr, "tok_specials: %s\n", eb.msg);
        gguf_close(f);
        return 2;
    }
    types = gguf_get(f, "tokenizer.ggml.token_type");
    gguf_type et =
        types && types->type == GGUF_TYPE_ARRAY ? types->v.arr.elem_type : GGUF_TYPE_STRING;
    if (!types || types->type != GGUF_TYPE_ARRAY || types->v.arr.n != toks->v.arr.n ||
        et == GGUF_TYPE_FLOAT32 || et == GGUF_TYPE_FLOAT64 || et == GGUF_TYPE_BOOL ||
        et == GGUF_TYPE_STRING || et == GGUF_TYPE_ARRAY) {
        fprintf(stderr, "tok_specials: %s: no usable tokenizer.ggml.token_type\n", argv[1]);
        gguf_close(f);
        return 2;
    }
    uint32_t bos;
    if (gguf_get(f, "tokenizer.ggml.bos_token_id") &&
        gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &bos, &eb) == KS_OK)
        printf("bos %u\n", bos);
    static const char *const names[] = {[2] = "unknown", [3] = "control", [4] = "user"};
    for (uint64_t i = 0; i < toks->v.arr.n; i++) {
        int64_t t = gguf_arr_i64(types, i);
        if (t < 2 || t > 4) continue;
        const gguf_str *s = &toks->v.arr.items[i].v.str;
        printf("%s %llu ", names[t], (unsigned long long)i);
        for (uint64_t k = 0; k < s->len; k++)
            printf("%02x", (unsigned char)s->ptr[k]);
        putchar('\n');
    }
    gguf_close(f);
    return fflush(stdout) ? 2 : 0;
}
