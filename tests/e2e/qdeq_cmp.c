/* qdeq_cmp.c — TEST ONLY: `qdeq_cmp Q.gguf F32.gguf` compares every
 * quantized tensor of Q.gguf, dequantized by kern_dequantize_row, with the
 * same tensor of F32.gguf, which llama-quantize --allow-requantize wrote
 * from Q.gguf (llama.cpp's own dequantization). They must be bit-identical:
 * the block layouts are llama.cpp's (tests/e2e/test_qtypes_kjv.sh). Prints
 * one line per tensor type; exits 1 on any difference. */
#include "kvseal/gguf.h"
#include "kvseal/kern.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: qdeq_cmp Q.gguf F32.gguf\n");
        return 2;
    }
    ks_errbuf eb;
    ks_errbuf_clear(&eb);
    gguf_file *q = NULL, *f = NULL;
    if (gguf_open(argv[1], &q, &eb) || gguf_open(argv[2], &f, &eb)) {
        fprintf(stderr, "qdeq_cmp: %s\n", eb.msg);
        return 2;
    }
    int bad = 0;
    uint64_t n_by_type[KS_DTYPE__COUNT] = {0};
    for (uint64_t i = 0; i < gguf_n_tensors(q); i++) {
        const gguf_tensor *t = gguf_tensor_at(q, i), *u = gguf_find_tensor(f, t->name);
        if (t->type == KS_DTYPE_F32) continue;
        if (!u || u->type != KS_DTYPE_F32 || u->n_elems != t->n_elems) {
            fprintf(stderr, "qdeq_cmp: %s: no F32 twin in %s\n", t->name, argv[2]);
            return 2;
        }
        if (!kern_wtype_supported((ks_dtype)t->type)) {
            fprintf(stderr, "qdeq_cmp: %s: type %s not supported\n", t->name,
                    ks_dtype_name(t->type));
            bad++;
            continue;
        }
        float *y = malloc(t->n_elems * sizeof(float));
        if (!y) return 2;
        kern_dequantize_row((ks_dtype)t->type, t->data, y, (int64_t)t->n_elems);
        if (memcmp(y, u->data, t->n_elems * sizeof(float)) != 0) {
            fprintf(stderr, "qdeq_cmp: %s (%s): dequantized values differ from llama.cpp's\n",
                    t->name, ks_dtype_name(t->type));
            bad++;
        }
        n_by_type[t->type]++;
        free(y);
    }
    for (int ty = 0; ty < KS_DTYPE__COUNT; ty++)
        if (n_by_type[ty])
            printf(" %s:%llu", ks_dtype_name((uint32_t)ty), (unsigned long long)n_by_type[ty]);
    printf("\n");
    gguf_close(q);
    gguf_close(f);
    return bad ? 1 : 0;
}
