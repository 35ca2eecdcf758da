/* fuzz_gguf.c — libFuzzer harness for the GGUF reader (gguf_open_mem,
 * src/gguf/gguf.c) and for what reads a file next: the tokenizer's
 * vocabulary loader (tok_vocab_load, src/tok/vocab.c), the chat template
 * detection (src/tok/chat.c) and the model loader's checks of every
 * architecture's keys and tensors (model_check_file, src/model/load.c; the
 * corpus has a tiny model of each).
 *
 * Each input is a whole file. One that opens must be safe to walk: every
 * key through every typed getter, every element of every array, every
 * tensor's first and last data byte (libFuzzer hands us a buffer of exactly
 * `size` bytes, so ASan catches a read past the end of the "mapping"), the
 * human-readable dump, and, when the vocabulary loads, a short encode and
 * decode with it. Built only with KS_FUZZ=ON; see tests/fuzz/README.md. */
#include "kvseal/chat.h"
#include "kvseal/gguf.h"
#include "kvseal/model.h"
#include "kvseal/tok.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t fz__sink; /* keeps the touched bytes' loads */

static void fz__value(const gguf_value *v, int depth) {
    if (v->type == GGUF_TYPE_STRING) {
        if (v->v.str.len) fz__sink ^= (uint8_t)v->v.str.ptr[v->v.str.len - 1];
    } else if (v->type == GGUF_TYPE_ARRAY) {
        uint64_t n = v->v.arr.n < 64 ? v->v.arr.n : 64;
        gguf_type et = v->v.arr.elem_type;
        if (et == GGUF_TYPE_STRING || et == GGUF_TYPE_ARRAY) {
            if (v->v.arr.n > 0 && !v->v.arr.items) abort();
            for (uint64_t i = 0; i < n && depth < 8; i++) fz__value(&v->v.arr.items[i], depth + 1);
            if (v->v.arr.n > 0) fz__value(&v->v.arr.items[v->v.arr.n - 1], depth + 1);
        } else if (et == GGUF_TYPE_FLOAT32 || et == GGUF_TYPE_FLOAT64) {
            for (uint64_t i = 0; i < n; i++) (void)gguf_arr_f64(v, i);
            if (v->v.arr.n > 0) (void)gguf_arr_f64(v, v->v.arr.n - 1);
        } else {
            for (uint64_t i = 0; i < n; i++) (void)gguf_arr_i64(v, i);
            if (v->v.arr.n > 0) (void)gguf_arr_i64(v, v->v.arr.n - 1);
        }
    }
}

static void fz__getters(const gguf_file *f, const char *key) {
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f32;
    bool b;
    gguf_str s;
    const gguf_value *arr;
    (void)gguf_get_u32(f, key, &u32, NULL);
    (void)gguf_get_u64(f, key, &u64, NULL);
    (void)gguf_get_i64(f, key, &i64, NULL);
    (void)gguf_get_f32(f, key, &f32, NULL);
    (void)gguf_get_bool(f, key, &b, NULL);
    if (gguf_get_str(f, key, &s, NULL) == KS_OK && s.len) fz__sink ^= (uint8_t)s.ptr[0];
    for (int t = 0; t < GGUF_TYPE__COUNT; t++)
        (void)gguf_get_arr(f, key, (gguf_type)t, &arr, NULL);
}

static void fz__vocab(const gguf_file *f) {
    tok_vocab *v = NULL;
    if (tok_vocab_load(f, &v, NULL) != KS_OK) return;
    static const char text[] = "In the beginning <s></s> \xe2\x96\x81 caf\xc3\xa9 \xff 12345";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (tok_encode(v, text, sizeof text - 1, true, true, &ids, &n_ids, NULL) == KS_OK) {
        char buf[512];
        (void)tok_detokenize(v, ids, n_ids, true, true, buf, sizeof buf);
        tok_stream st;
        tok_stream_init(&st);
        size_t cap = tok_stream_bound(v);
        char *out = malloc(cap);
        if (!out) abort();
        for (size_t i = 0; i < n_ids; i++) (void)tok_stream_push(&st, v, ids[i], out, cap);
        (void)tok_stream_flush(&st, out, cap);
        free(out);
    }
    free(ids);
    int32_t n = tok_n_vocab(v);
    for (int32_t id = 0; id < n && id < 300; id++) {
        char piece[64];
        (void)tok_piece(v, id, true, piece, sizeof piece);
        (void)tok_token_text(v, id);
    }
    tok_vocab_free(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static FILE *devnull;
    if (!devnull && !(devnull = fopen("/dev/null", "w"))) abort();
    gguf_file *f = NULL;
    ks_errbuf eb;
    memset(&eb, 0, sizeof eb);
    if (gguf_open_mem(data, size, "fuzz.gguf", &f, &eb) != KS_OK) {
        if (f || eb.msg[0] == '\0') abort();
        return 0;
    }
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        if (gguf_get(f, kv->key) == NULL) abort();
        fz__value(&kv->value, 0);
        fz__getters(f, kv->key);
    }
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (gguf_find_tensor(f, t->name) != t) abort();
        if (t->n_bytes) {
            const uint8_t *p = t->data;
            fz__sink ^= p[0];
            fz__sink ^= p[t->n_bytes - 1];
        }
    }
    gguf_print(f, devnull);
    (void)chat_detect(f);
    fz__vocab(f);
    gguf_close(f);
    // the model loader over the same bytes: any verdict, never a crash
    if (gguf_open_mem(data, size, "fuzz.gguf", &f, &eb) != KS_OK) abort();
    if (model_check_file(f, &eb) != KS_OK && eb.msg[0] == '\0') abort();
    return 0;
}
