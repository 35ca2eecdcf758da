/* msg.c — KVPD v1 message payloads: type names and bounds, one decoder and
 * one encoder per message (include/kvseal/pd_msg.h; layouts in
 * docs/pd-protocol.md section 4).
 *
 * Decoders check, in this order: the fixed part is present, length fields
 * (and counts) are within their bounds, len equals the size they imply, then
 * enum ranges and semantic rules. Encoders pre-check counts, write every
 * field (reserved bytes zero), and then run the decoder over their own
 * output, so nothing is sent that a peer would refuse. */
#include "kvseal/pd_msg.h"
#include "kvseal/pd.h"

#include <stdint.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Helpers

#define PROTO(...) ks_seterr(eb, KS_ERR_PROTO, __VA_ARGS__)

static void store_f32(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    pd_store_u32(p, u);
}

static float load_f32(const uint8_t *p) {
    uint32_t u = pd_load_u32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static ks_err want_len(const char *name, uint32_t len, uint32_t want, ks_errbuf *eb) {
    if (len != want) return PROTO("%s: payload is %u bytes, expected %u", name, len, want);
    return KS_OK;
}

static ks_err want_min(const char *name, uint32_t len, uint32_t fixed, ks_errbuf *eb) {
    if (len < fixed)
        return PROTO("%s: payload is %u bytes, shorter than its fixed part (%u)", name, len,
                     fixed);
    return KS_OK;
}

/* The variable part after `fixed` bytes is `var` bytes: len must be exactly
 * fixed + var (var computed in 64 bits by the caller). */
static ks_err want_var(const char *name, const char *field, uint32_t len, uint32_t fixed,
                       uint64_t var, ks_errbuf *eb) {
    if ((uint64_t)len != (uint64_t)fixed + var)
        return PROTO("%s: %s implies %llu payload bytes but len is %u", name, field,
                     (unsigned long long)((uint64_t)fixed + var), len);
    return KS_OK;
}

/* Turns a decoder failure over our own encoder's output into KS_ERR_INVAL. */
static ks_err enc_check(ks_err e, const ks_errbuf *tmp, ks_errbuf *eb) {
    if (e == KS_OK) return KS_OK;
    return ks_seterr(eb, KS_ERR_INVAL, "encode: %s", tmp->msg);
}

/* Common start of an encoder: size-only mode and capacity. Returns true when
 * the caller should return *ret right away. */
static bool enc_begin(uint64_t size, uint8_t *buf, size_t cap, uint32_t *out_len, ks_err *ret,
                      const char *name, ks_errbuf *eb) {
    if (size > PD_MSG_MAX_FRAME) {
        *ret = ks_seterr(eb, KS_ERR_INVAL, "%s: %llu payload bytes exceed the frame maximum",
                         name, (unsigned long long)size);
        return true;
    }
    *out_len = (uint32_t)size;
    if (!buf) {
        *ret = KS_OK;
        return true;
    }
    if (cap < size) {
        *ret = ks_seterr(eb, KS_ERR_NOSPACE, "%s: needs %llu bytes, buffer holds %zu", name,
                         (unsigned long long)size, cap);
        return true;
    }
    memset(buf, 0, (size_t)size);
    return false;
}

pd_msg_top pd_msg_top_at(const uint8_t *raw, uint32_t i) {
    pd_msg_top t;
    t.id = (int32_t)pd_load_u32(raw + 8u * i);
    t.logprob = load_f32(raw + 8u * i + 4);
    return t;
}

static void store_top(uint8_t *p, const pd_msg_top *top, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        pd_store_u32(p + 8u * i, (uint32_t)top[i].id);
        store_f32(p + 8u * i + 4, top[i].logprob);
    }
}

// ----------------------------------------------------------------------------
// Names and bounds

const char *pd_msg_type_name(uint16_t type) {
    switch (type) {
    case PD_MSG_HELLO: return "HELLO";
    case PD_MSG_AUTH: return "AUTH";
    case PD_MSG_REGISTER: return "REGISTER";
    case PD_MSG_REGISTER_ACK: return "REGISTER_ACK";
    case PD_MSG_HEALTH: return "HEALTH";
    case PD_MSG_HEALTH_ACK: return "HEALTH_ACK";
    case PD_MSG_PEER: return "PEER";
    case PD_MSG_LINK: return "LINK";
    case PD_MSG_LINK_ACK: return "LINK_ACK";
    case PD_MSG_ADMIT: return "ADMIT";
    case PD_MSG_GRANT: return "GRANT";
    case PD_MSG_DENY: return "DENY";
    case PD_MSG_PREFILL: return "PREFILL";
    case PD_MSG_KV_PAGE: return "KV_PAGE";
    case PD_MSG_DONE: return "DONE";
    case PD_MSG_REJECT: return "REJECT";
    case PD_MSG_ABORT: return "ABORT";
    case PD_MSG_ABORT_ACK: return "ABORT_ACK";
    case PD_MSG_TOKEN: return "TOKEN";
    case PD_MSG_FINISH: return "FINISH";
    case PD_MSG_POOL_CHECK: return "POOL_CHECK";
    case PD_MSG_POOL_CHECK_ACK: return "POOL_CHECK_ACK";
    case PD_MSG_RETIRE: return "RETIRE";
    case PD_MSG_ERROR: return "ERROR";
    case PD_MSG_EMBED:
        return "EMBED";
    case PD_MSG_EMBED_RESULT:
        return "EMBED_RESULT";
    case PD_MSG_PROMPT_LP:
        return "PROMPT_LP";
    default: return "UNKNOWN";
    }
}

uint64_t pd_msg_kv_page_len(const kv_geom *g, uint32_t n_rows, uint32_t layer_count) {
    return PD_MSG_KV_PAGE_HDR +
           (uint64_t)layer_count * (uint64_t)kv_geom_planes(g) * n_rows * (uint64_t)kv_row_bytes(g);
}

/* "1 plane" / "2 planes (K, V)": how KV_PAGE refusals name a plane count (as kvseal check). */
static const char *planes_name(int planes) { return planes == 1 ? "1 plane" : "2 planes (K, V)"; }

static ks_err geom_check(const kv_geom *g, ks_errbuf *eb) {
    if (g->n_layer <= 0 || g->kv_dim <= 0 || g->page_tokens <= 0)
        return ks_seterr(eb, KS_ERR_INVAL, "geometry n_layer %d kv_dim %d page_tokens %d",
                         g->n_layer, g->kv_dim, g->page_tokens);
    if (kv_row_bytes(g) == 0)
        return ks_seterr(eb, KS_ERR_INVAL,
                         "geometry: KV type %d with kv_dim %d (want " KV_TYPE_CHOICES
                         ", kv_dim a multiple of the type's block)",
                         g->kv_type, g->kv_dim);
    if (g->planes < 0 || g->planes > 2)
        return ks_seterr(eb, KS_ERR_INVAL, "geometry: planes %d is not 1 or 2", g->planes);
    uint64_t full = pd_msg_kv_page_len(g, (uint32_t)g->page_tokens, (uint32_t)g->n_layer);
    if (full > PD_MSG_MAX_FRAME)
        return ks_seterr(eb, KS_ERR_INVAL,
                         "geometry: a full KV_PAGE frame (%llu bytes) exceeds the %u-byte "
                         "frame maximum",
                         (unsigned long long)full, PD_MSG_MAX_FRAME);
    return KS_OK;
}

ks_err pd_msg_type_max(const kv_geom *g, uint32_t out[PD_MSG_N_TYPES], ks_errbuf *eb) {
    for (uint32_t t = 0; t < PD_MSG_N_TYPES; t++) out[t] = PD_TYPE_FORBIDDEN;
    uint32_t kv = PD_TYPE_FORBIDDEN;
    if (g) {
        ks_err e = geom_check(g, eb);
        if (e) return e;
        kv = (uint32_t)pd_msg_kv_page_len(g, (uint32_t)g->page_tokens, (uint32_t)g->n_layer);
    }
    out[PD_MSG_REGISTER] = PD_MSG_REGISTER_FIXED + PD_MSG_MAX_HOST + PD_MSG_MAX_NAMES +
                           PD_MSG_ADAPTER_BYTES * PD_MSG_MAX_ADAPTERS;
    out[PD_MSG_REGISTER_ACK] = 16;
    out[PD_MSG_HEALTH] = 8;
    out[PD_MSG_HEALTH_ACK] = 24;
    out[PD_MSG_PEER] = 8 + PD_MSG_MAX_HOST;
    out[PD_MSG_LINK] = PD_MSG_LINK_LEN;
    out[PD_MSG_LINK_ACK] = 12 + PD_MSG_UCX_ADDR_MAX;
    out[PD_MSG_ADMIT] = PD_MSG_ADMIT_FIXED + PD_MSG_SEXT_MAX + PD_MSG_ADAPTER_BYTES;
    out[PD_MSG_GRANT] = PD_MSG_GRANT_MAX;
    out[PD_MSG_DENY] = 8 + PD_MSG_MAX_TEXT;
    out[PD_MSG_PREFILL] = PD_MSG_PREFILL_MAX;
    out[PD_MSG_KV_PAGE] = kv;
    out[PD_MSG_DONE] = 32 + 8 * PD_MSG_MAX_TOP;
    out[PD_MSG_REJECT] = 12 + PD_MSG_MAX_TEXT;
    out[PD_MSG_ABORT] = 4;
    out[PD_MSG_ABORT_ACK] = 0;
    out[PD_MSG_TOKEN] = 12 + 8 * PD_MSG_MAX_TOP;
    out[PD_MSG_FINISH] = 28 + PD_MSG_MAX_TEXT;
    out[PD_MSG_POOL_CHECK] = 0;
    out[PD_MSG_POOL_CHECK_ACK] = 24;
    out[PD_MSG_RETIRE] = PD_MSG_LINK_LEN;
    out[PD_MSG_ERROR] = 8 + PD_MSG_MAX_TEXT;
    out[PD_MSG_EMBED] = PD_MSG_EMBED_MAX;
    out[PD_MSG_EMBED_RESULT] = PD_MSG_EMBED_RESULT_FIXED + 4 * PD_MSG_EMBED_MAX_DIM;
    out[PD_MSG_PROMPT_LP] = PD_MSG_PROMPT_LP_MAX;
    return KS_OK;
}

// ----------------------------------------------------------------------------
// Connection-level messages

ks_err pd_msg_register_decode(const uint8_t *p, uint32_t len, pd_msg_register *out,
                              ks_errbuf *eb) {
    ks_err e = want_min("REGISTER", len, PD_MSG_REGISTER_FIXED, eb);
    if (e) return e;
    uint16_t host_len = pd_load_u16(p + 26), names_len = pd_load_u16(p + 60),
             n_adapters = pd_load_u16(p + 62); // 0 from a sender before the field
    if (host_len > PD_MSG_MAX_HOST)
        return PROTO("REGISTER: host_len %u exceeds %u", host_len, PD_MSG_MAX_HOST);
    if (names_len > PD_MSG_MAX_NAMES)
        return PROTO("REGISTER: names_len %u exceeds %u", names_len, PD_MSG_MAX_NAMES);
    if (n_adapters > PD_MSG_MAX_ADAPTERS)
        return PROTO("REGISTER: n_adapters %u exceeds %u", n_adapters, PD_MSG_MAX_ADAPTERS);
    if ((e = want_var("REGISTER", "host_len, names_len and n_adapters", len, PD_MSG_REGISTER_FIXED,
                      (uint64_t)host_len + names_len + PD_MSG_ADAPTER_BYTES * (uint64_t)n_adapters,
                      eb)))
        return e;
    if (memchr(p + PD_MSG_REGISTER_FIXED + host_len, 0, names_len))
        return PROTO("REGISTER: the names hold a NUL byte");
    pd_msg_register m;
    m.role = p[0];
    if (m.role != PD_ROLE_PREFILL && m.role != PD_ROLE_DECODE)
        return PROTO("REGISTER: role %u is not prefill (2) or decode (3)", m.role);
    m.kv_type = p[1];
    if (!kv_type_ok(m.kv_type))
        return PROTO("REGISTER: kv_type %u is not F32 (0), F16 (1) or Q8_0 (8)", m.kv_type);
    m.planes = p[2] ? p[2] : 2; // 0: a sender from before the field, whose pages had K and V
    if (m.planes > 2)
        return PROTO("REGISTER: planes %u is not 1 (one row per position) or 2 (K, V)", p[2]);
    m.n_layer = pd_load_u32(p + 4);
    m.kv_dim = pd_load_u32(p + 8);
    m.page_tokens = pd_load_u32(p + 12);
    m.n_pages = pd_load_u32(p + 16);
    m.n_ctx = pd_load_u32(p + 20);
    m.data_port = pd_load_u16(p + 24);
    m.data_plane = p[3];
    if (m.data_plane > PD_PLANE_UCX)
        return PROTO("REGISTER: data_plane %u is not TLS (0) or UCX (1)", p[3]);
    m.host_len = host_len;
    memcpy(m.model_id, p + 28, PD_MSG_HASH_BYTES);
    m.host = (const char *)(p + PD_MSG_REGISTER_FIXED);
    m.names_len = names_len;
    m.names = m.host + host_len;
    m.n_adapters = n_adapters;
    m.adapters = n_adapters ? (const uint8_t *)m.names + names_len : NULL;
    *out = m;
    return KS_OK;
}

ks_err pd_msg_register_encode(const pd_msg_register *m, uint8_t *buf, size_t cap,
                              uint32_t *out_len, ks_errbuf *eb) {
    if (m->host_len > PD_MSG_MAX_HOST)
        return ks_seterr(eb, KS_ERR_INVAL, "REGISTER: host_len %u exceeds %u", m->host_len,
                         PD_MSG_MAX_HOST);
    if (m->names_len > PD_MSG_MAX_NAMES)
        return ks_seterr(eb, KS_ERR_INVAL, "REGISTER: names_len %u exceeds %u", m->names_len,
                         PD_MSG_MAX_NAMES);
    if (m->n_adapters > PD_MSG_MAX_ADAPTERS || (m->n_adapters && !m->adapters))
        return ks_seterr(eb, KS_ERR_INVAL, "REGISTER: n_adapters %u exceeds %u", m->n_adapters,
                         PD_MSG_MAX_ADAPTERS);
    const size_t ad_bytes = PD_MSG_ADAPTER_BYTES * (size_t)m->n_adapters;
    ks_err ret;
    if (enc_begin((uint64_t)PD_MSG_REGISTER_FIXED + m->host_len + m->names_len + ad_bytes, buf,
                  cap, out_len, &ret, "REGISTER", eb))
        return ret;
    buf[0] = m->role;
    buf[1] = m->kv_type;
    buf[2] = m->planes ? m->planes : 2; // the decoder below refuses > 2
    buf[3] = m->data_plane;
    pd_store_u32(buf + 4, m->n_layer);
    pd_store_u32(buf + 8, m->kv_dim);
    pd_store_u32(buf + 12, m->page_tokens);
    pd_store_u32(buf + 16, m->n_pages);
    pd_store_u32(buf + 20, m->n_ctx);
    pd_store_u16(buf + 24, m->data_port);
    pd_store_u16(buf + 26, m->host_len);
    memcpy(buf + 28, m->model_id, PD_MSG_HASH_BYTES);
    pd_store_u16(buf + 60, m->names_len);
    pd_store_u16(buf + 62, m->n_adapters);
    if (m->host_len) memcpy(buf + PD_MSG_REGISTER_FIXED, m->host, m->host_len);
    if (m->names_len) memcpy(buf + PD_MSG_REGISTER_FIXED + m->host_len, m->names, m->names_len);
    if (ad_bytes)
        memcpy(buf + PD_MSG_REGISTER_FIXED + m->host_len + m->names_len, m->adapters, ad_bytes);
    pd_msg_register chk;
    ks_errbuf tmp;
    return enc_check(pd_msg_register_decode(buf, *out_len, &chk, &tmp), &tmp, eb);
}

ks_err pd_msg_register_ack_decode(const uint8_t *p, uint32_t len, pd_msg_register_ack *out,
                                  ks_errbuf *eb) {
    ks_err e = want_len("REGISTER_ACK", len, 16, eb);
    if (e) return e;
    out->worker_id = pd_load_u32(p);
    out->health_interval_ms = pd_load_u32(p + 4);
    out->router_id = pd_load_u64(p + 8);
    if (out->router_id == 0) return PROTO("REGISTER_ACK: router identity 0");
    return KS_OK;
}

ks_err pd_msg_register_ack_encode(const pd_msg_register_ack *m, uint8_t *buf, size_t cap,
                                  uint32_t *out_len, ks_errbuf *eb) {
    ks_err ret;
    if (m->router_id == 0) return ks_seterr(eb, KS_ERR_INVAL, "REGISTER_ACK: router identity 0");
    if (enc_begin(16, buf, cap, out_len, &ret, "REGISTER_ACK", eb)) return ret;
    pd_store_u32(buf, m->worker_id);
    pd_store_u32(buf + 4, m->health_interval_ms);
    pd_store_u64(buf + 8, m->router_id);
    return KS_OK;
}

ks_err pd_msg_health_decode(const uint8_t *p, uint32_t len, pd_msg_health *out,
                            ks_errbuf *eb) {
    ks_err e = want_len("HEALTH", len, 8, eb);
    if (e) return e;
    out->seq = pd_load_u64(p);
    return KS_OK;
}

ks_err pd_msg_health_encode(const pd_msg_health *m, uint8_t *buf, size_t cap,
                            uint32_t *out_len, ks_errbuf *eb) {
    ks_err ret;
    if (enc_begin(8, buf, cap, out_len, &ret, "HEALTH", eb)) return ret;
    pd_store_u64(buf, m->seq);
    return KS_OK;
}

ks_err pd_msg_health_ack_decode(const uint8_t *p, uint32_t len, pd_msg_health_ack *out,
                                ks_errbuf *eb) {
    ks_err e = want_len("HEALTH_ACK", len, 24, eb);
    if (e) return e;
    out->seq = pd_load_u64(p);
    out->active_requests = pd_load_u32(p + 8);
    out->free_pages = pd_load_u32(p + 12);
    out->quarantined_pages = pd_load_u32(p + 16);
    out->flags = pd_load_u32(p + 20);
    if (out->flags & ~(uint32_t)PD_HEALTH_DRAINING)
        return PROTO("HEALTH_ACK: flags 0x%x has unknown bits", out->flags);
    return KS_OK;
}

ks_err pd_msg_health_ack_encode(const pd_msg_health_ack *m, uint8_t *buf, size_t cap,
                                uint32_t *out_len, ks_errbuf *eb) {
    ks_err ret;
    if (enc_begin(24, buf, cap, out_len, &ret, "HEALTH_ACK", eb)) return ret;
    pd_store_u64(buf, m->seq);
    pd_store_u32(buf + 8, m->active_requests);
    pd_store_u32(buf + 12, m->free_pages);
    pd_store_u32(buf + 16, m->quarantined_pages);
    if (m->flags & ~(uint32_t)PD_HEALTH_DRAINING)
        return ks_seterr(eb, KS_ERR_INVAL, "HEALTH_ACK: flags 0x%x has unknown bits", m->flags);
    pd_store_u32(buf + 20, m->flags);
    return KS_OK;
}

ks_err pd_msg_pool_check_ack_decode(const uint8_t *p, uint32_t len, pd_msg_pool_check_ack *out,
                                    ks_errbuf *eb) {
    ks_err e = want_len("POOL_CHECK_ACK", len, 24, eb);
    if (e) return e;
    out->clean = pd_load_u32(p);
    out->active = pd_load_u32(p + 4);
    out->free_pages = pd_load_u32(p + 8);
    out->allocated = pd_load_u32(p + 12);
    out->ready = pd_load_u32(p + 16);
    out->quarantined = pd_load_u32(p + 20);
    if (out->clean > 1) return PROTO("POOL_CHECK_ACK: clean %u is not 0 or 1", out->clean);
    return KS_OK;
}

ks_err pd_msg_pool_check_ack_encode(const pd_msg_pool_check_ack *m, uint8_t *buf, size_t cap,
                                    uint32_t *out_len, ks_errbuf *eb) {
    ks_err ret;
    if (enc_begin(24, buf, cap, out_len, &ret, "POOL_CHECK_ACK", eb)) return ret;
    if (m->clean > 1)
        return ks_seterr(eb, KS_ERR_INVAL, "POOL_CHECK_ACK: clean %u is not 0 or 1", m->clean);
    pd_store_u32(buf, m->clean);
    pd_store_u32(buf + 4, m->active);
    pd_store_u32(buf + 8, m->free_pages);
    pd_store_u32(buf + 12, m->allocated);
    pd_store_u32(buf + 16, m->ready);
    pd_store_u32(buf + 20, m->quarantined);
    return KS_OK;
}

ks_err pd_msg_peer_decode(const uint8_t *p, uint32_t len, pd_msg_peer *out, ks_errbuf *eb) {
    ks_err e = want_min("PEER", len, 8, eb);
    if (e) return e;
    uint16_t host_len = pd_load_u16(p + 6);
    if (host_len > PD_MSG_MAX_HOST)
        return PROTO("PEER: host_len %u exceeds %u", host_len, PD_MSG_MAX_HOST);
    if ((e = want_var("PEER", "host_len", len, 8, host_len, eb))) return e;
    out->decode_worker_id = pd_load_u32(p);
    out->port = pd_load_u16(p + 4);
    out->host_len = host_len;
    out->host = (const char *)(p + 8);
    return KS_OK;
}

ks_err pd_msg_peer_encode(const pd_msg_peer *m, uint8_t *buf, size_t cap, uint32_t *out_len,
                          ks_errbuf *eb) {
    if (m->host_len > PD_MSG_MAX_HOST)
        return ks_seterr(eb, KS_ERR_INVAL, "PEER: host_len %u exceeds %u", m->host_len,
                         PD_MSG_MAX_HOST);
    ks_err ret;
    if (enc_begin(8u + m->host_len, buf, cap, out_len, &ret, "PEER", eb)) return ret;
    pd_store_u32(buf, m->decode_worker_id);
    pd_store_u16(buf + 4, m->port);
    pd_store_u16(buf + 6, m->host_len);
    if (m->host_len) memcpy(buf + 8, m->host, m->host_len);
    return KS_OK;
}

ks_err pd_msg_link_decode(const uint8_t *p, uint32_t len, pd_msg_link *out, ks_errbuf *eb) {
    ks_err e = want_len("LINK", len, PD_MSG_LINK_LEN, eb);
    if (e) return e;
    out->prefill_worker_id = pd_load_u32(p);
    memcpy(out->model_id, p + 8, PD_MSG_HASH_BYTES);
    out->router_id = pd_load_u64(p + 8 + PD_MSG_HASH_BYTES);
    if (out->router_id == 0) return PROTO("LINK: router identity 0");
    return KS_OK;
}

ks_err pd_msg_link_encode(const pd_msg_link *m, uint8_t *buf, size_t cap, uint32_t *out_len,
                          ks_errbuf *eb) {
    ks_err ret;
    if (m->router_id == 0) return ks_seterr(eb, KS_ERR_INVAL, "LINK: router identity 0");
    if (enc_begin(PD_MSG_LINK_LEN, buf, cap, out_len, &ret, "LINK", eb)) return ret;
    pd_store_u32(buf, m->prefill_worker_id);
    pd_store_u32(buf + 4, 0);
    memcpy(buf + 8, m->model_id, PD_MSG_HASH_BYTES);
    pd_store_u64(buf + 8 + PD_MSG_HASH_BYTES, m->router_id);
    return KS_OK;
}

ks_err pd_msg_link_ack_decode(const uint8_t *p, uint32_t len, pd_msg_link_ack *out,
                              ks_errbuf *eb) {
    ks_err e = want_min("LINK_ACK", len, 8, eb);
    if (e) return e;
    uint64_t epoch = pd_load_u64(p);
    if (epoch == 0) return PROTO("LINK_ACK: link_epoch is 0");
    pd_msg_link_ack m = {.link_epoch = epoch};
    if (len > 8) { // a decode worker on the UCX data plane: its worker address
        if ((e = want_min("LINK_ACK", len, 12, eb))) return e;
        m.ucx_addr_len = pd_load_u32(p + 8);
        if (m.ucx_addr_len == 0 || m.ucx_addr_len > PD_MSG_UCX_ADDR_MAX)
            return PROTO("LINK_ACK: ucx_addr_len %u is not 1..%u", m.ucx_addr_len,
                         PD_MSG_UCX_ADDR_MAX);
        if ((e = want_var("LINK_ACK", "ucx_addr_len", len, 12, m.ucx_addr_len, eb))) return e;
        m.ucx_addr = p + 12;
    }
    *out = m;
    return KS_OK;
}

ks_err pd_msg_link_ack_encode(const pd_msg_link_ack *m, uint8_t *buf, size_t cap,
                              uint32_t *out_len, ks_errbuf *eb) {
    if (m->link_epoch == 0) return ks_seterr(eb, KS_ERR_INVAL, "LINK_ACK: link_epoch is 0");
    if (m->ucx_addr_len > PD_MSG_UCX_ADDR_MAX)
        return ks_seterr(eb, KS_ERR_INVAL, "LINK_ACK: ucx_addr_len %u exceeds %u",
                         m->ucx_addr_len, PD_MSG_UCX_ADDR_MAX);
    ks_err ret;
    uint64_t size = m->ucx_addr_len ? 12u + (uint64_t)m->ucx_addr_len : 8u;
    if (enc_begin(size, buf, cap, out_len, &ret, "LINK_ACK", eb)) return ret;
    pd_store_u64(buf, m->link_epoch);
    if (m->ucx_addr_len) {
        pd_store_u32(buf + 8, m->ucx_addr_len);
        memcpy(buf + 12, m->ucx_addr, m->ucx_addr_len);
    }
    return KS_OK;
}

/* Decodes {u32 msg_len at len_off, msg at fixed} after the fixed part. */
static ks_err text_decode(const char *name, const uint8_t *p, uint32_t len, uint32_t fixed,
                          uint32_t len_off, const char **msg, uint32_t *msg_len,
                          ks_errbuf *eb) {
    ks_err e = want_min(name, len, fixed, eb);
    if (e) return e;
    uint32_t n = pd_load_u32(p + len_off);
    if (n > PD_MSG_MAX_TEXT) return PROTO("%s: msg_len %u exceeds %u", name, n, PD_MSG_MAX_TEXT);
    if ((e = want_var(name, "msg_len", len, fixed, n, eb))) return e;
    *msg = (const char *)(p + fixed);
    *msg_len = n;
    return KS_OK;
}

static ks_err text_pre(const char *name, uint32_t msg_len, ks_errbuf *eb) {
    if (msg_len > PD_MSG_MAX_TEXT)
        return ks_seterr(eb, KS_ERR_INVAL, "%s: msg_len %u exceeds %u", name, msg_len,
                         PD_MSG_MAX_TEXT);
    return KS_OK;
}

static bool ks_err_valid(uint32_t err) { return err > 0 && err < (uint32_t)KS_ERR__COUNT; }

ks_err pd_msg_error_decode(const uint8_t *p, uint32_t len, pd_msg_error *out, ks_errbuf *eb) {
    pd_msg_error m;
    ks_err e = text_decode("ERROR", p, len, 8, 4, &m.msg, &m.msg_len, eb);
    if (e) return e;
    m.err = pd_load_u32(p);
    if (!ks_err_valid(m.err)) return PROTO("ERROR: err %u is not a ks_err error value", m.err);
    *out = m;
    return KS_OK;
}

ks_err pd_msg_error_encode(const pd_msg_error *m, uint8_t *buf, size_t cap, uint32_t *out_len,
                           ks_errbuf *eb) {
    ks_err ret = text_pre("ERROR", m->msg_len, eb);
    if (ret) return ret;
    if (enc_begin(8u + m->msg_len, buf, cap, out_len, &ret, "ERROR", eb)) return ret;
    pd_store_u32(buf, m->err);
    pd_store_u32(buf + 4, m->msg_len);
    if (m->msg_len) memcpy(buf + 8, m->msg, m->msg_len);
    pd_msg_error chk;
    ks_errbuf tmp;
    return enc_check(pd_msg_error_decode(buf, *out_len, &chk, &tmp), &tmp, eb);
}

// ----------------------------------------------------------------------------
// ADMIT, GRANT, DENY, PREFILL

/* Sampling fields of ADMIT and PREFILL: max_tokens at mt_off (ADMIT 4,
 * PREFILL 8), flags at 12, seed..n_probs at 48..76 (the same in both). */
static ks_err sampling_decode(const char *name, const uint8_t *p, uint32_t mt_off,
                              bool need_max_tokens, pd_msg_sampling *s, ks_errbuf *eb) {
    s->max_tokens = pd_load_u32(p + mt_off);
    s->flags = pd_load_u32(p + 12);
    s->seed = pd_load_u64(p + 48);
    s->temperature = load_f32(p + 56);
    s->top_p = load_f32(p + 60);
    s->min_p = load_f32(p + 64);
    s->top_k = (int32_t)pd_load_u32(p + 68);
    s->n_probs = (int32_t)pd_load_u32(p + 72);
    if (need_max_tokens && s->max_tokens < 1) return PROTO("%s: max_tokens is 0", name);
    // the extension's rows read as their off values without it (sext_decode)
#define PD__EXT_OFF(f, T, key, alias, def, off, lo, lo_open, hi, what, jhi, wire, ...)             \
    if (wire == SAMPLE_WIRE_EXT) s->f = off;
    SAMPLE_PARAM_MAP(PD__EXT_OFF)
#undef PD__EXT_OFF
    s->n_bias = s->grammar_len = 0;
    s->bias = NULL;
    s->grammar = NULL;
    memset(s->adapter, 0, sizeof s->adapter);
    if (s->flags & ~(uint32_t)(PD_FLAG_IGNORE_EOS | PD_FLAG_LOGPROBS | PD_FLAG_EXT |
                               PD_FLAG_PROMPT_LP | PD_FLAG_ADAPTER))
        return PROTO("%s: flags 0x%x has unknown bits", name, s->flags);
    if ((uint32_t)s->n_probs > PD_MSG_MAX_TOP)
        return PROTO("%s: n_probs %u exceeds %u", name, (uint32_t)s->n_probs, PD_MSG_MAX_TOP);
    return KS_OK;
}

static bool adapter_set(const pd_msg_sampling *s) {
    uint8_t any = 0;
    for (size_t i = 0; i < sizeof s->adapter; i++) any |= s->adapter[i];
    return any != 0;
}

/* Bytes of the sampling extension alone. */
static uint64_t sext_only_size(const pd_msg_sampling *s) {
    if (!(s->flags & PD_FLAG_EXT)) return 0;
    return PD_MSG_SEXT_FIXED + 8u * (uint64_t)s->n_bias + s->grammar_len;
}

uint64_t pd_msg_sext_size(const pd_msg_sampling *s) {
    return sext_only_size(s) + (adapter_set(s) ? PD_MSG_ADAPTER_BYTES : 0u);
}

/* The adapter trailer (PD_FLAG_ADAPTER) of a len-byte payload p: checks
 * there is room for it above fixed, loads it into s->adapter and returns
 * the payload length without it in *body_len. */
static ks_err adapter_trailer(const char *name, const uint8_t *p, uint32_t len, uint32_t fixed,
                              pd_msg_sampling *s, uint32_t *body_len, ks_errbuf *eb) {
    *body_len = len;
    memset(s->adapter, 0, sizeof s->adapter);
    if (!(pd_load_u32(p + 12) & PD_FLAG_ADAPTER)) return KS_OK;
    if ((uint64_t)len < (uint64_t)fixed + PD_MSG_ADAPTER_BYTES)
        return PROTO("%s: PD_FLAG_ADAPTER but %u payload bytes leave no room for the digest", name,
                     len);
    *body_len = len - PD_MSG_ADAPTER_BYTES;
    memcpy(s->adapter, p + *body_len, PD_MSG_ADAPTER_BYTES);
    if (!adapter_set(s)) return PROTO("%s: PD_FLAG_ADAPTER with an all-zero adapter digest", name);
    return KS_OK;
}

void pd_msg_bias_at(const pd_msg_sampling *s, uint32_t i, int32_t *token, float *bias) {
    *token = (int32_t)pd_load_u32(s->bias + 8u * (size_t)i);
    *bias = load_f32(s->bias + 8u * (size_t)i + 4);
}

void pd_msg_bias_store(uint8_t *raw, uint32_t i, int32_t token, float bias) {
    pd_store_u32(raw + 8u * (size_t)i, (uint32_t)token);
    store_f32(raw + 8u * (size_t)i + 4, bias);
}

static bool finite_f32(float f) { return f == f && f - f == 0.0f; }

/* The SAMPLE_WIRE_EXT rows' 4-byte slots, by type. */
#define PD__LOAD_SAMPLE_F32(q) load_f32(q)
#define PD__LOAD_SAMPLE_I32(q) (int32_t)pd_load_u32(q)
#define PD__STORE_SAMPLE_F32(q, v) store_f32(q, v)
#define PD__STORE_SAMPLE_I32(q, v) pd_store_u32(q, (uint32_t)(v))
#define PD__FINITE_SAMPLE_F32(v) finite_f32(v)
#define PD__FINITE_SAMPLE_I32(v) true

/* The sampling extension (PD_FLAG_EXT) in the n bytes at x, which must be
 * exactly its size: one 4-byte slot per SAMPLE_WIRE_EXT row of
 * SAMPLE_PARAM_MAP in row order (today 0: f32 repeat_penalty, 4: i32
 * repeat_last_n, 8: f32 frequency_penalty, 12: f32 presence_penalty, 16: i32
 * min_tokens), then u32 n_bias, u32 grammar_len (PD_MSG_SEXT_FIXED in all),
 * n_bias x {i32 token, f32 bias}, then the grammar text. */
static ks_err sext_decode(const char *name, const uint8_t *x, uint64_t n, pd_msg_sampling *s,
                          ks_errbuf *eb) {
    if (n < PD_MSG_SEXT_FIXED)
        return PROTO("%s: %llu bytes left for the sampling extension, shorter than its fixed "
                     "part (%u)",
                     name, (unsigned long long)n, PD_MSG_SEXT_FIXED);
    uint32_t o = 0;
#define PD__EXT_LOAD(f, T, key, alias, def, off, lo, lo_open, hi, what, jhi, wire, ...)            \
    if (wire == SAMPLE_WIRE_EXT) {                                                                 \
        s->f = PD__LOAD_##T(x + o);                                                                \
        o += 4;                                                                                    \
        if (!PD__FINITE_##T(s->f)) return PROTO("%s: %s is not a finite number", name, #f);        \
    }
    SAMPLE_PARAM_MAP(PD__EXT_LOAD)
#undef PD__EXT_LOAD
    s->n_bias = pd_load_u32(x + o);
    s->grammar_len = pd_load_u32(x + o + 4);
    if (s->n_bias > PD_MSG_MAX_BIAS)
        return PROTO("%s: n_bias %u exceeds %u", name, s->n_bias, PD_MSG_MAX_BIAS);
    if (s->grammar_len > PD_MSG_MAX_GRAMMAR)
        return PROTO("%s: grammar_len %u exceeds %u", name, s->grammar_len, PD_MSG_MAX_GRAMMAR);
    uint64_t want = PD_MSG_SEXT_FIXED + 8u * (uint64_t)s->n_bias + s->grammar_len;
    if (n != want)
        return PROTO("%s: n_bias and grammar_len imply a %llu-byte sampling extension but %llu "
                     "bytes are left",
                     name, (unsigned long long)want, (unsigned long long)n);
    s->bias = s->n_bias ? x + PD_MSG_SEXT_FIXED : NULL;
    s->grammar = s->grammar_len ? (const char *)x + PD_MSG_SEXT_FIXED + 8u * s->n_bias : NULL;
    for (uint32_t i = 0; i < s->n_bias; i++) {
        int32_t t;
        float b;
        pd_msg_bias_at(s, i, &t, &b);
        if (t < 0 || !finite_f32(b))
            return PROTO("%s: bias entry %u (token %d) is not a token id and a finite bias", name,
                         i, t);
    }
    if (s->grammar && memchr(s->grammar, 0, s->grammar_len))
        return PROTO("%s: the grammar text holds a NUL byte", name);
    return KS_OK;
}

/* Writes the sampling extension of s at x (pd_msg_sext_size bytes). */
static void sext_encode(uint8_t *x, const pd_msg_sampling *s) {
    uint32_t o = 0;
#define PD__EXT_STORE(f, T, key, alias, def, off, lo, lo_open, hi, what, jhi, wire, ...)           \
    if (wire == SAMPLE_WIRE_EXT) {                                                                 \
        PD__STORE_##T(x + o, s->f);                                                                \
        o += 4;                                                                                    \
    }
    SAMPLE_PARAM_MAP(PD__EXT_STORE)
#undef PD__EXT_STORE
    pd_store_u32(x + o, s->n_bias);
    pd_store_u32(x + o + 4, s->grammar_len);
    if (s->n_bias) memcpy(x + PD_MSG_SEXT_FIXED, s->bias, 8u * (size_t)s->n_bias);
    if (s->grammar_len) memcpy(x + PD_MSG_SEXT_FIXED + 8u * s->n_bias, s->grammar, s->grammar_len);
}

/* Encoder pre-check of the extension's bounds (the decoder checks the rest). */
static ks_err sext_pre(const char *name, const pd_msg_sampling *s, ks_errbuf *eb) {
    if ((s->flags & PD_FLAG_EXT) &&
        (s->n_bias > PD_MSG_MAX_BIAS || s->grammar_len > PD_MSG_MAX_GRAMMAR ||
         (s->n_bias && !s->bias) || (s->grammar_len && !s->grammar)))
        return ks_seterr(eb, KS_ERR_INVAL, "%s: sampling extension out of bounds", name);
    return KS_OK;
}

static void sampling_encode(uint8_t *p, uint32_t mt_off, const pd_msg_sampling *s) {
    pd_store_u32(p + mt_off, s->max_tokens);
    // PD_FLAG_ADAPTER follows the digest: set exactly when one is given
    pd_store_u32(p + 12, (s->flags & ~(uint32_t)PD_FLAG_ADAPTER) |
                             (adapter_set(s) ? (uint32_t)PD_FLAG_ADAPTER : 0u));
    pd_store_u64(p + 48, s->seed);
    store_f32(p + 56, s->temperature);
    store_f32(p + 60, s->top_p);
    store_f32(p + 64, s->min_p);
    pd_store_u32(p + 68, (uint32_t)s->top_k);
    pd_store_u32(p + 72, (uint32_t)s->n_probs);
}

ks_err pd_msg_admit_decode(const uint8_t *p, uint32_t len, pd_msg_admit *out, ks_errbuf *eb) {
    ks_err e = want_min("ADMIT", len, PD_MSG_ADMIT_FIXED, eb);
    if (e) return e;
    uint8_t digest[PD_MSG_ADAPTER_BYTES];
    {
        pd_msg_sampling t;
        if ((e = adapter_trailer("ADMIT", p, len, PD_MSG_ADMIT_FIXED, &t, &len, eb))) return e;
        memcpy(digest, t.adapter, sizeof digest);
    }
    if (!(pd_load_u32(p + 12) & PD_FLAG_EXT) && (e = want_len("ADMIT", len, PD_MSG_ADMIT_FIXED, eb)))
        return e;
    pd_msg_admit m;
    m.n_prompt = pd_load_u32(p);
    if (m.n_prompt < 1) return PROTO("ADMIT: n_prompt is 0");
    m.prefill_worker_id = pd_load_u32(p + 8);
    memcpy(m.domain_hash, p + 16, PD_MSG_HASH_BYTES);
    memcpy(m.model_id, p + 80, PD_MSG_HASH_BYTES);
    if ((e = sampling_decode("ADMIT", p, 4, true, &m.s, eb))) return e;
    if ((m.s.flags & PD_FLAG_EXT) &&
        (e = sext_decode("ADMIT", p + PD_MSG_ADMIT_FIXED, len - PD_MSG_ADMIT_FIXED, &m.s, eb)))
        return e;
    memcpy(m.s.adapter, digest, sizeof digest);
    *out = m;
    return KS_OK;
}

ks_err pd_msg_admit_encode(const pd_msg_admit *m, uint8_t *buf, size_t cap, uint32_t *out_len,
                           ks_errbuf *eb) {
    ks_err ret = sext_pre("ADMIT", &m->s, eb);
    if (ret) return ret;
    if (enc_begin(PD_MSG_ADMIT_FIXED + pd_msg_sext_size(&m->s), buf, cap, out_len, &ret, "ADMIT", eb))
        return ret;
    pd_store_u32(buf, m->n_prompt);
    pd_store_u32(buf + 8, m->prefill_worker_id);
    memcpy(buf + 16, m->domain_hash, PD_MSG_HASH_BYTES);
    sampling_encode(buf, 4, &m->s);
    memcpy(buf + 80, m->model_id, PD_MSG_HASH_BYTES);
    if (m->s.flags & PD_FLAG_EXT) sext_encode(buf + PD_MSG_ADMIT_FIXED, &m->s);
    if (adapter_set(&m->s))
        memcpy(buf + *out_len - PD_MSG_ADAPTER_BYTES, m->s.adapter, PD_MSG_ADAPTER_BYTES);
    pd_msg_admit chk;
    ks_errbuf tmp;
    return enc_check(pd_msg_admit_decode(buf, *out_len, &chk, &tmp), &tmp, eb);
}

uint64_t pd_msg_grant_size(uint32_t n_pages) {
    return PD_MSG_GRANT_FIXED + (uint64_t)PD_MSG_GRANT_ENTRY * n_pages;
}

uint64_t pd_msg_grant_size_ucx(uint32_t n_pages, uint32_t key_len) {
    return pd_msg_grant_size(n_pages) + (key_len ? 16u + (uint64_t)key_len : 0u);
}

pd_msg_grant_entry pd_msg_grant_entry_at(const pd_msg_grant *g, uint32_t i) {
    const uint8_t *q = g->entries + (size_t)PD_MSG_GRANT_ENTRY * i;
    pd_msg_grant_entry en;
    en.page_id = pd_load_u32(q);
    en.first_token = pd_load_u32(q + 4);
    en.n_tokens = pd_load_u32(q + 8);
    en.gen = pd_load_u64(q + 16);
    return en;
}

/* The layout part of GRANT: fixed part, bound, len == 32 + 24 n_pages. */
static ks_err grant_layout(const char *name, const uint8_t *p, uint32_t len, ks_errbuf *eb) {
    ks_err e = want_min(name, len, PD_MSG_GRANT_FIXED, eb);
    if (e) return e;
    if (len > PD_MSG_GRANT_MAX)
        return PROTO("%s: payload is %u bytes, over the %u-byte bound", name, len,
                     PD_MSG_GRANT_MAX);
    uint32_t n_pages = pd_load_u32(p + 24), key_len = pd_load_u32(p + 28);
    if (key_len > PD_MSG_UCX_KEY_MAX)
        return PROTO("%s: ucx_key_len %u exceeds %u", name, key_len, PD_MSG_UCX_KEY_MAX);
    return want_var(name, "n_pages and ucx_key_len", len, PD_MSG_GRANT_FIXED,
                    pd_msg_grant_size_ucx(n_pages, key_len) - PD_MSG_GRANT_FIXED, eb);
}

ks_err pd_msg_grant_decode(const uint8_t *p, uint32_t len, pd_msg_grant *out, ks_errbuf *eb) {
    ks_err e = grant_layout("GRANT", p, len, eb);
    if (e) return e;
    pd_msg_grant g;
    g.seq_uid = pd_load_u64(p);
    g.link_epoch = pd_load_u64(p + 8);
    g.n_prompt = pd_load_u32(p + 16);
    g.page_tokens = pd_load_u32(p + 20);
    g.n_pages = pd_load_u32(p + 24);
    memcpy(g.model_id, p + 32, PD_MSG_HASH_BYTES);
    g.entries = p + PD_MSG_GRANT_FIXED;
    g.ucx_key_len = pd_load_u32(p + 28);
    g.ucx_addr = g.ucx_len = 0;
    g.ucx_key = NULL;
    if (g.ucx_key_len) {
        const uint8_t *t = g.entries + (size_t)PD_MSG_GRANT_ENTRY * g.n_pages;
        g.ucx_addr = pd_load_u64(t);
        g.ucx_len = pd_load_u64(t + 8);
        g.ucx_key = t + 16;
        if (g.ucx_len == 0) return PROTO("GRANT: a UCX key for an empty staging area");
    }
    if (g.link_epoch == 0) return PROTO("GRANT: link_epoch is 0");
    if (g.n_prompt < 1) return PROTO("GRANT: n_prompt is 0");
    if (g.page_tokens < 1) return PROTO("GRANT: page_tokens is 0");
    uint64_t want = ((uint64_t)g.n_prompt + g.page_tokens - 1) / g.page_tokens;
    if (g.n_pages < want)
        return PROTO("GRANT: n_pages %u but ceil(n_prompt %u / page_tokens %u) is %llu",
                     g.n_pages, g.n_prompt, g.page_tokens, (unsigned long long)want);
    g.n_state = g.n_pages - (uint32_t)want;
    for (uint32_t i = (uint32_t)want; i < g.n_pages; i++) { // the recurrent state's pages
        pd_msg_grant_entry en = pd_msg_grant_entry_at(&g, i);
        if (en.first_token != PD_MSG_STATE_PAGE || en.n_tokens != g.page_tokens)
            return PROTO("GRANT: page %u past the prompt's %llu is not a state page (first_token "
                         "%u, n_tokens %u)",
                         i, (unsigned long long)want, en.first_token, en.n_tokens);
    }
    for (uint32_t i = 0; i < (uint32_t)want; i++) {
        pd_msg_grant_entry en = pd_msg_grant_entry_at(&g, i);
        uint64_t first = (uint64_t)i * g.page_tokens; /* < n_prompt since i < n_pages */
        uint64_t end = (uint64_t)en.first_token + en.n_tokens;
        if (en.first_token != first)
            return PROTO("GRANT: page %u has first_token %u, expected %llu", i, en.first_token,
                         (unsigned long long)first);
        if (end > g.n_prompt)
            return PROTO("GRANT: page %u covers tokens [%u, %llu) but n_prompt is %u", i,
                         en.first_token, (unsigned long long)end, g.n_prompt);
        uint64_t n_want = g.n_prompt - first < g.page_tokens ? g.n_prompt - first : g.page_tokens;
        if (en.n_tokens != n_want)
            return PROTO("GRANT: page %u covers tokens [%u, %llu), expected [%u, %llu)", i,
                         en.first_token, (unsigned long long)end, en.first_token,
                         (unsigned long long)(first + n_want));
    }
    *out = g;
    return KS_OK;
}

ks_err pd_msg_grant_encode(const pd_msg_grant *m, const pd_msg_grant_entry *entries,
                           uint8_t *buf, size_t cap, uint32_t *out_len, ks_errbuf *eb) {
    if (m->ucx_key_len > PD_MSG_UCX_KEY_MAX)
        return ks_seterr(eb, KS_ERR_INVAL, "GRANT: ucx_key_len %u exceeds %u", m->ucx_key_len,
                         PD_MSG_UCX_KEY_MAX);
    uint64_t size = pd_msg_grant_size_ucx(m->n_pages, m->ucx_key_len);
    if (size > PD_MSG_GRANT_MAX)
        return ks_seterr(eb, KS_ERR_INVAL, "GRANT: %u pages exceed the %u-byte bound",
                         m->n_pages, PD_MSG_GRANT_MAX);
    ks_err ret;
    if (enc_begin(size, buf, cap, out_len, &ret, "GRANT", eb)) return ret;
    pd_store_u64(buf, m->seq_uid);
    pd_store_u64(buf + 8, m->link_epoch);
    pd_store_u32(buf + 16, m->n_prompt);
    pd_store_u32(buf + 20, m->page_tokens);
    pd_store_u32(buf + 24, m->n_pages);
    memcpy(buf + 32, m->model_id, PD_MSG_HASH_BYTES);
    for (uint32_t i = 0; i < m->n_pages; i++) {
        uint8_t *q = buf + PD_MSG_GRANT_FIXED + (size_t)PD_MSG_GRANT_ENTRY * i;
        pd_store_u32(q, entries[i].page_id);
        pd_store_u32(q + 4, entries[i].first_token);
        pd_store_u32(q + 8, entries[i].n_tokens);
        pd_store_u64(q + 16, entries[i].gen);
    }
    pd_store_u32(buf + 28, m->ucx_key_len);
    if (m->ucx_key_len) {
        uint8_t *t = buf + pd_msg_grant_size(m->n_pages);
        pd_store_u64(t, m->ucx_addr);
        pd_store_u64(t + 8, m->ucx_len);
        memcpy(t + 16, m->ucx_key, m->ucx_key_len);
    }
    pd_msg_grant chk;
    ks_errbuf tmp;
    return enc_check(pd_msg_grant_decode(buf, *out_len, &chk, &tmp), &tmp, eb);
}

static const char *deny_name(uint32_t r) {
    switch (r) {
    case PD_DENY_NOSPACE: return "NOSPACE";
    case PD_DENY_NO_LINK: return "NO_LINK";
    case PD_DENY_CONTEXT: return "CONTEXT";
    case PD_DENY_DUPLICATE: return "DUPLICATE";
    case PD_DENY_DRAINING: return "DRAINING";
    case PD_DENY_INVALID: return "INVALID";
    case PD_DENY_MODEL: return "MODEL";
    default: return NULL;
    }
}

ks_err pd_msg_deny_decode(const uint8_t *p, uint32_t len, pd_msg_deny *out, ks_errbuf *eb) {
    pd_msg_deny m;
    ks_err e = text_decode("DENY", p, len, 8, 4, &m.msg, &m.msg_len, eb);
    if (e) return e;
    m.reason = pd_load_u32(p);
    if (!deny_name(m.reason)) return PROTO("DENY: reason %u out of range [1, 7]", m.reason);
    *out = m;
    return KS_OK;
}

ks_err pd_msg_deny_encode(const pd_msg_deny *m, uint8_t *buf, size_t cap, uint32_t *out_len,
                          ks_errbuf *eb) {
    ks_err ret = text_pre("DENY", m->msg_len, eb);
    if (ret) return ret;
    if (enc_begin(8u + m->msg_len, buf, cap, out_len, &ret, "DENY", eb)) return ret;
    pd_store_u32(buf, m->reason);
    pd_store_u32(buf + 4, m->msg_len);
    if (m->msg_len) memcpy(buf + 8, m->msg, m->msg_len);
    pd_msg_deny chk;
    ks_errbuf tmp;
    return enc_check(pd_msg_deny_decode(buf, *out_len, &chk, &tmp), &tmp, eb);
}

uint64_t pd_msg_prefill_size(uint32_t grant_len, uint32_t n_prompt) {
    return PD_MSG_PREFILL_FIXED + (uint64_t)grant_len + 4u * (uint64_t)n_prompt;
}

int32_t pd_msg_prefill_token(const pd_msg_prefill *p, uint32_t i) {
    return (int32_t)pd_load_u32(p->tokens + 4u * (size_t)i);
}

ks_err pd_msg_prefill_decode(const uint8_t *p, uint32_t len, pd_msg_prefill *out,
                             ks_errbuf *eb) {
    ks_err e = want_min("PREFILL", len, PD_MSG_PREFILL_FIXED, eb);
    if (e) return e;
    if (len > PD_MSG_PREFILL_MAX)
        return PROTO("PREFILL: payload is %u bytes, over the %u-byte bound", len,
                     PD_MSG_PREFILL_MAX);
    pd_msg_prefill m;
    uint8_t digest[PD_MSG_ADAPTER_BYTES];
    {
        pd_msg_sampling t;
        if ((e = adapter_trailer("PREFILL", p, len, PD_MSG_PREFILL_FIXED, &t, &len, eb))) return e;
        memcpy(digest, t.adapter, sizeof digest);
    }
    m.decode_worker_id = pd_load_u32(p);
    m.n_prompt = pd_load_u32(p + 4);
    m.grant_len = pd_load_u32(p + 76);
    const uint64_t body = (uint64_t)m.grant_len + 4u * (uint64_t)m.n_prompt;
    const bool ext = (pd_load_u32(p + 12) & PD_FLAG_EXT) != 0;
    if (!ext &&
        (e = want_var("PREFILL", "grant_len and n_prompt", len, PD_MSG_PREFILL_FIXED, body, eb)))
        return e;
    if (ext && (uint64_t)len < PD_MSG_PREFILL_FIXED + body)
        return PROTO("PREFILL: grant_len and n_prompt imply at least %llu payload bytes but len "
                     "is %u",
                     (unsigned long long)(PD_MSG_PREFILL_FIXED + body), len);
    m.grant = p + PD_MSG_PREFILL_FIXED;
    m.tokens = m.grant + m.grant_len;
    if ((e = grant_layout("PREFILL: grant", m.grant, m.grant_len, eb))) return e;
    memcpy(m.domain_hash, p + 16, PD_MSG_HASH_BYTES);
    if ((e = sampling_decode("PREFILL", p, 8, false, &m.s, eb))) return e;
    if (ext && (e = sext_decode("PREFILL", p + PD_MSG_PREFILL_FIXED + body,
                                len - (PD_MSG_PREFILL_FIXED + body), &m.s, eb)))
        return e;
    memcpy(m.s.adapter, digest, sizeof digest);
    *out = m;
    return KS_OK;
}

ks_err pd_msg_prefill_grant(const pd_msg_prefill *p, pd_msg_grant *out, ks_errbuf *eb) {
    ks_errbuf tmp;
    pd_msg_grant g;
    if (pd_msg_grant_decode(p->grant, p->grant_len, &g, &tmp))
        return PROTO("PREFILL: grant: %s", tmp.msg);
    if (g.n_prompt != p->n_prompt)
        return PROTO("PREFILL: n_prompt %u but its grant covers %u tokens", p->n_prompt,
                     g.n_prompt);
    *out = g;
    return KS_OK;
}

ks_err pd_msg_prefill_encode(const pd_msg_prefill *m, const int32_t *tokens, uint8_t *buf,
                             size_t cap, uint32_t *out_len, ks_errbuf *eb) {
    uint64_t size = pd_msg_prefill_size(m->grant_len, m->n_prompt) + pd_msg_sext_size(&m->s);
    ks_err ret = sext_pre("PREFILL", &m->s, eb);
    if (ret) return ret;
    if (size > PD_MSG_PREFILL_MAX)
        return ks_seterr(eb, KS_ERR_INVAL, "PREFILL: %llu bytes exceed the %u-byte bound",
                         (unsigned long long)size, PD_MSG_PREFILL_MAX);
    if (enc_begin(size, buf, cap, out_len, &ret, "PREFILL", eb)) return ret;
    pd_store_u32(buf, m->decode_worker_id);
    pd_store_u32(buf + 4, m->n_prompt);
    memcpy(buf + 16, m->domain_hash, PD_MSG_HASH_BYTES);
    sampling_encode(buf, 8, &m->s);
    pd_store_u32(buf + 76, m->grant_len);
    if (m->grant_len) memcpy(buf + PD_MSG_PREFILL_FIXED, m->grant, m->grant_len);
    uint8_t *t = buf + PD_MSG_PREFILL_FIXED + m->grant_len;
    for (uint32_t i = 0; i < m->n_prompt; i++) pd_store_u32(t + 4u * (size_t)i, (uint32_t)tokens[i]);
    if (m->s.flags & PD_FLAG_EXT) sext_encode(t + 4u * (size_t)m->n_prompt, &m->s);
    if (adapter_set(&m->s))
        memcpy(buf + *out_len - PD_MSG_ADAPTER_BYTES, m->s.adapter, PD_MSG_ADAPTER_BYTES);
    pd_msg_prefill chk;
    ks_errbuf tmp;
    return enc_check(pd_msg_prefill_decode(buf, *out_len, &chk, &tmp), &tmp, eb);
}

// ----------------------------------------------------------------------------
// REJECT, ABORT, ABORT_ACK, TOKEN, FINISH

ks_err pd_msg_reject_decode(const uint8_t *p, uint32_t len, pd_msg_reject *out,
                            ks_errbuf *eb) {
    pd_msg_reject m;
    ks_err e = text_decode("REJECT", p, len, 12, 8, &m.msg, &m.msg_len, eb);
    if (e) return e;
    m.reason = pd_load_u32(p);
    if (!admit_reason_on_wire(m.reason))
        return PROTO("REJECT: reason %u is not one that crosses the wire", m.reason);
    *out = m;
    return KS_OK;
}

ks_err pd_msg_reject_encode(const pd_msg_reject *m, uint8_t *buf, size_t cap,
                            uint32_t *out_len, ks_errbuf *eb) {
    ks_err ret = text_pre("REJECT", m->msg_len, eb);
    if (ret) return ret;
    if (enc_begin(12u + m->msg_len, buf, cap, out_len, &ret, "REJECT", eb)) return ret;
    pd_store_u32(buf, m->reason);
    pd_store_u32(buf + 4, 0);
    pd_store_u32(buf + 8, m->msg_len);
    if (m->msg_len) memcpy(buf + 12, m->msg, m->msg_len);
    pd_msg_reject chk;
    ks_errbuf tmp;
    return enc_check(pd_msg_reject_decode(buf, *out_len, &chk, &tmp), &tmp, eb);
}

ks_err pd_msg_abort_decode(const uint8_t *p, uint32_t len, pd_msg_abort *out, ks_errbuf *eb) {
    ks_err e = want_len("ABORT", len, 4, eb);
    if (e) return e;
    uint32_t r = pd_load_u32(p);
    if (r < PD_ABORT_CLIENT_GONE || r > PD_ABORT_STOP)
        return PROTO("ABORT: reason %u out of range [1, 6]", r);
    out->reason = r;
    return KS_OK;
}

ks_err pd_msg_abort_encode(const pd_msg_abort *m, uint8_t *buf, size_t cap, uint32_t *out_len,
                           ks_errbuf *eb) {
    ks_err ret;
    if (enc_begin(4, buf, cap, out_len, &ret, "ABORT", eb)) return ret;
    pd_store_u32(buf, m->reason);
    pd_msg_abort chk;
    ks_errbuf tmp;
    return enc_check(pd_msg_abort_decode(buf, 4, &chk, &tmp), &tmp, eb);
}

ks_err pd_msg_abort_ack_decode(const uint8_t *payload, uint32_t len, ks_errbuf *eb) {
    (void)payload;
    return want_len("ABORT_ACK", len, 0, eb);
}

/* {u32 n_top at n_off} then n_top pairs after `fixed` bytes. */
static ks_err top_decode(const char *name, const uint8_t *p, uint32_t len, uint32_t fixed,
                         uint32_t n_off, uint32_t *n_top, ks_errbuf *eb) {
    ks_err e = want_min(name, len, fixed, eb);
    if (e) return e;
    uint32_t n = pd_load_u32(p + n_off);
    if (n > PD_MSG_MAX_TOP) return PROTO("%s: n_top %u exceeds %u", name, n, PD_MSG_MAX_TOP);
    if ((e = want_var(name, "n_top", len, fixed, 8u * (uint64_t)n, eb))) return e;
    *n_top = n;
    return KS_OK;
}

static ks_err top_pre(const char *name, uint32_t n_top, ks_errbuf *eb) {
    if (n_top > PD_MSG_MAX_TOP)
        return ks_seterr(eb, KS_ERR_INVAL, "%s: n_top %u exceeds %u", name, n_top,
                         PD_MSG_MAX_TOP);
    return KS_OK;
}

ks_err pd_msg_token_decode(const uint8_t *p, uint32_t len, pd_msg_token *out, ks_errbuf *eb) {
    pd_msg_token m;
    ks_err e = top_decode("TOKEN", p, len, 12, 8, &m.n_top, eb);
    if (e) return e;
    m.token = (int32_t)pd_load_u32(p);
    m.logprob = load_f32(p + 4);
    m.top = p + 12;
    *out = m;
    return KS_OK;
}

ks_err pd_msg_token_encode(const pd_msg_token *m, const pd_msg_top *top, uint8_t *buf,
                           size_t cap, uint32_t *out_len, ks_errbuf *eb) {
    ks_err ret = top_pre("TOKEN", m->n_top, eb);
    if (ret) return ret;
    if (enc_begin(12u + 8u * m->n_top, buf, cap, out_len, &ret, "TOKEN", eb)) return ret;
    pd_store_u32(buf, (uint32_t)m->token);
    store_f32(buf + 4, m->logprob);
    pd_store_u32(buf + 8, m->n_top);
    store_top(buf + 12, top, m->n_top);
    return KS_OK;
}

ks_err pd_msg_finish_decode(const uint8_t *p, uint32_t len, pd_msg_finish *out,
                            ks_errbuf *eb) {
    pd_msg_finish m;
    ks_err e = text_decode("FINISH", p, len, 28, 20, &m.msg, &m.msg_len, eb);
    if (e) return e;
    m.finish = pd_load_u32(p);
    m.n_prompt = pd_load_u32(p + 4);
    m.n_gen = pd_load_u32(p + 8);
    m.err = pd_load_u32(p + 12);
    m.n_cached = pd_load_u32(p + 16);
    m.reason = pd_load_u32(p + 24);
    if (m.reason != 0 && !admit_reason_on_wire(m.reason))
        return PROTO("FINISH: reason %u is neither 0 nor one that crosses the wire", m.reason);
    if (m.n_cached > m.n_prompt)
        return PROTO("FINISH: n_cached %u exceeds n_prompt %u", m.n_cached, m.n_prompt);
    if (m.finish < PD_FINISH_STOP || m.finish > PD_FINISH_ERROR)
        return PROTO("FINISH: finish %u out of range [1, 4]", m.finish);
    if (m.err >= (uint32_t)KS_ERR__COUNT)
        return PROTO("FINISH: err %u is not a ks_err value", m.err);
    if (m.err != 0 && (m.finish == PD_FINISH_STOP || m.finish == PD_FINISH_LENGTH))
        return PROTO("FINISH: err %u with finish %s (must be 0)", m.err,
                     m.finish == PD_FINISH_STOP ? "STOP" : "LENGTH");
    if (m.reason != 0 && (m.finish == PD_FINISH_STOP || m.finish == PD_FINISH_LENGTH))
        return PROTO("FINISH: reason %u with finish %s (must be 0)", m.reason,
                     m.finish == PD_FINISH_STOP ? "STOP" : "LENGTH");
    *out = m;
    return KS_OK;
}

ks_err pd_msg_finish_encode(const pd_msg_finish *m, uint8_t *buf, size_t cap,
                            uint32_t *out_len, ks_errbuf *eb) {
    ks_err ret = text_pre("FINISH", m->msg_len, eb);
    if (ret) return ret;
    if (enc_begin(28u + m->msg_len, buf, cap, out_len, &ret, "FINISH", eb)) return ret;
    pd_store_u32(buf, m->finish);
    pd_store_u32(buf + 4, m->n_prompt);
    pd_store_u32(buf + 8, m->n_gen);
    pd_store_u32(buf + 12, m->err);
    pd_store_u32(buf + 16, m->n_cached);
    pd_store_u32(buf + 20, m->msg_len);
    pd_store_u32(buf + 24, m->reason);
    if (m->msg_len) memcpy(buf + 28, m->msg, m->msg_len);
    pd_msg_finish chk;
    ks_errbuf tmp;
    return enc_check(pd_msg_finish_decode(buf, *out_len, &chk, &tmp), &tmp, eb);
}

// ----------------------------------------------------------------------------
// KV_PAGE header, DONE

ks_err pd_msg_kv_page_decode(const uint8_t *p, uint32_t prefix_len, uint32_t frame_len,
                             const kv_geom *g, pd_msg_kv_page *out, ks_errbuf *eb) {
    if (prefix_len < PD_MSG_KV_PAGE_HDR)
        return PROTO("KV_PAGE: page header is %u bytes, expected %u", prefix_len,
                     PD_MSG_KV_PAGE_HDR);
    if (g->n_layer <= 0 || g->kv_dim <= 0 || g->page_tokens <= 0 || kv_row_bytes(g) == 0 ||
        g->planes < 0 || g->planes > 2)
        return PROTO("KV_PAGE: link has no valid geometry");
    pd_msg_kv_page m;
    m.page_index = pd_load_u32(p);
    m.page_id = pd_load_u32(p + 4);
    m.tag_seq_uid = pd_load_u64(p + 8);
    m.tag_gen = pd_load_u64(p + 16);
    m.n_rows = pd_load_u32(p + 24);
    m.layer_first = pd_load_u32(p + 28);
    m.layer_count = pd_load_u32(p + 32);
    if (m.n_rows < 1 || m.n_rows > (uint32_t)g->page_tokens)
        return PROTO("KV_PAGE: n_rows %u out of range [1, %d]", m.n_rows, g->page_tokens);
    if (m.layer_count < 1) return PROTO("KV_PAGE: layer_count is 0");
    if ((uint64_t)m.layer_first + m.layer_count > (uint64_t)g->n_layer)
        return PROTO("KV_PAGE: layers [%u, %llu) exceed n_layer %d", m.layer_first,
                     (unsigned long long)((uint64_t)m.layer_first + m.layer_count), g->n_layer);
    uint64_t want = pd_msg_kv_page_len(g, m.n_rows, m.layer_count);
    int np = kv_geom_planes(g);
    if (frame_len != want) {
        // the sender's pages have the other plane count: say so, it is a deployment error
        kv_geom other = *g;
        other.planes = 3 - np;
        if (frame_len == pd_msg_kv_page_len(&other, m.n_rows, m.layer_count))
            return PROTO("KV_PAGE: len %u fits pages of %s per layer, but this link's pages have "
                         "%s: %u layers x %s x %u rows x %zu bytes need %llu",
                         frame_len, planes_name(3 - np), planes_name(np), m.layer_count,
                         planes_name(np), m.n_rows, kv_row_bytes(g), (unsigned long long)want);
        return PROTO("KV_PAGE: len %u but %u layers x %s x %u rows x kv_dim %d (%s, %zu bytes a "
                     "row) need %llu",
                     frame_len, m.layer_count, planes_name(np), m.n_rows, g->kv_dim,
                     kv_type_name(g->kv_type), kv_row_bytes(g), (unsigned long long)want);
    }
    *out = m;
    return KS_OK;
}

ks_err pd_msg_kv_page_encode(const pd_msg_kv_page *m, const kv_geom *g, uint8_t *buf,
                             size_t cap, uint32_t *out_len, ks_errbuf *eb) {
    ks_err ret;
    if (enc_begin(PD_MSG_KV_PAGE_HDR, buf, cap, out_len, &ret, "KV_PAGE", eb)) return ret;
    pd_store_u32(buf, m->page_index);
    pd_store_u32(buf + 4, m->page_id);
    pd_store_u64(buf + 8, m->tag_seq_uid);
    pd_store_u64(buf + 16, m->tag_gen);
    pd_store_u32(buf + 24, m->n_rows);
    pd_store_u32(buf + 28, m->layer_first);
    pd_store_u32(buf + 32, m->layer_count);
    uint64_t full = pd_msg_kv_page_len(g, m->n_rows, m->layer_count);
    if (full > PD_MSG_MAX_FRAME)
        return ks_seterr(eb, KS_ERR_INVAL, "KV_PAGE: %llu bytes exceed the frame maximum",
                         (unsigned long long)full);
    pd_msg_kv_page chk;
    ks_errbuf tmp;
    return enc_check(pd_msg_kv_page_decode(buf, PD_MSG_KV_PAGE_HDR, (uint32_t)full, g, &chk,
                                           &tmp),
                     &tmp, eb);
}

static bool done_adapter_set(const pd_msg_done *m) {
    uint8_t any = 0;
    for (size_t i = 0; i < sizeof m->adapter; i++) any |= m->adapter[i];
    return any != 0;
}

ks_err pd_msg_done_decode(const uint8_t *p, uint32_t len, pd_msg_done *out, ks_errbuf *eb) {
    pd_msg_done m;
    ks_err e = want_min("DONE", len, 32, eb);
    if (e) return e;
    const uint32_t flags = pd_load_u32(p + 28);
    if (flags & ~(uint32_t)PD_DONE_ADAPTER) return PROTO("DONE: unknown flags 0x%x", flags);
    memset(m.adapter, 0, sizeof m.adapter);
    uint32_t body = len; // the payload without the adapter trailer
    if (flags & PD_DONE_ADAPTER) {
        if (len < 32u + PD_MSG_ADAPTER_BYTES)
            return PROTO("DONE: PD_DONE_ADAPTER but %u payload bytes leave no room for the "
                         "digest", len);
        body = len - PD_MSG_ADAPTER_BYTES;
        memcpy(m.adapter, p + body, PD_MSG_ADAPTER_BYTES);
        if (!done_adapter_set(&m)) return PROTO("DONE: PD_DONE_ADAPTER with an all-zero digest");
    }
    if ((e = top_decode("DONE", p, body, 32, 12, &m.n_top, eb))) return e;
    m.covered = pd_load_u32(p);
    m.first_token = (int32_t)pd_load_u32(p + 4);
    m.logprob = load_f32(p + 8);
    m.rng_state = pd_load_u64(p + 16);
    m.cached = pd_load_u32(p + 24);
    if (m.cached > m.covered) return PROTO("DONE: cached %u exceeds covered %u", m.cached, m.covered);
    m.top = p + 32;
    *out = m;
    return KS_OK;
}

ks_err pd_msg_done_encode(const pd_msg_done *m, const pd_msg_top *top, uint8_t *buf,
                          size_t cap, uint32_t *out_len, ks_errbuf *eb) {
    ks_err ret = top_pre("DONE", m->n_top, eb);
    if (ret) return ret;
    if (m->cached > m->covered)
        return ks_seterr(eb, KS_ERR_INVAL, "DONE: cached %u exceeds covered %u", m->cached,
                         m->covered);
    const bool ad = done_adapter_set(m);
    const uint32_t body = 32u + 8u * m->n_top;
    if (enc_begin(body + (ad ? PD_MSG_ADAPTER_BYTES : 0u), buf, cap, out_len, &ret, "DONE", eb))
        return ret;
    pd_store_u32(buf, m->covered);
    pd_store_u32(buf + 4, (uint32_t)m->first_token);
    store_f32(buf + 8, m->logprob);
    pd_store_u32(buf + 12, m->n_top);
    pd_store_u64(buf + 16, m->rng_state);
    pd_store_u32(buf + 24, m->cached);
    pd_store_u32(buf + 28, ad ? (uint32_t)PD_DONE_ADAPTER : 0u);
    store_top(buf + 32, top, m->n_top);
    if (ad) memcpy(buf + body, m->adapter, PD_MSG_ADAPTER_BYTES);
    return KS_OK;
}

// ----------------------------------------------------------------------------
// Embeddings: EMBED, EMBED_RESULT

int32_t pd_msg_embed_token(const pd_msg_embed *m, uint32_t i) {
    return (int32_t)pd_load_u32(m->tokens + 4u * (size_t)i);
}

float pd_msg_embed_value(const pd_msg_embed_result *m, uint32_t i) {
    return load_f32(m->vec + 4u * (size_t)i);
}

ks_err pd_msg_embed_decode(const uint8_t *p, uint32_t len, pd_msg_embed *out, ks_errbuf *eb) {
    ks_err e = want_min("EMBED", len, PD_MSG_EMBED_FIXED, eb);
    if (e) return e;
    pd_msg_embed m;
    m.pooling = pd_load_u32(p);
    m.n_tokens = pd_load_u32(p + 4);
    if (m.n_tokens < 1) return PROTO("EMBED: n_tokens is 0");
    if ((e = want_var("EMBED", "n_tokens", len, PD_MSG_EMBED_FIXED, 4ull * m.n_tokens, eb)))
        return e;
    if (m.pooling != 0 && m.pooling != 1 && m.pooling != 3)
        return PROTO("EMBED: pooling %u is not 0 (the worker's), 1 (mean) or 3 (last)", m.pooling);
    memcpy(m.domain_hash, p + 8, PD_MSG_HASH_BYTES);
    m.tokens = p + PD_MSG_EMBED_FIXED;
    *out = m;
    return KS_OK;
}

ks_err pd_msg_embed_encode(const pd_msg_embed *m, const int32_t *tokens, uint8_t *buf, size_t cap,
                           uint32_t *out_len, ks_errbuf *eb) {
    ks_err ret;
    uint64_t size = PD_MSG_EMBED_FIXED + 4ull * m->n_tokens;
    if (size > PD_MSG_EMBED_MAX)
        return ks_seterr(eb, KS_ERR_INVAL, "EMBED: %u tokens exceed the frame bound", m->n_tokens);
    if (enc_begin(size, buf, cap, out_len, &ret, "EMBED", eb)) return ret;
    pd_store_u32(buf, m->pooling);
    pd_store_u32(buf + 4, m->n_tokens);
    memcpy(buf + 8, m->domain_hash, PD_MSG_HASH_BYTES);
    for (uint32_t i = 0; i < m->n_tokens; i++)
        pd_store_u32(buf + PD_MSG_EMBED_FIXED + 4u * (size_t)i, (uint32_t)tokens[i]);
    pd_msg_embed chk;
    ks_errbuf tmp;
    return enc_check(pd_msg_embed_decode(buf, *out_len, &chk, &tmp), &tmp, eb);
}

ks_err pd_msg_embed_result_decode(const uint8_t *p, uint32_t len, pd_msg_embed_result *out,
                                  ks_errbuf *eb) {
    ks_err e = want_min("EMBED_RESULT", len, PD_MSG_EMBED_RESULT_FIXED, eb);
    if (e) return e;
    pd_msg_embed_result m;
    m.n_embd = pd_load_u32(p);
    m.n_tokens = pd_load_u32(p + 4);
    m.pooling = pd_load_u32(p + 8);
    if (m.n_embd < 1 || m.n_embd > PD_MSG_EMBED_MAX_DIM)
        return PROTO("EMBED_RESULT: n_embd %u out of range [1, %u]", m.n_embd,
                     PD_MSG_EMBED_MAX_DIM);
    if ((e = want_var("EMBED_RESULT", "n_embd", len, PD_MSG_EMBED_RESULT_FIXED, 4ull * m.n_embd,
                      eb)))
        return e;
    if (m.n_tokens < 1) return PROTO("EMBED_RESULT: n_tokens is 0");
    if (m.pooling != 1 && m.pooling != 3)
        return PROTO("EMBED_RESULT: pooling %u is not 1 (mean) or 3 (last)", m.pooling);
    m.vec = p + PD_MSG_EMBED_RESULT_FIXED;
    *out = m;
    return KS_OK;
}

ks_err pd_msg_embed_result_encode(const pd_msg_embed_result *m, const float *vec, uint8_t *buf,
                                  size_t cap, uint32_t *out_len, ks_errbuf *eb) {
    ks_err ret;
    if (m->n_embd < 1 || m->n_embd > PD_MSG_EMBED_MAX_DIM)
        return ks_seterr(eb, KS_ERR_INVAL, "EMBED_RESULT: n_embd %u out of range", m->n_embd);
    if (enc_begin(PD_MSG_EMBED_RESULT_FIXED + 4ull * m->n_embd, buf, cap, out_len, &ret,
                  "EMBED_RESULT", eb))
        return ret;
    pd_store_u32(buf, m->n_embd);
    pd_store_u32(buf + 4, m->n_tokens);
    pd_store_u32(buf + 8, m->pooling);
    for (uint32_t i = 0; i < m->n_embd; i++)
        store_f32(buf + PD_MSG_EMBED_RESULT_FIXED + 4u * (size_t)i, vec[i]);
    pd_msg_embed_result chk;
    ks_errbuf tmp;
    return enc_check(pd_msg_embed_result_decode(buf, *out_len, &chk, &tmp), &tmp, eb);
}

// ----------------------------------------------------------------------------
// Prompt logprobs: PROMPT_LP

/* Byte offset of record i in a PROMPT_LP's records. */
static size_t prompt_lp_off(const pd_msg_prompt_lp *m, uint32_t i) {
    return (size_t)i * PD_MSG_PROMPT_LP_RECORD(m->n_top);
}

void pd_msg_prompt_lp_record(const pd_msg_prompt_lp *m, uint32_t i, int32_t *token,
                             float *logprob) {
    const uint8_t *r = m->records + prompt_lp_off(m, i);
    *token = (int32_t)pd_load_u32(r);
    *logprob = load_f32(r + 4);
}

pd_msg_top pd_msg_prompt_lp_top(const pd_msg_prompt_lp *m, uint32_t i, uint32_t k) {
    return pd_msg_top_at(m->records + prompt_lp_off(m, i) + 8, k);
}

ks_err pd_msg_prompt_lp_decode(const uint8_t *p, uint32_t len, pd_msg_prompt_lp *out,
                               ks_errbuf *eb) {
    ks_err e = want_min("PROMPT_LP", len, PD_MSG_PROMPT_LP_FIXED, eb);
    if (e) return e;
    pd_msg_prompt_lp m;
    m.first_pos = pd_load_u32(p);
    m.n_records = pd_load_u32(p + 4);
    m.n_top = pd_load_u32(p + 8);
    m.flags = pd_load_u32(p + 12);
    if (m.n_records > PD_MSG_PROMPT_LP_MAX_RECORDS)
        return PROTO("PROMPT_LP: n_records %u exceeds %u", m.n_records,
                     PD_MSG_PROMPT_LP_MAX_RECORDS);
    if (m.n_top > PD_MSG_MAX_TOP)
        return PROTO("PROMPT_LP: n_top %u exceeds %u", m.n_top, PD_MSG_MAX_TOP);
    if ((e = want_var("PROMPT_LP", "n_records", len, PD_MSG_PROMPT_LP_FIXED,
                      (uint64_t)m.n_records * PD_MSG_PROMPT_LP_RECORD(m.n_top), eb)))
        return e;
    if (m.flags & ~(uint32_t)PD_PROMPT_LP_LAST)
        return PROTO("PROMPT_LP: flags 0x%x has unknown bits", m.flags);
    if (m.first_pos < 1)
        return PROTO("PROMPT_LP: first_pos is 0 (the first prompt token has no logprob)");
    if ((uint64_t)m.first_pos + m.n_records > (uint64_t)INT32_MAX + 1u)
        return PROTO("PROMPT_LP: positions %u + %u out of range", m.first_pos, m.n_records);
    if (m.n_records == 0 && !(m.flags & PD_PROMPT_LP_LAST))
        return PROTO("PROMPT_LP: no records and not the last message");
    m.records = p + PD_MSG_PROMPT_LP_FIXED;
    *out = m;
    return KS_OK;
}

ks_err pd_msg_prompt_lp_encode(const pd_msg_prompt_lp *m, const int32_t *tokens,
                               const float *logprobs, const pd_msg_top *top, uint8_t *buf,
                               size_t cap, uint32_t *out_len, ks_errbuf *eb) {
    ks_err ret = top_pre("PROMPT_LP", m->n_top, eb);
    if (ret) return ret;
    if (m->n_records > PD_MSG_PROMPT_LP_MAX_RECORDS)
        return ks_seterr(eb, KS_ERR_INVAL, "PROMPT_LP: n_records %u exceeds %u", m->n_records,
                         PD_MSG_PROMPT_LP_MAX_RECORDS);
    const uint32_t R = PD_MSG_PROMPT_LP_RECORD(m->n_top);
    if (enc_begin(PD_MSG_PROMPT_LP_FIXED + (uint64_t)m->n_records * R, buf, cap, out_len, &ret,
                  "PROMPT_LP", eb))
        return ret;
    pd_store_u32(buf, m->first_pos);
    pd_store_u32(buf + 4, m->n_records);
    pd_store_u32(buf + 8, m->n_top);
    pd_store_u32(buf + 12, m->flags);
    for (uint32_t i = 0; i < m->n_records; i++) {
        uint8_t *r = buf + PD_MSG_PROMPT_LP_FIXED + (size_t)i * R;
        pd_store_u32(r, (uint32_t)tokens[i]);
        store_f32(r + 4, logprobs[i]);
        if (m->n_top) store_top(r + 8, top + (size_t)i * m->n_top, m->n_top);
    }
    pd_msg_prompt_lp chk;
    ks_errbuf tmp;
    return enc_check(pd_msg_prompt_lp_decode(buf, *out_len, &chk, &tmp), &tmp, eb);
}
