/* gguf_patch.h — tests: makes a `kvseal mkmodel` file (every tensor F32,
 * --type f32) and overwrites chosen tensors in place, so that a test can
 * build a model whose output it can predict (a NextN block that passes its
 * input through, layers that add nothing). */
#ifndef KS_TEST_GGUF_PATCH_H
#define KS_TEST_GGUF_PATCH_H

#include "kvseal/gguf.h"

#include "../check.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Writes `kvseal mkmodel -o dst --vocab (kjv-mini) --type f32 ARGS` with
 * KS_BIN; false (and a note) where KS_BIN or KS_SRC is unset. */
static inline bool gp_mkmodel(const char *dst, const char *args) {
    const char *bin = getenv("KS_BIN"), *src = getenv("KS_SRC");
    if (!bin || !src) {
        printf("note: KS_BIN or KS_SRC unset: no mkmodel file (%s)\n", args);
        return false;
    }
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "'%s' mkmodel -o '%s' --vocab '%s/models/kjv-mini.gguf' --type f32 %s >/dev/null",
             bin, dst, src, args);
    CHECK_EQ(system(cmd), 0);
    return true;
}

/* Writes buf (t->n_bytes) over tensor t of the file at path, which f (then
 * closed) has open; frees buf. */
static inline void gp_write(const char *path, gguf_file *f, const gguf_tensor *t, float *buf) {
    const off_t at = (off_t)(gguf_data_offset(f) + t->offset);
    const size_t n = t->n_bytes;
    gguf_close(f);
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0);
    CHECK_EQ(pwrite(fd, buf, n, at), (ssize_t)n);
    close(fd);
    free(buf);
}

/* Sets every element of the F32 tensor `name` of the file at path to v,
 * then, with eye >= 0, element (row r, column r + eye) of each row to 1:
 * a matrix that copies its input's columns [eye, eye + rows). */
static inline void gp_fill(const char *path, const char *name, float v, int64_t eye) {
    gguf_file *f;
    ks_errbuf eb;
    CHECK_EQ(gguf_open(path, &f, &eb), KS_OK);
    const gguf_tensor *t = gguf_find_tensor(f, name);
    CHECK(t != NULL);
    if (!t) {
        gguf_close(f);
        return;
    }
    CHECK_EQ(t->type, KS_DTYPE_F32);
    const int64_t cols = t->ne[0], rows = (int64_t)(t->n_elems / (uint64_t)cols);
    float *buf = malloc(t->n_bytes);
    CHECK(buf != NULL);
    for (uint64_t i = 0; i < t->n_elems; i++)
        buf[i] = v;
    for (int64_t r = 0; eye >= 0 && r < rows && r + eye < cols; r++)
        buf[r * cols + r + eye] = 1.0f;
    gp_write(path, f, t, buf);
}

/* Sets row v of the F32 matrix dst (V rows) to row (v - shift) mod V of the
 * F32 matrix src of the same shape (both in the file at path). */
static inline void gp_rows_shifted(const char *path, const char *dst, const char *src, int shift) {
    gguf_file *f;
    ks_errbuf eb;
    CHECK_EQ(gguf_open(path, &f, &eb), KS_OK);
    const gguf_tensor *d = gguf_find_tensor(f, dst), *s = gguf_find_tensor(f, src);
    CHECK(d && s && d->type == KS_DTYPE_F32 && s->type == KS_DTYPE_F32 && d->n_dims == 2 &&
          s->n_dims == 2 && d->ne[0] == s->ne[0] && d->ne[1] == s->ne[1]);
    const int64_t cols = s->ne[0], rows = s->ne[1];
    float *buf = malloc(s->n_bytes);
    CHECK(buf != NULL);
    for (int64_t v = 0; v < rows; v++)
        memcpy(buf + v * cols, (const float *)s->data + ((v - shift) % rows + rows) % rows * cols,
               sizeof(float) * (size_t)cols);
    gp_write(path, f, d, buf);
}

/* gp_fill of blk.<layer>.<what>. */
static inline void gp_fill_blk(const char *path, int layer, const char *what, float v,
                               int64_t eye) {
    char name[128];
    snprintf(name, sizeof name, "blk.%d.%s", layer, what);
    gp_fill(path, name, v, eye);
}

/* Makes the glm4moe block `layer` (a MoE one; `dense`: the leading dense
 * one) add nothing to the residual stream: its attention output and every
 * FFN's down projection zero. */
static inline void gp_silence_glm4moe_block(const char *path, int layer, bool dense) {
    gp_fill_blk(path, layer, "attn_output.weight", 0.0f, -1);
    if (dense) {
        gp_fill_blk(path, layer, "ffn_down.weight", 0.0f, -1);
        return;
    }
    gp_fill_blk(path, layer, "ffn_down_exps.weight", 0.0f, -1);
    gp_fill_blk(path, layer, "ffn_down_shexp.weight", 0.0f, -1);
}

/* The glm4moe NextN block `layer` of an E-wide model as a probe: it adds
 * nothing, its norms are unweighted, and eh_proj passes through the
 * normed embedding of the token (`embd`) or the normed hidden row. */
static inline void gp_nextn_probe(const char *path, int layer, int64_t E, bool embd) {
    gp_silence_glm4moe_block(path, layer, false);
    gp_fill_blk(path, layer, "nextn.eh_proj.weight", 0.0f, embd ? 0 : E);
    gp_fill_blk(path, layer, "nextn.enorm.weight", 1.0f, -1);
    gp_fill_blk(path, layer, "nextn.hnorm.weight", 1.0f, -1);
    gp_fill_blk(path, layer, "nextn.shared_head_norm.weight", 1.0f, -1);
}

#endif
