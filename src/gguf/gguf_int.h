/* gguf_int.h — private helpers shared by the GGUF reader, writer and printer:
 * value-type sizes and little-endian load/store. Not part of the API. */
#ifndef KS_GGUF_INT_H
#define KS_GGUF_INT_H

#include "kvseal/gguf.h"

#include <string.h>

/* Nesting limit for arrays of arrays: bounds recursion on hostile input. */
#define GGUF__MAX_DEPTH 16
/* Spec limits: keys < 2^16 bytes, tensor names <= 64 bytes (GGML_MAX_NAME). */
#define GGUF__MAX_KEY 65535u
#define GGUF__MAX_NAME 64u

/* Size in bytes of a fixed-size value type; 0 for STRING, ARRAY and unknown. */
static inline uint32_t gguf__type_size(uint32_t t) {
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_BOOL:
        return 1;
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16:
        return 2;
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_FLOAT32:
        return 4;
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
    case GGUF_TYPE_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

static inline uint16_t gguf__ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t gguf__ld32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t gguf__ld64(const uint8_t *p) {
    return (uint64_t)gguf__ld32(p) | ((uint64_t)gguf__ld32(p + 4) << 32);
}
static inline void gguf__st32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void gguf__st64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Decodes one packed scalar of type t at p into a gguf_value (no STRING/ARRAY). */
static inline void gguf__decode_scalar(uint32_t t, const uint8_t *p, gguf_value *v) {
    v->type = (gguf_type)t;
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_BOOL:
        v->v.u64 = p[0];
        break;
    case GGUF_TYPE_INT8:
        v->v.i64 = (int8_t)p[0];
        break;
    case GGUF_TYPE_UINT16:
        v->v.u64 = gguf__ld16(p);
        break;
    case GGUF_TYPE_INT16:
        v->v.i64 = (int16_t)gguf__ld16(p);
        break;
    case GGUF_TYPE_UINT32:
        v->v.u64 = gguf__ld32(p);
        break;
    case GGUF_TYPE_INT32:
        v->v.i64 = (int32_t)gguf__ld32(p);
        break;
    case GGUF_TYPE_UINT64:
        v->v.u64 = gguf__ld64(p);
        break;
    case GGUF_TYPE_INT64:
        v->v.i64 = (int64_t)gguf__ld64(p);
        break;
    case GGUF_TYPE_FLOAT32: {
        uint32_t u = gguf__ld32(p);
        float f;
        memcpy(&f, &u, 4);
        v->v.f64 = f;
        break;
    }
    case GGUF_TYPE_FLOAT64: {
        uint64_t u = gguf__ld64(p);
        memcpy(&v->v.f64, &u, 8);
        break;
    }
    default:
        v->v.u64 = 0;
        break;
    }
}

#endif /* KS_GGUF_INT_H */
