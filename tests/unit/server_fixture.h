/* server_fixture.h — what the tests of the HTTP front on a scripted
 * server_backend share (test_server_backend.c, test_server_tools.c): the
 * backend table over the including test's fake_* callbacks, the options
 * its server starts from, the number a prompt names (which script the fake
 * plays), and a one-request HTTP/1.1 client over loopback. Header-only
 * (static inline); the including test defines the ten fake_* callbacks
 * declared below. */
#ifndef KS_TESTS_SERVER_FIXTURE_H
#define KS_TESTS_SERVER_FIXTURE_H

#include "../check.h"
#include "kjv_model.h"
#include "kvseal/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// The scripted backend (the including test defines these)

static ks_err fake_submit(void *impl, const engine_params *p, void **req, ks_errbuf *eb);
static ks_err fake_next(void *req, engine_event *ev, uint32_t timeout_ms);
static void fake_cancel(void *req);
static void fake_release(void *req);
static void fake_set_notify(void *req, void (*fn)(void *), void *ctx);
static bool fake_is_online(void *impl);
static void fake_set_online(void *impl, bool online, bool abort_running);
static void fake_get_stats(void *impl, engine_stats *out);
static ks_err fake_check(void *impl, uint32_t timeout_ms, ks_errbuf *eb);

/* The backend whose every entry is the fake_* callback of its name, over impl. */
static inline server_backend sfx_backend(void *impl) {
    return (server_backend){.impl = impl,
                            .submit = fake_submit,
                            .next = fake_next,
                            .cancel = fake_cancel,
                            .release = fake_release,
                            .set_notify = fake_set_notify,
                            .is_online = fake_is_online,
                            .set_online = fake_set_online,
                            .get_stats = fake_get_stats,
                            .check_quiescent = fake_check};
}

/* Defaults for a server of model "kjv" on an ephemeral port, 512-token context. */
static inline void sfx_opts(server_opts *o) {
    server_opts_default(o);
    o->port = 0;
    o->n_ctx = 512;
    o->model_name = "kjv";
}

/* The number the digits of p's prompt spell, read through m's tokenizer
 * ("t2" -> 2; no digits: 0); it names the script the fake plays. */
static inline int sfx_prompt_number(const model *m, const engine_params *p) {
    char digits[64] = {0};
    size_t len = 0;
    for (int32_t i = 0; i < p->n_prompt && len < sizeof digits - 1; i++) {
        char piece[32];
        size_t n = tok_piece(model_vocab(m), p->prompt[i], false, piece, sizeof piece);
        for (size_t k = 0; k < n && len < sizeof digits - 1; k++)
            if (piece[k] >= '0' && piece[k] <= '9') digits[len++] = piece[k];
    }
    return atoi(digits);
}

// ----------------------------------------------------------------------------
// A minimal HTTP client

/* One request (auth: a bearer key or NULL; body NULL: none) on a new
 * connection to 127.0.0.1:port; the whole answer, headers included, lands
 * NUL-terminated in raw[0..cap). Returns the status; *body points into raw
 * where the body starts. */
static inline int sfx_http(int port, const char *method, const char *path, const char *auth,
                           const char *body, char *raw, size_t cap, const char **out_body) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char req[4096];
    int n = snprintf(req, sizeof req,
                     "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s%s%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     method, path, auth ? "Authorization: Bearer " : "", auth ? auth : "",
                     auth ? "\r\n" : "", body ? strlen(body) : 0, body ? body : "");
    CHECK(n > 0 && (size_t)n < sizeof req);
    CHECK_EQ(write(fd, req, (size_t)n), n);
    size_t got = 0;
    ssize_t k;
    while ((k = read(fd, raw + got, cap - 1 - got)) > 0)
        got += (size_t)k;
    raw[got] = 0;
    close(fd);
    int status = 0;
    CHECK_EQ(sscanf(raw, "HTTP/1.1 %d", &status), 1);
    const char *b = strstr(raw, "\r\n\r\n");
    *out_body = b ? b + 4 : "";
    return status;
}

#endif
