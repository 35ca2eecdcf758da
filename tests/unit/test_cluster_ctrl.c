/* test_cluster_ctrl.c — the worker's control client (src/cluster/ctrl.c,
 * docs/pd-protocol.md sections 1, 4, 8) against an in-process fake router
 * (a pd_listener with role ROUTER on a second pd_loop, both loops driven from
 * this thread): a worker started before the router listens still registers
 * (back-off retries), HEALTH is answered with the seq echoed, POOL_CHECK with
 * the same req_id, other frames reach on_frame, and a lost router (close,
 * ERROR, T_router silence) is reported through on_lost exactly once before
 * the worker registers again. The router's REGISTER check
 * (cl_register_refused, what router.c runs) refuses a worker whose plane
 * count, geometry, KV type, model or role differs, naming the difference,
 * and the fake router applies it on the wire. The worker's health endpoint
 * (health_http.c): /health 200 until the loop stops beating, /ready 200 only
 * when the last beat said registered and not draining, each 503 naming why.
 * `test_cluster_ctrl NAME` runs one case. */
#include "cluster/cluster_int.h"

#include "../check.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const uint8_t SECRET[32] = "cluster-secret-ctrl-0123456789ab";

// ----------------------------------------------------------------------------
// Harness: the worker side (cl_ctrl on wl) and a fake router (listener on rl)

typedef struct {
    pd_loop *wl, *rl;
    pd_listener *ls;
    uint16_t port;
    cl_ctrl *ctrl;
    uint32_t tmax[PD_MSG_N_TYPES];
    // worker-side observations
    int n_registered, n_lost, n_frames;
    uint32_t last_id;
    uint16_t last_type;
    // fake router
    pd_conn *rc; /* the accepted worker conn */
    int n_register;
    uint8_t reg_role;
    uint32_t next_id;
    bool auto_ack;
    uint32_t ack_interval_ms; /* health interval announced in REGISTER_ACK */
    uint64_t lost_at_ms;      /* cl_now_ms at the last on_lost */
    int n_health_ack, n_pool_ack;
    pd_msg_health_ack hack;
    pd_msg_pool_check_ack pack;
    uint64_t pack_req;
    int n_router_closed;
    kv_geom rg;    /* the fake router's KV geometry: REGISTERs are checked against it */
    int n_refused; /* REGISTERs cl_register_refused turned away */
    char why[256]; /* the last refusal's reason */
} harness;

static void w_registered(void *ud, uint32_t id) {
    harness *h = ud;
    h->n_registered++;
    h->last_id = id;
}
static void w_frame(void *ud, const pd_frame *f) {
    harness *h = ud;
    h->n_frames++;
    h->last_type = f->hdr.type;
}
static void w_lost(void *ud) {
    harness *h = ud;
    h->n_lost++;
    h->lost_at_ms = cl_now_ms(NULL);
}
static void w_health(void *ud, pd_msg_health_ack *out) {
    (void)ud;
    out->active_requests = 3;
    out->free_pages = 11;
    out->quarantined_pages = 2;
}
static void w_pool_check(void *ud, pd_msg_pool_check_ack *out) {
    (void)ud;
    out->clean = 1;
    out->active = 0;
    out->free_pages = 12;
}

static void r_send(harness *h, uint16_t type, uint64_t req_id, const uint8_t *p, uint32_t len) {
    struct iovec iov = {(void *)p, len};
    CHECK(h->rc);
    CHECK_EQ(pd_conn_send(h->rc, type, req_id, &iov, len ? 1 : 0, NULL), KS_OK);
}

static void r_open(pd_conn *c, void *ud) {
    harness *h = ud;
    h->rc = c;
}
static void r_frame(pd_conn *c, void *ud, const pd_frame *f) {
    harness *h = ud;
    switch (f->hdr.type) {
    case PD_MSG_REGISTER: {
        pd_msg_register m;
        CHECK_EQ(pd_msg_register_decode(f->payload, f->payload_len, &m, NULL), KS_OK);
        h->n_register++;
        h->reg_role = m.role;
        static const uint8_t model_id[PD_MSG_HASH_BYTES]; /* the harness's workers send zeros */
        if (cl_register_refused(&m, pd_conn_peer_role(c), model_id, &h->rg, 0, NULL, h->why,
                                sizeof h->why)) {
            h->n_refused++;
            cl_error_close(c, KS_ERR_INVAL, h->why); // as router.c does
            break;
        }
        if (h->auto_ack) {
            pd_msg_register_ack a = {.worker_id = h->next_id++, .health_interval_ms = h->ack_interval_ms,
                                     .router_id = 0x5151};
            uint8_t buf[16];
            uint32_t len;
            CHECK_EQ(pd_msg_register_ack_encode(&a, buf, sizeof buf, &len, NULL), KS_OK);
            r_send(h, PD_MSG_REGISTER_ACK, 0, buf, len);
        }
        break;
    }
    case PD_MSG_HEALTH_ACK:
        CHECK_EQ(pd_msg_health_ack_decode(f->payload, f->payload_len, &h->hack, NULL), KS_OK);
        h->n_health_ack++;
        break;
    case PD_MSG_POOL_CHECK_ACK:
        CHECK_EQ(pd_msg_pool_check_ack_decode(f->payload, f->payload_len, &h->pack, NULL), KS_OK);
        h->pack_req = f->hdr.req_id;
        h->n_pool_ack++;
        break;
    default:
        CHECK(!"unexpected frame at the fake router");
    }
}
static void r_close(pd_conn *c, void *ud, ks_err why, const char *msg) {
    harness *h = ud;
    (void)why;
    (void)msg;
    if (h->rc == c) h->rc = NULL;
    h->n_router_closed++;
}

static void r_listen(harness *h, uint16_t port) {
    pd_conn_cbs cbs = {.on_open = r_open, .on_frame = r_frame, .on_close = r_close,
                       .peer_roles = (1u << PD_ROLE_PREFILL) | (1u << PD_ROLE_DECODE)};
    ks_errbuf eb;
    ks_err e = pd_tcp_listen(h->rl, "127.0.0.1", port, &cbs, h, &h->ls, &eb);
    if (e) fprintf(stderr, "listen: %s\n", eb.msg);
    CHECK_EQ(e, KS_OK);
    h->port = pd_listener_port(h->ls);
}

static pd_loop *mkloop(uint8_t role) {
    pd_loop_cfg cfg = {.secret = SECRET, .secret_len = sizeof SECRET, .role = role,
                       .max_payload = PD_MSG_MAX_FRAME};
    pd_loop *l = NULL;
    CHECK_EQ(pd_loop_create(&cfg, &l, NULL), KS_OK);
    return l;
}

/* The plane count the next h_init's worker registers with (its pages: 2 = K, V). */
static int g_worker_planes = 2;

static void h_init(harness *h, uint32_t t_router_ms, bool listen_first) {
    memset(h, 0, sizeof *h);
    h->wl = mkloop(PD_ROLE_PREFILL);
    h->rl = mkloop(PD_ROLE_ROUTER);
    h->next_id = 7;
    h->auto_ack = true;
    h->ack_interval_ms = 1;
    // a free port: bind, note it, close again
    r_listen(h, 0);
    if (!listen_first) {
        pd_listener_close(h->ls);
        h->ls = NULL;
    }
    kv_geom g = {.n_layer = 2, .kv_dim = 8, .page_tokens = 4, .planes = g_worker_planes};
    CHECK_EQ(pd_msg_type_max(&g, h->tmax, NULL), KS_OK);
    h->rg = (kv_geom){.n_layer = 2, .kv_dim = 8, .page_tokens = 4}; // 2 planes (the zero value)
    cl_ctrl_cfg cfg = {.router_host = "127.0.0.1", .router_port = h->port, .type_max = h->tmax,
                       .t_router_ms = t_router_ms};
    cfg.reg.role = PD_ROLE_PREFILL;
    cfg.reg.n_layer = 2;
    cfg.reg.kv_dim = 8;
    cfg.reg.page_tokens = 4;
    cfg.reg.planes = (uint8_t)kv_geom_planes(&g);
    cfg.reg.n_pages = 12;
    cfg.reg.n_ctx = 32;
    cl_ctrl_cbs cbs = {.on_registered = w_registered, .on_frame = w_frame, .on_lost = w_lost,
                       .health = w_health, .pool_check = w_pool_check};
    CHECK_EQ(cl_ctrl_start(h->wl, &cfg, &cbs, h, &h->ctrl, NULL), KS_OK);
}

static void h_fini(harness *h) {
    cl_ctrl_destroy(h->ctrl);
    pd_loop_destroy(h->wl);
    pd_loop_destroy(h->rl);
}

/* Drives both loops (and the ctrl's tick) for up to ms, or until *flag >= want. */
static bool run_until(harness *h, const int *flag, int want, int ms) {
    uint64_t end = cl_now_ms(NULL) + (uint64_t)ms;
    while (cl_now_ms(NULL) < end) {
        if (flag && *flag >= want) return true;
        CHECK_EQ(pd_loop_run_once(h->wl, 2), KS_OK);
        CHECK_EQ(pd_loop_run_once(h->rl, 2), KS_OK);
        cl_ctrl_tick(h->ctrl);
    }
    return flag ? *flag >= want : true;
}

// ----------------------------------------------------------------------------
// Cases

/* Order independence: the worker starts while nothing listens, fails its
 * connects with back-off, and registers once the router comes up. */
static void test_register_after_router_starts(void) {
    harness h;
    h_init(&h, 5000, false);
    run_until(&h, NULL, 0, 400); // several failed attempts (100, 200 ms back-off)
    CHECK_EQ(h.n_registered, 0);
    CHECK(!cl_ctrl_registered(h.ctrl));
    CHECK_EQ(cl_ctrl_worker_id(h.ctrl), 0);
    struct iovec none = {NULL, 0};
    CHECK_EQ(cl_ctrl_send(h.ctrl, PD_MSG_REJECT, 1, &none, 0, NULL), KS_ERR_PEER_CLOSED);
    r_listen(&h, h.port);
    CHECK(run_until(&h, &h.n_registered, 1, TEST_WAIT_MS)); // back-off is at most 2 s
    CHECK_EQ(h.n_register, 1);
    CHECK_EQ(h.reg_role, PD_ROLE_PREFILL);
    CHECK_EQ(h.last_id, 7);
    CHECK(cl_ctrl_registered(h.ctrl));
    CHECK_EQ(cl_ctrl_worker_id(h.ctrl), 7);
    CHECK_EQ(h.n_lost, 0);
    h_fini(&h);
}

/* HEALTH -> HEALTH_ACK with the seq echoed and the callback's numbers;
 * POOL_CHECK -> POOL_CHECK_ACK with the same req_id; other frames go to
 * on_frame; neither HEALTH nor POOL_CHECK does. */
static void test_health_and_pool_check(void) {
    harness h;
    h_init(&h, 5000, true);
    CHECK(run_until(&h, &h.n_registered, 1, TEST_WAIT_MS));
    uint8_t buf[64];
    uint32_t len;
    pd_msg_health hm = {.seq = 0x1122334455ull};
    CHECK_EQ(pd_msg_health_encode(&hm, buf, sizeof buf, &len, NULL), KS_OK);
    r_send(&h, PD_MSG_HEALTH, 0, buf, len);
    CHECK(run_until(&h, &h.n_health_ack, 1, TEST_WAIT_MS));
    CHECK_EQ(h.hack.seq, 0x1122334455ull);
    CHECK_EQ(h.hack.active_requests, 3);
    CHECK_EQ(h.hack.free_pages, 11);
    CHECK_EQ(h.hack.quarantined_pages, 2);

    r_send(&h, PD_MSG_POOL_CHECK, 991, NULL, 0);
    CHECK(run_until(&h, &h.n_pool_ack, 1, TEST_WAIT_MS));
    CHECK_EQ(h.pack_req, 991);
    CHECK_EQ(h.pack.clean, 1);
    CHECK_EQ(h.pack.free_pages, 12);
    CHECK_EQ(h.n_frames, 0);

    pd_msg_peer pm = {.decode_worker_id = 4, .port = 1234, .host = "127.0.0.1", .host_len = 9};
    CHECK_EQ(pd_msg_peer_encode(&pm, buf, sizeof buf, &len, NULL), KS_OK);
    r_send(&h, PD_MSG_PEER, 0, buf, len);
    CHECK(run_until(&h, &h.n_frames, 1, TEST_WAIT_MS));
    CHECK_EQ(h.last_type, PD_MSG_PEER);
    CHECK_EQ(h.n_lost, 0);
    h_fini(&h);
}

/* The router closes the connection: on_lost exactly once, then the worker
 * registers again (a new REGISTER, a new id). */
static void test_router_close_then_reregister(void) {
    harness h;
    h_init(&h, 5000, true);
    CHECK(run_until(&h, &h.n_registered, 1, TEST_WAIT_MS));
    pd_conn_close(h.rc);
    CHECK(run_until(&h, &h.n_registered, 2, TEST_WAIT_MS));
    CHECK_EQ(h.n_lost, 1);
    CHECK_EQ(h.n_register, 2);
    CHECK_EQ(h.last_id, 8);
    CHECK_EQ(cl_ctrl_worker_id(h.ctrl), 8);
    run_until(&h, NULL, 0, 300);
    CHECK_EQ(h.n_lost, 1); // once, not per retry
    h_fini(&h);
}

/* ERROR from the router: logged, the connection closed, on_lost once, re-register. */
static void test_router_error(void) {
    harness h;
    h_init(&h, 5000, true);
    CHECK(run_until(&h, &h.n_registered, 1, TEST_WAIT_MS));
    pd_msg_error em = {.err = KS_ERR_INVAL, .msg = "model mismatch", .msg_len = 14};
    uint8_t buf[64];
    uint32_t len;
    CHECK_EQ(pd_msg_error_encode(&em, buf, sizeof buf, &len, NULL), KS_OK);
    r_send(&h, PD_MSG_ERROR, 0, buf, len);
    CHECK(run_until(&h, &h.n_lost, 1, TEST_WAIT_MS));
    CHECK(run_until(&h, &h.n_registered, 2, TEST_WAIT_MS));
    CHECK_EQ(h.n_lost, 1);
    h_fini(&h);
}

/* T_router: a registered connection without HEALTH is given up (on_lost once)
 * and re-registered; HEALTH keeps it alive. The limit is the larger of the
 * configured one (300 ms) and five announced health intervals (5 x 400 ms):
 * the loss cannot come sooner than 2000 ms after the last HEALTH. */
static void test_t_router(void) {
    harness h;
    h_init(&h, 300, true);
    h.ack_interval_ms = 400;
    CHECK(run_until(&h, &h.n_registered, 1, TEST_WAIT_MS));
    // HEALTH every 100 ms for 1.5 s: not lost
    uint8_t buf[16];
    uint32_t len;
    uint64_t last = 0;
    for (int i = 0; i < 15; i++) {
        pd_msg_health hm = {.seq = (uint64_t)i};
        CHECK_EQ(pd_msg_health_encode(&hm, buf, sizeof buf, &len, NULL), KS_OK);
        r_send(&h, PD_MSG_HEALTH, 0, buf, len);
        CHECK(run_until(&h, &h.n_health_ack, i + 1, TEST_WAIT_MS));
        last = cl_now_ms(NULL);
        run_until(&h, NULL, 0, 100);
    }
    CHECK_EQ(h.n_lost, 0);
    CHECK_EQ(h.n_health_ack, 15);
    // silence: lost after T_router, then registered again
    CHECK(run_until(&h, &h.n_lost, 1, TEST_WAIT_MS));
    CHECK(h.lost_at_ms - last >= 2000);
    CHECK(run_until(&h, &h.n_registered, 2, TEST_WAIT_MS));
    CHECK_EQ(h.n_lost, 1);
    h_fini(&h);
}

/* No REGISTER_ACK: the worker is not registered and keeps retrying; no on_lost
 * (it never was registered). */
static void test_no_ack_no_lost(void) {
    harness h;
    h_init(&h, 200, true);
    h.auto_ack = false;
    CHECK(run_until(&h, &h.n_register, 2, TEST_WAIT_MS));
    CHECK_EQ(h.n_registered, 0);
    CHECK_EQ(h.n_lost, 0);
    h_fini(&h);
}

/* The router's REGISTER check, field by field: a worker of the router's
 * model, geometry, plane count and KV type is accepted; one whose pages have
 * another plane count (1 = one row per position, MLA; 2 = K, V) is refused
 * either way round, the reason naming both counts; so are the other
 * differences, each with its own reason. */
static void test_register_check(void) {
    uint8_t id[PD_MSG_HASH_BYTES], other[PD_MSG_HASH_BYTES];
    memset(id, 0x11, sizeof id);
    memset(other, 0x22, sizeof other);
    kv_geom g2 = {.n_layer = 2, .kv_dim = 8, .page_tokens = 4, .kv_type = KS_DTYPE_F16};
    kv_geom g1 = g2;
    g1.planes = 1;
    pd_msg_register m = {.role = PD_ROLE_DECODE,
                         .kv_type = KS_DTYPE_F16,
                         .planes = 2,
                         .n_layer = 2,
                         .kv_dim = 8,
                         .page_tokens = 4,
                         .n_pages = 9,
                         .n_ctx = 32,
                         .data_port = 9000,
                         .host = "127.0.0.1",
                         .host_len = 9};
    memcpy(m.model_id, id, sizeof id);
    char why[256] = "";
    CHECK(!cl_register_refused(&m, PD_ROLE_DECODE, id, &g2, 0, NULL, why, sizeof why));
    CHECK_EQ(why[0], 0);
    // planes: a 2-plane worker and a 1-plane router, and the other way round
    CHECK(cl_register_refused(&m, PD_ROLE_DECODE, id, &g1, 0, NULL, why, sizeof why));
    CHECK_STR_EQ(why, "the worker's KV pages hold 2 planes per position per layer (K, V), the "
                      "router's 1 (one row per position): every node must run the same model");
    m.planes = 1;
    CHECK(cl_register_refused(&m, PD_ROLE_DECODE, id, &g2, 0, NULL, why, sizeof why));
    CHECK_STR_EQ(why, "the worker's KV pages hold 1 plane per position per layer (one row per "
                      "position), the router's 2 (K, V): every node must run the same model");
    why[0] = 0;
    CHECK(!cl_register_refused(&m, PD_ROLE_DECODE, id, &g1, 0, NULL, why, sizeof why));
    CHECK_EQ(why[0], 0);
    // every other difference keeps its own reason
    pd_msg_register b = m;
    b.kv_dim = 16;
    CHECK(cl_register_refused(&b, PD_ROLE_DECODE, id, &g1, 0, NULL, why, sizeof why));
    CHECK_STR_HAS(why, "KV geometry n_layer 2 kv_dim 16 page_tokens 4 differs");
    b = m;
    b.kv_type = KS_DTYPE_Q8_0;
    CHECK(cl_register_refused(&b, PD_ROLE_DECODE, id, &g1, 0, NULL, why, sizeof why));
    CHECK_STR_HAS(why, "KV type q8_0 differs from the router's f16");
    CHECK(cl_register_refused(&m, PD_ROLE_DECODE, other, &g1, 0, NULL, why, sizeof why));
    CHECK_STR_HAS(why, "model_id differs");
    CHECK(cl_register_refused(&m, PD_ROLE_PREFILL, id, &g1, 0, NULL, why, sizeof why));
    CHECK_STR_HAS(why, "differs from the HELLO role");
    b = m;
    b.data_port = 0;
    CHECK(cl_register_refused(&b, PD_ROLE_DECODE, id, &g1, 0, NULL, why, sizeof why));
    CHECK_STR_HAS(why, "data-link host and port");
    // issue 40: a decode pool that cannot hold the context the router advertises
    // for the model is refused with the arithmetic (the seed's incident); 9 pages
    // x 4 tokens = 36 holds 36 but not 37; a prefill worker's pool is its own affair
    why[0] = 0;
    CHECK(!cl_register_refused(&m, PD_ROLE_DECODE, id, &g1, 36, "kjv", why, sizeof why));
    CHECK_EQ(why[0], 0);
    CHECK(cl_register_refused(&m, PD_ROLE_DECODE, id, &g1, 37, "kjv", why, sizeof why));
    CHECK_STR_EQ(why, "pool 9 pages x 4 tokens = 36 < context 37 advertised for kjv");
    b = m;
    b.role = PD_ROLE_PREFILL;
    CHECK(!cl_register_refused(&b, PD_ROLE_PREFILL, id, &g1, 37, "kjv", why, sizeof why));
}

/* On the wire: a 1-plane worker's REGISTER (planes in byte 2) reaches a
 * 2-plane router as planes 1 and is refused every time it retries — never
 * registered, ERROR + close — while a 2-plane worker registers. */
static void test_register_planes_refused(void) {
    harness h;
    g_worker_planes = 1;
    h_init(&h, 5000, true);
    g_worker_planes = 2;
    CHECK(run_until(&h, &h.n_refused, 2, TEST_WAIT_MS)); // refused, and refused again on retry
    CHECK_EQ(h.n_registered, 0);
    CHECK(!cl_ctrl_registered(h.ctrl));
    CHECK_EQ(h.n_lost, 0);
    CHECK_STR_HAS(h.why, "KV pages hold 1 plane per position per layer");
    h_fini(&h);
    h_init(&h, 5000, true);
    CHECK(run_until(&h, &h.n_registered, 1, TEST_WAIT_MS));
    CHECK_EQ(h.n_refused, 0);
    h_fini(&h);
}


// ----------------------------------------------------------------------------
// The health endpoint (health_http.c)

/* One HTTP/1.0 request to 127.0.0.1:port; returns the status, the body in
 * body[0..cap). Blocking: the endpoint answers on its own thread. */
static int health_get(int port, const char *method, const char *path, char *body, size_t cap) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char req[256];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", method, path);
    CHECK_EQ(write(fd, req, (size_t)n), n);
    char buf[2048];
    size_t len = 0;
    ssize_t r;
    while (len < sizeof buf - 1 && (r = read(fd, buf + len, sizeof buf - 1 - len)) > 0)
        len += (size_t)r;
    close(fd);
    buf[len] = '\0';
    int status = 0;
    CHECK_EQ(sscanf(buf, "HTTP/1.%*d %d", &status), 1);
    const char *b = strstr(buf, "\r\n\r\n");
    snprintf(body, cap, "%s", b ? b + 4 : "");
    return status;
}

static void sleep_ms(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_health_endpoint(void) {
    ks_errbuf eb = {0};
    cl_health *h = NULL;
    // bad input: no host; an address that does not resolve
    CHECK_EQ(cl_health_start(NULL, 0, 0, &h, &eb), KS_ERR_INVAL);
    CHECK_EQ(cl_health_start("no such host.invalid", 0, 0, &h, &eb), KS_ERR_INVAL);
    CHECK(h == NULL);
    cl_health_beat(NULL, true, false);  // no endpoint: nothing
    cl_health_destroy(NULL);
    CHECK_EQ(cl_health_start("127.0.0.1", 0, 0, &h, &eb), KS_OK);
    int port = cl_health_port(h);
    CHECK(port > 0);
    // the port is taken: a second endpoint there fails to bind
    cl_health *h2 = NULL;
    CHECK_EQ(cl_health_start("127.0.0.1", port, 0, &h2, &eb), KS_ERR_IO);
    CHECK_STR_HAS(eb.msg, "cannot listen");
    char body[512];
    // before the loop's first beat: live, not ready
    CHECK_EQ(health_get(port, "GET", "/health", body, sizeof body), 200);
    CHECK_STR_EQ(body, "ok\n");
    CHECK_EQ(health_get(port, "GET", "/ready", body, sizeof body), 503);
    CHECK_STR_EQ(body, "starting\n");
    cl_health_beat(h, false, false);
    CHECK_EQ(health_get(port, "GET", "/ready", body, sizeof body), 503);
    CHECK_STR_EQ(body, "not registered with the router\n");
    cl_health_beat(h, true, false);
    CHECK_EQ(health_get(port, "GET", "/ready", body, sizeof body), 200);
    CHECK_STR_EQ(body, "ready\n");
    CHECK_EQ(health_get(port, "HEAD", "/ready", body, sizeof body), 200);
    CHECK_EQ(health_get(port, "GET", "/health", body, sizeof body), 200);
    cl_health_beat(h, true, true);
    CHECK_EQ(health_get(port, "GET", "/ready", body, sizeof body), 503);
    CHECK_STR_EQ(body, "draining\n");
    CHECK_EQ(health_get(port, "GET", "/health", body, sizeof body), 200);
    CHECK_EQ(health_get(port, "GET", "/metrics", body, sizeof body), 404);
    CHECK_EQ(health_get(port, "POST", "/ready", body, sizeof body), 405);
    cl_health_destroy(h);
    // a loop that stops beating: after stall_ms neither live nor ready (a
    // second endpoint with a 1 s stall; the first one's is 30 s)
    CHECK_EQ(cl_health_start("127.0.0.1", 0, 1000, &h, &eb), KS_OK);
    port = cl_health_port(h);
    cl_health_beat(h, true, false);
    uint64_t t0 = cl_now_ms(NULL);
    while (health_get(port, "GET", "/health", body, sizeof body) == 200) {
        CHECK(cl_now_ms(NULL) - t0 < TEST_WAIT_MS);
        sleep_ms(20);
    }
    CHECK(cl_now_ms(NULL) - t0 >= 1000);
    CHECK_STR_HAS(body, "the worker's loop has not run for");
    CHECK_EQ(health_get(port, "GET", "/ready", body, sizeof body), 503);
    CHECK_STR_HAS(body, "the worker's loop has not run for");
    // a beat brings it back
    cl_health_beat(h, true, false);
    CHECK_EQ(health_get(port, "GET", "/health", body, sizeof body), 200);
    CHECK_EQ(health_get(port, "GET", "/ready", body, sizeof body), 200);
    cl_health_destroy(h);
}

int main(int argc, char **argv) {
    ks_log_init_env();
    struct {
        const char *name;
        void (*fn)(void);
    } cases[] = {
        {"register_after_router_starts", test_register_after_router_starts},
        {"health_and_pool_check", test_health_and_pool_check},
        {"router_close_then_reregister", test_router_close_then_reregister},
        {"router_error", test_router_error},
        {"t_router", test_t_router},
        {"no_ack_no_lost", test_no_ack_no_lost},
        {"register_check", test_register_check},
        {"register_planes_refused", test_register_planes_refused},
        {"health_endpoint", test_health_endpoint},
    };
    int n = (int)(sizeof cases / sizeof cases[0]), ran = 0;
    for (int i = 0; i < n; i++) {
        if (argc > 1 && strcmp(argv[1], cases[i].name) != 0) continue;
        fprintf(stderr, "-- %s\n", cases[i].name);
        cases[i].fn();
        ran++;
    }
    CHECK(ran > 0);
    return 0;
}
