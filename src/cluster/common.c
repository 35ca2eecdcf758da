/* common.c — what every cluster role shares: the cluster secret file, the
 * model id, the router's check of a worker's REGISTER, and sampling
 * parameters on the wire (cluster_int.h). */
#include "cluster_int.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

ks_err cluster_secret_load(const char *path, uint8_t *buf, size_t cap, size_t *len, ks_errbuf *eb) {
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ks_seterr(eb, KS_ERR_IO, "cluster secret %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ks_seterr(eb, KS_ERR_IO, "cluster secret %s: %s", path, strerror(e));
    }
    if (st.st_mode & 077) {
        close(fd);
        return ks_seterr(eb, KS_ERR_INVAL,
                         "cluster secret %s is readable by group or others (mode %03o); "
                         "chmod 600 it",
                         path, (unsigned)(st.st_mode & 0777));
    }
    size_t n = 0;
    for (;;) {
        if (n == cap) {  // one more byte would not fit: too long (unless whitespace)
            uint8_t extra[64];
            ssize_t k = read(fd, extra, sizeof extra);
            bool only_ws = k >= 0;
            for (ssize_t i = 0; i < k; i++)
                only_ws &= extra[i] == '\n' || extra[i] == '\r' || extra[i] == ' ' || extra[i] == '\t';
            if (k == 0 || (only_ws && k < (ssize_t)sizeof extra)) break;
            close(fd);
            sodium_memzero(buf, cap);
            return ks_seterr(eb, KS_ERR_INVAL, "cluster secret %s is longer than %zu bytes", path, cap);
        }
        ssize_t k = read(fd, buf + n, cap - n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            int e = errno;
            close(fd);
            sodium_memzero(buf, cap);
            return ks_seterr(eb, KS_ERR_IO, "cluster secret %s: %s", path, strerror(e));
        }
        if (k == 0) break;
        n += (size_t)k;
    }
    close(fd);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        n--;
    if (n < 16) {
        sodium_memzero(buf, cap);
        return ks_seterr(eb, KS_ERR_INVAL, "cluster secret %s has %zu bytes; at least 16 are needed",
                         path, n);
    }
    *len = n;
    return KS_OK;
}

void cluster_model_id(const model *m, uint8_t out[32]) {
    const gguf_file *f = model_gguf(m);
    // the metadata and tensor-info block is mapped with the file: re-read it
    // through the file so the id covers exactly the bytes on disk
    crypto_hash_sha256_state st;
    crypto_hash_sha256_init(&st);
    uint64_t n = gguf_data_offset(f);
    int fd = open(gguf_path(f), O_RDONLY | O_CLOEXEC);
    uint8_t buf[65536];
    uint64_t done = 0;
    while (fd >= 0 && done < n) {
        size_t want = n - done < sizeof buf ? (size_t)(n - done) : sizeof buf;
        ssize_t k = read(fd, buf, want);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        crypto_hash_sha256_update(&st, buf, (size_t)k);
        done += (uint64_t)k;
    }
    if (fd >= 0) close(fd);
    // fold in the hyper-parameters too, so an unreadable file still yields a
    // geometry-specific id (and never a constant one)
    const model_hparams *hp = model_hp(m);
    int32_t geo[6] = {hp->n_vocab, hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim};
    crypto_hash_sha256_update(&st, (const uint8_t *)geo, sizeof geo);
    crypto_hash_sha256_final(&st, out);
}

/* "K, V" or "one row per position": how refusals name a plane count. */
static const char *cl__planes_what(int planes) {
    return planes == 1 ? "one row per position" : "K, V";
}

bool cl_register_refused(const pd_msg_register *m, uint8_t peer_role,
                         const uint8_t model_id[PD_MSG_HASH_BYTES], const kv_geom *g,
                         int32_t n_ctx, const char *model_name, char *why, size_t cap) {
    const uint64_t pool_tokens = (uint64_t)m->n_pages * m->page_tokens;
    int np = kv_geom_planes(g);
    if (m->role != peer_role)
        snprintf(why, cap, "REGISTER role %u differs from the HELLO role", m->role);
    else if (memcmp(m->model_id, model_id, PD_MSG_HASH_BYTES) != 0)
        snprintf(why, cap, "the worker serves a different model (model_id differs)");
    else if ((int)m->n_layer != g->n_layer || (int)m->kv_dim != g->kv_dim ||
             (int)m->page_tokens != g->page_tokens)
        snprintf(
            why, cap,
            "KV geometry n_layer %u kv_dim %u page_tokens %u differs from the router's %d/%d/%d",
            m->n_layer, m->kv_dim, m->page_tokens, g->n_layer, g->kv_dim, g->page_tokens);
    else if ((int)m->planes != np) // page layout, page size and KV_PAGE lengths all follow it
        snprintf(why, cap,
                 "the worker's KV pages hold %u plane%s per position per layer (%s), the "
                 "router's %d (%s): every node must run the same model",
                 m->planes, m->planes == 1 ? "" : "s", cl__planes_what(m->planes), np,
                 cl__planes_what(np));
    else if ((int)m->kv_type != g->kv_type) // pages travel in their type: no conversion
        snprintf(why, cap,
                 "the worker's KV type %s differs from the router's %s (every node needs the same "
                 "--kv-type)",
                 kv_type_name(m->kv_type), kv_type_name(g->kv_type));
    else if (m->role == PD_ROLE_DECODE && (m->data_port == 0 || m->host_len == 0))
        snprintf(why, cap, "a decode worker must name its data-link host and port");
    else if (m->role == PD_ROLE_DECODE && n_ctx > 0 && pool_tokens < (uint64_t)n_ctx)
        // the seed's incident: a pool smaller than the context the fleet advertises
        snprintf(why, cap, "pool %u pages x %u tokens = %llu < context %d advertised for %s",
                 m->n_pages, m->page_tokens, (unsigned long long)pool_tokens, (int)n_ctx,
                 model_name ? model_name : "the model");
    else
        return false;
    return true;
}

bool cl_sampling_to_msg(const sample_params *sp, int32_t max_tokens, bool ignore_eos,
                        const char *gbnf, uint32_t grammar_len, const uint8_t *bias,
                        uint32_t n_bias, pd_msg_sampling *out, char *msg, size_t cap) {
    memset(out, 0, sizeof *out);
    if (sp->n_probs < 0 || sp->n_probs > (int32_t)PD_MSG_MAX_TOP || max_tokens < 1 ||
        sp->repeat_last_n < 0) {
        snprintf(msg, cap, "n_probs %d, repeat_last_n %d or max_tokens %d out of range",
                 sp->n_probs, sp->repeat_last_n, max_tokens);
        return false;
    }
    if (grammar_len > PD_MSG_MAX_GRAMMAR || n_bias > PD_MSG_MAX_BIAS) {
        snprintf(msg, cap, "the grammar (%u bytes) or logit_bias (%u entries) is too large",
                 grammar_len, n_bias);
        return false;
    }
    // every row of SAMPLE_PARAM_MAP
#define CL__COPY(f, ...) out->f = sp->f;
    SAMPLE_PARAM_MAP(CL__COPY)
#undef CL__COPY
    // penalties that do nothing (a zero window, or all three neutral) travel
    // as off, so a request without them sends no extension
    if (!sample_params_penalized(sp)) {
        out->repeat_penalty = 1.0f;
        out->repeat_last_n = 0;
        out->frequency_penalty = out->presence_penalty = 0.0f;
    }
    // the extension travels when one of its rows is not off (or with a grammar or a bias)
    bool ext = false;
#define CL__EXT(f, T, key, alias, def, off, lo, lo_open, hi, what, jhi, wire, ...)                 \
    if (wire == SAMPLE_WIRE_EXT && out->f != off) ext = true;
    SAMPLE_PARAM_MAP(CL__EXT)
#undef CL__EXT
    out->max_tokens = (uint32_t)max_tokens;
    out->flags = (ignore_eos ? PD_FLAG_IGNORE_EOS : 0u) | (sp->logprobs ? PD_FLAG_LOGPROBS : 0u) |
                 (ext || grammar_len || n_bias ? PD_FLAG_EXT : 0u);
    out->seed = sp->seed;
    out->grammar = grammar_len ? gbnf : NULL;
    out->grammar_len = grammar_len;
    out->bias = n_bias ? bias : NULL;
    out->n_bias = n_bias;
    return true;
}

void cl_sampling_from_msg(const pd_msg_sampling *m, sample_params *sp, bool *ignore_eos) {
    sample_params_default(sp);
#define CL__COPY(f, ...) sp->f = m->f;
    SAMPLE_PARAM_MAP(CL__COPY)
#undef CL__COPY
    sp->seed = m->seed;
    sp->logprobs = (m->flags & PD_FLAG_LOGPROBS) != 0;
    *ignore_eos = (m->flags & PD_FLAG_IGNORE_EOS) != 0;
}

int cl_bias_from_msg(const pd_msg_sampling *m, sample_bias *out) {
    for (uint32_t i = 0; i < m->n_bias; i++)
        pd_msg_bias_at(m, i, &out[i].token, &out[i].bias);
    return (int)m->n_bias;
}

void cl_health_fill(const kv_pool *pool, uint32_t active, bool draining, pd_msg_health_ack *out) {
    kv_stats ks;
    kv_pool_stats(pool, &ks);
    out->active_requests = active;
    out->free_pages = ks.pages[KV_PAGE_FREE];
    out->quarantined_pages = ks.pages[KV_PAGE_QUARANTINE];
    out->flags = draining ? PD_HEALTH_DRAINING : 0;
}

void cl_pool_check_fill(const kv_pool *pool, uint32_t active, bool busy, pd_msg_pool_check_ack *out) {
    kv_stats ks;
    kv_pool_stats(pool, &ks);
    out->active = active + (busy ? 1u : 0u);
    out->free_pages = ks.pages[KV_PAGE_FREE];
    out->allocated = ks.pages[KV_PAGE_ALLOCATED];
    out->ready = ks.pages[KV_PAGE_READY];
    out->quarantined = ks.pages[KV_PAGE_QUARANTINE];
    out->clean = out->active == 0 && kv_pool_all_free_and_scrubbed(pool);
}

uint64_t cl_now_ms(void *ctx) {
    (void)ctx;
    return ks_now_ns() / 1000000u;
}

void cl_error_close(pd_conn *c, ks_err err, const char *msg) {
    size_t ml = strlen(msg);
    pd_msg_error m = {.err = (uint32_t)err, .msg = msg,
                      .msg_len = (uint32_t)(ml < PD_MSG_MAX_TEXT ? ml : PD_MSG_MAX_TEXT)};
    uint8_t buf[8 + PD_MSG_MAX_TEXT];
    uint32_t len = 0;
    if (pd_msg_error_encode(&m, buf, sizeof buf, &len, NULL) == KS_OK) {
        struct iovec iov = {.iov_base = buf, .iov_len = len};
        if (pd_conn_send(c, PD_MSG_ERROR, 0, &iov, 1, NULL) != KS_OK) {
            // best effort: the close below happens either way
        }
    }
    pd_conn_close_flush(c);
}

// ----------------------------------------------------------------------------
// LoRA adapters

ks_err cl_lora_read(const cluster_lora *l, uint8_t **buf, size_t *len,
                    uint8_t digest[ENGINE_ADAPTER_DIGEST_BYTES], ks_errbuf *eb) {
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(l->path, "rb");
    if (!f) return ks_seterr(eb, KS_ERR_IO, "--lora %s: %s", l->path, strerror(errno));
    size_t cap = 0, n = 0;
    uint8_t *b = NULL;
    bool ok = true;
    for (;;) {
        if (n == cap) {
            size_t nc = cap ? 2 * cap : (size_t)1 << 20;
            uint8_t *nb = malloc(nc);
            if (!nb) {
                ok = false;
                break;
            }
            if (n) memcpy(nb, b, n);
            if (b) sodium_memzero(b, cap); // a tenant's fine-tune: no copy left behind
            free(b);
            b = nb;
            cap = nc;
        }
        size_t got = fread(b + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    bool rerr = ferror(f) != 0;
    fclose(f);
    if (!ok || rerr) {
        if (b) sodium_memzero(b, cap);
        free(b);
        return ks_seterr(eb, ok ? KS_ERR_IO : KS_ERR_NOMEM, "--lora %s: %s", l->path,
                         ok ? "read error" : "out of memory");
    }
    engine_adapter_digest(b, n, l->scale, digest);
    *buf = b;
    *len = n;
    return KS_OK;
}

void cl_hex(const uint8_t *d, size_t n, char *out) {
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[d[i] >> 4];
        out[2 * i + 1] = hx[d[i] & 15];
    }
    out[2 * n] = 0;
}
