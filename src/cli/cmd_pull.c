/* cmd_pull.c — `kvseal pull ORG/REPO[:QUANT]`: downloads a GGUF file from a
 * Hugging Face repository (or an endpoint with the same API) into the models
 * directory (docs/models.md "Downloading models: kvseal pull").
 *
 * It lists the repository (GET {endpoint}/api/models/ORG/REPO/tree/REV,
 * every page), picks the file (pull_hub.c), then fetches
 * {endpoint}/ORG/REPO/resolve/REV/PATH with libcurl, following the hub's
 * redirect to its CDN, into DIR/NAME.part: resumed with a Range request
 * when a part is there, retried with backoff on transient failures, hashed
 * (SHA-256, libsodium) as it is written, checked against the listing's
 * lfs.oid and size and the GGUF magic, then fsynced and renamed to DIR/NAME.
 * The token (HF_TOKEN, --token-file) goes to the endpoint only: libcurl
 * drops bearer auth on a redirect to another host or port, and a listing's
 * next-page link must stay on the endpoint. The final path is the one line
 * on stdout. Exit status: 0, 1 (network, hub, disk), 2 (usage), 130
 * (interrupted: the part stays for the next run). */
#include "cli_int.h"
#include "kvseal_version.h"

#include <curl/curl.h>
#include <sodium.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define PULL_DEFAULT_ENDPOINT "https://huggingface.co"
#define PULL_MAX_LISTING (64u << 20) /* bytes of one listing page kept in memory */
#define PULL_MAX_PAGES 1000
#define PULL_ERR_BODY 512 /* bytes of an error answer's body kept for the message */

// ----------------------------------------------------------------------------
// Options

static void pull__usage(const char *cmd) {
    (void)cmd;
    fprintf(stderr,
            "usage: kvseal pull ORG/REPO[:QUANT] [options]\n"
            "       kvseal pull ORG/REPO/path/to/file.gguf [options]\n"
            "  downloads a GGUF file from a Hugging Face repository into the models\n"
            "  directory, resumably, checks its SHA-256, and prints its path on stdout\n"
            "  :QUANT                the .gguf whose name holds this tag (Q4_K_M, q8_0, ...);\n"
            "                        without one the repository must hold a single .gguf\n"
            "  --dir DIR             models directory (also --models-dir; default\n"
            "                        $KVSEAL_MODELS_DIR, else ~/.cache/kvseal/models)\n"
            "  --file PATH           the file's exact path in the repository\n"
            "  --revision REV        branch, tag or commit (main)\n"
            "  --endpoint URL        the hub (default $HF_ENDPOINT, else " PULL_DEFAULT_ENDPOINT
            ")\n"
            "  --token-file F        read the access token from F (default $HF_TOKEN, else\n"
            "                        the token huggingface-cli login saved)\n"
            "  --retries N           attempts after a transient failure (5)\n"
            "  --force               replace a different file already under that name\n");
}

enum { PO_DIR, PO_MODELS_DIR, PO_FILE, PO_REVISION, PO_ENDPOINT, PO_TOKEN_FILE, PO_RETRIES,
       PO_FORCE, PO__N };
static const cli__opt pull__opts[PO__N] = {
    [PO_DIR] = {"dir", 0, true, false},
    [PO_MODELS_DIR] = {"models-dir", 0, true, false},
    [PO_FILE] = {"file", 0, true, false},
    [PO_REVISION] = {"revision", 0, true, false},
    [PO_ENDPOINT] = {"endpoint", 0, true, false},
    [PO_TOKEN_FILE] = {"token-file", 0, true, false},
    [PO_RETRIES] = {"retries", 0, true, false},
    [PO_FORCE] = {"force", 0, false, false},
};

typedef struct pull__cfg {
    const char *dir, *file, *revision, *endpoint, *token_file;
    long retries;
    bool force;
} pull__cfg;

static int pull__apply(void *ctx, int id, const char *v, bool reset) {
    pull__cfg *c = ctx;
    (void)reset;
    switch (id) {
    case PO_DIR:
    case PO_MODELS_DIR: c->dir = v; return 0;
    case PO_FILE: c->file = v; return 0;
    case PO_REVISION: c->revision = v; return 0;
    case PO_ENDPOINT: c->endpoint = v; return 0;
    case PO_TOKEN_FILE: c->token_file = v; return 0;
    case PO_RETRIES: return cli__parse_int("--retries", v, 0, 100, &c->retries) ? 0 : 2;
    case PO_FORCE: c->force = !strcmp(v, "true"); return 0;
    }
    return 2;
}

// ----------------------------------------------------------------------------
// Interruption: SIGINT/SIGTERM set a flag that the transfer's progress
// callback and the backoff sleep read, so the part is left consistent

static atomic_int pull__stop;

static void pull__on_signal(int sig) { atomic_store_explicit(&pull__stop, sig, memory_order_relaxed); }

static bool pull__stopped(void) { return atomic_load_explicit(&pull__stop, memory_order_relaxed) != 0; }

// ----------------------------------------------------------------------------
// One HTTP client for the whole pull

typedef struct pull__ctx {
    CURL *h;
    const char *endpoint; // no trailing '/'
    const char *repo;     // "org/name", for messages
    bool have_token;
    long retries;
    char curl_err[CURL_ERROR_SIZE];
    // the response being read (reset at each status line: redirects included)
    long status;
    char x_error_code[64], x_error_msg[256], content_range[128], link_next[2048];
    // the hub's answer before its redirect (kept over the chain)
    char linked_etag[128];
    int64_t linked_size;
    // memory sink (listings, error bodies)
    char *mem;
    size_t mem_len, mem_cap, mem_max;
    // file sink (the download)
    int fd;
    int64_t off, total;        // bytes in the part, hashed; the file's size
    crypto_hash_sha256_state sha;
    bool body_started, range_bad, too_long, restarted;
    int werrno;                // write(2)'s errno when the part could not be written
    // progress
    bool tty;
    const char *name;
    int64_t start_off;         // off when this run began fetching
    uint64_t t_start, t_last;  // ns
    int last_decile;
    bool line_open;            // a progress line without its newline is on the terminal
} pull__ctx;

static void pull__trim(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\r' || s[n - 1] == '\n' || s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
}

/* Copies the header value after "Name:" into dst if line is that header. */
static bool pull__header_is(const char *line, size_t len, const char *name, char *dst, size_t cap) {
    size_t n = strlen(name);
    if (len <= n || line[n] != ':' || strncasecmp(line, name, n) != 0) return false;
    const char *v = line + n + 1;
    size_t vl = len - n - 1;
    while (vl && (*v == ' ' || *v == '\t')) v++, vl--;
    if (vl >= cap) vl = cap - 1;
    memcpy(dst, v, vl);
    dst[vl] = '\0';
    pull__trim(dst);
    return true;
}

static size_t pull__on_header(char *p, size_t sz, size_t nmemb, void *ud) {
    pull__ctx *c = ud;
    size_t len = sz * nmemb;
    char tmp[64];
    if (len > 5 && !strncmp(p, "HTTP/", 5)) {
        const char *sp = memchr(p, ' ', len);
        c->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        c->x_error_code[0] = c->x_error_msg[0] = c->content_range[0] = c->link_next[0] = '\0';
        return len;
    }
    if (pull__header_is(p, len, "x-error-code", c->x_error_code, sizeof c->x_error_code) ||
        pull__header_is(p, len, "x-error-message", c->x_error_msg, sizeof c->x_error_msg) ||
        pull__header_is(p, len, "content-range", c->content_range, sizeof c->content_range))
        return len;
    if (pull__header_is(p, len, "link", c->link_next, sizeof c->link_next)) {
        // keep the rel="next" target only: Link: <URL>; rel="next"
        char *lt = strchr(c->link_next, '<'), *gt = lt ? strchr(lt, '>') : NULL;
        if (!lt || !gt || !strstr(gt, "rel=\"next\"")) {
            c->link_next[0] = '\0';
        } else {
            memmove(c->link_next, lt + 1, (size_t)(gt - lt - 1));
            c->link_next[gt - lt - 1] = '\0';
        }
        return len;
    }
    // the hub's redirect carries the file's sha256 and size (LFS files)
    if (c->status >= 300 && c->status < 400) {
        pull__header_is(p, len, "x-linked-etag", c->linked_etag, sizeof c->linked_etag);
        if (pull__header_is(p, len, "x-linked-size", tmp, sizeof tmp))
            c->linked_size = strtoll(tmp, NULL, 10);
    }
    return len;
}

static size_t pull__on_mem(char *p, size_t sz, size_t nmemb, void *ud) {
    pull__ctx *c = ud;
    size_t len = sz * nmemb;
    if (c->mem_len + len > c->mem_max) {
        if (c->status >= 400) return len; // an error body: the head is enough
        c->too_long = true;
        return 0;
    }
    if (c->mem_len + len + 1 > c->mem_cap) {
        size_t cap = c->mem_cap ? c->mem_cap : 4096;
        while (cap < c->mem_len + len + 1) cap *= 2;
        char *m = realloc(c->mem, cap);
        if (!m) return 0;
        c->mem = m;
        c->mem_cap = cap;
    }
    memcpy(c->mem + c->mem_len, p, len);
    c->mem_len += len;
    c->mem[c->mem_len] = '\0';
    return len;
}

static int pull__on_xfer(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
    (void)ud, (void)dt, (void)dn, (void)ut, (void)un;
    return pull__stopped() ? 1 : 0; // CURLE_ABORTED_BY_CALLBACK
}

/* Sleeps ms unless a signal comes first. */
static void pull__backoff(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (!pull__stopped() && nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Worth another attempt: a dropped or refused connection, a stall, 5xx, 429. */
static bool pull__transient(CURLcode rc, long status) {
    switch (rc) {
    case CURLE_OK: return status >= 500 || status == 429 || status == 408;
    case CURLE_COULDNT_CONNECT:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
        return true;
    default: return false;
    }
}

static bool pull__tls_error(CURLcode rc) {
    switch (rc) {
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_ENGINE_INITFAILED:
        return true;
    default: return false;
    }
}

/* Prints why a request for url failed at the transport level. */
static void pull__say_curl(const pull__ctx *c, CURLcode rc, const char *url) {
    const char *detail = c->curl_err[0] ? c->curl_err : curl_easy_strerror(rc);
    if (pull__tls_error(rc))
        fprintf(stderr,
                "kvseal pull: TLS failure talking to %s: %s (is the system's CA list, "
                "ca-certificates, installed and current?)\n",
                url, detail);
    else if (rc == CURLE_COULDNT_RESOLVE_HOST)
        fprintf(stderr, "kvseal pull: cannot resolve the host of %s: %s\n", url, detail);
    else if (rc == CURLE_COULDNT_CONNECT)
        fprintf(stderr, "kvseal pull: cannot connect to %s: %s\n", url, detail);
    else if (rc == CURLE_TOO_MANY_REDIRECTS || rc == CURLE_UNSUPPORTED_PROTOCOL)
        fprintf(stderr, "kvseal pull: %s: refused redirect: %s\n", url, detail);
    else
        fprintf(stderr, "kvseal pull: %s: %s\n", url, detail);
}

/* Prints what an HTTP error answer from the hub means. */
static void pull__say_status(const pull__ctx *c, const char *what, const char *url) {
    const char *code = c->x_error_code, *msg = c->x_error_msg;
    char *last = NULL; // where the answer came from: the hub, or the host it redirected to
    curl_easy_getinfo(c->h, CURLINFO_EFFECTIVE_URL, &last);
    size_t ne = strlen(c->endpoint);
    if (last && (strncmp(last, c->endpoint, ne) != 0 || (last[ne] != '/' && last[ne] != '\0'))) {
        fprintf(stderr, "kvseal pull: %s: the download host answered HTTP %ld (%.200s)\n", what,
                c->status, last);
        return;
    }
    if (c->status == 401 || c->status == 403) {
        if (c->have_token)
            fprintf(stderr,
                    "kvseal pull: %s: the hub refused the token (HTTP %ld%s%s): check that it is "
                    "valid and has access to %s (a gated repository: accept its conditions on "
                    "its page first)\n",
                    c->repo, c->status, *msg ? ": " : "", msg, c->repo);
        else
            fprintf(stderr,
                    "kvseal pull: %s is gated or private (HTTP %ld%s%s): set HF_TOKEN (or "
                    "--token-file) to an access token that may read it\n",
                    c->repo, c->status, *msg ? ": " : "", msg);
    } else if (c->status == 404 && !strcmp(code, "RevisionNotFound")) {
        fprintf(stderr, "kvseal pull: %s: revision not found (%s)\n", c->repo, url);
    } else if (c->status == 404 && !strcmp(code, "EntryNotFound")) {
        fprintf(stderr, "kvseal pull: %s: %s not found in the repository\n", c->repo, what);
    } else if (c->status == 404) {
        fprintf(stderr,
                "kvseal pull: repository %s not found on %s (a private one needs HF_TOKEN)\n",
                c->repo, c->endpoint);
    } else {
        fprintf(stderr, "kvseal pull: %s: HTTP %ld%s%s (%s)\n", what, c->status, *msg ? ": " : "",
                msg, url);
    }
}

/* Sets the options every request shares. */
static void pull__request(pull__ctx *c, const char *url) {
    curl_easy_setopt(c->h, CURLOPT_URL, url);
    c->curl_err[0] = '\0';
    c->status = 0;
    c->linked_etag[0] = '\0';
    c->linked_size = -1;
    c->too_long = false;
}

/* GETs url into c->mem (at most max bytes), retrying transient failures.
 * Returns 0 with c->status set (any status), or 1 after printing a transport
 * error, 130 when interrupted. */
static int pull__get_mem(pull__ctx *c, const char *url, size_t max) {
    for (long attempt = 0;; attempt++) {
        pull__request(c, url);
        c->mem_len = 0;
        c->mem_max = max;
        curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, pull__on_mem);
        curl_easy_setopt(c->h, CURLOPT_RANGE, NULL);
        curl_easy_setopt(c->h, CURLOPT_ACCEPT_ENCODING, ""); // a listing may come compressed
        CURLcode rc = curl_easy_perform(c->h);
        curl_easy_setopt(c->h, CURLOPT_ACCEPT_ENCODING, NULL);
        if (c->mem) c->mem[c->mem_len] = '\0';
        if (pull__stopped()) return 130;
        if (c->too_long) {
            fprintf(stderr, "kvseal pull: %s: answer over %zu bytes\n", url, max);
            return 1;
        }
        if (!pull__transient(rc, c->status) || attempt >= c->retries) {
            if (rc != CURLE_OK) {
                pull__say_curl(c, rc, url);
                return 1;
            }
            return 0;
        }
        long ms = 500L << (attempt < 5 ? attempt : 5);
        ks_log(KS_LOG_WARN, "pull: %s: %s; retrying in %.1f s", url,
               rc ? curl_easy_strerror(rc) : "server error", (double)ms / 1000);
        pull__backoff(ms);
    }
}

// ----------------------------------------------------------------------------
// Listing and choosing

/* Appends URL-escaped s to dst (cap), keeping '/' when keep_slash. */
static bool pull__url_add(pull__ctx *c, char *dst, size_t cap, const char *s, bool keep_slash) {
    size_t n = strlen(dst);
    while (*s) {
        const char *end = keep_slash ? strchr(s, '/') : NULL;
        size_t len = end ? (size_t)(end - s) : strlen(s);
        char *e = curl_easy_escape(c->h, s, (int)len);
        if (!e) return false;
        int w = snprintf(dst + n, cap - n, "%s%s", e, end ? "/" : "");
        curl_free(e);
        if (w < 0 || (size_t)w >= cap - n) return false;
        n += (size_t)w;
        s += len + (end ? 1 : 0);
    }
    return true;
}

/* Fills l with every file of the repository at rev. 0, 1 or 130. */
static int pull__list(pull__ctx *c, const char *rev, cli__hub_list *l) {
    char url[4096];
    snprintf(url, sizeof url, "%s/api/models/%s/tree/", c->endpoint, c->repo);
    if (!pull__url_add(c, url, sizeof url, rev, false) ||
        strlen(url) + 20 >= sizeof url) {
        fprintf(stderr, "kvseal pull: the revision is too long\n");
        return 1;
    }
    strcat(url, "?recursive=true");
    char api_prefix[1024];
    snprintf(api_prefix, sizeof api_prefix, "%s/api/", c->endpoint);
    for (int page = 0;; page++) {
        int rc = pull__get_mem(c, url, PULL_MAX_LISTING);
        if (rc) return rc;
        if (c->status != 200) {
            pull__say_status(c, "the file list", url);
            return 1;
        }
        ks_errbuf eb = {0};
        if (cli__hub_list_parse(l, c->mem ? c->mem : "", c->mem_len, &eb)) {
            fprintf(stderr, "kvseal pull: %s: %s\n", url, eb.msg);
            return 1;
        }
        if (!c->link_next[0]) return 0;
        // the next page must stay on the endpoint: the token goes with it
        if (strncmp(c->link_next, api_prefix, strlen(api_prefix)) != 0) {
            fprintf(stderr, "kvseal pull: %s: the next page of the list is elsewhere (%.200s): refused\n",
                    url, c->link_next);
            return 1;
        }
        if (page + 1 >= PULL_MAX_PAGES) {
            fprintf(stderr, "kvseal pull: %s: over %d pages in the file list\n", c->repo,
                    PULL_MAX_PAGES);
            return 1;
        }
        snprintf(url, sizeof url, "%s", c->link_next);
    }
}

static void pull__list_files(const cli__hub_list *l, const int *idx, int n, bool gguf_only) {
    for (int k = 0; k < (idx ? n : l->n); k++) {
        const cli__hub_file *f = &l->v[idx ? idx[k] : k];
        size_t np = strlen(f->path);
        if (gguf_only && (np < 5 || strcasecmp(f->path + np - 5, ".gguf") != 0)) continue;
        fprintf(stderr, "  %-60s %10.1f MB\n", f->path, (double)f->size / 1e6);
    }
}

/* Picks the file: --file / the spec's path exactly, else by quant tag.
 * Returns its index, or -1 after printing why (exit 1). */
static int pull__pick(const cli__hub_list *l, const cli__pull_spec *sp, const char *path) {
    if (path && *path) {
        for (int i = 0; i < l->n; i++)
            if (!strcmp(l->v[i].path, path)) return i;
        fprintf(stderr, "kvseal pull: %s has no file %s; its .gguf files:\n", sp->repo, path);
        pull__list_files(l, NULL, 0, true);
        return -1;
    }
    enum { CAP = 64 };
    int idx[CAP];
    int n = cli__pull_choose(l, sp->quant, idx, CAP);
    int shown = n < CAP ? n : CAP;
    if (n == 0) {
        int all = cli__pull_choose(l, NULL, idx, CAP);
        if (all == 0 && !sp->quant[0])
            fprintf(stderr, "kvseal pull: %s holds no .gguf file\n", sp->repo);
        else if (all == 0)
            fprintf(stderr, "kvseal pull: %s holds no .gguf file (looked for %s)\n", sp->repo,
                    sp->quant);
        else {
            fprintf(stderr, "kvseal pull: %s: no .gguf file matches '%s'; there are:\n", sp->repo,
                    sp->quant);
            pull__list_files(l, idx, all < CAP ? all : CAP, false);
        }
        return -1;
    }
    bool shards = true;
    for (int k = 0; k < shown; k++) shards = shards && cli__pull_is_shard(l->v[idx[k]].path);
    if (shards) {
        fprintf(stderr,
                "kvseal pull: %s: %s is split into several files (%s...): split GGUF files are "
                "not supported yet; merge them with llama.cpp's gguf-split --merge\n",
                sp->repo, sp->quant[0] ? sp->quant : "the model", l->v[idx[0]].path);
        return -1;
    }
    if (n > 1) {
        fprintf(stderr,
                "kvseal pull: %s: %s %d .gguf files; name one with :QUANT or --file PATH:\n",
                sp->repo, sp->quant[0] ? "the tag matches" : "no quant tag given and it holds", n);
        pull__list_files(l, idx, shown, false);
        return -1;
    }
    return idx[0];
}

// ----------------------------------------------------------------------------
// Progress

static void pull__progress(pull__ctx *c, bool final) {
    uint64_t now = ks_now_ns();
    if (!final && c->tty && now - c->t_last < 250000000ull) return;
    double secs = (double)(now - c->t_start) / 1e9;
    double rate = secs > 0 ? (double)(c->off - c->start_off) / secs : 0; // bytes/s
    double pct = c->total > 0 ? 100.0 * (double)c->off / (double)c->total : 100;
    if (c->tty) {
        c->t_last = now;
        long eta = rate > 0 ? (long)((double)(c->total - c->off) / rate) : -1;
        char etas[32] = "--:--";
        if (eta >= 0) snprintf(etas, sizeof etas, "%ld:%02ld:%02ld", eta / 3600, eta / 60 % 60, eta % 60);
        fprintf(stderr, "\r%5.1f%%  %9.1f / %.1f MB  %7.1f MB/s  ETA %s   ", pct,
                (double)c->off / 1e6, (double)c->total / 1e6, rate / 1e6, etas);
        if (final) fputc('\n', stderr);
        c->line_open = !final;
        return;
    }
    int decile = (int)(pct / 10);
    if (decile <= c->last_decile && (!final || decile == 10)) return;
    c->last_decile = decile;
    ks_log(KS_LOG_INFO, "pull: %s: %.0f%% (%.1f of %.1f MB, %.1f MB/s)", c->name, pct,
           (double)c->off / 1e6, (double)c->total / 1e6, rate / 1e6);
}

// ----------------------------------------------------------------------------
// Download into the part

/* Parses "bytes A-B/T" (T may be '*'); false on anything else. */
static bool pull__content_range(const char *s, int64_t *a, int64_t *t) {
    long long x, y, z = -1;
    if (strncasecmp(s, "bytes ", 6) != 0) return false;
    if (sscanf(s + 6, "%lld-%lld/%lld", &x, &y, &z) < 2) return false;
    *a = x;
    *t = z;
    return true;
}

static size_t pull__on_file(char *p, size_t sz, size_t nmemb, void *ud) {
    pull__ctx *c = ud;
    size_t len = sz * nmemb;
    if (!c->body_started) {
        c->body_started = true;
        if (c->status == 206) {
            int64_t a, t;
            if (!pull__content_range(c->content_range, &a, &t) || a != c->off ||
                (t >= 0 && t != c->total)) {
                c->range_bad = true;
                return 0;
            }
        } else if (c->status == 200 && c->off > 0) {
            // the server ignored the Range: start over
            c->off = 0;
            crypto_hash_sha256_init(&c->sha);
            c->restarted = true;
        }
    }
    if (c->status != 200 && c->status != 206) return pull__on_mem(p, sz, nmemb, ud);
    if (c->off + (int64_t)len > c->total) {
        c->too_long = true;
        return 0;
    }
    for (size_t done = 0; done < len;) {
        ssize_t w = pwrite(c->fd, p + done, len - done, (off_t)(c->off + (int64_t)done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            c->werrno = w < 0 ? errno : EIO;
            return 0;
        }
        done += (size_t)w;
    }
    crypto_hash_sha256_update(&c->sha, (const unsigned char *)p, len);
    c->off += (int64_t)len;
    pull__progress(c, false);
    return len;
}

/* Hashes the part's first c->off bytes into c->sha. 0, 1 or 130. */
static int pull__hash_part(pull__ctx *c, const char *part) {
    enum { BUF = 1 << 20 };
    unsigned char *buf = malloc(BUF);
    if (!buf) {
        fprintf(stderr, "kvseal pull: out of memory\n");
        return 1;
    }
    crypto_hash_sha256_init(&c->sha);
    int64_t at = 0;
    int rc = 0;
    while (at < c->off && !rc) {
        size_t want = c->off - at < BUF ? (size_t)(c->off - at) : BUF;
        ssize_t r = pread(c->fd, buf, want, (off_t)at);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            fprintf(stderr, "kvseal pull: reading %s: %s\n", part, r ? strerror(errno) : "short file");
            rc = 1;
        }
        if (pull__stopped()) rc = 130;
        if (!rc) {
            crypto_hash_sha256_update(&c->sha, buf, (size_t)r);
            at += r;
        }
    }
    free(buf);
    return rc;
}

/* Fetches url into the open part (c->fd, c->off bytes there and hashed)
 * until it holds c->total bytes. 0, 1 or 130; the part stays either way. */
static int pull__fetch(pull__ctx *c, const char *url, const char *part) {
    c->start_off = c->off;
    c->t_start = c->t_last = ks_now_ns();
    c->last_decile = c->total > 0 ? (int)(10 * c->off / c->total) : 0;
    bool restarted_416 = false;
    for (long attempt = 0; c->off < c->total; attempt++) {
        if (ftruncate(c->fd, (off_t)c->off) != 0) {
            fprintf(stderr, "kvseal pull: %s: %s\n", part, strerror(errno));
            return 1;
        }
        pull__request(c, url);
        c->mem_len = 0;
        c->mem_max = PULL_ERR_BODY;
        c->body_started = c->range_bad = c->restarted = false;
        c->werrno = 0;
        char range[64];
        snprintf(range, sizeof range, "%lld-", (long long)c->off);
        curl_easy_setopt(c->h, CURLOPT_RANGE, c->off > 0 ? range : NULL);
        curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, pull__on_file);
        if (c->off > 0) ks_log(KS_LOG_INFO, "pull: %s: resuming at %lld bytes", c->name, (long long)c->off);
        CURLcode rc = curl_easy_perform(c->h);
        if (c->line_open) { // what follows starts on a line of its own
            fputc('\n', stderr);
            c->line_open = false;
        }
        if (c->restarted) ks_log(KS_LOG_WARN, "pull: %s: the server ignored the Range; started over", c->name);
        if (pull__stopped()) return 130;
        if (c->werrno) {
            if (c->werrno == ENOSPC || c->werrno == EDQUOT)
                fprintf(stderr,
                        "kvseal pull: disk full writing %s (%.1f of %.1f MB): free some space and "
                        "run again to resume\n",
                        part, (double)c->off / 1e6, (double)c->total / 1e6);
            else
                fprintf(stderr, "kvseal pull: writing %s: %s\n", part, strerror(c->werrno));
            return 1;
        }
        if (c->too_long) {
            fprintf(stderr, "kvseal pull: %s: the server sent more than the %lld bytes listed\n",
                    url, (long long)c->total);
            return 1; // the part holds the first bytes only; the next run verifies them
        }
        if (c->status == 416 && !restarted_416) {
            // the server thinks the part is complete or past the end: start over once
            ks_log(KS_LOG_WARN, "pull: %s: the server refused the range %s; starting over", c->name, range);
            c->off = 0;
            crypto_hash_sha256_init(&c->sha);
            restarted_416 = true;
            attempt--;
            continue;
        }
        if (c->range_bad) {
            // a 206 for another range: nothing of it was written
            if (attempt >= c->retries) {
                fprintf(stderr, "kvseal pull: %s: asked for bytes %s, got '%s'\n", url, range,
                        c->content_range);
                return 1;
            }
            ks_log(KS_LOG_WARN, "pull: %s: asked for bytes %s, got '%s'; starting over", c->name,
                   range, c->content_range);
            c->off = 0;
            crypto_hash_sha256_init(&c->sha);
            continue;
        }
        bool http_ok = rc == CURLE_OK && (c->status == 200 || c->status == 206);
        if (http_ok && c->off < c->total) rc = CURLE_PARTIAL_FILE; // short: as if dropped
        if (rc == CURLE_OK && !http_ok && !pull__transient(rc, c->status)) {
            pull__say_status(c, c->name, url);
            return 1;
        }
        if (rc != CURLE_OK && !pull__transient(rc, c->status)) {
            pull__say_curl(c, rc, url);
            return 1;
        }
        if (c->off >= c->total) break;
        if (attempt >= c->retries) {
            if (rc != CURLE_OK) pull__say_curl(c, rc, url);
            else pull__say_status(c, c->name, url);
            fprintf(stderr,
                    "kvseal pull: gave up after %ld attempts; %s keeps %.1f of %.1f MB: run again "
                    "to resume\n",
                    attempt + 1, part, (double)c->off / 1e6, (double)c->total / 1e6);
            return 1;
        }
        long ms = 500L << (attempt < 5 ? attempt : 5);
        ks_log(KS_LOG_WARN, "pull: %s: %s at %.1f MB; retrying in %.1f s", c->name,
               rc ? (c->curl_err[0] ? c->curl_err : curl_easy_strerror(rc)) : "server error",
               (double)c->off / 1e6, (double)ms / 1000);
        pull__backoff(ms);
        if (pull__stopped()) return 130;
    }
    pull__progress(c, true);
    return 0;
}

// ----------------------------------------------------------------------------
// Files

static void pull__hex(const unsigned char *h, char out[65]) {
    static const char d[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) out[2 * i] = d[h[i] >> 4], out[2 * i + 1] = d[h[i] & 15];
    out[64] = '\0';
}

/* SHA-256 of the file at path as hex, or "" when it cannot be read. */
static void pull__sha256_file(const char *path, char out[65]) {
    out[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    enum { BUF = 1 << 20 };
    unsigned char *buf = malloc(BUF), h[32];
    crypto_hash_sha256_state st;
    crypto_hash_sha256_init(&st);
    ssize_t r = -1;
    while (buf && !pull__stopped() && ((r = read(fd, buf, BUF)) > 0 || (r < 0 && errno == EINTR)))
        if (r > 0) crypto_hash_sha256_update(&st, buf, (size_t)r);
    if (buf && r == 0) {
        crypto_hash_sha256_final(&st, h);
        pull__hex(h, out);
    }
    free(buf);
    close(fd);
}

/* mkdir -p path; new directories get mode 0700. */
static bool pull__mkdirs(const char *path) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) {
        errno = ENAMETOOLONG;
        return false;
    }
    for (char *p = tmp + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char was = *p;
        *p = '\0';
        struct stat st;
        if (mkdir(tmp, 0700) != 0 && errno != EEXIST && (stat(tmp, &st) != 0 || !S_ISDIR(st.st_mode)))
            return false; // (EACCES on a directory that exists is no failure)
        *p = was;
        if (!was) break;
    }
    struct stat st;
    if (stat(path, &st) != 0) return false;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return false;
    }
    return true;
}

/* Reads the token: --token-file, else $HF_TOKEN, else the file
 * huggingface-cli login writes ($HF_TOKEN_PATH, $HF_HOME/token,
 * ~/.cache/huggingface/token). *tok NULL when there is none. 0 or 2. */
static int pull__token(const char *token_file, char **tok) {
    *tok = NULL;
    const char *env = getenv("HF_TOKEN");
    char path[4096] = "";
    if (token_file) {
        snprintf(path, sizeof path, "%s", token_file);
    } else if (env && *env) {
        if (!(*tok = strdup(env))) return 2;
    } else {
        const char *p = getenv("HF_TOKEN_PATH"), *home = getenv("HF_HOME"), *h = getenv("HOME");
        if (p && *p) snprintf(path, sizeof path, "%s", p);
        else if (home && *home) snprintf(path, sizeof path, "%s/token", home);
        else if (h && *h) snprintf(path, sizeof path, "%s/.cache/huggingface/token", h);
        if (path[0] && access(path, R_OK) != 0) path[0] = '\0';
    }
    if (path[0]) {
        size_t n;
        if (!(*tok = cli__read_file(path, &n))) return 2;
    }
    if (!*tok) return 0;
    pull__trim(*tok);
    for (const char *s = *tok; *s; s++)
        if (*s <= ' ' || *s == 0x7f) {
            fprintf(stderr, "kvseal pull: the token%s%s holds a blank or control character\n",
                    path[0] ? " in " : " in HF_TOKEN", path);
            free(*tok);
            *tok = NULL;
            return 2;
        }
    if (!**tok) {
        free(*tok);
        *tok = NULL;
    }
    return 0;
}

/* Verifies the complete part (hash so far, size, magic) and moves it to
 * final. 0 or 1 (the part is deleted when it is wrong). */
static int pull__finish(pull__ctx *c, const char *part, const char *final, const char *want_sha) {
    unsigned char h[32];
    char got[65];
    crypto_hash_sha256_final(&c->sha, h);
    pull__hex(h, got);
    if (want_sha[0] && strcmp(got, want_sha) != 0) {
        unlink(part);
        fprintf(stderr,
                "kvseal pull: sha256 mismatch for %s: expected %s, got %s; the download was "
                "deleted: run again\n",
                c->name, want_sha, got);
        return 1;
    }
    if (!want_sha[0])
        ks_log(KS_LOG_WARN, "pull: %s: the hub gives no sha256 for it (not an LFS file): size checked only",
               c->name);
    char magic[4] = {0};
    if (pread(c->fd, magic, 4, 0) != 4 || memcmp(magic, "GGUF", 4) != 0) {
        unlink(part);
        fprintf(stderr, "kvseal pull: %s is not a GGUF file (no GGUF magic); deleted\n", c->name);
        return 1;
    }
    if (fsync(c->fd) != 0 || rename(part, final) != 0) {
        fprintf(stderr, "kvseal pull: moving %s to %s: %s\n", part, final, strerror(errno));
        return 1;
    }
    // the rename is durable once the directory is
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", final);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    int dfd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    ks_log(KS_LOG_INFO, "pull: %s: sha256 %s verified", c->name, got);
    return 0;
}

// ----------------------------------------------------------------------------
// The command

/* Downloads f of c->repo at rev into dir. 0, 1 or 130. */
static int pull__one(pull__ctx *c, const char *rev, const cli__hub_file *f, const char *dir,
                     bool force) {
    const char *base;
    ks_errbuf eb = {0};
    if (cli__pull_name_check(f->path, &base, &eb)) {
        fprintf(stderr, "kvseal pull: %s: refused the hub's file name: %s\n", c->repo, eb.msg);
        return 1;
    }
    c->name = base;
    c->total = f->size;
    char final[4096], part[4200], url[8192];
    if (snprintf(final, sizeof final, "%s/%s", dir, base) >= (int)sizeof final) {
        fprintf(stderr, "kvseal pull: the path %s/%s is too long\n", dir, base);
        return 1;
    }
    snprintf(part, sizeof part, "%s.part", final);
    struct stat st;
    if (stat(final, &st) == 0) {
        char have[65] = "";
        if (st.st_size == f->size) {
            ks_log(KS_LOG_INFO, "pull: %s is there: checking its sha256", final);
            pull__sha256_file(final, have);
            if (pull__stopped()) return 130;
        }
        if (st.st_size == f->size && (!f->sha256[0] || !strcmp(have, f->sha256))) {
            ks_log(KS_LOG_INFO, "pull: %s is already present%s; nothing to download", final,
                   f->sha256[0] ? " with the right sha256" : " (same size)");
            printf("%s\n", final);
            return fflush(stdout) == 0 ? 0 : 1;
        }
        if (!force) {
            fprintf(stderr,
                    "kvseal pull: %s exists with other contents (%lld bytes, sha256 %s; %s %s "
                    "has %lld bytes, sha256 %s): remove it, pass --force to replace it, or "
                    "use another --dir\n",
                    final, (long long)st.st_size, have[0] ? have : "not computed", c->repo,
                    f->path, (long long)f->size, f->sha256[0] ? f->sha256 : "unknown");
            return 1;
        }
    }
    c->fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (c->fd < 0) {
        fprintf(stderr, "kvseal pull: cannot write in %s: %s: %s\n", dir, part, strerror(errno));
        return 1;
    }
    int rc = 1;
    if (flock(c->fd, LOCK_EX | LOCK_NB) != 0) {
        fprintf(stderr, "kvseal pull: another kvseal pull is downloading %s\n", part);
        goto done;
    }
    if (fstat(c->fd, &st) != 0) {
        fprintf(stderr, "kvseal pull: %s: %s\n", part, strerror(errno));
        goto done;
    }
    c->off = st.st_size;
    if (c->off > c->total) {
        ks_log(KS_LOG_WARN, "pull: %s is longer than the file (%lld > %lld bytes): starting over",
               part, (long long)c->off, (long long)c->total);
        c->off = 0;
    }
    if (c->off > 0) {
        ks_log(KS_LOG_INFO, "pull: %s: %.1f of %.1f MB already there: hashing them", part,
               (double)c->off / 1e6, (double)c->total / 1e6);
        if ((rc = pull__hash_part(c, part)) != 0) goto done;
        rc = 1;
    } else {
        crypto_hash_sha256_init(&c->sha);
    }
    struct statvfs vfs;
    if (fstatvfs(c->fd, &vfs) == 0 &&
        (uint64_t)vfs.f_bavail * vfs.f_frsize < (uint64_t)(c->total - c->off)) {
        fprintf(stderr, "kvseal pull: disk full: %s needs %.1f MB more, %s has %.1f MB free\n",
                base, (double)(c->total - c->off) / 1e6, dir,
                (double)vfs.f_bavail * (double)vfs.f_frsize / 1e6);
        goto done;
    }
    snprintf(url, sizeof url, "%s/%s/resolve/", c->endpoint, c->repo);
    bool fits = pull__url_add(c, url, sizeof url, rev, false) && strlen(url) + 2 < sizeof url;
    if (fits) strcat(url, "/");
    if (!fits || !pull__url_add(c, url, sizeof url, f->path, true)) {
        fprintf(stderr, "kvseal pull: the URL of %s is too long\n", f->path);
        goto done;
    }
    ks_log(KS_LOG_INFO, "pull: %s %s (%.1f MB) into %s", c->repo, f->path, (double)f->size / 1e6,
           dir);
    if ((rc = pull__fetch(c, url, part)) != 0) {
        if (rc == 130)
            fprintf(stderr, "\nkvseal pull: interrupted; %s keeps %.1f of %.1f MB: run again to resume\n",
                    part, (double)c->off / 1e6, (double)c->total / 1e6);
        goto done;
    }
    // the redirect's X-Linked-Etag is the sha256 of an LFS file: it must agree
    char etag[65] = "";
    const char *e = c->linked_etag;
    if (!strncmp(e, "W/", 2)) e += 2;
    if (*e == '"') e++;
    size_t ne = strcspn(e, "\"");
    if (ne == 64) {
        memcpy(etag, e, 64);
        for (int i = 0; i < 64; i++) etag[i] = (char)(etag[i] >= 'A' && etag[i] <= 'F' ? etag[i] + 32 : etag[i]);
    }
    if (f->sha256[0] && etag[0] && strcmp(etag, f->sha256) != 0) {
        fprintf(stderr,
                "kvseal pull: %s: the listing's sha256 %s and the download's %s differ (the "
                "revision moved meanwhile?): run again\n",
                f->path, f->sha256, etag);
        unlink(part);
        goto done;
    }
    if ((rc = pull__finish(c, part, final, f->sha256[0] ? f->sha256 : etag)) != 0) goto done;
    printf("%s\n", final);
    rc = fflush(stdout) == 0 ? 0 : 1;
done:
    close(c->fd);
    c->fd = -1;
    return rc;
}

int cli_pull(int argc, char **argv) {
    pull__cfg cf = {.retries = 5};
    const cli__spec spec = {"pull", pull__opts, PO__N, pull__apply, pull__usage, false, false};
    int first = argc;
    int prc = cli__opts_parse(&spec, &cf, argc, argv, &first);
    if (prc) return prc < 0 ? 0 : prc;
    if (argc - first != 1) {
        pull__usage("pull");
        return 2;
    }
    cli__pull_spec sp;
    ks_errbuf eb = {0};
    if (cli__pull_spec_parse(argv[first], &sp, &eb)) {
        fprintf(stderr, "kvseal pull: %s\n", eb.msg);
        return 2;
    }
    if (cf.file && (sp.path[0] || sp.quant[0])) {
        fprintf(stderr, "kvseal pull: --file names the file: give ORG/REPO alone with it\n");
        return 2;
    }
    const char *base;
    if (cf.file && cli__pull_name_check(cf.file, &base, &eb)) {
        fprintf(stderr, "kvseal pull: --file: %s\n", eb.msg);
        return 2;
    }
    char dirbuf[4096];
    const char *dir = cf.dir ? cf.dir : cli__models_dir_default(dirbuf, sizeof dirbuf);
    if (!dir || !*dir) {
        fprintf(stderr, "kvseal pull: no models directory: pass --dir DIR or set KVSEAL_MODELS_DIR "
                        "(HOME is not set)\n");
        return 2;
    }
    const char *rev = cf.revision && *cf.revision ? cf.revision : "main";
    const char *ep = cf.endpoint ? cf.endpoint : getenv("HF_ENDPOINT");
    if (!ep || !*ep) ep = PULL_DEFAULT_ENDPOINT;
    char endpoint[1024];
    snprintf(endpoint, sizeof endpoint, "%s", ep);
    for (size_t n = strlen(endpoint); n && endpoint[n - 1] == '/';) endpoint[--n] = '\0';
    bool https = !strncasecmp(endpoint, "https://", 8);
    if (!https && strncasecmp(endpoint, "http://", 7) != 0) {
        fprintf(stderr, "kvseal pull: the endpoint '%s' is not an http:// or https:// URL\n", ep);
        return 2;
    }
    char *token = NULL;
    if (pull__token(cf.token_file, &token)) return 2;
    if (!pull__mkdirs(dir)) {
        fprintf(stderr, "kvseal pull: cannot create the models directory %s: %s\n", dir,
                strerror(errno));
        free(token);
        return 1;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        fprintf(stderr, "kvseal pull: the models directory %s is not writable: %s\n", dir,
                strerror(errno));
        free(token);
        return 1;
    }

    int rc = 1;
    cli__hub_list list = {0};
    pull__ctx c = {.endpoint = endpoint, .repo = sp.repo, .retries = cf.retries, .fd = -1,
                   .have_token = token != NULL, .tty = isatty(2) == 1};
    struct sigaction sa = {.sa_handler = pull__on_signal}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    if (sodium_init() < 0 || curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK ||
        !(c.h = curl_easy_init())) {
        fprintf(stderr, "kvseal pull: cannot initialize libcurl or libsodium\n");
        goto done;
    }
    char ua[64];
    snprintf(ua, sizeof ua, "kvseal/%s", KS_VERSION);
    curl_easy_setopt(c.h, CURLOPT_USERAGENT, ua);
    curl_easy_setopt(c.h, CURLOPT_ERRORBUFFER, c.curl_err);
    curl_easy_setopt(c.h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c.h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c.h, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c.h, CURLOPT_PROTOCOLS_STR, "http,https");
    // from an https hub only to https: a redirect may not downgrade
    curl_easy_setopt(c.h, CURLOPT_REDIR_PROTOCOLS_STR, https ? "https" : "http,https");
    curl_easy_setopt(c.h, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(c.h, CURLOPT_LOW_SPEED_LIMIT, 1L); // a stall of 60 s is a dropped connection
    curl_easy_setopt(c.h, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(c.h, CURLOPT_HEADERFUNCTION, pull__on_header);
    curl_easy_setopt(c.h, CURLOPT_HEADERDATA, &c);
    curl_easy_setopt(c.h, CURLOPT_WRITEDATA, &c);
    curl_easy_setopt(c.h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c.h, CURLOPT_XFERINFOFUNCTION, pull__on_xfer);
    if (token) {
        // libcurl's own bearer auth: it is not sent on to another host or port
        // after a redirect (CURLOPT_UNRESTRICTED_AUTH stays off)
        curl_easy_setopt(c.h, CURLOPT_HTTPAUTH, (long)CURLAUTH_BEARER);
        curl_easy_setopt(c.h, CURLOPT_XOAUTH2_BEARER, token);
    }
    if ((rc = pull__list(&c, rev, &list)) != 0) goto done;
    rc = 1;
    int i = pull__pick(&list, &sp, cf.file ? cf.file : sp.path);
    if (i < 0) goto done;
    rc = pull__one(&c, rev, &list.v[i], dir, cf.force);
done:
    if (rc == 130) fprintf(stderr, "kvseal pull: interrupted\n");
    cli__hub_list_free(&list);
    free(c.mem);
    if (c.h) curl_easy_cleanup(c.h);
    curl_global_cleanup();
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (token) sodium_memzero(token, strlen(token));
    free(token);
    return rc;
}
