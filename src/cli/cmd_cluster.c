/* cmd_cluster.c — `kvseal router`, `kvseal prefill` and `kvseal decode`: the
 * three processes of disaggregated serving (cluster.h, docs/pd-protocol.md).
 * They take serve's options (cmd_serve.c) plus the cluster's: every node
 * reads the same secret file; workers name the router's control address.
 *
 * The router prints "cluster port N" and then "listening on http[s]://HOST:PORT"
 * to stdout; the decode worker prints "data link on HOST:PORT", a worker with
 * --health-port "health on http://HOST:PORT". All three
 * run until SIGTERM/SIGINT, drain (the router as serve does; a worker as
 * cluster.h says) and exit 0 after freeing everything. */
#include "cli_int.h"

#include "kvseal/cluster.h"
#include "kvseal/kern.h"
#include "kvseal/pd_msg.h"
#include "kvseal/server.h"

#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#define CLUSTER_SECRET_MAX 256

/* Blocks SIGINT/SIGTERM in every thread started after this (sigwait or the
 * stop flag sees them); ignores SIGPIPE. */
static bool cluster__secret(const char *cmd, const serve__cfg *c, uint8_t *buf, size_t *len) {
    if (!c->secret_file) {
        fprintf(stderr, "kvseal %s: --secret-file is required (the shared cluster secret)\n", cmd);
        return false;
    }
    ks_errbuf eb = {0};
    if (cluster_secret_load(c->secret_file, buf, CLUSTER_SECRET_MAX, len, &eb)) {
        fprintf(stderr, "kvseal %s: %s\n", cmd, eb.msg);
        return false;
    }
    return true;
}

/* --insecure-plaintext is loud: once at start, in the log every node keeps. */
static void cluster__warn_plaintext(const serve__cfg *c) {
    if (!c->insecure_plaintext) return;
    ks_log(KS_LOG_WARN, "cluster: --insecure-plaintext: NO TLS. KV pages (tenants' prompts) and "
                        "tokens cross the network unencrypted, and the plaintext handshake can be "
                        "relayed by anyone on the path. Use only on a trusted, isolated fabric.");
}

/* The start every role shares: serve's options, the model, the pool sizing
 * check (I8) and the cluster secret. Returns -1 to continue (*m loaded, c
 * to free with serve__cfg_free), else the exit status (everything freed). */
static int cluster__prepare(int argc, char **argv, serve__cfg *c, model **m, engine_opts *o,
                            uint8_t secret[CLUSTER_SECRET_MAX], size_t *secret_len) {
    int rc = serve__prepare(argc, argv, c, m, o, stderr);
    if (rc < 0 && !cluster__secret(argv[0], c, secret, secret_len)) rc = 2;
    if (rc >= 0) {
        model_free(*m);
        *m = NULL;
        serve__cfg_free(c);
    }
    return rc;
}

/* The router's further catalog entries (-m PATH[,ALIAS...] after the first):
 * each loaded unpacked (mmap: its tokenizer, template and geometry), named by its
 * file and its aliases. Freed by cluster__catalog_free. */
typedef struct cluster__catalog {
    int n;
    model *m[SERVE_MAX_MODELS];
    char name[SERVE_MAX_MODELS][256];
    char *spec[SERVE_MAX_MODELS]; /* the -m value, cut at its commas */
    const char *aliases[SERVE_MAX_MODELS][SERVE_MAX_ALIASES];
    cluster_router_model rm[SERVE_MAX_MODELS];
    server_model sm[SERVE_MAX_MODELS];
} cluster__catalog;

static void cluster__catalog_free(cluster__catalog *k) {
    for (int i = 0; i < k->n; i++) {
        model_free(k->m[i]);
        free(k->spec[i]);
    }
    k->n = 0;
}

static ks_err cluster__catalog_load(const serve__cfg *c, const engine_opts *o, cluster__catalog *k,
                                    ks_errbuf *eb) {
    for (int i = 0; i < c->n_more_models; i++) {
        char *spec = strdup(c->more_models[i]);
        if (!spec) return ks_seterr(eb, KS_ERR_NOMEM, "catalog");
        k->spec[k->n] = spec;
        k->m[k->n] = NULL;
        int na = 0;
        char *save = NULL, *path = strtok_r(spec, ",", &save);
        for (char *a; na < SERVE_MAX_ALIASES && (a = strtok_r(NULL, ",", &save));)
            k->aliases[k->n][na++] = a;
        if (!path || !*path) return ks_seterr(eb, KS_ERR_INVAL, "--model '%s': no path", c->more_models[i]);
        ks_err e = model_load_unpacked(path, &k->m[k->n], eb); // tokenizer and shape only
        if (!e) e = model_kv_type_check(k->m[k->n], o->kv_type, eb);
        k->n++; // (freed from here on)
        if (e) return e;
        int32_t n_ctx = c->ctx ? (int32_t)c->ctx : model_hp(k->m[k->n - 1])->n_ctx_train;
        serve__model_name(path, k->name[k->n - 1], sizeof k->name[0]);
        const int j = k->n - 1;
        k->rm[j] = (cluster_router_model){.m = k->m[j], .name = na ? k->aliases[j][0] : k->name[j],
                                          .n_ctx = n_ctx};
        k->sm[j] = (server_model){.m = k->m[j], .name = k->name[j], .aliases = k->aliases[j],
                                  .n_aliases = na, .n_ctx = n_ctx};
        ks_log(KS_LOG_INFO, "router catalog: %s as '%s' (%d aliases), context %d", path,
               na ? k->aliases[j][0] : k->name[j], na, n_ctx);
    }
    return KS_OK;
}

int cli_router(int argc, char **argv) {
    serve__cfg c;
    model *m = NULL;
    engine_opts o;
    uint8_t secret[CLUSTER_SECRET_MAX];
    size_t secret_len = 0;
    int rc = cluster__prepare(argc, argv, &c, &m, &o, secret, &secret_len);
    if (rc >= 0) return rc;
    rc = 1;
    ks_errbuf eb = {0};
    sigset_t sigs;
    serve__block_signals(&sigs);
    cluster_router *r = NULL;
    server *s = NULL;
    static cluster__catalog cat; // borrowed by the router and the server for their lifetime
    static char name[256];       // borrowed by the server for its lifetime
    serve__model_name(c.model_path, name, sizeof name);
    cluster_router_opts ro;
    cluster_router_opts_default(&ro);
    ro.m = m;
    ro.name = c.n_aliases ? c.aliases[0] : name;
    if (cluster__catalog_load(&c, &o, &cat, &eb)) goto fail;
    ro.more = cat.rm;
    ro.n_more = cat.n;
    ro.secret = secret;
    ro.secret_len = secret_len;
    ro.insecure_plaintext = c.insecure_plaintext;
    cluster__warn_plaintext(&c);
    if (c.cluster_host) ro.host = c.cluster_host;
    ro.port = c.cluster_port >= 0 ? (int)c.cluster_port : 7070; // 0: any free port
    ro.n_ctx = o.n_ctx;
    ro.page_tokens = o.page_tokens;
    ro.kv_type = o.kv_type;
    ro.pooling = (model_pooling)c.pooling;
    ro.health_interval_ms = (uint32_t)c.health_interval_ms;
    ro.queue_timeout_ms = o.queue_timeout_ms;
    ro.queue_max = (uint32_t)o.queue_max;
    if (cluster_router_create(&ro, &r, &eb)) goto fail;
    printf("cluster port %d\n", cluster_router_port(r));
    fflush(stdout);
    server_backend be;
    cluster_router_backend(r, &be);
    if (serve__http_start(&c, o.n_ctx, name, &be, m, cat.sm, cat.n, &s, &eb)) goto fail;
    cluster_router_adapters_seal(r); // the tenants file's adapters are in: no more (POST 501)
    ks_log(KS_LOG_INFO, "router for %s, context %d, cluster control on %s:%d", c.model_path, o.n_ctx,
           ro.host, cluster_router_port(r));
    serve__run_until_signal(s, &be, &sigs, c.drain_timeout_ms);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "kvseal router: %s\n", eb.msg[0] ? eb.msg : ks_strerror(eb.code));
done:
    server_destroy(s);
    cluster_router_destroy(r);
    cluster__catalog_free(&cat);
    sodium_memzero(secret, sizeof secret);
    model_free(m);
    serve__cfg_free(&c);
    return rc;
}

static atomic_int cluster__stop; // set by the signal thread, read by the worker's loop

static void *cluster__sigwaiter(void *arg) {
    sigset_t *sigs = arg;
    int sig = 0;
    while (sigwait(sigs, &sig) != 0) {
    }
    ks_log(KS_LOG_INFO, "signal %d: shutting down", sig);
    atomic_store_explicit(&cluster__stop, 1, memory_order_release);
    return NULL;
}

/* --lora PATH[:SCALE] into l: the text after the last ':' is the scale when
 * it reads whole as a non-zero number, else part of the path. Returns
 * false (printed) when the path is empty. The path is copied into buf. */
static bool cluster__lora(const char *cmd, const char *v, char *buf, size_t cap, cluster_lora *l) {
    snprintf(buf, cap, "%s", v);
    l->path = buf;
    l->scale = 1.0f;
    char *colon = strrchr(buf, ':');
    if (colon && colon[1]) {
        char *end;
        float f = strtof(colon + 1, &end);
        if (!*end && f != 0.0f) {
            *colon = 0;
            l->scale = f;
        }
    }
    if (!buf[0] || strlen(v) >= cap) {
        fprintf(stderr, "kvseal %s: --lora expects PATH[:SCALE], got '%s'\n", cmd, v);
        return false;
    }
    return true;
}

/* Shared body of prefill and decode. */
static int cluster__worker(int argc, char **argv, bool decode) {
    serve__cfg c;
    model *m = NULL;
    engine_opts o;
    uint8_t secret[CLUSTER_SECRET_MAX];
    size_t secret_len = 0;
    int rc = cluster__prepare(argc, argv, &c, &m, &o, secret, &secret_len);
    if (rc >= 0) return rc;
    char hosts[SERVE_MAX_ROUTERS][256];
    cluster_router_addr ra[SERVE_MAX_ROUTERS];
    for (int i = 0; i < c.n_routers; i++) {
        const char *r = c.routers[i];
        const char *colon = strrchr(r, ':');
        long port = 0;
        if (!colon || colon == r || (size_t)(colon - r) >= sizeof hosts[i] ||
            !cli__parse_int("--router", colon + 1, 1, 65535, &port)) {
            c.n_routers = 0;
            break;
        }
        snprintf(hosts[i], sizeof hosts[i], "%.*s", (int)(colon - r), r);
        ra[i] = (cluster_router_addr){hosts[i], (int)port};
    }
    if (c.n_routers == 0) {
        fprintf(stderr, "kvseal %s: --router HOST:PORT is required (the router's cluster port; "
                "repeat it, or list several separated by commas, for more than one router)\n",
                argv[0]);
        sodium_memzero(secret, sizeof secret);
        model_free(m);
        serve__cfg_free(&c);
        return 2;
    }
    static char lpath[SERVE_MAX_LORA][1024];
    static cluster_lora lora[SERVE_MAX_LORA];
    for (int i = 0; i < c.n_lora; i++)
        if (!cluster__lora(argv[0], c.lora[i], lpath[i], sizeof lpath[i], &lora[i])) {
            sodium_memzero(secret, sizeof secret);
            model_free(m);
            serve__cfg_free(&c);
            return 2;
        }
    sigset_t sigs;
    serve__block_signals(&sigs);
    pthread_t waiter;
    if (pthread_create(&waiter, NULL, cluster__sigwaiter, &sigs) != 0) {
        fprintf(stderr, "kvseal %s: cannot start the signal thread\n", argv[0]);
        model_free(m);
        serve__cfg_free(&c);
        return 1;
    }
    // REGISTER's names: the file's name, then the aliases
    char names[PD_MSG_MAX_NAMES + 1];
    serve__model_name(c.model_path, names, sizeof names);
    for (int i = 0; i < c.n_aliases; i++) {
        size_t n = strlen(names);
        snprintf(names + n, sizeof names - n, ",%s", c.aliases[i]);
    }
    cluster_worker_opts wo = {.m = m, .names = names, .secret = secret, .secret_len = secret_len,
                              .router_host = ra[0].host, .router_port = ra[0].port,
                              .routers = ra, .n_routers = c.n_routers,
                              .data_host = c.data_host ? c.data_host : "127.0.0.1",
                              .data_port = (int)c.data_port, .advertise_host = c.advertise_host,
                              .eng = o, .drain_ms = (uint32_t)c.drain_timeout_ms,
                              .insecure_plaintext = c.insecure_plaintext,
                              .data_plane = (uint8_t)c.data_plane,
                              .lora = lora, .n_lora = c.n_lora};
    if (c.health_port >= 0) { // --health-port: the probes' endpoint (cluster_int.h cl_health)
        wo.health_host = c.health_host ? c.health_host : "127.0.0.1";
        wo.health_port = (int)c.health_port;
    }
    cluster__warn_plaintext(&c);
    if (decode)
        wo.eng.prefix_cache = false; // prefill owns the cache (cluster/prefill.c pf__reserve)
    ks_log(KS_LOG_INFO, "%s worker for %s, context %d, %u KV pages, kernels %s, %d router(s), first %s:%d",
           decode ? "decode" : "prefill", c.model_path, o.n_ctx, o.kv_pages, kern_get()->name,
           c.n_routers, ra[0].host, ra[0].port);
    ks_errbuf eb = {0};
    ks_err e = decode ? cluster_decode_run(&wo, &cluster__stop, &eb)
                      : cluster_prefill_run(&wo, &cluster__stop, &eb);
    if (e) fprintf(stderr, "kvseal %s: %s\n", argv[0], eb.msg[0] ? eb.msg : ks_strerror(e));
    if (!atomic_load(&cluster__stop)) pthread_kill(waiter, SIGTERM);  // it is blocked in sigwait: wake it
    pthread_join(waiter, NULL);
    sodium_memzero(secret, sizeof secret);
    model_free(m);
    serve__cfg_free(&c);
    return e ? 1 : 0;
}

_Static_assert(SERVE_MAX_ROUTERS == CLUSTER_MAX_ROUTERS, "one router limit");

int cli_prefill(int argc, char **argv) { return cluster__worker(argc, argv, false); }

int cli_decode(int argc, char **argv) { return cluster__worker(argc, argv, true); }
