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

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--pre")) return with_pre(argv[2], argv[3], argv[4]);
    if (argc != 2) {
        fprintf(stderr, "usage: tok_specials VOCAB.gguf | tok_specials --pre NAME IN OUT\n");
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
