/* base.h — errors, logging, assertions, clocks, aligned memory, the thread
 * pool, CPU feature detection and the tensor element-type table.
 *
 * Everything here is model- and network-agnostic (docs/design.md, the source tour).
 * One ks_err enum for the whole project; details travel in a ks_errbuf owned
 * by the caller, never in a global (STYLE.md section 4). */
#ifndef KS_BASE_H
#define KS_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// ----------------------------------------------------------------------------
// Errors

#define KS_ERR_MAP(XX)                                                         \
    XX(NOMEM, "out of memory")                                                 \
    XX(IO, "i/o error")                                                        \
    XX(FORMAT, "malformed input")                                              \
    XX(UNSUPPORTED, "unsupported")                                             \
    XX(INVAL, "invalid argument")                                              \
    XX(NOSPACE, "kv cache full")                                               \
    XX(TIMEOUT, "timed out")                                                   \
    XX(PROTO, "protocol error")                                                \
    XX(PEER_CLOSED, "peer closed the connection")                              \
    XX(CANCELLED, "cancelled")                                                 \
    XX(AGAIN, "try again")                                                     \
    XX(INTERNAL, "internal error")                                             \
    XX(EXISTS, "already exists")

typedef enum ks_err {
    KS_OK = 0,
#define KS__ERR_ENUM(name, msg) KS_ERR_##name,
    KS_ERR_MAP(KS__ERR_ENUM)
#undef KS__ERR_ENUM
    KS_ERR__COUNT
} ks_err;

#define KS_MUST_USE __attribute__((warn_unused_result))

/* Returns the enum name ("KS_ERR_FORMAT"); never NULL, static storage. */
const char *ks_err_name(ks_err e);
/* Returns a short English description; never NULL, static storage. */
const char *ks_strerror(ks_err e);

#define KS_ERRMSG_CAP 512

/* Caller-owned error detail: the code and a message naming what was wrong.
 * Any function taking a ks_errbuf * accepts NULL (details are dropped). */
typedef struct ks_errbuf {
    ks_err code;              /* public */
    uint16_t reason;          /* public: why a request was refused (admit_reason in
                                 kvseal/admit.h), 0 when it was not a refusal */
    char msg[KS_ERRMSG_CAP];  /* public: NUL-terminated, "" when code is KS_OK */
} ks_errbuf;

/* Fills eb (if non-NULL) with code, reason 0 and a printf-formatted message; returns code
 * so callers can write `return ks_seterr(eb, KS_ERR_FORMAT, ...)`. */
ks_err ks_seterr(ks_errbuf *eb, ks_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Clears eb to KS_OK and an empty message. eb may be NULL. */
void ks_errbuf_clear(ks_errbuf *eb);

/* Aborts after printing file:line and the failed expression. Stays on in
 * release builds: use it for programmer errors, never for bad input. */
#define KS_ASSERT(x)                                                           \
    do {                                                                       \
        if (!(x)) ks__assert_fail(__FILE__, __LINE__, #x);                     \
    } while (0)
_Noreturn void ks__assert_fail(const char *file, int line, const char *expr);

// ----------------------------------------------------------------------------
// Logging (stderr only: stdout belongs to the tools' real output)

typedef enum ks_log_level {
    KS_LOG_DEBUG = 0,
    KS_LOG_INFO = 1,
    KS_LOG_WARN = 2,
    KS_LOG_ERROR = 3,
    KS_LOG_OFF = 4,
} ks_log_level;

/* Sets the minimum level written; thread-safe (atomic). Default KS_LOG_INFO,
 * or the value of KS_LOG=debug|info|warn|error|off read by ks_log_init_env. */
void ks_log_set_level(ks_log_level lvl);
/* Line formats: text "2026-01-02T03:04:05.678Z kvseal LEVEL: message", or
 * json, one object a line: {"ts":"...","level":"info","msg":"...", fields}. */
typedef enum ks_log_format {
    KS_LOG_TEXT = 0,
    KS_LOG_JSON = 1,
} ks_log_format;

/* Sets the line format (default text); thread-safe (atomic). */
void ks_log_set_format(ks_log_format fmt);
/* The current line format; thread-safe (atomic), can't fail. */
ks_log_format ks_log_get_format(void);
/* "debug|info|warn|error|off" -> *out; false (and *out untouched) otherwise. */
bool ks_log_level_parse(const char *s, ks_log_level *out /* OUT */);
/* "text|json" -> *out; false (and *out untouched) otherwise. */
bool ks_log_format_parse(const char *s, ks_log_format *out /* OUT */);
/* Reads the KS_LOG environment variable once; can't fail. */
void ks_log_init_env(void);
/* Writes one line to stderr in the current format, with an RFC 3339 UTC
 * timestamp to the millisecond; thread-safe (one write per line). */
void ks_log(ks_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* ks_log with structured fields: `fields` is the text of a JSON object (the
 * caller vouches for it), whose members join the json line's ts, level and
 * msg; a text line carries only the message. fields may be NULL. */
void ks_log_fields(ks_log_level lvl, const char *fields, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Writes the current UTC time as "YYYY-MM-DDTHH:MM:SS.mmmZ" into buf (cap
 * >= 25) and returns its length; can't fail. */
size_t ks_log_timestamp(char *buf, size_t cap);

// ----------------------------------------------------------------------------
// Clocks and memory

/* Monotonic clock in nanoseconds; can't fail. */
uint64_t ks_now_ns(void);

/* 64-byte aligned allocation of n bytes (n may be 0); NULL on failure.
 * Free with ks_free_aligned. */
void *ks_alloc_aligned(size_t n);
/* Frees memory from ks_alloc_aligned or ks_alloc_huge; accepts NULL. */
void ks_free_aligned(void *p);
/* A 2 MiB-aligned allocation of n bytes (rounded up to 2 MiB) advised for
 * transparent huge pages, for large buffers streamed every step (weights,
 * KV pages): one TLB entry covers 2 MiB instead of 4 KiB. The advice is a
 * hint the kernel may decline. NULL on failure; free with ks_free_aligned. */
void *ks_alloc_huge(size_t n);

/* a*b with overflow detection: returns false (and leaves *out unchanged) on
 * overflow. */
static inline bool ks_mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}
/* a+b with overflow detection, as ks_mul_ok. */
static inline bool ks_add_ok(uint64_t a, uint64_t b, uint64_t *out) {
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r)) return false;
    *out = r;
    return true;
}

// ----------------------------------------------------------------------------
// Thread pool: persistent workers woken once per op.
//
// Work is claimed dynamically: a task splits its range into chunks and every
// participating thread claims chunks from a shared counter (ks_pool_claim)
// until none are left. The owner always participates; a worker that is not
// scheduled in time (a busy, shared machine) simply misses the op instead of
// stalling it. So a task must never assume that every ith runs: ith only
// indexes per-thread scratch. Results must not depend on who computed what
// (each output element is computed whole by whichever thread claims it).

#include <stdatomic.h>

typedef struct ks_pool ks_pool;

/* One parallel task: called on the owner (ith 0) and on each worker that
 * joins the op in time (distinct ith in [1, nth)). */
typedef void (*ks_pool_fn)(void *arg, int ith, int nth);

/* Starts n_threads-1 workers (the caller is thread 0). n_threads >= 1.
 * Returns NULL on failure (threads or memory). Owned by the caller. */
ks_pool *ks_pool_create(int n_threads);
/* Runs fn on the owner and on the workers that join, and returns when every
 * participant has finished. Blocks. Must be called from one thread at a
 * time (the owner). Can't fail. */
void ks_pool_run(ks_pool *p, ks_pool_fn fn, void *arg);
/* Number of threads including the caller; can't fail. */
int ks_pool_nth(const ks_pool *p);
/* Stops and joins the workers; accepts NULL. */
void ks_pool_destroy(ks_pool *p);

/* Claims the next chunk [*i0, *i1) of [0, n) in steps of `chunk` from the
 * shared counter *next (start it at 0); false when the range is exhausted. */
static inline bool ks_pool_claim(atomic_llong *next, int64_t n, int64_t chunk, int64_t *i0,
                                 int64_t *i1) {
    int64_t i = (int64_t)atomic_fetch_add_explicit(next, chunk, memory_order_relaxed);
    if (i >= n) return false;
    *i0 = i;
    *i1 = i + chunk < n ? i + chunk : n;
    return true;
}

// ----------------------------------------------------------------------------
// CPU features

typedef struct ks_cpu {
    bool avx2;     /* AVX2 + FMA + F16C, with OS support for YMM state */
    bool avx512;   /* AVX-512 F/BW/VL/DQ, with OS support for ZMM state */
    bool avx512vnni;
    bool avx512bf16;
    bool gfni; /* GF2P8AFFINEQB on ZMM (reported only with avx512) */
    bool amd;  /* vendor "AuthenticAMD" (CPUID leaf 0) */
} ks_cpu;

/* Detects the CPU once (CPUID + XGETBV) and caches it; thread-safe. */
const ks_cpu *ks_cpu_get(void);

// ----------------------------------------------------------------------------
// Tensor element types (ggml type ids as stored in GGUF; append-only)

typedef enum ks_dtype {
    KS_DTYPE_F32 = 0,
    KS_DTYPE_F16 = 1,
    KS_DTYPE_Q4_0 = 2,
    KS_DTYPE_Q4_1 = 3,
    /* 4, 5: retired (Q4_2, Q4_3) */
    KS_DTYPE_Q5_0 = 6,
    KS_DTYPE_Q5_1 = 7,
    KS_DTYPE_Q8_0 = 8,
    KS_DTYPE_Q8_1 = 9,
    KS_DTYPE_Q2_K = 10,
    KS_DTYPE_Q3_K = 11,
    KS_DTYPE_Q4_K = 12,
    KS_DTYPE_Q5_K = 13,
    KS_DTYPE_Q6_K = 14,
    KS_DTYPE_Q8_K = 15,
    KS_DTYPE_IQ2_XXS = 16,
    KS_DTYPE_IQ2_XS = 17,
    KS_DTYPE_IQ3_XXS = 18,
    KS_DTYPE_IQ1_S = 19,
    KS_DTYPE_IQ4_NL = 20,
    KS_DTYPE_IQ3_S = 21,
    KS_DTYPE_IQ2_S = 22,
    KS_DTYPE_IQ4_XS = 23,
    KS_DTYPE_I8 = 24,
    KS_DTYPE_I16 = 25,
    KS_DTYPE_I32 = 26,
    KS_DTYPE_I64 = 27,
    KS_DTYPE_F64 = 28,
    KS_DTYPE_IQ1_M = 29,
    KS_DTYPE_BF16 = 30,
    /* 31-33: retired (Q4_0_4_4, Q4_0_4_8, Q4_0_8_8) */
    KS_DTYPE_TQ1_0 = 34,
    KS_DTYPE_TQ2_0 = 35,
    /* 36-38: retired (IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8) */
    KS_DTYPE_MXFP4 = 39,
    KS_DTYPE__COUNT = 40
} ks_dtype;

/* True when t is a known ggml type id (its block layout is known). */
bool ks_dtype_known(uint32_t t);
/* Elements per block (1 for plain types); 0 for an unknown type. */
uint32_t ks_dtype_block_elems(uint32_t t);
/* Bytes per block; 0 for an unknown type. */
uint32_t ks_dtype_block_bytes(uint32_t t);
/* Name such as "Q4_K"; "?" for an unknown type. Static storage. */
const char *ks_dtype_name(uint32_t t);
/* Parses a name ("q8_0", case-insensitive); false if unknown. */
bool ks_dtype_parse(const char *name, ks_dtype *out);
/* Bytes for a row of n elements; false if n is not a multiple of the block
 * size, the type is unknown, or the size overflows. */
bool ks_dtype_row_bytes(uint32_t t, uint64_t n, uint64_t *out);

// ----------------------------------------------------------------------------
// Half-precision conversions (exact IEEE round-to-nearest-even).

/* Converts IEEE binary16 bits to float; can't fail. */
float ks_f16_to_f32(uint16_t h);
/* Converts float to binary16 bits, round to nearest even; can't fail. */
uint16_t ks_f32_to_f16(float f);
/* Converts bfloat16 bits to float; can't fail. */
static inline float ks_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}
/* Converts float to bfloat16 bits, round to nearest even (NaN kept quiet). */
uint16_t ks_f32_to_bf16(float f);

#endif /* KS_BASE_H */
