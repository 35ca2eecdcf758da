/* serve_common.c — what `kvseal serve`, `check`, serve with several
 * models (serve_models.c) and the cluster roles (cmd_cluster.c) share:
 * sizes, the engine options and pool sizing, the model's name, starting the
 * HTTP front, and running it until a signal (with the drain). */
#include "cli_int.h"

#include "kvseal/engine.h"
#include "kvseal/server.h"

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>

bool serve__parse_bytes(const char *v, uint64_t *out) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || !(x > 0)) return false;
    double mul = 1;
    if (*end) {
        switch (*end) {
        case 'k':
        case 'K':
            mul = 1024.0;
            break;
        case 'm':
        case 'M':
            mul = 1048576.0;
            break;
        case 'g':
        case 'G':
            mul = 1073741824.0;
            break;
        case 't':
        case 'T':
            mul = 1099511627776.0;
            break;
        default:
            return false;
        }
        end++;
        if (*end == 'i') end++;
        if (*end == 'B' || *end == 'b') end++;
        if (*end) return false;
    }
    x *= mul;
    if (x > 1.8e19) return false;
    *out = (uint64_t)x;
    return true;
}

uint64_t serve__mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

/* Loads nothing; fills o from c and m, sizing the pool. Prints how it was
 * sized to stderr. */
void serve__engine_opts(const serve__cfg *c, const model *m, engine_opts *o) {
    engine_opts_default(o);
    o->m = m;
    o->n_ctx = c->ctx ? (int32_t)c->ctx : model_hp(m)->n_ctx_train;
    o->page_tokens = (int)c->page_tokens;
    if (c->threads) o->n_threads = (int)c->threads;
    o->max_running = (int32_t)c->max_running;
    o->queue_max = (int32_t)c->queue_max;
    o->queue_timeout_ms = (uint32_t)c->queue_timeout_ms;
    o->max_batch_tokens = (int32_t)c->batch;
    o->spec_tokens = (int32_t)c->spec_tokens;
    o->spec_ngram_min = (int32_t)c->spec_ngram_min;
    o->spec_ngram_max = (int32_t)c->spec_ngram_max;
    o->spec_max_batch = (int32_t)c->spec_max_batch;
    o->grammar_budget_us = (uint64_t)c->grammar_budget_ms * 1000;
    o->grammar_cpu_us = (uint64_t)c->grammar_cpu_ms * 1000;
    o->prefix_cache = !c->no_prefix_cache;
    o->scrub = c->scrub;
    o->kv_type = c->kv_type;
    o->pooling = (model_pooling)c->pooling;
    kv_geom g = model_kv_geom(m, o->page_tokens, o->kv_type);
    // pages of one full-context sequence: its KV, and its recurrent state (hybrid models)
    uint64_t ctx_pages =
        ((uint64_t)o->n_ctx + (uint64_t)o->page_tokens - 1) / (uint64_t)o->page_tokens +
        (uint64_t)(g.state_pages > 0 ? g.state_pages : 0);
    if (c->kv_pages) {
        o->kv_pages = (uint32_t)c->kv_pages;
    } else if (c->kv_memory) {
        o->kv_pages = kv_pages_for_bytes(&g, c->kv_memory);
    } else {
        uint64_t avail = serve__mem_available();
        uint64_t pages = kv_pages_for_bytes(&g, avail / 4);
        if (pages > 8 * ctx_pages) pages = 8 * ctx_pages;
        if (pages < ctx_pages) {
            ks_log(KS_LOG_WARN,
                   "25%% of MemAvailable (%.0f MiB) holds less than one context; "
                   "sizing the pool to exactly one context",
                   (double)avail / 4 / 1048576.0);
            pages = ctx_pages;
        }
        if (pages > UINT32_MAX) pages = UINT32_MAX;
        o->kv_pages = (uint32_t)pages;
        ks_log(KS_LOG_INFO,
               "kv pool sized from MemAvailable %.0f MiB: %u pages (%.1fx the context)",
               (double)avail / 1048576.0, o->kv_pages, (double)o->kv_pages / (double)ctx_pages);
    }
    o->prefix_max_pages = o->kv_pages / 4;
    if (o->n_ctx > model_hp(m)->n_ctx_train)
        ks_log(KS_LOG_WARN, "--ctx %d exceeds the model's training context %d", o->n_ctx,
               model_hp(m)->n_ctx_train);
}

/* The model's own name: the file's basename without ".gguf". */
void serve__model_name(const char *path, char *buf, size_t cap) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 5 && !strcasecmp(b + n - 5, ".gguf")) n -= 5;
    snprintf(buf, cap, "%.*s", (int)n, b);
}

ks_err serve__http_start(const serve__cfg *c, int32_t n_ctx, const char *name, const server_backend *be,
                         const model *m, const server_model *more, int n_more, server **s,
                         ks_errbuf *eb) {
    server_opts so;
    server_opts_default(&so);
    so.host = c->host;
    so.port = (int)c->port;
    so.aliases = c->aliases;
    so.n_aliases = c->n_aliases;
    so.cors_origins = c->cors;
    so.n_cors_origins = c->n_cors;
    so.model_name = name;
    so.tenants_path = c->tenants;
    so.chat_template_file = c->chat_template_file;
    so.admin_key = c->admin_key;
    so.metrics_key = c->metrics_key;
    so.limits_redis = c->limits_redis;
    so.limits_redis_prefix = c->limits_redis_prefix;
    so.limits_local_share = c->limits_local_share;
    so.embed_max_tokens = (int32_t)c->embed_max_tokens;
    so.responses_ttl_s = (uint64_t)c->responses_ttl;
    so.responses_max = (size_t)c->responses_max;
    so.responses_max_bytes = (size_t)c->responses_max_bytes;
    so.max_adapter_bytes = (size_t)c->max_adapter_mb << 20;
    so.log_content = c->log_content;
    so.n_ctx = n_ctx;
    so.idle_timeout_s = (unsigned)c->idle_timeout;
    so.request_timeout_s = (unsigned)c->request_timeout;
    so.max_connections = (unsigned)c->max_conns;
    so.max_connections_per_ip = (unsigned)c->max_conns_per_ip;
    so.tool_call_format = c->tool_call_format;
    so.reasoning_format = c->reasoning_format;
    so.more = more;
    so.n_more = n_more;
    so.tls_cert_pem = c->tls_cert_pem;
    so.tls_key_pem = c->tls_key_pem;
    // room for every connection: raise the soft descriptor limit toward the hard one
    struct rlimit rl;
    rlim_t want = (rlim_t)so.max_connections + 256;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < want) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < want)
            ks_log(KS_LOG_WARN, "open-file limit %llu is below --max-connections %u + 256",
                   (unsigned long long)rl.rlim_cur, so.max_connections);
    }
    ks_err e = server_create_backend(&so, be, m, s, eb);
    if (e) return e;
    bool v6 = strchr(c->host, ':') != NULL;
    const char *scheme = c->tls_cert_pem ? "https" : "http";
    printf("listening on %s://%s%s%s:%d\n", scheme, v6 ? "[" : "", c->host, v6 ? "]" : "",
           server_port(*s));
    fflush(stdout);
    // the port is bound and the model loaded: a Type=notify unit is up
    cli__notify("READY=1\nSTATUS=serving %s on %s://%s%s%s:%d", name, scheme, v6 ? "[" : "",
                c->host, v6 ? "]" : "", server_port(*s));
    return KS_OK;
}

/* serve__run_until_signal's graceful part: returns once nothing is in
 * flight, timeout_ms has passed or a second signal came. */
static void serve__drain(server *s, const sigset_t *sigs, long timeout_ms) {
    server_drain(s);
    if (timeout_ms <= 0 || server_inflight(s) == 0) return;
    ks_log(KS_LOG_INFO, "draining %d request(s) for up to %ld ms (signal again to abort them)",
           server_inflight(s), timeout_ms);
    uint64_t deadline = ks_now_ns() + (uint64_t)timeout_ms * 1000000u;
    const struct timespec tick = {0, 20 * 1000 * 1000};
    while (server_inflight(s) > 0) {
        if (ks_now_ns() >= deadline) {
            ks_log(KS_LOG_WARN, "drain timeout: aborting %d request(s)", server_inflight(s));
            return;
        }
        if (sigtimedwait(sigs, NULL, &tick) > 0) {
            ks_log(KS_LOG_WARN, "second signal: aborting %d request(s)", server_inflight(s));
            return;
        }
    }
    ks_log(KS_LOG_INFO, "drained: every request finished");
}

void serve__run_until_signal(server *s, const server_backend *be, const sigset_t *sigs,
                             long drain_ms) {
    int sig = 0;
    while (sigwait(sigs, &sig) != 0) {
    }
    ks_log(KS_LOG_INFO, "signal %d: shutting down", sig);
    cli__notify("STOPPING=1\nSTATUS=draining %d request(s)", server_inflight(s));
    serve__drain(s, sigs, drain_ms);
    server_stop_accepting(s);
    be->set_online(be->impl, false, true);  // abort what is left: answers end now
}

void serve__block_signals(sigset_t *sigs) {
    sigemptyset(sigs);
    sigaddset(sigs, SIGINT);
    sigaddset(sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
}
