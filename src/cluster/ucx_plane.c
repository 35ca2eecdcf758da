/* ucx_plane.c — the UCX data plane of the cluster workers (ucx_plane.h). */
#include "ucx_plane.h"

#include "kvseal/pd_seal.h"
#include "kvseal/pd_ucx.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define UCX__REC_FIXED (8u + PD_MSG_KV_PAGE_HDR)           /* len, record number, page header */
#define UCX__REC_OVER (UCX__REC_FIXED + PD_SEAL_TAG_BYTES + 7u) /* + tag + alignment */
#define UCX__FLUSH_MS 30000u      /* a flush that takes longer: the transfer fails (F5) */
#define UCX__CLOSE_FLUSH_MS 2000u /* a closing link's flush: then its endpoint is forced shut */
#define UCX__STAGING_MAX ((uint64_t)1 << 34)

static size_t ucx__align8(size_t n) { return (n + 7u) & ~(size_t)7u; }

/* One data link: decode keeps its sealing key; prefill also its endpoint. */
typedef struct ucx__link {
    uint64_t epoch;
    uint32_t decode_id;  /* prefill */
    uint8_t key[PD_SEAL_KEY_BYTES];
    pd_ucx_ep *ep;       /* prefill */
    struct ucx__link *next;
} ucx__link;

/* A staging buffer. Never given back to the allocator while UCX runs: a put
 * a transport could not refuse after revocation (tcp, sm) lands in staging
 * memory, never in memory put to another use. */
typedef struct ucx__buf {
    uint8_t *p;
    size_t cap;
    struct ucx__buf *next;
} ucx__buf;

/* decode: a grant's mapped staging area */
typedef struct ucx__grant {
    uint64_t req_id, epoch, seq_uid;
    ucx__buf *buf;
    size_t len;
    pd_ucx_region *reg;
    struct ucx__grant *next;
} ucx__grant;

/* prefill: a transfer's puts */
typedef struct ucx__xfer {
    uint64_t req_id, epoch, seq_uid;
    uint32_t decode_id;
    pd_ucx_rkey *rkey;
    uint64_t raddr, rlen;
    uint8_t *mirror;  /* (rlen) sealed records, the source of the puts */
    size_t off;
    uint32_t record;
    uint64_t bytes, t_first_ns; /* sealed bytes put, and when the first put went */
    pd_seal_grant seal;
    struct ucx__xfer *next;
} ucx__xfer;

struct cl_ucx {
    pd_ucx *u;
    kv_geom g;
    ucx__link *links;
    ucx__grant *grants;
    ucx__buf *spare;
    ucx__xfer *xfers;
    uint8_t *gout; /* the last extended GRANT */
    size_t gout_cap;
    uint32_t n_mapped;
};

ks_err cl_ucx_create(const kv_geom *g, cl_ucx **out, ks_errbuf *eb) {
    *out = NULL;
    cl_ucx *u = calloc(1, sizeof *u);
    if (!u) return ks_seterr(eb, KS_ERR_NOMEM, "UCX data plane: out of memory");
    u->g = *g;
    ks_err e = pd_ucx_create(NULL, &u->u, eb);
    if (e != KS_OK) {
        free(u);
        return e;
    }
    *out = u;
    return KS_OK;
}

static ucx__link *ucx__link_find(cl_ucx *u, uint64_t epoch) {
    for (ucx__link *k = u->links; k; k = k->next)
        if (k->epoch == epoch) return k;
    return NULL;
}

static void ucx__link_drop(cl_ucx *u, ucx__link *k) {
    for (ucx__link **pp = &u->links; *pp; pp = &(*pp)->next)
        if (*pp == k) {
            *pp = k->next;
            break;
        }
    pd_ucx_ep_close(k->ep);
    memset(k->key, 0, sizeof k->key);
    free(k);
}

static void ucx__grant_unlink(cl_ucx *u, ucx__grant *q) {
    for (ucx__grant **pp = &u->grants; *pp; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            break;
        }
}

/* Revokes an unlinked grant's key and keeps its buffer for a later grant. */
static void ucx__grant_release(cl_ucx *u, ucx__grant *q) {
    pd_ucx_revoke(q->reg);
    u->n_mapped--;
    q->buf->next = u->spare;
    u->spare = q->buf;
    free(q);
}

static void ucx__grant_end(cl_ucx *u, ucx__grant *q) {
    ucx__grant_unlink(u, q);
    ucx__grant_release(u, q);
}

/* Waits (progressing) up to ms until every put issued on ep has landed. */
static ks_err ucx__flush(cl_ucx *u, pd_ucx_ep *ep, uint32_t ms, ks_errbuf *eb) {
    ks_err e = pd_ucx_flush_start(ep, eb);
    if (e != KS_OK) return e;
    uint64_t t0 = cl_now_ms(NULL);
    while ((e = pd_ucx_flush_poll(ep, eb)) == KS_ERR_AGAIN) {
        pd_ucx_progress(u->u);
        if (cl_now_ms(NULL) - t0 > ms)
            return ks_seterr(eb, KS_ERR_TIMEOUT, "UCX flush: no completion in %u ms", ms);
    }
    return e;
}

static void ucx__xfer_free(cl_ucx *u, ucx__xfer *x) {
    for (ucx__xfer **pp = &u->xfers; *pp; pp = &(*pp)->next)
        if (*pp == x) {
            *pp = x->next;
            break;
        }
    pd_ucx_rkey_close(x->rkey);
    pd_seal_grant_free(&x->seal);
    free(x->mirror);
    free(x);
}

void cl_ucx_destroy(cl_ucx *u) {
    if (!u) return;
    for (ucx__link *k = u->links, *n; k; k = n) { // prefill: flush and close the endpoints first
        n = k->next;
        if (k->ep) cl_ucxp_link_closed(u, k->decode_id, k->epoch);
    }
    while (u->xfers) ucx__xfer_free(u, u->xfers);
    while (u->grants) ucx__grant_end(u, u->grants);
    while (u->links) ucx__link_drop(u, u->links);
    pd_ucx_destroy(u->u); // no put can land any more: the buffers may go
    while (u->spare) {
        ucx__buf *b = u->spare;
        u->spare = b->next;
        free(b->p);
        free(b);
    }
    free(u->gout);
    free(u);
}

unsigned cl_ucx_progress(cl_ucx *u) {
    // bounded: a worker with events every time must not keep the loop from
    // the control connection (HEALTH) and the data links
    unsigned n = 0, k;
    for (int i = 0; i < 64 && (k = pd_ucx_progress(u->u)) > 0; i++) n += k;
    return n;
}

bool cl_ucx_busy(const cl_ucx *u) { return u->n_mapped > 0 || u->xfers; }

// ----------------------------------------------------------------------------
// decode

const void *cl_ucxd_address(const cl_ucx *u, size_t *len) { return pd_ucx_address(u->u, len); }

ks_err cl_ucxd_link_up(cl_ucx *u, pd_conn *c, uint64_t epoch, ks_errbuf *eb) {
    ucx__link *k = calloc(1, sizeof *k);
    if (!k) return ks_seterr(eb, KS_ERR_NOMEM, "UCX data plane: out of memory");
    ks_err e = pd_seal_link_key(c, epoch, k->key, eb);
    if (e != KS_OK) {
        free(k);
        return e;
    }
    k->epoch = epoch;
    k->next = u->links;
    u->links = k;
    return KS_OK;
}

void cl_ucxd_link_closed(cl_ucx *u, uint64_t epoch) {
    for (ucx__grant *q = u->grants, *n; q; q = n) {
        n = q->next;
        if (q->epoch == epoch) ucx__grant_end(u, q);
    }
    ucx__link *k = ucx__link_find(u, epoch);
    if (k) ucx__link_drop(u, k);
}

/* A staging buffer of at least need bytes (a spare one if one fits). */
static ucx__buf *ucx__buf_get(cl_ucx *u, size_t need) {
    for (ucx__buf **pp = &u->spare; *pp; pp = &(*pp)->next)
        if ((*pp)->cap >= need) {
            ucx__buf *b = *pp;
            *pp = b->next;
            return b;
        }
    ucx__buf *b = calloc(1, sizeof *b);
    size_t cap = (need + 65535u) & ~(size_t)65535u;
    if (!b || posix_memalign((void **)&b->p, 4096, cap) != 0) {
        free(b);
        return NULL;
    }
    b->cap = cap;
    return b;
}

ks_err cl_ucxd_grant(cl_ucx *u, uint64_t req_id, uint64_t epoch, const uint8_t *grant,
                     uint32_t grant_len, const uint8_t **out, uint32_t *out_len, ks_errbuf *eb) {
    pd_msg_grant gm;
    ks_err e = pd_msg_grant_decode(grant, grant_len, &gm, eb);
    if (e != KS_OK) return e;
    if (!ucx__link_find(u, epoch))
        return ks_seterr(eb, KS_ERR_INVAL, "UCX data plane: link %" PRIu64 " has no sealing key",
                         epoch);
    // every page in records of at least one layer: data + per-record overhead
    uint64_t need = 8; // the terminator
    for (uint32_t i = 0; i < gm.n_pages; i++) {
        pd_msg_grant_entry en = pd_msg_grant_entry_at(&gm, i);
        need += pd_msg_kv_page_len(&u->g, en.n_tokens, (uint32_t)u->g.n_layer) -
                PD_MSG_KV_PAGE_HDR + (uint64_t)u->g.n_layer * UCX__REC_OVER;
    }
    if (need > UCX__STAGING_MAX)
        return ks_seterr(eb, KS_ERR_NOSPACE, "UCX data plane: %" PRIu64 " staging bytes", need);
    ucx__grant *q = calloc(1, sizeof *q);
    ucx__buf *b = q ? ucx__buf_get(u, (size_t)need) : NULL;
    if (!b) {
        free(q);
        return ks_seterr(eb, KS_ERR_NOMEM, "UCX data plane: no memory for %" PRIu64
                         " staging bytes", need);
    }
    memset(b->p, 0, 8); // no record yet (a TLS-plane fallback leaves it so)
    if ((e = pd_ucx_map(u->u, b->p, (size_t)need, &q->reg, eb)) != KS_OK) {
        b->next = u->spare;
        u->spare = b;
        free(q);
        return e;
    }
    size_t klen;
    uint64_t raddr;
    const void *key = pd_ucx_region_key(q->reg, &klen, &raddr);
    uint64_t size = (uint64_t)grant_len + 16u + klen;
    if (klen > PD_MSG_UCX_KEY_MAX || size > PD_MSG_GRANT_MAX) {
        pd_ucx_revoke(q->reg);
        b->next = u->spare;
        u->spare = b;
        free(q);
        return ks_seterr(eb, KS_ERR_NOSPACE, "UCX data plane: a %zu-byte remote key", klen);
    }
    if (size > u->gout_cap) {
        uint8_t *p = realloc(u->gout, (size_t)size);
        if (!p) {
            pd_ucx_revoke(q->reg);
            b->next = u->spare;
            u->spare = b;
            free(q);
            return ks_seterr(eb, KS_ERR_NOMEM, "UCX data plane: out of memory");
        }
        u->gout = p;
        u->gout_cap = (size_t)size;
    }
    memcpy(u->gout, grant, grant_len);
    pd_store_u32(u->gout + 28, (uint32_t)klen);
    pd_store_u64(u->gout + grant_len, raddr);
    pd_store_u64(u->gout + grant_len + 8, need);
    memcpy(u->gout + grant_len + 16, key, klen);
    q->req_id = req_id;
    q->epoch = epoch;
    q->seq_uid = gm.seq_uid;
    q->buf = b;
    q->len = (size_t)need;
    q->next = u->grants;
    u->grants = q;
    u->n_mapped++;
    *out = u->gout;
    *out_len = (uint32_t)size;
    return KS_OK;
}

static ucx__grant *ucx__grant_find(cl_ucx *u, uint64_t req_id) {
    for (ucx__grant *q = u->grants; q; q = q->next)
        if (q->req_id == req_id) return q;
    return NULL;
}

uint64_t cl_ucxd_deliver(cl_ucx *u, uint64_t req_id, pd_recv *rcv) {
    ucx__grant *q = ucx__grant_find(u, req_id);
    if (!q) return 0;
    cl_ucx_progress(u);
    ucx__link *k = ucx__link_find(u, q->epoch);
    pd_seal_grant op;
    ks_errbuf eb;
    uint64_t bytes = 0;
    ucx__grant_unlink(u, q); // pd_recv's events (cl_ucxd_end) no longer find it
    if (!k || pd_seal_grant_init(&op, k->key, req_id, q->seq_uid, false, &eb) != KS_OK) {
        ucx__grant_release(u, q);
        return 0; // nothing delivered: DONE fails its coverage check (F2)
    }
    const int planes = kv_geom_planes(&u->g);
    size_t off = 0;
    for (uint32_t rec = 0;; rec++) {
        const uint8_t *p = q->buf->p;
        if (off + 8 > q->len) break;
        uint8_t fix[UCX__REC_FIXED];
        memcpy(fix, p + off, 8); // read once: a late put may change the source
        uint32_t dlen = pd_load_u32(fix), recno = pd_load_u32(fix + 4);
        if (dlen == 0) break;
        if (recno != rec || off + UCX__REC_FIXED + (uint64_t)dlen + PD_SEAL_TAG_BYTES > q->len) {
            ks_log(KS_LOG_WARN, "decode: request %" PRIu64 ": UCX record %u malformed", req_id, rec);
            break;
        }
        memcpy(fix + 8, p + off + 8, PD_MSG_KV_PAGE_HDR);
        pd_msg_kv_page ph;
        if (pd_msg_kv_page_decode(fix + 8, PD_MSG_KV_PAGE_HDR, PD_MSG_KV_PAGE_HDR + dlen, &u->g,
                                  &ph, &eb) != KS_OK ||
            (uint64_t)planes * ph.layer_count > PD_MAX_IOV) {
            ks_log(KS_LOG_WARN, "decode: request %" PRIu64 ": UCX record %u: %s", req_id, rec,
                   eb.msg);
            break;
        }
        struct iovec iov[PD_MAX_IOV];
        int nd = 0;
        if (!pd_recv_kv_page_begin(rcv, req_id, q->epoch, &ph, iov, PD_MAX_IOV, &nd)) break;
        pd_seal_ad ad = {.req_id = req_id, .seq_uid = q->seq_uid, .gen = ph.tag_gen,
                         .record = rec, .page_id = ph.page_id, .page_index = ph.page_index,
                         .n_rows = ph.n_rows, .layer_lo = ph.layer_first,
                         .layer_hi = ph.layer_first + ph.layer_count};
        bool ok = pd_seal_openv(&op, &ad, p + off + UCX__REC_FIXED, dlen, iov, nd, &eb) == KS_OK;
        pd_recv_kv_page_end(rcv, req_id, ok);
        if (!ok) {
            ks_log(KS_LOG_WARN, "decode: request %" PRIu64 ": %s", req_id, eb.msg);
            break;
        }
        bytes += PD_MSG_KV_PAGE_HDR + dlen;
        off = ucx__align8(off + UCX__REC_FIXED + dlen + PD_SEAL_TAG_BYTES);
    }
    pd_seal_grant_free(&op);
    ucx__grant_release(u, q); // revoked before DONE can free or hand over the pages
    return bytes;
}

void cl_ucxd_end(cl_ucx *u, uint64_t req_id) {
    ucx__grant *q = ucx__grant_find(u, req_id);
    if (q) ucx__grant_end(u, q);
}

// ----------------------------------------------------------------------------
// prefill

ks_err cl_ucxp_link_up(cl_ucx *u, pd_conn *c, uint32_t decode_id, uint64_t epoch,
                       const uint8_t *addr, uint32_t addr_len, ks_errbuf *eb) {
    ucx__link *k = calloc(1, sizeof *k);
    if (!k) return ks_seterr(eb, KS_ERR_NOMEM, "UCX data plane: out of memory");
    ks_err e = pd_seal_link_key(c, epoch, k->key, eb);
    if (e == KS_OK) e = pd_ucx_connect(u->u, addr, addr_len, &k->ep, eb);
    if (e != KS_OK) {
        free(k);
        return e;
    }
    k->epoch = epoch;
    k->decode_id = decode_id;
    k->next = u->links;
    u->links = k;
    return KS_OK;
}

void cl_ucxp_link_closed(cl_ucx *u, uint32_t decode_id, uint64_t epoch) {
    ucx__link *k = ucx__link_find(u, epoch);
    if (!k || k->decode_id != decode_id) return;
    ks_errbuf eb;
    if (ucx__flush(u, k->ep, UCX__CLOSE_FLUSH_MS, &eb) != KS_OK)
        ks_log(KS_LOG_INFO, "UCX data plane: link %" PRIu64 " closed with puts in flight: %s",
               epoch, eb.msg);
    for (ucx__xfer *x = u->xfers, *n; x; x = n) {
        n = x->next;
        if (x->epoch == epoch) {
            pd_ucx_rkey_close(x->rkey);
            x->rkey = NULL;
        }
    }
    pd_ucx_ep_close(k->ep); // forced: nothing of ours is referenced after it
    k->ep = NULL;
    for (ucx__xfer *x = u->xfers, *n; x; x = n) {
        n = x->next;
        if (x->epoch == epoch) ucx__xfer_free(u, x);
    }
    ucx__link_drop(u, k);
}

static ucx__xfer *ucx__xfer_find(cl_ucx *u, uint64_t req_id) {
    for (ucx__xfer *x = u->xfers; x; x = x->next)
        if (x->req_id == req_id) return x;
    return NULL;
}

void cl_ucxp_prefill(cl_ucx *u, uint64_t req_id, const uint8_t *payload, uint32_t len) {
    pd_msg_prefill pm;
    pd_msg_grant gm;
    ks_errbuf eb;
    if (pd_msg_prefill_decode(payload, len, &pm, &eb) != KS_OK ||
        pd_msg_prefill_grant(&pm, &gm, &eb) != KS_OK || gm.ucx_key_len == 0 ||
        ucx__xfer_find(u, req_id))
        return; // pd_send refuses what does not parse; no key: the TLS plane
    ucx__link *k = ucx__link_find(u, gm.link_epoch);
    if (!k || !k->ep || k->decode_id != pm.decode_worker_id || gm.ucx_len > UCX__STAGING_MAX)
        return; // pd_send finds the grant's link gone (STALE_GRANT) or sends on TLS
    ucx__xfer *x = calloc(1, sizeof *x);
    if (!x) return;
    x->mirror = malloc((size_t)gm.ucx_len);
    if (!x->mirror || pd_ucx_rkey_open(k->ep, gm.ucx_key, gm.ucx_key_len, &x->rkey, &eb) != KS_OK ||
        pd_seal_grant_init(&x->seal, k->key, req_id, gm.seq_uid, true, &eb) != KS_OK) {
        ks_log(KS_LOG_WARN, "request %" PRIu64 ": UCX transfer not set up (%s); pages go on the "
               "TLS link", req_id, eb.msg);
        pd_ucx_rkey_close(x->rkey);
        free(x->mirror);
        free(x);
        return;
    }
    x->req_id = req_id;
    x->epoch = gm.link_epoch;
    x->decode_id = pm.decode_worker_id;
    x->seq_uid = gm.seq_uid;
    x->raddr = gm.ucx_addr;
    x->rlen = gm.ucx_len;
    x->next = u->xfers;
    u->xfers = x;
}

void cl_ucxp_forget(cl_ucx *u, uint64_t req_id) {
    ucx__xfer *x = ucx__xfer_find(u, req_id);
    if (!x) return;
    ucx__link *k = ucx__link_find(u, x->epoch);
    ks_errbuf eb;
    if (x->off && k && k->ep && ucx__flush(u, k->ep, UCX__FLUSH_MS, &eb) != KS_OK) {
        // puts may still read x's records: the endpoint goes first (and x with the link)
        ks_log(KS_LOG_WARN, "request %" PRIu64 ": UCX flush: %s; closing the UCX endpoint",
               req_id, eb.msg);
        cl_ucxp_link_closed(u, k->decode_id, k->epoch);
        return;
    }
    ucx__xfer_free(u, x);
}

/* Seals the KV_PAGE in iov as the transfer's next record and puts it. */
static bool ucx__put_page(cl_ucx *u, ucx__link *k, ucx__xfer *x, const struct iovec *iov,
                          int n_iov) {
    ks_errbuf eb;
    size_t total = 0;
    for (int i = 0; i < n_iov; i++) total += iov[i].iov_len;
    if (n_iov < 1 || iov[0].iov_len != PD_MSG_KV_PAGE_HDR || total > UINT32_MAX) return false;
    uint32_t dlen = (uint32_t)(total - PD_MSG_KV_PAGE_HDR);
    pd_msg_kv_page ph;
    if (pd_msg_kv_page_decode(iov[0].iov_base, PD_MSG_KV_PAGE_HDR, (uint32_t)total, &u->g, &ph,
                              &eb) != KS_OK)
        return false;
    size_t rec_len = UCX__REC_FIXED + dlen + PD_SEAL_TAG_BYTES;
    if (x->off + ucx__align8(rec_len) + 8 > x->rlen) {
        ks_log(KS_LOG_WARN, "request %" PRIu64 ": UCX staging area of %" PRIu64 " bytes is full",
               x->req_id, x->rlen);
        return false;
    }
    uint8_t *r = x->mirror + x->off;
    pd_store_u32(r, dlen);
    pd_store_u32(r + 4, x->record);
    memcpy(r + 8, iov[0].iov_base, PD_MSG_KV_PAGE_HDR);
    pd_seal_ad ad = {.req_id = x->req_id, .seq_uid = x->seq_uid, .gen = ph.tag_gen,
                     .record = x->record, .page_id = ph.page_id, .page_index = ph.page_index,
                     .n_rows = ph.n_rows, .layer_lo = ph.layer_first,
                     .layer_hi = ph.layer_first + ph.layer_count};
    if (pd_seal_pagev(&x->seal, &ad, iov + 1, n_iov - 1, r + UCX__REC_FIXED, &eb) != KS_OK ||
        pd_ucx_put(k->ep, x->rkey, r, rec_len, x->raddr + x->off, &eb) != KS_OK) {
        ks_log(KS_LOG_WARN, "request %" PRIu64 ": UCX put: %s", x->req_id, eb.msg);
        return false;
    }
    if (!x->t_first_ns) x->t_first_ns = ks_now_ns();
    x->bytes += rec_len;
    x->off += ucx__align8(rec_len);
    x->record++;
    pd_ucx_progress(u->u);
    return true;
}

cl_ucx_verdict cl_ucxp_frame(cl_ucx *u, uint32_t decode_id, uint64_t epoch, uint16_t type,
                             uint64_t req_id, const struct iovec *iov, int n_iov) {
    ucx__xfer *x = ucx__xfer_find(u, req_id);
    if (!x || x->decode_id != decode_id || x->epoch != epoch) return CL_UCX_SEND;
    ucx__link *k = ucx__link_find(u, epoch);
    if (!k || !k->ep) {
        ucx__xfer_free(u, x);
        return CL_UCX_FAILED;
    }
    ks_errbuf eb;
    switch (type) {
    case PD_MSG_KV_PAGE:
        if (ucx__put_page(u, k, x, iov, n_iov)) return CL_UCX_CONSUMED;
        return CL_UCX_FAILED; // the link goes down: link_closed flushes, then frees x
    case PD_MSG_DONE: {
        // the terminator, then every put landed, then DONE on the TLS link
        memset(x->mirror + x->off, 0, 8);
        ks_err e = pd_ucx_put(k->ep, x->rkey, x->mirror + x->off, 8, x->raddr + x->off, &eb);
        if (e == KS_OK) e = ucx__flush(u, k->ep, UCX__FLUSH_MS, &eb);
        if (e != KS_OK) {
            ks_log(KS_LOG_WARN, "request %" PRIu64 ": UCX transfer failed: %s", req_id, eb.msg);
            return CL_UCX_FAILED; // link_closed flushes/closes and frees x
        }
        if (x->t_first_ns) // the figure bench/cluster.sh reports (with decode's open time)
            ks_log(KS_LOG_INFO, "prefill: request %" PRIu64 ": UCX transfer: %" PRIu64
                   " bytes put and flushed in %.3f ms", req_id, x->bytes,
                   (double)(ks_now_ns() - x->t_first_ns) / 1e6);
        ucx__xfer_free(u, x);
        return CL_UCX_SEND;
    }
    case PD_MSG_ABORT:
    case PD_MSG_ABORT_ACK:
    case PD_MSG_REJECT:
        cl_ucxp_forget(u, req_id); // no put of ours lands after this frame
        return CL_UCX_SEND;
    default:
        return CL_UCX_SEND;
    }
}
