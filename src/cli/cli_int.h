/* cli_int.h — helpers shared by the subcommands: option parsing, loading a
 * model with a KV pool and a forward context, and a one-sequence runner. */
#ifndef KS_CLI_INT_H
#define KS_CLI_INT_H

#include "kvseal/cli.h"
#include "kvseal/model.h"

#include <signal.h>
#include <stdio.h>

/* A loaded model ready to run single sequences. */
typedef struct cli__session {
    model *m;
    kv_pool *pool;
    model_ctx *ctx;
    kv_seq seq;
    int n_threads;
    int32_t n_ctx;      // positions available to the sequence
    int32_t n_batch;    // tokens per forward call
    int kv_type;        // KV element type of the pool (kv.h)
    model_lora *lora;   // the sequence's LoRA adapter (NULL: none; cli__session_lora)
} cli__session;

/* Default thread count: online CPUs. */
int cli__default_threads(void);

/* Loads path with a pool of n_ctx positions of KV type kv_type (kv.h) and
 * batches of n_batch tokens. n_ctx <= 0 means the model's training context.
 * On failure prints the error (naming the file) to stderr and returns it. */
ks_err cli__session_open(cli__session *s, const char *path, int n_threads, int32_t n_ctx,
                         int32_t n_batch, int kv_type);
/* Loads the LoRA adapter at path (scale: --lora-scale) for the session's
 * sequence. On failure prints the error (naming the file) to stderr and
 * returns it; the session is unchanged. */
ks_err cli__session_lora(cli__session *s, const char *path, double scale);
/* Frees everything; accepts a zeroed session. */
void cli__session_close(cli__session *s);

/* Feeds tokens [0, n) to the empty-or-partial sequence in n_batch chunks.
 * If logits is non-NULL, writes the logits of every token whose index i
 * satisfies i >= first_logit into logits[(i - first_logit) * V]; if
 * last_logits is non-NULL, writes the last token's logits there. */
ks_err cli__session_eval(cli__session *s, const int32_t *toks, int32_t n, int32_t first_logit,
                         float *logits, float *last_logits, ks_errbuf *eb);

/* Parses a non-negative int / float option value; prints and returns false
 * on junk. */
bool cli__parse_int(const char *opt, const char *v, long lo, long hi, long *out);
bool cli__parse_float(const char *opt, const char *v, double *out);
/* Parses --kv-type's value (f32, f16, q8_0); on a bad one prints the error
 * listing the choices and returns false. */
bool cli__parse_kv_type(const char *v, int *out /* OUT */);

/* Reads a whole file into a malloc'd NUL-terminated buffer; NULL + message
 * on failure. */
char *cli__read_file(const char *path, size_t *len);

// ----------------------------------------------------------------------------
// Options (opts.c): getopt_long over a table, config files, --version

/* One option of a subcommand. */
typedef struct cli__opt {
    const char *name; // long name without "--"; also the config-file key
    int short_name;   // 'm' for -m, or 0
    bool has_arg;     // takes a value (else a flag: apply gets "true"/"false")
    bool repeat;      // may be given more than once (--alias)
} cli__opt;

/* A subcommand's options and what to do with each. */
typedef struct cli__spec {
    const char *cmd; // subcommand name, for messages
    const cli__opt *opts;
    int n_opts;
    /* Applies option opts[id] with its value (flags: "true" or "false").
     * reset: the first command-line occurrence of a repeatable option, which
     * replaces the values a config file gave. Returns 0, or 2 after printing
     * what is wrong with the value. */
    int (*apply)(void *ctx, int id, const char *val, bool reset);
    void (*usage)(const char *cmd); // prints the usage to stderr
    bool config;                    // accepts --config FILE
    bool args_last;                 // options end at the first positional argument (a text
                                    // that may start with '-' follows them)
} cli__spec;

/* Parses argv (argv[0] the subcommand) by getopt_long: sp's options, plus
 * -h/--help, --log-format text|json and --log-level LEVEL (applied at once)
 * and, where sp->config, --config FILE or KVSEAL_CONFIG (applied first).
 * Each option's KVSEAL_<NAME> environment variable (cli__opt_env_name) is
 * applied after the file and before the command line, which overrides both.
 * With first_arg NULL a positional argument is an error; else *first_arg is
 * the index of the first one (argv permuted: the positional arguments
 * last). Returns 0, 2 after printing the error and
 * the usage (unknown option, missing value, bad value or config line), or
 * -1 once help is printed. Not thread-safe (getopt's globals). */
int cli__opts_parse(const cli__spec *sp, void *ctx, int argc, char **argv, int *first_arg);
/* Writes the environment variable of the long option opt into buf:
 * "KVSEAL_" + opt upper-cased with '-' as '_' ("ssl-cert-file":
 * KVSEAL_SSL_CERT_FILE). Returns its length, or -1 when cap is too small;
 * can't fail otherwise. */
int cli__opt_env_name(const char *opt, char *buf, size_t cap);
/* Applies the `key = value` lines of the config file at path through sp
 * (keys: sp's long option names, log-format, log-level; '#' starts a comment
 * line; a value in double quotes keeps its blanks). Returns 0, or 2 after
 * printing the error with the file and line (unknown key, bad value,
 * a key given twice unless repeatable, unreadable file). */
int cli__config_load(const cli__spec *sp, void *ctx, const char *path);
/* The "+/-" of perplexity's final line from the sums of the count per-token
 * NLLs (nll) and of their squares (nll2): the standard error of the mean NLL
 * propagated to exp(mean). -1 when count < 2 or the spread is not positive. */
double cli__ppl_stderr(double nll, double nll2, long count);
/* Mean and sample standard deviation (n - 1; 0 for n < 2) of x[0..n). */
void cli__stats(const double *x, int n, double *mean /* OUT */, double *sd /* OUT */);
/* Prints kvseal's version, git describe, CPU features, kernel set, sd_notify
 * support and whether this is a TEST-ONLY KS_BROKEN build; can't fail. */
void cli__version_print(FILE *f);

// ----------------------------------------------------------------------------
// The models directory (util.c) and `kvseal pull`'s pure parts (pull_hub.c):
// the spec, the hub's file list, choosing a file, checking a name

/* The models directory's default, written into buf: $KVSEAL_MODELS_DIR when
 * set and non-empty, else $HOME/.cache/kvseal/models. Returns buf, or NULL
 * when neither variable is set or the path does not fit in cap. Creates
 * nothing (the caller does, mode 0700); reads the environment only. */
const char *cli__models_dir_default(char *buf, size_t cap);

/* What `kvseal pull` was asked for: ORG/REPO[:QUANT] or ORG/REPO/path.gguf
 * (an "hf.co/" or "https://huggingface.co/" prefix is dropped). */
typedef struct cli__pull_spec {
    char repo[200];  // "org/name": [A-Za-z0-9._-], no "..", no leading '.' or '-'
    char quant[64];  // the ":QUANT" tag ([A-Za-z0-9._-]), "" when none
    char path[1024]; // the file's path in the repository (third form), "" when none
} cli__pull_spec;

/* Parses s into *sp. Returns KS_OK, or KS_ERR_INVAL with eb saying what is
 * wrong (no '/', a bad character, a path that cli__pull_name_check refuses). */
ks_err cli__pull_spec_parse(const char *s, cli__pull_spec *sp /* OUT */, ks_errbuf *eb) KS_MUST_USE;

/* One file of a repository, as the hub's tree API lists it. */
typedef struct cli__hub_file {
    char *path;      // path in the repository (malloc'd, owned by the list); untrusted
    int64_t size;    // bytes (lfs.size for an LFS file)
    char sha256[65]; // lfs.oid, lowercase hex; "" when the file is not in LFS
} cli__hub_file;

/* A repository's files (every page of the listing); zero-initialize. */
typedef struct cli__hub_list {
    cli__hub_file *v;
    int n, cap;
} cli__hub_list;

/* Appends the files (type "file"; directories are skipped) of one page of
 * the tree API's JSON array to l. Returns KS_OK, KS_ERR_FORMAT (eb names the
 * entry and field) or KS_ERR_NOMEM; on error l keeps the earlier entries. */
ks_err cli__hub_list_parse(cli__hub_list *l, const char *json, size_t len, ks_errbuf *eb) KS_MUST_USE;
/* Frees l's entries and array and zeroes it; accepts a zeroed list. */
void cli__hub_list_free(cli__hub_list *l);

/* The .gguf files of l that quant picks: those whose file name contains it
 * case-insensitively, narrowed, when several do, to those where it stands
 * alone (no letter, digit or '_' beside it: "Q4_K" then matches
 * "x-Q4_K.gguf" but not "x-Q4_K_M.gguf"). quant NULL or "": every .gguf.
 * Multimodal projectors (names containing "mmproj") are never picked.
 * Writes up to cap indexes of l->v into idx and returns how many matched
 * (possibly more than cap); can't fail. */
int cli__pull_choose(const cli__hub_list *l, const char *quant, int *idx /* OUT */, int cap);

/* True when path's file name is one shard of a split GGUF
 * ("...-00001-of-00003.gguf"); can't fail. */
bool cli__pull_is_shard(const char *path);

/* Checks a file path that came from the hub or the command line before any
 * part of it names a file here: refuses an empty or over-long path, a
 * leading '/', an empty, "." or ".." component, a backslash, control
 * characters, a file name that starts with '.' or does not end in ".gguf".
 * On KS_OK *base points at the file name inside path (what is written to
 * the models directory); else KS_ERR_INVAL with eb saying why. */
ks_err cli__pull_name_check(const char *path, const char **base /* OUT */, ks_errbuf *eb) KS_MUST_USE;

// ----------------------------------------------------------------------------
// Service manager readiness (notify.c): sd_notify when built with libsystemd

/* True when built with libsystemd's sd_notify. */
bool cli__notify_available(void);
/* Sends one sd_notify state ("READY=1", "STATUS=...", printf format) to
 * $NOTIFY_SOCKET; does nothing without one or without libsystemd. Never
 * fails the caller: an error is logged at debug level. */
void cli__notify(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// ----------------------------------------------------------------------------
// Server and cluster options (cmd_serve.c), shared by serve, check, router,
// prefill and decode

#include "kvseal/engine.h"
#include "kvseal/server.h"

#define SERVE_MAX_ALIASES 16
#define SERVE_MAX_MODELS 16 /* further -m values (the router's catalog) */
#define SERVE_MAX_CORS 16
#define SERVE_MAX_ROUTERS 16 /* CLUSTER_MAX_ROUTERS */
#define SERVE_MAX_LORA 64    /* --lora adapters of a cluster worker */

typedef struct serve__cfg {
    const char *model_path, *host, *tenants, *admin_key, *metrics_key, *security_log;
    const char *chat_template_file; /* --chat-template-file: overrides the model's template */
    const char *draft_model;        /* --draft-model: speculative decoding's drafts (serve) */
    long port;
    const char *aliases[SERVE_MAX_ALIASES];
    int n_aliases;
    const char *more_models[SERVE_MAX_MODELS]; /* -m after the first: "PATH[,ALIAS...]" (router) */
    int n_more_models;
    int n_models_given; /* private: -m values seen in the current source (file, argv) */
    const char *cors[SERVE_MAX_CORS]; /* --cors-origin ORIGIN|* (repeatable; none: CORS off) */
    int n_cors;
    long ctx, kv_pages, page_tokens, threads, max_running, queue_max, queue_timeout_ms, batch;
    long grammar_budget_ms, grammar_cpu_ms; /* engine_opts' mask budgets */
    long spec_tokens, spec_ngram_min, spec_ngram_max, spec_max_batch; /* engine_opts' spec_* */
    long idle_timeout, request_timeout, max_conns, max_conns_per_ip;
    long embed_max_tokens; /* --embed-max-tokens (0: the server's default) */
    long responses_ttl, responses_max, responses_max_bytes; /* /v1/responses' store bounds */
    long max_adapter_mb; /* POST /admin/adapters' largest body, MiB */
    uint64_t kv_memory;
    bool no_prefix_cache, log_content;
    bool spec_nextn; /* --spec-nextn: drafts from the model's NextN block (serve) */
    bool insecure_plaintext; /* cluster roles: --insecure-plaintext (no TLS) */
    int data_plane; /* prefill/decode: --data-plane (PD_PLANE_TLS 0, PD_PLANE_UCX 1) */
    kv_scrub scrub;
    int kv_type; /* --kv-type (kv.h), default the engine's (f16) */
    int pooling; /* --pooling (model_pooling): embeddings; 0 = the model's */
    int tool_call_format; /* --tool-call-format (server_opts), -1: the template's */
    int reasoning_format; /* --reasoning-format (server_opts), -1: the template's */
    // cluster roles (kvseal router / prefill / decode)
    const char *secret_file, *data_host, *advertise_host, *cluster_host;
    const char *limits_redis, *limits_redis_prefix; /* --limits-redis HOST:PORT, key prefix */
    double limits_local_share;                      /* --limits-local-share (0: default 1) */
    const char *routers[SERVE_MAX_ROUTERS]; /* --router HOST:PORT (repeatable, or a comma list) */
    int n_routers;
    const char *lora[SERVE_MAX_LORA]; /* prefill/decode: --lora PATH[:SCALE] (repeatable) */
    int n_lora;
    long data_port, cluster_port, health_interval_ms, drain_timeout_ms; // cluster_port -1: unset
    const char *ssl_cert_file, *ssl_key_file; /* serve/router: HTTPS (both or neither) */
    char *tls_cert_pem, *tls_key_pem;         /* their PEM text, read and checked by serve__prepare
                                                 before the model loads (serve__cfg_free frees) */
    const char *models_dir;    /* serve: --models-dir DIR (every *.gguf a model) */
    const char *models_config; /* serve: --models-config FILE (default DIR/models.json) */
    uint64_t models_memory;    /* serve, several models: --models-memory (0: 3/4 MemAvailable) */
    long models_max_loaded;    /* serve, several models: --models-max-loaded (0: no limit) */
    const char *health_host; /* workers: --health-host (127.0.0.1) */
    long health_port;        /* workers: --health-port (-1: no health endpoint; 0: any) */
    char **strings; /* private: copies of string values (serve__cfg_free) */
    int n_strings;
} serve__cfg;

/* Prints the options of serve and the cluster roles. */
void serve__usage(const char *cmd);
/* Parses argv (and a --config FILE) into c (overwritten); whatever the
 * result, free c with serve__cfg_free. Returns 0 ok, 2 usage error
 * (printed), -1 help printed. */
int serve__parse(int argc, char **argv, serve__cfg *c);
/* Frees the strings c holds (from any parse, good or not); c may be NULL. */
void serve__cfg_free(serve__cfg *c);
/* Fills o from c and m (engine defaults, pool sized from --kv-pages,
 * --kv-memory or MemAvailable); logs how the pool was sized. */
void serve__engine_opts(const serve__cfg *c, const model *m, engine_opts *o);
/* The model's own name: the file's basename without ".gguf". */
void serve__model_name(const char *path, char *buf, size_t cap);
/* Starts the HTTP front (server_create_backend) with c's server options on
 * backend be, serving the model as name and the n_more further catalog
 * entries more (the router's; all borrowed: they must outlive the
 * server), and prints "listening on http://HOST:PORT" to stdout. Errors:
 * server_create's. */
ks_err serve__http_start(const serve__cfg *c, int32_t n_ctx, const char *name, const server_backend *be,
                         const model *m, const server_model *more, int n_more,
                         server **s /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* Parse, load the model, size and check the pool (I8), report to `report`
 * (stderr: through the log). Returns -1 to continue, else the exit status;
 * either way the caller frees c (serve__cfg_free) and *m. */
int serve__prepare(int argc, char **argv, serve__cfg *c, model **m, engine_opts *o, FILE *report);
/* True when c asks `kvseal serve` or `check` (cmd) for several models: -m
 * repeated or --models-dir (serve_models.c serves them; the router has its
 * own catalog). */
bool serve__multi(const serve__cfg *c, const char *cmd);
/* kvseal serve / check with several models (serve__multi): builds the
 * catalog, loads each model's tokenizer and checks its pool (I8, reported
 * to `report`), then (serve) starts the HTTP front over a backend that loads
 * each model's engine on first use and unloads the least recently used under
 * --models-memory, until a signal. Returns the exit status. */
int serve__models_main(const char *cmd, serve__cfg *c, FILE *report);
/* MemAvailable in bytes, 0 if unknown. */
uint64_t serve__mem_available(void);
/* "512M", "4G", "1048576" -> bytes (binary suffixes); false when malformed. */
bool serve__parse_bytes(const char *v, uint64_t *out);
/* Blocks SIGINT and SIGTERM in this thread and every thread it starts from
 * here on (only serve__run_until_signal's sigwait sees them; sigs is the
 * set), and ignores SIGPIPE. */
void serve__block_signals(sigset_t *sigs /* OUT */);
/* Runs an HTTP front until the first signal in sigs (blocked in every
 * thread), then shuts it down: s refuses new generations (server_drain)
 * while those in flight run to their end for up to drain_ms (a second
 * signal cuts it short), stops accepting and aborts what is left through be.
 * The caller then destroys the server and the backend. */
void serve__run_until_signal(server *s, const server_backend *be, const sigset_t *sigs,
                             long drain_ms);

#endif
