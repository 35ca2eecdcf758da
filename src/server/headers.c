/* headers.c — the pure parts of the answer headers every route carries:
 * CORS (which origins, which requested headers a preflight allows), the
 * x-request-id (a client's kept when sane, else a new random one) and the
 * Retry-After estimate for a busy queue. http.c's srv__decorate puts them
 * on each answer; the tenant buckets behind x-ratelimit-* are tenants.c's.
 * Operator's view: docs/api.md "CORS, request ids, rate-limit headers", docs/metrics.md. */
#include "server_int.h"

#include <ctype.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

// ----------------------------------------------------------------------------
// CORS

bool server_cors_origin_valid(const char *o) {
    if (!o) return false;
    if (!strcmp(o, "*")) return true;
    size_t n = strlen(o);
    if (n == 0 || n > 255) return false;
    const char *host;
    if (!strncasecmp(o, "http://", 7))
        host = o + 7;
    else if (!strncasecmp(o, "https://", 8))
        host = o + 8;
    else
        return false;
    if (!*host) return false;
    for (const char *p = host; *p; p++)
        if (*p <= 0x20 || *p >= 0x7f || *p == '/' || *p == '?' || *p == '#' || *p == ',' ||
            *p == '*')
            return false;
    return true;
}

bool srv_cors_origin_ok(const char *const *origins, int n, const char *origin) {
    if (!origin || !*origin) return false;
    for (int i = 0; i < n; i++)
        if (!strcmp(origins[i], "*") || !strcasecmp(origins[i], origin)) return true;
    return false;
}

/* Request headers a browser may send cross-origin to these routes: auth,
 * JSON bodies, the Anthropic and OpenAI SDKs' own headers. */
static bool srv__cors_header_ok(const char *h, size_t n) {
    static const char *const exact[] = {
        "authorization",
        "content-type",
        "x-api-key",
        "anthropic-version",
        "anthropic-beta",
        "x-request-id",
        "accept",
        "accept-language",
        "content-language",
        "cache-control",
        "anthropic-dangerous-direct-browser-access",
    };
    static const char *const prefix[] = {"openai-", "x-stainless-"};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        if (strlen(exact[i]) == n && !strncasecmp(exact[i], h, n)) return true;
    for (size_t i = 0; i < sizeof prefix / sizeof prefix[0]; i++) {
        size_t k = strlen(prefix[i]);
        if (n > k && !strncasecmp(prefix[i], h, k)) return true;
    }
    return false;
}

size_t srv_cors_allow_headers(const char *requested, char *out, size_t cap) {
    size_t len = 0;
    if (cap) out[0] = '\0';
    if (!requested || !cap) return 0;
    const char *p = requested;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        const char *start = p;
        while (*p && *p != ',')
            p++;
        const char *end = p;
        while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        size_t n = (size_t)(end - start);
        bool token = n > 0;
        for (size_t i = 0; i < n && token; i++)
            token = isalnum((unsigned char)start[i]) || start[i] == '-' || start[i] == '_';
        if (!token || !srv__cors_header_ok(start, n)) continue;
        size_t need = (len ? 2 : 0) + n;
        if (len + need + 1 > cap) break; // what fits; the browser refuses the rest
        if (len) out[len++] = ',', out[len++] = ' ';
        for (size_t i = 0; i < n; i++)
            out[len++] = (char)tolower((unsigned char)start[i]);
        out[len] = '\0';
    }
    return len;
}

// ----------------------------------------------------------------------------
// Request ids

bool srv_request_id_ok(const char *v) {
    if (!v) return false;
    size_t n = 0;
    for (; v[n]; n++)
        if ((unsigned char)v[n] < 0x21 || (unsigned char)v[n] > 0x7e || n >= SRV_REQUEST_ID_MAX)
            return false;
    return n > 0 && n < SRV_REQUEST_ID_MAX;
}

static bool hdr__log_plain(unsigned char c) {
    return isalnum(c) || (c && strchr("-._~:/@+,", c));
}

size_t srv_log_value(const char *v, char *out, size_t cap) {
    if (!cap) return 0;
    if (!v) v = "";
    bool plain = *v != '\0';
    for (const char *p = v; *p && plain; p++)
        plain = hdr__log_plain((unsigned char)*p);
    size_t n = 0;
    if (plain) {
        n = strlen(v);
        if (n > cap - 1) n = cap - 1;
        memcpy(out, v, n);
        out[n] = '\0';
        return n;
    }
    if (cap < 3) {
        out[0] = '\0';
        return 0;
    }
    out[n++] = '"';
    for (const char *p = v; *p; p++) {
        unsigned char c = (unsigned char)*p;
        char esc[5];
        size_t k;
        if (c == '"' || c == '\\')
            esc[0] = '\\', esc[1] = (char)c, k = 2;
        else if (c < 0x20 || c > 0x7e)
            k = (size_t)snprintf(esc, sizeof esc, "\\x%02x", c);
        else
            esc[0] = (char)c, k = 1;
        if (n + k + 1 >= cap) break; // room for the closing quote and the NUL
        memcpy(out + n, esc, k);
        n += k;
    }
    out[n++] = '"';
    out[n] = '\0';
    return n;
}

void srv_request_id_new(char *buf, size_t cap) {
    uint8_t r[16];
    randombytes_buf(r, sizeof r);
    size_t k = 0;
    for (size_t i = 0; i < sizeof r && k + 2 < cap; i++, k += 2)
        snprintf(buf + k, cap - k, "%02x", r[i]);
    if (cap) buf[k < cap ? k : cap - 1] = '\0';
}

// ----------------------------------------------------------------------------
// Retry-After for a busy queue

int64_t srv_queue_retry_s(double mean_e2e_s, uint32_t n_queued, uint32_t n_running) {
    if (!(mean_e2e_s > 0)) return 1; // nothing measured yet
    double s = mean_e2e_s * ((double)n_queued + 1.0) / (double)(n_running ? n_running : 1);
    if (s > SRV_QUEUE_RETRY_MAX_S) s = SRV_QUEUE_RETRY_MAX_S;
    return srv_retry_after_s(s);
}
