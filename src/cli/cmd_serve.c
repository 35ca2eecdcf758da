/* cmd_serve.c — `kvseal serve` (the HTTP server) and `kvseal check` (the
 * deploy-time pool sizing check, I8, without starting anything).
 *
 * Both size the KV pool the same way: --kv-pages or --kv-memory when given,
 * else from free memory (at most a quarter of MemAvailable), aiming at 8x
 * the context and never below 1x. Both print engine_capacity_check's
 * arithmetic; serve refuses to start (exit 1) when one request of the
 * advertised context cannot fit and warns below 2x. serve prints one line
 * "listening on http://HOST:PORT" to stdout once bound, then waits for
 * SIGTERM/SIGINT, drains (new requests get 503, running ones finish, up to
 * --drain-timeout-ms), aborts what is left and exits 0 after freeing all. */
#include "cli_int.h"

#include "kvseal/engine.h"
#include "kvseal/kern.h"
#include "kvseal/server.h"

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>



void serve__usage(const char *cmd) {
    fprintf(
        stderr,
        "usage: kvseal %s [-m MODEL] [--host 127.0.0.1] [--port 8080 (0: any free port)]\n"
        "         [--alias NAME]... [--ctx N] [--kv-pages N | --kv-memory BYTES (512M, 4G)]\n"
        "         [--page-tokens 16] [--kv-type f32|f16|q8_0 (f16)] [--threads N]\n"
        "         [--batch-tokens 256] [--max-running 16]\n"
        "         [--queue-max 64] [--queue-timeout-ms 30000] [--no-prefix-cache]\n"
        "         [--scrub zero|poison] [--tenants FILE] [--admin-key KEY] [--log-content]\n"
        "         [--security-log FILE] [--idle-timeout SECONDS (120)] [--drain-timeout-ms 30000]\n"
        "         [--request-timeout SECONDS (10)] [--max-connections 4096]\n"
        "         [--max-connections-per-ip 256 (0: no limit)] [--chat-template-file FILE]\n"
        "         [--tool-call-format auto|none|NAME] [--reasoning-format auto|none|deepseek]\n"
        "         [--pooling mean|last]\n"
        "  --pooling: how POST /v1/embeddings pools the final hidden state (default: the\n"
        "  GGUF's <arch>.pooling_type when mean or last, else mean); on prefill workers too.\n"
        "         [--cors-origin ORIGIN|'*']... (browsers; off by default: no CORS headers)\n"
        "  --tool-call-format: how the model writes tool calls (auto: from the chat template;\n"
        "  NAME: %s). --reasoning-format deepseek splits the text between think markers into\n"
        "  reasoning_content (auto: when the template has them; none: it stays content).\n"
        "  --ctx defaults to the model's training context. Without --kv-pages/--kv-memory the\n"
        "  pool takes at most 25%% of MemAvailable, between 1x and 8x the context.\n"
        "  --kv-type: the KV cache element type (f16 and q8_0 hold 2x and ~3.8x the tokens of\n"
        "  f32 in the same memory; q8_0 needs head_dim %% 32 == 0). Every node of a cluster\n"
        "  must use the same one.\n"
        "  Without --tenants there is one anonymous tenant and no API key is required.\n"
        "  Chat requests render the model's Jinja tokenizer.chat_template (its .tool_use\n"
        "  variant for requests with tools), or --chat-template-file's; a template that\n"
        "  cannot render stops the server at startup. No template: the plain format.\n"
        "  On SIGTERM/SIGINT serve (and router) drain: new requests get 503 and /health 503,\n"
        "  running ones finish for up to --drain-timeout-ms (0: abort at once); a second\n"
        "  signal aborts them.\n"
        "disaggregated serving (docs/pd-protocol.md); every node reads the same secret file\n"
        "(>= 16 bytes, mode 600):\n"
        "  kvseal router  [the options above] --secret-file FILE [--cluster-host 127.0.0.1]\n"
        "                 [--cluster-port 7070 (0: any)] [--health-interval-ms 1000]\n"
        "  kvseal prefill [-m MODEL] --router HOST:PORT --secret-file FILE [--ctx N] [--kv-pages "
        "N]\n"
        "                 [--threads N] [--batch-tokens 256] [--page-tokens 16] [--scrub "
        "zero|poison]\n"
        "                 [--kv-type f32|f16|q8_0] [--no-prefix-cache] [--drain-timeout-ms 30000]\n"
        "  kvseal decode  [-m MODEL] --router HOST:PORT --secret-file FILE [--data-host "
        "127.0.0.1]\n"
        "                 [--data-port 0] [--advertise-host HOST] [--ctx N] [--kv-pages N]\n"
        "                 [--threads N] [--max-running 16] [--page-tokens 16] [--scrub "
        "zero|poison]\n"
        "                 [--kv-type f32|f16|q8_0] [--drain-timeout-ms 30000]\n"
        "  On SIGTERM a worker drains: it takes no new request, finishes what it holds (up to\n"
        "  --drain-timeout-ms; 0 aborts at once) and exits 0.\n"
        "  Every cluster connection is TLS 1.3, mutually authenticated with keys derived from\n"
        "  the secret, and encrypted. --insecure-plaintext (on every node) turns that off for a\n"
        "  trusted fabric: KV pages then cross the network in the clear and the handshake can be\n"
        "  relayed by anyone on the path.\n",
        cmd, server_tool_call_format_names());
}

/* "512M", "4G", "1048576" -> bytes (binary suffixes). */
static bool serve__parse_bytes(const char *v, uint64_t *out) {
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

/* Returns 0 ok, 2 usage error, -1 help printed. */
int serve__parse(int argc, char **argv, serve__cfg *c) {
    memset(c, 0, sizeof *c);
    c->model_path = cli_default_model();
    c->host = "127.0.0.1";
    c->port = 8080;
    engine_opts d;  // the engine's defaults are the only copy of them
    engine_opts_default(&d);
    c->page_tokens = d.page_tokens;
    c->max_running = d.max_running;
    c->queue_max = d.queue_max;
    c->queue_timeout_ms = d.queue_timeout_ms;
    c->batch = d.max_batch_tokens;
    server_opts so;
    server_opts_default(&so);  // the server's defaults are the only copy of them
    c->idle_timeout = so.idle_timeout_s;
    c->request_timeout = so.request_timeout_s;
    c->max_conns = so.max_connections;
    c->max_conns_per_ip = so.max_connections_per_ip;
    c->scrub = d.scrub;
    c->kv_type = d.kv_type;
    c->health_interval_ms = 1000;
    c->drain_timeout_ms = 30000;
    c->tool_call_format = so.tool_call_format;
    c->reasoning_format = so.reasoning_format;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define INTOPT(name, field, lo, hi)                                                                \
    else if (!strcmp(a, name) && v) {                                                              \
        if (!cli__parse_int(name, argv[++i], lo, hi, &c->field)) return 2;                         \
    }
        if (!strcmp(a, "-m") && v)
            c->model_path = argv[++i];
        else if (!strcmp(a, "--host") && v)
            c->host = argv[++i];
        INTOPT("--port", port, 0, 65535)
        INTOPT("--ctx", ctx, 1, 1 << 24)
        INTOPT("-c", ctx, 1, 1 << 24)
        INTOPT("--kv-pages", kv_pages, 1, UINT32_MAX)
        INTOPT("--page-tokens", page_tokens, 1, 4096)
        INTOPT("--threads", threads, 1, 256)
        INTOPT("-t", threads, 1, 256)
        INTOPT("--batch-tokens", batch, 1, 1 << 20)
        INTOPT("--max-running", max_running, 1, 1 << 16)
        INTOPT("--queue-max", queue_max, 1, 1 << 20)
        INTOPT("--queue-timeout-ms", queue_timeout_ms, 1, UINT32_MAX)
        INTOPT("--idle-timeout", idle_timeout, 0, 86400)
        INTOPT("--request-timeout", request_timeout, 0, 86400)
        INTOPT("--max-connections", max_conns, 1, 1 << 20)
        INTOPT("--max-connections-per-ip", max_conns_per_ip, 0, 1 << 20)
        else if (!strcmp(a, "--kv-memory") && v) {
            if (!serve__parse_bytes(argv[++i], &c->kv_memory)) {
                fprintf(stderr, "kvseal: --kv-memory expects a size such as 512M or 4G, got '%s'\n",
                        argv[i]);
                return 2;
            }
        }
        else if (!strcmp(a, "--alias") && v) {
            if (c->n_aliases == SERVE_MAX_ALIASES) {
                fprintf(stderr, "kvseal: at most %d --alias names\n", SERVE_MAX_ALIASES);
                return 2;
            }
            c->aliases[c->n_aliases++] = argv[++i];
        }
        else if (!strcmp(a, "--cors-origin") && v) {
            const char *o = argv[++i];
            if (c->n_cors == SERVE_MAX_CORS) {
                fprintf(stderr, "kvseal: at most %d --cors-origin values\n", SERVE_MAX_CORS);
                return 2;
            }
            if (!server_cors_origin_valid(o)) {
                fprintf(stderr,
                        "kvseal: --cors-origin expects '*' or an origin such as "
                        "https://app.example.com (scheme://host[:port], no path), got '%s'\n",
                        o);
                return 2;
            }
            c->cors[c->n_cors++] = o;
        }
        else if (!strcmp(a, "--scrub") && v) {
            const char *s = argv[++i];
            if (!strcmp(s, "zero"))
                c->scrub = KV_SCRUB_ZERO;
            else if (!strcmp(s, "poison"))
                c->scrub = KV_SCRUB_POISON;
            else {
                fprintf(stderr, "kvseal: --scrub expects zero or poison, got '%s'\n", s);
                return 2;
            }
        }
        else if (!strcmp(a, "--tool-call-format") && v) {
            if (!server_tool_call_format_parse(argv[++i], &c->tool_call_format)) {
                fprintf(stderr, "kvseal: --tool-call-format expects one of %s, got '%s'\n",
                        server_tool_call_format_names(), argv[i]);
                return 2;
            }
        }
        else if (!strcmp(a, "--reasoning-format") && v) {
            const char *r = argv[++i];
            if (!strcmp(r, "auto"))
                c->reasoning_format = -1;
            else if (!strcmp(r, "none"))
                c->reasoning_format = 0;
            else if (!strcmp(r, "deepseek"))
                c->reasoning_format = 1;
            else {
                fprintf(stderr,
                        "kvseal: --reasoning-format expects auto, none or deepseek, got '%s'\n", r);
                return 2;
            }
        }
        else if (!strcmp(a, "--kv-type") && v) {
            if (!cli__parse_kv_type(argv[++i], &c->kv_type)) return 2;
        }
        else if (!strcmp(a, "--pooling") && v) {
            model_pooling p;
            if (!model_pooling_parse(argv[++i], &p)) {
                fprintf(stderr, "kvseal: --pooling expects mean or last, got '%s'\n", argv[i]);
                return 2;
            }
            c->pooling = (int)p;
        }
        INTOPT("--data-port", data_port, 0, 65535)
        INTOPT("--cluster-port", cluster_port, 0, 65535)
        INTOPT("--health-interval-ms", health_interval_ms, 10, 600000)
        INTOPT("--drain-timeout-ms", drain_timeout_ms, 0, 3600000)
        else if (!strcmp(a, "--secret-file") && v) c->secret_file = argv[++i];
        else if (!strcmp(a, "--router") && v) c->router = argv[++i];
        else if (!strcmp(a, "--data-host") && v) c->data_host = argv[++i];
        else if (!strcmp(a, "--advertise-host") && v) c->advertise_host = argv[++i];
        else if (!strcmp(a, "--cluster-host") && v) c->cluster_host = argv[++i];
        else if (!strcmp(a, "--tenants") && v) c->tenants = argv[++i];
        else if (!strcmp(a, "--chat-template-file") && v) c->chat_template_file = argv[++i];
        else if (!strcmp(a, "--admin-key") && v) c->admin_key = argv[++i];
        else if (!strcmp(a, "--security-log") && v) c->security_log = argv[++i];
        else if (!strcmp(a, "--no-prefix-cache")) c->no_prefix_cache = true;
        else if (!strcmp(a, "--log-content")) c->log_content = true;
        else if (!strcmp(a, "--insecure-plaintext")) c->insecure_plaintext = true;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            serve__usage(argv[0]);
            return -1;
        }
        else {
            fprintf(stderr, "kvseal %s: unknown or incomplete option '%s'\n", argv[0], a);
            serve__usage(argv[0]);
            return 2;
        }
#undef INTOPT
    }
    if (c->kv_pages && c->kv_memory) {
        fprintf(stderr, "kvseal %s: give --kv-pages or --kv-memory, not both\n", argv[0]);
        return 2;
    }
    return 0;
}

/* MemAvailable in bytes, 0 if unknown. */
static uint64_t serve__mem_available(void) {
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
    o->prefix_cache = !c->no_prefix_cache;
    o->scrub = c->scrub;
    o->kv_type = c->kv_type;
    o->pooling = (model_pooling)c->pooling;
    kv_geom g = model_kv_geom(m, o->page_tokens, o->kv_type);
    uint64_t ctx_pages =
        ((uint64_t)o->n_ctx + (uint64_t)o->page_tokens - 1) / (uint64_t)o->page_tokens;
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
                         const model *m, server **s, ks_errbuf *eb) {
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
    so.log_content = c->log_content;
    so.n_ctx = n_ctx;
    so.idle_timeout_s = (unsigned)c->idle_timeout;
    so.request_timeout_s = (unsigned)c->request_timeout;
    so.max_connections = (unsigned)c->max_conns;
    so.max_connections_per_ip = (unsigned)c->max_conns_per_ip;
    so.tool_call_format = c->tool_call_format;
    so.reasoning_format = c->reasoning_format;
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
    printf("listening on http://%s%s%s:%d\n", v6 ? "[" : "", c->host, v6 ? "]" : "", server_port(*s));
    fflush(stdout);
    return KS_OK;
}

/* Shared start of serve and check: parse, load, size, check. Returns -1 to
 * continue, else the exit status. */
int serve__prepare(int argc, char **argv, serve__cfg *c, model **m, engine_opts *o,
                          FILE *report) {
    int rc = serve__parse(argc, argv, c);
    if (rc) return rc < 0 ? 0 : rc;
    ks_errbuf eb = {0};
    if (kern_init(NULL, &eb) || model_load(c->model_path, m, &eb) ||
        model_kv_type_check(*m, c->kv_type, &eb)) {
        fprintf(stderr, "kvseal %s: %s\n", argv[0], eb.msg);
        return 1;
    }
    serve__engine_opts(c, *m, o);
    char buf[1024];
    bool warn = false;
    ks_err e = engine_capacity_check(o, &warn, buf, sizeof buf);
    fprintf(report, "%s\n", buf);
    fflush(report);
    if (e) {
        fprintf(stderr,
                "kvseal %s: %s: the KV pool cannot hold one request of the advertised "
                "context length %d (I8); raise --kv-pages/--kv-memory or lower --ctx\n",
                argv[0], report == stdout ? "check failed" : "refusing to start", o->n_ctx);
        return 1;
    }
    if (warn)
        ks_log(KS_LOG_WARN,
               "the KV pool holds less than 2 requests of the full context (%d tokens)", o->n_ctx);
    return -1;
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
    serve__drain(s, sigs, drain_ms);
    server_stop_accepting(s);
    be->set_online(be->impl, false, true);  // abort what is left: answers end now
}

int cli_check(int argc, char **argv) {
    serve__cfg c;
    model *m = NULL;
    engine_opts o;
    int rc = serve__prepare(argc, argv, &c, &m, &o, stdout);
    model_free(m);
    return rc < 0 ? 0 : rc;
}

int cli_serve(int argc, char **argv) {
    serve__cfg c;
    model *m = NULL;
    engine_opts o;
    engine *e = NULL;
    server *s = NULL;
    server_seclog *sl = NULL;
    int rc = serve__prepare(argc, argv, &c, &m, &o, stderr);
    if (rc >= 0) {
        model_free(m);
        return rc;
    }
    rc = 1;
    ks_errbuf eb = {0};
    // every thread started from here on inherits this mask: only sigwait below
    // sees SIGINT/SIGTERM
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    char name[256];
    serve__model_name(c.model_path, name, sizeof name);
    if (server_seclog_open(c.security_log, &sl, &eb)) goto fail;
    o.on_security_event = server_seclog_write;
    o.event_ctx = sl;
    if (engine_create(&o, &e, &eb)) goto fail;
    server_backend be;
    server_engine_backend(e, &be);
    if (serve__http_start(&c, o.n_ctx, name, &be, m, &s, &eb)) goto fail;
    ks_log(KS_LOG_INFO, "serving %s as '%s' (%d aliases), context %d, %u KV pages, kernels %s",
           c.model_path, c.n_aliases ? c.aliases[0] : name, c.n_aliases, o.n_ctx, o.kv_pages,
           kern_get()->name);
    serve__run_until_signal(s, &be, &sigs, c.drain_timeout_ms);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "kvseal serve: %s\n", eb.msg[0] ? eb.msg : ks_strerror(eb.code));
done:
    server_destroy(s);
    engine_destroy(e);
    server_seclog_close(sl);
    model_free(m);
    return rc;
}
