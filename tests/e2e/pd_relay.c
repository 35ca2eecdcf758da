/* pd_relay.c — TEST ONLY: a fake router without the cluster secret that
 * relays a real prefill worker's connection to a real decode worker's data
 * port (issue 8, section 1; run by tests/e2e/test_cluster_relay.sh).
 *
 * Usage: pd_relay DECODE_PORT VICTIM_PREFILL_ID VICTIM_ROUTER_ID (hex, the
 * router identity the victim's LINK names: wire version 3)
 * Listens on 127.0.0.1 (port printed as "relay port N"), accepts one
 * connection (a prefill worker that takes us for its router), connects to
 * the decode worker's data port on 127.0.0.1 and then:
 *  - if the prefill worker speaks the KVPD v1 HELLO/AUTH handshake, splices
 *    the two handshakes (decode's nonce goes to the prefill worker inside a
 *    HELLO claiming the router role; the prefill worker's AUTH goes to
 *    decode), then sends LINK for VICTIM_PREFILL_ID on the link it gained;
 *  - else (TLS), relays bytes blindly both ways: all an attacker without the
 *    secret can do.
 * Prints one result line: "RELAY: link up epoch E" (the attack worked),
 * "RELAY: decode refused" or "RELAY: closed", then holds the connections
 * until killed, so the test can check that the live link is untouched. */
#include "kvseal/pd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int rl_read_full(int fd, uint8_t *p, size_t n) {
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int rl_write_full(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Reads one frame (header + payload up to 64 bytes) into buf; returns the
 * total length or -1. */
static int rl_read_frame(int fd, uint8_t *buf, size_t cap, uint16_t *type) {
    if (rl_read_full(fd, buf, PD_HDR_BYTES)) return -1;
    uint32_t len = pd_load_u32(buf + 16);
    if (PD_HDR_BYTES + len > cap) return -1;
    if (rl_read_full(fd, buf + PD_HDR_BYTES, len)) return -1;
    *type = pd_load_u16(buf + 6);
    return (int)(PD_HDR_BYTES + len);
}

static int rl_send_frame(int fd, uint16_t type, const uint8_t *payload, uint32_t len) {
    uint8_t buf[128];
    size_t n = 0;
    if (pd_frame_encode(buf, sizeof buf, type, 0, payload, len, 1024, &n, NULL) != KS_OK) return -1;
    return rl_write_full(fd, buf, n);
}

static void rl_hold(void) {
    fflush(stdout);
    for (;;) pause();
}

/* Copies bytes both ways until one side closes. */
static void rl_blind(int a, int b, const uint8_t *first, size_t n_first) {
    if (rl_write_full(b, first, n_first)) {
        printf("RELAY: closed\n");
        rl_hold();
    }
    struct pollfd p[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
    uint8_t buf[65536];
    for (;;) {
        if (poll(p, 2, -1) < 0) continue;
        for (int i = 0; i < 2; i++) {
            if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t r = read(p[i].fd, buf, sizeof buf);
            if (r <= 0 || rl_write_full(p[1 - i].fd, buf, (size_t)r)) {
                printf("RELAY: closed by %s\n", i ? "decode" : "prefill");
                rl_hold();
            }
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: pd_relay DECODE_PORT VICTIM_PREFILL_ID VICTIM_ROUTER_ID_HEX\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    int dport = atoi(argv[1]);
    uint32_t victim = (uint32_t)strtoul(argv[2], NULL, 10);
    uint64_t victim_router = (uint64_t)strtoull(argv[3], NULL, 16);
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 4) ||
        getsockname(ls, (struct sockaddr *)&a, &al)) {
        perror("pd_relay: listen");
        return 1;
    }
    printf("relay port %u\n", ntohs(a.sin_port));
    int p = accept(ls, NULL, NULL);
    int d = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in da = {.sin_family = AF_INET, .sin_port = htons((uint16_t)dport),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (p < 0 || d < 0 || connect(d, (struct sockaddr *)&da, sizeof da)) {
        perror("pd_relay: accept/connect");
        return 1;
    }
    uint8_t ph[128];
    if (rl_read_full(p, ph, PD_HDR_BYTES)) {
        printf("RELAY: closed\n");
        rl_hold();
    }
    if (pd_load_u32(ph) != PD_MAGIC || pd_load_u16(ph + 6) != PD_TYPE_HELLO) {
        printf("relay: not a KVPD v1 HELLO: relaying blindly\n");
        rl_blind(p, d, ph, PD_HDR_BYTES);
    }
    // KVPD v1: splice the two handshakes
    uint32_t plen = pd_load_u32(ph + 16);
    uint16_t t;
    uint8_t dh[128], pa[128], da_[128];
    if (plen != 36 || rl_read_full(p, ph + PD_HDR_BYTES, plen) ||
        rl_write_full(d, ph, PD_HDR_BYTES + plen) ||      // prefill's HELLO -> decode
        rl_read_frame(d, dh, sizeof dh, &t) < 0 || t != PD_TYPE_HELLO) {
        printf("RELAY: decode refused\n");
        rl_hold();
    }
    uint8_t hello[36];
    memcpy(hello, dh + PD_HDR_BYTES, 36);
    hello[0] = 1;  // claim the router role towards the prefill worker
    if (rl_send_frame(p, PD_TYPE_HELLO, hello, 36) ||
        rl_read_frame(p, pa, sizeof pa, &t) < 0 || t != PD_TYPE_AUTH ||  // prefill's AUTH
        rl_write_full(d, pa, PD_HDR_BYTES + 32) ||
        rl_read_frame(d, da_, sizeof da_, &t) < 0 || t != PD_TYPE_AUTH) {  // decode's, dropped
        printf("RELAY: decode refused\n");
        rl_hold();
    }
    uint8_t link[48] = {0}; // v3: + the model_id (the relay does not know it: zero) + the router
    pd_store_u32(link, victim);
    pd_store_u64(link + 40, victim_router);
    uint8_t ack[128];
    if (rl_send_frame(d, 0x0008 /* LINK */, link, sizeof link) || rl_read_frame(d, ack, sizeof ack, &t) < 0 ||
        t != 0x0009 /* LINK_ACK */) {
        printf("RELAY: decode refused\n");
        rl_hold();
    }
    printf("RELAY: link up epoch %llu\n", (unsigned long long)pd_load_u64(ack + PD_HDR_BYTES));
    rl_hold();
    return 0;
}
