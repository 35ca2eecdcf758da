/* ucx.c — one-sided puts over UCX for the UCX data plane (pd_ucx.h). */
#include "kvseal/pd_ucx.h"

#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

struct pd_ucx {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
};

struct pd_ucx_ep {
    pd_ucx *u;
    ucp_ep_h ep;
    void *flush_req;      /* a running flush, NULL if none */
    ucs_status_t failed;  /* the first put or flush error, UCS_OK if none */
};

struct pd_ucx_region {
    pd_ucx *u;
    ucp_mem_h mem;
    void *packed;
    size_t packed_len;
    uint64_t addr;
};

struct pd_ucx_rkey {
    ucp_rkey_h rkey;
};

ks_err pd_ucx_create(const char *tls, pd_ucx **out, ks_errbuf *eb) {
    *out = NULL;
    ucp_config_t *cfg = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK)
        return ks_seterr(eb, KS_ERR_UNSUPPORTED, "UCX config: %s", ucs_status_string(st));
    if (tls && (st = ucp_config_modify(cfg, "TLS", tls)) != UCS_OK) {
        ucp_config_release(cfg);
        return ks_seterr(eb, KS_ERR_INVAL, "UCX transports '%s': %s", tls,
                         ucs_status_string(st));
    }
    pd_ucx *u = calloc(1, sizeof *u);
    if (!u) {
        ucp_config_release(cfg);
        return ks_seterr(eb, KS_ERR_NOMEM, "no memory for UCX");
    }
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_RMA};
    st = ucp_init(&p, cfg, &u->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        free(u);
        return ks_seterr(eb, KS_ERR_UNSUPPORTED, "UCX init (transports %s): %s",
                         tls ? tls : "default", ucs_status_string(st));
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if ((st = ucp_worker_create(u->ctx, &wp, &u->worker)) != UCS_OK ||
        (st = ucp_worker_get_address(u->worker, &u->addr, &u->addr_len)) != UCS_OK) {
        pd_ucx_destroy(u);
        return ks_seterr(eb, KS_ERR_UNSUPPORTED, "UCX worker: %s", ucs_status_string(st));
    }
    *out = u;
    return KS_OK;
}

void pd_ucx_destroy(pd_ucx *u) {
    if (!u) return;
    if (u->addr) ucp_worker_release_address(u->worker, u->addr);
    if (u->worker) ucp_worker_destroy(u->worker);
    if (u->ctx) ucp_cleanup(u->ctx);
    free(u);
}

const void *pd_ucx_address(const pd_ucx *u, size_t *len) {
    *len = u->addr_len;
    return u->addr;
}

unsigned pd_ucx_progress(pd_ucx *u) { return ucp_worker_progress(u->worker); }

ks_err pd_ucx_connect(pd_ucx *u, const void *addr, size_t len, pd_ucx_ep **out,
                      ks_errbuf *eb) {
    (void)len; // a UCP worker address carries its own length
    *out = NULL;
    pd_ucx_ep *e = calloc(1, sizeof *e);
    if (!e) return ks_seterr(eb, KS_ERR_NOMEM, "no memory for a UCX endpoint");
    e->u = u;
    ucp_ep_params_t p = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                         .address = (const ucp_address_t *)addr};
    ucs_status_t st = ucp_ep_create(u->worker, &p, &e->ep);
    if (st != UCS_OK) {
        free(e);
        return ks_seterr(eb, KS_ERR_IO, "UCX endpoint: %s", ucs_status_string(st));
    }
    *out = e;
    return KS_OK;
}

/* Progresses until a request completes, then frees it; its status. */
static ucs_status_t pd__ucx_wait(pd_ucx *u, void *req) {
    if (req == NULL) return UCS_OK;
    if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
    ucs_status_t st;
    while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) ucp_worker_progress(u->worker);
    ucp_request_free(req);
    return st;
}

void pd_ucx_ep_close(pd_ucx_ep *e) {
    if (!e) return;
    if (e->flush_req) pd__ucx_wait(e->u, e->flush_req);
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_EP_CLOSE_FLAG_FORCE};
    pd__ucx_wait(e->u, ucp_ep_close_nbx(e->ep, &p));
    free(e);
}

ks_err pd_ucx_map(pd_ucx *u, void *base, size_t len, pd_ucx_region **out, ks_errbuf *eb) {
    *out = NULL;
    pd_ucx_region *r = calloc(1, sizeof *r);
    if (!r) return ks_seterr(eb, KS_ERR_NOMEM, "no memory for a UCX region");
    r->u = u;
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                             UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = base, .length = len};
    ucs_status_t st = ucp_mem_map(u->ctx, &mp, &r->mem);
    if (st != UCS_OK) {
        free(r);
        return ks_seterr(eb, KS_ERR_IO, "UCX mem_map of %zu bytes: %s", len, ucs_status_string(st));
    }
    if ((st = ucp_rkey_pack(u->ctx, r->mem, &r->packed, &r->packed_len)) != UCS_OK) {
        ucp_mem_unmap(u->ctx, r->mem);
        free(r);
        return ks_seterr(eb, KS_ERR_IO, "UCX rkey_pack: %s", ucs_status_string(st));
    }
    r->addr = (uint64_t)(uintptr_t)base;
    *out = r;
    return KS_OK;
}

const void *pd_ucx_region_key(const pd_ucx_region *r, size_t *len, uint64_t *remote_addr) {
    *len = r->packed_len;
    *remote_addr = r->addr;
    return r->packed;
}

void pd_ucx_revoke(pd_ucx_region *r) {
    if (!r) return;
    ucp_rkey_buffer_release(r->packed);
    ucp_mem_unmap(r->u->ctx, r->mem);
    free(r);
}

ks_err pd_ucx_rkey_open(pd_ucx_ep *e, const void *packed, size_t len, pd_ucx_rkey **out,
                        ks_errbuf *eb) {
    (void)len;
    *out = NULL;
    pd_ucx_rkey *k = calloc(1, sizeof *k);
    if (!k) return ks_seterr(eb, KS_ERR_NOMEM, "no memory for a UCX key");
    ucs_status_t st = ucp_ep_rkey_unpack(e->ep, packed, &k->rkey);
    if (st != UCS_OK) {
        free(k);
        return ks_seterr(eb, KS_ERR_PROTO, "UCX rkey_unpack: %s", ucs_status_string(st));
    }
    *out = k;
    return KS_OK;
}

void pd_ucx_rkey_close(pd_ucx_rkey *k) {
    if (!k) return;
    ucp_rkey_destroy(k->rkey);
    free(k);
}

/* A put's completion: remembers the first failure on its endpoint. */
static void pd__ucx_put_done(void *req, ucs_status_t st, void *ud) {
    pd_ucx_ep *e = ud;
    if (st != UCS_OK && e->failed == UCS_OK) e->failed = st;
    ucp_request_free(req);
}

ks_err pd_ucx_put(pd_ucx_ep *e, pd_ucx_rkey *k, const void *src, size_t len,
                  uint64_t remote_addr, ks_errbuf *eb) {
    if (e->failed != UCS_OK)
        return ks_seterr(eb, KS_ERR_IO, "UCX put: %s", ucs_status_string(e->failed));
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.send = pd__ucx_put_done, .user_data = e};
    void *req = ucp_put_nbx(e->ep, src, len, remote_addr, k->rkey, &p);
    if (UCS_PTR_IS_ERR(req)) {
        e->failed = UCS_PTR_STATUS(req);
        return ks_seterr(eb, KS_ERR_IO, "UCX put: %s", ucs_status_string(e->failed));
    }
    return KS_OK; // NULL: done at once; else the callback frees it
}

ks_err pd_ucx_flush_start(pd_ucx_ep *e, ks_errbuf *eb) {
    if (e->flush_req) return ks_seterr(eb, KS_ERR_INVAL, "a UCX flush is already running");
    ucp_request_param_t p = {.op_attr_mask = 0};
    void *req = ucp_ep_flush_nbx(e->ep, &p);
    if (UCS_PTR_IS_ERR(req)) {
        e->failed = UCS_PTR_STATUS(req);
        return ks_seterr(eb, KS_ERR_IO, "UCX flush: %s", ucs_status_string(e->failed));
    }
    e->flush_req = req; // NULL: nothing was pending
    return KS_OK;
}

ks_err pd_ucx_flush_poll(pd_ucx_ep *e, ks_errbuf *eb) {
    if (e->flush_req) {
        ucs_status_t st = ucp_request_check_status(e->flush_req);
        if (st == UCS_INPROGRESS) return KS_ERR_AGAIN;
        ucp_request_free(e->flush_req);
        e->flush_req = NULL;
        if (st != UCS_OK && e->failed == UCS_OK) e->failed = st;
    }
    if (e->failed != UCS_OK)
        return ks_seterr(eb, KS_ERR_IO, "UCX put/flush: %s", ucs_status_string(e->failed));
    return KS_OK;
}
