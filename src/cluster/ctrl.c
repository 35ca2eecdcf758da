/* ctrl.c — a worker's control connection to the router (cluster_int.h,
 * docs/pd-protocol.md sections 1, 4, 8): connect with back-off (100 ms
 * doubling to 2 s) until the handshake and REGISTER succeed, answer HEALTH
 * and POOL_CHECK here, hand every other router frame to the role, tell it
 * when a registration's PEER list is complete (on_synced), and after
 * losing a registered connection (close, ERROR, T_router without HEALTH)
 * report it once through on_lost and start over. Loop thread only. */
#include "cluster_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CTRL_BACKOFF_MIN_MS 100u
#define CTRL_BACKOFF_MAX_MS 2000u
#define CTRL_CONNECT_TIMEOUT_MS 2000
#define CTRL_T_ROUTER_DEFAULT_MS 5000u

struct cl_ctrl {
    pd_loop *l;
    cl_ctrl_cfg cfg;  /* router_host and reg.host point at the copies below */
    char *router_host;
    char *reg_host;
    cl_ctrl_cbs cbs;
    void *ud;
    pd_conn *conn;    /* NULL while waiting to reconnect */
    bool open;        /* handshake done, REGISTER sent */
    bool registered;  /* REGISTER_ACK received on conn */
    bool synced;      /* registered, and a HEALTH came after the ACK (on_synced called) */
    uint32_t worker_id;
    uint64_t router_id;       /* REGISTER_ACK's identity */
    char name[300];           /* "host:port" for logs */
    uint32_t backoff_ms;
    bool quiesced;          /* draining: no reconnect once the router lets go */
    uint64_t next_attempt_ms; /* when conn == NULL: next connect */
    uint64_t opened_ms;       /* REGISTER sent at */
    uint64_t last_health_ms;  /* registered: last HEALTH (or the ACK) */
    uint32_t t_router_ms;     /* registered: max(cfg.t_router_ms, 5 x health interval) */
};

// ----------------------------------------------------------------------------
// Connection handling

/* Sends ERROR{err, msg} best-effort, then closes after flushing. */
static void ctrl__fail(cl_ctrl *c, ks_err err, const char *msg) {
    if (!c->conn) return;
    cl_error_close(c->conn, err, msg);
}

static void ctrl__send_register(cl_ctrl *c) {
    // (up to 34 KiB with the most adapters: on the heap)
    const size_t cap = PD_MSG_REGISTER_FIXED + PD_MSG_MAX_HOST + PD_MSG_MAX_NAMES +
                       PD_MSG_ADAPTER_BYTES * (size_t)c->cfg.reg.n_adapters;
    uint8_t *buf = malloc(cap);
    uint32_t len = 0;
    ks_errbuf eb;
    ks_err e = buf ? pd_msg_register_encode(&c->cfg.reg, buf, cap, &len, &eb)
                   : ks_seterr(&eb, KS_ERR_NOMEM, "out of memory");
    if (e == KS_OK) {
        struct iovec iov = {buf, len};
        e = pd_conn_send(c->conn, PD_MSG_REGISTER, 0, &iov, 1, &eb);
    }
    free(buf);
    if (e != KS_OK) {
        ks_log(KS_LOG_ERROR, "router %s:%d: cannot send REGISTER: %s", c->router_host,
               c->cfg.router_port, eb.msg);
        pd_conn_close(c->conn);
    }
}

static void ctrl__on_open(pd_conn *pc, void *ud) {
    cl_ctrl *c = ud;
    if (!c) return;
    (void)pc;
    c->open = true;
    c->opened_ms = cl_now_ms(NULL);
    ctrl__send_register(c);
}

static void ctrl__health(cl_ctrl *c, const pd_frame *f) {
    pd_msg_health h;
    ks_errbuf eb;
    if (pd_msg_health_decode(f->payload, f->payload_len, &h, &eb) != KS_OK) {
        ctrl__fail(c, KS_ERR_PROTO, eb.msg);
        return;
    }
    c->last_health_ms = cl_now_ms(NULL);
    pd_msg_health_ack a;
    memset(&a, 0, sizeof a);
    c->cbs.health(c->ud, &a);
    a.seq = h.seq;
    uint8_t buf[24];
    uint32_t len = 0;
    ks_err e = pd_msg_health_ack_encode(&a, buf, sizeof buf, &len, &eb);
    if (e == KS_OK) {
        struct iovec iov = {buf, len};
        e = pd_conn_send(c->conn, PD_MSG_HEALTH_ACK, 0, &iov, 1, &eb);
    }
    if (e != KS_OK) ks_log(KS_LOG_WARN, "router: HEALTH_ACK not sent: %s", eb.msg);
}

static void ctrl__pool_check(cl_ctrl *c, const pd_frame *f) {
    pd_msg_pool_check_ack a;
    memset(&a, 0, sizeof a);
    c->cbs.pool_check(c->ud, &a);
    uint8_t buf[24];
    uint32_t len = 0;
    ks_errbuf eb;
    ks_err e = pd_msg_pool_check_ack_encode(&a, buf, sizeof buf, &len, &eb);
    if (e == KS_OK) {
        struct iovec iov = {buf, len};
        e = pd_conn_send(c->conn, PD_MSG_POOL_CHECK_ACK, f->hdr.req_id, &iov, 1, &eb);
    }
    if (e != KS_OK) ks_log(KS_LOG_WARN, "router: POOL_CHECK_ACK not sent: %s", eb.msg);
}

static void ctrl__on_frame(pd_conn *pc, void *ud, const pd_frame *f) {
    cl_ctrl *c = ud;
    (void)pc;
    if (!c || !c->conn) return;
    ks_errbuf eb;
    uint16_t t = f->hdr.type;
    if (t == PD_MSG_ERROR) {
        pd_msg_error m;
        if (pd_msg_error_decode(f->payload, f->payload_len, &m, &eb) == KS_OK)
            ks_log(KS_LOG_WARN, "router %s:%d sent ERROR %s: %.*s; closing", c->router_host,
                   c->cfg.router_port, ks_err_name((ks_err)m.err), (int)m.msg_len, m.msg);
        else
            ks_log(KS_LOG_WARN, "router %s:%d sent a malformed ERROR; closing", c->router_host,
                   c->cfg.router_port);
        if (c->registered) c->cbs.on_frame(c->ud, f);
        pd_conn_close(c->conn);
        return;
    }
    if (!c->registered) {
        if (t != PD_MSG_REGISTER_ACK) {
            ctrl__fail(c, KS_ERR_PROTO, "frame before REGISTER_ACK");
            return;
        }
        pd_msg_register_ack a;
        if (pd_msg_register_ack_decode(f->payload, f->payload_len, &a, &eb) != KS_OK) {
            ctrl__fail(c, KS_ERR_PROTO, eb.msg);
            return;
        }
        c->registered = true;
        c->synced = false;
        c->worker_id = a.worker_id;
        c->router_id = a.router_id;
        /* The router gives up on a worker after three missed HEALTH_ACKs;
         * the worker waits at least five announced intervals, so a slow
         * router is not mistaken for a dead one before it says so. */
        uint64_t five = 5ull * a.health_interval_ms;
        c->t_router_ms = five > c->cfg.t_router_ms ? (uint32_t)(five > UINT32_MAX ? UINT32_MAX : five)
                                                   : c->cfg.t_router_ms;
        c->backoff_ms = CTRL_BACKOFF_MIN_MS;
        c->last_health_ms = cl_now_ms(NULL);
        ks_log(KS_LOG_INFO, "registered with router %s:%d as worker %" PRIu32 " (router %016" PRIx64 ")",
               c->router_host, c->cfg.router_port, a.worker_id, a.router_id);
        if (c->cbs.on_registered) c->cbs.on_registered(c->ud, a.worker_id);
        return;
    }
    switch (t) {
    case PD_MSG_REGISTER_ACK:
        ctrl__fail(c, KS_ERR_PROTO, "duplicate REGISTER_ACK");
        return;
    case PD_MSG_HEALTH:
        ctrl__health(c, f);
        // the router sends REGISTER_ACK and then a PEER per decode worker in
        // one go, its HEALTHs only later: by the first one the list is complete
        if (!c->synced && c->conn) {
            c->synced = true;
            if (c->cbs.on_synced) c->cbs.on_synced(c->ud);
        }
        return;
    case PD_MSG_POOL_CHECK:
        ctrl__pool_check(c, f);
        return;
    default:
        c->cbs.on_frame(c->ud, f);
        return;
    }
}

static void ctrl__on_close(pd_conn *pc, void *ud, ks_err why, const char *msg) {
    cl_ctrl *c = ud;
    if (!c || c->conn != pc) return;
    bool was_registered = c->registered;
    c->conn = NULL;
    c->open = false;
    c->registered = false;
    uint64_t now = cl_now_ms(NULL);
    if (was_registered) {
        ks_log(KS_LOG_INFO, "router %s:%d lost (%s: %s); reconnecting", c->router_host,
               c->cfg.router_port, ks_err_name(why), msg ? msg : "");
        c->backoff_ms = CTRL_BACKOFF_MIN_MS;
        c->next_attempt_ms = now + c->backoff_ms;
        if (c->cbs.on_lost) c->cbs.on_lost(c->ud);
        return;
    }
    ks_log(KS_LOG_DEBUG, "router %s:%d: connect failed (%s: %s); retry in %" PRIu32 " ms",
           c->router_host, c->cfg.router_port, ks_err_name(why), msg ? msg : "", c->backoff_ms);
    c->next_attempt_ms = now + c->backoff_ms;
    c->backoff_ms = c->backoff_ms * 2 > CTRL_BACKOFF_MAX_MS ? CTRL_BACKOFF_MAX_MS : c->backoff_ms * 2;
}

/* Starts one connect attempt; on an immediate failure schedules the next. */
static void ctrl__connect(cl_ctrl *c) {
    pd_conn_cbs cbs = {
        .on_open = ctrl__on_open,
        .on_frame = ctrl__on_frame,
        .on_close = ctrl__on_close,
        .type_max = c->cfg.type_max,
        .n_types = PD_MSG_N_TYPES,
        .peer_roles = 1u << PD_ROLE_ROUTER,
    };
    ks_errbuf eb;
    pd_conn *pc = NULL;
    ks_err e = pd_tcp_connect(c->l, c->router_host, (uint16_t)c->cfg.router_port,
                              CTRL_CONNECT_TIMEOUT_MS, &cbs, c, &pc, &eb);
    if (e != KS_OK) {
        ks_log(KS_LOG_DEBUG, "router %s:%d: %s", c->router_host, c->cfg.router_port, eb.msg);
        c->next_attempt_ms = cl_now_ms(NULL) + c->backoff_ms;
        c->backoff_ms =
            c->backoff_ms * 2 > CTRL_BACKOFF_MAX_MS ? CTRL_BACKOFF_MAX_MS : c->backoff_ms * 2;
        return;
    }
    c->conn = pc;
    c->open = false;
    c->registered = false;
}

// ----------------------------------------------------------------------------
// API

ks_err cl_ctrl_start(pd_loop *l, const cl_ctrl_cfg *cfg, const cl_ctrl_cbs *cbs, void *ud,
                     cl_ctrl **out, ks_errbuf *eb) {
    *out = NULL;
    if (!l || !cfg || !cbs || !cfg->router_host || cfg->router_port <= 0 ||
        cfg->router_port > 65535 || !cfg->type_max || !cbs->on_frame || !cbs->health ||
        !cbs->pool_check)
        return ks_seterr(eb, KS_ERR_INVAL,
                         "control client: router address, type table and callbacks are required");
    if (cfg->reg.host_len > PD_MSG_MAX_HOST)
        return ks_seterr(eb, KS_ERR_INVAL, "control client: host longer than %u bytes",
                         PD_MSG_MAX_HOST);
    cl_ctrl *c = calloc(1, sizeof *c);
    if (!c) return ks_seterr(eb, KS_ERR_NOMEM, "control client: out of memory");
    c->l = l;
    c->cfg = *cfg;
    c->cbs = *cbs;
    c->ud = ud;
    c->router_host = strdup(cfg->router_host);
    c->reg_host = malloc((size_t)cfg->reg.host_len + 1);
    if (!c->router_host || !c->reg_host) goto fail;
    if (cfg->reg.host_len) memcpy(c->reg_host, cfg->reg.host, cfg->reg.host_len);
    c->reg_host[cfg->reg.host_len] = '\0';
    c->cfg.router_host = c->router_host;
    snprintf(c->name, sizeof c->name, "%.255s:%d", c->router_host, cfg->router_port);
    c->cfg.reg.host = c->reg_host;
    if (!c->cfg.t_router_ms) c->cfg.t_router_ms = CTRL_T_ROUTER_DEFAULT_MS;
    c->backoff_ms = CTRL_BACKOFF_MIN_MS;
    ctrl__connect(c);
    *out = c;
    return KS_OK;
fail:
    free(c->router_host);
    free(c->reg_host);
    free(c);
    return ks_seterr(eb, KS_ERR_NOMEM, "control client: out of memory");
}

void cl_ctrl_tick(cl_ctrl *c) {
    uint64_t now = cl_now_ms(NULL);
    if (!c->conn) {
        if (!c->quiesced && now >= c->next_attempt_ms) ctrl__connect(c);
        return;
    }
    if (c->registered && now - c->last_health_ms > c->t_router_ms) {
        ks_log(KS_LOG_WARN, "router %s:%d: no HEALTH for %" PRIu32 " ms (T_router); reconnecting",
               c->router_host, c->cfg.router_port, c->t_router_ms);
        pd_conn_close(c->conn); // on_close reports the loss (on_lost)
    } else if (c->open && !c->registered && now - c->opened_ms > c->cfg.t_router_ms) {
        ks_log(KS_LOG_WARN, "router %s:%d: no REGISTER_ACK within %" PRIu32 " ms; retrying",
               c->router_host, c->cfg.router_port, c->cfg.t_router_ms);
        pd_conn_close(c->conn);
    }
}

ks_err cl_ctrl_send(cl_ctrl *c, uint16_t type, uint64_t req_id, const struct iovec *iov, int n_iov,
                    ks_errbuf *eb) {
    if (!c->conn || !c->registered)
        return ks_seterr(eb, KS_ERR_PEER_CLOSED, "not registered with the router");
    return pd_conn_send(c->conn, type, req_id, iov, n_iov, eb);
}

bool cl_ctrl_registered(const cl_ctrl *c) { return c->registered; }

void cl_ctrl_quiesce(cl_ctrl *c) { c->quiesced = true; }

uint32_t cl_ctrl_worker_id(const cl_ctrl *c) { return c->worker_id; }

uint64_t cl_ctrl_router_id(const cl_ctrl *c) { return c->router_id; }

const char *cl_ctrl_name(const cl_ctrl *c) { return c->name; }

int cl_worker_routers(const cluster_worker_opts *o, cluster_router_addr out[CLUSTER_MAX_ROUTERS]) {
    int n = o->n_routers > 0 ? o->n_routers : 1;
    if (n > CLUSTER_MAX_ROUTERS) return 0;
    for (int i = 0; i < n; i++) {
        out[i] = o->n_routers > 0 ? o->routers[i]
                                  : (cluster_router_addr){o->router_host, o->router_port};
        if (!out[i].host || out[i].port <= 0 || out[i].port > 65535) return 0;
    }
    return n;
}

void cl_ctrl_destroy(cl_ctrl *c) {
    if (!c) return;
    if (c->conn) {
        pd_conn_set_ud(c->conn, NULL); // its on_close runs later: it must not find c
        pd_conn_close(c->conn);
    }
    free(c->router_host);
    free(c->reg_host);
    free(c);
}
