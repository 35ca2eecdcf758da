/* pd.h — prefill/decode disaggregation: the wire framing, the transport
 * interface (with its TCP implementation and epoll loop) and the mutually
 * authenticated TLS 1.3 channel every cluster connection runs in. The protocol logic (admit, page grant, KV page, done,
 * reject, abort...) is layered on top in later sections of this header and
 * is specified in docs/pd-protocol.md.
 *
 * Sections:
 *   1. Wire framing        — the 24-byte frame header, encoder, incremental decoder
 *   2. Transport interface — pd_conn, pd_transport_ops vtable, callbacks, the loop
 *   3. TCP transport       — listen/connect over non-blocking sockets
 *   4. Authentication      — TLS 1.3 with a PSK per connection kind (or, on
 *                            a trusted fabric, the plaintext HELLO/AUTH)
 *
 * Threading: a pd_loop and every pd_conn / pd_listener on it are owned by the
 * thread that runs the loop. Only pd_loop_post and pd_loop_stop may be called
 * from another thread. Callbacks run on the loop thread and never inside the
 * call that registered them (STYLE.md section 6). */
#ifndef KS_PD_H
#define KS_PD_H

#include "kvseal/base.h"

#include <sys/uio.h>

// ----------------------------------------------------------------------------
// 1. Wire framing
//
// A frame is a 24-byte little-endian header followed by `len` payload bytes:
//   off  0  magic    u32 LE  0x4450564b ("KVPD" as bytes on the wire)
//   off  4  ver      u16 LE  1
//   off  6  type     u16 LE  PD_TYPE_*
//   off  8  req_id   u64 LE  request the frame belongs to (0: connection-level)
//   off 16  len      u32 LE  payload bytes, <= the configured maximum
//   off 20  checksum u32 LE  low 32 bits of XXH3-64 (seed 0) over the header with this field
//                            zeroed, then over the payload
// Fields are read with explicit load helpers; no struct is cast over bytes.

#define PD_MAGIC 0x4450564bu
#define PD_VERSION 3u /* 2: min_tokens in the sampling extension (issue 39); 3: the fleet (issue 40) */
#define PD_HDR_BYTES 24u
/* Default maximum payload: one 4 MiB KV page plus a header's worth of
 * per-frame metadata. Checked before any allocation. */
#define PD_MAX_PAYLOAD_DEFAULT ((4u << 20) + PD_HDR_BYTES)
/* Largest payload accepted before authentication (HELLO is 36 bytes). */
#define PD_MAX_PAYLOAD_UNAUTH 64u
/* Most payload iovecs per send / per sink destination (a KV_PAGE of a partial page
 * needs 1 + planes * n_layer, planes = kv_geom_planes: 2 for K and V, 1 for MLA). */
#define PD_MAX_IOV 128

/* Frame types 1 and 2 are the transport's handshake; all others belong to the
 * protocol layer (docs/pd-protocol.md). Append-only. */
#define PD_TYPE_HELLO 1u /* {role u8, reserved[3], nonce[32]} — 36 bytes */
#define PD_TYPE_AUTH 2u  /* {hmac[32]} — 32 bytes */
#define PD_TYPE_FIRST_PROTO 3u
/* type_max[] entry for a type not allowed on a conn (pd_conn_cbs). */
#define PD_TYPE_FORBIDDEN 0xffffffffu

/* A decoded frame header (host byte order). */
typedef struct pd_frame_hdr {
    uint16_t type;     /* PD_TYPE_* */
    uint64_t req_id;   /* request id, 0 for connection-level frames */
    uint32_t len;      /* payload bytes */
    uint32_t checksum; /* as received / as sent */
} pd_frame_hdr;

/* A complete frame as delivered by the decoder or the transport. */
typedef struct pd_frame {
    pd_frame_hdr hdr;
    const uint8_t *payload; /* payload_len bytes, NULL when 0. Owned by the
                               decoder/conn, valid until the callback returns /
                               the next feed */
    uint32_t payload_len;   /* == hdr.len, except for sunk frames: the prefix
                               bytes that were read before the sink was asked */
    bool sunk;              /* true: payload bytes [payload_len, hdr.len) went
                               into the sink's destination (checksum verified) */
} pd_frame;

/* Little-endian load/store helpers; can't fail. */
static inline void pd_store_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void pd_store_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void pd_store_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t pd_load_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t pd_load_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}
static inline uint64_t pd_load_u64(const uint8_t *p) {
    return (uint64_t)pd_load_u32(p) | ((uint64_t)pd_load_u32(p + 4) << 32);
}

/* Computes the frame checksum of a header (its checksum field is treated as
 * zero; hdr is not modified) and a payload given as n_iov iovecs (n_iov may be
 * 0). Can't fail. */
uint32_t pd_frame_checksum(const uint8_t hdr[PD_HDR_BYTES], const struct iovec *payload,
                           int n_iov);

/* Writes the 24-byte header for a frame whose payload is the n_iov iovecs
 * (len and checksum computed here) into hdr. For zero-copy sends: the caller
 * then writev()s {hdr, payload...}. Errors: KS_ERR_INVAL (n_iov out of
 * [0, PD_MAX_IOV], or the payload exceeds max_payload). Doesn't block. */
ks_err pd_frame_encode_hdr(uint8_t hdr[PD_HDR_BYTES] /* OUT */, uint16_t type, uint64_t req_id,
                           const struct iovec *payload, int n_iov, uint32_t max_payload,
                           ks_errbuf *eb) KS_MUST_USE;

/* Encodes a whole frame (header + len payload bytes) into buf[0..cap) and sets
 * *out_len = PD_HDR_BYTES + len. Errors: KS_ERR_INVAL when cap is too small or
 * len exceeds max_payload. Doesn't block. */
ks_err pd_frame_encode(uint8_t *buf, size_t cap, uint16_t type, uint64_t req_id,
                       const void *payload, uint32_t len, uint32_t max_payload,
                       size_t *out_len /* OUT */, ks_errbuf *eb) KS_MUST_USE;

/* Parses and validates a 24-byte header: magic, version, and len against
 * max_payload (in that order, each with its own message). Errors:
 * KS_ERR_PROTO ("bad magic", "unsupported version", "oversize"). */
ks_err pd_hdr_parse(const uint8_t hdr[PD_HDR_BYTES], uint32_t max_payload,
                    pd_frame_hdr *out /* OUT */, ks_errbuf *eb) KS_MUST_USE;

/* Incremental decoder: consumes bytes as they arrive, in any split. */
typedef struct pd_decoder pd_decoder;

/* Creates a decoder that accepts payloads up to max_payload bytes (the
 * payload buffer is allocated only after a header passed the check). Owned by
 * the caller. Errors: KS_ERR_NOMEM. */
ks_err pd_decoder_create(uint32_t max_payload, pd_decoder **out /* OUT */) KS_MUST_USE;
/* Frees the decoder and its payload buffer; accepts NULL. */
void pd_decoder_destroy(pd_decoder *d);
/* Feeds up to n bytes; *consumed says how many were used. Returns KS_OK with
 * *out filled when a frame completed (its payload is owned by the decoder and
 * valid until the next feed), KS_ERR_AGAIN when all n bytes were consumed
 * without completing a frame, KS_ERR_PROTO (bad magic / version / oversize /
 * checksum, with a message) after which the decoder stays failed, or
 * KS_ERR_NOMEM. Never blocks. */
ks_err pd_decoder_feed(pd_decoder *d, const uint8_t *buf, size_t n, size_t *consumed /* OUT */,
                       pd_frame *out /* OUT */, ks_errbuf *eb) KS_MUST_USE;

// ----------------------------------------------------------------------------
// 2. Transport interface
//
// A pd_conn is one authenticated, framed, ordered, reliable byte stream to a
// peer node. The protocol layer talks to it only through pd_conn_* below,
// which dispatch through the transport's pd_transport_ops; an RDMA-capable
// transport supplies its own ops (and registers its completion fd with the
// pd_loop) without changing the protocol layer.

typedef struct pd_loop pd_loop;
typedef struct pd_conn pd_conn;
typedef struct pd_listener pd_listener;

/* The transport vtable. Every op is called on the loop thread. */
typedef struct pd_transport_ops {
    const char *name; /* "tcp" */
    /* Queues one frame {type, req_id, payload iovecs}; done == NULL: see
     * pd_conn_send, else pd_conn_send_borrowed. */
    ks_err (*send_frame)(pd_conn *c, uint16_t type, uint64_t req_id, const struct iovec *payload,
                         int n_iov, void (*done)(void *arg, ks_err e), void *arg, ks_errbuf *eb);
    /* Bytes accepted by send_frame but not yet handed to the network. */
    size_t (*out_pending)(const pd_conn *c);
    /* Stops (false) or resumes (true) delivering frames from this peer. */
    void (*set_read)(pd_conn *c, bool on);
    /* Starts closing (at once, or after the queue is flushed); on_close
     * follows from the loop. */
    void (*close)(pd_conn *c, ks_err why, const char *msg, bool flush);
} pd_transport_ops;

/* Payload sink: called on the loop thread when a frame of a protocol type
 * (>= PD_TYPE_FIRST_PROTO) with len > cbs.sink_prefix has arrived far enough:
 * its header has passed validation and its first cbs.sink_prefix payload
 * bytes (e.g. the 40-byte KV_PAGE page header, docs/pd-protocol.md) are in
 * prefix[0..prefix_len) (prefix_len = sink_prefix; NULL/0 when sink_prefix
 * is 0). Frames with len <= sink_prefix are buffered without asking. To
 * receive the REST of the payload straight into
 * memory of its own (a KV pool page), the upper layer sets up to PD_MAX_IOV
 * destination iovecs whose lengths sum to hdr->len - prefix_len, and *n_iov;
 * the transport reads into them directly (no intermediate copy) and verifies
 * the frame checksum over header + prefix + them. The memory must stay valid
 * until on_frame (sunk=true) or on_sink_fail for this frame. *n_iov = 0 (the
 * default) means "buffer it as usual" (also the way to drop a frame for an
 * unknown request: ignore it in on_frame). Returning an error closes the
 * connection with that error (use KS_ERR_PROTO for a bad page header). */
typedef ks_err (*pd_sink_fn)(pd_conn *c, void *ud, const pd_frame_hdr *hdr,
                             const uint8_t *prefix, uint32_t prefix_len,
                             struct iovec *iov /* OUT, PD_MAX_IOV entries */,
                             int *n_iov /* OUT */);

/* Connection callbacks; all optional except on_close for connects. */
typedef struct pd_conn_cbs {
    /* The handshake succeeded: frames may be sent; peer role is known. */
    void (*on_open)(pd_conn *c, void *ud);
    /* A complete, checksum-verified frame of a protocol type arrived. */
    void (*on_frame)(pd_conn *c, void *ud, const pd_frame *f);
    pd_sink_fn sink;
    uint32_t sink_prefix; /* payload bytes read before sink is called (<= 256) */
    /* Per-type payload bounds, checked on the header before any allocation
     * or payload read (docs/pd-protocol.md section 2, rule 2): type_max[t] is
     * the largest len accepted for type t after authentication, or
     * PD_TYPE_FORBIDDEN; types >= n_types are refused. A violation closes the
     * conn with KS_ERR_PROTO. NULL: only cfg.max_payload applies. The array
     * must outlive the conn. */
    const uint32_t *type_max;
    uint16_t n_types;
    /* Accepted peer roles as a bitmask (1u << role), checked on HELLO; 0 = any. */
    uint32_t peer_roles;
    /* A destination handed out by sink will NOT receive a verified frame
     * (checksum mismatch: why = KS_ERR_PROTO; the connection died mid-payload:
     * why = KS_ERR_PEER_CLOSED / KS_ERR_IO / ...). Its bytes are garbage: the
     * upper layer quarantines/scrubs that page. Called before on_close. */
    void (*on_sink_fail)(pd_conn *c, void *ud, const pd_frame_hdr *hdr, ks_err why);
    /* After send_frame returned KS_ERR_AGAIN: the output queue drained below
     * the low watermark; sending may resume. */
    void (*on_writable)(pd_conn *c, void *ud);
    /* The connection is gone (why, with a message); c is freed after this
     * returns. Called exactly once for every conn returned by pd_tcp_connect
     * and every accepted conn that reached on_open. */
    void (*on_close)(pd_conn *c, void *ud, ks_err why, const char *msg);
} pd_conn_cbs;

/* Loop configuration; zero fields take the defaults. */
typedef struct pd_loop_cfg {
    const uint8_t *secret;   /* shared cluster secret (copied), required */
    size_t secret_len;       /* >= 16 bytes */
    uint8_t role;            /* this node's role: in the TLS PSK identity (or HELLO) */
    bool insecure_plaintext; /* false (default): every conn is TLS 1.3 with a PSK per
                                connection kind (section 4); true: no encryption, only
                                the KVPD v1 HELLO/AUTH membership check, which an
                                on-path relay defeats — a trusted fabric only */
    uint32_t max_payload;    /* default PD_MAX_PAYLOAD_DEFAULT */
    uint32_t auth_timeout_ms;/* handshake must finish within; default 5000 */
    size_t out_high_bytes;   /* send_frame returns AGAIN above; default 16 MiB */
    size_t out_low_bytes;    /* on_writable fires below; default out_high/4 */
} pd_loop_cfg;

/* Counters (loop thread; read them there). */
typedef struct pd_loop_stats {
    uint64_t frames_in, frames_out; /* protocol frames delivered / queued */
    uint64_t bytes_in, bytes_out;   /* wire bytes including headers */
    uint64_t auth_failures;         /* handshakes that failed (bad MAC, wrong
                                       frame, timeout, reflection) */
    uint64_t proto_errors;          /* connections closed with KS_ERR_PROTO */
    uint64_t sink_failures;         /* sink destinations reported failed */
} pd_loop_stats;

/* Creates an epoll loop. Owned by the caller. Errors: KS_ERR_INVAL (no or too
 * short secret), KS_ERR_NOMEM, KS_ERR_IO (epoll/eventfd). */
ks_err pd_loop_create(const pd_loop_cfg *cfg, pd_loop **out /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* Closes every connection and listener (running their on_close), then frees
 * the loop; accepts NULL. Loop thread only. */
void pd_loop_destroy(pd_loop *l);
/* Waits up to timeout_ms (-1: no limit, 0: poll) for events and runs their
 * callbacks, plus posted functions and expired deadlines. Errors: KS_ERR_IO
 * (epoll_wait failed). Blocks. Loop thread only. */
ks_err pd_loop_run_once(pd_loop *l, int timeout_ms) KS_MUST_USE;
/* Runs the loop until pd_loop_stop. Blocks. Errors as pd_loop_run_once. */
ks_err pd_loop_run(pd_loop *l) KS_MUST_USE;
/* Makes pd_loop_run return soon; thread-safe, can't fail. */
void pd_loop_stop(pd_loop *l);
/* Runs fn(arg) on the loop thread during a later iteration; thread-safe.
 * Errors: KS_ERR_NOMEM. */
ks_err pd_loop_post(pd_loop *l, void (*fn)(void *arg), void *arg) KS_MUST_USE;
/* Copies the counters; loop thread; can't fail. */
void pd_loop_stats_get(const pd_loop *l, pd_loop_stats *out /* OUT */);

/* Sends one frame whose payload is the concatenation of n_iov iovecs
 * (0 <= n_iov <= PD_MAX_IOV). Zero-copy when the socket takes it at once;
 * what the kernel doesn't accept is copied into the conn's output queue, so
 * the caller's memory is free again on return. Frames are atomic: all or
 * nothing is queued. Errors: KS_ERR_AGAIN (queue above the high watermark;
 * on_writable follows), KS_ERR_INVAL (reserved type, too big, conn not open),
 * KS_ERR_PEER_CLOSED / KS_ERR_IO (the conn is closing; on_close follows).
 * Never blocks. */
ks_err pd_conn_send(pd_conn *c, uint16_t type, uint64_t req_id, const struct iovec *payload,
                    int n_iov, ks_errbuf *eb) KS_MUST_USE;
/* Zero-copy send: as pd_conn_send, but the payload memory is borrowed, never
 * copied: it must stay valid and unchanged until done(arg, e) runs on the
 * loop thread — e = KS_OK once every byte was handed to the kernel, or the
 * close reason if the conn died first (the peer may have received a prefix).
 * done runs exactly once when this returns KS_OK, never inside this call;
 * on an error return it never runs. For pages the sender keeps pinned for
 * the transfer anyway (a prefill worker's KV pages). Errors as pd_conn_send. */
ks_err pd_conn_send_borrowed(pd_conn *c, uint16_t type, uint64_t req_id,
                             const struct iovec *payload, int n_iov,
                             void (*done)(void *arg, ks_err e), void *arg,
                             ks_errbuf *eb) KS_MUST_USE;
/* Bytes queued but not yet sent; can't fail. */
size_t pd_conn_out_pending(const pd_conn *c);
/* Pauses (false) or resumes (true) reading from the peer; can't fail. */
void pd_conn_set_read(pd_conn *c, bool on);
/* Closes the connection (pending output is dropped); on_close(why=
 * KS_ERR_CANCELLED) follows from the loop. Idempotent; can't fail. */
void pd_conn_close(pd_conn *c);
/* Graceful close: stops reading, sends what is queued (e.g. a last ERROR
 * frame, docs/pd-protocol.md section 2), then closes; on_close(why=
 * KS_ERR_CANCELLED) follows. Further sends fail with KS_ERR_PEER_CLOSED.
 * Can't fail. */
void pd_conn_close_flush(pd_conn *c);
/* The peer's role from its HELLO (valid after on_open); can't fail. */
uint8_t pd_conn_peer_role(const pd_conn *c);
/* A process-unique connection id (for logs); can't fail. */
uint64_t pd_conn_id(const pd_conn *c);
/* "ip:port" of the peer; static per conn, never NULL. */
const char *pd_conn_peer_addr(const pd_conn *c);
/* Per-connection user data passed to callbacks; can't fail. */
void *pd_conn_ud(const pd_conn *c);
/* Replaces the per-connection user data (e.g. in on_open); can't fail. */
void pd_conn_set_ud(pd_conn *c, void *ud);
/* The transport's ops (for logs/tests); never NULL. */
const pd_transport_ops *pd_conn_ops(const pd_conn *c);

// ----------------------------------------------------------------------------
// 3. TCP transport
//
// Sockets are SOCK_NONBLOCK|SOCK_CLOEXEC with TCP_NODELAY; sends use
// MSG_NOSIGNAL; EINTR is retried. A frame's payload is read straight into a
// sink destination when the upper layer provides one (section 2).

/* Listens on host:port ("127.0.0.1", "0.0.0.0", "::", or NULL for any IPv4
 * address; port 0 picks a free port, see pd_listener_port). Accepted conns
 * get cbs/ud and start the handshake at once; they are reported through
 * on_open. Owned by the caller (pd_listener_close) or by the loop at destroy.
 * Errors: KS_ERR_INVAL (bad address), KS_ERR_IO (socket/bind/listen, with
 * strerror). Doesn't block (a numeric host never resolves). Loop thread. */
ks_err pd_tcp_listen(pd_loop *l, const char *host, uint16_t port, const pd_conn_cbs *cbs,
                     void *ud, pd_listener **out /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* The bound port (useful after port 0); can't fail. */
uint16_t pd_listener_port(const pd_listener *ls);
/* Stops listening at once (no callback); accepted conns live on; accepts NULL. */
void pd_listener_close(pd_listener *ls);

/* Starts connecting to host:port; the conn opens (on_open) after the TCP
 * connect and the handshake. cbs.peer_roles names the one role the server
 * must have (TLS: it selects the PSK; 0 means "this loop's own role"), or closes (on_close with KS_ERR_TIMEOUT,
 * KS_ERR_IO, KS_ERR_PROTO...) — timeout_ms bounds the TCP connect, then
 * cfg.auth_timeout_ms the handshake. The conn is owned by the loop and freed
 * after on_close. Errors returned here (no callback follows): KS_ERR_INVAL
 * (address, or more than one role in cbs.peer_roles on a TLS loop), KS_ERR_IO (socket), KS_ERR_NOMEM. A host name is resolved with
 * getaddrinfo, which may block; numeric addresses never do. Loop thread. */
ks_err pd_tcp_connect(pd_loop *l, const char *host, uint16_t port, int timeout_ms,
                      const pd_conn_cbs *cbs, void *ud, pd_conn **out /* OUT */,
                      ks_errbuf *eb) KS_MUST_USE;

// ----------------------------------------------------------------------------
// 4. Authentication and encryption
//
// Default: every conn is TLS 1.3 (OpenSSL libssl) authenticated by an
// external PSK (src/pd/tls.c). A connection from role C to role S uses
//   psk = HKDF-SHA256(ikm = cluster secret, salt = "kvseal-pd-v2",
//                     info = "psk" || C u8 || S u8)
// with the identity "kvseal-pd-v2 C>S". The server accepts an identity only
// when S is its own role and C is in the listener's peer_roles, and takes
// the peer's role from it; the client requires that the server completed the
// handshake with that PSK (no certificates are accepted). Both sides are
// authenticated before the first frame is read, the connection kind (who
// connects to whom) is bound into the key, and every frame is encrypted and
// integrity-protected (AES-128-GCM, or ChaCha20-Poly1305), with ECDHE for
// forward secrecy. A relay can only forward ciphertext between the two
// endpoints of one kind, which gains it nothing.
//
// --insecure-plaintext (cfg.insecure_plaintext) keeps the KVPD v1 handshake
// for a trusted fabric: HELLO {role u8, reserved[3], nonce[32]}, then AUTH
// {mac[32]} with
//   mac = HMAC-SHA256(secret, "kvseal-pd-v1" || dir u8 || sender role u8
//                     || sender nonce[32] || receiver nonce[32])
// (dir = 1 for the connecting side, 2 for the accepting side). It keeps out
// a node with another secret, but an on-path relay can splice two sessions
// (docs/pd-protocol.md section 3; pd/model/handshake.pml, mutant
// V1_HANDSHAKE), and later frames are neither encrypted nor MACed.
// Implemented in src/pd/auth.c.

/* Bytes of a connection kind's PSK. */
#define PD_PSK_BYTES 32u

/* Derives the PSK of connections from client_role to server_role (exposed
 * for tests). Errors: KS_ERR_INTERNAL (HKDF failed). Doesn't block. */
ks_err pd_tls_psk(const uint8_t *secret, size_t secret_len, uint8_t client_role,
                  uint8_t server_role, uint8_t key[PD_PSK_BYTES] /* OUT */,
                  ks_errbuf *eb) KS_MUST_USE;

#define PD_AUTH_LABEL "kvseal-pd-v1"
#define PD_NONCE_BYTES 32u
#define PD_MAC_BYTES 32u

/* Computes the AUTH mac for a sender (exposed for tests and alternative
 * transports); can't fail. */
void pd_auth_mac(const uint8_t *secret, size_t secret_len, bool sender_is_connector,
                 uint8_t sender_role, const uint8_t sender_nonce[PD_NONCE_BYTES],
                 const uint8_t receiver_nonce[PD_NONCE_BYTES], uint8_t mac[PD_MAC_BYTES] /* OUT */);

#endif /* KS_PD_H */
