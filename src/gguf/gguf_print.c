/* gguf_print.c — human-readable dump of a validated GGUF file: header,
 * every metadata key with its type and value (arrays abbreviated to their
 * first few elements), then the tensor table. Used by `kvseal inspect`.
 * Strings from the file are escaped, so a hostile file cannot inject
 * terminal control sequences. */
#include "gguf/gguf_int.h"

#include <stdio.h>

#define GGUF__PRINT_ITEMS 8 /* array elements shown */
#define GGUF__PRINT_STR 120 /* string bytes shown */

static void gguf__print_str(FILE *fp, const char *s, uint64_t len) {
    fputc('"', fp);
    uint64_t n = len < GGUF__PRINT_STR ? len : GGUF__PRINT_STR;
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(fp, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", fp);
        else if (c == '\t')
            fputs("\\t", fp);
        else if (c < 0x20 || c == 0x7f)
            fprintf(fp, "\\x%02x", c);
        else
            fputc(c, fp); // UTF-8 bytes pass through
    }
    fputc('"', fp);
    if (n < len) fprintf(fp, "...(%llu bytes)", (unsigned long long)len);
}

/* Copies a key or tensor name into dst with control bytes escaped (\xNN),
 * cut to fit cap. */
static const char *gguf__name(char *dst, size_t cap, const char *s) {
    size_t o = 0;
    for (; *s && o + 5 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c == 0x7f)
            o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", c);
        else
            dst[o++] = (char)c;
    }
    dst[o] = '\0';
    return dst;
}

static void gguf__print_value(FILE *fp, const gguf_value *v);

static void gguf__print_scalar(FILE *fp, const gguf_value *v) {
    switch (v->type) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_UINT64:
        fprintf(fp, "%llu", (unsigned long long)v->v.u64);
        break;
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_INT16:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_INT64:
        fprintf(fp, "%lld", (long long)v->v.i64);
        break;
    case GGUF_TYPE_FLOAT32:
        fprintf(fp, "%.9g", v->v.f64);
        break;
    case GGUF_TYPE_FLOAT64:
        fprintf(fp, "%.17g", v->v.f64);
        break;
    case GGUF_TYPE_BOOL:
        fputs(v->v.u64 ? "true" : "false", fp);
        break;
    case GGUF_TYPE_STRING:
        gguf__print_str(fp, v->v.str.ptr, v->v.str.len);
        break;
    default:
        gguf__print_value(fp, v);
        break;
    }
}

/* Writes "array[TYPE; N] [e0, e1, ...]" recursively. */
static void gguf__print_value(FILE *fp, const gguf_value *v) {
    if (v->type != GGUF_TYPE_ARRAY) {
        gguf__print_scalar(fp, v);
        return;
    }
    uint32_t et = v->v.arr.elem_type;
    uint64_t n = v->v.arr.n, shown = n < GGUF__PRINT_ITEMS ? n : GGUF__PRINT_ITEMS;
    fputc('[', fp);
    for (uint64_t i = 0; i < shown; i++) {
        if (i) fputs(", ", fp);
        if (v->v.arr.items) {
            const gguf_value *it = &v->v.arr.items[i];
            if (it->type == GGUF_TYPE_ARRAY)
                fprintf(fp, "array[%s; %llu] ", gguf_type_name(it->v.arr.elem_type),
                        (unsigned long long)it->v.arr.n);
            gguf__print_value(fp, it);
        } else {
            gguf_value e;
            gguf__decode_scalar(et, (const uint8_t *)v->v.arr.raw + i * gguf__type_size(et), &e);
            gguf__print_scalar(fp, &e);
        }
    }
    if (shown < n) fprintf(fp, ", ... (%llu more)", (unsigned long long)(n - shown));
    fputc(']', fp);
}

void gguf_print(const gguf_file *f, void *fpv) {
    FILE *fp = fpv;
    fprintf(fp, "file:        %s\n", gguf_path(f));
    fprintf(fp, "size:        %llu bytes\n", (unsigned long long)gguf_file_size(f));
    fprintf(fp, "version:     %u\n", gguf_version(f));
    fprintf(fp, "alignment:   %llu\n", (unsigned long long)gguf_alignment(f));
    fprintf(fp, "kv count:    %llu\n", (unsigned long long)gguf_n_kv(f));
    fprintf(fp, "tensors:     %llu\n", (unsigned long long)gguf_n_tensors(f));
    fprintf(fp, "data offset: %llu\n", (unsigned long long)gguf_data_offset(f));

    fprintf(fp, "\nmetadata:\n");
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        const gguf_value *v = &kv->value;
        char type[48];
        if (v->type == GGUF_TYPE_ARRAY)
            snprintf(type, sizeof type, "array[%s; %llu]", gguf_type_name(v->v.arr.elem_type),
                     (unsigned long long)v->v.arr.n);
        else
            snprintf(type, sizeof type, "%s", gguf_type_name(v->type));
        char name[256];
        fprintf(fp, "  %-44s %-20s = ", gguf__name(name, sizeof name, kv->key), type);
        gguf__print_value(fp, v);
        fputc('\n', fp);
    }

    fprintf(fp, "\ntensors:\n");
    fprintf(fp, "  %-40s %-7s %-26s %12s %12s\n", "name", "type", "shape", "offset", "bytes");
    uint64_t total_bytes = 0, total_elems = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char shape[96];
        int o = snprintf(shape, sizeof shape, "[");
        for (uint32_t d = 0; d < t->n_dims && o > 0 && (size_t)o < sizeof shape; d++)
            o += snprintf(shape + o, sizeof shape - (size_t)o, "%s%lld", d ? ", " : "",
                          (long long)t->ne[d]);
        if (o > 0 && (size_t)o < sizeof shape) snprintf(shape + o, sizeof shape - (size_t)o, "]");
        char name[300];
        fprintf(fp, "  %-40s %-7s %-26s %12llu %12llu\n", gguf__name(name, sizeof name, t->name),
                ks_dtype_name(t->type), shape, (unsigned long long)t->offset,
                (unsigned long long)t->n_bytes);
        total_bytes += t->n_bytes;
        total_elems += t->n_elems;
    }
    fprintf(fp, "  total: %llu tensors, %llu elements, %llu bytes\n",
            (unsigned long long)gguf_n_tensors(f), (unsigned long long)total_elems,
            (unsigned long long)total_bytes);
}
