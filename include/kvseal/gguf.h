/* gguf.h — reading (mmap, validated) and writing GGUF files, versions 2 and 3.
 *
 * The reader maps the file read-only, validates every header field, metadata
 * value and tensor info before handing out any pointer, and never copies
 * tensor data: gguf_tensor.data points into the mapping. Every failure fills
 * the caller's ks_errbuf with a message that names the file, the key or the
 * tensor, and what was wrong. The writer builds a file in memory order
 * (header, kv, tensor infos, aligned data) for fixtures and `mkmodel`.
 * Format reference: the GGUF specification (ggml docs/gguf.md). */
#ifndef KS_GGUF_H
#define KS_GGUF_H

#include "kvseal/base.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

/* Metadata value types (append-only, as in the spec). */
typedef enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE__COUNT
} gguf_type;

/* A string in the mapping: NOT NUL-terminated. */
typedef struct gguf_str {
    const char *ptr; /* read-only, points into the mapping */
    uint64_t len;    /* bytes */
} gguf_str;

/* A metadata value. Scalars are decoded; arrays keep a pointer to their raw
 * little-endian elements (numeric types) or to decoded items (strings and
 * nested arrays). Owned by the gguf_file; valid until gguf_close. */
typedef struct gguf_value gguf_value;
struct gguf_value {
    gguf_type type; /* read-only */
    union {
        uint64_t u64; /* UINT8/16/32/64 and BOOL (0/1) */
        int64_t i64;  /* INT8/16/32/64 */
        double f64;   /* FLOAT32/64 */
        gguf_str str; /* STRING */
        struct {
            gguf_type elem_type;     /* element type */
            uint64_t n;              /* element count */
            const void *raw;         /* numeric elements, packed LE, in the mapping */
            const gguf_value *items; /* (n) for STRING and ARRAY elements, else NULL */
        } arr;
    } v;
};

typedef struct gguf_kv {
    const char *key;  /* NUL-terminated copy, owned by the file */
    gguf_value value;
} gguf_kv;

typedef struct gguf_tensor {
    const char *name;          /* NUL-terminated copy, owned by the file */
    uint32_t n_dims;           /* 1..GGUF_MAX_DIMS */
    int64_t ne[GGUF_MAX_DIMS]; /* elements per dim, fastest first; unused dims = 1 */
    uint32_t type;             /* ks_dtype (a known ggml type id) */
    uint64_t offset;           /* from the start of the data section */
    uint64_t n_bytes;          /* size of the data */
    uint64_t n_elems;          /* product of ne */
    const void *data;          /* read-only, points into the mapping */
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* Maps and validates path. On success *out owns the mapping (close with
 * gguf_close); the file must not be truncated while it is open (mmap).
 * Errors: KS_ERR_IO (open/stat/mmap, with strerror), KS_ERR_FORMAT (bad
 * magic, truncation, overflow, data outside the file, duplicate key/tensor,
 * misaligned offset, ...), KS_ERR_UNSUPPORTED (version other than 2/3,
 * unknown tensor type), KS_ERR_NOMEM. Blocks on file I/O. */
ks_err gguf_open(const char *path, gguf_file **out /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* Same as gguf_open over a caller-owned buffer (must outlive the file);
 * `name` is used in error messages. */
ks_err gguf_open_mem(const void *buf, size_t n, const char *name, gguf_file **out /* OUT */,
                     ks_errbuf *eb) KS_MUST_USE;
/* Unmaps and frees; accepts NULL. */
void gguf_close(gguf_file *f);
/* Hints that bytes [p, p + n) of f's tensor data won't be read again soon
 * (a copy was made): the whole pages inside leave resident memory and come
 * back from the file if touched. No-op for gguf_open_mem files. */
void gguf_advise_unneeded(const gguf_file *f, const void *p, size_t n);

/* Hints that bytes [p, p + n) of f's tensor data will be read piecemeal
 * from now on: their pages are mapped now (MADV_POPULATE_READ), so a later
 * read takes no page fault. No-op for gguf_open_mem files or where the
 * kernel lacks the advice. */
void gguf_advise_resident(const gguf_file *f, const void *p, size_t n);

/* File facts; these can't fail. */
const char *gguf_path(const gguf_file *f);
uint32_t gguf_version(const gguf_file *f);
uint64_t gguf_alignment(const gguf_file *f);
/* Start of the data section (aligned; past EOF in a file without tensors). */
uint64_t gguf_data_offset(const gguf_file *f);
uint64_t gguf_file_size(const gguf_file *f);

uint64_t gguf_n_kv(const gguf_file *f);
/* i < gguf_n_kv(f); never NULL. */
const gguf_kv *gguf_kv_at(const gguf_file *f, uint64_t i);
/* The value of key, or NULL if absent. */
const gguf_value *gguf_get(const gguf_file *f, const char *key);

uint64_t gguf_n_tensors(const gguf_file *f);
/* i < gguf_n_tensors(f); never NULL. */
const gguf_tensor *gguf_tensor_at(const gguf_file *f, uint64_t i);
/* The tensor called name, or NULL if absent. */
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Typed getters: each returns KS_OK, or KS_ERR_FORMAT (with a message naming
 * the file and key) when the key is missing, has an incompatible type, or
 * does not fit. Integer getters accept any integer type in range; float
 * getters accept FLOAT32/64. */
ks_err gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out /* OUT */,
                    ks_errbuf *eb) KS_MUST_USE;
ks_err gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out /* OUT */,
                    ks_errbuf *eb) KS_MUST_USE;
ks_err gguf_get_i64(const gguf_file *f, const char *key, int64_t *out /* OUT */,
                    ks_errbuf *eb) KS_MUST_USE;
ks_err gguf_get_f32(const gguf_file *f, const char *key, float *out /* OUT */,
                    ks_errbuf *eb) KS_MUST_USE;
ks_err gguf_get_bool(const gguf_file *f, const char *key, bool *out /* OUT */,
                     ks_errbuf *eb) KS_MUST_USE;
/* *out points into the mapping (not NUL-terminated). */
ks_err gguf_get_str(const gguf_file *f, const char *key, gguf_str *out /* OUT */,
                    ks_errbuf *eb) KS_MUST_USE;
/* An array whose elements have type elem_type; *out is the array value. */
ks_err gguf_get_arr(const gguf_file *f, const char *key, gguf_type elem_type,
                    const gguf_value **out /* OUT */, ks_errbuf *eb) KS_MUST_USE;

/* Element i of a numeric array as a double / int64; i < n. Can't fail for an
 * array of the matching kind (asserts otherwise). */
double gguf_arr_f64(const gguf_value *arr, uint64_t i);
int64_t gguf_arr_i64(const gguf_value *arr, uint64_t i);

/* Name of a value type ("uint32", "array", ...); static storage. */
const char *gguf_type_name(uint32_t t);

/* Writes a human-readable dump (header, every key with its value — long
 * arrays abbreviated — and the tensor table) to fp. Can't fail beyond stdio. */
void gguf_print(const gguf_file *f, void *fp /* FILE * */);

// ----------------------------------------------------------------------------
// Writer

typedef struct gguf_writer gguf_writer;

/* An empty GGUF v3 writer with alignment 32; NULL on NOMEM. Caller destroys. */
gguf_writer *gguf_writer_create(void);
/* Frees the writer and its copies; accepts NULL. */
void gguf_writer_destroy(gguf_writer *w);

/* Setters copy key and value. Setting an existing key replaces it (order is
 * kept). Errors: KS_ERR_NOMEM, KS_ERR_INVAL (empty key). */
ks_err gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v) KS_MUST_USE;
ks_err gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v) KS_MUST_USE;
ks_err gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v) KS_MUST_USE;
ks_err gguf_writer_set_f32(gguf_writer *w, const char *key, float v) KS_MUST_USE;
ks_err gguf_writer_set_bool(gguf_writer *w, const char *key, bool v) KS_MUST_USE;
ks_err gguf_writer_set_str(gguf_writer *w, const char *key, const char *v) KS_MUST_USE;
/* Numeric array: n elements of elem_type, packed LE in data (copied). */
ks_err gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_type elem_type,
                           const void *data, uint64_t n) KS_MUST_USE;
/* String array of n NUL-terminated strings (copied). */
ks_err gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                               uint64_t n) KS_MUST_USE;
/* Copies one metadata entry (any type, nested arrays included) from src.
 * Errors: INVAL (src has no such key), NOMEM. */
ks_err gguf_writer_copy_kv(gguf_writer *w, const gguf_file *src, const char *key) KS_MUST_USE;
/* Copies any value (scalars, strings, numeric arrays from arr.raw, string and
 * nested arrays from arr.items, recursively). Errors: NOMEM, INVAL (bad type,
 * empty key, general.alignment not a uint32 power of two). */
ks_err gguf_writer_set_value(gguf_writer *w, const char *key, const gguf_value *v) KS_MUST_USE;
/* Sets general.alignment (power of two) and uses it for tensor data. */
ks_err gguf_writer_set_alignment(gguf_writer *w, uint32_t align) KS_MUST_USE;

/* Adds a tensor. ne has n_dims entries (fastest first); data (n_bytes, must
 * equal the size implied by type and ne) is NOT copied and must stay valid
 * until gguf_writer_write returns. Errors: INVAL (size mismatch, duplicate
 * or empty name, name over 64 bytes, n_dims not 1..4, a dim <= 0, unknown
 * type, ne[0] not a multiple of the type's block size), NOMEM. */
ks_err gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t n_dims,
                              const int64_t *ne, ks_dtype type, const void *data,
                              uint64_t n_bytes) KS_MUST_USE;
/* Streaming tensor data: a fill callback writes the tensor's bytes, in any
 * number of pieces, through gguf_sink_write while the file is being written,
 * so a large model never has to sit in memory. */
typedef struct gguf_sink gguf_sink;
/* Appends n bytes of the current tensor's data. Errors: KS_ERR_INVAL (more
 * bytes than the tensor's size), KS_ERR_IO (write failed; stop and return it). */
ks_err gguf_sink_write(gguf_sink *s, const void *data, size_t n) KS_MUST_USE;
/* Called once per tensor, in order, from gguf_writer_write; must write
 * exactly the tensor's n_bytes and return KS_OK, or return an error (with a
 * message in eb) to abort the write. */
typedef ks_err (*gguf_fill_fn)(void *ctx, const char *name, gguf_sink *sink, ks_errbuf *eb);
/* Adds a tensor whose data comes from fill(ctx, ...) at write time. ctx must
 * stay valid until gguf_writer_write returns. Errors as gguf_writer_add_tensor. */
ks_err gguf_writer_add_tensor_fill(gguf_writer *w, const char *name, uint32_t n_dims,
                                   const int64_t *ne, ks_dtype type, gguf_fill_fn fill,
                                   void *ctx) KS_MUST_USE;
/* Writes the file (GGUF v3) to path, atomically via a temporary file.
 * Errors: KS_ERR_IO with strerror, or whatever a fill callback returned
 * (the temporary file is removed and path is left untouched). Blocks. */
ks_err gguf_writer_write(gguf_writer *w, const char *path, ks_errbuf *eb) KS_MUST_USE;

#endif /* KS_GGUF_H */
