/* health_http.c — a prefill or decode worker's optional health endpoint
 * (`--health-port`), for orchestrators' probes (deploy/k8s): GET /health is
 * liveness (200 while the worker's loop turns), GET /ready is readiness (200
 * only while registered with the router and not draining; else 503 with a
 * one-line reason). Plain text, no authentication: it tells nothing but
 * those states.
 *
 * Threading: libmicrohttpd answers on a thread of its own; the worker's loop
 * thread reports its state with cl_health_beat (atomics only), so a probe
 * never touches the worker's data and a stuck loop shows as a stale beat. */
#include "cluster_int.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* A loop that has not turned for this long is not live: /health 503 (an
 * orchestrator restarts the worker). Far above any pause of a working
 * loop (a decode step, a prompt chunk: well under a second). */
#define CL_HEALTH_STALL_MS 30000u

struct cl_health {
    struct MHD_Daemon *d;
    int port;                 /* the bound port */
    uint64_t stall_ms;        /* no beat for longer: not live */
    uint64_t start_ms;        /* cl_now_ms at start */
    _Atomic uint64_t beat_ms; /* last cl_health_beat (0: none yet); written by the loop */
    atomic_bool registered;   /* as of the last beat */
    atomic_bool draining;     /* as of the last beat */
};

/* The state as /health (ready false) or /ready (ready true) sees it: NULL
 * when it is 200, else the one-line reason for the 503. */
static const char *health__verdict(cl_health *h, bool ready, char *buf, size_t cap) {
    uint64_t now = cl_now_ms(NULL);
    uint64_t beat = atomic_load_explicit(&h->beat_ms, memory_order_acquire);
    uint64_t since = beat ? beat : h->start_ms;
    if (now > since && now - since > h->stall_ms) {
        snprintf(buf, cap, "the worker's loop has not run for %llu ms",
                 (unsigned long long)(now - since));
        return buf;
    }
    if (!ready) return NULL;
    if (!beat) return "starting";
    if (atomic_load_explicit(&h->draining, memory_order_relaxed)) return "draining";
    if (!atomic_load_explicit(&h->registered, memory_order_relaxed))
        return "not registered with the router";
    return NULL;
}

static enum MHD_Result health__answer(struct MHD_Connection *c, unsigned status, const char *text) {
    char body[256];
    snprintf(body, sizeof body, "%s\n", text);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    (void)MHD_add_response_header(r, "Content-Type", "text/plain; charset=utf-8");
    (void)MHD_add_response_header(r, "Cache-Control", "no-store");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result health__access(void *cls, struct MHD_Connection *c, const char *url,
                                      const char *method, const char *version, const char *upload,
                                      size_t *upload_len, void **con_cls) {
    (void)version;
    (void)upload;
    cl_health *h = cls;
    if (!*con_cls) { // first call: headers only; answer on the next
        *con_cls = h;
        return MHD_YES;
    }
    if (*upload_len) { // a body is not for us: drop it
        *upload_len = 0;
        return MHD_YES;
    }
    bool health = !strcmp(url, "/health"), ready = !strcmp(url, "/ready");
    if (!health && !ready) return health__answer(c, MHD_HTTP_NOT_FOUND, "not found");
    if (strcmp(method, "GET") && strcmp(method, "HEAD"))
        return health__answer(c, MHD_HTTP_METHOD_NOT_ALLOWED, "GET only");
    char buf[128];
    const char *why = health__verdict(h, ready, buf, sizeof buf);
    return why ? health__answer(c, MHD_HTTP_SERVICE_UNAVAILABLE, why)
               : health__answer(c, MHD_HTTP_OK, ready ? "ready" : "ok");
}

static void health__mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && buf[n - 1] == '\n')
        buf[--n] = '\0';
    ks_log(KS_LOG_WARN, "health endpoint: %s", buf);
}

ks_err cl_health_start(const char *host, int port, uint32_t stall_ms, cl_health **out,
                       ks_errbuf *eb) {
    *out = NULL;
    if (!host || port < 0 || port > 65535)
        return ks_seterr(eb, KS_ERR_INVAL,
                         "health endpoint: a host and a port (0-65535) are needed");
    cl_health *h = calloc(1, sizeof *h);
    if (!h) return ks_seterr(eb, KS_ERR_NOMEM, "health endpoint: out of memory");
    h->start_ms = cl_now_ms(NULL);
    h->stall_ms = stall_ms ? stall_ms : CL_HEALTH_STALL_MS;
    atomic_init(&h->beat_ms, 0);
    atomic_init(&h->registered, false);
    atomic_init(&h->draining, false);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int gai = getaddrinfo(host, ps, &hints, &ai);
    if (gai != 0 || !ai) {
        free(h);
        return ks_seterr(eb, KS_ERR_INVAL, "health endpoint: cannot resolve '%s': %s", host,
                         gai_strerror(gai));
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    // probes are few and short: a small connection cap and a short idle timeout
    h->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, health__access, h,
                            MHD_OPTION_EXTERNAL_LOGGER, health__mhd_log, h, MHD_OPTION_SOCK_ADDR,
                            ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT, 32u,
                            MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    int bind_errno = errno;
    freeaddrinfo(ai);
    if (!h->d) {
        free(h);
        return ks_seterr(eb, KS_ERR_IO, "health endpoint: cannot listen on %s:%d: %s", host, port,
                         strerror(bind_errno));
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : port;
    printf("health on http://%s%s%s:%d\n", strchr(host, ':') ? "[" : "", host,
           strchr(host, ':') ? "]" : "", h->port);
    fflush(stdout);
    *out = h;
    return KS_OK;
}

void cl_health_beat(cl_health *h, bool registered, bool draining) {
    if (!h) return;
    atomic_store_explicit(&h->registered, registered, memory_order_relaxed);
    atomic_store_explicit(&h->draining, draining, memory_order_relaxed);
    uint64_t now = cl_now_ms(NULL);
    // release: a probe that sees this beat sees the two states above
    atomic_store_explicit(&h->beat_ms, now ? now : 1, memory_order_release);
}

int cl_health_port(const cl_health *h) { return h->port; }

void cl_health_destroy(cl_health *h) {
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}
