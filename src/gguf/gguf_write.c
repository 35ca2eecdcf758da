/* gguf_write.c — GGUF v3 writer for fixtures and `kvseal mkmodel`.
 *
 * Metadata values are serialized into owned byte blobs as soon as they are
 * set (u32 type + payload, exactly as they will appear in the file), so
 * copying a value from a reader, nested arrays included, is one recursive
 * encode. Tensor data is either borrowed (add_tensor) or streamed from a
 * callback at write time (add_tensor_fill). The file is written to a
 * temporary next to the target, fsynced and renamed into place. */
#include "gguf/gguf_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char *key;
    uint8_t *blob; /* (n) u32 type + value, LE */
    size_t n;
} gguf__wkv;

typedef struct {
    char *name;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    ks_dtype type;
    uint64_t n_bytes;
    const void *data; /* borrowed, or NULL when fill is set */
    gguf_fill_fn fill;
    void *ctx;
} gguf__wt;

struct gguf_writer {
    gguf__wkv *kv;
    size_t n_kv, cap_kv;
    gguf__wt *t;
    size_t n_t, cap_t;
    uint32_t alignment;
};

// ----------------------------------------------------------------------------
// Growable byte buffer

typedef struct {
    uint8_t *p;
    size_t n, cap;
    bool oom;
} gguf__buf;

static void gguf__put(gguf__buf *b, const void *src, size_t n) {
    if (b->oom) return;
    if (n > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void gguf__put32(gguf__buf *b, uint32_t v) {
    uint8_t x[4];
    gguf__st32(x, v);
    gguf__put(b, x, 4);
}

static void gguf__put64(gguf__buf *b, uint64_t v) {
    uint8_t x[8];
    gguf__st64(x, v);
    gguf__put(b, x, 8);
}

static void gguf__putstr(gguf__buf *b, const char *s, uint64_t len) {
    gguf__put64(b, len);
    if (len > SIZE_MAX)
        b->oom = true;
    else
        gguf__put(b, s, (size_t)len);
}

/* Encodes v's payload (without its type tag). INVAL on a malformed value. */
static ks_err gguf__encode(gguf__buf *b, const gguf_value *v, int depth) {
    if (depth >= GGUF__MAX_DEPTH) return KS_ERR_INVAL;
    uint8_t x[8];
    switch (v->type) {
    case GGUF_TYPE_BOOL:
        if (v->v.u64 > 1) return KS_ERR_INVAL;
        x[0] = (uint8_t)v->v.u64;
        gguf__put(b, x, 1);
        return KS_OK;
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
        x[0] = (uint8_t)v->v.u64;
        gguf__put(b, x, 1);
        return KS_OK;
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16:
        x[0] = (uint8_t)v->v.u64;
        x[1] = (uint8_t)(v->v.u64 >> 8);
        gguf__put(b, x, 2);
        return KS_OK;
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
        gguf__put32(b, (uint32_t)v->v.u64);
        return KS_OK;
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
        gguf__put64(b, v->v.u64);
        return KS_OK;
    case GGUF_TYPE_FLOAT32: {
        float f = (float)v->v.f64;
        uint32_t u;
        memcpy(&u, &f, 4);
        gguf__put32(b, u);
        return KS_OK;
    }
    case GGUF_TYPE_FLOAT64: {
        uint64_t u;
        memcpy(&u, &v->v.f64, 8);
        gguf__put64(b, u);
        return KS_OK;
    }
    case GGUF_TYPE_STRING:
        if (v->v.str.len && !v->v.str.ptr) return KS_ERR_INVAL;
        gguf__putstr(b, v->v.str.ptr, v->v.str.len);
        return KS_OK;
    case GGUF_TYPE_ARRAY: {
        uint32_t et = v->v.arr.elem_type;
        uint64_t n = v->v.arr.n;
        if (et >= GGUF_TYPE__COUNT) return KS_ERR_INVAL;
        gguf__put32(b, et);
        gguf__put64(b, n);
        uint32_t esz = gguf__type_size(et);
        if (esz) {
            uint64_t bytes;
            if (!ks_mul_ok(n, esz, &bytes) || bytes > SIZE_MAX || (n && !v->v.arr.raw))
                return KS_ERR_INVAL;
            if (et == GGUF_TYPE_BOOL)
                for (uint64_t i = 0; i < n; i++)
                    if (((const uint8_t *)v->v.arr.raw)[i] > 1) return KS_ERR_INVAL;
            gguf__put(b, v->v.arr.raw, (size_t)bytes);
            return KS_OK;
        }
        if (n && !v->v.arr.items) return KS_ERR_INVAL;
        for (uint64_t i = 0; i < n; i++) {
            if (v->v.arr.items[i].type != et) return KS_ERR_INVAL;
            ks_err e = gguf__encode(b, &v->v.arr.items[i], depth + 1);
            if (e) return e;
        }
        return KS_OK;
    }
    default:
        return KS_ERR_INVAL;
    }
}

// ----------------------------------------------------------------------------
// Writer object and metadata

gguf_writer *gguf_writer_create(void) {
    gguf_writer *w = calloc(1, sizeof *w);
    if (w) w->alignment = GGUF_DEFAULT_ALIGNMENT;
    return w;
}

void gguf_writer_destroy(gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].blob);
    }
    for (size_t i = 0; i < w->n_t; i++)
        free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w);
}

/* Takes ownership of blob (freed on error). Replaces an existing key in place. */
static ks_err gguf__wset(gguf_writer *w, const char *key, gguf__buf *b) {
    if (b->oom) {
        free(b->p);
        return KS_ERR_NOMEM;
    }
    size_t klen = key ? strlen(key) : 0;
    if (klen == 0 || klen > GGUF__MAX_KEY) {
        free(b->p);
        return KS_ERR_INVAL;
    }
    if (!strcmp(key, "general.alignment")) {
        uint32_t a = b->n == 8 ? gguf__ld32(b->p + 4) : 0;
        if (gguf__ld32(b->p) != GGUF_TYPE_UINT32 || a == 0 || (a & (a - 1))) {
            free(b->p);
            return KS_ERR_INVAL;
        }
        w->alignment = a;
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (!strcmp(w->kv[i].key, key)) {
            free(w->kv[i].blob);
            w->kv[i].blob = b->p;
            w->kv[i].n = b->n;
            return KS_OK;
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
        gguf__wkv *kv = realloc(w->kv, cap * sizeof *kv);
        if (!kv) {
            free(b->p);
            return KS_ERR_NOMEM;
        }
        w->kv = kv;
        w->cap_kv = cap;
    }
    char *k = strdup(key);
    if (!k) {
        free(b->p);
        return KS_ERR_NOMEM;
    }
    w->kv[w->n_kv++] = (gguf__wkv){.key = k, .blob = b->p, .n = b->n};
    return KS_OK;
}

ks_err gguf_writer_set_value(gguf_writer *w, const char *key, const gguf_value *v) {
    gguf__buf b = {0};
    gguf__put32(&b, v->type);
    ks_err e = gguf__encode(&b, v, 0);
    if (e) {
        free(b.p);
        return e;
    }
    return gguf__wset(w, key, &b);
}

ks_err gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v) {
    gguf_value x = {.type = GGUF_TYPE_UINT32, .v.u64 = v};
    return gguf_writer_set_value(w, key, &x);
}

ks_err gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v) {
    gguf_value x = {.type = GGUF_TYPE_INT32, .v.i64 = v};
    return gguf_writer_set_value(w, key, &x);
}

ks_err gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v) {
    gguf_value x = {.type = GGUF_TYPE_UINT64, .v.u64 = v};
    return gguf_writer_set_value(w, key, &x);
}

ks_err gguf_writer_set_f32(gguf_writer *w, const char *key, float v) {
    gguf_value x = {.type = GGUF_TYPE_FLOAT32, .v.f64 = v};
    return gguf_writer_set_value(w, key, &x);
}

ks_err gguf_writer_set_bool(gguf_writer *w, const char *key, bool v) {
    gguf_value x = {.type = GGUF_TYPE_BOOL, .v.u64 = v ? 1 : 0};
    return gguf_writer_set_value(w, key, &x);
}

ks_err gguf_writer_set_str(gguf_writer *w, const char *key, const char *v) {
    if (!v) return KS_ERR_INVAL;
    gguf_value x = {.type = GGUF_TYPE_STRING, .v.str = {.ptr = v, .len = strlen(v)}};
    return gguf_writer_set_value(w, key, &x);
}

ks_err gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_type elem_type, const void *data,
                           uint64_t n) {
    if (!gguf__type_size(elem_type)) return KS_ERR_INVAL;
    gguf_value x = {.type = GGUF_TYPE_ARRAY};
    x.v.arr.elem_type = elem_type;
    x.v.arr.n = n;
    x.v.arr.raw = data;
    return gguf_writer_set_value(w, key, &x);
}

ks_err gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                               uint64_t n) {
    gguf__buf b = {0};
    gguf__put32(&b, GGUF_TYPE_ARRAY);
    gguf__put32(&b, GGUF_TYPE_STRING);
    gguf__put64(&b, n);
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i]) {
            free(b.p);
            return KS_ERR_INVAL;
        }
        gguf__putstr(&b, strs[i], strlen(strs[i]));
    }
    return gguf__wset(w, key, &b);
}

ks_err gguf_writer_copy_kv(gguf_writer *w, const gguf_file *src, const char *key) {
    const gguf_value *v = gguf_get(src, key);
    if (!v) return KS_ERR_INVAL;
    return gguf_writer_set_value(w, key, v);
}

ks_err gguf_writer_set_alignment(gguf_writer *w, uint32_t align) {
    if (align == 0 || (align & (align - 1))) return KS_ERR_INVAL;
    return gguf_writer_set_u32(w, "general.alignment", align);
}

// ----------------------------------------------------------------------------
// Tensors

static ks_err gguf__add_tensor(gguf_writer *w, const char *name, uint32_t n_dims, const int64_t *ne,
                               ks_dtype type, const void *data, uint64_t n_bytes, gguf_fill_fn fill,
                               void *ctx) {
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len > GGUF__MAX_NAME || n_dims == 0 || n_dims > GGUF_MAX_DIMS ||
        !ks_dtype_known(type))
        return KS_ERR_INVAL;
    uint64_t rows = 1, row_bytes, total;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] <= 0) return KS_ERR_INVAL;
        if (d > 0 && !ks_mul_ok(rows, (uint64_t)ne[d], &rows)) return KS_ERR_INVAL;
    }
    if (!ks_dtype_row_bytes(type, (uint64_t)ne[0], &row_bytes) ||
        !ks_mul_ok(row_bytes, rows, &total))
        return KS_ERR_INVAL;
    if (!fill && (total != n_bytes || !data)) return KS_ERR_INVAL;
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) return KS_ERR_INVAL;
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 64;
        gguf__wt *t = realloc(w->t, cap * sizeof *t);
        if (!t) return KS_ERR_NOMEM;
        w->t = t;
        w->cap_t = cap;
    }
    gguf__wt *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return KS_ERR_NOMEM;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = d < n_dims ? ne[d] : 1;
    t->type = type;
    t->n_bytes = total;
    t->data = data;
    t->fill = fill;
    t->ctx = ctx;
    w->n_t++;
    return KS_OK;
}

ks_err gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t n_dims, const int64_t *ne,
                              ks_dtype type, const void *data, uint64_t n_bytes) {
    return gguf__add_tensor(w, name, n_dims, ne, type, data, n_bytes, NULL, NULL);
}

ks_err gguf_writer_add_tensor_fill(gguf_writer *w, const char *name, uint32_t n_dims,
                                   const int64_t *ne, ks_dtype type, gguf_fill_fn fill, void *ctx) {
    if (!fill) return KS_ERR_INVAL;
    return gguf__add_tensor(w, name, n_dims, ne, type, NULL, 0, fill, ctx);
}

// ----------------------------------------------------------------------------
// Writing

struct gguf_sink {
    FILE *fp;
    uint64_t left; /* bytes the current tensor still needs */
    int err;       /* errno of the first failed write, 0 if none */
};

ks_err gguf_sink_write(gguf_sink *s, const void *data, size_t n) {
    if (n > s->left) return KS_ERR_INVAL;
    if (s->err) return KS_ERR_IO;
    if (n && fwrite(data, 1, n, s->fp) != n) {
        s->err = errno ? errno : EIO;
        return KS_ERR_IO;
    }
    s->left -= n;
    return KS_OK;
}

static bool gguf__pad(FILE *fp, uint64_t pos, uint64_t align) {
    static const uint8_t zeros[256];
    uint64_t pad = (align - pos % align) % align;
    while (pad) {
        size_t k = pad < sizeof zeros ? (size_t)pad : sizeof zeros;
        if (fwrite(zeros, 1, k, fp) != k) return false;
        pad -= k;
    }
    return true;
}

static uint64_t gguf__align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

ks_err gguf_writer_write(gguf_writer *w, const char *path, ks_errbuf *eb) {
    // Header, metadata and tensor infos go into one buffer first.
    gguf__buf b = {0};
    gguf__put32(&b, GGUF_MAGIC);
    gguf__put32(&b, 3);
    gguf__put64(&b, w->n_t);
    gguf__put64(&b, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        gguf__putstr(&b, w->kv[i].key, strlen(w->kv[i].key));
        gguf__put(&b, w->kv[i].blob, w->kv[i].n);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const gguf__wt *t = &w->t[i];
        gguf__putstr(&b, t->name, strlen(t->name));
        gguf__put32(&b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            gguf__put64(&b, (uint64_t)t->ne[d]);
        gguf__put32(&b, (uint32_t)t->type);
        off = gguf__align_up(off, w->alignment);
        gguf__put64(&b, off);
        off += t->n_bytes;
    }
    if (b.oom) {
        free(b.p);
        return ks_seterr(eb, KS_ERR_NOMEM, "%s: no memory for the GGUF header", path);
    }

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) {
        free(b.p);
        return ks_seterr(eb, KS_ERR_NOMEM, "%s: no memory", path);
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp.XXXXXX", 12);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        ks_err e = ks_seterr(eb, KS_ERR_IO, "%s: create temporary file: %s", path, strerror(errno));
        free(tmp);
        free(b.p);
        return e;
    }
    mode_t um = umask(0);
    umask(um);
    (void)fchmod(fd, 0666 & ~um);
    FILE *fp = fdopen(fd, "wb");
    ks_err e = KS_OK;
    if (!fp) {
        e = ks_seterr(eb, KS_ERR_IO, "%s: fdopen: %s", tmp, strerror(errno));
        close(fd);
        goto fail;
    }
    setvbuf(fp, NULL, _IOFBF, 1 << 20);
    errno = 0;
    if (fwrite(b.p, 1, b.n, fp) != b.n || !gguf__pad(fp, b.n, w->alignment)) goto io_fail;
    uint64_t pos = 0; // within the data section
    for (size_t i = 0; i < w->n_t; i++) {
        const gguf__wt *t = &w->t[i];
        if (!gguf__pad(fp, pos, w->alignment)) goto io_fail;
        pos = gguf__align_up(pos, w->alignment);
        if (t->fill) {
            gguf_sink s = {.fp = fp, .left = t->n_bytes, .err = 0};
            ks_errbuf feb;
            ks_errbuf_clear(&feb);
            e = t->fill(t->ctx, t->name, &s, &feb);
            if (!e && s.left)
                e = ks_seterr(&feb, KS_ERR_INTERNAL, "fill wrote %llu of %llu bytes",
                              (unsigned long long)(t->n_bytes - s.left),
                              (unsigned long long)t->n_bytes);
            if (e && s.err) {
                errno = s.err;
                goto io_fail;
            }
            if (e) {
                e = ks_seterr(eb, e, "%s: tensor '%s': %s", path, t->name,
                              feb.msg[0] ? feb.msg : ks_strerror(e));
                fclose(fp);
                goto fail;
            }
        } else if (t->n_bytes && fwrite(t->data, 1, (size_t)t->n_bytes, fp) != t->n_bytes) {
            goto io_fail;
        }
        pos += t->n_bytes;
    }
    if (!gguf__pad(fp, pos, w->alignment) || fflush(fp) != 0 || fsync(fileno(fp)) != 0)
        goto io_fail;
    if (fclose(fp) != 0) {
        e = ks_seterr(eb, KS_ERR_IO, "%s: close: %s", tmp, strerror(errno));
        goto fail;
    }
    if (rename(tmp, path) != 0) {
        e = ks_seterr(eb, KS_ERR_IO, "%s: rename from %s: %s", path, tmp, strerror(errno));
        goto fail;
    }
    free(tmp);
    free(b.p);
    return KS_OK;

io_fail:
    e = ks_seterr(eb, KS_ERR_IO, "%s: write: %s", tmp, strerror(errno ? errno : EIO));
    fclose(fp);
fail:
    unlink(tmp);
    free(tmp);
    free(b.p);
    return e;
}
