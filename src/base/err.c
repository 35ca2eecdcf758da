/* err.c — the ks_err table, error buffers, assertions and logging.
 *
 * The enum, its names and messages all come from KS_ERR_MAP in base.h, so
 * they cannot drift apart. Logging writes single lines to stderr. */
#include "kvseal/base.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
// Logging

static atomic_int ks__log_level = KS_LOG_INFO;

void ks_log_set_level(ks_log_level lvl) {
    atomic_store_explicit(&ks__log_level, (int)lvl, memory_order_relaxed);
}

void ks_log_init_env(void) {
    const char *s = getenv("KS_LOG");
    if (!s) return;
    static const char *names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i < 5; i++)
        if (strcmp(s, names[i]) == 0) ks_log_set_level((ks_log_level)i);
}

void ks_log(ks_log_level lvl, const char *fmt, ...) {
    if ((int)lvl < atomic_load_explicit(&ks__log_level, memory_order_relaxed)) return;
    static const char *tags[] = {"debug", "info", "warn", "error", "off"};
    char line[1024];
    int n = snprintf(line, sizeof line, "kvseal %s: ", tags[lvl < 0 || lvl > 4 ? 4 : lvl]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    // one fputs per line keeps lines whole when threads log concurrently
    size_t len = strlen(line);
    if (len + 1 < sizeof line) {
        line[len] = '\n';
        line[len + 1] = '\0';
    }
    fputs(line, stderr);
}
