/* rawc.c — a raw HTTP/1.1 test client for the end-to-end tests: it does what
 * curl will not, so that a test can construct a scenario whose outcome does
 * not depend on timing.
 *
 *   rawc [options] PORT < REQUEST
 *
 * Sends REQUEST (the exact bytes, from stdin) to 127.0.0.1:PORT, then reads
 * the answer to EOF and writes it, once complete, to stdout (or -o FILE):
 * the status line and headers, a blank line, then the body with any
 * chunked transfer coding removed. Options:
 *   --rcvbuf N         SO_RCVBUF before connect (small: the server's writes
 *                      block as soon as this client stops reading)
 *   --pause-after STR  stop reading once STR has arrived (the rest stays in
 *                      the socket buffers; the server sees a stalled reader)
 *   --ready FILE       create FILE once paused (the test waits for it)
 *   --resume-on FILE   while paused, wait for FILE to exist, then read on to
 *                      EOF (without it: stay paused until killed)
 *   --half-close       shutdown(SHUT_WR) after sending the request
 *   --trickle-ms N     send one byte every N ms (a slow client)
 *   --conns N          open N connections at once, all doing the same
 *                      (only with --trickle-ms); prints how they ended:
 *                      "408 A, closed B, other C" (a 408 answer, closed
 *                      with no answer, any other answer)
 *   -o FILE            write the answer to FILE
 *   --body-only        write only the (decoded) body
 *   rawc --free-port   prints a loopback TCP port that was free a moment ago
 * Exit status: 0 on EOF after the answer, 1 on a connect or I/O error, 2 on
 * bad usage. Killing it (SIGKILL) while paused closes its socket with unread
 * data, which the kernel turns into a reset: a client that vanished. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define RAWC_MAX_CONNS 4096

static void rawc__sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int rawc__connect(int port, int rcvbuf) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    if (rcvbuf > 0) (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int rawc__write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static char *rawc__read_stdin(size_t *len) {
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    for (;;) {
        if (!b) return NULL;
        ssize_t r = read(0, b + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return free(b), NULL;
        if (r == 0) break;
        n += (size_t)r;
        if (n == cap) b = realloc(b, cap *= 2);
    }
    *len = n;
    return b;
}

/* Trickles req into n connections, one byte per connection every ms; a
 * connection ends when the server answers or closes it. Returns when all
 * have ended, having printed how. */
static int rawc__trickle(int port, int n, int ms, const char *req, size_t len) {
    static int fds[RAWC_MAX_CONNS];
    int n408 = 0, nclosed = 0, nother = 0;
    for (int i = 0; i < n; i++) {
        fds[i] = rawc__connect(port, 0);
        if (fds[i] < 0) return fprintf(stderr, "rawc: connect %d: %s\n", i, strerror(errno)), 1;
    }
    int open_n = n;
    for (size_t off = 0; open_n > 0; off++) {
        for (int i = 0; i < n; i++) {
            if (fds[i] < 0) continue;
            struct pollfd p = {.fd = fds[i], .events = POLLIN};
            bool ended = poll(&p, 1, 0) > 0;
            if (ended) {  // an answer or EOF (or a reset)
                char buf[64] = {0};
                ssize_t r = recv(fds[i], buf, sizeof buf - 1, 0);
                if (r <= 0) nclosed++;
                else if (!strncmp(buf, "HTTP/1.1 408", 12)) n408++;
                else nother++;
            } else if (off < len && send(fds[i], req + off, 1, MSG_NOSIGNAL) != 1) {
                ended = true;
                nclosed++;
            }
            if (ended) {
                close(fds[i]);
                fds[i] = -1;
                open_n--;
            }
        }
        rawc__sleep_ms(ms);
    }
    printf("408 %d, closed %d, other %d\n", n408, nclosed, nother);
    return 0;
}

static int rawc__free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t n = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &n) != 0)
        return fprintf(stderr, "rawc: --free-port: %s\n", strerror(errno)), 1;
    printf("%d\n", ntohs(a.sin_port));
    close(fd);
    return 0;
}

/* Writes head, blank line, body; a chunked body is decoded (1xx interim
 * answers before the final one are kept in the head). */
static void rawc__write_answer(FILE *o, const char *a, size_t n, bool body_only) {
    const char *end = NULL, *head = a;
    for (;;) {  // skip to the final answer's head
        end = memmem(head, n - (size_t)(head - a), "\r\n\r\n", 4);
        if (!end || strncmp(head, "HTTP/1.1 1", 10) != 0) break;
        head = end + 4;
    }
    if (!end) {
        fwrite(a, 1, n, o);
        return;
    }
    if (!body_only) fwrite(a, 1, (size_t)(end - a) + 4, o);
    const char *p = end + 4, *lim = a + n;
    bool chunked = false;
    for (const char *h = head; h < end; h++)
        if (!strncasecmp(h, "\ntransfer-encoding: chunked", 27)) chunked = true;
    if (!chunked) {
        fwrite(p, 1, (size_t)(lim - p), o);
        return;
    }
    while (p < lim) {
        char *e;
        unsigned long len = strtoul(p, &e, 16);
        const char *nl = memmem(p, (size_t)(lim - p), "\r\n", 2);
        if (!nl || e == p || len == 0) break;
        p = nl + 2;
        if ((size_t)(lim - p) < len) len = (unsigned long)(lim - p);
        fwrite(p, 1, len, o);
        p += len + 2;
    }
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--free-port")) return rawc__free_port();
    int rcvbuf = 0, trickle = 0, conns = 1, port = 0;
    bool half = false, body_only = false;
    const char *pause = NULL, *ready = NULL, *resume = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool more = i + 1 < argc;
        if (!strcmp(a, "--rcvbuf") && more) rcvbuf = atoi(argv[++i]);
        else if (!strcmp(a, "--pause-after") && more) pause = argv[++i];
        else if (!strcmp(a, "--ready") && more) ready = argv[++i];
        else if (!strcmp(a, "--resume-on") && more) resume = argv[++i];
        else if (!strcmp(a, "--half-close")) half = true;
        else if (!strcmp(a, "--body-only")) body_only = true;
        else if (!strcmp(a, "--trickle-ms") && more) trickle = atoi(argv[++i]);
        else if (!strcmp(a, "--conns") && more) conns = atoi(argv[++i]);
        else if (!strcmp(a, "-o") && more) out = argv[++i];
        else if (a[0] != '-' && !port) port = atoi(a);
        else return fprintf(stderr, "rawc: bad argument '%s'\n", a), 2;
    }
    if (port <= 0 || conns < 1 || conns > RAWC_MAX_CONNS || (conns > 1 && !trickle))
        return fprintf(stderr, "usage: rawc [options] PORT < REQUEST (see rawc.c)\n"), 2;
    size_t len = 0;
    char *req = rawc__read_stdin(&len);
    if (!req) return fprintf(stderr, "rawc: cannot read the request\n"), 1;
    if (trickle) {
        int rc = rawc__trickle(port, conns, trickle, req, len);
        free(req);
        return rc;
    }

    int fd = rawc__connect(port, rcvbuf);
    if (fd < 0 || rawc__write_all(fd, req, len) != 0) {
        fprintf(stderr, "rawc: %s: %s\n", fd < 0 ? "connect" : "send", strerror(errno));
        free(req);
        return 1;
    }
    free(req);
    if (half) shutdown(fd, SHUT_WR);
    // everything received (answers here are small)
    size_t cap = 1 << 16, got = 0;
    char *all = malloc(cap + 1);
    bool paused = false, failed = false;
    char buf[4096];
    for (;;) {
        ssize_t r = recv(fd, buf, pause && !paused ? 1 : sizeof buf, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) fprintf(stderr, "rawc: recv: %s\n", strerror(errno)), failed = true;
        if (r <= 0) break;
        while (got + (size_t)r > cap) all = realloc(all, (cap *= 2) + 1);
        memcpy(all + got, buf, (size_t)r);
        got += (size_t)r;
        all[got] = 0;
        if (!pause || paused || !strstr(all, pause)) continue;
        paused = true;
        if (ready) close(open(ready, O_WRONLY | O_CREAT | O_TRUNC, 0644));
        struct stat st;
        while (!resume || stat(resume, &st) != 0) rawc__sleep_ms(10);
    }
    if (pause && !paused) fprintf(stderr, "rawc: EOF before '%s'\n", pause);
    FILE *o = out ? fopen(out, "wb") : stdout;
    if (o) rawc__write_answer(o, all, got, body_only);
    else fprintf(stderr, "rawc: %s: %s\n", out, strerror(errno)), failed = true;
    if (o && o != stdout) fclose(o);
    free(all);
    close(fd);
    return failed || (pause && !paused) ? 1 : 0;
}
