/* fuzz_pd_wire.c — libFuzzer harness for the pd frame decoder
 * (src/pd/wire.c): pd_hdr_parse, the copying pd_decoder_feed, and the
 * want/advance state machine the TCP transport drives with a payload sink.
 *
 * Input: one mode byte, then a byte stream as a peer would send it.
 *   mode bit 0   : rewrite each frame's checksum to the right value first, so
 *                  that the fuzzer reaches the payload paths (a checksum it
 *                  cannot forge would stop almost every input at frame one)
 *   mode bits 1-5: read size: the stream arrives in pieces of this many bytes
 *                  (0: all at once)
 *   mode bit 6   : drive the transport's state machine (pd__dec_want /
 *                  advance, a 40-byte sink prefix, the rest into a sink split
 *                  over three iovecs) instead of pd_decoder_feed
 *   mode bit 7   : max payload PD_MAX_PAYLOAD_UNAUTH (64) instead of 64 KiB
 * Every frame delivered must be the bytes that were sent: re-encoding it with
 * pd_frame_encode gives the same bytes, and sunk payload bytes land intact.
 * After an error the decoder must stay failed. Built only with KS_FUZZ=ON;
 * see tests/fuzz/README.md. */
#include "pd/pd_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_SINK_PREFIX 40u

/* Rewrites the checksum of every whole-header frame in s[0..n). */
static void fz__fix_checksums(uint8_t *s, size_t n) {
    size_t p = 0;
    while (n - p >= PD_HDR_BYTES) {
        uint32_t len = pd_load_u32(s + p + 16);
        size_t have = n - p - PD_HDR_BYTES;
        struct iovec iov = {s + p + PD_HDR_BYTES, len < have ? len : have};
        pd_store_u32(s + p + 20, pd_frame_checksum(s + p, &iov, 1));
        if (len >= have) break;
        p += PD_HDR_BYTES + len;
    }
}

/* A delivered frame that ends at s[end] must be byte-identical to what
 * pd_frame_encode makes of it (the sunk part was checked by the caller). */
static void fz__check_frame(const uint8_t *s, size_t end, const pd_frame *f, uint32_t max) {
    size_t total = PD_HDR_BYTES + (size_t)f->hdr.len;
    if (end < total) abort();
    const uint8_t *start = s + end - total;
    if (f->payload_len > f->hdr.len) abort();
    if (!f->sunk && f->payload_len != f->hdr.len) abort();
    if (f->payload_len && memcmp(f->payload, start + PD_HDR_BYTES, f->payload_len) != 0) abort();
    if (f->sunk) return;
    uint8_t *re = malloc(total);
    size_t re_len = 0;
    if (!re) abort();
    if (pd_frame_encode(re, total, f->hdr.type, f->hdr.req_id, f->payload, f->hdr.len, max,
                        &re_len, NULL) != KS_OK)
        abort();
    if (re_len != total || memcmp(re, start, total) != 0) abort();
    free(re);
}

static void fz__feed(const uint8_t *s, size_t n, size_t chunk, uint32_t max) {
    pd_decoder *d = NULL;
    if (pd_decoder_create(max, &d) != KS_OK) abort();
    size_t pos = 0;
    while (pos < n) {
        size_t give = chunk && chunk < n - pos ? chunk : n - pos;
        size_t used = 0;
        pd_frame f;
        ks_errbuf eb;
        ks_err e = pd_decoder_feed(d, s + pos, give, &used, &f, &eb);
        if (used > give) abort();
        pos += used;
        if (e == KS_OK) {
            if (used == 0) abort(); /* a frame ends with its last byte */
            fz__check_frame(s, pos, &f, max);
        } else if (e == KS_ERR_AGAIN) {
            if (used != give) abort();
        } else {
            if (e != KS_ERR_PROTO) abort();
            if (pd_decoder_feed(d, s, n, &used, &f, &eb) != KS_ERR_PROTO || used != 0) abort();
            break;
        }
    }
    pd_decoder_destroy(d);
}

/* The transport's loop (src/pd/tcp.c pd__on_readable / pd__on_header) with a
 * sink that takes every payload longer than its prefix. */
static void fz__transport(const uint8_t *s, size_t n, size_t chunk, uint32_t max) {
    pd_decoder *d = pd__alloc_aligned(sizeof *d);
    if (!d) abort();
    pd__dec_init(d, max);
    uint8_t *sink = NULL; /* the sink's destination for the frame in progress */
    size_t pos = 0;
    while (pos < n) {
        struct iovec iov[PD_MAX_IOV];
        int k = pd__dec_want(d, iov, PD_MAX_IOV);
        if (k < 1) abort();
        size_t take = 0;
        size_t limit = chunk && chunk < n - pos ? chunk : n - pos;
        for (int i = 0; i < k && take < limit; i++) {
            size_t c = limit - take < iov[i].iov_len ? limit - take : iov[i].iov_len;
            memcpy(iov[i].iov_base, s + pos + take, c);
            take += c;
        }
        pos += take;
        pd_frame f;
        ks_errbuf eb;
        ks_err e = pd__dec_advance(d, take, &f, &eb);
        if (e == KS_ERR_AGAIN) {
            if (d->state != PD__DEC_NEED_DEST) continue;
            const pd_frame_hdr *h = &d->cur;
            if (d->pay_have == 0 && h->len > FZ_SINK_PREFIX) {
                if (pd__dec_read_prefix(d, FZ_SINK_PREFIX, &eb) != KS_OK) abort();
            } else if (d->pay_have == 0) {
                if (pd__dec_use_buffer(d, &eb) != KS_OK) abort();
            } else {
                size_t rest = h->len - d->pay_have;
                free(sink);
                if (!(sink = malloc(rest))) abort();
                struct iovec sv[3] = {{sink, rest / 2}, {sink + rest / 2, 0},
                                      {sink + rest / 2, rest - rest / 2}};
                pd__dec_use_sink(d, sv, 3);
            }
            continue;
        }
        if (e != KS_OK) {
            if (e != KS_ERR_PROTO || d->state != PD__DEC_FAILED) abort();
            break;
        }
        if (f.sunk) {
            if (f.payload_len != FZ_SINK_PREFIX) abort();
            size_t rest = f.hdr.len - FZ_SINK_PREFIX;
            if (memcmp(sink, s + pos - rest, rest) != 0) abort();
        }
        fz__check_frame(s, pos, &f, max);
    }
    free(sink);
    pd__dec_free(d);
    free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t mode = data[0];
    size_t n = size - 1;
    uint8_t *s = malloc(n ? n : 1);
    if (!s) abort();
    memcpy(s, data + 1, n);
    if (mode & 1) fz__fix_checksums(s, n);
    size_t chunk = (mode >> 1) & 0x1f;
    uint32_t max = (mode & 0x80) ? PD_MAX_PAYLOAD_UNAUTH : 65536u;
    if (n >= PD_HDR_BYTES) {
        pd_frame_hdr h;
        (void)pd_hdr_parse(s, max, &h, NULL);
    }
    if (mode & 0x40)
        fz__transport(s, n, chunk, max);
    else
        fz__feed(s, n, chunk, max);
    free(s);
    return 0;
}
