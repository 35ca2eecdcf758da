/* gguf.c — GGUF v2/v3 reader: mmap the file read-only, validate everything,
 * then hand out pointers into the mapping.
 *
 * Layout (little-endian; v2 and v3 are byte-identical for LE files):
 *   u32 magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv x {str key, u32 type, value}, n_tensors x {str name, u32 n_dims,
 *   u64 ne[n_dims], u32 ggml type, u64 offset}, pad to alignment, data.
 *   str = u64 len + bytes; array = u32 elem type + u64 n + elements.
 * Every read goes through a bounds-checked cursor and explicit LE loads; no
 * struct is ever cast over file bytes. Counts are checked against the bytes
 * left before anything is allocated, so a hostile header cannot make us
 * allocate more than a small multiple of the file size. */
#include "gguf/gguf_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct gguf_file {
    char *path;          /* copy of the path or name given at open */
    const uint8_t *base; /* (size) file bytes */
    uint64_t size;
    void *map; /* mmap base, NULL for gguf_open_mem */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    uint64_t n_kv;
    gguf_kv *kv; /* (n_kv) */
    uint64_t n_tensors;
    gguf_tensor *tensors; /* (n_tensors) */
    uint64_t *kv_hash;    /* open addressing, index+1 (0 = empty), (hash_cap) */
    uint64_t *t_hash;     /* same for tensors */
    uint64_t kv_hash_cap, t_hash_cap;
};

// ----------------------------------------------------------------------------
// Cursor and error messages

typedef struct {
    const uint8_t *b;
    uint64_t n, pos;
    const char *path;
    char ctx[192]; /* "key 'general.name'", "tensor 'x'", "header" */
    ks_errbuf *eb;
} gguf__rd;

/* Copies len bytes of untrusted text into dst as printable ASCII (others as
 * \xNN), cut at about 80 characters. */
static void gguf__quote(char *dst, size_t cap, const char *s, uint64_t len) {
    size_t o = 0;
    for (uint64_t i = 0; i < len && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (o >= 80) {
            memcpy(dst + o, "...", 3);
            o += 3;
            break;
        }
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            dst[o++] = (char)c;
        } else {
            o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", c);
        }
    }
    dst[o] = '\0';
}

static ks_err gguf__fail(gguf__rd *r, ks_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ks_err gguf__fail(gguf__rd *r, ks_err code, const char *fmt, ...) {
    char msg[KS_ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ks_seterr(r->eb, code, "%s: %s: %s", r->path, r->ctx, msg);
}

/* Succeeds when k more bytes are available at the cursor. */
static ks_err gguf__need(gguf__rd *r, uint64_t k, const char *what) {
    if (k <= r->n - r->pos) return KS_OK;
    return gguf__fail(r, KS_ERR_FORMAT,
                      "truncated: %s needs %llu bytes at offset %llu, file has %llu bytes", what,
                      (unsigned long long)k, (unsigned long long)r->pos, (unsigned long long)r->n);
}

static ks_err gguf__u32(gguf__rd *r, uint32_t *out, const char *what) {
    ks_err e = gguf__need(r, 4, what);
    if (e) return e;
    *out = gguf__ld32(r->b + r->pos);
    r->pos += 4;
    return KS_OK;
}

static ks_err gguf__u64(gguf__rd *r, uint64_t *out, const char *what) {
    ks_err e = gguf__need(r, 8, what);
    if (e) return e;
    *out = gguf__ld64(r->b + r->pos);
    r->pos += 8;
    return KS_OK;
}

static ks_err gguf__str(gguf__rd *r, gguf_str *out, const char *what) {
    uint64_t len;
    ks_err e = gguf__u64(r, &len, what);
    if (e) return e;
    if (len > r->n - r->pos)
        return gguf__fail(r, KS_ERR_FORMAT,
                          "truncated: %s length %llu at offset %llu exceeds the %llu bytes left",
                          what, (unsigned long long)len, (unsigned long long)(r->pos - 8),
                          (unsigned long long)(r->n - r->pos));
    out->ptr = (const char *)(r->b + r->pos);
    out->len = len;
    r->pos += len;
    return KS_OK;
}

static uint64_t gguf__hash(const char *s, uint64_t len) {
    uint64_t h = 1469598103934665603ull; // FNV-1a
    for (uint64_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

// ----------------------------------------------------------------------------
// Values

static void gguf__free_value(gguf_value *v) {
    if (v->type != GGUF_TYPE_ARRAY || !v->v.arr.items) return;
    gguf_value *items = (gguf_value *)v->v.arr.items;
    if (v->v.arr.elem_type == GGUF_TYPE_ARRAY)
        for (uint64_t i = 0; i < v->v.arr.n; i++)
            gguf__free_value(&items[i]);
    free(items);
    v->v.arr.items = NULL;
}

static ks_err gguf__value(gguf__rd *r, uint32_t type, gguf_value *out, int depth);

static ks_err gguf__array(gguf__rd *r, gguf_value *out, int depth) {
    uint32_t et;
    uint64_t n;
    ks_err e = gguf__u32(r, &et, "array element type");
    if (!e) e = gguf__u64(r, &n, "array length");
    if (e) return e;
    out->type = GGUF_TYPE_ARRAY;
    out->v.arr.elem_type = (gguf_type)et;
    out->v.arr.n = 0;
    out->v.arr.raw = NULL;
    out->v.arr.items = NULL;
    if (et >= GGUF_TYPE__COUNT)
        return gguf__fail(r, KS_ERR_FORMAT, "invalid array element type %u", et);
    uint64_t left = r->n - r->pos;
    uint32_t esz = gguf__type_size(et);
    if (esz) {
        if (n > left / esz)
            return gguf__fail(r, KS_ERR_FORMAT,
                              "truncated: array of %llu %s elements at offset %llu exceeds the "
                              "%llu bytes left",
                              (unsigned long long)n, gguf_type_name(et), (unsigned long long)r->pos,
                              (unsigned long long)left);
        const uint8_t *p = r->b + r->pos;
        if (et == GGUF_TYPE_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (p[i] > 1)
                    return gguf__fail(r, KS_ERR_FORMAT, "bool array element %llu is %u, not 0/1",
                                      (unsigned long long)i, p[i]);
        out->v.arr.n = n;
        out->v.arr.raw = p;
        r->pos += n * esz;
        return KS_OK;
    }
    // STRING (>= 8 bytes each) or ARRAY (>= 12 bytes each): bound n by the
    // bytes left before allocating the item table.
    uint64_t min_sz = et == GGUF_TYPE_STRING ? 8 : 12;
    if (n > left / min_sz)
        return gguf__fail(r, KS_ERR_FORMAT,
                          "truncated: array of %llu %s elements at offset %llu cannot fit in the "
                          "%llu bytes left",
                          (unsigned long long)n, gguf_type_name(et), (unsigned long long)r->pos,
                          (unsigned long long)left);
    if (et == GGUF_TYPE_ARRAY && depth + 1 >= GGUF__MAX_DEPTH)
        return gguf__fail(r, KS_ERR_FORMAT, "arrays nested deeper than %d levels", GGUF__MAX_DEPTH);
    if (n == 0) return KS_OK;
    gguf_value *items = calloc((size_t)n, sizeof *items);
    if (!items)
        return gguf__fail(r, KS_ERR_NOMEM, "no memory for %llu array items", (unsigned long long)n);
    out->v.arr.items = items;
    out->v.arr.n = n; // items beyond the parsed ones are zeroed: safe to free
    for (uint64_t i = 0; i < n; i++) {
        e = gguf__value(r, et, &items[i], depth + 1);
        if (e) return e;
    }
    return KS_OK;
}

static ks_err gguf__value(gguf__rd *r, uint32_t type, gguf_value *out, int depth) {
    if (type >= GGUF_TYPE__COUNT)
        return gguf__fail(r, KS_ERR_FORMAT, "invalid value type %u", type);
    if (type == GGUF_TYPE_STRING) {
        out->type = GGUF_TYPE_STRING;
        return gguf__str(r, &out->v.str, "string");
    }
    if (type == GGUF_TYPE_ARRAY) return gguf__array(r, out, depth);
    uint32_t sz = gguf__type_size(type);
    ks_err e = gguf__need(r, sz, gguf_type_name(type));
    if (e) return e;
    gguf__decode_scalar(type, r->b + r->pos, out);
    if (type == GGUF_TYPE_BOOL && out->v.u64 > 1)
        return gguf__fail(r, KS_ERR_FORMAT, "bool value is %llu, not 0/1",
                          (unsigned long long)out->v.u64);
    r->pos += sz;
    return KS_OK;
}

// ----------------------------------------------------------------------------
// Header, metadata, tensor infos

static ks_err gguf__parse_kv(gguf_file *f, gguf__rd *r) {
    for (uint64_t i = 0; i < f->n_kv; i++) {
        snprintf(r->ctx, sizeof r->ctx, "key #%llu", (unsigned long long)i);
        gguf_str k;
        ks_err e = gguf__str(r, &k, "key");
        if (e) return e;
        char q[128];
        gguf__quote(q, sizeof q, k.ptr, k.len);
        snprintf(r->ctx, sizeof r->ctx, "key '%s'", q);
        if (k.len == 0)
            return gguf__fail(r, KS_ERR_FORMAT, "empty key (key #%llu)", (unsigned long long)i);
        if (k.len > GGUF__MAX_KEY)
            return gguf__fail(r, KS_ERR_FORMAT, "key is %llu bytes long (max %u)",
                              (unsigned long long)k.len, GGUF__MAX_KEY);
        if (memchr(k.ptr, 0, (size_t)k.len))
            return gguf__fail(r, KS_ERR_FORMAT, "key contains a NUL byte");
        char *key = malloc((size_t)k.len + 1);
        if (!key) return gguf__fail(r, KS_ERR_NOMEM, "no memory");
        memcpy(key, k.ptr, (size_t)k.len);
        key[k.len] = '\0';
        f->kv[i].key = key;
        // duplicate check + index
        uint64_t h = gguf__hash(key, k.len) & (f->kv_hash_cap - 1);
        while (f->kv_hash[h]) {
            if (!strcmp(f->kv[f->kv_hash[h] - 1].key, key))
                return gguf__fail(r, KS_ERR_FORMAT, "duplicate key (also key #%llu)",
                                  (unsigned long long)(f->kv_hash[h] - 1));
            h = (h + 1) & (f->kv_hash_cap - 1);
        }
        f->kv_hash[h] = i + 1;
        uint32_t type;
        e = gguf__u32(r, &type, "value type");
        if (!e) e = gguf__value(r, type, &f->kv[i].value, 0);
        if (e) return e;
    }
    return KS_OK;
}

static ks_err gguf__parse_tensors(gguf_file *f, gguf__rd *r) {
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        snprintf(r->ctx, sizeof r->ctx, "tensor #%llu", (unsigned long long)i);
        gguf_str s;
        ks_err e = gguf__str(r, &s, "tensor name");
        if (e) return e;
        char q[128];
        gguf__quote(q, sizeof q, s.ptr, s.len);
        snprintf(r->ctx, sizeof r->ctx, "tensor '%s'", q);
        if (s.len == 0)
            return gguf__fail(r, KS_ERR_FORMAT, "empty tensor name (tensor #%llu)",
                              (unsigned long long)i);
        if (s.len > GGUF__MAX_NAME)
            return gguf__fail(r, KS_ERR_FORMAT, "name is %llu bytes long (max %u)",
                              (unsigned long long)s.len, GGUF__MAX_NAME);
        if (memchr(s.ptr, 0, (size_t)s.len))
            return gguf__fail(r, KS_ERR_FORMAT, "name contains a NUL byte");
        char *name = malloc((size_t)s.len + 1);
        if (!name) return gguf__fail(r, KS_ERR_NOMEM, "no memory");
        memcpy(name, s.ptr, (size_t)s.len);
        name[s.len] = '\0';
        t->name = name;
        uint64_t h = gguf__hash(name, s.len) & (f->t_hash_cap - 1);
        while (f->t_hash[h]) {
            if (!strcmp(f->tensors[f->t_hash[h] - 1].name, name))
                return gguf__fail(r, KS_ERR_FORMAT, "duplicate tensor name (also tensor #%llu)",
                                  (unsigned long long)(f->t_hash[h] - 1));
            h = (h + 1) & (f->t_hash_cap - 1);
        }
        f->t_hash[h] = i + 1;

        e = gguf__u32(r, &t->n_dims, "n_dims");
        if (e) return e;
        if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
            return gguf__fail(r, KS_ERR_FORMAT, "n_dims is %u (must be 1..%d)", t->n_dims,
                              GGUF_MAX_DIMS);
        uint64_t n_elems = 1;
        for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
            t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t ne;
            e = gguf__u64(r, &ne, "dimension");
            if (e) return e;
            if (ne == 0 || ne > (uint64_t)INT64_MAX)
                return gguf__fail(r, KS_ERR_FORMAT, "dimension %u is %lld (must be > 0)", d,
                                  (long long)ne);
            if (!ks_mul_ok(n_elems, ne, &n_elems) || n_elems > (uint64_t)INT64_MAX)
                return gguf__fail(r, KS_ERR_FORMAT, "element count overflows at dimension %u", d);
            t->ne[d] = (int64_t)ne;
        }
        t->n_elems = n_elems;
        e = gguf__u32(r, &t->type, "tensor type");
        if (!e) e = gguf__u64(r, &t->offset, "tensor offset");
        if (e) return e;
        if (!ks_dtype_known(t->type))
            return gguf__fail(r, KS_ERR_UNSUPPORTED, "unknown tensor type %u", t->type);
        uint32_t be = ks_dtype_block_elems(t->type);
        uint64_t row;
        if ((uint64_t)t->ne[0] % be)
            return gguf__fail(r, KS_ERR_FORMAT,
                              "row of %lld elements is not a multiple of the %s "
                              "block size %u",
                              (long long)t->ne[0], ks_dtype_name(t->type), be);
        if (!ks_dtype_row_bytes(t->type, (uint64_t)t->ne[0], &row) ||
            !ks_mul_ok(row, n_elems / (uint64_t)t->ne[0], &t->n_bytes))
            return gguf__fail(r, KS_ERR_FORMAT, "data size overflows");
        if (t->offset % f->alignment)
            return gguf__fail(r, KS_ERR_FORMAT,
                              "offset %llu is not a multiple of the alignment %llu",
                              (unsigned long long)t->offset, (unsigned long long)f->alignment);
    }
    return KS_OK;
}

static int gguf__cmp_off(const void *a, const void *b) {
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Places the tensors: data section bounds, then overlaps (sorted by offset). */
static ks_err gguf__check_data(gguf_file *f, gguf__rd *r) {
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        char q[128];
        gguf__quote(q, sizeof q, t->name, strlen(t->name));
        snprintf(r->ctx, sizeof r->ctx, "tensor '%s'", q);
        uint64_t start, end;
        if (!ks_add_ok(f->data_offset, t->offset, &start) || !ks_add_ok(start, t->n_bytes, &end))
            return gguf__fail(r, KS_ERR_FORMAT,
                              "data at offset %llu + %llu bytes extends past end of file (%llu "
                              "bytes)",
                              (unsigned long long)t->offset, (unsigned long long)t->n_bytes,
                              (unsigned long long)f->size);
        if (end > f->size)
            return gguf__fail(
                r, KS_ERR_FORMAT, "data [%llu, %llu) extends past end of file (%llu bytes)",
                (unsigned long long)start, (unsigned long long)end, (unsigned long long)f->size);
        t->data = f->base + start;
    }
    if (f->n_tensors < 2) return KS_OK;
    const gguf_tensor **order = malloc((size_t)f->n_tensors * sizeof *order);
    if (!order) return gguf__fail(r, KS_ERR_NOMEM, "no memory");
    for (uint64_t i = 0; i < f->n_tensors; i++)
        order[i] = &f->tensors[i];
    qsort(order, (size_t)f->n_tensors, sizeof *order, gguf__cmp_off);
    ks_err e = KS_OK;
    for (uint64_t i = 1; i < f->n_tensors && !e; i++) {
        const gguf_tensor *a = order[i - 1], *b = order[i];
        if (a->offset + a->n_bytes > b->offset) {
            char qa[128], qb[128];
            gguf__quote(qa, sizeof qa, a->name, strlen(a->name));
            gguf__quote(qb, sizeof qb, b->name, strlen(b->name));
            snprintf(r->ctx, sizeof r->ctx, "tensor '%s'", qb);
            e = gguf__fail(r, KS_ERR_FORMAT,
                           "data at offset %llu overlaps tensor '%s' [%llu, %llu)",
                           (unsigned long long)b->offset, qa, (unsigned long long)a->offset,
                           (unsigned long long)(a->offset + a->n_bytes));
        }
    }
    free(order);
    return e;
}

static ks_err gguf__hash_alloc(uint64_t n, uint64_t **tab, uint64_t *cap) {
    uint64_t c = 8;
    while (c < 2 * n)
        c <<= 1;
    *tab = calloc((size_t)c, sizeof **tab);
    *cap = c;
    return *tab ? KS_OK : KS_ERR_NOMEM;
}

static ks_err gguf__parse(gguf_file *f, ks_errbuf *eb) {
    gguf__rd r = {.b = f->base, .n = f->size, .pos = 0, .path = f->path, .eb = eb};
    snprintf(r.ctx, sizeof r.ctx, "header");
    uint32_t magic;
    ks_err e = gguf__u32(&r, &magic, "magic");
    if (e) return e;
    if (magic != GGUF_MAGIC)
        return gguf__fail(&r, KS_ERR_FORMAT, "bad magic 0x%08x (not a GGUF file)", magic);
    e = gguf__u32(&r, &f->version, "version");
    if (e) return e;
    if (f->version != 2 && f->version != 3) {
        if (f->version == 1)
            return gguf__fail(&r, KS_ERR_UNSUPPORTED, "unsupported GGUF version 1 (need 2 or 3)");
        if ((f->version & 0xffff) == 0)
            return gguf__fail(&r, KS_ERR_UNSUPPORTED,
                              "unsupported GGUF version %u (big-endian file?)", f->version);
        return gguf__fail(&r, KS_ERR_UNSUPPORTED, "unsupported GGUF version %u (need 2 or 3)",
                          f->version);
    }
    e = gguf__u64(&r, &f->n_tensors, "tensor count");
    if (!e) e = gguf__u64(&r, &f->n_kv, "metadata count");
    if (e) return e;
    // Smallest possible entries: kv = 8+1 key, 4 type, 1 value; tensor =
    // 8+1 name, 4 n_dims, 8 dim, 4 type, 8 offset.
    uint64_t left = r.n - r.pos;
    if (f->n_kv > left / 14)
        return gguf__fail(&r, KS_ERR_FORMAT,
                          "metadata count %llu cannot fit in the %llu bytes left",
                          (unsigned long long)f->n_kv, (unsigned long long)left);
    if (f->n_tensors > left / 33)
        return gguf__fail(&r, KS_ERR_FORMAT, "tensor count %llu cannot fit in the %llu bytes left",
                          (unsigned long long)f->n_tensors, (unsigned long long)left);
    f->kv = calloc(f->n_kv ? (size_t)f->n_kv : 1, sizeof *f->kv);
    f->tensors = calloc(f->n_tensors ? (size_t)f->n_tensors : 1, sizeof *f->tensors);
    if (!f->kv || !f->tensors || gguf__hash_alloc(f->n_kv, &f->kv_hash, &f->kv_hash_cap) ||
        gguf__hash_alloc(f->n_tensors, &f->t_hash, &f->t_hash_cap))
        return gguf__fail(&r, KS_ERR_NOMEM, "no memory for %llu keys and %llu tensors",
                          (unsigned long long)f->n_kv, (unsigned long long)f->n_tensors);
    e = gguf__parse_kv(f, &r);
    if (e) return e;

    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_value *al = gguf_get(f, "general.alignment");
    if (al) {
        snprintf(r.ctx, sizeof r.ctx, "key 'general.alignment'");
        if (al->type != GGUF_TYPE_UINT32)
            return gguf__fail(&r, KS_ERR_FORMAT, "type is %s, must be uint32",
                              gguf_type_name(al->type));
        if (al->v.u64 == 0 || (al->v.u64 & (al->v.u64 - 1)))
            return gguf__fail(&r, KS_ERR_FORMAT, "alignment %llu is not a nonzero power of two",
                              (unsigned long long)al->v.u64);
        f->alignment = al->v.u64;
    }
    e = gguf__parse_tensors(f, &r);
    if (e) return e;
    uint64_t pad = (f->alignment - r.pos % f->alignment) % f->alignment;
    f->data_offset = r.pos + pad; // r.pos <= size < 2^63: no overflow
    return gguf__check_data(f, &r);
}

// ----------------------------------------------------------------------------
// Open / close

static ks_err gguf__open_common(gguf_file *f, gguf_file **out, ks_errbuf *eb) {
    ks_err e = gguf__parse(f, eb);
    if (e) {
        gguf_close(f);
        return e;
    }
    *out = f;
    return KS_OK;
}

ks_err gguf_open_mem(const void *buf, size_t n, const char *name, gguf_file **out, ks_errbuf *eb) {
    *out = NULL;
    gguf_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(name ? name : "(memory)"))) {
        free(f);
        return ks_seterr(eb, KS_ERR_NOMEM, "%s: no memory", name ? name : "(memory)");
    }
    f->base = buf;
    f->size = n;
    return gguf__open_common(f, out, eb);
}

ks_err gguf_open(const char *path, gguf_file **out, ks_errbuf *eb) {
    *out = NULL;
    int fd;
    do
        fd = open(path, O_RDONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) return ks_seterr(eb, KS_ERR_IO, "%s: open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return ks_seterr(eb, KS_ERR_IO, "%s: stat: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ks_seterr(eb, KS_ERR_IO, "%s: not a regular file", path);
    }
    gguf_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        close(fd);
        return ks_seterr(eb, KS_ERR_NOMEM, "%s: no memory", path);
    }
    f->size = (uint64_t)st.st_size;
    static const uint8_t empty[1];
    f->base = empty;
    if (f->size > 0) {
        void *m = mmap(NULL, (size_t)f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int err = errno;
            close(fd);
            free(f->path);
            free(f);
            return ks_seterr(eb, KS_ERR_IO, "%s: mmap: %s", path, strerror(err));
        }
        f->map = m;
        f->base = m;
    }
    close(fd);
    return gguf__open_common(f, out, eb);
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    if (f->kv) {
        for (uint64_t i = 0; i < f->n_kv; i++) {
            free((char *)f->kv[i].key);
            gguf__free_value(&f->kv[i].value);
        }
    }
    if (f->tensors)
        for (uint64_t i = 0; i < f->n_tensors; i++)
            free((char *)f->tensors[i].name);
    free(f->kv);
    free(f->tensors);
    free(f->kv_hash);
    free(f->t_hash);
    if (f->map) munmap(f->map, (size_t)f->size);
    free(f->path);
    free(f);
}

/* Calls madvise(advice) on the pages of [p, p + n) inside f's mapping:
 * whole pages only (inner), else every page touching it. A hint: failure is
 * harmless. */
static void gguf__advise(const gguf_file *f, const void *p, size_t n, int advice, bool inner) {
    const uintptr_t base = (uintptr_t)f->map, a = (uintptr_t)p,
                    pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    if (!f->map || a < base || n > f->size || a - base > f->size - n) return;
    uintptr_t lo = inner ? (a + pg - 1) / pg * pg : a / pg * pg,
              hi = inner ? (a + n) / pg * pg : (a + n + pg - 1) / pg * pg;
    if (hi > lo) (void)madvise((void *)lo, hi - lo, advice);
}

void gguf_advise_unneeded(const gguf_file *f, const void *p, size_t n) {
    gguf__advise(f, p, n, MADV_DONTNEED, true);
}

void gguf_advise_resident(const gguf_file *f, const void *p, size_t n) {
#ifdef MADV_POPULATE_READ
    gguf__advise(f, p, n, MADV_POPULATE_READ, false);
#else
    (void)f, (void)p, (void)n;
#endif
}

// ----------------------------------------------------------------------------
// Accessors

const char *gguf_path(const gguf_file *f) { return f->path; }
uint32_t gguf_version(const gguf_file *f) { return f->version; }
uint64_t gguf_alignment(const gguf_file *f) { return f->alignment; }
uint64_t gguf_data_offset(const gguf_file *f) { return f->data_offset; }
uint64_t gguf_file_size(const gguf_file *f) { return f->size; }
uint64_t gguf_n_kv(const gguf_file *f) { return f->n_kv; }
uint64_t gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }

const gguf_kv *gguf_kv_at(const gguf_file *f, uint64_t i) {
    KS_ASSERT(i < f->n_kv);
    return &f->kv[i];
}

const gguf_tensor *gguf_tensor_at(const gguf_file *f, uint64_t i) {
    KS_ASSERT(i < f->n_tensors);
    return &f->tensors[i];
}

const gguf_value *gguf_get(const gguf_file *f, const char *key) {
    uint64_t h = gguf__hash(key, strlen(key)) & (f->kv_hash_cap - 1);
    while (f->kv_hash[h]) {
        const gguf_kv *kv = &f->kv[f->kv_hash[h] - 1];
        if (kv->key && !strcmp(kv->key, key)) return &kv->value;
        h = (h + 1) & (f->kv_hash_cap - 1);
    }
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    uint64_t h = gguf__hash(name, strlen(name)) & (f->t_hash_cap - 1);
    while (f->t_hash[h]) {
        const gguf_tensor *t = &f->tensors[f->t_hash[h] - 1];
        if (t->name && !strcmp(t->name, name)) return t;
        h = (h + 1) & (f->t_hash_cap - 1);
    }
    return NULL;
}

const char *gguf_type_name(uint32_t t) {
    static const char *names[GGUF_TYPE__COUNT] = {
        "uint8", "int8",   "uint16", "int16",  "uint32", "int32",   "float32",
        "bool",  "string", "array",  "uint64", "int64",  "float64",
    };
    return t < GGUF_TYPE__COUNT ? names[t] : "?";
}

// ----------------------------------------------------------------------------
// Typed getters

static bool gguf__is_uint(gguf_type t) {
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 ||
           t == GGUF_TYPE_UINT64;
}
static bool gguf__is_sint(gguf_type t) {
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 ||
           t == GGUF_TYPE_INT64;
}

static ks_err gguf__lookup(const gguf_file *f, const char *key, const gguf_value **v,
                           ks_errbuf *eb) {
    *v = gguf_get(f, key);
    if (!*v) return ks_seterr(eb, KS_ERR_FORMAT, "%s: key '%s' not found", f->path, key);
    return KS_OK;
}

static ks_err gguf__wrong_type(const gguf_file *f, const char *key, const gguf_value *v,
                               const char *want, ks_errbuf *eb) {
    return ks_seterr(eb, KS_ERR_FORMAT, "%s: key '%s' has type %s, expected %s", f->path, key,
                     gguf_type_name(v->type), want);
}

/* Integer value as (negative?, magnitude) checked against [lo, hi]. */
static ks_err gguf__get_int(const gguf_file *f, const char *key, int64_t lo, uint64_t hi, bool *neg,
                            uint64_t *mag, ks_errbuf *eb) {
    const gguf_value *v;
    ks_err e = gguf__lookup(f, key, &v, eb);
    if (e) return e;
    if (gguf__is_uint(v->type)) {
        *neg = false;
        *mag = v->v.u64;
        if (*mag > hi) goto range;
        return KS_OK;
    }
    if (gguf__is_sint(v->type)) {
        *neg = v->v.i64 < 0;
        *mag = *neg ? (uint64_t)0 - (uint64_t)v->v.i64 : (uint64_t)v->v.i64;
        if (*neg ? v->v.i64 < lo : *mag > hi) goto range;
        return KS_OK;
    }
    return gguf__wrong_type(f, key, v, "an integer", eb);
range:
    if (gguf__is_sint(v->type))
        return ks_seterr(eb, KS_ERR_FORMAT, "%s: key '%s': value %lld out of range", f->path, key,
                         (long long)v->v.i64);
    return ks_seterr(eb, KS_ERR_FORMAT, "%s: key '%s': value %llu out of range", f->path, key,
                     (unsigned long long)v->v.u64);
}

ks_err gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, ks_errbuf *eb) {
    bool neg;
    uint64_t m;
    ks_err e = gguf__get_int(f, key, 0, UINT32_MAX, &neg, &m, eb);
    if (!e) *out = (uint32_t)m;
    return e;
}

ks_err gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, ks_errbuf *eb) {
    bool neg;
    uint64_t m;
    ks_err e = gguf__get_int(f, key, 0, UINT64_MAX, &neg, &m, eb);
    if (!e) *out = m;
    return e;
}

ks_err gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, ks_errbuf *eb) {
    bool neg;
    uint64_t m;
    ks_err e = gguf__get_int(f, key, INT64_MIN, INT64_MAX, &neg, &m, eb);
    if (!e) *out = neg ? (int64_t)(0 - m) : (int64_t)m;
    return e;
}

ks_err gguf_get_f32(const gguf_file *f, const char *key, float *out, ks_errbuf *eb) {
    const gguf_value *v;
    ks_err e = gguf__lookup(f, key, &v, eb);
    if (e) return e;
    if (v->type != GGUF_TYPE_FLOAT32 && v->type != GGUF_TYPE_FLOAT64)
        return gguf__wrong_type(f, key, v, "float32 or float64", eb);
    *out = (float)v->v.f64;
    return KS_OK;
}

ks_err gguf_get_bool(const gguf_file *f, const char *key, bool *out, ks_errbuf *eb) {
    const gguf_value *v;
    ks_err e = gguf__lookup(f, key, &v, eb);
    if (e) return e;
    if (v->type != GGUF_TYPE_BOOL) return gguf__wrong_type(f, key, v, "bool", eb);
    *out = v->v.u64 != 0;
    return KS_OK;
}

ks_err gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, ks_errbuf *eb) {
    const gguf_value *v;
    ks_err e = gguf__lookup(f, key, &v, eb);
    if (e) return e;
    if (v->type != GGUF_TYPE_STRING) return gguf__wrong_type(f, key, v, "string", eb);
    *out = v->v.str;
    return KS_OK;
}

ks_err gguf_get_arr(const gguf_file *f, const char *key, gguf_type elem_type,
                    const gguf_value **out, ks_errbuf *eb) {
    const gguf_value *v;
    ks_err e = gguf__lookup(f, key, &v, eb);
    if (e) return e;
    if (v->type != GGUF_TYPE_ARRAY || v->v.arr.elem_type != elem_type) {
        if (v->type == GGUF_TYPE_ARRAY)
            return ks_seterr(eb, KS_ERR_FORMAT, "%s: key '%s' is an array of %s, expected %s",
                             f->path, key, gguf_type_name(v->v.arr.elem_type),
                             gguf_type_name(elem_type));
        return ks_seterr(eb, KS_ERR_FORMAT, "%s: key '%s' has type %s, expected an array of %s",
                         f->path, key, gguf_type_name(v->type), gguf_type_name(elem_type));
    }
    *out = v;
    return KS_OK;
}

double gguf_arr_f64(const gguf_value *arr, uint64_t i) {
    KS_ASSERT(arr->type == GGUF_TYPE_ARRAY && i < arr->v.arr.n);
    uint32_t et = arr->v.arr.elem_type, sz = gguf__type_size(et);
    KS_ASSERT(sz != 0);
    gguf_value v;
    gguf__decode_scalar(et, (const uint8_t *)arr->v.arr.raw + i * sz, &v);
    if (et == GGUF_TYPE_FLOAT32 || et == GGUF_TYPE_FLOAT64) return v.v.f64;
    return gguf__is_sint(et) ? (double)v.v.i64 : (double)v.v.u64;
}

int64_t gguf_arr_i64(const gguf_value *arr, uint64_t i) {
    KS_ASSERT(arr->type == GGUF_TYPE_ARRAY && i < arr->v.arr.n);
    uint32_t et = arr->v.arr.elem_type, sz = gguf__type_size(et);
    KS_ASSERT(sz != 0 && et != GGUF_TYPE_FLOAT32 && et != GGUF_TYPE_FLOAT64);
    gguf_value v;
    gguf__decode_scalar(et, (const uint8_t *)arr->v.arr.raw + i * sz, &v);
    return gguf__is_sint(et) ? v.v.i64 : (int64_t)v.v.u64;
}
