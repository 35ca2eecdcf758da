/* err.c — the ks_err table, error buffers, assertions and logging.
 *
 * The enum, its names and messages all come from KS_ERR_MAP in base.h, so
 * they cannot drift apart. Logging writes single lines to stderr, as text
 * or JSON, each with an RFC 3339 UTC timestamp. */
#include "kvseal/base.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *ks_err_name(ks_err e) {
    switch (e) {
    case KS_OK: return "KS_OK";
#define KS__ERR_NAME(name, msg) case KS_ERR_##name: return "KS_ERR_" #name;
        KS_ERR_MAP(KS__ERR_NAME)
#undef KS__ERR_NAME
    default: return "KS_ERR_?";
    }
}

const char *ks_strerror(ks_err e) {
    switch (e) {
    case KS_OK: return "ok";
#define KS__ERR_MSG(name, msg) case KS_ERR_##name: return msg;
        KS_ERR_MAP(KS__ERR_MSG)
#undef KS__ERR_MSG
    default: return "unknown error";
    }
}

ks_err ks_seterr(ks_errbuf *eb, ks_err code, const char *fmt, ...) {
    if (eb) {
        va_list ap;
        va_start(ap, fmt);
        eb->code = code;
        eb->reason = 0;
        vsnprintf(eb->msg, sizeof eb->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

void ks_errbuf_clear(ks_errbuf *eb) {
    if (!eb) return;
    eb->code = KS_OK;
    eb->reason = 0;
    eb->msg[0] = '\0';
}

_Noreturn void ks__assert_fail(const char *file, int line, const char *expr) {
    fprintf(stderr, "kvseal: assertion failed at %s:%d: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}

// ----------------------------------------------------------------------------
// Logging: one line per call, built in a stack buffer and written with one
// fputs so that lines from concurrent threads never interleave. The json
// format escapes the message itself (base links no JSON library).

static atomic_int ks__log_level = KS_LOG_INFO;
static atomic_int ks__log_format = KS_LOG_TEXT;
static const char *const ks__log_names[] = {"debug", "info", "warn", "error", "off"};

void ks_log_set_level(ks_log_level lvl) {
    atomic_store_explicit(&ks__log_level, (int)lvl, memory_order_relaxed);
}

void ks_log_set_format(ks_log_format fmt) {
    atomic_store_explicit(&ks__log_format, (int)fmt, memory_order_relaxed);
}

ks_log_format ks_log_get_format(void) {
    return (ks_log_format)atomic_load_explicit(&ks__log_format, memory_order_relaxed);
}

bool ks_log_level_parse(const char *s, ks_log_level *out) {
    for (int i = 0; s && i < 5; i++)
        if (strcmp(s, ks__log_names[i]) == 0) {
            *out = (ks_log_level)i;
            return true;
        }
    return false;
}

bool ks_log_format_parse(const char *s, ks_log_format *out) {
    if (s && !strcmp(s, "text"))
        *out = KS_LOG_TEXT;
    else if (s && !strcmp(s, "json"))
        *out = KS_LOG_JSON;
    else
        return false;
    return true;
}

void ks_log_init_env(void) {
    ks_log_level l;
    if (ks_log_level_parse(getenv("KS_LOG"), &l)) ks_log_set_level(l);
}

size_t ks_log_timestamp(char *buf, size_t cap) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n =
        snprintf(buf, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                 tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

/* Appends s as a JSON string body (no quotes) to line[*n..cap), escaping
 * quotes, backslashes and control bytes; stops short rather than overflow. */
static void ks__json_escape(char *line, size_t cap, size_t *n, const char *s) {
    for (; *s && *n + 8 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            line[(*n)++] = '\\';
            line[(*n)++] = (char)c;
        } else if (c == '\n') {
            line[(*n)++] = '\\';
            line[(*n)++] = 'n';
        } else if (c < 0x20) {
            *n += (size_t)snprintf(line + *n, cap - *n, "\\u%04x", c);
        } else {
            line[(*n)++] = (char)c;
        }
    }
    line[*n] = '\0';
}

static void ks__log_v(ks_log_level lvl, const char *fields, const char *fmt, va_list ap) {
    if ((int)lvl < atomic_load_explicit(&ks__log_level, memory_order_relaxed)) return;
    const char *name = ks__log_names[lvl < 0 || lvl > 4 ? 4 : lvl];
    char msg[1024], ts[32], line[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    ks_log_timestamp(ts, sizeof ts);
    size_t n;
    if (atomic_load_explicit(&ks__log_format, memory_order_relaxed) == KS_LOG_JSON) {
        n = (size_t)snprintf(line, sizeof line, "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":\"", ts,
                             name);
        ks__json_escape(line, sizeof line, &n, msg);
        // the fields object's members, without its braces, follow msg
        const char *f = fields ? strchr(fields, '{') : NULL, *e = f ? strrchr(f, '}') : NULL;
        if (f) f++;
        while (f && f < e && (*f == ' ' || *f == '\n' || *f == '\t'))
            f++;
        size_t flen = f && e > f ? (size_t)(e - f) : 0;
        if (flen && n + flen + 8 < sizeof line) {
            line[n++] = '"';
            line[n++] = ',';
            memcpy(line + n, f, flen);
            n += flen;
            line[n++] = '}';
        } else {
            line[n++] = '"';
            line[n++] = '}';
        }
        line[n] = '\0';
    } else {
        int k = snprintf(line, sizeof line - 2, "%s kvseal %s: %s", ts, name, msg);
        n = k < 0 ? 0 : (size_t)k < sizeof line - 2 ? (size_t)k : sizeof line - 3;
    }
    line[n] = '\n';
    line[n + 1] = '\0';
    fputs(line, stderr);
}

void ks_log(ks_log_level lvl, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ks__log_v(lvl, NULL, fmt, ap);
    va_end(ap);
}

void ks_log_fields(ks_log_level lvl, const char *fields, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ks__log_v(lvl, fields, fmt, ap);
    va_end(ap);
}
