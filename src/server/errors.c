/* errors.c — the server's floor below: the error builders (srv_refuse,
 * srv_fail) and the small helpers every server file uses (srv_buf, ids,
 * JSON kind names). It calls no other server file, so parsers, answers and
 * the HTTP front can all lean on it without calling each other in a loop. */
#include "server_int.h"

#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Errors

/* Length of the valid UTF-8 sequence at s (strict, as jansson checks it: no
 * overlongs, surrogates or code points past U+10FFFF), or 0 if none starts
 * there. s is NUL-terminated, so reading stops at the NUL. */
static size_t err__utf8_len(const unsigned char *s) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
    if (c >= 0xc2 && c <= 0xdf) n = 2;
    else if (c >= 0xe0 && c <= 0xef) n = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4) n = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    else return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    return n;
}

/* Fills the message part of e (cut to fit, made valid UTF-8). */
static void err__error_msg(srv_error *e, const char *param, const char *fmt, va_list ap) {
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    // The message may quote what the client sent (a model name from the URL
    // is any bytes) and may have been cut inside a character; JSON strings
    // must be UTF-8, or srv_error_json fails and the client gets a 500.
    for (unsigned char *p = (unsigned char *)e->msg; *p;) {
        size_t n = err__utf8_len(p);
        if (n == 0) *p++ = '?';
        else p += n;
    }
}

bool srv_refuse(srv_error *e, admit_reason r, const char *param, const char *fmt, ...) {
    const admit_info *in = admit_reason_info(r);
    e->status = in->http_status;
    e->type = in->type;
    e->code = in->code;
    e->workers_code = in->workers_code;
    // a failure after admission (the table's ADMIT_FAILURE rows) is no refusal
    e->reason = admit_reason_is_refusal(r)             ? r
                : r > ADMIT_OK && r < ADMIT__COUNT ? ADMIT_OK
                                                   : ADMIT_INTERNAL;
    if (!fmt) {
        snprintf(e->param, sizeof e->param, "%s", param ? param : "");
        snprintf(e->msg, sizeof e->msg, "%s", in->msg);
        return false;
    }
    va_list ap;
    va_start(ap, fmt);
    err__error_msg(e, param, fmt, ap);
    va_end(ap);
    return false;
}

bool srv_fail(srv_error *e, int status, const char *code, const char *fmt, ...) {
    e->status = status;
    e->type = status >= 500 ? "server_error" : "invalid_request_error";
    e->code = code;
    e->workers_code = (uint16_t)status;
    e->reason = ADMIT_OK;
    va_list ap;
    va_start(ap, fmt);
    err__error_msg(e, NULL, fmt, ap);
    va_end(ap);
    return false;
}

// ----------------------------------------------------------------------------
// Buffers, ids, names

void srv_make_id(const char *prefix, char *buf, size_t cap) {
    unsigned char rnd[12];
    randombytes_buf(rnd, sizeof rnd);
    char hex[2 * sizeof rnd + 1];
    sodium_bin2hex(hex, sizeof hex, rnd, sizeof rnd);
    snprintf(buf, cap, "%s%s", prefix, hex);
}

bool srv_buf_add(srv_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}

void srv_buf_free(srv_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

const char *srv_json_type(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "object";
    case JSON_ARRAY:
        return "array";
    case JSON_STRING:
        return "string";
    case JSON_INTEGER:
        return "integer";
    case JSON_REAL:
        return "number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "boolean";
    default:
        return "null";
    }
}

const char *srv_json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}
