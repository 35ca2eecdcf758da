/* wire.c — pd frame encoding and the incremental decoder (include/kvseal/pd.h
 * section 1; layout in docs/pd-protocol.md).
 *
 * The decoder is a read-target state machine: want() says where the next
 * bytes belong (the header array, then the payload destination), advance()
 * accounts them. A socket can therefore recv straight into a KV page; the
 * checksum is folded in chunk by chunk while the bytes are still in cache.
 * The header is validated (magic, version, len <= max) before any payload
 * memory is allocated. pd_decoder_feed is the copying wrapper for callers
 * that already hold the bytes. */
#include "pd_int.h"
#include "pd_xxh.h"

#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Checksum: XXH3 on the widest vector unit (pd_xxh.h)

const char *pd__xxh_isa(void) {
    const ks_cpu *c = ks_cpu_get();
    return c->avx512 ? "avx512" : c->avx2 ? "avx2" : "libxxhash";
}

void pd__xxh_update(XXH3_state_t *st, const void *p, size_t n) {
    const ks_cpu *c = ks_cpu_get();
    if (c->avx512) pd__xxh3_update_avx512(st, p, n);
    else if (c->avx2) pd__xxh3_update_avx2(st, p, n);
    else (void)XXH3_64bits_update(st, p, n);
}

// ----------------------------------------------------------------------------
// Encoding

uint32_t pd_frame_checksum(const uint8_t hdr[PD_HDR_BYTES], const struct iovec *payload,
                           int n_iov) {
    uint8_t h[PD_HDR_BYTES];
    memcpy(h, hdr, PD_HDR_BYTES);
    pd_store_u32(h + 20, 0);
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, h, PD_HDR_BYTES);
    for (int i = 0; i < n_iov; i++)
        if (payload[i].iov_len) pd__xxh_update(&st, payload[i].iov_base, payload[i].iov_len);
    return (uint32_t)XXH3_64bits_digest(&st);  // the low 32 bits
}

ks_err pd_frame_encode_hdr(uint8_t hdr[PD_HDR_BYTES], uint16_t type, uint64_t req_id,
                           const struct iovec *payload, int n_iov, uint32_t max_payload,
                           ks_errbuf *eb) {
    if (n_iov < 0 || n_iov > PD_MAX_IOV)
        return ks_seterr(eb, KS_ERR_INVAL, "pd frame: %d payload iovecs (max %d)", n_iov,
                         PD_MAX_IOV);
    uint64_t len = 0;
    for (int i = 0; i < n_iov; i++) len += payload[i].iov_len;
    if (len > max_payload)
        return ks_seterr(eb, KS_ERR_INVAL, "pd frame: payload of %llu bytes exceeds max %u",
                         (unsigned long long)len, max_payload);
    pd_store_u32(hdr + 0, PD_MAGIC);
    pd_store_u16(hdr + 4, PD_VERSION);
    pd_store_u16(hdr + 6, type);
    pd_store_u64(hdr + 8, req_id);
    pd_store_u32(hdr + 16, (uint32_t)len);
    pd_store_u32(hdr + 20, 0);
    pd_store_u32(hdr + 20, pd_frame_checksum(hdr, payload, n_iov));
    return KS_OK;
}

ks_err pd_frame_encode(uint8_t *buf, size_t cap, uint16_t type, uint64_t req_id,
                       const void *payload, uint32_t len, uint32_t max_payload, size_t *out_len,
                       ks_errbuf *eb) {
    if (cap < PD_HDR_BYTES || cap - PD_HDR_BYTES < len)
        return ks_seterr(eb, KS_ERR_INVAL, "pd frame: buffer of %zu bytes < %zu needed", cap,
                         (size_t)PD_HDR_BYTES + len);
    struct iovec iov = {(void *)(uintptr_t)payload, len};
    ks_err e = pd_frame_encode_hdr(buf, type, req_id, &iov, len ? 1 : 0, max_payload, eb);
    if (e) return e;
    if (len) memcpy(buf + PD_HDR_BYTES, payload, len);
    *out_len = PD_HDR_BYTES + (size_t)len;
    return KS_OK;
}

ks_err pd_hdr_parse(const uint8_t hdr[PD_HDR_BYTES], uint32_t max_payload, pd_frame_hdr *out,
                    ks_errbuf *eb) {
    uint32_t magic = pd_load_u32(hdr);
    if (magic != PD_MAGIC)
        return ks_seterr(eb, KS_ERR_PROTO, "pd frame: bad magic 0x%08x (want 0x%08x \"KVPD\")",
                         magic, PD_MAGIC);
    uint16_t ver = pd_load_u16(hdr + 4);
    if (ver != PD_VERSION)
        return ks_seterr(eb, KS_ERR_PROTO, "pd frame: unsupported version %u (want %u)", ver,
                         PD_VERSION);
    uint32_t len = pd_load_u32(hdr + 16);
    if (len > max_payload)
        return ks_seterr(eb, KS_ERR_PROTO, "pd frame: oversize payload %u bytes (max %u)", len,
                         max_payload);
    out->type = pd_load_u16(hdr + 6);
    out->req_id = pd_load_u64(hdr + 8);
    out->len = len;
    out->checksum = pd_load_u32(hdr + 20);
    return KS_OK;
}

// ----------------------------------------------------------------------------
// Decoder state machine

void *pd__alloc_aligned(size_t n) {
    const size_t a = _Alignof(pd_decoder);
    void *p = aligned_alloc(a, (n + a - 1) / a * a);  // C11: size a multiple of the alignment
    if (p) memset(p, 0, n);
    return p;
}

void pd__dec_init(pd_decoder *d, uint32_t max_payload) {
    memset(d, 0, sizeof *d);
    d->max_payload = max_payload;
    d->state = PD__DEC_HDR;
}

void pd__dec_free(pd_decoder *d) {
    free(d->buf);
    d->buf = NULL;
    d->buf_cap = 0;
}

int pd__dec_want(const pd_decoder *d, struct iovec *iov, int cap) {
    if (cap < 1) return 0;
    if (d->state == PD__DEC_HDR) {
        iov[0].iov_base = (uint8_t *)d->hdr + d->hdr_have;
        iov[0].iov_len = PD_HDR_BYTES - d->hdr_have;
        return 1;
    }
    if (d->state != PD__DEC_PAYLOAD) return 0;
    int n = 0;
    for (int i = d->dest_i; i < d->n_dest && n < cap; i++) {
        size_t off = i == d->dest_i ? d->dest_off : 0;
        if (d->dest[i].iov_len == off) continue;
        iov[n].iov_base = (uint8_t *)d->dest[i].iov_base + off;
        iov[n].iov_len = d->dest[i].iov_len - off;
        n++;
    }
    return n;
}

/* Completes the frame in progress: compares the checksum, fills *out. */
static ks_err pd__dec_finish(pd_decoder *d, pd_frame *out, ks_errbuf *eb) {
    uint32_t got = (uint32_t)XXH3_64bits_digest(&d->xs);
    if (got != d->cur.checksum) {
        d->state = PD__DEC_FAILED;
        return ks_seterr(eb, KS_ERR_PROTO,
                         "pd frame: bad checksum (type %u, req %llu, %u bytes: got 0x%08x, "
                         "header says 0x%08x)",
                         d->cur.type, (unsigned long long)d->cur.req_id, d->cur.len, got,
                         d->cur.checksum);
    }
    out->hdr = d->cur;
    out->sunk = d->sunk;
    out->payload_len = d->sunk ? d->prefix_len : d->cur.len;
    out->payload = out->payload_len ? d->buf : NULL;
    d->state = PD__DEC_HDR;
    d->hdr_have = 0;
    return KS_OK;
}

ks_err pd__dec_advance(pd_decoder *d, size_t n, pd_frame *out, ks_errbuf *eb) {
    if (d->state == PD__DEC_FAILED)
        return ks_seterr(eb, KS_ERR_PROTO, "pd frame: stream already failed");
    if (d->state == PD__DEC_HDR) {
        KS_ASSERT(n <= PD_HDR_BYTES - d->hdr_have);
        d->hdr_have += (uint32_t)n;
        if (d->hdr_have < PD_HDR_BYTES) return KS_ERR_AGAIN;
        ks_err e = pd_hdr_parse(d->hdr, d->max_payload, &d->cur, eb);
        if (e) {
            d->state = PD__DEC_FAILED;
            return e;
        }
        uint8_t h[PD_HDR_BYTES];
        memcpy(h, d->hdr, PD_HDR_BYTES);
        pd_store_u32(h + 20, 0);
        XXH3_64bits_reset(&d->xs);
        XXH3_64bits_update(&d->xs, h, PD_HDR_BYTES);
        d->sunk = false;
        d->pay_have = 0;
        d->prefix_len = 0;
        d->in_prefix = false;
        if (d->cur.len == 0) return pd__dec_finish(d, out, eb);
        d->state = PD__DEC_NEED_DEST;
        return KS_ERR_AGAIN;
    }
    KS_ASSERT(d->state == PD__DEC_PAYLOAD);
    KS_ASSERT(n <= d->cur.len - d->pay_have);
    // Fold the new bytes into the checksum where they landed.
    size_t left = n;
    while (left) {
        struct iovec *v = &d->dest[d->dest_i];
        size_t room = v->iov_len - d->dest_off;
        size_t k = left < room ? left : room;
        if (k) pd__xxh_update(&d->xs, (uint8_t *)v->iov_base + d->dest_off, k);
        d->dest_off += k;
        left -= k;
        if (d->dest_off == v->iov_len && d->dest_i + 1 < d->n_dest) {
            d->dest_i++;
            d->dest_off = 0;
        }
    }
    d->pay_have += (uint32_t)n;
    if (d->in_prefix && d->pay_have == d->prefix_len) {
        d->in_prefix = false;
        d->state = PD__DEC_NEED_DEST;
        return KS_ERR_AGAIN;
    }
    if (d->pay_have < d->cur.len) return KS_ERR_AGAIN;
    return pd__dec_finish(d, out, eb);
}

/* Makes buf hold at least need bytes, keeping the first keep bytes. */
static ks_err pd__dec_reserve(pd_decoder *d, size_t need, size_t keep, ks_errbuf *eb) {
    if (d->buf_cap >= need) return KS_OK;
    // need <= len, which was checked against max_payload at header time.
    uint8_t *nb = malloc(need);
    if (!nb) return ks_seterr(eb, KS_ERR_NOMEM, "pd frame: no memory for %zu bytes", need);
    if (keep) memcpy(nb, d->buf, keep);
    free(d->buf);
    d->buf = nb;
    d->buf_cap = need;
    return KS_OK;
}

static void pd__dec_set_dest1(pd_decoder *d, uint8_t *p, size_t n) {
    d->dest[0].iov_base = p;
    d->dest[0].iov_len = n;
    d->n_dest = 1;
    d->dest_i = 0;
    d->dest_off = 0;
    d->state = PD__DEC_PAYLOAD;
}

ks_err pd__dec_read_prefix(pd_decoder *d, uint32_t n, ks_errbuf *eb) {
    KS_ASSERT(d->state == PD__DEC_NEED_DEST && d->pay_have == 0 && n > 0 && n < d->cur.len);
    ks_err e = pd__dec_reserve(d, n < 256 ? 256 : n, 0, eb);
    if (e) return e;
    d->prefix_len = n;
    d->in_prefix = true;
    pd__dec_set_dest1(d, d->buf, n);
    return KS_OK;
}

ks_err pd__dec_use_buffer(pd_decoder *d, ks_errbuf *eb) {
    KS_ASSERT(d->state == PD__DEC_NEED_DEST);
    ks_err e = pd__dec_reserve(d, d->cur.len, d->pay_have, eb);
    if (e) return e;
    d->sunk = false;
    pd__dec_set_dest1(d, d->buf + d->pay_have, d->cur.len - d->pay_have);
    return KS_OK;
}

void pd__dec_use_sink(pd_decoder *d, const struct iovec *iov, int n) {
    KS_ASSERT(d->state == PD__DEC_NEED_DEST && n >= 1 && n <= PD_MAX_IOV);
    memcpy(d->dest, iov, (size_t)n * sizeof *iov);
    d->n_dest = n;
    d->dest_i = 0;
    d->dest_off = 0;
    while (d->dest_i + 1 < d->n_dest && d->dest[d->dest_i].iov_len == 0) d->dest_i++;
    d->sunk = true;
    d->state = PD__DEC_PAYLOAD;
}

// ----------------------------------------------------------------------------
// Public copying decoder

ks_err pd_decoder_create(uint32_t max_payload, pd_decoder **out) {
    pd_decoder *d = pd__alloc_aligned(sizeof *d);
    if (!d) return KS_ERR_NOMEM;
    pd__dec_init(d, max_payload);
    *out = d;
    return KS_OK;
}

void pd_decoder_destroy(pd_decoder *d) {
    if (!d) return;
    pd__dec_free(d);
    free(d);
}

ks_err pd_decoder_feed(pd_decoder *d, const uint8_t *buf, size_t n, size_t *consumed,
                       pd_frame *out, ks_errbuf *eb) {
    size_t used = 0;
    *consumed = 0;
    if (d->state == PD__DEC_FAILED)
        return ks_seterr(eb, KS_ERR_PROTO, "pd frame: stream already failed");
    for (;;) {
        if (d->state == PD__DEC_NEED_DEST) {
            ks_err e = pd__dec_use_buffer(d, eb);
            if (e) return e;
        }
        if (used == n) return KS_ERR_AGAIN;
        struct iovec iov[PD_MAX_IOV];
        int k = pd__dec_want(d, iov, PD_MAX_IOV);
        KS_ASSERT(k >= 1);
        size_t take = 0;
        for (int i = 0; i < k && used + take < n; i++) {
            size_t c = n - used - take < iov[i].iov_len ? n - used - take : iov[i].iov_len;
            memcpy(iov[i].iov_base, buf + used + take, c);
            take += c;
        }
        used += take;
        *consumed = used;
        ks_err e = pd__dec_advance(d, take, out, eb);
        if (e != KS_ERR_AGAIN) return e;
    }
}
