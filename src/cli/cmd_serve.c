/* cmd_serve.c — `kvseal serve` (the HTTP server) and `kvseal check` (the
 * deploy-time pool sizing check, I8, without starting anything).
 *
 * Both size the KV pool the same way: --kv-pages or --kv-memory when given,
 * else from free memory (at most a quarter of MemAvailable), aiming at 8x
 * the context and never below 1x. Both print engine_capacity_check's
 * arithmetic; serve refuses to start (exit 1) when one request of the
 * advertised context cannot fit and warns below 2x. serve prints one line
 * "listening on http://HOST:PORT" (https:// with --ssl-cert-file) to
 * stdout once bound, then waits for
 * SIGTERM/SIGINT, drains (new requests get 503, running ones finish, up to
 * --drain-timeout-ms), aborts what is left and exits 0 after freeing all.
 * Options come from the command line and a --config FILE (opts.c); under a
 * service manager serve and router send sd_notify READY=1 once bound with
 * the model loaded, STOPPING=1 when the drain starts, and STATUS= lines. */
#include "cli_int.h"

#include "kvseal/engine.h"
#include "kvseal/kern.h"
#include "kvseal/server.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>



void serve__usage(const char *cmd) {
    fprintf(
        stderr,
        "usage: kvseal %s [--config FILE] [-m|--model MODEL] [--host 127.0.0.1]\n"
        "         [--port 8080 (0: any free port)] [--log-format text|json]\n"
        "         [--log-level debug|info|warn|error|off]\n"
        "         [--alias NAME]... [--ctx N] [--kv-pages N | --kv-memory BYTES (512M, 4G)]\n"
        "         [--page-tokens 16] [--kv-type f32|f16|q8_0 (f16)] [--threads N]\n"
        "         [--batch-tokens 256] [--max-running 16]\n"
        "         [--queue-max 64] [--queue-timeout-ms 30000] [--no-prefix-cache]\n"
        "         [--scrub zero|poison] [--tenants FILE] [--admin-key KEY] [--metrics-key KEY]\n"
        "         [--log-content] [--embed-max-tokens 32768]\n"
        "         [--responses-ttl SECONDS (3600; 0: keep none)] [--responses-max 1000]\n"
        "         [--responses-max-bytes BYTES (67108864)] [--max-adapter-mb 1024]\n"
        "         [--security-log FILE] [--idle-timeout SECONDS (120)] [--drain-timeout-ms 30000]\n"
        "         [--request-timeout SECONDS (10)] [--max-connections 4096]\n"
        "         [--max-connections-per-ip 256 (0: no limit)] [--chat-template-file FILE]\n"
        "         [--tool-call-format auto|none|NAME] [--reasoning-format auto|none|deepseek]\n"
        "         [--pooling mean|cls|last] [--grammar-budget-ms 1000] [--grammar-cpu-ms 20000]\n"
        "         [--spec-tokens 0..8 (0: off)] [--spec-ngram-min 2] [--spec-ngram-max 4]\n"
        "         [--spec-max-batch 4] [--draft-model MODEL | --spec-nextn (serve)]\n"
        "  --spec-tokens N: speculative decoding, up to N drafts a step from the request's own\n"
        "  prompt and output (prompt lookup, n-grams of --spec-ngram-min..max tokens) and its\n"
        "  'prediction'; the same output as without it. No drafts in a step with more than\n"
        "  --spec-max-batch requests decoding (docs/speculative.md). --draft-model: a smaller\n"
        "  model of the same vocabulary drafts instead (its greedy tokens; --spec-tokens 4\n"
        "  unless given). --spec-nextn: the model's own NextN (MTP) block drafts instead\n"
        "  (GLM-4.5+, DeepSeek-V3 files; --spec-tokens 4 unless given).\n"
        "  --grammar-budget-ms / --grammar-cpu-ms: the CPU a request's grammar masks may\n"
        "  take for one token / in all (0: no limit); past either it ends with a 400. Masks\n"
        "  run on their own threads and never hold up other requests' tokens.\n"
        "  --pooling: how POST /v1/embeddings pools the final hidden state (default: the\n"
        "  GGUF's <arch>.pooling_type when mean, cls or last, else mean); on prefill workers too.\n"
        "         [--cors-origin ORIGIN|'*']... (browsers; off by default: no CORS headers)\n"
        "         [--ssl-cert-file FILE --ssl-key-file FILE] (serve, router: HTTPS)\n"
        "  --ssl-cert-file / --ssl-key-file: serve HTTPS (TLS) instead of HTTP on --port with\n"
        "  this PEM certificate chain and its unencrypted PEM private key; both or neither.\n"
        "  --responses-ttl / --responses-max / --responses-max-bytes: how long, how many and\n"
        "  how many bytes of /v1/responses answers each tenant's store keeps (the oldest are\n"
        "  evicted and wiped first; docs/responses.md).\n"
        "  --max-adapter-mb: the largest LoRA adapter POST /admin/adapters takes (docs/api.md).\n"
        "  --tool-call-format: how the model writes tool calls (auto: from the chat template;\n"
        "  NAME: %s). --reasoning-format deepseek splits the text between think markers into\n"
        "  reasoning_content (auto: when the template has them; none: it stays content).\n"
        "  --config FILE: 'key = value' lines, the keys the long options' names (port = 8080,\n"
        "  alias = a, a line per alias; flags take true or false); the command line overrides\n"
        "  the file. --opt=value and --opt value both work; -- ends the options.\n"
        "  -m PATH,ALIAS[,ALIAS...] is -m PATH --alias ALIAS... More -m PATH[,ALIAS...]\n"
        "  add models (one serve or router, many models; a request's \"model\" picks one);\n"
        "  in a config file a `model = PATH[,ALIAS...]` line each.\n"
        "         [--models-dir DIR] [--models-config FILE] [--models-memory BYTES]\n"
        "         [--models-max-loaded N] (serve)\n"
        "  --models-dir: every *.gguf in DIR is a model, named by its file; DIR/models.json\n"
        "  (or --models-config) gives aliases, ctx, kv_pages, kv_memory, preload per model.\n"
        "  With several models each loads on first use (503 model_loading meanwhile) and the\n"
        "  least recently used idle one is unloaded when another would exceed --models-memory\n"
        "  (default 3/4 of MemAvailable: weights + KV pool) or --models-max-loaded.\n"
        "  --ctx defaults to the model's training context. Without --kv-pages/--kv-memory the\n"
        "  pool takes at most 25%% of MemAvailable, between 1x and 8x the context.\n"
        "  --kv-type: the KV cache element type (f16 and q8_0 hold 2x and ~3.8x the tokens of\n"
        "  f32 in the same memory; q8_0 needs head_dim %% 32 == 0). Every node of a cluster\n"
        "  must use the same one.\n"
        "  Without --tenants there is one anonymous tenant and no API key is required.\n"
        "  --limits-redis HOST:PORT shares the tenants' tokens_per_minute and\n"
        "  requests_per_minute with every serve/router pointed at the same redis (keys\n"
        "  start with --limits-redis-prefix, default kvseal:); while redis is unreachable\n"
        "  each process admits --limits-local-share (default 1) of each limit on its own.\n"
        "  max_concurrent is always counted per process.\n"
        "  With tenants, /metrics needs --metrics-key's key (or the admin key) as a bearer\n"
        "  token. --embed-max-tokens: tokens one embeddings request may hold over all its\n"
        "  inputs (never below --ctx).\n"
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
        "  kvseal prefill [-m MODEL] --router HOST:PORT[,HOST:PORT...] --secret-file FILE [--ctx N]\n"
        "                 [--kv-pages N]\n"
        "                 [--threads N] [--batch-tokens 256] [--page-tokens 16] [--scrub "
        "zero|poison]\n"
        "                 [--kv-type f32|f16|q8_0] [--no-prefix-cache] [--drain-timeout-ms 30000]\n"
        "                 [--data-plane tls|ucx] [--health-port N] [--health-host 127.0.0.1]\n"
        "  kvseal decode  [-m MODEL] --router HOST:PORT --secret-file FILE [--data-host "
        "127.0.0.1]\n"
        "                 [--data-port 0] [--advertise-host HOST] [--ctx N] [--kv-pages N]\n"
        "                 [--threads N] [--max-running 16] [--page-tokens 16] [--scrub "
        "zero|poison]\n"
        "                 [--kv-type f32|f16|q8_0] [--drain-timeout-ms 30000]\n"
        "                 [--grammar-budget-ms 1000] [--grammar-cpu-ms 20000] [--data-plane tls|ucx]\n"
        "                 [--health-port N] [--health-host 127.0.0.1]\n"
        "  --lora PATH[:SCALE] (prefill and decode alike; repeatable): a LoRA adapter the\n"
        "  worker holds, known by the SHA-256 of its file and scale; the router's tenants\n"
        "  file names it for tenants (docs/cluster.md \"LoRA adapters\").\n"
        "  --data-plane ucx (prefill and decode alike; the router pairs only workers of one\n"
        "  plane): KV pages go as one-sided UCX puts (transports from UCX_TLS), each sealed\n"
        "  with AES-GCM under keys exported from the TLS data link.\n"
        "  --router may repeat (or list several, comma-separated; at most 16): the worker\n"
        "  registers with every router and serves them all over its one pool; losing one\n"
        "  router ends only the requests it carried.\n"
        "  On SIGTERM a worker drains: it takes no new request, finishes what it holds (up to\n"
        "  --drain-timeout-ms; 0 aborts at once) and exits 0.\n"
        "  --health-port N (0: any; prints \"health on http://HOST:PORT\"): a worker answers\n"
        "  GET /health (200 while its loop runs) and GET /ready (200 only while registered\n"
        "  with the router and not draining, else 503 and the reason) for probes.\n"
        "  Every cluster connection is TLS 1.3, mutually authenticated with keys derived from\n"
        "  the secret, and encrypted. --insecure-plaintext (on every node) turns that off for a\n"
        "  trusted fabric: KV pages then cross the network in the clear and the handshake can be\n"
        "  relayed by anyone on the path.\n",
        cmd, server_tool_call_format_names());
}

/* A copy of v that lives as long as c (serve__cfg_free): option values from
 * a config file outlive the file's buffer. NULL (message printed) on NOMEM. */
static const char *serve__keep(serve__cfg *c, const char *v) {
    char **ns = realloc(c->strings, sizeof(char *) * (size_t)(c->n_strings + 1));
    if (ns) c->strings = ns;
    char *copy = ns ? strdup(v) : NULL;
    if (!copy) {
        fprintf(stderr, "kvseal: out of memory\n");
        return NULL;
    }
    c->strings[c->n_strings++] = copy;
    return copy;
}

// ----------------------------------------------------------------------------
// Options: one table for the command line and the config file (opts.c)

enum {
    SO_MODEL,
    SO_HOST,
    SO_PORT,
    SO_CTX,
    SO_KV_PAGES,
    SO_PAGE_TOKENS,
    SO_THREADS,
    SO_BATCH,
    SO_MAX_RUNNING,
    SO_QUEUE_MAX,
    SO_QUEUE_TIMEOUT,
    SO_IDLE_TIMEOUT,
    SO_REQUEST_TIMEOUT,
    SO_MAX_CONNS,
    SO_MAX_CONNS_IP,
    SO_KV_MEMORY,
    SO_ALIAS,
    SO_SCRUB,
    SO_TOOL_CALL_FORMAT,
    SO_REASONING_FORMAT,
    SO_KV_TYPE,
    SO_DATA_PORT,
    SO_CLUSTER_PORT,
    SO_HEALTH_INTERVAL,
    SO_DRAIN_TIMEOUT,
    SO_SECRET_FILE,
    SO_ROUTER,
    SO_DATA_HOST,
    SO_ADVERTISE_HOST,
    SO_CLUSTER_HOST,
    SO_TENANTS,
    SO_CHAT_TEMPLATE_FILE,
    SO_ADMIN_KEY,
    SO_SECURITY_LOG,
    SO_NO_PREFIX_CACHE,
    SO_LOG_CONTENT,
    SO_INSECURE_PLAINTEXT,
    SO_CORS_ORIGIN,
    SO_POOLING,
    SO_METRICS_KEY,
    SO_EMBED_MAX_TOKENS,
    SO_RESPONSES_TTL,
    SO_RESPONSES_MAX,
    SO_RESPONSES_MAX_BYTES,
    SO_GRAMMAR_BUDGET,
    SO_GRAMMAR_CPU,
    SO_DATA_PLANE,
    SO_LIMITS_REDIS,
    SO_LIMITS_REDIS_PREFIX,
    SO_LIMITS_LOCAL_SHARE,
    SO_HEALTH_HOST,
    SO_HEALTH_PORT,
    SO_SPEC_TOKENS,
    SO_SPEC_NGRAM_MIN,
    SO_SPEC_NGRAM_MAX,
    SO_SPEC_MAX_BATCH,
    SO_DRAFT_MODEL,
    SO_SPEC_NEXTN,
    SO_SSL_CERT_FILE,
    SO_SSL_KEY_FILE,
    SO_MODELS_DIR,
    SO_MODELS_CONFIG,
    SO_MODELS_MEMORY,
    SO_MODELS_MAX_LOADED,
    SO_MAX_ADAPTER_MB,
    SO_LORA,
    SO__N
};

static const cli__opt serve__opts[SO__N] = {
    [SO_MODEL] = {"model", 'm', true, true},
    [SO_HOST] = {"host", 0, true, false},
    [SO_PORT] = {"port", 0, true, false},
    [SO_CTX] = {"ctx", 'c', true, false},
    [SO_KV_PAGES] = {"kv-pages", 0, true, false},
    [SO_PAGE_TOKENS] = {"page-tokens", 0, true, false},
    [SO_THREADS] = {"threads", 't', true, false},
    [SO_BATCH] = {"batch-tokens", 0, true, false},
    [SO_MAX_RUNNING] = {"max-running", 0, true, false},
    [SO_QUEUE_MAX] = {"queue-max", 0, true, false},
    [SO_QUEUE_TIMEOUT] = {"queue-timeout-ms", 0, true, false},
    [SO_IDLE_TIMEOUT] = {"idle-timeout", 0, true, false},
    [SO_REQUEST_TIMEOUT] = {"request-timeout", 0, true, false},
    [SO_MAX_CONNS] = {"max-connections", 0, true, false},
    [SO_MAX_CONNS_IP] = {"max-connections-per-ip", 0, true, false},
    [SO_KV_MEMORY] = {"kv-memory", 0, true, false},
    [SO_ALIAS] = {"alias", 0, true, true},
    [SO_SCRUB] = {"scrub", 0, true, false},
    [SO_TOOL_CALL_FORMAT] = {"tool-call-format", 0, true, false},
    [SO_REASONING_FORMAT] = {"reasoning-format", 0, true, false},
    [SO_KV_TYPE] = {"kv-type", 0, true, false},
    [SO_DATA_PORT] = {"data-port", 0, true, false},
    [SO_CLUSTER_PORT] = {"cluster-port", 0, true, false},
    [SO_HEALTH_INTERVAL] = {"health-interval-ms", 0, true, false},
    [SO_DRAIN_TIMEOUT] = {"drain-timeout-ms", 0, true, false},
    [SO_SECRET_FILE] = {"secret-file", 0, true, false},
    [SO_ROUTER] = {"router", 0, true, true},
    [SO_DATA_HOST] = {"data-host", 0, true, false},
    [SO_ADVERTISE_HOST] = {"advertise-host", 0, true, false},
    [SO_CLUSTER_HOST] = {"cluster-host", 0, true, false},
    [SO_TENANTS] = {"tenants", 0, true, false},
    [SO_CHAT_TEMPLATE_FILE] = {"chat-template-file", 0, true, false},
    [SO_ADMIN_KEY] = {"admin-key", 0, true, false},
    [SO_SECURITY_LOG] = {"security-log", 0, true, false},
    [SO_NO_PREFIX_CACHE] = {"no-prefix-cache", 0, false, false},
    [SO_LOG_CONTENT] = {"log-content", 0, false, false},
    [SO_INSECURE_PLAINTEXT] = {"insecure-plaintext", 0, false, false},
    [SO_CORS_ORIGIN] = {"cors-origin", 0, true, true},
    [SO_POOLING] = {"pooling", 0, true, false},
    [SO_METRICS_KEY] = {"metrics-key", 0, true, false},
    [SO_EMBED_MAX_TOKENS] = {"embed-max-tokens", 0, true, false},
    [SO_RESPONSES_TTL] = {"responses-ttl", 0, true, false},
    [SO_RESPONSES_MAX] = {"responses-max", 0, true, false},
    [SO_RESPONSES_MAX_BYTES] = {"responses-max-bytes", 0, true, false},
    [SO_GRAMMAR_BUDGET] = {"grammar-budget-ms", 0, true, false},
    [SO_GRAMMAR_CPU] = {"grammar-cpu-ms", 0, true, false},
    [SO_DATA_PLANE] = {"data-plane", 0, true, false},
    [SO_LIMITS_REDIS] = {"limits-redis", 0, true, false},
    [SO_LIMITS_REDIS_PREFIX] = {"limits-redis-prefix", 0, true, false},
    [SO_LIMITS_LOCAL_SHARE] = {"limits-local-share", 0, true, false},
    [SO_HEALTH_HOST] = {"health-host", 0, true, false},
    [SO_HEALTH_PORT] = {"health-port", 0, true, false},
    [SO_SPEC_TOKENS] = {"spec-tokens", 0, true, false},
    [SO_SPEC_NGRAM_MIN] = {"spec-ngram-min", 0, true, false},
    [SO_SPEC_NGRAM_MAX] = {"spec-ngram-max", 0, true, false},
    [SO_SPEC_MAX_BATCH] = {"spec-max-batch", 0, true, false},
    [SO_DRAFT_MODEL] = {"draft-model", 0, true, false},
    [SO_SPEC_NEXTN] = {"spec-nextn", 0, false, false},
    [SO_SSL_CERT_FILE] = {"ssl-cert-file", 0, true, false},
    [SO_SSL_KEY_FILE] = {"ssl-key-file", 0, true, false},
    [SO_MODELS_DIR] = {"models-dir", 0, true, false},
    [SO_MODELS_CONFIG] = {"models-config", 0, true, false},
    [SO_MODELS_MEMORY] = {"models-memory", 0, true, false},
    [SO_MODELS_MAX_LOADED] = {"models-max-loaded", 0, true, false},
    [SO_MAX_ADAPTER_MB] = {"max-adapter-mb", 0, true, false},
    [SO_LORA] = {"lora", 0, true, true},
};

/* cli__spec.apply for serve and the cluster roles. String values point
 * into argv or, from a config file, into storage that lives as long as the
 * config (serve__cfg.strings). */
static int serve__apply(void *ctx, int id, const char *v, bool reset) {
    serve__cfg *c = ctx;
    char name[64];
    snprintf(name, sizeof name, "--%s", serve__opts[id].name);
    long *lv = NULL, lo = 0, hi = 0;
    switch (id) {
    case SO_PORT:
        lv = &c->port, lo = 0, hi = 65535;
        break;
    case SO_CTX:
        lv = &c->ctx, lo = 1, hi = 1 << 24;
        break;
    case SO_KV_PAGES:
        lv = &c->kv_pages, lo = 1, hi = UINT32_MAX;
        break;
    case SO_PAGE_TOKENS:
        lv = &c->page_tokens, lo = 1, hi = 4096;
        break;
    case SO_THREADS:
        lv = &c->threads, lo = 1, hi = 256;
        break;
    case SO_BATCH:
        lv = &c->batch, lo = 1, hi = 1 << 20;
        break;
    case SO_MAX_RUNNING:
        lv = &c->max_running, lo = 1, hi = 1 << 16;
        break;
    case SO_QUEUE_MAX:
        lv = &c->queue_max, lo = 1, hi = 1 << 20;
        break;
    case SO_QUEUE_TIMEOUT:
        lv = &c->queue_timeout_ms, lo = 1, hi = UINT32_MAX;
        break;
    case SO_IDLE_TIMEOUT:
        lv = &c->idle_timeout, lo = 0, hi = 86400;
        break;
    case SO_REQUEST_TIMEOUT:
        lv = &c->request_timeout, lo = 0, hi = 86400;
        break;
    case SO_MAX_CONNS:
        lv = &c->max_conns, lo = 1, hi = 1 << 20;
        break;
    case SO_MAX_CONNS_IP:
        lv = &c->max_conns_per_ip, lo = 0, hi = 1 << 20;
        break;
    case SO_DATA_PORT:
        lv = &c->data_port, lo = 0, hi = 65535;
        break;
    case SO_HEALTH_PORT:
        lv = &c->health_port, lo = 0, hi = 65535;
        break;
    case SO_SPEC_TOKENS:
        lv = &c->spec_tokens, lo = 0, hi = ENGINE_SPEC_MAX;
        break;
    case SO_SPEC_NGRAM_MIN:
        lv = &c->spec_ngram_min, lo = 1, hi = 64;
        break;
    case SO_SPEC_NGRAM_MAX:
        lv = &c->spec_ngram_max, lo = 1, hi = 64;
        break;
    case SO_SPEC_MAX_BATCH:
        lv = &c->spec_max_batch, lo = 1, hi = 1 << 16;
        break;
    case SO_CLUSTER_PORT:
        lv = &c->cluster_port, lo = 0, hi = 65535;
        break;
    case SO_HEALTH_INTERVAL:
        lv = &c->health_interval_ms, lo = 10, hi = 600000;
        break;
    case SO_DRAIN_TIMEOUT:
        lv = &c->drain_timeout_ms, lo = 0, hi = 3600000;
        break;
    case SO_RESPONSES_TTL:
        lv = &c->responses_ttl, lo = 0, hi = 30L * 86400;
        break;
    case SO_RESPONSES_MAX:
        lv = &c->responses_max, lo = 0, hi = 1L << 20;
        break;
    case SO_RESPONSES_MAX_BYTES:
        lv = &c->responses_max_bytes, lo = 0, hi = 1L << 40;
        break;
    case SO_MAX_ADAPTER_MB:
        lv = &c->max_adapter_mb, lo = 1, hi = 1L << 16;
        break;
    case SO_EMBED_MAX_TOKENS:
        lv = &c->embed_max_tokens, lo = 1, hi = INT32_MAX;
        break;
    case SO_GRAMMAR_BUDGET:
        lv = &c->grammar_budget_ms, lo = 0, hi = 3600000;
        break;
    case SO_GRAMMAR_CPU:
        lv = &c->grammar_cpu_ms, lo = 0, hi = 86400000;
        break;
    case SO_MODELS_MAX_LOADED:
        lv = &c->models_max_loaded, lo = 0, hi = 1 << 16;
        break;
    default:
        break;
    }
    if (lv) return cli__parse_int(name, v, lo, hi, lv) ? 0 : 2;
    const char **sv = NULL;
    switch (id) {
    case SO_MODEL: // the first is the model; more (kvseal router's catalog) "PATH[,alias...]"
        if (reset) c->n_models_given = 0; // the command line's replace the file's
        if (c->n_models_given++ == 0) {  // "PATH[,ALIAS...]": serve__parse splits it
            if (!(c->model_path = serve__keep(c, v))) return 2;
            c->n_more_models = 0;
            return 0;
        }
        if (c->n_more_models == SERVE_MAX_MODELS) {
            fprintf(stderr, "kvseal: at most %d further --model entries\n", SERVE_MAX_MODELS);
            return 2;
        }
        if (!(c->more_models[c->n_more_models] = serve__keep(c, v))) return 2;
        c->n_more_models++;
        return 0;
    case SO_HOST:
        sv = &c->host;
        break;
    case SO_SECRET_FILE:
        sv = &c->secret_file;
        break;
    case SO_DATA_HOST:
        sv = &c->data_host;
        break;
    case SO_ADVERTISE_HOST:
        sv = &c->advertise_host;
        break;
    case SO_HEALTH_HOST:
        sv = &c->health_host;
        break;
    case SO_CLUSTER_HOST:
        sv = &c->cluster_host;
        break;
    case SO_TENANTS:
        sv = &c->tenants;
        break;
    case SO_CHAT_TEMPLATE_FILE:
        sv = &c->chat_template_file;
        break;
    case SO_DRAFT_MODEL:
        sv = &c->draft_model;
        break;
    case SO_ADMIN_KEY:
        sv = &c->admin_key;
        break;
    case SO_METRICS_KEY:
        sv = &c->metrics_key;
        break;
    case SO_SECURITY_LOG:
        sv = &c->security_log;
        break;
    case SO_LIMITS_REDIS:
        sv = &c->limits_redis;
        break;
    case SO_LIMITS_REDIS_PREFIX:
        sv = &c->limits_redis_prefix;
        break;
    case SO_SSL_CERT_FILE:
        sv = &c->ssl_cert_file;
        break;
    case SO_SSL_KEY_FILE:
        sv = &c->ssl_key_file;
        break;
    case SO_MODELS_DIR:
        sv = &c->models_dir;
        break;
    case SO_MODELS_CONFIG:
        sv = &c->models_config;
        break;
    default:
        break;
    }
    if ((sv == &c->admin_key || sv == &c->metrics_key) && strlen(v) < SERVER_KEY_MIN_BYTES) {
        fprintf(stderr, "kvseal: %s has %zu bytes; at least %d are needed\n", name, strlen(v),
                SERVER_KEY_MIN_BYTES);
        return 2;
    }
    if (sv) {
        if (!(*sv = serve__keep(c, v))) return 2;
        return 0;
    }
    bool *bv = id == SO_NO_PREFIX_CACHE      ? &c->no_prefix_cache
               : id == SO_LOG_CONTENT        ? &c->log_content
               : id == SO_INSECURE_PLAINTEXT ? &c->insecure_plaintext
               : id == SO_SPEC_NEXTN         ? &c->spec_nextn
                                             : NULL;
    if (bv) {
        *bv = !strcmp(v, "true");
        return 0;
    }
    switch (id) {
    case SO_LIMITS_LOCAL_SHARE: {
        char *end = NULL;
        double f = strtod(v, &end);
        if (!end || *end || !(f > 0 && f <= 1)) {
            fprintf(stderr, "kvseal: --limits-local-share expects a fraction in (0, 1], got '%s'\n", v);
            return 2;
        }
        c->limits_local_share = f;
        return 0;
    }
    case SO_MODELS_MEMORY:
        if (!serve__parse_bytes(v, &c->models_memory)) {
            fprintf(stderr, "kvseal: --models-memory expects a size such as 8G, got '%s'\n", v);
            return 2;
        }
        return 0;
    case SO_KV_MEMORY:
        if (!serve__parse_bytes(v, &c->kv_memory)) {
            fprintf(stderr, "kvseal: --kv-memory expects a size such as 512M or 4G, got '%s'\n", v);
            return 2;
        }
        return 0;
    case SO_ROUTER: {  // repeatable, and each value may be a comma list
        if (reset) c->n_routers = 0; // the command line's routers replace the file's
        const char *p = v;
        for (;;) {
            while (*p == ' ' || *p == '\t') p++;  // "a:1, b:2": spaces around items go
            size_t n = strcspn(p, ","), m = n;
            while (m > 0 && (p[m - 1] == ' ' || p[m - 1] == '\t')) m--;
            if (m > 0) {
                if (c->n_routers == SERVE_MAX_ROUTERS) {
                    fprintf(stderr, "kvseal: at most %d --router addresses\n", SERVE_MAX_ROUTERS);
                    return 2;
                }
                char one[300];
                if (m >= sizeof one) {
                    fprintf(stderr, "kvseal: --router address too long\n");
                    return 2;
                }
                memcpy(one, p, m);
                one[m] = '\0';
                if (!(c->routers[c->n_routers] = serve__keep(c, one))) return 2;
                c->n_routers++;
            }
            if (!p[n]) break;
            p += n + 1;
        }
        return 0;
    }
    case SO_ALIAS:
        if (reset) c->n_aliases = 0; // the command line's aliases replace the file's
        if (c->n_aliases == SERVE_MAX_ALIASES) {
            fprintf(stderr, "kvseal: at most %d --alias names\n", SERVE_MAX_ALIASES);
            return 2;
        }
        if (!(c->aliases[c->n_aliases] = serve__keep(c, v))) return 2;
        c->n_aliases++;
        return 0;
    case SO_SCRUB:
        if (!strcmp(v, "zero"))
            c->scrub = KV_SCRUB_ZERO;
        else if (!strcmp(v, "poison"))
            c->scrub = KV_SCRUB_POISON;
        else {
            fprintf(stderr, "kvseal: --scrub expects zero or poison, got '%s'\n", v);
            return 2;
        }
        return 0;
    case SO_TOOL_CALL_FORMAT:
        if (!server_tool_call_format_parse(v, &c->tool_call_format)) {
            fprintf(stderr, "kvseal: --tool-call-format expects one of %s, got '%s'\n",
                    server_tool_call_format_names(), v);
            return 2;
        }
        return 0;
    case SO_REASONING_FORMAT:
        if (!strcmp(v, "auto"))
            c->reasoning_format = -1;
        else if (!strcmp(v, "none"))
            c->reasoning_format = 0;
        else if (!strcmp(v, "deepseek"))
            c->reasoning_format = 1;
        else {
            fprintf(stderr, "kvseal: --reasoning-format expects auto, none or deepseek, got '%s'\n",
                    v);
            return 2;
        }
        return 0;
    case SO_KV_TYPE:
        return cli__parse_kv_type(v, &c->kv_type) ? 0 : 2;
    case SO_DATA_PLANE:
        if (!strcmp(v, "tls") || !strcmp(v, "ucx")) {
            c->data_plane = !strcmp(v, "ucx");
            return 0;
        }
        fprintf(stderr, "kvseal: --data-plane expects tls or ucx, got '%s'\n", v);
        return 2;
    case SO_LORA: // PATH[:SCALE], cut by cmd_cluster.c
        if (reset) c->n_lora = 0; // the command line's adapters replace the file's
        if (c->n_lora == SERVE_MAX_LORA) {
            fprintf(stderr, "kvseal: at most %d --lora adapters\n", SERVE_MAX_LORA);
            return 2;
        }
        if (!(c->lora[c->n_lora] = serve__keep(c, v))) return 2;
        c->n_lora++;
        return 0;
    case SO_CORS_ORIGIN:
        if (reset) c->n_cors = 0; // the command line's origins replace the file's
        if (c->n_cors == SERVE_MAX_CORS) {
            fprintf(stderr, "kvseal: at most %d --cors-origin values\n", SERVE_MAX_CORS);
            return 2;
        }
        if (!server_cors_origin_valid(v)) {
            fprintf(stderr,
                    "kvseal: --cors-origin expects '*' or an origin such as "
                    "https://app.example.com (scheme://host[:port], no path), got '%s'\n",
                    v);
            return 2;
        }
        if (!(c->cors[c->n_cors] = serve__keep(c, v))) return 2;
        c->n_cors++;
        return 0;
    case SO_POOLING: {
        model_pooling pm;
        if (!model_pooling_parse(v, &pm)) {
            fprintf(stderr, "kvseal: --pooling expects mean, cls or last, got '%s'\n", v);
            return 2;
        }
        c->pooling = (int)pm;
        return 0;
    }
    default:
        KS_ASSERT(!"serve option without a case");
    }
    return 2;
}

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
    c->spec_tokens = d.spec_tokens;
    c->spec_ngram_min = d.spec_ngram_min;
    c->spec_ngram_max = d.spec_ngram_max;
    c->spec_max_batch = d.spec_max_batch;
    c->grammar_budget_ms = (long)(d.grammar_budget_us / 1000);
    c->grammar_cpu_ms = (long)(d.grammar_cpu_us / 1000);
    server_opts so;
    server_opts_default(&so);  // the server's defaults are the only copy of them
    c->idle_timeout = so.idle_timeout_s;
    c->responses_ttl = (long)so.responses_ttl_s;
    c->responses_max = (long)so.responses_max;
    c->responses_max_bytes = (long)so.responses_max_bytes;
    c->max_adapter_mb = (long)(so.max_adapter_bytes >> 20);
    c->request_timeout = so.request_timeout_s;
    c->max_conns = so.max_connections;
    c->max_conns_per_ip = so.max_connections_per_ip;
    c->scrub = d.scrub;
    c->kv_type = d.kv_type;
    c->health_interval_ms = 1000;
    c->drain_timeout_ms = 30000;
    c->cluster_port = -1; // unset: the router's 7070 (0 is "any free port")
    c->health_port = -1;  // unset: no worker health endpoint
    c->tool_call_format = so.tool_call_format;
    c->reasoning_format = so.reasoning_format;
    const cli__spec sp = {argv[0], serve__opts, SO__N, serve__apply, serve__usage, true, false};
    int rc = cli__opts_parse(&sp, c, argc, argv, NULL);
    if (rc) return rc;
    char *comma = c->n_models_given ? strchr(c->model_path, ',') : NULL;
    if (comma) {  // -m PATH,ALIAS[,ALIAS...]: those aliases first, then --alias's
        *comma = 0; // model_path is ours (serve__keep) once a -m was given
        const char *given[SERVE_MAX_ALIASES];
        int n_given = c->n_aliases;
        memcpy(given, c->aliases, sizeof given);
        c->n_aliases = 0;
        for (char *a = comma + 1, *next; a; a = next) {
            if ((next = strchr(a, ','))) *next++ = 0;
            if (*a && (rc = serve__apply(c, SO_ALIAS, a, false))) return rc;
        }
        for (int i = 0; i < n_given; i++)
            if ((rc = serve__apply(c, SO_ALIAS, given[i], false))) return rc;
    }
    if (c->kv_pages && c->kv_memory) {
        fprintf(stderr, "kvseal %s: give --kv-pages or --kv-memory, not both\n", argv[0]);
        return 2;
    }
    return 0;
}

void serve__cfg_free(serve__cfg *c) {
    if (!c) return;
    server_tls_free(c->tls_cert_pem);
    server_tls_free(c->tls_key_pem);
    c->tls_cert_pem = c->tls_key_pem = NULL;
    for (int i = 0; i < c->n_strings; i++)
        free(c->strings[i]);
    free(c->strings);
    c->strings = NULL;
    c->n_strings = 0;
}

/* Reads the model file through once before model_load maps it, reporting
 * progress: on a terminal (text logs) one line updated in place with the
 * percent and MB/s, else a log line at each 25%. The weights are mmapped
 * (never copied); this read only brings the file into the page cache, which
 * is where a cold start spends its time, so that the wait is visible. The
 * rate is said once more, in the "model loaded" line, after model_load.
 * Reports the file's size in *bytes_out (0 if it cannot be read: model_load
 * then says why). */
static void serve__preload(const char *path, uint64_t *bytes_out) {
    *bytes_out = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0) return;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        close(fd);
        return;
    }
    uint64_t size = (uint64_t)st.st_size, done = 0;
    *bytes_out = size;
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    bool tty = isatty(2) && ks_log_get_format() == KS_LOG_TEXT;
    enum { CHUNK = 1 << 22 };
    char *buf = malloc(CHUNK);
    uint64_t t0 = ks_now_ns(), t_shown = 0;
    int next_q = 1; // the next quarter to log
    while (buf && done < size) {
        ssize_t n = read(fd, buf, CHUNK);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += (uint64_t)n;
        uint64_t now = ks_now_ns();
        double mb = (double)done / 1e6, s = (double)(now - t0) * 1e-9;
        double rate = s > 0 ? mb / s : 0;
        int pct = (int)(done * 100 / size);
        if (tty && (now - t_shown > 100000000ull || done == size)) { // 10 a second at most
            t_shown = now;
            fprintf(stderr, "\rloading model: %3d%% (%.0f of %.0f MB, %.0f MB/s)", pct, mb,
                    (double)size / 1e6, rate);
            fflush(stderr);
        } else if (!tty && next_q < 4 && done * 4 >= size * (uint64_t)next_q) {
            while (next_q < 4 && done * 4 >= size * (uint64_t)(next_q + 1))
                next_q++; // a read that jumps several quarters says the last
            ks_log(KS_LOG_INFO, "loading model: %d%% (%.0f of %.0f MB, %.0f MB/s)", pct, mb,
                   (double)size / 1e6, rate);
            next_q++;
        }
    }
    if (tty) fputc('\n', stderr);
    free(buf);
    close(fd);
}

/* Whether host:port can be bound now: a trial bind (SO_REUSEADDR, as
 * libmicrohttpd binds) closed at once, so that a port in use fails the start
 * in a moment rather than after the model's load. The HTTP server binds for
 * real later; a race in between still fails there, with the same message.
 * Port 0 (any free port) always passes. */
static bool serve__port_free(const char *host, long port, char *why, size_t cap) {
    if (port == 0) return true;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%ld", port);
    int gai = getaddrinfo(host, ps, &hints, &ai);
    if (gai != 0 || !ai) {
        snprintf(why, cap, "cannot resolve listen address '%s': %s", host, gai_strerror(gai));
        return false;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, err = 0;
    if (fd < 0)
        err = errno;
    else if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
             bind(fd, ai->ai_addr, ai->ai_addrlen) != 0)
        err = errno;
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
    if (err) snprintf(why, cap, "cannot listen on %s:%ld: %s", host, port, strerror(err));
    return err == 0;
}

/* Shared start of serve and check: parse, load, size, check. Returns -1 to
 * continue, else the exit status. */
int serve__prepare(int argc, char **argv, serve__cfg *c, model **m, engine_opts *o,
                          FILE *report) {
    int rc = serve__parse(argc, argv, c);
    if (rc) return rc < 0 ? 0 : rc;
    if ((c->draft_model || c->spec_nextn) && strcmp(argv[0], "serve") != 0) {
        fprintf(stderr, "kvseal %s: --%s is kvseal serve's (cluster workers do not draft yet)\n",
                argv[0], c->draft_model ? "draft-model" : "spec-nextn");
        return 2;
    }
    if (c->n_lora && strcmp(argv[0], "prefill") != 0 && strcmp(argv[0], "decode") != 0) {
        fprintf(stderr, "kvseal %s: --lora is the cluster workers' (kvseal serve and the router "
                "take adapters from the tenants file's \"adapters\")\n", argv[0]);
        return 2;
    }
    if (c->draft_model && c->spec_nextn) {
        fprintf(stderr, "kvseal %s: --draft-model or --spec-nextn, not both\n", argv[0]);
        return 2;
    }
    const bool multi_cmd = !strcmp(argv[0], "serve") || !strcmp(argv[0], "check");
    if (c->n_more_models && strcmp(argv[0], "router") != 0 && !multi_cmd) {
        fprintf(stderr, "kvseal %s: one --model only (kvseal serve and router front several)\n",
                argv[0]);
        return 2;
    }
    if ((c->models_dir || c->models_config || c->models_memory || c->models_max_loaded) &&
        !multi_cmd) {
        fprintf(stderr, "kvseal %s: --models-dir, --models-config, --models-memory and "
                "--models-max-loaded are kvseal serve's\n", argv[0]);
        return 2;
    }
    if (serve__multi(c, argv[0]) && (c->draft_model || c->spec_nextn)) {
        fprintf(stderr, "kvseal %s: --%s works with one model only (not with -m repeated or "
                "--models-dir)\n", argv[0], c->draft_model ? "draft-model" : "spec-nextn");
        return 2;
    }
    // HTTPS: the certificate and key read and checked before the model loads
    if (c->ssl_cert_file || c->ssl_key_file) {
        if (!strcmp(argv[0], "prefill") || !strcmp(argv[0], "decode")) {
            fprintf(stderr,
                    "kvseal %s: --ssl-cert-file/--ssl-key-file are kvseal serve's and "
                    "router's (workers serve no HTTP API)\n",
                    argv[0]);
            return 2;
        }
        if (!c->ssl_cert_file || !c->ssl_key_file) {
            fprintf(stderr,
                    "kvseal %s: %s needs %s too (HTTPS takes the certificate and its "
                    "key)\n",
                    argv[0], c->ssl_cert_file ? "--ssl-cert-file" : "--ssl-key-file",
                    c->ssl_cert_file ? "--ssl-key-file" : "--ssl-cert-file");
            return 2;
        }
        ks_errbuf teb = {0};
        ks_err te = server_tls_load(c->ssl_cert_file, c->ssl_key_file, &c->tls_cert_pem,
                                    &c->tls_key_pem, &teb);
        if (te) {
            fprintf(stderr, "kvseal %s: %s\n", argv[0], teb.msg[0] ? teb.msg : ks_strerror(te));
            return 2;
        }
    }
    ks_errbuf eb = {0};
    // the HTTP port before the model: "address in use" in a moment, not after the load
    bool http = !strcmp(argv[0], "serve") || !strcmp(argv[0], "router");
    if (http && report == stderr && !serve__port_free(c->host, c->port, eb.msg, sizeof eb.msg)) {
        ks_log(KS_LOG_ERROR, "%s: %s", argv[0], eb.msg);
        cli__notify("STATUS=failed: %s", eb.msg);
        return 1;
    }
    if (kern_init(NULL, &eb)) {
        ks_log(KS_LOG_ERROR, "%s: %s", argv[0], eb.msg);
        return 1;
    }
    if (serve__multi(c, argv[0])) return -1; // serve__models_main loads and checks each model
    cli__notify("STATUS=loading %s", c->model_path);
    uint64_t t_load = ks_now_ns(), bytes = 0;
    if (report == stderr) serve__preload(c->model_path, &bytes);
    // the router only tokenizes: its model's weights stay in the file, unpacked
    ks_err (*load)(const char *, model **, ks_errbuf *) =
        strcmp(argv[0], "router") ? model_load : model_load_unpacked;
    if (load(c->model_path, m, &eb) || model_kv_type_check(*m, c->kv_type, &eb)) {
        ks_log(KS_LOG_ERROR, "%s: %s", argv[0], eb.msg);
        return 1;
    }
    if (bytes) {
        double s = (double)(ks_now_ns() - t_load) * 1e-9;
        ks_log(KS_LOG_INFO, "model loaded: %.0f MB in %.2f s (%.0f MB/s)", (double)bytes / 1e6, s,
               s > 0 ? (double)bytes / 1e6 / s : 0.0);
    }
    serve__engine_opts(c, *m, o);
    char buf[1024];
    bool warn = false;
    ks_err e = engine_capacity_check(o, &warn, buf, sizeof buf);
    if (report == stderr) { // a log line each, so that a json log stays json
        for (char *line = buf, *nl; line && *line; line = nl ? nl + 1 : NULL) {
            nl = strchr(line, '\n');
            if (nl) *nl = '\0';
            // info even when it does not fit: the refusal below is the one error
            ks_log(KS_LOG_INFO, "%s", line);
        }
        o->sizing_logged = true; // engine_create does not say it again
    } else {
        fprintf(report, "%s\n", buf);
        fflush(report);
    }
    if (e) {
        const char *what = report == stdout ? "check failed" : "refusing to start";
        if (report == stdout)
            fprintf(stderr,
                    "kvseal %s: %s: the KV pool cannot hold one request of the advertised "
                    "context length %d (I8); raise --kv-pages/--kv-memory or lower --ctx\n",
                    argv[0], what, o->n_ctx);
        else
            ks_log(KS_LOG_ERROR,
                   "%s: %s: the KV pool cannot hold one request of the advertised "
                   "context length %d (I8); raise --kv-pages/--kv-memory or lower --ctx",
                   argv[0], what, o->n_ctx);
        cli__notify("STATUS=%s: the KV pool cannot hold one request of context %d", what, o->n_ctx);
        return 1;
    }
    if (warn)
        ks_log(KS_LOG_WARN,
               "the KV pool holds less than 2 requests of the full context (%d tokens)", o->n_ctx);
    return -1;
}

int cli_check(int argc, char **argv) {
    serve__cfg c;
    model *m = NULL;
    engine_opts o;
    int rc = serve__prepare(argc, argv, &c, &m, &o, stdout);
    if (rc < 0 && serve__multi(&c, argv[0])) rc = serve__models_main(argv[0], &c, stdout);
    model_free(m);
    serve__cfg_free(&c);
    return rc < 0 ? 0 : rc;
}

int cli_serve(int argc, char **argv) {
    serve__cfg c;
    model *m = NULL, *dm = NULL; // the model, the draft model (--draft-model)
    engine_opts o;
    engine *e = NULL;
    server *s = NULL;
    server_seclog *sl = NULL;
    int rc = serve__prepare(argc, argv, &c, &m, &o, stderr);
    if (rc < 0 && serve__multi(&c, argv[0])) rc = serve__models_main(argv[0], &c, stderr);
    if (rc >= 0) {
        model_free(m);
        serve__cfg_free(&c);
        return rc;
    }
    rc = 1;
    ks_errbuf eb = {0};
    // every thread started from here on inherits this mask: only sigwait below
    // sees SIGINT/SIGTERM
    sigset_t sigs;
    serve__block_signals(&sigs);
    char name[256];
    serve__model_name(c.model_path, name, sizeof name);
    if (server_seclog_open(c.security_log, &sl, &eb)) goto fail;
    if (c.draft_model) { // speculative decoding's drafts from a second model (docs/speculative.md)
        if (model_load(c.draft_model, &dm, &eb) || model_kv_type_check(dm, c.kv_type, &eb)) {
            ks_log(KS_LOG_ERROR, "serve: draft model %s: %s", c.draft_model, eb.msg);
            goto done;
        }
        o.draft = dm;
        if (!o.spec_tokens) o.spec_tokens = 4;
        ks_log(KS_LOG_INFO, "speculative decoding: up to %d drafts a step from %s", o.spec_tokens,
               c.draft_model);
    }
    if (c.spec_nextn) { // drafts from the model's own NextN block
        if (!model_has_mtp(m)) {
            ks_log(KS_LOG_ERROR,
                   "serve: --spec-nextn: %s has no NextN (multi-token prediction) block to draft "
                   "with (%s.nextn_predict_layers is 0, or its blocks are not plain ones)",
                   c.model_path, model_hp(m)->arch_name);
            goto done;
        }
        o.spec_nextn = true;
        if (!o.spec_tokens) o.spec_tokens = 4;
        ks_log(KS_LOG_INFO, "speculative decoding: up to %d drafts a step from the model's NextN "
               "block", o.spec_tokens);
    }
    o.on_security_event = server_seclog_write;
    o.event_ctx = sl;
    if (engine_create(&o, &e, &eb)) goto fail;
    server_backend be;
    server_engine_backend(e, &be);
    if (serve__http_start(&c, o.n_ctx, name, &be, m, NULL, 0, &s, &eb)) goto fail;
    // a json log line carries these as fields (jansson escapes the strings)
    json_t *f = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:s}", "model", c.model_path, "name",
                          c.n_aliases ? c.aliases[0] : name, "host", c.host, "port",
                          server_port(s), "n_ctx", (int)o.n_ctx, "kv_pages", (int)o.kv_pages,
                          "kernels", kern_get()->name);
    char *fields = f ? json_dumps(f, JSON_COMPACT) : NULL;
    json_decref(f);
    ks_log_fields(KS_LOG_INFO, fields,
                  "serving %s as '%s' (%d aliases), context %d, %u KV pages, kernels %s",
                  c.model_path, c.n_aliases ? c.aliases[0] : name, c.n_aliases, o.n_ctx,
                  o.kv_pages, kern_get()->name);
    free(fields);
    serve__run_until_signal(s, &be, &sigs, c.drain_timeout_ms);
    rc = 0;
    goto done;
fail:
    ks_log(KS_LOG_ERROR, "serve: %s", eb.msg[0] ? eb.msg : ks_strerror(eb.code));
    cli__notify("STATUS=failed: %s", eb.msg[0] ? eb.msg : ks_strerror(eb.code));
done:
    server_destroy(s);
    engine_destroy(e);
    server_seclog_close(sl);
    model_free(dm);
    model_free(m);
    serve__cfg_free(&c);
    return rc;
}
