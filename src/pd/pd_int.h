/* pd_int.h — private structures of the pd transport (see include/kvseal/pd.h).
 *
 * wire.c owns the decoder (a read-target state machine: the caller asks where
 * the next bytes go, reads into exactly that memory, then advances — which is
 * what lets the TCP transport recv a payload straight into a sink's page).
 * tcp.c owns the loop, listeners and TCP conns; auth.c the handshake that runs
 * on every conn before the upper layer sees it. */
#ifndef KS_PD_INT_H
#define KS_PD_INT_H

#include "kvseal/pd.h"

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t by value: no malloc per conn */
#include <pthread.h>
#include <xxhash.h>

// ----------------------------------------------------------------------------
// Decoder (wire.c)

enum {
    PD__DEC_HDR = 0,       /* reading the 24-byte header */
    PD__DEC_NEED_DEST = 1, /* header valid, len > 0: caller picks buffer or sink */
    PD__DEC_PAYLOAD = 2,   /* reading payload into dest[] */
    PD__DEC_FAILED = 3,    /* a PROTO error happened; the stream is dead */
};

struct pd_decoder {
    uint32_t max_payload;        /* len limit checked at header time */
    int state;                   /* PD__DEC_* */
    uint8_t hdr[PD_HDR_BYTES];   /* header bytes as received */
    uint32_t hdr_have;           /* bytes of hdr filled */
    pd_frame_hdr cur;            /* parsed header of the frame in progress */
    XXH3_state_t xs;             /* running checksum of the frame in progress (64-byte
                                    aligned: decoders and conns are allocated with
                                    pd__alloc_aligned) */
    uint8_t *buf;                /* default payload buffer (grow-only, <= max) */
    size_t buf_cap;
    struct iovec dest[PD_MAX_IOV]; /* payload destination (buf or a sink's) */
    int n_dest;
    int dest_i;                  /* current dest entry */
    size_t dest_off;             /* bytes filled in dest[dest_i] */
    uint32_t pay_have;           /* payload bytes received */
    bool sunk;                   /* dest came from a sink */
    uint32_t prefix_len;         /* payload bytes read into buf before the sink */
    bool in_prefix;              /* reading those prefix bytes now */
};

/* Folds n bytes into an XXH3-64 state with the widest vector unit the CPU
 * has (the same hash as XXH3_64bits_update, 2-4x faster); can't fail. */
void pd__xxh_update(XXH3_state_t *st, const void *p, size_t n);
/* The unit pd__xxh_update uses: "avx512", "avx2" or "libxxhash". */
const char *pd__xxh_isa(void);
/* Initializes an embedded decoder; can't fail (no allocation yet). */
/* Zeroed memory of n bytes aligned for a pd_decoder (and a struct that
 * embeds one); free() releases it. NULL on out-of-memory. */
void *pd__alloc_aligned(size_t n);
void pd__dec_init(pd_decoder *d, uint32_t max_payload);
/* Frees the payload buffer; the decoder may be re-initialized. */
void pd__dec_free(pd_decoder *d);
/* Fills up to cap iovecs with where the next received bytes must go; returns
 * the count (>= 1 in states HDR and PAYLOAD, 0 otherwise). */
int pd__dec_want(const pd_decoder *d, struct iovec *iov, int cap);
/* Accounts n bytes just written into the want() iovecs. KS_OK: a frame is
 * complete in *out; KS_ERR_AGAIN: more bytes needed (check state for
 * NEED_DEST); KS_ERR_PROTO: bad header or checksum (state FAILED). */
ks_err pd__dec_advance(pd_decoder *d, size_t n, pd_frame *out, ks_errbuf *eb);
/* In NEED_DEST right after the header (0 < n < len): read the first n payload
 * bytes into the buffer, then stop in NEED_DEST again. KS_ERR_NOMEM. */
ks_err pd__dec_read_prefix(pd_decoder *d, uint32_t n, ks_errbuf *eb);
/* In NEED_DEST: read the (rest of the) payload into the decoder's buffer,
 * after any prefix. KS_ERR_NOMEM. */
ks_err pd__dec_use_buffer(pd_decoder *d, ks_errbuf *eb);
/* In NEED_DEST: read the rest of the payload into iov[0..n) (lengths sum to
 * len - prefix_len: checked by the caller). */
void pd__dec_use_sink(pd_decoder *d, const struct iovec *iov, int n);

// ----------------------------------------------------------------------------
// Loop, listeners, conns (tcp.c)

enum { PD__EV_CONN = 1, PD__EV_LISTENER = 2, PD__EV_WAKE = 3 };

/* The first member of everything registered with epoll. */
typedef struct pd__ev {
    int kind; /* PD__EV_* */
} pd__ev;

enum {
    PD__CONN_CONNECTING = 0, /* TCP connect in progress */
    PD__CONN_HANDSHAKE = 1,  /* HELLO/AUTH exchange */
    PD__CONN_OPEN = 2,       /* authenticated */
    PD__CONN_DRAINING = 3,   /* flush the queue, then close (drain_why/msg) */
    PD__CONN_CLOSED = 4,     /* fd closed; on_close pending */
};

/* One queued piece of output: a frame's unsent bytes, either copied into
 * data (n_iov = 1, iov[0] points into data) or, for a borrowed send, the
 * header's rest in data plus iovecs into the caller's memory. */
typedef struct pd__chunk {
    struct pd__chunk *next;
    int n_iov;                       /* entries in iov */
    int iov_i;                       /* first entry not fully sent */
    size_t iov_off;                  /* bytes of iov[iov_i] already sent */
    struct iovec iov[PD_MAX_IOV + 1];
    void (*done)(void *arg, ks_err e); /* borrowed: completion, else NULL */
    void *arg;
    ks_err err;                      /* completion result, once finished */
    size_t cap;                      /* bytes allocated for data */
    uint8_t data[];
} pd__chunk;

/* Frames held by pd_conn_cork until they leave in one sendmsg: each
 * frame's header and its small payload pieces (a page header, often on the
 * caller's stack) copied into head[], larger pieces referenced (the caller
 * keeps them until uncork). */
#define PD__CORK_FRAMES 16
#define PD__CORK_IOV 512
#define PD__CORK_HEAD 128 /* bytes copied per frame: the header and small pieces */
typedef struct pd__cork {
    int frames, n_iov;
    size_t bytes;
    uint8_t head[PD__CORK_FRAMES][PD__CORK_HEAD];
    struct iovec iov[PD__CORK_IOV];
} pd__cork;

struct pd_conn {
    pd__ev ev;                     /* kind PD__EV_CONN */
    const pd_transport_ops *ops;   /* the transport (tcp) */
    pd_loop *loop;
    pd_conn_cbs cbs;
    void *ud;
    uint64_t id;
    int fd;
    int state;                     /* PD__CONN_* */
    bool initiator;                /* we connected (dir 1) */
    bool user_knows;               /* returned by connect, or on_open ran */
    bool read_on;                  /* reading enabled by the upper layer */
    uint32_t epoll_events;         /* currently registered */
    char peer[80];                 /* "ip:port" */
    uint64_t deadline_ns;          /* connect/handshake deadline, 0 = none */
    uint64_t hold_until_ns;        /* fault delay: output held until */
    size_t stall_at;               /* fault stall: queued bytes until the cut (0: none) */
    uint32_t stall_ms;             /* fault stall: how long the cut lasts at most */
    bool stalled;                  /* fault stall: cut now; the next frame in ends it */
    // auth (auth.c)
    uint8_t nonce[PD_NONCE_BYTES];      /* ours */
    uint8_t peer_nonce[PD_NONCE_BYTES];
    uint8_t peer_role;             /* HELLO's role, or the TLS PSK identity's */
    bool got_hello;
    // TLS (tls.c); ssl is NULL on an --insecure-plaintext loop
    struct ssl_st *ssl;
    struct bio_st *tls_out;        /* our end of the BIO pair OpenSSL writes the handshake into:
                                      ciphertext not yet on the socket */
    char psk_id[32];               /* client: the PSK identity offered */
    char tls_why[96];              /* why a PSK callback refused, for the log */
    bool tls_hs_write;             /* the handshake waits for POLLOUT */
    struct pd__recs *recs;         /* sealed records after the handshake (tls.c) */
    // input
    pd_decoder dec;
    uint8_t rx_ahead[PD_HDR_BYTES + 256]; /* read ahead: the next frame's header and
                                      a sink's prefix, read with the current
                                      payload's tail (never a sunk payload) */
    uint32_t rx_ahead_len, rx_ahead_off; /* bytes in rx_ahead, bytes consumed */
    pd_frame_hdr sink_hdr;         /* header of the frame with a live sink dest */
    bool sink_live;                /* a sink dest is handed out, not yet resolved */
    // output
    pd__chunk *out_head, *out_tail;
    size_t out_bytes;              /* unsent bytes queued */
    bool want_writable;            /* send returned AGAIN: call on_writable */
    bool corked;                   /* pd_conn_cork: frames wait in cork */
    struct pd__cork *cork;         /* held frames (allocated at the first cork) */
    pd__chunk *spare;              /* one recycled big chunk: a 1 MiB page tail
                                      queued per frame would otherwise cost a
                                      fresh mmap + page faults every time */
    // close
    ks_err drain_why;              /* DRAINING: the close reason once flushed */
    char drain_msg[96];
    ks_err close_why;
    char close_msg[256];
    pd_conn *next, *prev;          /* loop->conns (live) or loop->dead */
};

struct pd_listener {
    pd__ev ev; /* kind PD__EV_LISTENER */
    pd_loop *loop;
    int fd;
    uint16_t port;
    pd_conn_cbs cbs;
    void *ud;
    pd_listener *next, *prev;
};

typedef struct pd__post {
    struct pd__post *next;
    void (*fn)(void *arg);
    void *arg;
} pd__post;

struct pd_loop {
    pd__ev wake_ev;     /* kind PD__EV_WAKE, for the eventfd */
    int epfd;
    int evfd;           /* eventfd: pd_loop_post / pd_loop_stop wake-ups */
    pd_loop_cfg cfg;    /* secret points at secret_copy */
    uint8_t *secret_copy;
    pd_conn *conns;     /* live conns */
    pd_conn *dead;      /* closed conns waiting for their on_close */
    pd_listener *listeners;
    pd_listener *dead_listeners; /* closed, freed at the end of the iteration */
    pd__chunk *completed;        /* borrowed sends whose done() is due */
    pthread_mutex_t post_mu;
    pd__post *post_head, *post_tail; /* guarded by post_mu */
    atomic_bool stop;
    pd_loop_stats stats;
    struct ssl_ctx_st *ssl_ctx; /* TLS 1.3 PSK context; NULL when insecure_plaintext */
};

/* Closes c with a reason (logged once); the fd is closed at once, on_sink_fail
 * and on_close run later from the loop. Idempotent. */
void pd__conn_fail(pd_conn *c, ks_err why, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Registers the epoll interest that matches c's state; may fail c. */
void pd__conn_update_events(pd_conn *c);
/* The handshake succeeded: c becomes OPEN and on_open runs. */
void pd__conn_open(pd_conn *c);
/* Queues a frame on c in any state but CLOSED (used by auth for HELLO/AUTH). */
ks_err pd__conn_send_raw(pd_conn *c, uint16_t type, uint64_t req_id, const struct iovec *payload,
                         int n_iov, void (*done)(void *arg, ks_err e), void *arg, ks_errbuf *eb);

// ----------------------------------------------------------------------------
// Handshake (auth.c)

/* Starts the handshake on a connected socket: picks our nonce, sends HELLO.
 * Errors close the conn (pd__conn_fail). */
void pd__auth_start(pd_conn *c);
/* Handles a frame received during the handshake; on success moves c to OPEN
 * and runs on_open. Any problem closes the conn with a reason. */
void pd__auth_on_frame(pd_conn *c, const pd_frame *f);

// ----------------------------------------------------------------------------
// TLS 1.3 with a PSK per connection kind (tls.c)

/* Creates l->ssl_ctx. Errors: KS_ERR_INTERNAL. */
ks_err pd__tls_ctx_create(pd_loop *l, ks_errbuf *eb);
/* Frees l->ssl_ctx; can't fail. */
void pd__tls_ctx_free(pd_loop *l);
/* Creates c->ssl on the connected socket and starts the handshake (client
 * side offers the PSK of (our role, c->peer_role)). Failures close c. */
void pd__tls_start(pd_conn *c);
/* Drives the handshake on a socket event; on success pd__conn_open(c). */
void pd__tls_handshake(pd_conn *c);
/* readv through the sealed records: > 0 verified bytes, 0 at the peer's close
 * between records, -1 with errno (EAGAIN: nothing whole yet), -2 when c was
 * failed (reason logged). A record that fits iov is read and opened in it. */
ssize_t pd__tls_readv(pd_conn *c, const struct iovec *iov, int n);
/* writev through the sealed records: bytes taken (sealed into the send ring;
 * 0: would block), -1 when c was failed. */
ssize_t pd__tls_writev(pd_conn *c, const struct iovec *iov, int n);
/* Sealed bytes not yet taken by the socket (0 without TLS). */
size_t pd__tls_unsent(const pd_conn *c);
/* Sends sealed bytes until the socket is full: 0, or -1 when c was failed. */
int pd__tls_push(pd_conn *c);
/* True when opened input waits in the record buffer (epoll can't see it). */
bool pd__tls_pending(const pd_conn *c);
/* Frees c->ssl and the record state (scrubbing its buffers); accepts a conn
 * without them. */
void pd__tls_free(pd_conn *c);
/* sendmsg with MSG_NOSIGNAL (EINTR retried): bytes taken, 0 when the socket
 * is full, -1 after failing c. */
ssize_t pd__sock_sendv(pd_conn *c, const struct iovec *iov, int n);
/* Records sealed under one key before the next is exported (tests lower it). */
extern uint64_t pd__rec_rekey;

#endif /* KS_PD_INT_H */
