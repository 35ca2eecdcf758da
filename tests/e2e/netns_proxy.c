/* netns_proxy.c — TEST ONLY: a userspace TCP proxy that stands between a
 * prefill worker and a decode worker's data port (tests/e2e/
 * test_netns_proxy.sh), for the faults tc cannot make on these machines
 * (netem is absent): latency, connections cut, a middlebox that swallows.
 *
 * Usage: netns_proxy LISTEN_HOST PORT TARGET_HOST TARGET_PORT DELAY_MS
 * Listens on LISTEN_HOST:PORT, prints "proxy listening", and relays every
 * connection to TARGET_HOST:TARGET_PORT, each chunk held DELAY_MS in each
 * direction (latency, not a rate cap: chunks leave in order once due).
 * Commands, by signal:
 *   SIGUSR1  cut mid-stream: once bytes are flowing toward the target (at
 *            least NP_CUT_QUEUED bytes queued there: a KV transfer), the
 *            proxy forwards part of them (NP_CUT_PART bytes, ignoring the
 *            delay) and then resets every open connection on both sides
 *            (RST), so the target is cut in the middle of what it receives
 *   SIGUSR2  toggle the black hole: while on, every byte read from either
 *            side is discarded and nothing is forwarded, but the
 *            connections stay open and new ones are accepted (the peers'
 *            kernels see their bytes acknowledged: only the application's
 *            own timers can tell); off again, connections opened meanwhile
 *            are cut (their streams lost bytes)
 * Each command prints a line ("proxy: cut N", "proxy: black hole on|off").
 * A close on one side is passed to the other once its queue has drained. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define NP_MAX_PAIRS 64
#define NP_CHUNK 65536
#define NP_QUEUE_MAX (4u << 20) /* stop reading a side while its queue holds more */
#define NP_CUT_QUEUED 32768u
#define NP_CUT_PART 20000u

typedef struct np_chunk {
    struct np_chunk *next;
    uint64_t due_ms;
    size_t len, off;
    char data[];
} np_chunk;

/* One direction: bytes read from fd `from`, queued for fd `to`. */
typedef struct np_dir {
    np_chunk *head, *tail;
    size_t queued;
    int eof; /* `from` closed: shut `to` down once the queue is empty */
} np_dir;

typedef struct np_pair {
    int fd[2];     /* 0: the accepted side, 1: the target side */
    np_dir dir[2]; /* dir[i]: from fd[i] to fd[1 - i] */
    int tainted;   /* opened or fed while the black hole was on */
} np_pair;

static np_pair np_pairs[NP_MAX_PAIRS];
static volatile sig_atomic_t np_cut_req, np_hole_req;

static uint64_t np_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void np_on_usr1(int sig) { (void)sig; np_cut_req = 1; }
static void np_on_usr2(int sig) { (void)sig; np_hole_req = 1; }

static void np_dir_clear(np_dir *d) {
    while (d->head) {
        np_chunk *c = d->head;
        d->head = c->next;
        free(c);
    }
    d->tail = NULL;
    d->queued = 0;
    d->eof = 0;
}

/* Closes a pair; with reset, both sides get an RST instead of a FIN. */
static void np_close(np_pair *p, int reset) {
    for (int i = 0; i < 2; i++) {
        if (p->fd[i] < 0) continue;
        if (reset) {
            struct linger lg = {.l_onoff = 1, .l_linger = 0};
            setsockopt(p->fd[i], SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        }
        close(p->fd[i]);
        p->fd[i] = -1;
        np_dir_clear(&p->dir[i]);
    }
}

static int np_resolve(const char *host, const char *port, struct sockaddr_storage *ss, socklen_t *sl) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, port, &hints, &ai) != 0 || !ai) return -1;
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *sl = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: netns_proxy LISTEN_HOST PORT TARGET_HOST TARGET_PORT DELAY_MS\n");
        return 2;
    }
    uint64_t delay = (uint64_t)strtoull(argv[5], NULL, 10);
    struct sockaddr_storage la, ta;
    socklen_t lsl, tsl;
    if (np_resolve(argv[1], argv[2], &la, &lsl) || np_resolve(argv[3], argv[4], &ta, &tsl)) {
        fprintf(stderr, "netns_proxy: cannot resolve the addresses\n");
        return 1;
    }
    int lfd = socket(la.ss_family, SOCK_STREAM, 0), one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&la, lsl) != 0 || listen(lfd, 16) != 0) {
        fprintf(stderr, "netns_proxy: listen on %s:%s: %s\n", argv[1], argv[2], strerror(errno));
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = np_on_usr1};
    sigaction(SIGUSR1, &sa, NULL);
    sa.sa_handler = np_on_usr2;
    sigaction(SIGUSR2, &sa, NULL);
    for (int i = 0; i < NP_MAX_PAIRS; i++) np_pairs[i].fd[0] = np_pairs[i].fd[1] = -1;
    int hole = 0;
    printf("proxy listening on %s:%s -> %s:%s, delay %llu ms\n", argv[1], argv[2], argv[3], argv[4],
           (unsigned long long)delay);
    fflush(stdout);
    for (;;) {
        for (int i = 0; np_cut_req && i < NP_MAX_PAIRS; i++) {
            np_pair *p = &np_pairs[i];
            if (p->fd[0] < 0 || p->dir[0].queued < NP_CUT_QUEUED) continue;
            size_t part = 0;  // forward a part of the flow, then reset everything
            while (p->dir[0].head && part < NP_CUT_PART) {
                np_chunk *c = p->dir[0].head;
                size_t want = c->len - c->off < NP_CUT_PART - part ? c->len - c->off : NP_CUT_PART - part;
                ssize_t n = write(p->fd[1], c->data + c->off, want);
                if (n <= 0) break;
                part += (size_t)n;
                c->off += (size_t)n;
                p->dir[0].queued -= (size_t)n;
                if (c->off < c->len) continue;
                p->dir[0].head = c->next;
                if (!p->dir[0].head) p->dir[0].tail = NULL;
                free(c);
            }
            int n = 0;
            for (int j = 0; j < NP_MAX_PAIRS; j++)
                if (np_pairs[j].fd[0] >= 0) np_close(&np_pairs[j], 1), n++;
            np_cut_req = 0;
            printf("proxy: cut %d mid-stream (%zu bytes forwarded first)\n", n, part);
            fflush(stdout);
        }
        if (np_hole_req) {
            np_hole_req = 0;
            hole = !hole;
            if (!hole)  // streams that lost bytes cannot go on
                for (int i = 0; i < NP_MAX_PAIRS; i++)
                    if (np_pairs[i].fd[0] >= 0 && np_pairs[i].tainted) np_close(&np_pairs[i], 1);
            printf("proxy: black hole %s\n", hole ? "on" : "off");
            fflush(stdout);
        }
        struct pollfd pf[1 + 2 * NP_MAX_PAIRS];
        int np = 0;
        pf[np++] = (struct pollfd){.fd = lfd, .events = POLLIN};
        uint64_t now = np_now_ms(), next = now + 1000;
        for (int i = 0; i < NP_MAX_PAIRS; i++) {
            np_pair *p = &np_pairs[i];
            for (int s = 0; s < 2; s++) {
                short ev = 0;
                if (p->fd[s] >= 0) {
                    np_dir *in = &p->dir[s], *out = &p->dir[1 - s];
                    if (!in->eof && in->queued < NP_QUEUE_MAX) ev |= POLLIN;
                    if (out->head && out->head->due_ms <= now) ev |= POLLOUT;
                    if (out->head && out->head->due_ms > now && out->head->due_ms < next)
                        next = out->head->due_ms;
                }
                pf[np++] = (struct pollfd){.fd = p->fd[s], .events = ev};
            }
        }
        int r = poll(pf, (nfds_t)np, (int)(next - now));
        if (r < 0 && errno != EINTR) return 1;
        if (r <= 0) continue;
        if (pf[0].revents & POLLIN) {
            int cfd = accept(lfd, NULL, NULL), slot = -1;
            for (int i = 0; i < NP_MAX_PAIRS && cfd >= 0; i++)
                if (np_pairs[i].fd[0] < 0) { slot = i; break; }
            int tfd = cfd >= 0 && slot >= 0 ? socket(ta.ss_family, SOCK_STREAM, 0) : -1;
            if (tfd >= 0 && connect(tfd, (struct sockaddr *)&ta, tsl) == 0) {
                np_pair *p = &np_pairs[slot];
                p->fd[0] = cfd, p->fd[1] = tfd, p->tainted = hole;
                for (int s = 0; s < 2; s++) {
                    fcntl(p->fd[s], F_SETFL, fcntl(p->fd[s], F_GETFL) | O_NONBLOCK);
                    setsockopt(p->fd[s], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                }
            } else {
                if (tfd >= 0) close(tfd);
                if (cfd >= 0) close(cfd);
            }
            continue;  // the poll set changed
        }
        now = np_now_ms();
        for (int i = 0; i < NP_MAX_PAIRS; i++) {
            np_pair *p = &np_pairs[i];
            for (int s = 0; s < 2 && p->fd[0] >= 0; s++) {
                short re = pf[1 + 2 * i + s].revents;
                np_dir *in = &p->dir[s], *out = &p->dir[1 - s];
                if (re & (POLLIN | POLLHUP | POLLERR)) {
                    np_chunk *c = malloc(sizeof *c + NP_CHUNK);
                    ssize_t n = c ? read(p->fd[s], c->data, NP_CHUNK) : -1;
                    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
                        free(c);
                    } else if (n < 0) {
                        free(c);
                        np_close(p, 1);  // reset: pass it on
                        break;
                    } else if (n == 0) {
                        free(c);
                        in->eof = 1;
                    } else if (hole) {
                        free(c);
                        p->tainted = 1;
                    } else {
                        c->next = NULL, c->len = (size_t)n, c->off = 0, c->due_ms = now + delay;
                        if (in->tail) in->tail->next = c;
                        else in->head = c;
                        in->tail = c;
                        in->queued += (size_t)n;
                    }
                }
                // deliver what is due from the other side to this one
                while (out->head && out->head->due_ms <= now) {
                    np_chunk *c = out->head;
                    ssize_t n = write(p->fd[s], c->data + c->off, c->len - c->off);
                    if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
                    if (n < 0) { np_close(p, 1); break; }
                    c->off += (size_t)n;
                    out->queued -= (size_t)n;
                    if (c->off < c->len) break;
                    out->head = c->next;
                    if (!out->head) out->tail = NULL;
                    free(c);
                }
            }
            if (p->fd[0] < 0) continue;
            for (int s = 0; s < 2; s++)  // a side closed and its bytes delivered: pass the close on
                if (p->dir[s].eof && !p->dir[s].head) {
                    np_close(p, 0);
                    break;
                }
        }
    }
}
