/* test_server_backend.c — the HTTP front on a scripted server_backend (what
 * `kvseal router` plugs in), over real sockets:
 * - every request goes through the backend (submit, next, release exactly
 *   once per request; cancel when the client's answer ends early);
 * - a done event before any token that reports a rejection (state REJECTED)
 *   or a remote failure gets the error JSON with the status its error
 *   implies (INVAL 400, NOSPACE 400 context_length_exceeded, AGAIN 503,
 *   PEER_CLOSED/IO 502, TIMEOUT 504, others 500) and the event's message,
 *   streamed or not — a stream does not answer 200 first;
 * - the engine's own failures keep today's answers: a cancel or a queue
 *   timeout before any token is 503 request_aborted (streamed: 200 and an
 *   SSE error event), INTERNAL is 500;
 * - a failure after a streamed token ends the stream with an error event
 *   (no [DONE]); the same request unstreamed gets the mapped status;
 * - health, metrics, the kv check and the admin switch reach the backend;
 * - a connection whose deadline start is stamped while the sweeper walks
 *   the connections (one just opened, a keep-alive one just answered) is not
 *   taken for one past its request deadline (it was: 408 at once, when the
 *   sweeper's clock was read before the stamp).
 * Needs models/kjv-mini.gguf (tokenizer) via KS_SRC. */
#include "../check.h"
#include "kvseal/admit.h"
#include "kvseal/server.h"
#include "server_fixture.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>

// ----------------------------------------------------------------------------
// The scripted backend

/* One scripted outcome: n_tok token events ("A", "B", ...), then the done
 * event (state, finish, err, msg). The prompt names the script: "s<k>". */
typedef struct script {
    int n_tok;
    engine_state state;
    engine_finish finish;
    ks_err err;
    const char *msg;
    admit_reason reason; /* REJECTED: what the refusing process said */
} script;

enum { S_OK, S_REJ_INVAL, S_REJ_NOSPACE, S_REJ_AGAIN, S_LOST, S_TTFT, S_QUEUE_TO, S_CANCELLED,
       S_INTERNAL, S_LOST_LATE, S_REJ_PROTO, S__N };

static const script SCRIPTS[S__N] = {
    [S_OK] = {2, ENGINE_FINISHED, ENGINE_FINISH_LENGTH, KS_OK, NULL},
    [S_REJ_INVAL] = {0, ENGINE_REJECTED, ENGINE_FINISH_ERROR, KS_ERR_INVAL, "prefill: bad sampling",
                     ADMIT_INVALID},
    [S_REJ_NOSPACE] = {0, ENGINE_REJECTED, ENGINE_FINISH_ERROR, KS_ERR_NOSPACE,
                       "prefill: pool too small", ADMIT_KV_CAPACITY},
    [S_REJ_AGAIN] = {0, ENGINE_REJECTED, ENGINE_FINISH_ERROR, KS_ERR_AGAIN, "prefill: queue full",
                     ADMIT_BUSY},
    [S_LOST] = {0, ENGINE_ABORTED, ENGINE_FINISH_ABORT, KS_ERR_PEER_CLOSED,
                "the decode worker was lost"},
    [S_TTFT] = {0, ENGINE_ABORTED, ENGINE_FINISH_ERROR, KS_ERR_TIMEOUT, "no first token in time"},
    [S_QUEUE_TO] = {0, ENGINE_ABORTED, ENGINE_FINISH_ABORT, KS_ERR_TIMEOUT,
                    "timed out waiting for KV capacity"},
    [S_CANCELLED] = {0, ENGINE_ABORTED, ENGINE_FINISH_ABORT, KS_ERR_CANCELLED,
                     "aborted: model taken offline"},
    [S_INTERNAL] = {0, ENGINE_ABORTED, ENGINE_FINISH_ERROR, KS_ERR_INTERNAL, "internal error"},
    [S_LOST_LATE] = {2, ENGINE_ABORTED, ENGINE_FINISH_ABORT, KS_ERR_PEER_CLOSED,
                     "the decode worker was lost"},
    [S_REJ_PROTO] = {0, ENGINE_REJECTED, ENGINE_FINISH_ERROR, KS_ERR_PROTO, "bad frame"},
};

typedef struct fake_req {
    const script *sc;
    int next;  // events handed out so far
    int32_t n_prompt;
} fake_req;

typedef struct fake {
    atomic_int n_submit, n_release, n_cancel, n_next_after_done;
    atomic_bool online;
    atomic_int n_check, n_stats, n_set_online;
} fake;

static const model *g_model;

static ks_err fake_submit(void *impl, const engine_params *p, void **req, ks_errbuf *eb) {
    fake *f = impl;
    *req = NULL;
    int k = sfx_prompt_number(g_model, p); // the prompt is "s<k>": the script
    if (!atomic_load(&f->online)) return admit_refuse(eb, ADMIT_OFFLINE, NULL);
    if (k < 0 || k >= S__N) return admit_refuse(eb, ADMIT_INVALID, "no script %d", k);
    fake_req *r = calloc(1, sizeof *r);
    CHECK(r);
    r->sc = &SCRIPTS[k];
    r->n_prompt = p->n_prompt;
    atomic_fetch_add(&f->n_submit, 1);
    *req = r;
    return KS_OK;
}

static fake g_fake;

static ks_err fake_next(void *req, engine_event *ev, uint32_t timeout_ms) {
    (void)timeout_ms;
    fake_req *r = req;
    if (r->next > r->sc->n_tok) {
        atomic_fetch_add(&g_fake.n_next_after_done, 1);
        return KS_ERR_CANCELLED;
    }
    memset(ev, 0, sizeof *ev);
    ev->n_prompt = r->n_prompt;
    if (r->next < r->sc->n_tok) {
        ev->token = 1 + r->next;
        ev->text[0] = (char)('A' + r->next);
        ev->text_len = 1;
    } else {
        ev->done = true;
        ev->token = -1;
        ev->state = r->sc->state;
        ev->finish = r->sc->finish;
        ev->err = r->sc->err;
        ev->reason = (uint16_t)r->sc->reason;
        if (r->sc->msg) snprintf(ev->errmsg, sizeof ev->errmsg, "%s", r->sc->msg);
        ev->n_gen = r->sc->n_tok;
    }
    r->next++;
    return KS_OK;
}

static void fake_set_notify(void *req, void (*fn)(void *), void *ctx) {
    (void)req, (void)fn, (void)ctx;  // every event is there at once: no wakeup needed
}

static void fake_cancel(void *req) {
    (void)req;
    atomic_fetch_add(&g_fake.n_cancel, 1);
}
static void fake_release(void *req) {
    atomic_fetch_add(&g_fake.n_release, 1);
    free(req);
}
static bool fake_is_online(void *impl) { return atomic_load(&((fake *)impl)->online); }
static void fake_set_online(void *impl, bool online, bool abort_running) {
    (void)abort_running;
    atomic_store(&((fake *)impl)->online, online);
    atomic_fetch_add(&((fake *)impl)->n_set_online, 1);
}
static void fake_get_stats(void *impl, engine_stats *out) {
    memset(out, 0, sizeof *out);
    out->n_rejected = 4242;
    atomic_fetch_add(&((fake *)impl)->n_stats, 1);
}
static ks_err fake_check(void *impl, uint32_t timeout_ms, ks_errbuf *eb) {
    (void)timeout_ms;
    atomic_fetch_add(&((fake *)impl)->n_check, 1);
    return ks_seterr(eb, KS_ERR_INTERNAL, "cluster: decode worker 2 not clean");
}

// ----------------------------------------------------------------------------
// A minimal HTTP client

typedef struct reply {
    int status;
    char raw[16384];  // whole response, headers included
    const char *body;
} reply;

static void http(int port, const char *method, const char *path, const char *auth, const char *body,
                 reply *out) {
    out->status = sfx_http(port, method, path, auth, body, out->raw, sizeof out->raw, &out->body);
}

static void gen(int port, int script_id, bool stream, reply *out) {
    char body[256];
    snprintf(body, sizeof body,
             "{\"model\":\"kjv\",\"prompt\":\"s%d\",\"max_tokens\":4,\"stream\":%s}", script_id,
             stream ? "true" : "false");
    http(port, "POST", "/v1/completions", NULL, body, out);
}

/* Both ways, the answer is the error JSON with this status and code. */
static void expect_error(int port, int script_id, int status, const char *code, const char *msg) {
    for (int stream = 0; stream < 2; stream++) {
        static reply r;
        gen(port, script_id, stream, &r);
        if (r.status != status) fprintf(stderr, "script %d stream %d: %s\n", script_id, stream, r.raw);
        CHECK_EQ(r.status, status);
        CHECK_STR_HAS(r.raw, "Content-Type: application/json");
        CHECK(!strstr(r.raw, "text/event-stream"));
        char want[128];
        snprintf(want, sizeof want, "\"code\":\"%s\"", code);
        CHECK_STR_HAS(r.body, want);
        CHECK_STR_HAS(r.body, msg);
        CHECK_STR_HAS(r.body, "{\"error\":{\"message\":");
    }
}

// ----------------------------------------------------------------------------
// Tests

static void test_routes(int port) {
    static reply r;
    // a normal answer, both ways
    gen(port, S_OK, false, &r);
    CHECK_EQ(r.status, 200);
    CHECK_STR_HAS(r.body, "\"text\":\"AB\"");
    CHECK_STR_HAS(r.body, "\"finish_reason\":\"length\"");
    gen(port, S_OK, true, &r);
    CHECK_EQ(r.status, 200);
    CHECK_STR_HAS(r.raw, "text/event-stream");
    CHECK_STR_HAS(r.body, "\"text\":\"A\"");
    CHECK_STR_HAS(r.body, "\"text\":\"B\"");
    CHECK_STR_HAS(r.body, "data: [DONE]");

    // rejections and remote failures before any token: mapped status
    expect_error(port, S_REJ_INVAL, 400, "invalid_parameter", "prefill: bad sampling");
    expect_error(port, S_REJ_NOSPACE, 400, "context_length_exceeded", "prefill: pool too small");
    expect_error(port, S_REJ_AGAIN, 503, "queue_full", "prefill: queue full");
    expect_error(port, S_LOST, 502, "upstream_error", "the decode worker was lost");
    expect_error(port, S_TTFT, 504, "upstream_timeout", "no first token in time");
    expect_error(port, S_REJ_PROTO, 500, "internal_error", "bad frame");

    // the engine's own failures keep their answers
    gen(port, S_QUEUE_TO, false, &r);
    CHECK_EQ(r.status, 503);
    CHECK_STR_HAS(r.body, "\"code\":\"request_aborted\"");
    CHECK_STR_HAS(r.body, "timed out waiting for KV capacity");
    gen(port, S_CANCELLED, false, &r);
    CHECK_EQ(r.status, 503);
    CHECK_STR_HAS(r.body, "\"code\":\"request_aborted\"");
    gen(port, S_CANCELLED, true, &r);  // streamed: 200, then an SSE error event
    CHECK_EQ(r.status, 200);
    CHECK_STR_HAS(r.raw, "text/event-stream");
    CHECK_STR_HAS(r.body, "data: {\"error\":");
    CHECK_STR_HAS(r.body, "\"code\":\"request_aborted\"");
    CHECK(!strstr(r.body, "[DONE]"));
    gen(port, S_INTERNAL, false, &r);
    CHECK_EQ(r.status, 500);
    CHECK_STR_HAS(r.body, "\"code\":\"internal_error\"");

    // a worker lost after a token: the stream has started, so an error event
    gen(port, S_LOST_LATE, true, &r);
    CHECK_EQ(r.status, 200);
    CHECK_STR_HAS(r.body, "\"text\":\"A\"");
    CHECK_STR_HAS(r.body, "\"code\":\"upstream_error\"");
    CHECK(!strstr(r.body, "[DONE]"));
    gen(port, S_LOST_LATE, false, &r);  // not streamed: nothing was sent yet
    CHECK_EQ(r.status, 502);
    CHECK_STR_HAS(r.body, "the decode worker was lost");

    // a submit failure as before: offline is 503 model_offline; a rejection
    // arriving with the done event while offline says so too
    atomic_store(&g_fake.online, false);
    gen(port, S_OK, false, &r);
    CHECK_EQ(r.status, 503);
    CHECK_STR_HAS(r.body, "\"code\":\"model_offline\"");
    atomic_store(&g_fake.online, true);

    // the other routes reach the backend
    http(port, "GET", "/health", NULL, NULL, &r);
    CHECK_EQ(r.status, 200);
    CHECK_STR_HAS(r.body, "\"status\":\"ok\"");
    http(port, "GET", "/metrics", NULL, NULL, &r);
    CHECK_EQ(r.status, 200);
    CHECK_STR_HAS(r.body, "outcome=\"rejected\"} 4242");
    CHECK_STR_HAS(r.body, "kvseal_rejections_total{reason=\"queue_full\"} 2");  // S_REJ_AGAIN, twice
    http(port, "GET", "/admin/kv/check", "adm1n-key-0123456789", NULL, &r);
    CHECK_EQ(r.status, 200);
    CHECK_STR_HAS(r.body, "\"clean\":false");
    CHECK_STR_HAS(r.body, "decode worker 2 not clean");
    http(port, "POST", "/admin/models/kjv/offline", "adm1n-key-0123456789", "", &r);
    CHECK_EQ(r.status, 200);
    CHECK(!atomic_load(&g_fake.online));
    http(port, "GET", "/health", NULL, NULL, &r);
    CHECK_STR_HAS(r.body, "\"status\":\"offline\"");
    http(port, "POST", "/admin/models/kjv/online", "adm1n-key-0123456789", "", &r);
    CHECK(atomic_load(&g_fake.online));
    CHECK(atomic_load(&g_fake.n_check) == 1 && atomic_load(&g_fake.n_set_online) == 2);
}

enum { CHURN_THREADS = 8, CHURN_IDLE = 400, CHURN_MS = 1500 };
static atomic_int g_churn_408, g_churn_n;
static int g_churn_port;

static int churn_connect(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_churn_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* One keep-alive connection, GET /health after GET /health for CHURN_MS:
 * every answer restamps the connection's deadline start. */
static void *churn_main(void *arg) {
    (void)arg;
    static const char req[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    char buf[4096];
    int fd = churn_connect();
    uint64_t t0 = ks_now_ns();
    while (ks_now_ns() - t0 < CHURN_MS * 1000000ull) {
        CHECK_EQ(write(fd, req, sizeof req - 1), (ssize_t)(sizeof req - 1));
        size_t got = 0;
        const char *end = NULL;
        long clen = -1;
        for (;;) { // the head, then Content-Length bytes of body
            ssize_t k = read(fd, buf + got, sizeof buf - 1 - got);
            if (k <= 0) break;
            got += (size_t)k;
            buf[got] = 0;
            if (!end && (end = strstr(buf, "\r\n\r\n"))) {
                const char *cl = strcasestr(buf, "Content-Length:");
                CHECK(cl && cl < end);
                clen = atol(cl + 15);
            }
            if (end && got >= (size_t)(end + 4 - buf) + (size_t)clen) break;
        }
        int status = 0;
        if (sscanf(buf, "HTTP/1.1 %d", &status) != 1 || status == 408 || !end) {
            atomic_fetch_add(&g_churn_408, 1);
            close(fd);
            fd = churn_connect();
        }
        atomic_fetch_add(&g_churn_n, 1);
    }
    close(fd);
    return NULL;
}

/* The sweeper's deadline check against connections whose deadline start is
 * stamped while it walks them: CHURN_IDLE idle connections make the walk
 * long, CHURN_THREADS keep-alive clients restamp theirs at every answer. No
 * answer may be a 408 or a closed connection. */
static void test_deadline_churn(int port) {
    g_churn_port = port;
    struct rlimit rl; // both ends of every connection live in this process
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < 4 * CHURN_IDLE) {
        rl.rlim_cur = rl.rlim_max < 4 * CHURN_IDLE ? rl.rlim_max : 4 * CHURN_IDLE;
        CHECK_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
    }
    int idle[CHURN_IDLE];
    for (int i = 0; i < CHURN_IDLE; i++)
        idle[i] = churn_connect();
    pthread_t th[CHURN_THREADS];
    for (int i = 0; i < CHURN_THREADS; i++)
        CHECK_EQ(pthread_create(&th[i], NULL, churn_main, NULL), 0);
    for (int i = 0; i < CHURN_THREADS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < CHURN_IDLE; i++)
        close(idle[i]);
    fprintf(stderr, "churn: %d requests, %d answered 408 or closed\n", atomic_load(&g_churn_n),
            atomic_load(&g_churn_408));
    CHECK(atomic_load(&g_churn_n) > 0);
    CHECK_EQ(atomic_load(&g_churn_408), 0);
}

/* server_drain: new generations get 503 server_shutting_down before they
 * reach the backend, and /health says draining (503). */
static void test_drain(server *s) {
    static reply r;
    int port = server_port(s);
    int submits = atomic_load(&g_fake.n_submit);
    server_drain(s);
    expect_error(port, S_OK, 503, "server_shutting_down", "shutting down");
    CHECK_EQ(atomic_load(&g_fake.n_submit), submits);
    CHECK_EQ(server_inflight(s), 0);
    http(port, "GET", "/health", NULL, NULL, &r);
    CHECK_EQ(r.status, 503);
    CHECK_STR_HAS(r.body, "\"status\":\"draining\"");
    http(port, "GET", "/metrics", NULL, NULL, &r);
    CHECK_STR_HAS(r.body, "kvseal_rejections_total{reason=\"shutting_down\"} 2");
}

int main(void) {
    model *m = kjv_model_load(false);
    if (!m) return 1;
    g_model = m;
    atomic_store(&g_fake.online, true);
    server_backend b = sfx_backend(&g_fake);
    server_opts o;
    sfx_opts(&o);
    o.admin_key = "adm1n-key-0123456789";
    o.max_connections_per_ip = 0; // test_deadline_churn's idle connections
    o.request_timeout_s = 3600;   // none of them is past a real deadline
    ks_errbuf eb;
    server *s;
    // an incomplete backend is refused
    server_backend bad = b;
    bad.next = NULL;
    CHECK_EQ(server_create_backend(&o, &bad, m, &s, &eb), KS_ERR_INVAL);
    CHECK_EQ(server_create(&o, NULL, m, &s, &eb), KS_ERR_INVAL);
    if (server_create_backend(&o, &b, m, &s, &eb) != KS_OK) {
        fprintf(stderr, "%s\n", eb.msg);
        return 1;
    }
    test_routes(server_port(s));
    test_deadline_churn(server_port(s));
    test_drain(s);
    server_destroy(s);
    // every request the backend took was released exactly once, and none
    // was pulled past its done event
    CHECK(atomic_load(&g_fake.n_submit) > 0);
    CHECK_EQ(atomic_load(&g_fake.n_release), atomic_load(&g_fake.n_submit));
    CHECK_EQ(atomic_load(&g_fake.n_next_after_done), 0);
    model_free(m);
    printf("server backend ok\n");
    return 0;
}
