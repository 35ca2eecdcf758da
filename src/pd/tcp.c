/* tcp.c — the pd epoll loop and the TCP transport (include/kvseal/pd.h
 * sections 2, 3 and 5).
 *
 * One loop per I/O thread (redis ae style), level-triggered epoll. A conn is
 * CONNECTING -> HANDSHAKE -> OPEN -> CLOSED; closing closes the fd at once
 * and parks the conn on a dead list, so its on_sink_fail/on_close run from the
 * loop (never inside the call that closed it) and a pending epoll event can
 * never touch freed memory. Sends try one sendmsg(header, payload...) first
 * (zero-copy when the kernel takes it all) and copy only the unsent rest into
 * the conn's output queue; above out_high_bytes, send returns KS_ERR_AGAIN
 * (a state, not a failure) and on_writable follows once the queue drains.
 * Reads go where the decoder says: the header array, then either the
 * decoder's buffer or a sink's destination (a KV page), with no copy. */
#include "pd_fault.h"
#include "pd_int.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

static const pd_transport_ops pd__tcp_ops;
static atomic_ullong pd__conn_ids = 1;

#define PD__READ_BUDGET_FRAMES 64            /* frames per conn per wakeup (fairness) */
#define PD__READ_BUDGET_BYTES (16u << 20)    /* bytes per conn per wakeup */
#define PD__OUT_IOV 64                       /* chunks per sendmsg */
/* Dead-peer detection by the kernel (docs/pd-protocol.md section 8, T_tcp):
 * a connection whose sent bytes stay unacknowledged this long, or that is
 * idle and answers no keepalive probe, fails with ETIMEDOUT. Without it a
 * silent partition (no RST, no FIN) leaves the side that only sends, e.g.
 * prefill on a data link, retransmitting for ~15 minutes (tcp_retries2),
 * its transfers and their pages held. */
#define PD__TCP_USER_TIMEOUT_MS 15000u
#define PD__TCP_KEEPIDLE_S 5
#define PD__TCP_KEEPINTVL_S 2
#define PD__TCP_KEEPCNT 5

// ----------------------------------------------------------------------------
// Test-only fault injection (KS_TEST_FAULTS)

#ifdef KS_TEST_FAULTS
enum { PD__F_NONE = 0, PD__F_DROP, PD__F_DUP, PD__F_DELAY, PD__F_TRUNC, PD__F_CORRUPT, PD__F_STALL };
#define PD__MAX_FAULTS 8
typedef struct pd__fault {
    int action;     /* PD__F_* */
    uint16_t type;  /* frame type it applies to */
    uint32_t nth;   /* 1-based occurrence, 0 = every */
    uint32_t ms;    /* delay */
    atomic_uint seen; /* frames of this type seen so far */
} pd__fault;
static pd__fault pd__faults[PD__MAX_FAULTS];
static int pd__n_faults;

ks_err pd_fault_set(const char *spec, ks_errbuf *eb) {
    pd__n_faults = 0;
    if (!spec || !*spec) return KS_OK;
    char buf[512];
    if (strlen(spec) >= sizeof buf) return ks_seterr(eb, KS_ERR_INVAL, "KS_PD_FAULT too long");
    strcpy(buf, spec);
    int n = 0;
    for (char *save = NULL, *it = strtok_r(buf, ",", &save); it; it = strtok_r(NULL, ",", &save)) {
        if (n == PD__MAX_FAULTS)
            return ks_seterr(eb, KS_ERR_INVAL, "KS_PD_FAULT: more than %d faults", PD__MAX_FAULTS);
        char act[16];
        unsigned type = 0, nth = 0, ms = 0;
        int got = sscanf(it, "%15[a-z]:%u:%u:%u", act, &type, &nth, &ms);
        pd__fault *f = &pd__faults[n];
        memset(f, 0, sizeof *f);
        f->action = !strcmp(act, "drop")      ? PD__F_DROP
                    : !strcmp(act, "dup")     ? PD__F_DUP
                    : !strcmp(act, "delay")   ? PD__F_DELAY
                    : !strcmp(act, "trunc")   ? PD__F_TRUNC
                    : !strcmp(act, "corrupt") ? PD__F_CORRUPT
                    : !strcmp(act, "stall")   ? PD__F_STALL
                                              : PD__F_NONE;
        if (got < 3 || f->action == PD__F_NONE || type > 0xffff ||
            ((f->action == PD__F_DELAY || f->action == PD__F_STALL) && got < 4))
            return ks_seterr(eb, KS_ERR_INVAL,
                             "KS_PD_FAULT: bad item \"%s\" (want ACTION:TYPE:N[:MS])", it);
        f->type = (uint16_t)type;
        f->nth = nth;
        f->ms = ms;
        n++;
    }
    pd__n_faults = n;
    ks_log(KS_LOG_WARN, "pd: TEST ONLY fault injection active: %s", spec);
    return KS_OK;
}

/* The fault to apply to this outgoing frame, if any (first match wins). */
static const pd__fault *pd__fault_pick(uint16_t type) {
    const pd__fault *hit = NULL;
    for (int i = 0; i < pd__n_faults; i++) {
        pd__fault *f = &pd__faults[i];
        if (f->type != type) continue;
        // every entry counts every frame of its type, so N means the N-th frame
        unsigned k = atomic_fetch_add_explicit(&f->seen, 1, memory_order_relaxed) + 1;
        if (!hit && (f->nth == 0 || f->nth == k)) hit = f;
    }
    return hit;
}
#endif

// ----------------------------------------------------------------------------
// Conn bookkeeping

static void pd__list_del(pd_conn **head, pd_conn *c) {
    if (c->prev) c->prev->next = c->next;
    else *head = c->next;
    if (c->next) c->next->prev = c->prev;
    c->next = c->prev = NULL;
}

static void pd__list_add(pd_conn **head, pd_conn *c) {
    c->prev = NULL;
    c->next = *head;
    if (*head) (*head)->prev = c;
    *head = c;
}

void pd__conn_update_events(pd_conn *c) {
    if (c->state == PD__CONN_CLOSED) return;
    uint32_t ev = 0;
    if (c->state == PD__CONN_CONNECTING) ev = EPOLLOUT;
    else if (c->ssl && c->state == PD__CONN_HANDSHAKE) ev = c->tls_hs_write ? EPOLLOUT : EPOLLIN;
    else {
        if (c->read_on) ev |= EPOLLIN;
        if ((c->out_bytes && !c->hold_until_ns) || pd__tls_unsent(c)) ev |= EPOLLOUT;
    }
    if (ev == c->epoll_events) return;
    struct epoll_event e = {.events = ev, .data.ptr = &c->ev};
    if (epoll_ctl(c->loop->epfd, EPOLL_CTL_MOD, c->fd, &e) != 0)
        pd__conn_fail(c, KS_ERR_IO, "epoll_ctl: %s", strerror(errno));
    else c->epoll_events = ev;
}

/* Hands a finished borrowed chunk to the loop; done() runs from the loop. */
static void pd__complete(pd_loop *l, pd__chunk *k, ks_err e) {
    k->err = e;
    k->next = l->completed;
    l->completed = k;
}

static void pd__conn_free_out(pd_conn *c) {
    for (pd__chunk *k = c->out_head, *nx; k; k = nx) {
        nx = k->next;
        if (k->done) pd__complete(c->loop, k, c->close_why ? c->close_why : KS_ERR_CANCELLED);
        else free(k);
    }
    c->out_head = c->out_tail = NULL;
    c->out_bytes = 0;
    free(c->spare);
    c->spare = NULL;
}

/* Runs due completions of borrowed sends (in completion order). */
static void pd__run_completed(pd_loop *l) {
    while (l->completed) {
        // reverse into FIFO order
        pd__chunk *rev = NULL;
        for (pd__chunk *k = l->completed, *nx; k; k = nx) {
            nx = k->next;
            k->next = rev;
            rev = k;
        }
        l->completed = NULL;
        for (pd__chunk *k = rev, *nx; k; k = nx) {
            nx = k->next;
            k->done(k->arg, k->err);
            free(k);
        }
    }
}

/* Frees a sent chunk, keeping the largest big one for reuse. */
static void pd__chunk_done(pd_conn *c, pd__chunk *k) {
    if (k->done) return pd__complete(c->loop, k, KS_OK);
    if (k->cap >= (64u << 10) && (!c->spare || c->spare->cap < k->cap)) {
        free(c->spare);
        c->spare = k;
    } else {
        free(k);
    }
}

void pd__conn_fail(pd_conn *c, ks_err why, const char *fmt, ...) {
    if (c->state == PD__CONN_CLOSED) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->close_msg, sizeof c->close_msg, fmt, ap);
    va_end(ap);
    c->close_why = why;
    ks_log(why == KS_ERR_CANCELLED ? KS_LOG_DEBUG : KS_LOG_WARN,
           "pd: conn #%llu %s closed (%s): %s", (unsigned long long)c->id, c->peer,
           ks_err_name(why), c->close_msg);
    if (why == KS_ERR_PROTO) c->loop->stats.proto_errors++;
    epoll_ctl(c->loop->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    pd__conn_free_out(c);
    if (c->cork) c->cork->frames = c->cork->n_iov = 0, c->cork->bytes = 0;
    c->state = PD__CONN_CLOSED;
    pd__list_del(&c->loop->conns, c);
    pd__list_add(&c->loop->dead, c);
}

/* Runs the deferred callbacks of closed conns and frees them. */
static void pd__reap(pd_loop *l) {
    while (l->dead) {
        pd_conn *c = l->dead;
        pd__list_del(&l->dead, c);
        if (c->sink_live) {
            l->stats.sink_failures++;
            if (c->cbs.on_sink_fail) c->cbs.on_sink_fail(c, c->ud, &c->sink_hdr, c->close_why);
        }
        if (c->user_knows && c->cbs.on_close)
            c->cbs.on_close(c, c->ud, c->close_why, c->close_msg);
        pd__dec_free(&c->dec);
        pd__tls_free(c);
        free(c->cork);
        free(c);
    }
}

static void pd__fmt_addr(const struct sockaddr *sa, socklen_t sl, char *out, size_t cap) {
    char h[64], s[8];
    if (getnameinfo(sa, sl, h, sizeof h, s, sizeof s, NI_NUMERICHOST | NI_NUMERICSERV) == 0)
        snprintf(out, cap, "%s:%s", h, s);
    else snprintf(out, cap, "?");
}

/* Per-connection socket options: no Nagle delay, and the kernel's
 * dead-peer timeouts above (best effort: a failure leaves the defaults). */
static void pd__sock_opts(int fd) {
    int one = 1, idle = PD__TCP_KEEPIDLE_S, intvl = PD__TCP_KEEPINTVL_S, cnt = PD__TCP_KEEPCNT;
    unsigned int uto = PD__TCP_USER_TIMEOUT_MS;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof uto);
}

static ks_err pd__conn_new(pd_loop *l, int fd, bool initiator, const pd_conn_cbs *cbs, void *ud,
                           pd_conn **out, ks_errbuf *eb) {
    pd_conn *c = pd__alloc_aligned(sizeof *c);  // its decoder's XXH3 state wants 64 bytes
    if (!c) return ks_seterr(eb, KS_ERR_NOMEM, "pd: no memory for a connection");
    c->ev.kind = PD__EV_CONN;
    c->ops = &pd__tcp_ops;
    c->loop = l;
    if (cbs) c->cbs = *cbs;
    c->ud = ud;
    c->id = atomic_fetch_add_explicit(&pd__conn_ids, 1, memory_order_relaxed);
    c->fd = fd;
    c->initiator = initiator;
    c->read_on = true;
    c->state = initiator ? PD__CONN_CONNECTING : PD__CONN_HANDSHAKE;
    pd__dec_init(&c->dec, PD_MAX_PAYLOAD_UNAUTH);
    pd__sock_opts(fd);
    c->epoll_events = initiator ? EPOLLOUT : EPOLLIN;
    struct epoll_event e = {.events = c->epoll_events, .data.ptr = &c->ev};
    if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &e) != 0) {
        ks_err r = ks_seterr(eb, KS_ERR_IO, "pd: epoll_ctl add: %s", strerror(errno));
        free(c);
        return r;
    }
    pd__list_add(&l->conns, c);
    *out = c;
    return KS_OK;
}

// ----------------------------------------------------------------------------
// Output

/* Appends the bytes of iov[0..n) after the first `skip` to the queue: copied,
 * or (done != NULL) iov[0] (the header) copied and iov[1..n) referenced. */
static ks_err pd__queue(pd_conn *c, const struct iovec *iov, int n, size_t skip,
                        void (*done)(void *, ks_err), void *arg, ks_errbuf *eb) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += iov[i].iov_len;
    if (skip >= total && !done) return KS_OK;
    size_t need = done ? PD_HDR_BYTES : total - skip;
    pd__chunk *k;
    if (!done && c->spare && c->spare->cap >= need) {
        k = c->spare;
        c->spare = NULL;
    } else {
        k = malloc(sizeof *k + need);
        if (!k) return ks_seterr(eb, KS_ERR_NOMEM, "pd: no memory to queue %zu bytes", need);
        k->cap = need;
    }
    k->next = NULL;
    k->iov_i = 0;
    k->iov_off = 0;
    k->done = done;
    k->arg = arg;
    k->err = KS_OK;
    k->n_iov = 0;
    size_t w = 0;
    for (int i = 0; i < n; i++) {
        size_t len = iov[i].iov_len;
        const uint8_t *p = iov[i].iov_base;
        if (skip >= len) {
            skip -= len;
            continue;
        }
        if (!done || i == 0) {
            memcpy(k->data + w, p + skip, len - skip);
            w += len - skip;
        } else {
            k->iov[k->n_iov].iov_base = (void *)(p + skip);
            k->iov[k->n_iov].iov_len = len - skip;
            k->n_iov++;
        }
        skip = 0;
    }
    if (!done || w) {  // the copied bytes go first
        memmove(k->iov + 1, k->iov, (size_t)k->n_iov * sizeof *k->iov);
        k->iov[0].iov_base = k->data;
        k->iov[0].iov_len = w;
        k->n_iov++;
    }
    size_t qlen = 0;
    for (int i = 0; i < k->n_iov; i++) qlen += k->iov[i].iov_len;
    if (qlen == 0) {  // borrowed and already fully sent: only the completion is due
        pd__complete(c->loop, k, KS_OK);
        return KS_OK;
    }
    if (c->out_tail) c->out_tail->next = k;
    else c->out_head = k;
    c->out_tail = k;
    c->out_bytes += qlen;
    return KS_OK;
}

static void pd__fail_errno(pd_conn *c, const char *what) {
    int e = errno;
    pd__conn_fail(c, (e == EPIPE || e == ECONNRESET) ? KS_ERR_PEER_CLOSED : KS_ERR_IO, "%s: %s",
                  what, strerror(e));
}

ssize_t pd__sock_sendv(pd_conn *c, const struct iovec *iov, int n) {
    struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
    for (;;) {
        ssize_t r = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r >= 0) return r;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        pd__fail_errno(c, "send");
        return -1;
    }
}

/* Sends through TLS, or straight to the socket. Returns bytes taken, 0 when
 * the socket is full, -1 after failing c. */
static ssize_t pd__sendv(pd_conn *c, const struct iovec *iov, int n) {
    ssize_t r = c->ssl ? pd__tls_writev(c, iov, n) : pd__sock_sendv(c, iov, n);
    if (r > 0) c->loop->stats.writes++;
    return r;
}

/* Writes as much queued output as the socket takes. */
static void pd__flush(pd_conn *c) {
    if (pd__tls_unsent(c) && pd__tls_push(c) < 0) return;
    while (c->out_head && c->state != PD__CONN_CLOSED && !c->hold_until_ns) {
        struct iovec iov[PD__OUT_IOV];
        int n = 0;
        for (pd__chunk *k = c->out_head; k && n < PD__OUT_IOV; k = k->next) {
            for (int i = k->iov_i; i < k->n_iov && n < PD__OUT_IOV; i++) {
                size_t off = i == k->iov_i ? k->iov_off : 0;
                iov[n].iov_base = (uint8_t *)k->iov[i].iov_base + off;
                iov[n].iov_len = k->iov[i].iov_len - off;
                n++;
            }
        }
#ifdef KS_TEST_FAULTS
        if (c->stall_at) {  // a stall fault: send nothing past its point
            size_t room = c->stall_at;
            for (int i = 0; i < n; i++) {
                if (iov[i].iov_len >= room) {
                    iov[i].iov_len = room;
                    n = i + 1;
                    break;
                }
                room -= iov[i].iov_len;
            }
        }
#endif
        ssize_t r = pd__sendv(c, iov, n);
        if (r < 0) return;
        if (r == 0) break;
#ifdef KS_TEST_FAULTS
        if (c->stall_at && (c->stall_at -= (size_t)r) == 0) {  // reached: hold the rest
            c->hold_until_ns = ks_now_ns() + (uint64_t)c->stall_ms * 1000000u;
            c->stalled = true;
            ks_log(KS_LOG_WARN,
                   "pd: TEST ONLY stall: frame cut mid-payload until a frame comes in (at most %u ms)",
                   c->stall_ms);
        }
#endif
        c->loop->stats.bytes_out += (uint64_t)r;
        c->out_bytes -= (size_t)r;
        size_t left = (size_t)r;
        while (c->out_head) {
            pd__chunk *k = c->out_head;
            while (k->iov_i < k->n_iov) {
                size_t room = k->iov[k->iov_i].iov_len - k->iov_off;
                if (left < room) {
                    k->iov_off += left;
                    left = 0;
                    break;
                }
                left -= room;
                k->iov_i++;
                k->iov_off = 0;
            }
            if (k->iov_i < k->n_iov) break;
            c->out_head = k->next;
            if (!c->out_head) c->out_tail = NULL;
            pd__chunk_done(c, k);
        }
        KS_ASSERT(left == 0);
    }
    if (c->state == PD__CONN_CLOSED) return;
    if (!c->out_head && !pd__tls_unsent(c) && c->state == PD__CONN_DRAINING)
        return pd__conn_fail(c, c->drain_why, "%s", c->drain_msg);
    pd__conn_update_events(c);
    if (c->want_writable && c->out_bytes <= c->loop->cfg.out_low_bytes &&
        c->state == PD__CONN_OPEN) {
        c->want_writable = false;
        if (c->cbs.on_writable) c->cbs.on_writable(c, c->ud);
    }
}

/* Sends the corked frames in one sendmsg; the socket's refusal is copied
 * into the queue. Errors: the close reason when c failed. */
static ks_err pd__cork_flush(pd_conn *c, ks_errbuf *eb) {
    pd__cork *k = c->cork;
    if (!k || !k->n_iov) return KS_OK;
    ssize_t r = pd__sendv(c, k->iov, k->n_iov);
    size_t total = k->bytes;
    int n = k->n_iov;
    k->frames = k->n_iov = 0;
    k->bytes = 0;
    if (r < 0) return ks_seterr(eb, c->close_why, "pd: %s", c->close_msg);
    c->loop->stats.bytes_out += (uint64_t)r;
    if ((size_t)r < total) {
        ks_err e = pd__queue(c, k->iov, n, (size_t)r, NULL, NULL, eb);
        if (e) return e;
    }
    pd__conn_update_events(c);
    return KS_OK;
}

/* True when a frame of n_iov payload iovecs joins the cork (else the cork,
 * if any, must leave first). */
static bool pd__cork_takes(const pd_conn *c, int n_iov, bool borrowed) {
    const pd__cork *k = c->cork;
    return c->corked && k && !borrowed && k->frames < PD__CORK_FRAMES &&
           k->n_iov + 1 + n_iov <= PD__CORK_IOV;
}

/* Sends header + payload: directly if nothing is queued, else queued (copied,
 * or referenced when done != NULL); while corked, held for one sendmsg. */
static ks_err pd__emit(pd_conn *c, const uint8_t hdr[PD_HDR_BYTES], const struct iovec *payload,
                       int n_iov, void (*done)(void *, ks_err), void *arg, ks_errbuf *eb) {
    bool direct = !c->out_head && !c->hold_until_ns && c->state != PD__CONN_CONNECTING &&
                  !(c->ssl && c->state == PD__CONN_HANDSHAKE);
    if (direct && c->corked && c->cork && !pd__cork_takes(c, n_iov, done != NULL)) {
        ks_err e = pd__cork_flush(c, eb); // full, or a frame that cannot wait: in order
        if (e) return e;
        direct = !c->out_head;
    }
    if (direct && pd__cork_takes(c, n_iov, done != NULL)) {
        pd__cork *k = c->cork;
        uint8_t *head = k->head[k->frames];
        size_t used = PD_HDR_BYTES;
        memcpy(head, hdr, PD_HDR_BYTES);
        k->iov[k->n_iov++] = (struct iovec){.iov_base = head, .iov_len = PD_HDR_BYTES};
        for (int i = 0; i < n_iov; i++) {
            size_t len = payload[i].iov_len;
            struct iovec *last = &k->iov[k->n_iov - 1];
            if (!len) continue;
            k->bytes += len;
            if (len <= PD__CORK_HEAD - used && last->iov_base == head) { // small: copied
                memcpy(head + used, payload[i].iov_base, len);
                used += len;
                last->iov_len += len;
                continue;
            }
            k->iov[k->n_iov++] = payload[i];
        }
        k->bytes += PD_HDR_BYTES;
        k->frames++;
        return KS_OK;
    }
    if (c->cork && c->cork->n_iov) {  // queued output came first: the cork leaves now
        ks_err e = pd__cork_flush(c, eb);
        if (e) return e;
        direct = direct && !c->out_head;
    }
    struct iovec iov[PD_MAX_IOV + 1];
    iov[0].iov_base = (void *)hdr;
    iov[0].iov_len = PD_HDR_BYTES;
    size_t total = PD_HDR_BYTES;
    for (int i = 0; i < n_iov; i++) {
        iov[1 + i] = payload[i];
        total += payload[i].iov_len;
    }
    size_t sent = 0;
    if (direct) {
        ssize_t r = pd__sendv(c, iov, 1 + n_iov);
        if (r < 0) return ks_seterr(eb, c->close_why, "pd: %s", c->close_msg);
        sent = (size_t)r;
        c->loop->stats.bytes_out += sent;
    }
    if (sent < total || done) {
        ks_err e = pd__queue(c, iov, 1 + n_iov, sent, done, arg, eb);
        if (e) return e;
    }
    // TLS may have taken the whole frame yet left ciphertext the socket
    // refused: EPOLLOUT must be armed for it too (else the frame's tail
    // waits for the next send; seen as a hung transfer under load)
    pd__conn_update_events(c);
    return KS_OK;
}

ks_err pd__conn_send_raw(pd_conn *c, uint16_t type, uint64_t req_id, const struct iovec *payload,
                         int n_iov, void (*done)(void *, ks_err), void *arg, ks_errbuf *eb) {
    if (c->state == PD__CONN_CLOSED || c->state == PD__CONN_DRAINING)
        return ks_seterr(eb, KS_ERR_PEER_CLOSED, "pd: conn #%llu is closing: %s",
                         (unsigned long long)c->id, c->close_msg);
    uint8_t hdr[PD_HDR_BYTES];
    ks_err e = pd_frame_encode_hdr(hdr, type, req_id, payload, n_iov, c->loop->cfg.max_payload, eb);
    if (e) return e;
    if (type >= PD_TYPE_FIRST_PROTO) c->loop->stats.frames_out++;
#ifdef KS_TEST_FAULTS
    const pd__fault *f = pd__fault_pick(type);
    if (f && (e = pd__cork_flush(c, eb)) != KS_OK) return e;  // in order, before the fault
    if (f) {
        uint32_t len = pd_load_u32(hdr + 16);
        ks_log(KS_LOG_WARN, "pd: TEST ONLY fault %d on frame type %u req %llu", f->action, type,
               (unsigned long long)req_id);
        switch (f->action) {
        case PD__F_DROP:
            if (done) return pd__queue(c, NULL, 0, 0, done, arg, eb); // completes
            return KS_OK;
        case PD__F_DUP:
            e = pd__emit(c, hdr, payload, n_iov, NULL, NULL, eb);
            if (e) return e;
            break;
        case PD__F_DELAY:
            c->hold_until_ns = ks_now_ns() + (uint64_t)f->ms * 1000000u;
            if (!c->hold_until_ns) c->hold_until_ns = 1;
            pd__conn_update_events(c);
            break;
        case PD__F_TRUNC: {
            struct iovec iov[PD_MAX_IOV + 1];
            iov[0].iov_base = hdr;
            iov[0].iov_len = PD_HDR_BYTES;
            memcpy(iov + 1, payload, (size_t)n_iov * sizeof *iov);
            // queue the whole frame, then cut the queue to header + len/2
            e = pd__queue(c, iov, 1 + n_iov, 0, NULL, NULL, eb);
            if (e) return e;
            size_t cut = len - len / 2;
            c->out_tail->iov[0].iov_len -= cut;
            c->out_bytes -= cut;
            if (done) {
                e = pd__queue(c, NULL, 0, 0, done, arg, eb); // completes now
                if (e) return e;
            }
            c->state = PD__CONN_DRAINING;
            c->drain_why = KS_ERR_IO;
            snprintf(c->drain_msg, sizeof c->drain_msg,
                     "TEST ONLY fault: frame truncated, connection closed");
            pd__conn_update_events(c);
            return KS_OK;
        }
        case PD__F_STALL: {  // header + half the payload now, the rest MS later
            struct iovec iov[PD_MAX_IOV + 1];
            iov[0].iov_base = hdr;
            iov[0].iov_len = PD_HDR_BYTES;
            memcpy(iov + 1, payload, (size_t)n_iov * sizeof *iov);
            size_t before = c->out_bytes;
            e = pd__queue(c, iov, 1 + n_iov, 0, NULL, NULL, eb);
            if (!e && done) e = pd__queue(c, NULL, 0, 0, done, arg, eb);
            if (e) return e;
            c->stall_at = before + PD_HDR_BYTES + len / 2;
            c->stall_ms = f->ms;
            pd__flush(c);
            return KS_OK;
        }
        case PD__F_CORRUPT: {
            if (!len) break;
            uint8_t *tmp = malloc(len);
            if (!tmp) return ks_seterr(eb, KS_ERR_NOMEM, "pd: fault corrupt: no memory");
            size_t w = 0;
            for (int i = 0; i < n_iov; i++) {
                memcpy(tmp + w, payload[i].iov_base, payload[i].iov_len);
                w += payload[i].iov_len;
            }
            tmp[len / 2] ^= 0x5a;
            struct iovec one = {tmp, len};
            e = pd__emit(c, hdr, &one, 1, NULL, NULL, eb);
            free(tmp);
            if (!e && done) e = pd__queue(c, NULL, 0, 0, done, arg, eb);
            return e;
        }
        default: break;
        }
    }
#endif
    return pd__emit(c, hdr, payload, n_iov, done, arg, eb);
}

// ----------------------------------------------------------------------------
// Input

/* Checks a protocol frame's type and len against cbs.type_max. */
static bool pd__type_ok(pd_conn *c, const pd_frame_hdr *h) {
    if (!c->cbs.type_max) return true;
    uint32_t max = h->type < c->cbs.n_types ? c->cbs.type_max[h->type] : PD_TYPE_FORBIDDEN;
    if (max == PD_TYPE_FORBIDDEN) {
        pd__conn_fail(c, KS_ERR_PROTO, "frame type %u not allowed on this connection", h->type);
        return false;
    }
    if (h->len > max) {
        pd__conn_fail(c, KS_ERR_PROTO, "frame type %u: oversize payload %u bytes (max %u)",
                      h->type, h->len, max);
        return false;
    }
    return true;
}

/* A valid header (or header + sink prefix) arrived with len > 0: choose where
 * the payload goes. */
static void pd__on_header(pd_conn *c) {
    pd_decoder *d = &c->dec;
    const pd_frame_hdr *h = &d->cur;
    ks_errbuf eb;
    if (c->state == PD__CONN_HANDSHAKE) {
        if (h->type != PD_TYPE_HELLO && h->type != PD_TYPE_AUTH) {
            c->loop->stats.auth_failures++;
            return pd__conn_fail(c, KS_ERR_PROTO,
                                 "auth failed: frame type %u before authentication", h->type);
        }
    } else if (h->type < PD_TYPE_FIRST_PROTO) {
        return pd__conn_fail(c, KS_ERR_PROTO, "handshake frame type %u after authentication",
                             h->type);
    } else if (d->pay_have == 0 && !pd__type_ok(c, h)) {
        return;
    } else if (c->cbs.sink) {
        uint32_t pre = c->cbs.sink_prefix < 256 ? c->cbs.sink_prefix : 256;
        if (d->pay_have == 0 && pre > 0) {
            if (h->len <= pre) goto buffer;  // small frames are simply buffered
            if (pd__dec_read_prefix(d, pre, &eb)) pd__conn_fail(c, eb.code, "%s", eb.msg);
            return;
        }
        struct iovec iov[PD_MAX_IOV];
        int n = 0;
        ks_err e = c->cbs.sink(c, c->ud, h, d->pay_have ? d->buf : NULL, d->pay_have, iov, &n);
        if (c->state == PD__CONN_CLOSED) return;
        if (e)
            return pd__conn_fail(c, e, "sink refused frame type %u req %llu (%u bytes)", h->type,
                                 (unsigned long long)h->req_id, h->len);
        if (n > 0) {
            uint64_t sum = 0;
            for (int i = 0; i < n && i < PD_MAX_IOV; i++) sum += iov[i].iov_len;
            if (n > PD_MAX_IOV || sum != h->len - d->pay_have)
                return pd__conn_fail(c, KS_ERR_INTERNAL,
                                     "sink gave %d iovecs / %llu bytes for %u payload bytes", n,
                                     (unsigned long long)sum, h->len - d->pay_have);
            pd__dec_use_sink(d, iov, n);
            c->sink_hdr = *h;
            c->sink_live = true;
            return;
        }
    }
buffer:
    if (pd__dec_use_buffer(d, &eb)) pd__conn_fail(c, eb.code, "%s", eb.msg);
}

static void pd__dispatch(pd_conn *c, const pd_frame *f) {
    if (c->state == PD__CONN_HANDSHAKE) return pd__auth_on_frame(c, f);
    if (f->hdr.type < PD_TYPE_FIRST_PROTO)
        return pd__conn_fail(c, KS_ERR_PROTO, "handshake frame type %u after authentication",
                             f->hdr.type);
    if (f->hdr.len == 0 && !pd__type_ok(c, &f->hdr)) return; // len > 0 was checked on the header
    c->loop->stats.frames_in++;
#ifdef KS_TEST_FAULTS
    if (c->stalled) {  // the peer spoke (e.g. an ABORT): the rest of the cut frame goes now
        c->stalled = false;
        c->hold_until_ns = 1;
        ks_log(KS_LOG_WARN, "pd: TEST ONLY stall: released by an incoming frame (type %u)",
               f->hdr.type);
    }
#endif
    if (c->cbs.on_frame) c->cbs.on_frame(c, c->ud, f);
}

/* Bytes read ahead that the decoder has not taken yet. */
static uint32_t pd__ahead(const pd_conn *c) { return c->rx_ahead_len - c->rx_ahead_off; }

/* How many bytes to read ahead behind the decoder's destination: behind a
 * payload the next frame's header and the prefix a sink reads before it
 * names a page, behind a header only that prefix, behind a prefix nothing.
 * So a stream of sunk frames costs one read each, and no byte of a sunk
 * payload is ever copied (read ahead only as far as the frame's prefix). */
static size_t pd__ahead_room(const pd_conn *c) {
    uint32_t pre = !c->cbs.sink ? 0 : c->cbs.sink_prefix < 256 ? c->cbs.sink_prefix : 256;
    if (c->dec.state == PD__DEC_HDR) return pre;
    return c->dec.in_prefix ? 0 : PD_HDR_BYTES + pre;
}

/* Copies read-ahead bytes into iov[0..n); returns how many. */
static size_t pd__take_ahead(pd_conn *c, const struct iovec *iov, int n) {
    size_t took = 0;
    for (int i = 0; i < n && pd__ahead(c); i++) {
        size_t k = iov[i].iov_len < pd__ahead(c) ? iov[i].iov_len : pd__ahead(c);
        memcpy(iov[i].iov_base, c->rx_ahead + c->rx_ahead_off, k);
        c->rx_ahead_off += (uint32_t)k;
        took += k;
    }
    if (!pd__ahead(c)) c->rx_ahead_len = c->rx_ahead_off = 0;
    return took;
}

static void pd__on_readable(pd_conn *c) {
    if (c->ssl && c->state == PD__CONN_HANDSHAKE) return pd__tls_handshake(c);
    int frames = 0;
    size_t bytes = 0;
    while ((c->state == PD__CONN_HANDSHAKE || c->state == PD__CONN_OPEN ||
            c->state == PD__CONN_DRAINING) &&
           c->read_on && frames < PD__READ_BUDGET_FRAMES && bytes < PD__READ_BUDGET_BYTES) {
        struct iovec iov[PD_MAX_IOV + 1];
        int n = pd__dec_want(&c->dec, iov, PD_MAX_IOV);
        KS_ASSERT(n >= 1);
        ssize_t r;
        if (pd__ahead(c)) {
            r = (ssize_t)pd__take_ahead(c, iov, n);
        } else {
            size_t want = 0;
            for (int i = 0; i < n; i++) want += iov[i].iov_len;
            iov[n].iov_base = c->rx_ahead;
            iov[n].iov_len = c->ssl ? 0 : pd__ahead_room(c); // records read their own ahead
            if (iov[n].iov_len) n++;
            if (c->ssl) {
                r = pd__tls_readv(c, iov, n);
                if (r == -2) return;
            } else {
                do r = readv(c->fd, iov, n);
                while (r < 0 && errno == EINTR);
            }
            if (r < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK) return;
                return pd__fail_errno(c, "recv");
            }
            if (r == 0) {
                bool mid = c->dec.state != PD__DEC_HDR || c->dec.hdr_have;
                return pd__conn_fail(c, KS_ERR_PEER_CLOSED, "peer closed the connection%s%s",
                                     mid ? " mid-frame" : "",
                                     c->state == PD__CONN_HANDSHAKE ? " during the handshake" : "");
            }
            bytes += (size_t)r;
            if (!c->ssl) c->loop->stats.reads++;  // the records count their own syscalls
            c->loop->stats.bytes_in += (uint64_t)r;
            if ((size_t)r > want) {  // the rest went ahead: the decoder takes it next
                c->rx_ahead_len = (uint32_t)((size_t)r - want);
                c->rx_ahead_off = 0;
                r = (ssize_t)want;
            }
        }
        pd_frame f;
        ks_errbuf eb;
        ks_err e = pd__dec_advance(&c->dec, (size_t)r, &f, &eb);
        if (e == KS_ERR_AGAIN) {
            if (c->dec.state == PD__DEC_NEED_DEST) pd__on_header(c);
            continue;
        }
        if (e) return pd__conn_fail(c, e, "%s", eb.msg); // sink_live stays set: on_sink_fail
        if (f.sunk) c->sink_live = false;
        frames++;
        pd__dispatch(c, &f);
    }
}

/* Starts the TLS handshake, or the plaintext HELLO/AUTH one. */
static void pd__handshake_start(pd_conn *c) {
    if (c->loop->ssl_ctx) pd__tls_start(c);
    else pd__auth_start(c);
}

void pd__conn_open(pd_conn *c) {
    c->state = PD__CONN_OPEN;
    c->deadline_ns = 0;
    c->dec.max_payload = c->loop->cfg.max_payload;
    c->user_knows = true;
    pd__conn_update_events(c);
    ks_log(KS_LOG_DEBUG, "pd: conn #%llu %s authenticated (peer role %u)",
           (unsigned long long)c->id, c->peer, c->peer_role);
    if (c->cbs.on_open) c->cbs.on_open(c, c->ud);
}

static void pd__on_connected(pd_conn *c) {
    int err = 0;
    socklen_t sl = sizeof err;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &sl) != 0) err = errno;
    if (err) return pd__conn_fail(c, KS_ERR_IO, "connect to %s: %s", c->peer, strerror(err));
    c->state = PD__CONN_HANDSHAKE;
    c->deadline_ns = ks_now_ns() + (uint64_t)c->loop->cfg.auth_timeout_ms * 1000000u;
    pd__conn_update_events(c);
    pd__handshake_start(c);
}

// ----------------------------------------------------------------------------
// TCP vtable and the transport-neutral conn API

static ks_err pd__tcp_send_frame(pd_conn *c, uint16_t type, uint64_t req_id,
                                 const struct iovec *payload, int n_iov,
                                 void (*done)(void *arg, ks_err e), void *arg, ks_errbuf *eb) {
    if (c->state == PD__CONN_CLOSED || c->state == PD__CONN_DRAINING)
        return ks_seterr(eb, KS_ERR_PEER_CLOSED, "pd: conn #%llu is closing: %s",
                         (unsigned long long)c->id, c->close_msg);
    if (c->state != PD__CONN_OPEN)
        return ks_seterr(eb, KS_ERR_INVAL, "pd: conn #%llu is not open yet",
                         (unsigned long long)c->id);
    if (type < PD_TYPE_FIRST_PROTO)
        return ks_seterr(eb, KS_ERR_INVAL, "pd: frame type %u is reserved for the handshake", type);
    if (c->out_bytes && c->out_bytes >= c->loop->cfg.out_high_bytes) {
        c->want_writable = true;
        return ks_seterr(eb, KS_ERR_AGAIN, "pd: conn #%llu output queue full (%zu bytes)",
                         (unsigned long long)c->id, c->out_bytes);
    }
    return pd__conn_send_raw(c, type, req_id, payload, n_iov, done, arg, eb);
}

static size_t pd__tcp_out_pending(const pd_conn *c) {
    return c->out_bytes + pd__tls_unsent(c) + (c->cork ? c->cork->bytes : 0);
}

static void pd__tcp_cork(pd_conn *c, bool on) {
    if (on && !c->cork && c->state != PD__CONN_CLOSED) c->cork = calloc(1, sizeof *c->cork);
    c->corked = on && c->cork;  // no memory: frames simply go one by one
}

static ks_err pd__tcp_uncork(pd_conn *c, ks_errbuf *eb) {
    c->corked = false;
    if (c->state == PD__CONN_CLOSED) return KS_OK;
    return pd__cork_flush(c, eb);
}

static void pd__tcp_set_read(pd_conn *c, bool on) {
    c->read_on = on;
    pd__conn_update_events(c);
}

static void pd__tcp_close(pd_conn *c, ks_err why, const char *msg, bool flush) {
    if (flush && c->state == PD__CONN_OPEN && pd__tcp_uncork(c, NULL) != KS_OK) return;
    if (!flush || (!c->out_head && !pd__tls_unsent(c)) || c->state != PD__CONN_OPEN) {
        pd__conn_fail(c, why, "%s", msg);
        return;
    }
    c->state = PD__CONN_DRAINING;
    c->drain_why = why;
    snprintf(c->drain_msg, sizeof c->drain_msg, "%s", msg);
    c->read_on = false;
    pd__conn_update_events(c);
}

static const pd_transport_ops pd__tcp_ops = {
    .name = "tcp",
    .send_frame = pd__tcp_send_frame,
    .out_pending = pd__tcp_out_pending,
    .set_read = pd__tcp_set_read,
    .close = pd__tcp_close,
    .cork = pd__tcp_cork,
    .uncork = pd__tcp_uncork,
};

ks_err pd_conn_send(pd_conn *c, uint16_t type, uint64_t req_id, const struct iovec *payload,
                    int n_iov, ks_errbuf *eb) {
    return c->ops->send_frame(c, type, req_id, payload, n_iov, NULL, NULL, eb);
}
ks_err pd_conn_send_borrowed(pd_conn *c, uint16_t type, uint64_t req_id,
                             const struct iovec *payload, int n_iov,
                             void (*done)(void *arg, ks_err e), void *arg, ks_errbuf *eb) {
    KS_ASSERT(done != NULL);
    return c->ops->send_frame(c, type, req_id, payload, n_iov, done, arg, eb);
}
size_t pd_conn_out_pending(const pd_conn *c) { return c->ops->out_pending(c); }
void pd_conn_cork(pd_conn *c) {
    if (c->ops->cork) c->ops->cork(c, true);
}
ks_err pd_conn_uncork(pd_conn *c, ks_errbuf *eb) {
    if (!c->ops->cork) return KS_OK;
    c->ops->cork(c, false);
    return c->ops->uncork(c, eb);
}
void pd_conn_set_read(pd_conn *c, bool on) { c->ops->set_read(c, on); }
void pd_conn_close(pd_conn *c) {
    c->ops->close(c, KS_ERR_CANCELLED, "closed by the local side", false);
}
void pd_conn_close_flush(pd_conn *c) {
    c->ops->close(c, KS_ERR_CANCELLED, "closed by the local side after flushing", true);
}
uint8_t pd_conn_peer_role(const pd_conn *c) { return c->peer_role; }
uint64_t pd_conn_id(const pd_conn *c) { return c->id; }
const char *pd_conn_peer_addr(const pd_conn *c) { return c->peer; }
void *pd_conn_ud(const pd_conn *c) { return c->ud; }
void pd_conn_set_ud(pd_conn *c, void *ud) { c->ud = ud; }
const pd_transport_ops *pd_conn_ops(const pd_conn *c) { return c->ops; }

// ----------------------------------------------------------------------------
// Listen, accept, connect

static void pd__on_accept(pd_listener *ls) {
    pd_loop *l = ls->loop;
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(ls->fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                ks_log(KS_LOG_WARN, "pd: accept on port %u: %s", ls->port, strerror(errno));
            return;
        }
        pd_conn *c;
        ks_errbuf eb;
        if (pd__conn_new(l, fd, false, &ls->cbs, ls->ud, &c, &eb)) {
            ks_log(KS_LOG_WARN, "pd: accept: %s", eb.msg);
            close(fd);
            continue;
        }
        pd__fmt_addr((struct sockaddr *)&ss, sl, c->peer, sizeof c->peer);
        c->deadline_ns = ks_now_ns() + (uint64_t)l->cfg.auth_timeout_ms * 1000000u;
        pd__handshake_start(c);
    }
}

ks_err pd_tcp_listen(pd_loop *l, const char *host, uint16_t port, const pd_conn_cbs *cbs,
                     void *ud, pd_listener **out, ks_errbuf *eb) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV};
    char ps[8];
    snprintf(ps, sizeof ps, "%u", port);
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(host ? host : "0.0.0.0", ps, &hints, &ai);
    if (g) return ks_seterr(eb, KS_ERR_INVAL, "pd listen: bad address %s: %s", host, gai_strerror(g));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        return ks_seterr(eb, KS_ERR_IO, "pd listen: socket: %s", strerror(errno));
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
        ks_err e = ks_seterr(eb, KS_ERR_IO, "pd listen on %s:%u: %s", host ? host : "*", port,
                             strerror(errno));
        freeaddrinfo(ai);
        close(fd);
        return e;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    pd_listener *ls = calloc(1, sizeof *ls);
    if (!ls) {
        close(fd);
        return ks_seterr(eb, KS_ERR_NOMEM, "pd listen: no memory");
    }
    ls->ev.kind = PD__EV_LISTENER;
    ls->loop = l;
    ls->fd = fd;
    ls->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    if (cbs) ls->cbs = *cbs;
    ls->ud = ud;
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = &ls->ev};
    if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &e) != 0) {
        close(fd);
        free(ls);
        return ks_seterr(eb, KS_ERR_IO, "pd listen: epoll_ctl: %s", strerror(errno));
    }
    ls->next = l->listeners;
    if (l->listeners) l->listeners->prev = ls;
    l->listeners = ls;
    *out = ls;
    return KS_OK;
}

uint16_t pd_listener_port(const pd_listener *ls) { return ls->port; }

void pd_listener_close(pd_listener *ls) {
    if (!ls) return;
    pd_loop *l = ls->loop;
    epoll_ctl(l->epfd, EPOLL_CTL_DEL, ls->fd, NULL);
    close(ls->fd);
    ls->fd = -1;
    // Unlink now; free at the end of this loop iteration (an event for it may
    // still be in the current epoll batch).
    if (ls->prev) ls->prev->next = ls->next;
    else l->listeners = ls->next;
    if (ls->next) ls->next->prev = ls->prev;
    ls->ev.kind = 0;
    ls->next = NULL;
    ls->prev = NULL;
    // reuse prev as the dead-list link
    ls->prev = (pd_listener *)l->dead_listeners;
    l->dead_listeners = ls;
}

ks_err pd_tcp_connect(pd_loop *l, const char *host, uint16_t port, int timeout_ms,
                      const pd_conn_cbs *cbs, void *ud, pd_conn **out, ks_errbuf *eb) {
    uint32_t pr = cbs ? cbs->peer_roles : 0;
    if (l->ssl_ctx && (pr & (pr - 1)))
        return ks_seterr(eb, KS_ERR_INVAL,
                         "pd connect: a TLS connect names exactly one peer role (peer_roles 0x%x)",
                         pr);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    char ps[8];
    snprintf(ps, sizeof ps, "%u", port);
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g) return ks_seterr(eb, KS_ERR_INVAL, "pd connect: bad address %s: %s", host, gai_strerror(g));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        return ks_seterr(eb, KS_ERR_IO, "pd connect: socket: %s", strerror(errno));
    }
    int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (r != 0 && errno != EINPROGRESS && errno != EINTR) {
        ks_err e = ks_seterr(eb, KS_ERR_IO, "pd connect to %s:%u: %s", host, port, strerror(errno));
        freeaddrinfo(ai);
        close(fd);
        return e;
    }
    pd_conn *c;
    ks_err e = pd__conn_new(l, fd, true, cbs, ud, &c, eb);
    if (e) {
        freeaddrinfo(ai);
        close(fd);
        return e;
    }
    pd__fmt_addr(ai->ai_addr, ai->ai_addrlen, c->peer, sizeof c->peer);
    freeaddrinfo(ai);
    c->user_knows = true;
    // TLS: the server's role selects the PSK (0: a peer of our own role)
    c->peer_role = pr ? (uint8_t)__builtin_ctz(pr) : l->cfg.role;
    c->deadline_ns = ks_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 5000) * 1000000u;
    *out = c;
    return KS_OK;
}

// ----------------------------------------------------------------------------
// The loop

ks_err pd_loop_create(const pd_loop_cfg *cfg, pd_loop **out, ks_errbuf *eb) {
    if (!cfg || !cfg->secret || cfg->secret_len < 16)
        return ks_seterr(eb, KS_ERR_INVAL, "pd loop: a cluster secret of >= 16 bytes is required");
    if (sodium_init() < 0) return ks_seterr(eb, KS_ERR_INTERNAL, "pd loop: sodium_init failed");
#ifdef KS_TEST_FAULTS
    const char *spec = getenv("KS_PD_FAULT");
    if (spec && *spec) {
        ks_err fe = pd_fault_set(spec, eb);
        if (fe) return fe;
    }
#endif
    pd_loop *l = calloc(1, sizeof *l);
    if (!l) return ks_seterr(eb, KS_ERR_NOMEM, "pd loop: no memory");
    l->epfd = l->evfd = -1;
    l->cfg = *cfg;
    if (!l->cfg.max_payload) l->cfg.max_payload = PD_MAX_PAYLOAD_DEFAULT;
    if (!l->cfg.auth_timeout_ms) l->cfg.auth_timeout_ms = 5000;
    if (!l->cfg.out_high_bytes) l->cfg.out_high_bytes = 16u << 20;
    if (!l->cfg.out_low_bytes) l->cfg.out_low_bytes = l->cfg.out_high_bytes / 4;
    l->secret_copy = malloc(cfg->secret_len);
    if (!l->secret_copy) goto nomem;
    memcpy(l->secret_copy, cfg->secret, cfg->secret_len);
    l->cfg.secret = l->secret_copy;
    pthread_mutex_init(&l->post_mu, NULL);
    if (!cfg->insecure_plaintext) {
        ks_err te = pd__tls_ctx_create(l, eb);
        if (te) {
            pd_loop_destroy(l);
            return te;
        }
    }
    atomic_init(&l->stop, false);
    l->wake_ev.kind = PD__EV_WAKE;
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (l->epfd < 0) goto io;
    l->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (l->evfd < 0) goto io;
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = &l->wake_ev};
    if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->evfd, &e) != 0) goto io;
    *out = l;
    return KS_OK;
io:;
    ks_err r = ks_seterr(eb, KS_ERR_IO, "pd loop: %s", strerror(errno));
    pd_loop_destroy(l);
    return r;
nomem:
    pd_loop_destroy(l);
    return ks_seterr(eb, KS_ERR_NOMEM, "pd loop: no memory");
}

static void pd__reap_listeners(pd_loop *l) {
    while (l->dead_listeners) {
        pd_listener *ls = l->dead_listeners;
        l->dead_listeners = (pd_listener *)ls->prev;
        free(ls);
    }
}

void pd_loop_destroy(pd_loop *l) {
    if (!l) return;
    while (l->conns) pd__conn_fail(l->conns, KS_ERR_CANCELLED, "loop destroyed");
    pd__run_completed(l);
    pd__reap(l);
    while (l->listeners) pd_listener_close(l->listeners);
    pd__reap_listeners(l);
    for (pd__post *p = l->post_head, *nx; p; p = nx) {
        nx = p->next;
        free(p);
    }
    if (l->secret_copy) {
        sodium_memzero(l->secret_copy, l->cfg.secret_len);
        free(l->secret_copy);
        pthread_mutex_destroy(&l->post_mu);
    }
    pd__tls_ctx_free(l);
    if (l->evfd >= 0) close(l->evfd);
    if (l->epfd >= 0) close(l->epfd);
    free(l);
}

static void pd__run_posts(pd_loop *l) {
    pthread_mutex_lock(&l->post_mu);
    pd__post *p = l->post_head;
    l->post_head = l->post_tail = NULL;
    pthread_mutex_unlock(&l->post_mu);
    while (p) {
        pd__post *nx = p->next;
        p->fn(p->arg);
        free(p);
        p = nx;
    }
}

/* Fails conns past their connect/handshake deadline, releases fault holds;
 * returns ms until the next deadline (-1: none). */
static int pd__deadlines(pd_loop *l) {
    uint64_t now = ks_now_ns(), next = 0;
    for (pd_conn *c = l->conns, *nx; c; c = nx) {
        nx = c->next;
        if (c->deadline_ns && now >= c->deadline_ns) {
            if (c->state == PD__CONN_CONNECTING) {
                pd__conn_fail(c, KS_ERR_TIMEOUT, "connect to %s timed out", c->peer);
            } else {
                l->stats.auth_failures++;
                pd__conn_fail(c, KS_ERR_TIMEOUT, "auth failed: handshake timed out after %u ms",
                              l->cfg.auth_timeout_ms);
            }
            continue;
        }
        if (c->hold_until_ns && now >= c->hold_until_ns) {
            c->hold_until_ns = 0;
            pd__flush(c);
            if (c->state == PD__CONN_CLOSED) continue;
        }
        uint64_t d[2] = {c->deadline_ns, c->hold_until_ns};
        for (int i = 0; i < 2; i++)
            if (d[i] && (!next || d[i] < next)) next = d[i];
    }
    if (!next) return -1;
    uint64_t ms = (next - now + 999999u) / 1000000u;
    return ms > 60000 ? 60000 : (int)ms;
}

ks_err pd_loop_run_once(pd_loop *l, int timeout_ms) {
    pd__run_completed(l);
    pd__reap(l);
    int dl = pd__deadlines(l);
    pthread_mutex_lock(&l->post_mu);
    bool posted = l->post_head != NULL;
    pthread_mutex_unlock(&l->post_mu);
    if (posted || l->dead || l->completed) timeout_ms = 0;
    // input read ahead, or already inside OpenSSL: epoll will not report it
    for (pd_conn *c = l->conns, *nx; c; c = nx) {  // a cork never outlives its caller's turn
        nx = c->next;
        if (c->cork && c->cork->n_iov) {
            c->corked = false;
            (void)pd__cork_flush(c, NULL);
        }
    }
    pd_conn *pend[64];
    int n_pend = 0;
    for (pd_conn *c = l->conns; c && n_pend < 64; c = c->next)
        if (c->read_on && c->state != PD__CONN_CONNECTING && (pd__ahead(c) || pd__tls_pending(c)))
            pend[n_pend++] = c;
    if (n_pend) timeout_ms = 0;
    if (dl >= 0 && (timeout_ms < 0 || dl < timeout_ms)) timeout_ms = dl;
    struct epoll_event evs[64];
    int n = epoll_wait(l->epfd, evs, 64, timeout_ms);
    if (n < 0) {
        if (errno == EINTR) return KS_OK;
        return KS_ERR_IO;
    }
    for (int i = 0; i < n; i++) {
        pd__ev *ev = evs[i].data.ptr;
        uint32_t e = evs[i].events;
        if (ev->kind == PD__EV_WAKE) {
            uint64_t v;
            while (read(l->evfd, &v, sizeof v) < 0 && errno == EINTR) {}
        } else if (ev->kind == PD__EV_LISTENER) {
            pd__on_accept((pd_listener *)ev);
        } else if (ev->kind == PD__EV_CONN) {
            pd_conn *c = (pd_conn *)ev;
            if (c->state == PD__CONN_CLOSED) continue;
            if (c->state == PD__CONN_CONNECTING) {
                if (e & (EPOLLOUT | EPOLLERR | EPOLLHUP)) pd__on_connected(c);
                continue;
            }
            if (c->ssl && c->state == PD__CONN_HANDSHAKE) {
                pd__tls_handshake(c);
                continue;
            }
            if (e & EPOLLOUT) pd__flush(c);
            if ((e & (EPOLLIN | EPOLLHUP | EPOLLERR)) && c->state != PD__CONN_CLOSED) {
                if (c->read_on) pd__on_readable(c);
                else if (e & (EPOLLERR | EPOLLHUP)) // always reported: don't spin on it
                    pd__conn_fail(c, KS_ERR_PEER_CLOSED, "peer hung up while reading was paused");
            }
        }
    }
    // closed conns stay allocated (dead list) until the reap below
    for (int i = 0; i < n_pend; i++)
        if (pend[i]->state != PD__CONN_CLOSED && pend[i]->read_on) pd__on_readable(pend[i]);
    pd__run_posts(l);
    pd__run_completed(l);
    pd__reap(l);
    pd__reap_listeners(l);
    return KS_OK;
}

ks_err pd_loop_run(pd_loop *l) {
    while (!atomic_load_explicit(&l->stop, memory_order_acquire)) {
        ks_err e = pd_loop_run_once(l, -1);
        if (e) return e;
    }
    atomic_store_explicit(&l->stop, false, memory_order_release);
    return KS_OK;
}

static void pd__wake(pd_loop *l) {
    uint64_t one = 1;
    while (write(l->evfd, &one, sizeof one) < 0 && errno == EINTR) {}
}

void pd_loop_stop(pd_loop *l) {
    atomic_store_explicit(&l->stop, true, memory_order_release);
    pd__wake(l);
}

ks_err pd_loop_post(pd_loop *l, void (*fn)(void *arg), void *arg) {
    pd__post *p = malloc(sizeof *p);
    if (!p) return KS_ERR_NOMEM;
    p->next = NULL;
    p->fn = fn;
    p->arg = arg;
    pthread_mutex_lock(&l->post_mu);
    if (l->post_tail) l->post_tail->next = p;
    else l->post_head = p;
    l->post_tail = p;
    pthread_mutex_unlock(&l->post_mu);
    pd__wake(l);
    return KS_OK;
}

void pd_loop_stats_get(const pd_loop *l, pd_loop_stats *out) { *out = l->stats; }
