/* test_gguf.c — GGUF reader/writer tests: writer->reader round trip of every
 * value type (nested arrays included) and tensor data, a hand-built v2 file,
 * one test per malformed-input rule (error code AND message), truncation at
 * every prefix, random corruption (run under ASan), the residency hints,
 * and the real files in ../shared (skipped when absent). */
#include "kvseal/gguf.h"

#include "../check.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// Byte builder for hand-made files

typedef struct {
    uint8_t *p;
    size_t n, cap;
} bb;

static void bb_put(bb *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        CHECK(b->p);
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void bb_u8(bb *b, uint8_t v) { bb_put(b, &v, 1); }
static void bb_u32(bb *b, uint32_t v) {
    for (int i = 0; i < 4; i++)
        bb_u8(b, (uint8_t)(v >> (8 * i)));
}
static void bb_u64(bb *b, uint64_t v) {
    for (int i = 0; i < 8; i++)
        bb_u8(b, (uint8_t)(v >> (8 * i)));
}
static void bb_str(bb *b, const char *s) {
    bb_u64(b, strlen(s));
    bb_put(b, s, strlen(s));
}
static void bb_pad(bb *b, size_t align) {
    while (b->n % align)
        bb_u8(b, 0);
}
static void bb_zeros(bb *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        bb_u8(b, 0);
}
static void bb_hdr(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b->n = 0;
    bb_u32(b, GGUF_MAGIC);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}
static void bb_kv_u32(bb *b, const char *key, uint32_t v) {
    bb_str(b, key);
    bb_u32(b, GGUF_TYPE_UINT32);
    bb_u32(b, v);
}
static void bb_tinfo(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                     uint64_t offset) {
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        bb_u64(b, ne[d]);
    bb_u32(b, type);
    bb_u64(b, offset);
}

static uint8_t *open_copy; /* buffer behind the last file open_bytes handed out */

/* Opens a copy of b in an exact-size heap block (so ASan sees any over-read). */
static ks_err open_bytes(const uint8_t *p, size_t n, ks_errbuf *eb, gguf_file **out) {
    uint8_t *c = malloc(n ? n : 1);
    CHECK(c);
    if (n) memcpy(c, p, n);
    gguf_file *f = NULL;
    ks_errbuf_clear(eb);
    ks_err e = gguf_open_mem(c, n, "t.gguf", &f, eb);
    if (e) {
        CHECK(f == NULL);
        CHECK_EQ(eb->code, e);
        CHECK(strncmp(eb->msg, "t.gguf: ", 8) == 0); // every message names the file
    }
    if (out && !e) {
        *out = f; // caller closes f, then frees open_copy
        open_copy = c;
        return e;
    }
    gguf_close(f);
    free(c);
    return e;
}

static void expect_err(const bb *b, ks_err code, const char *s1, const char *s2) {
    ks_errbuf eb;
    ks_err e = open_bytes(b->p, b->n, &eb, NULL);
    if (e != code) fprintf(stderr, "got %s: %s\n", ks_err_name(e), eb.msg);
    CHECK_EQ(e, code);
    CHECK_STR_HAS(eb.msg, s1);
    if (s2) CHECK_STR_HAS(eb.msg, s2);
}

/* A one-tensor file: header, optional kvs already counted by the caller. */
static void one_tensor(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                       uint64_t offset, size_t data_bytes) {
    bb_hdr(b, 3, 1, 0);
    bb_tinfo(b, name, n_dims, ne, type, offset);
    bb_pad(b, 32);
    bb_zeros(b, data_bytes);
}

static char tmpdir[256];

static void make_tmpdir(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_gguf.XXXXXX");
    CHECK(mkdtemp(tmpdir));
}

static void rm_tmpdir(void) {
    DIR *d = opendir(tmpdir);
    CHECK(d);
    struct dirent *de;
    char p[512];
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", tmpdir, de->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(tmpdir);
}

static int count_dir_entries(void) {
    DIR *d = opendir(tmpdir);
    CHECK(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    CHECK(fp);
    fseek(fp, 0, SEEK_END);
    long sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)sz + 1);
    CHECK(p);
    CHECK_EQ(fread(p, 1, (size_t)sz, fp), sz);
    fclose(fp);
    *n = (size_t)sz;
    return p;
}

// ----------------------------------------------------------------------------
// Value equality (deep)

static bool value_eq(const gguf_value *a, const gguf_value *b) {
    if (a->type != b->type) return false;
    switch (a->type) {
    case GGUF_TYPE_STRING:
        return a->v.str.len == b->v.str.len && !memcmp(a->v.str.ptr, b->v.str.ptr, a->v.str.len);
    case GGUF_TYPE_FLOAT32:
    case GGUF_TYPE_FLOAT64:
        return a->v.f64 == b->v.f64;
    case GGUF_TYPE_ARRAY: {
        if (a->v.arr.elem_type != b->v.arr.elem_type || a->v.arr.n != b->v.arr.n) return false;
        uint32_t et = a->v.arr.elem_type;
        if (et == GGUF_TYPE_STRING || et == GGUF_TYPE_ARRAY) {
            for (uint64_t i = 0; i < a->v.arr.n; i++)
                if (!value_eq(&a->v.arr.items[i], &b->v.arr.items[i])) return false;
            return true;
        }
        for (uint64_t i = 0; i < a->v.arr.n; i++) {
            if (et == GGUF_TYPE_FLOAT32 || et == GGUF_TYPE_FLOAT64) {
                if (gguf_arr_f64(a, i) != gguf_arr_f64(b, i)) return false;
            } else if (gguf_arr_i64(a, i) != gguf_arr_i64(b, i)) {
                return false;
            }
        }
        return true;
    }
    default:
        return a->v.u64 == b->v.u64;
    }
}

// ----------------------------------------------------------------------------
// Round trip

static uint64_t rng_state = 0x1234567;
static uint64_t rnd(void) { // splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct {
    const char *name;
    uint32_t n_dims;
    int64_t ne[4];
    ks_dtype type;
    uint64_t n_bytes;
    uint8_t *data;
} tspec;

static tspec tensors[] = {
    {"a.f32", 2, {3, 5, 1, 1}, KS_DTYPE_F32, 60, NULL},
    {"b.f16", 1, {7, 1, 1, 1}, KS_DTYPE_F16, 14, NULL},
    {"c.q8_0", 2, {64, 2, 1, 1}, KS_DTYPE_Q8_0, 4 * 34, NULL},
    {"d.q4_k", 2, {256, 1, 1, 1}, KS_DTYPE_Q4_K, 144, NULL},
    {"e.i8", 4, {1, 1, 1, 3}, KS_DTYPE_I8, 3, NULL},
};
#define N_TENSORS (sizeof tensors / sizeof tensors[0])
static uint8_t fill_data[40]; // streamed tensor "f.fill", F32 [10]

static ks_err fill_cb(void *ctx, const char *name, gguf_sink *s, ks_errbuf *eb) {
    (void)eb;
    CHECK_STR_EQ(name, "f.fill");
    const uint8_t *p = ctx;
    ks_err e = gguf_sink_write(s, p, 7);
    if (!e) e = gguf_sink_write(s, p + 7, 0);
    if (!e) e = gguf_sink_write(s, p + 7, 33);
    if (!e) CHECK_EQ(gguf_sink_write(s, p, 1), KS_ERR_INVAL); // over the size
    return e;
}

static ks_err short_fill_cb(void *ctx, const char *name, gguf_sink *s, ks_errbuf *eb) {
    (void)name;
    (void)eb;
    return gguf_sink_write(s, ctx, 3);
}

static ks_err failing_fill_cb(void *ctx, const char *name, gguf_sink *s, ks_errbuf *eb) {
    (void)ctx;
    (void)s;
    return ks_seterr(eb, KS_ERR_UNSUPPORTED, "cannot make %s", name);
}

/* Every value kind, in insertion order. */
static gguf_value nested_inner[3], nested_outer[2], deep_mid[1], deep_items[2];
static const char *str_arr[] = {"alpha", "", "gamma \xe2\x9c\x93"};

static void fill_writer(gguf_writer *w) {
    gguf_value v;
    CHECK_EQ(gguf_writer_set_u32(w, "t.replaced", 1), KS_OK);
    v = (gguf_value){.type = GGUF_TYPE_UINT8, .v.u64 = 200};
    CHECK_EQ(gguf_writer_set_value(w, "t.u8", &v), KS_OK);
    v = (gguf_value){.type = GGUF_TYPE_INT8, .v.i64 = -100};
    CHECK_EQ(gguf_writer_set_value(w, "t.i8", &v), KS_OK);
    v = (gguf_value){.type = GGUF_TYPE_UINT16, .v.u64 = 60000};
    CHECK_EQ(gguf_writer_set_value(w, "t.u16", &v), KS_OK);
    v = (gguf_value){.type = GGUF_TYPE_INT16, .v.i64 = -30000};
    CHECK_EQ(gguf_writer_set_value(w, "t.i16", &v), KS_OK);
    CHECK_EQ(gguf_writer_set_u32(w, "t.u32", 4000000000u), KS_OK);
    CHECK_EQ(gguf_writer_set_i32(w, "t.i32", -2000000000), KS_OK);
    CHECK_EQ(gguf_writer_set_f32(w, "t.f32", 1.5f), KS_OK);
    CHECK_EQ(gguf_writer_set_bool(w, "t.bool", true), KS_OK);
    CHECK_EQ(gguf_writer_set_str(w, "t.str", "h\xc3\xa9llo"), KS_OK);
    CHECK_EQ(gguf_writer_set_u64(w, "t.u64", (1ull << 63) + 5), KS_OK);
    v = (gguf_value){.type = GGUF_TYPE_INT64, .v.i64 = -(1ll << 62)};
    CHECK_EQ(gguf_writer_set_value(w, "t.i64", &v), KS_OK);
    v = (gguf_value){.type = GGUF_TYPE_FLOAT64, .v.f64 = 3.141592653589793};
    CHECK_EQ(gguf_writer_set_value(w, "t.f64", &v), KS_OK);
    // numeric arrays of every fixed-size type
    static const uint8_t raw[64] = {1,  0,  1,  0,  1,  2,  3,  4,  5,  6,  7,    8,    9,    10,
                                    11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 0x80, 0xff, 0x7f, 0x3f};
    for (uint32_t t = 0; t < GGUF_TYPE__COUNT; t++) {
        if (t == GGUF_TYPE_STRING || t == GGUF_TYPE_ARRAY) continue;
        char key[64];
        snprintf(key, sizeof key, "arr.%s", gguf_type_name(t));
        CHECK_EQ(gguf_writer_set_arr(w, key, (gguf_type)t, raw, 3), KS_OK);
    }
    CHECK_EQ(gguf_writer_set_arr(w, "arr.empty", GGUF_TYPE_INT32, NULL, 0), KS_OK);
    CHECK_EQ(gguf_writer_set_arr_str(w, "arr.str", str_arr, 3), KS_OK);
    // nested: [[ "alpha","","gamma" ] as array of strings, [] ] and a 3-deep array
    static gguf_value strs[3];
    for (int i = 0; i < 3; i++)
        strs[i] = (gguf_value){.type = GGUF_TYPE_STRING,
                               .v.str = {.ptr = str_arr[i], .len = strlen(str_arr[i])}};
    nested_inner[0].type = GGUF_TYPE_ARRAY;
    nested_inner[0].v.arr.elem_type = GGUF_TYPE_STRING;
    nested_inner[0].v.arr.n = 3;
    nested_inner[0].v.arr.items = strs;
    nested_inner[1].type = GGUF_TYPE_ARRAY;
    nested_inner[1].v.arr.elem_type = GGUF_TYPE_INT32;
    nested_inner[1].v.arr.n = 2;
    nested_inner[1].v.arr.raw = raw + 4;
    nested_inner[2].type = GGUF_TYPE_ARRAY;
    nested_inner[2].v.arr.elem_type = GGUF_TYPE_FLOAT32;
    nested_inner[2].v.arr.n = 0;
    nested_outer[0].type = GGUF_TYPE_ARRAY;
    nested_outer[0].v.arr.elem_type = GGUF_TYPE_ARRAY;
    nested_outer[0].v.arr.n = 3;
    nested_outer[0].v.arr.items = nested_inner;
    CHECK_EQ(gguf_writer_set_value(w, "arr.nested", &nested_outer[0]), KS_OK);
    deep_items[0] = nested_outer[0];
    deep_items[1] = nested_inner[1]; // wrong elem type inside an ARRAY-of-ARRAY is fine
    deep_mid[0].type = GGUF_TYPE_ARRAY;
    deep_mid[0].v.arr.elem_type = GGUF_TYPE_ARRAY;
    deep_mid[0].v.arr.n = 2;
    deep_mid[0].v.arr.items = deep_items;
    CHECK_EQ(gguf_writer_set_value(w, "arr.deep", &deep_mid[0]), KS_OK);
    CHECK_EQ(gguf_writer_set_u32(w, "t.replaced", 77), KS_OK); // replaced in place
    CHECK_EQ(gguf_writer_set_alignment(w, 64), KS_OK);
    // tensors
    for (size_t i = 0; i < N_TENSORS; i++) {
        tspec *t = &tensors[i];
        if (!t->data) {
            t->data = malloc(t->n_bytes);
            for (uint64_t k = 0; k < t->n_bytes; k++)
                t->data[k] = (uint8_t)rnd();
        }
        CHECK_EQ(gguf_writer_add_tensor(w, t->name, t->n_dims, t->ne, t->type, t->data, t->n_bytes),
                 KS_OK);
    }
    for (size_t k = 0; k < sizeof fill_data; k++)
        fill_data[k] = (uint8_t)(k * 7 + 1);
    int64_t ne_fill[1] = {10};
    CHECK_EQ(gguf_writer_add_tensor_fill(w, "f.fill", 1, ne_fill, KS_DTYPE_F32, fill_cb, fill_data),
             KS_OK);
}

static void check_roundtrip_file(const gguf_file *f) {
    CHECK_EQ(gguf_version(f), 3);
    CHECK_EQ(gguf_alignment(f), 64);
    CHECK_EQ(gguf_data_offset(f) % 64, 0);
    // order: t.replaced first (kept in place), then the rest as inserted
    CHECK_STR_EQ(gguf_kv_at(f, 0)->key, "t.replaced");
    CHECK_STR_EQ(gguf_kv_at(f, 1)->key, "t.u8");
    CHECK_STR_EQ(gguf_kv_at(f, gguf_n_kv(f) - 1)->key, "general.alignment");
    ks_errbuf eb;
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f32;
    bool b;
    gguf_str s;
    CHECK_EQ(gguf_get_u32(f, "t.replaced", &u32, &eb), KS_OK);
    CHECK_EQ(u32, 77);
    CHECK_EQ(gguf_get(f, "t.u8")->v.u64, 200);
    CHECK_EQ(gguf_get(f, "t.u8")->type, GGUF_TYPE_UINT8);
    CHECK_EQ(gguf_get(f, "t.i8")->v.i64, -100);
    CHECK_EQ(gguf_get(f, "t.u16")->v.u64, 60000);
    CHECK_EQ(gguf_get(f, "t.i16")->v.i64, -30000);
    CHECK_EQ(gguf_get_u32(f, "t.u32", &u32, &eb), KS_OK);
    CHECK_EQ(u32, 4000000000u);
    CHECK_EQ(gguf_get_i64(f, "t.i32", &i64, &eb), KS_OK);
    CHECK_EQ(i64, -2000000000);
    CHECK_EQ(gguf_get_f32(f, "t.f32", &f32, &eb), KS_OK);
    CHECK(f32 == 1.5f);
    CHECK_EQ(gguf_get_bool(f, "t.bool", &b, &eb), KS_OK);
    CHECK(b);
    CHECK_EQ(gguf_get_str(f, "t.str", &s, &eb), KS_OK);
    CHECK_EQ(s.len, 6);
    CHECK(!memcmp(s.ptr, "h\xc3\xa9llo", 6));
    CHECK_EQ(gguf_get_u64(f, "t.u64", &u64, &eb), KS_OK);
    CHECK(u64 == (1ull << 63) + 5);
    CHECK_EQ(gguf_get_i64(f, "t.i64", &i64, &eb), KS_OK);
    CHECK_EQ(i64, -(1ll << 62));
    CHECK(gguf_get(f, "t.f64")->v.f64 == 3.141592653589793);
    CHECK_EQ(gguf_get(f, "t.f64")->type, GGUF_TYPE_FLOAT64);
    // numeric arrays
    const gguf_value *a;
    CHECK_EQ(gguf_get_arr(f, "arr.uint16", GGUF_TYPE_UINT16, &a, &eb), KS_OK);
    CHECK_EQ(a->v.arr.n, 3);
    CHECK_EQ(gguf_arr_i64(a, 0), 1);
    CHECK_EQ(gguf_arr_i64(a, 2), 1 | (2 << 8));
    CHECK_EQ(gguf_get_arr(f, "arr.int8", GGUF_TYPE_INT8, &a, &eb), KS_OK);
    CHECK_EQ(gguf_arr_i64(a, 1), 0);
    CHECK_EQ(gguf_get_arr(f, "arr.bool", GGUF_TYPE_BOOL, &a, &eb), KS_OK);
    CHECK_EQ(gguf_arr_i64(a, 0), 1);
    CHECK_EQ(gguf_arr_i64(a, 1), 0);
    CHECK_EQ(gguf_get_arr(f, "arr.int64", GGUF_TYPE_INT64, &a, &eb), KS_OK);
    CHECK_EQ(gguf_arr_i64(a, 0), 0x0403020100010001ll);
    CHECK_EQ(gguf_get_arr(f, "arr.float32", GGUF_TYPE_FLOAT32, &a, &eb), KS_OK);
    float fx;
    static const uint8_t fb[4] = {1, 0, 1, 0};
    memcpy(&fx, fb, 4);
    CHECK(gguf_arr_f64(a, 0) == (double)fx);
    CHECK_EQ(gguf_get_arr(f, "arr.empty", GGUF_TYPE_INT32, &a, &eb), KS_OK);
    CHECK_EQ(a->v.arr.n, 0);
    CHECK_EQ(gguf_get_arr(f, "arr.str", GGUF_TYPE_STRING, &a, &eb), KS_OK);
    CHECK_EQ(a->v.arr.n, 3);
    CHECK_EQ(a->v.arr.items[1].v.str.len, 0);
    CHECK(!memcmp(a->v.arr.items[2].v.str.ptr, "gamma \xe2\x9c\x93", 9));
    // nested
    CHECK(value_eq(gguf_get(f, "arr.nested"), &nested_outer[0]));
    CHECK(value_eq(gguf_get(f, "arr.deep"), &deep_mid[0]));
    CHECK_EQ(gguf_get_arr(f, "arr.deep", GGUF_TYPE_ARRAY, &a, &eb), KS_OK);
    CHECK_EQ(a->v.arr.items[0].v.arr.items[0].v.arr.items[2].v.str.len, 9);
    // tensors
    CHECK_EQ(gguf_n_tensors(f), N_TENSORS + 1);
    for (size_t i = 0; i < N_TENSORS; i++) {
        const tspec *ts = &tensors[i];
        const gguf_tensor *t = gguf_tensor_at(f, i);
        CHECK_STR_EQ(t->name, ts->name);
        CHECK(gguf_find_tensor(f, ts->name) == t);
        CHECK_EQ(t->n_dims, ts->n_dims);
        for (int d = 0; d < 4; d++)
            CHECK_EQ(t->ne[d], ts->ne[d]);
        CHECK_EQ(t->type, ts->type);
        CHECK_EQ(t->n_bytes, ts->n_bytes);
        CHECK_EQ(t->offset % 64, 0);
        CHECK_MEM_EQ(t->data, ts->data, ts->n_bytes);
    }
    const gguf_tensor *t = gguf_find_tensor(f, "f.fill");
    CHECK(t && t->n_bytes == 40 && t->n_elems == 10);
    CHECK_MEM_EQ(t->data, fill_data, 40);
    CHECK(gguf_find_tensor(f, "nope") == NULL);
    CHECK(gguf_get(f, "nope") == NULL);
}

static char rt_path[300];

static void test_roundtrip(void) {
    gguf_writer *w = gguf_writer_create();
    CHECK(w);
    fill_writer(w);
    snprintf(rt_path, sizeof rt_path, "%s/rt.gguf", tmpdir);
    ks_errbuf eb;
    ks_errbuf_clear(&eb);
    ks_err e = gguf_writer_write(w, rt_path, &eb);
    if (e) fprintf(stderr, "%s\n", eb.msg);
    CHECK_EQ(e, KS_OK);
    gguf_writer_destroy(w);
    CHECK_EQ(count_dir_entries(), 1); // no temporary left behind

    gguf_file *f;
    CHECK_EQ(gguf_open(rt_path, &f, &eb), KS_OK);
    check_roundtrip_file(f);

    // copy_kv of every key (nested arrays included) gives equal values
    gguf_writer *w2 = gguf_writer_create();
    for (uint64_t i = 0; i < gguf_n_kv(f); i++)
        CHECK_EQ(gguf_writer_copy_kv(w2, f, gguf_kv_at(f, i)->key), KS_OK);
    CHECK_EQ(gguf_writer_copy_kv(w2, f, "absent.key"), KS_ERR_INVAL);
    char p2[320];
    snprintf(p2, sizeof p2, "%s/copy.gguf", tmpdir);
    CHECK_EQ(gguf_writer_write(w2, p2, &eb), KS_OK);
    gguf_writer_destroy(w2);
    gguf_file *g;
    CHECK_EQ(gguf_open(p2, &g, &eb), KS_OK);
    CHECK_EQ(gguf_n_kv(g), gguf_n_kv(f));
    CHECK_EQ(gguf_alignment(g), 64);
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) {
        CHECK_STR_EQ(gguf_kv_at(g, i)->key, gguf_kv_at(f, i)->key);
        CHECK(value_eq(&gguf_kv_at(g, i)->value, &gguf_kv_at(f, i)->value));
    }
    gguf_close(g);

    // determinism: the same writer input gives the same bytes
    gguf_writer *w3 = gguf_writer_create();
    fill_writer(w3);
    char p3[320];
    snprintf(p3, sizeof p3, "%s/rt2.gguf", tmpdir);
    CHECK_EQ(gguf_writer_write(w3, p3, &eb), KS_OK);
    gguf_writer_destroy(w3);
    size_t n1, n3;
    uint8_t *b1 = read_all(rt_path, &n1), *b3 = read_all(p3, &n3);
    CHECK_EQ(n1, n3);
    CHECK_MEM_EQ(b1, b3, n1);
    CHECK_EQ(n1 % 64, 0);
    free(b1);
    free(b3);
    unlink(p3);
    unlink(p2);

    // the printer shows keys, types, nested arrays and the tensor table
    char *out = NULL;
    size_t out_n = 0;
    FILE *mf = open_memstream(&out, &out_n);
    gguf_print(f, mf);
    fclose(mf);
    CHECK_STR_HAS(out, "version:     3");
    CHECK_STR_HAS(out, "alignment:   64");
    CHECK_STR_HAS(out, "t.i8");
    CHECK_STR_HAS(out, "-100");
    CHECK_STR_HAS(out, "array[string; 3]");
    CHECK_STR_HAS(out, "\"h\xc3\xa9llo\"");
    CHECK_STR_HAS(out, "array[array; 3]");
    CHECK_STR_HAS(out, "[array[string; 3] [\"alpha\", \"\", \"gamma");
    CHECK_STR_HAS(out, "c.q8_0");
    CHECK_STR_HAS(out, "Q8_0");
    CHECK_STR_HAS(out, "[64, 2]");
    CHECK_STR_HAS(out, "[1, 1, 1, 3]");
    free(out);
    gguf_close(f);
}

static void test_getter_errors(void) {
    gguf_file *f;
    ks_errbuf eb;
    CHECK_EQ(gguf_open(rt_path, &f, &eb), KS_OK);
    uint32_t u32;
    int64_t i64;
    float f32;
    bool b;
    gguf_str s;
    const gguf_value *a;
    CHECK_EQ(gguf_get_u32(f, "missing.key", &u32, &eb), KS_ERR_FORMAT);
    CHECK_STR_HAS(eb.msg, "rt.gguf: key 'missing.key' not found");
    CHECK_EQ(gguf_get_u32(f, "t.i32", &u32, &eb), KS_ERR_FORMAT); // negative
    CHECK_STR_HAS(eb.msg, "key 't.i32'");
    CHECK_STR_HAS(eb.msg, "out of range");
    CHECK_EQ(gguf_get_u32(f, "t.u64", &u32, &eb), KS_ERR_FORMAT); // too big
    CHECK_STR_HAS(eb.msg, "out of range");
    CHECK_EQ(gguf_get_i64(f, "t.u64", &i64, &eb), KS_ERR_FORMAT); // > INT64_MAX
    CHECK_EQ(gguf_get_u32(f, "t.u16", &u32, &eb), KS_OK);
    CHECK_EQ(u32, 60000);
    CHECK_EQ(gguf_get_u32(f, "t.str", &u32, &eb), KS_ERR_FORMAT);
    CHECK_STR_HAS(eb.msg, "key 't.str' has type string, expected an integer");
    CHECK_EQ(gguf_get_f32(f, "t.u32", &f32, &eb), KS_ERR_FORMAT);
    CHECK_STR_HAS(eb.msg, "expected float32 or float64");
    CHECK_EQ(gguf_get_f32(f, "t.f64", &f32, &eb), KS_OK);
    CHECK_NEAR(f32, 3.14159274f, 0);
    CHECK_EQ(gguf_get_bool(f, "t.u8", &b, &eb), KS_ERR_FORMAT);
    CHECK_EQ(gguf_get_str(f, "t.bool", &s, &eb), KS_ERR_FORMAT);
    CHECK_EQ(gguf_get_arr(f, "arr.str", GGUF_TYPE_INT32, &a, &eb), KS_ERR_FORMAT);
    CHECK_STR_HAS(eb.msg, "key 'arr.str' is an array of string, expected int32");
    CHECK_EQ(gguf_get_arr(f, "t.u8", GGUF_TYPE_INT32, &a, &eb), KS_ERR_FORMAT);
    CHECK_STR_HAS(eb.msg, "expected an array of int32");
    gguf_close(f);
}

static void test_writer_errors(void) {
    gguf_writer *w = gguf_writer_create();
    float data[8] = {0};
    int64_t ne[2] = {4, 2}, ne_bad[2] = {0, 2}, ne_q[1] = {33};
    CHECK_EQ(gguf_writer_add_tensor(w, "x", 2, ne, KS_DTYPE_F32, data, 31), KS_ERR_INVAL);
    CHECK_EQ(gguf_writer_add_tensor(w, "x", 2, ne_bad, KS_DTYPE_F32, data, 0), KS_ERR_INVAL);
    CHECK_EQ(gguf_writer_add_tensor(w, "x", 0, ne, KS_DTYPE_F32, data, 32), KS_ERR_INVAL);
    CHECK_EQ(gguf_writer_add_tensor(w, "x", 1, ne_q, KS_DTYPE_Q8_0, data, 34), KS_ERR_INVAL);
    CHECK_EQ(gguf_writer_add_tensor(w, "x", 2, ne, (ks_dtype)4, data, 32), KS_ERR_INVAL);
    CHECK_EQ(gguf_writer_add_tensor(w, "", 2, ne, KS_DTYPE_F32, data, 32), KS_ERR_INVAL);
    CHECK_EQ(gguf_writer_add_tensor(w, "x", 2, ne, KS_DTYPE_F32, data, 32), KS_OK);
    CHECK_EQ(gguf_writer_add_tensor(w, "x", 2, ne, KS_DTYPE_F32, data, 32), KS_ERR_INVAL);
    CHECK_EQ(gguf_writer_set_alignment(w, 3), KS_ERR_INVAL);
    CHECK_EQ(gguf_writer_set_alignment(w, 0), KS_ERR_INVAL);
    CHECK_EQ(gguf_writer_set_u64(w, "general.alignment", 64), KS_ERR_INVAL);
    CHECK_EQ(gguf_writer_set_u32(w, "", 1), KS_ERR_INVAL);
    gguf_value bad_bool = {.type = GGUF_TYPE_BOOL, .v.u64 = 2};
    CHECK_EQ(gguf_writer_set_value(w, "b", &bad_bool), KS_ERR_INVAL);
    gguf_value bad_type = {.type = (gguf_type)13};
    CHECK_EQ(gguf_writer_set_value(w, "b", &bad_type), KS_ERR_INVAL);

    // a fill that writes too little, or fails, leaves no file and no temporary
    int before = count_dir_entries();
    int64_t ne1[1] = {4};
    CHECK_EQ(gguf_writer_add_tensor_fill(w, "short", 1, ne1, KS_DTYPE_F32, short_fill_cb, data),
             KS_OK);
    char p[320];
    snprintf(p, sizeof p, "%s/never.gguf", tmpdir);
    ks_errbuf eb;
    CHECK(gguf_writer_write(w, p, &eb) != KS_OK);
    CHECK_STR_HAS(eb.msg, "tensor 'short'");
    CHECK_STR_HAS(eb.msg, "fill wrote 3 of 16 bytes");
    CHECK_EQ(count_dir_entries(), before);
    gguf_writer_destroy(w);

    w = gguf_writer_create();
    CHECK_EQ(gguf_writer_add_tensor_fill(w, "boom", 1, ne1, KS_DTYPE_F32, failing_fill_cb, NULL),
             KS_OK);
    CHECK_EQ(gguf_writer_write(w, rt_path, &eb), KS_ERR_UNSUPPORTED); // rt.gguf is untouched
    CHECK_STR_HAS(eb.msg, "cannot make boom");
    CHECK_EQ(count_dir_entries(), before);
    gguf_file *f;
    CHECK_EQ(gguf_open(rt_path, &f, &eb), KS_OK);
    CHECK_EQ(gguf_n_tensors(f), N_TENSORS + 1);
    gguf_close(f);
    snprintf(p, sizeof p, "%s/no/such/dir/x.gguf", tmpdir);
    CHECK_EQ(gguf_writer_write(w, p, &eb), KS_ERR_IO);
    CHECK_STR_HAS(eb.msg, "No such file or directory");
    gguf_writer_destroy(w);
}

// ----------------------------------------------------------------------------
// Hand-built files

static void test_v2(void) {
    bb b = {0};
    uint64_t ne[2] = {4, 2};
    bb_hdr(&b, 2, 1, 2);
    bb_str(&b, "general.name");
    bb_u32(&b, GGUF_TYPE_STRING);
    bb_str(&b, "v2-file");
    bb_kv_u32(&b, "general.alignment", 16);
    bb_tinfo(&b, "w", 2, ne, KS_DTYPE_F32, 0);
    bb_pad(&b, 16);
    size_t data_at = b.n;
    for (int i = 0; i < 8; i++) {
        float x = (float)i * 0.5f;
        bb_put(&b, &x, 4);
    }
    gguf_file *f;
    ks_errbuf eb;
    CHECK_EQ(open_bytes(b.p, b.n, &eb, &f), KS_OK);
    CHECK_EQ(gguf_version(f), 2);
    CHECK_EQ(gguf_alignment(f), 16);
    CHECK_EQ(gguf_data_offset(f), data_at);
    gguf_str s;
    CHECK_EQ(gguf_get_str(f, "general.name", &s, &eb), KS_OK);
    CHECK(s.len == 7 && !memcmp(s.ptr, "v2-file", 7));
    const gguf_tensor *t = gguf_find_tensor(f, "w");
    CHECK(t);
    CHECK_EQ(t->n_elems, 8);
    const float *x = t->data;
    CHECK(x[7] == 3.5f);
    gguf_close(f);
    free(open_copy);
    free(b.p);
}

/* Hostile text (terminal escapes in keys, names and strings) is printed escaped. */
static void test_print_escapes(void) {
    bb b = {0};
    uint64_t ne[1] = {8};
    bb_hdr(&b, 3, 1, 2);
    bb_kv_u32(&b, "a\x1b[31mkey", 1);
    bb_str(&b, "s");
    bb_u32(&b, GGUF_TYPE_STRING);
    bb_str(&b, "x\x1b]0;title\x07\n\"q\"");
    bb_tinfo(&b, "t\x1b[2J", 1, ne, KS_DTYPE_F32, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 32);
    gguf_file *f;
    ks_errbuf eb;
    CHECK_EQ(open_bytes(b.p, b.n, &eb, &f), KS_OK);
    char *out = NULL;
    size_t out_n = 0;
    FILE *mf = open_memstream(&out, &out_n);
    gguf_print(f, mf);
    fclose(mf);
    CHECK(!strchr(out, 0x1b) && !strchr(out, 0x07));
    CHECK_STR_HAS(out, "a\\x1b[31mkey");
    CHECK_STR_HAS(out, "\"x\\x1b]0;title\\x07\\n\\\"q\\\"\"");
    CHECK_STR_HAS(out, "t\\x1b[2J");
    free(out);
    gguf_close(f);
    free(open_copy);
    free(b.p);
}

static void test_malformed(void) {
    bb b = {0};
    uint64_t ne2[2] = {4, 2};
    ks_errbuf eb;

    // empty and tiny files
    CHECK_EQ(open_bytes(NULL, 0, &eb, NULL), KS_ERR_FORMAT);
    CHECK_STR_HAS(eb.msg, "truncated: magic");
    // magic vs version: different codes
    bb_hdr(&b, 3, 0, 0);
    b.p[0] = 'X';
    expect_err(&b, KS_ERR_FORMAT, "header: bad magic", NULL);
    bb_hdr(&b, 1, 0, 0);
    expect_err(&b, KS_ERR_UNSUPPORTED, "version 1", NULL);
    bb_hdr(&b, 4, 0, 0);
    expect_err(&b, KS_ERR_UNSUPPORTED, "version 4", NULL);
    bb_hdr(&b, 0x03000000u, 0, 0);
    expect_err(&b, KS_ERR_UNSUPPORTED, "big-endian", NULL);
    // counts that cannot fit: checked before any allocation
    bb_hdr(&b, 3, 0, 1ull << 63);
    expect_err(&b, KS_ERR_FORMAT, "metadata count 9223372036854775808 cannot fit", NULL);
    bb_hdr(&b, 3, UINT64_MAX, 0);
    expect_err(&b, KS_ERR_FORMAT, "tensor count", "cannot fit");
    // key string length overflow
    bb_hdr(&b, 3, 0, 1);
    bb_u64(&b, UINT64_MAX);
    bb_zeros(&b, 16);
    expect_err(&b, KS_ERR_FORMAT, "key #0", "exceeds");
    // string value too long
    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "a.str");
    bb_u32(&b, GGUF_TYPE_STRING);
    bb_u64(&b, 1000);
    bb_zeros(&b, 10);
    expect_err(&b, KS_ERR_FORMAT, "key 'a.str'", "string length 1000");
    // numeric array count overflow (2^62 * 4 wraps)
    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "a.arr");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_UINT32);
    bb_u64(&b, 1ull << 62);
    bb_zeros(&b, 16);
    expect_err(&b, KS_ERR_FORMAT, "key 'a.arr'", "array of 4611686018427387904 uint32");
    // string array count too large for the bytes left
    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "a.strs");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_STRING);
    bb_u64(&b, 1ull << 61);
    bb_zeros(&b, 64);
    expect_err(&b, KS_ERR_FORMAT, "key 'a.strs'", "cannot fit");
    // nested array count too large
    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "a.nest");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u64(&b, 1000);
    bb_u32(&b, GGUF_TYPE_UINT8);
    bb_u64(&b, 0);
    expect_err(&b, KS_ERR_FORMAT, "key 'a.nest'", "array of 1000 array");
    // invalid value type, invalid array element type
    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "a.t");
    bb_u32(&b, 13);
    bb_zeros(&b, 8);
    expect_err(&b, KS_ERR_FORMAT, "key 'a.t'", "invalid value type 13");
    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "a.t");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, 99);
    bb_u64(&b, 0);
    expect_err(&b, KS_ERR_FORMAT, "key 'a.t'", "invalid array element type 99");
    // nested array with an invalid inner element type
    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "a.t");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u64(&b, 1);
    bb_u32(&b, 0xffffffffu);
    bb_u64(&b, 0);
    expect_err(&b, KS_ERR_FORMAT, "key 'a.t'", "invalid array element type 4294967295");
    // nesting too deep
    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "a.deep");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    for (int i = 0; i < 40; i++) {
        bb_u32(&b, GGUF_TYPE_ARRAY);
        bb_u64(&b, 1);
    }
    bb_zeros(&b, 16);
    expect_err(&b, KS_ERR_FORMAT, "key 'a.deep'", "nested deeper");
    // bool not 0/1: scalar and array
    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "a.bool");
    bb_u32(&b, GGUF_TYPE_BOOL);
    bb_u8(&b, 2);
    expect_err(&b, KS_ERR_FORMAT, "key 'a.bool'", "bool value is 2");
    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "a.bools");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_BOOL);
    bb_u64(&b, 3);
    bb_u8(&b, 1);
    bb_u8(&b, 0);
    bb_u8(&b, 0xff);
    expect_err(&b, KS_ERR_FORMAT, "key 'a.bools'", "element 2 is 255");
    // duplicate key, empty key, NUL in key
    bb_hdr(&b, 3, 0, 2);
    bb_kv_u32(&b, "a.dup", 1);
    bb_kv_u32(&b, "a.dup", 2);
    expect_err(&b, KS_ERR_FORMAT, "key 'a.dup'", "duplicate key");
    bb_hdr(&b, 3, 0, 1);
    bb_kv_u32(&b, "", 1);
    expect_err(&b, KS_ERR_FORMAT, "empty key", NULL);
    bb_hdr(&b, 3, 0, 1);
    bb_u64(&b, 3);
    bb_put(&b, "a\0b", 3);
    bb_u32(&b, GGUF_TYPE_UINT8);
    bb_u8(&b, 0);
    expect_err(&b, KS_ERR_FORMAT, "key 'a\\x00b'", "NUL");
    // alignment: wrong type, zero, not a power of two
    bb_hdr(&b, 3, 0, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, GGUF_TYPE_UINT64);
    bb_u64(&b, 32);
    expect_err(&b, KS_ERR_FORMAT, "key 'general.alignment'", "type is uint64, must be uint32");
    bb_hdr(&b, 3, 0, 1);
    bb_kv_u32(&b, "general.alignment", 0);
    expect_err(&b, KS_ERR_FORMAT, "key 'general.alignment'", "not a nonzero power of two");
    bb_hdr(&b, 3, 0, 1);
    bb_kv_u32(&b, "general.alignment", 48);
    expect_err(&b, KS_ERR_FORMAT, "alignment 48", "power of two");

    // tensors
    one_tensor(&b, "w", 0, ne2, KS_DTYPE_F32, 0, 32);
    expect_err(&b, KS_ERR_FORMAT, "tensor 'w'", "n_dims is 0");
    uint64_t ne5[5] = {1, 1, 1, 1, 1};
    one_tensor(&b, "w", 5, ne5, KS_DTYPE_F32, 0, 32);
    expect_err(&b, KS_ERR_FORMAT, "tensor 'w'", "n_dims is 5");
    uint64_t ne_zero[2] = {4, 0};
    one_tensor(&b, "w", 2, ne_zero, KS_DTYPE_F32, 0, 32);
    expect_err(&b, KS_ERR_FORMAT, "tensor 'w'", "dimension 1 is 0");
    uint64_t ne_neg[2] = {UINT64_MAX, 1};
    one_tensor(&b, "w", 2, ne_neg, KS_DTYPE_F32, 0, 32);
    expect_err(&b, KS_ERR_FORMAT, "tensor 'w'", "dimension 0 is -1");
    uint64_t ne_ovf[3] = {1ull << 32, 1ull << 32, 2};
    one_tensor(&b, "w", 3, ne_ovf, KS_DTYPE_F32, 0, 32);
    expect_err(&b, KS_ERR_FORMAT, "tensor 'w'", "element count overflows");
    uint64_t ne_big[2] = {1ull << 31, 1ull << 31}; // elements fit, F32 bytes do not... 2^64
    one_tensor(&b, "w", 2, ne_big, KS_DTYPE_F64, 0, 32);
    expect_err(&b, KS_ERR_FORMAT, "tensor 'w'", "data size overflows");
    uint64_t ne_q[2] = {33, 2};
    one_tensor(&b, "blk.0.attn_q.weight", 2, ne_q, KS_DTYPE_Q8_0, 0, 200);
    expect_err(&b, KS_ERR_FORMAT, "tensor 'blk.0.attn_q.weight'",
               "row of 33 elements is not a multiple of the Q8_0 block size 32");
    one_tensor(&b, "w", 2, ne2, 4, 0, 32); // retired Q4_2
    expect_err(&b, KS_ERR_UNSUPPORTED, "tensor 'w'", "unknown tensor type 4");
    one_tensor(&b, "w", 2, ne2, 1000, 0, 32);
    expect_err(&b, KS_ERR_UNSUPPORTED, "tensor 'w'", "unknown tensor type 1000");
    one_tensor(&b, "w", 2, ne2, KS_DTYPE_F32, 8, 64);
    expect_err(&b, KS_ERR_FORMAT, "tensor 'w'", "offset 8 is not a multiple of the alignment 32");
    one_tensor(&b, "blk.0.attn_q.weight", 2, ne2, KS_DTYPE_F32, 0, 31);
    {
        char want[128];
        uint64_t d0 = (b.n - 31);
        snprintf(want, sizeof want,
                 "t.gguf: tensor 'blk.0.attn_q.weight': data [%llu, %llu) "
                 "extends past end of file (%llu bytes)",
                 (unsigned long long)d0, (unsigned long long)(d0 + 32), (unsigned long long)b.n);
        expect_err(&b, KS_ERR_FORMAT, want, NULL);
    }
    one_tensor(&b, "w", 2, ne2, KS_DTYPE_F32, UINT64_MAX - 31, 32); // offset+size overflows
    expect_err(&b, KS_ERR_FORMAT, "tensor 'w'", "extends past end of file");
    char longname[80];
    memset(longname, 'n', 65);
    longname[65] = 0;
    one_tensor(&b, longname, 2, ne2, KS_DTYPE_F32, 0, 32);
    expect_err(&b, KS_ERR_FORMAT, "name is 65 bytes long", NULL);
    one_tensor(&b, "", 2, ne2, KS_DTYPE_F32, 0, 32);
    expect_err(&b, KS_ERR_FORMAT, "empty tensor name", NULL);
    // duplicate tensor names; overlapping tensors
    bb_hdr(&b, 3, 2, 0);
    bb_tinfo(&b, "w", 2, ne2, KS_DTYPE_F32, 0);
    bb_tinfo(&b, "w", 2, ne2, KS_DTYPE_F32, 32);
    bb_pad(&b, 32);
    bb_zeros(&b, 64);
    expect_err(&b, KS_ERR_FORMAT, "tensor 'w'", "duplicate tensor name");
    bb_hdr(&b, 3, 2, 0);
    bb_tinfo(&b, "w1", 2, ne2, KS_DTYPE_F32, 0);
    uint64_t ne_row[1] = {8};
    bb_tinfo(&b, "w2", 1, ne_row, KS_DTYPE_F32, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 64);
    expect_err(&b, KS_ERR_FORMAT, "overlaps tensor 'w", NULL);
    // a tensor info cut short
    bb_hdr(&b, 3, 1, 0);
    bb_str(&b, "w");
    bb_u32(&b, 4);
    for (int i = 0; i < 4; i++)
        bb_u64(&b, 4);
    expect_err(&b, KS_ERR_FORMAT, "tensor 'w'", "truncated: tensor type");
    bb_hdr(&b, 3, 1, 0); // too short to hold even one tensor info
    bb_str(&b, "w");
    bb_u32(&b, 2);
    bb_u64(&b, 4);
    expect_err(&b, KS_ERR_FORMAT, "tensor count 1 cannot fit", NULL);
    // valid counterpart of the tensor cases (the builder itself is right)
    one_tensor(&b, "w", 2, ne2, KS_DTYPE_F32, 0, 32);
    CHECK_EQ(open_bytes(b.p, b.n, &eb, NULL), KS_OK);
    free(b.p);

    // file-level errors
    CHECK_EQ(gguf_open("/nonexistent/x.gguf", &(gguf_file *){NULL}, &eb), KS_ERR_IO);
    CHECK_STR_HAS(eb.msg, "/nonexistent/x.gguf: open: No such file");
    CHECK_EQ(gguf_open(tmpdir, &(gguf_file *){NULL}, &eb), KS_ERR_IO);
    CHECK_STR_HAS(eb.msg, "not a regular file");
    char p[320];
    snprintf(p, sizeof p, "%s/empty.gguf", tmpdir);
    FILE *fp = fopen(p, "wb");
    fclose(fp);
    CHECK_EQ(gguf_open(p, &(gguf_file *){NULL}, &eb), KS_ERR_FORMAT);
    CHECK_STR_HAS(eb.msg, "empty.gguf: header: truncated");
    unlink(p);
}

// ----------------------------------------------------------------------------
// Truncation and corruption

/* Touches everything a caller could: every value, every tensor byte. */
static void walk(const gguf_file *f) {
    FILE *null = fopen("/dev/null", "w");
    gguf_print(f, null);
    fclose(null);
    volatile uint8_t sum = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        const uint8_t *p = t->data;
        for (uint64_t k = 0; k < t->n_bytes; k++)
            sum ^= p[k];
        CHECK(gguf_find_tensor(f, t->name) == t);
    }
    for (uint64_t i = 0; i < gguf_n_kv(f); i++)
        CHECK(gguf_get(f, gguf_kv_at(f, i)->key));
    (void)sum;
}

static void test_truncation(void) {
    size_t n;
    uint8_t *full = read_all(rt_path, &n);
    gguf_file *f;
    ks_errbuf eb;
    CHECK_EQ(open_bytes(full, n, &eb, &f), KS_OK);
    uint64_t end = 0; // end of the last tensor's data; bytes after it are padding
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        uint64_t e = gguf_data_offset(f) + t->offset + t->n_bytes;
        if (e > end) end = e;
    }
    gguf_close(f);
    free(open_copy);
    CHECK(end < n);
    for (size_t k = 0; k < n; k++) {
        ks_err e = open_bytes(full, k, &eb, NULL);
        if (k < end) {
            if (e != KS_ERR_FORMAT) fprintf(stderr, "prefix %zu: %s\n", k, ks_err_name(e));
            CHECK_EQ(e, KS_ERR_FORMAT);
            if (!strstr(eb.msg, "truncated") && !strstr(eb.msg, "past end of file") &&
                !strstr(eb.msg, "cannot fit"))
                CHECK_STR_HAS(eb.msg, "truncated");
        } else {
            CHECK_EQ(e, KS_OK);
        }
    }
    free(full);
}

static void test_corruption(void) {
    size_t n;
    uint8_t *full = read_all(rt_path, &n);
    gguf_file *f;
    ks_errbuf eb;
    CHECK_EQ(gguf_open(rt_path, &f, &eb), KS_OK);
    size_t hdr = (size_t)gguf_data_offset(f);
    gguf_close(f);
    uint8_t *c = malloc(n);
    int n_ok = 0, n_fail = 0;
    for (int it = 0; it < 4000; it++) {
        memcpy(c, full, n);
        uint64_t r = rnd();
        size_t pos = (r & 3) ? (size_t)((r >> 8) % hdr) : (size_t)((r >> 8) % n);
        if (it % 4 == 3 && pos + 8 <= n) { // smash a whole little-endian u64
            static const uint64_t vals[] = {0, 1, UINT64_MAX, 1ull << 63, 0x7fffffff, 64, 13};
            uint64_t v = vals[(r >> 40) % 7];
            for (int i = 0; i < 8; i++)
                c[pos + (size_t)i] = (uint8_t)(v >> (8 * i));
        } else {
            c[pos] = (uint8_t)(r >> 56);
        }
        gguf_file *g = NULL;
        ks_errbuf_clear(&eb);
        uint8_t *copy = malloc(n);
        memcpy(copy, c, n);
        ks_err e = gguf_open_mem(copy, n, "t.gguf", &g, &eb);
        if (e == KS_OK) {
            walk(g);
            gguf_close(g);
            n_ok++;
        } else {
            CHECK(g == NULL);
            CHECK(e == KS_ERR_FORMAT || e == KS_ERR_UNSUPPORTED);
            CHECK(strncmp(eb.msg, "t.gguf: ", 8) == 0);
            n_fail++;
        }
        free(copy);
    }
    CHECK(n_fail > 100 && n_ok > 100); // both paths exercised
    free(c);
    free(full);
}

// ----------------------------------------------------------------------------
// Real files in ../shared

static void test_shared(void) {
    char buf[512];
    static const struct {
        const char *file, *arch, *model;
        uint64_t n_tokens;
    } vocabs[] = {
        {"vocab/ggml-vocab-llama-spm.gguf", "llama", "llama", 32000},
        {"vocab/ggml-vocab-gpt-2.gguf", "gpt2", "gpt2", 50257},
        {"vocab/ggml-vocab-phi-3.gguf", "phi3", "llama", 32064},
        {"vocab/ggml-vocab-starcoder.gguf", "starcoder2", "gpt2", 49152},
        {"vocab/ggml-vocab-deepseek-llm.gguf", "llama", "gpt2", 102400},
        {"vocab/ggml-vocab-deepseek-coder.gguf", "llama", "gpt2", 32256},
    };
    int found = 0;
    ks_errbuf eb;
    for (size_t i = 0; i < sizeof vocabs / sizeof vocabs[0]; i++) {
        const char *p = check_shared_path(vocabs[i].file, buf, sizeof buf);
        if (!p) {
            fprintf(stderr, "note: %s absent, skipped\n", vocabs[i].file);
            continue;
        }
        found++;
        gguf_file *f;
        ks_err e = gguf_open(p, &f, &eb);
        if (e) fprintf(stderr, "%s\n", eb.msg);
        CHECK_EQ(e, KS_OK);
        gguf_str s;
        CHECK_EQ(gguf_get_str(f, "general.architecture", &s, &eb), KS_OK);
        CHECK(s.len == strlen(vocabs[i].arch) && !memcmp(s.ptr, vocabs[i].arch, s.len));
        CHECK_EQ(gguf_get_str(f, "tokenizer.ggml.model", &s, &eb), KS_OK);
        CHECK(s.len == strlen(vocabs[i].model) && !memcmp(s.ptr, vocabs[i].model, s.len));
        const gguf_value *a;
        CHECK_EQ(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &a, &eb), KS_OK);
        CHECK_EQ(a->v.arr.n, vocabs[i].n_tokens);
        CHECK_EQ(gguf_n_tensors(f), 0);
        walk(f);
        gguf_close(f);
    }
    const char *p = check_shared_path("models/kjv-mini.gguf", buf, sizeof buf);
    if (!p) {
        fprintf(stderr, "note: models/kjv-mini.gguf absent, skipped\n");
    } else {
        found++;
        gguf_file *f;
        CHECK_EQ(gguf_open(p, &f, &eb), KS_OK);
        CHECK_EQ(gguf_version(f), 3);
        CHECK_EQ(gguf_n_tensors(f), 57);
        CHECK_EQ(gguf_n_kv(f), 24);
        gguf_str s;
        CHECK_EQ(gguf_get_str(f, "general.architecture", &s, &eb), KS_OK);
        CHECK(s.len == 5 && !memcmp(s.ptr, "llama", 5));
        uint32_t u;
        CHECK_EQ(gguf_get_u32(f, "llama.vocab_size", &u, &eb), KS_OK);
        CHECK_EQ(u, 2048);
        CHECK_EQ(gguf_get_u32(f, "llama.block_count", &u, &eb), KS_OK);
        CHECK_EQ(u, 6);
        CHECK_EQ(gguf_get_u32(f, "llama.attention.head_count_kv", &u, &eb), KS_OK);
        CHECK_EQ(u, 4);
        float x;
        CHECK_EQ(gguf_get_f32(f, "llama.rope.freq_base", &x, &eb), KS_OK);
        CHECK(x == 10000.0f);
        const gguf_value *a;
        CHECK_EQ(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &a, &eb), KS_OK);
        CHECK_EQ(a->v.arr.n, 2048);
        CHECK(a->v.arr.items[1].v.str.len == 3 && !memcmp(a->v.arr.items[1].v.str.ptr, "<s>", 3));
        const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
        CHECK(t);
        CHECK_EQ(t->type, KS_DTYPE_F16);
        CHECK_EQ(t->ne[0], 256);
        CHECK_EQ(t->ne[1], 2048);
        CHECK_EQ(t->n_bytes, 256 * 2048 * 2);
        t = gguf_find_tensor(f, "blk.5.ffn_down.weight");
        CHECK(t && t->ne[0] == 704 && t->ne[1] == 256);
        t = gguf_find_tensor(f, "output_norm.weight");
        CHECK(t && t->type == KS_DTYPE_F32 && t->n_dims == 1 && t->ne[0] == 256);
        // norm weights of a trained model are finite and near 1
        const float *w = t->data;
        for (int i = 0; i < 256; i++)
            CHECK(w[i] > -100 && w[i] < 100);
        uint64_t total = 0;
        for (uint64_t i = 0; i < gguf_n_tensors(f); i++)
            total += gguf_tensor_at(f, i)->n_elems;
        CHECK_EQ(total, 5475584);
        gguf_close(f);
    }
    if (!found) fprintf(stderr, "note: no ../shared files found; shared checks skipped\n");
}

/* Resident kB of this process's mapping that holds p (/proc/self/smaps);
 * -1 where there is none. */
static long mapping_rss_kb(const void *p) {
    FILE *fp = fopen("/proc/self/smaps", "r");
    CHECK(fp);
    char line[512];
    bool in = false;
    long kb = -1;
    while (fgets(line, sizeof line, fp)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        } else if (in && sscanf(line, "Rss: %ld kB", &kb) == 1) {
            break;
        }
    }
    fclose(fp);
    return kb;
}

/* The residency hints act on the pages of the range they are given, in the
 * file's own mapping: unneeded drops them from the process's resident
 * memory, resident maps them all back (so reading a token's embedding row
 * takes no page fault), and neither changes a byte; ranges outside the
 * file and in-memory files are left alone. */
static void test_advise(void) {
    enum { N = 1 << 18 }; // 1 MiB of F32: 256 pages of the mapping
    bb b = {0};
    uint64_t ne[1] = {N};
    bb_hdr(&b, 3, 1, 0);
    bb_tinfo(&b, "w", 1, ne, KS_DTYPE_F32, 0);
    bb_pad(&b, 32);
    for (uint32_t i = 0; i < N; i++) {
        float x = (float)i;
        bb_put(&b, &x, 4);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/advise.gguf", tmpdir);
    FILE *fp = fopen(path, "wb");
    CHECK(fp && fwrite(b.p, 1, b.n, fp) == b.n);
    fclose(fp);
    gguf_file *f;
    ks_errbuf eb;
    CHECK_EQ(gguf_open(path, &f, &eb), KS_OK);
    const gguf_tensor *t = gguf_find_tensor(f, "w");
    CHECK(t);
    const size_t n = t->n_bytes;
    gguf_advise_unneeded(f, t->data, n);
    const long dropped = mapping_rss_kb(t->data);
    CHECK(dropped >= 0 && dropped < 64); // at most the header's pages
    gguf_advise_resident(f, t->data, n);
    const long back = mapping_rss_kb(t->data);
#ifdef MADV_POPULATE_READ
    void *anon = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(anon != MAP_FAILED);
    const bool can = madvise(anon, 4096, MADV_POPULATE_READ) == 0;
    munmap(anon, 4096);
#else
    const bool can = false;
#endif
    if (can)
        CHECK(back >= (long)(n / 1024)); // every page of the range mapped
    else
        fprintf(stderr, "note: the kernel lacks MADV_POPULATE_READ; residency check skipped\n");
    const float *x = t->data;
    for (uint32_t i = 0; i < N; i += 997)
        CHECK(x[i] == (float)i);
    // outside the file: nothing happens (no fault, the mapping unchanged)
    gguf_advise_resident(f, (const char *)t->data + n, 4096);
    gguf_advise_unneeded(f, &eb, sizeof eb);
    CHECK_EQ(mapping_rss_kb(t->data), back);
    gguf_close(f);
    // an in-memory file: no-ops
    CHECK_EQ(open_bytes(b.p, b.n, &eb, &f), KS_OK);
    t = gguf_find_tensor(f, "w");
    gguf_advise_unneeded(f, t->data, n);
    gguf_advise_resident(f, t->data, n);
    CHECK(((const float *)t->data)[N - 1] == (float)(N - 1));
    gguf_close(f);
    free(open_copy);
    free(b.p);
}

int main(void) {
    make_tmpdir();
    test_roundtrip();
    test_getter_errors();
    test_writer_errors();
    test_v2();
    test_print_escapes();
    test_malformed();
    test_truncation();
    test_corruption();
    test_shared();
    test_advise();
    for (size_t i = 0; i < N_TENSORS; i++)
        free(tensors[i].data);
    rm_tmpdir();
    printf("test_gguf: ok\n");
    return 0;
}
