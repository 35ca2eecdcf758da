/* tls.c — the cluster links' secure channel (include/kvseal/pd.h section 4):
 * TLS 1.3 from OpenSSL's libssl, mutually authenticated by an external PSK
 * derived from the cluster secret for one connection kind.
 *
 * The PSK of a connection from role C (client) to role S (server) is
 *   HKDF-SHA256(ikm = secret, salt = "kvseal-pd-v2", info = "psk" || C || S)
 * and its identity is "kvseal-pd-v2 C>S" (decimal roles). The server learns
 * the client's role only from the identity whose key the client proved
 * (TLS binder, then Finished), and the client accepts the connection only if
 * the server completed the handshake with the key for (C, S). So a
 * prefill->router connection relayed to a decode data port cannot complete
 * (decode has no key for "2>1"), and nothing a relay forwards can be altered
 * or read: every frame after the handshake is AEAD-protected (AES-128-GCM,
 * or ChaCha20-Poly1305 where the client prefers it), with (EC)DHE for
 * forward secrecy, in sealed records of our own under keys the session
 * exports (below). Design notes: docs/pd-protocol.md section 3. */
#include "pd_int.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#define PD__TLS_SALT "kvseal-pd-v2"
/* The handshake's records are written into a BIO pair of this size. */
#define PD__TLS_WBUF (16u * 1024u)

static bool pd__recs_start(pd_conn *c);

// ----------------------------------------------------------------------------
// Keys and PSK sessions

ks_err pd_tls_psk(const uint8_t *secret, size_t secret_len, uint8_t client_role,
                  uint8_t server_role, uint8_t key[PD_PSK_BYTES], ks_errbuf *eb) {
    uint8_t info[5] = {'p', 's', 'k', client_role, server_role};
    size_t n = PD_PSK_BYTES;
    EVP_PKEY_CTX *k = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
    bool ok = k && EVP_PKEY_derive_init(k) > 0 && EVP_PKEY_CTX_set_hkdf_md(k, EVP_sha256()) > 0 &&
              EVP_PKEY_CTX_set1_hkdf_salt(k, (const unsigned char *)PD__TLS_SALT,
                                          (int)strlen(PD__TLS_SALT)) > 0 &&
              EVP_PKEY_CTX_set1_hkdf_key(k, secret, (int)secret_len) > 0 &&
              EVP_PKEY_CTX_add1_hkdf_info(k, info, (int)sizeof info) > 0 &&
              EVP_PKEY_derive(k, key, &n) > 0 && n == PD_PSK_BYTES;
    EVP_PKEY_CTX_free(k);
    if (!ok) return ks_seterr(eb, KS_ERR_INTERNAL, "pd tls: HKDF failed");
    return KS_OK;
}

/* A TLS 1.3 session carrying the PSK for (client_role, server_role); NULL on
 * failure. The cipher only fixes the PSK's hash (SHA-256); the suite itself
 * is negotiated among those of the context. */
static SSL_SESSION *pd__tls_session(SSL *ssl, const pd_loop *l, uint8_t client_role,
                                    uint8_t server_role) {
    static const unsigned char aes128gcm[2] = {0x13, 0x01};
    const SSL_CIPHER *ci = SSL_CIPHER_find(ssl, aes128gcm);
    uint8_t key[PD_PSK_BYTES];
    if (!ci || pd_tls_psk(l->cfg.secret, l->cfg.secret_len, client_role, server_role, key, NULL))
        return NULL;
    SSL_SESSION *s = SSL_SESSION_new();
    if (s && (!SSL_SESSION_set1_master_key(s, key, sizeof key) || !SSL_SESSION_set_cipher(s, ci) ||
              !SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) ||
              !SSL_SESSION_set1_id_context(s, (const unsigned char *)PD__TLS_SALT,
                                           strlen(PD__TLS_SALT)))) {
        SSL_SESSION_free(s);
        s = NULL;
    }
    OPENSSL_cleanse(key, sizeof key);
    return s;
}

/* Client: offer the PSK for (our role, the role we connect to). */
static int pd__tls_use_psk(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *idlen,
                           SSL_SESSION **sess) {
    pd_conn *c = SSL_get_app_data(ssl);
    *sess = NULL;
    if (md && md != EVP_sha256()) return 1;  // a HelloRetryRequest for another hash: no PSK
    SSL_SESSION *s = pd__tls_session(ssl, c->loop, c->loop->cfg.role, c->peer_role);
    if (!s) return 0;
    *id = (const unsigned char *)c->psk_id;
    *idlen = strlen(c->psk_id);
    *sess = s;
    return 1;
}

/* Server: accept only "kvseal-pd-v2 C>S" with S our role and C a role this
 * listener accepts; the client's role is what it authenticated as. */
static int pd__tls_find_psk(SSL *ssl, const unsigned char *id, size_t idlen, SSL_SESSION **sess) {
    pd_conn *c = SSL_get_app_data(ssl);
    *sess = NULL;
    char s[64];
    unsigned cr = 0, sr = 0;
    char tail = 0;
    if (idlen >= sizeof s) goto refuse;
    memcpy(s, id, idlen);
    s[idlen] = 0;
    if (sscanf(s, PD__TLS_SALT " %u>%u%c", &cr, &sr, &tail) != 2 || cr > 255 ||
        sr != c->loop->cfg.role)
        goto refuse;
    if (c->cbs.peer_roles && (cr >= 32 || !(c->cbs.peer_roles >> cr & 1))) {
        snprintf(c->tls_why, sizeof c->tls_why, "peer role %u not accepted here", cr);
        return 0;
    }
    *sess = pd__tls_session(ssl, c->loop, (uint8_t)cr, (uint8_t)sr);
    if (!*sess) return 0;
    c->peer_role = (uint8_t)cr;
    return 1;
refuse:
    snprintf(c->tls_why, sizeof c->tls_why, "PSK identity \"%.40s\" is not one this port accepts",
             idlen < sizeof s ? s : "(too long)");
    return 0;
}

ks_err pd__tls_ctx_create(pd_loop *l, ks_errbuf *eb) {
    SSL_CTX *x = SSL_CTX_new(TLS_method());
    if (!x) return ks_seterr(eb, KS_ERR_INTERNAL, "pd tls: SSL_CTX_new failed");
    bool ok = SSL_CTX_set_min_proto_version(x, TLS1_3_VERSION) &&
              SSL_CTX_set_max_proto_version(x, TLS1_3_VERSION) &&
              SSL_CTX_set_ciphersuites(x, "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256") &&
              SSL_CTX_set_num_tickets(x, 0);
    if (!ok) {
        SSL_CTX_free(x);
        return ks_seterr(eb, KS_ERR_INTERNAL, "pd tls: cannot configure TLS 1.3");
    }
    SSL_CTX_set_session_cache_mode(x, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_session_id_context(x, (const unsigned char *)PD__TLS_SALT, strlen(PD__TLS_SALT));
    SSL_CTX_set_options(x, SSL_OP_NO_TICKET | SSL_OP_IGNORE_UNEXPECTED_EOF);
        // no read-ahead: OpenSSL reads exactly the handshake's records, so the
    // sealed records behind them stay on the socket for pd__tls_readv
    SSL_CTX_set_read_ahead(x, 0);
    SSL_CTX_set_psk_use_session_callback(x, pd__tls_use_psk);
    SSL_CTX_set_psk_find_session_callback(x, pd__tls_find_psk);
    l->ssl_ctx = x;
    return KS_OK;
}

void pd__tls_ctx_free(pd_loop *l) {
    SSL_CTX_free(l->ssl_ctx);
    l->ssl_ctx = NULL;
}

// ----------------------------------------------------------------------------
// Handshake

/* Fails c with the OpenSSL reason (or our own, from a callback). */
static void pd__tls_fail(pd_conn *c, ks_err why, const char *what) {
    char reason[160] = "";
    unsigned long e = ERR_get_error();
    if (c->tls_why[0]) snprintf(reason, sizeof reason, "%s", c->tls_why);
    else if (e) ERR_error_string_n(e, reason, sizeof reason);
    else if (errno) snprintf(reason, sizeof reason, "%s", strerror(errno));
    else snprintf(reason, sizeof reason, "peer closed the connection");
    ERR_clear_error();
    if (c->state == PD__CONN_HANDSHAKE) {
        c->loop->stats.auth_failures++;
        pd__conn_fail(c, KS_ERR_PROTO, "auth failed: TLS handshake: %s", reason);
    } else {
        pd__conn_fail(c, why, "%s: %s", what, reason);
    }
}

void pd__tls_start(pd_conn *c) {
    c->ssl = SSL_new(c->loop->ssl_ctx);
    // reads come from the socket; records go into a BIO pair that pd__tls_push drains
    BIO *sock = c->ssl ? BIO_new_socket(c->fd, BIO_NOCLOSE) : NULL, *rec = NULL;
    if (!sock || !BIO_new_bio_pair(&rec, PD__TLS_WBUF, &c->tls_out, 0)) {
        BIO_free(sock);
        return pd__tls_fail(c, KS_ERR_NOMEM, "SSL_new");
    }
    SSL_set_bio(c->ssl, sock, rec);
    SSL_set_app_data(c->ssl, c);
    if (c->initiator) {
        snprintf(c->psk_id, sizeof c->psk_id, PD__TLS_SALT " %u>%u", c->loop->cfg.role,
                 c->peer_role);
        // no trust store: a server offering a certificate instead of the PSK fails
        SSL_set_verify(c->ssl, SSL_VERIFY_PEER, NULL);
        SSL_set_connect_state(c->ssl);
    } else {
        SSL_set_accept_state(c->ssl);
    }
    pd__tls_handshake(c);
}

void pd__tls_handshake(pd_conn *c) {
    ERR_clear_error();
    errno = 0;
    if (pd__tls_push(c) < 0) return;
    int r = SSL_do_handshake(c->ssl);
    int e = r == 1 ? SSL_ERROR_NONE : SSL_get_error(c->ssl, r);
    if (e == SSL_ERROR_NONE || e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        if (pd__tls_push(c) < 0) return;
        c->tls_hs_write = e == SSL_ERROR_WANT_WRITE || pd__tls_unsent(c);
    }
    if (r != 1) {
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
            pd__conn_update_events(c);
            return;
        }
        return pd__tls_fail(c, KS_ERR_PROTO, "TLS handshake");
    }
    // only the PSK authenticates a peer: a handshake without it is refused
    if (!SSL_session_reused(c->ssl) || SSL_version(c->ssl) != TLS1_3_VERSION) {
        snprintf(c->tls_why, sizeof c->tls_why, "the peer did not authenticate with the PSK");
        return pd__tls_fail(c, KS_ERR_PROTO, "TLS handshake");
    }
    ks_log(KS_LOG_DEBUG, "pd: conn #%llu %s: TLS 1.3 %s, peer role %u", (unsigned long long)c->id,
           c->peer, SSL_get_cipher_name(c->ssl), c->peer_role);
    if (!pd__recs_start(c)) {
        snprintf(c->tls_why, sizeof c->tls_why,
                 "cannot key the sealed records (or data arrived early)");
        return pd__tls_fail(c, KS_ERR_PROTO, "TLS handshake");
    }
    pd__conn_open(c);
}

// ----------------------------------------------------------------------------
// Data: sealed records (docs/pd-protocol.md section 3)
//
// After the handshake OpenSSL's record layer steps aside: each direction
// seals its byte stream into records of our own, under AEAD keys exported
// from the session (RFC 8446 section 7.5), so the receiver can read a KV
// page's ciphertext straight into the page and open it there, and the
// sender seals straight from the pool into its send ring. Wire form:
//
//   record = len (u32 LE, 1..PD__REC_MAX) || AEAD(len bytes) || tag (16)
//   nonce  = iv XOR seq (u64 big-endian in the last 8 bytes, as TLS 1.3), AAD = len
//   key, iv of epoch e = export("kvseal pd records", dir || e (u64 LE))
//
// dir is 'c' for the stream the client (initiator) writes, 's' for the
// server's; seq counts the records under one key and the key changes every
// pd__rec_rekey records. The AEAD is the negotiated suite's (AES-128-GCM or
// ChaCha20-Poly1305). A record's bytes are handed up only after its tag
// verified; a failed tag closes the connection.

#define PD__REC_MAX (256u * 1024u)   /* largest record a receiver accepts */
#define PD__REC_OVER 20u             /* len + tag */
#define PD__REC_SMALL 1024u          /* iovecs below this coalesce into one record */
#define PD__RING_MIN (64u * 1024u)
#define PD__RING_MAX (4u * (PD__REC_MAX + PD__REC_OVER))
#define PD__REC_LABEL "kvseal pd records"
#define PD__RAW_AHEAD 512u          /* stream bytes a read takes beyond the record */

uint64_t pd__rec_rekey = 1ull << 16;

/* One direction's AEAD state. */
typedef struct pd__aead {
    EVP_CIPHER_CTX *ctx;
    uint8_t iv[12];
    uint64_t seq, epoch;
    char dir;
} pd__aead;

struct pd__recs {
    const EVP_CIPHER *cipher;
    int key_len;
    pd__aead tx, rx;
    // tx: sealed bytes not yet on the socket, a ring [head, head + len) mod cap
    uint8_t *ring;
    size_t cap, head, len;
    // rx: the record being read
    uint8_t hdr[4];           /* the next record's len field */
    uint32_t hdr_have;
    bool in_rec;              /* hdr parsed: L is this record's length */
    uint32_t L, got;          /* plaintext length, ciphertext bytes read */
    uint8_t aad[4];
    uint8_t tag[16];
    uint32_t tag_have;
    bool direct;              /* ciphertext goes into the caller's iovecs */
    const void *direct_at;    /* ... which must start here on every call */
    uint8_t *bounce;          /* otherwise here; then opened plaintext served from it */
    uint32_t bounce_cap, b_off, b_len;
    uint8_t raw[PD__RAW_AHEAD];  /* stream bytes read ahead, not yet parsed */
    uint32_t raw_off, raw_len;
};

/* Keys of a's next epoch (the first: epoch 0). False when export failed. */
static bool pd__aead_key(pd_conn *c, pd__aead *a, bool enc) {
    struct pd__recs *r = c->recs;
    uint8_t km[32 + 12], ctx[9];
    ctx[0] = (uint8_t)a->dir;
    pd_store_u64(ctx + 1, a->epoch);
    bool ok = SSL_export_keying_material(c->ssl, km, (size_t)r->key_len + 12, PD__REC_LABEL,
                                         strlen(PD__REC_LABEL), ctx, sizeof ctx, 1) == 1;
    if (ok) {
        memcpy(a->iv, km + r->key_len, 12);
        ok = enc ? EVP_EncryptInit_ex(a->ctx, r->cipher, NULL, km, NULL) == 1
                 : EVP_DecryptInit_ex(a->ctx, r->cipher, NULL, km, NULL) == 1;
    }
    OPENSSL_cleanse(km, sizeof km);
    a->seq = 0;
    a->epoch++;
    return ok;
}

/* The nonce of a's current record. */
static void pd__aead_nonce(const pd__aead *a, uint8_t nonce[12]) {
    memcpy(nonce, a->iv, 12);
    for (int i = 0; i < 8; i++) nonce[4 + i] ^= (uint8_t)(a->seq >> (56 - 8 * i));
}

/* Counts a record; moves a to its next key after pd__rec_rekey records.
 * False when export failed. */
static bool pd__aead_next(pd_conn *c, pd__aead *a, bool enc) {
    return ++a->seq < pd__rec_rekey || pd__aead_key(c, a, enc);
}

/* Switches c to sealed records once the handshake is done. Nothing of the
 * peer may be buffered inside OpenSSL (read-ahead is off during the
 * handshake, so it reads exactly the handshake's records). */
static bool pd__recs_start(pd_conn *c) {
    const SSL_CIPHER *ci = SSL_get_current_cipher(c->ssl);
    struct pd__recs *r = calloc(1, sizeof *r);
    if (!r) return false;
    c->recs = r;
    bool chacha = ci && SSL_CIPHER_get_protocol_id(ci) == 0x1303;
    r->cipher = chacha ? EVP_chacha20_poly1305() : EVP_aes_128_gcm();
    r->key_len = chacha ? 32 : 16;
    r->tx.dir = c->initiator ? 'c' : 's';
    r->rx.dir = c->initiator ? 's' : 'c';
    r->tx.ctx = EVP_CIPHER_CTX_new();
    r->rx.ctx = EVP_CIPHER_CTX_new();
    return r->tx.ctx && r->rx.ctx && !SSL_has_pending(c->ssl) && pd__aead_key(c, &r->tx, true) &&
           pd__aead_key(c, &r->rx, false);
}

size_t pd__tls_unsent(const pd_conn *c) {
    return (c->tls_out ? BIO_ctrl_pending(c->tls_out) : 0) + (c->recs ? c->recs->len : 0);
}

int pd__tls_push(pd_conn *c) {
    for (;;) {  // the handshake's last flight first
        char *p;
        int n = c->tls_out ? BIO_nread0(c->tls_out, &p) : 0;
        if (n <= 0) break;
        struct iovec v = {p, (size_t)n};
        ssize_t sent = pd__sock_sendv(c, &v, 1);
        if (sent <= 0) return (int)sent;
        BIO_nread(c->tls_out, &p, (int)sent);
    }
    struct pd__recs *r = c->recs;
    while (r && r->len) {
        size_t first = r->cap - r->head < r->len ? r->cap - r->head : r->len;
        struct iovec v[2] = {{r->ring + r->head, first}, {r->ring, r->len - first}};
        ssize_t sent = pd__sock_sendv(c, v, r->len > first ? 2 : 1);
        if (sent <= 0) return (int)sent;
        r->head = (r->head + (size_t)sent) % r->cap;
        r->len -= (size_t)sent;
        if (!r->len) r->head = 0;
    }
    return 0;
}

bool pd__tls_pending(const pd_conn *c) {
    return c->recs && (c->recs->b_off < c->recs->b_len || c->recs->raw_off < c->recs->raw_len);
}

/* Copies opened bounce bytes into iov[0..n); returns how many. */
static size_t pd__bounce_take(struct pd__recs *r, const struct iovec *iov, int n) {
    size_t took = 0;
    for (int i = 0; i < n && r->b_off < r->b_len; i++) {
        size_t k = r->b_len - r->b_off < iov[i].iov_len ? r->b_len - r->b_off : iov[i].iov_len;
        memcpy(iov[i].iov_base, r->bounce + r->b_off, k);
        r->b_off += (uint32_t)k;
        took += k;
    }
    return took;
}

/* Opens the record just read (in place); false after failing c. */
static bool pd__rec_open(pd_conn *c, const struct iovec *iov, int n) {
    struct pd__recs *r = c->recs;
    uint8_t nonce[12];
    pd__aead_nonce(&r->rx, nonce);
    int len = 0;
    bool ok = EVP_DecryptInit_ex(r->rx.ctx, NULL, NULL, NULL, nonce) == 1 &&
              EVP_DecryptUpdate(r->rx.ctx, NULL, &len, r->aad, 4) == 1;
    // the ciphertext lies in iov (direct) or the bounce buffer, L bytes
    size_t left = r->L;
    if (r->direct) {
        for (int i = 0; ok && i < n && left; i++) {
            size_t k = iov[i].iov_len < left ? iov[i].iov_len : left;
            ok = EVP_DecryptUpdate(r->rx.ctx, iov[i].iov_base, &len, iov[i].iov_base, (int)k) == 1;
            left -= k;
        }
    } else {
        ok = ok && EVP_DecryptUpdate(r->rx.ctx, r->bounce, &len, r->bounce, (int)r->L) == 1;
    }
    ok = ok && EVP_CIPHER_CTX_ctrl(r->rx.ctx, EVP_CTRL_AEAD_SET_TAG, 16, r->tag) == 1 &&
         EVP_DecryptFinal_ex(r->rx.ctx, nonce, &len) == 1;
    if (!ok) {
        ERR_clear_error();
        c->loop->stats.proto_errors++;
        pd__conn_fail(c, KS_ERR_PROTO, "record %llu of key %llu failed authentication",
                      (unsigned long long)r->rx.seq, (unsigned long long)(r->rx.epoch - 1));
        return false;
    }
    if (!pd__aead_next(c, &r->rx, false)) {
        pd__conn_fail(c, KS_ERR_INTERNAL, "TLS exporter failed at a key change");
        return false;
    }
    r->in_rec = false;
    return true;
}

/* Fills v[0..k) from the bytes read ahead, then with one readv that also
 * reads up to PD__RAW_AHEAD bytes ahead (the next record's len field and, for
 * a KV page, its small header record: one syscall per page). Returns the
 * bytes placed in v (> 0), 0 at EOF, -1 with errno (EAGAIN). */
static ssize_t pd__rec_fill(pd_conn *c, struct iovec *v, int k) {
    struct pd__recs *r = c->recs;
    size_t placed = 0;
    int i = 0;
    for (; i < k && r->raw_off < r->raw_len; i++) {
        size_t t = r->raw_len - r->raw_off < v[i].iov_len ? r->raw_len - r->raw_off : v[i].iov_len;
        memcpy(v[i].iov_base, r->raw + r->raw_off, t);
        r->raw_off += (uint32_t)t;
        placed += t;
        if (t < v[i].iov_len) {
            v[i].iov_base = (uint8_t *)v[i].iov_base + t;
            v[i].iov_len -= t;
            break;
        }
    }
    if (i == k) return (ssize_t)placed;
    r->raw_off = r->raw_len = 0;
    size_t want = 0;
    for (int j = i; j < k; j++) want += v[j].iov_len;
    v[k] = (struct iovec){r->raw, sizeof r->raw};
    ssize_t got;
    do got = readv(c->fd, v + i, k + 1 - i);
    while (got < 0 && errno == EINTR);
    if (got <= 0) return placed ? (ssize_t)placed : got;
    c->loop->stats.reads++;
    if ((size_t)got > want) {
        r->raw_len = (uint32_t)((size_t)got - want);
        got = (ssize_t)want;
    }
    return (ssize_t)(placed + (size_t)got);
}

ssize_t pd__tls_readv(pd_conn *c, const struct iovec *iov, int n) {
    struct pd__recs *r = c->recs;
    size_t want = 0;
    for (int i = 0; i < n; i++) want += iov[i].iov_len;
    if (r->b_off < r->b_len) return (ssize_t)pd__bounce_take(r, iov, n);
    for (;;) {
        struct iovec v[PD_MAX_IOV + 4];
        int k = 0;
        if (!r->in_rec) {  // the len field
            v[k++] = (struct iovec){r->hdr + r->hdr_have, 4 - r->hdr_have};
            ssize_t got = pd__rec_fill(c, v, k);
            if (got < 0) return -1;
            if (got == 0) {
                if (!r->hdr_have) return 0;
                pd__conn_fail(c, KS_ERR_PEER_CLOSED, "peer closed the connection mid-record");
                return -2;
            }
            if ((r->hdr_have += (uint32_t)got) < 4) continue;
            uint32_t L = pd_load_u32(r->hdr);
            if (L == 0 || L > PD__REC_MAX) {
                pd__conn_fail(c, KS_ERR_PROTO, "record length %u out of range (1..%u)", L,
                              PD__REC_MAX);
                return -2;
            }
            memcpy(r->aad, r->hdr, 4);
            r->hdr_have = 0;
            r->in_rec = true;
            r->L = L;
            r->got = r->tag_have = 0;
            // straight into the caller's memory when the record fits what it
            // asks for (a KV page's rows do: the sender starts a record where
            // the frame's small header iovecs end)
            r->direct = L <= want;
            r->direct_at = iov[0].iov_base;
            k = 0;
            if (!r->direct && r->bounce_cap < L) {
                uint8_t *b = realloc(r->bounce, L);
                if (!b) {
                    pd__conn_fail(c, KS_ERR_NOMEM, "no memory for a %u-byte record", L);
                    return -2;
                }
                r->bounce = b;
                r->bounce_cap = L;
            }
        }
        if (r->direct && iov[0].iov_base != r->direct_at) {  // the caller moved: write nowhere else
            pd__conn_fail(c, KS_ERR_INTERNAL, "record destination changed mid-record");
            return -2;
        }
        if (r->direct) {  // iov[] from offset got, up to L
            size_t skip = r->got, left = r->L - r->got;
            for (int i = 0; i < n && left; i++) {
                if (skip >= iov[i].iov_len) {
                    skip -= iov[i].iov_len;
                    continue;
                }
                size_t take = iov[i].iov_len - skip < left ? iov[i].iov_len - skip : left;
                v[k++] = (struct iovec){(uint8_t *)iov[i].iov_base + skip, take};
                left -= take;
                skip = 0;
            }
        } else if (r->got < r->L) {
            v[k++] = (struct iovec){r->bounce + r->got, r->L - r->got};
        }
        if (r->tag_have < 16) v[k++] = (struct iovec){r->tag + r->tag_have, 16 - r->tag_have};
        ssize_t got = pd__rec_fill(c, v, k);
        if (got < 0) return -1;
        if (got == 0) {
            pd__conn_fail(c, KS_ERR_PEER_CLOSED, "peer closed the connection mid-record");
            return -2;
        }
        size_t g = (size_t)got, a = r->L - r->got < g ? r->L - r->got : g;
        r->got += (uint32_t)a;
        r->tag_have += (uint32_t)(g - a);
        if (r->got < r->L || r->tag_have < 16) continue;  // the socket may have more
        if (!pd__rec_open(c, iov, n)) return -2;
        if (r->direct) return (ssize_t)r->L;
        r->b_off = 0;
        r->b_len = r->L;
        return (ssize_t)pd__bounce_take(r, iov, n);
    }
}

/* Makes room for `need` more bytes in the ring (growing it while it has
 * room to grow); false when it is full for now. */
static bool pd__ring_room(struct pd__recs *r, size_t need) {
    if (r->cap - r->len >= need) return true;
    if (r->cap >= PD__RING_MAX) return false;
    size_t cap = r->cap ? r->cap : PD__RING_MIN;
    while (cap - r->len < need && cap < PD__RING_MAX) cap *= 2;
    if (cap > PD__RING_MAX) cap = PD__RING_MAX;
    if (cap - r->len < need) return false;
    uint8_t *b = malloc(cap);
    if (!b) return false;
    for (size_t i = 0, h = r->head; i < r->len;) {  // unwrap into the new ring
        size_t run = r->cap - h < r->len - i ? r->cap - h : r->len - i;
        memcpy(b + i, r->ring + h, run);
        i += run;
        h = 0;
    }
    free(r->ring);
    r->ring = b;
    r->cap = cap;
    r->head = 0;
    return true;
}

/* Seals len bytes from (iov, i, off) onwards into the ring as one record. */
static bool pd__rec_seal(pd_conn *c, const struct iovec *iov, int i, size_t off, size_t len) {
    struct pd__recs *r = c->recs;
    uint8_t nonce[12], hdr[4], tag[16];
    pd_store_u32(hdr, (uint32_t)len);
    pd__aead_nonce(&r->tx, nonce);
    int out = 0;
    bool ok = EVP_EncryptInit_ex(r->tx.ctx, NULL, NULL, NULL, nonce) == 1 &&
              EVP_EncryptUpdate(r->tx.ctx, NULL, &out, hdr, 4) == 1;
    size_t at = (r->head + r->len) % r->cap;
    // writes n bytes at the ring's tail (wrapping), sealed when src is plaintext
    #define PD__RING_PUT(src, nb, seal)                                                        \
        for (size_t done_ = 0; ok && done_ < (nb);) {                                           \
            size_t run_ = r->cap - at < (nb) - done_ ? r->cap - at : (nb) - done_;              \
            if (seal) ok = EVP_EncryptUpdate(r->tx.ctx, r->ring + at, &out,                     \
                                             (const uint8_t *)(src) + done_, (int)run_) == 1;   \
            else memcpy(r->ring + at, (const uint8_t *)(src) + done_, run_);                    \
            done_ += run_;                                                                      \
            at = (at + run_) % r->cap;                                                          \
        }
    PD__RING_PUT(hdr, 4, false);
    for (size_t left = len; ok && left; i++, off = 0) {
        size_t take = iov[i].iov_len - off < left ? iov[i].iov_len - off : left;
        PD__RING_PUT((const uint8_t *)iov[i].iov_base + off, take, true);
        left -= take;
    }
    ok = ok && EVP_EncryptFinal_ex(r->tx.ctx, tag, &out) == 1 &&
         EVP_CIPHER_CTX_ctrl(r->tx.ctx, EVP_CTRL_AEAD_GET_TAG, 16, tag) == 1;
    PD__RING_PUT(tag, 16, false);
    #undef PD__RING_PUT
    if (!ok) {
        ERR_clear_error();
        pd__conn_fail(c, KS_ERR_INTERNAL, "record sealing failed");
        return false;
    }
    r->len += len + PD__REC_OVER;
    if (!pd__aead_next(c, &r->tx, true)) {
        pd__conn_fail(c, KS_ERR_INTERNAL, "TLS exporter failed at a key change");
        return false;
    }
    return true;
}

ssize_t pd__tls_writev(pd_conn *c, const struct iovec *iov, int n) {
    struct pd__recs *r = c->recs;
    size_t total = 0;
    int i = 0;
    size_t off = 0;  // cursor into iov[i]
    if (pd__tls_push(c) < 0) return -1;
    while (i < n) {
        if (off == iov[i].iov_len) {
            i++, off = 0;
            continue;
        }
        // A record is a run of small iovecs (frame and page headers) or of
        // large ones (a page's rows), so a KV page's rows open a record of
        // their own that the receiver reads into the page itself.
        bool small = iov[i].iov_len - off < PD__REC_SMALL;
        size_t len = 0;
        for (int j = i; j < n && len < PD__REC_MAX; j++) {
            size_t piece = iov[j].iov_len - (j == i ? off : 0);
            if (j > i && (piece < PD__REC_SMALL) != small) break;
            len += piece;
        }
        if (len > PD__REC_MAX) len = PD__REC_MAX;
        if (!pd__ring_room(r, len + PD__REC_OVER)) {  // full: what fits, if it is worth a record
            size_t room = r->cap - r->len > PD__REC_OVER ? r->cap - r->len - PD__REC_OVER : 0;
            if (room < len && room < 16384) {
                if (pd__tls_push(c) < 0) return -1;
                if (r->cap - r->len >= PD__REC_OVER + (len < 16384 ? len : 16384)) continue;
                break;
            }
            len = room < len ? room : len;
        }
        if (!pd__rec_seal(c, iov, i, off, len)) return -1;
        total += len;
        for (size_t left = len; left;) {  // advance the cursor
            size_t room = iov[i].iov_len - off;
            if (left < room) {
                off += left;
                left = 0;
            } else {
                left -= room;
                i++, off = 0;
            }
        }
        if (r->len >= r->cap / 2 && pd__tls_push(c) < 0) return -1;
    }
    if (pd__tls_push(c) < 0) return -1;
    return (ssize_t)total;
}

void pd__tls_free(pd_conn *c) {
    SSL_free(c->ssl); // frees the socket BIO and OpenSSL's end of the pair
    BIO_free(c->tls_out);
    c->ssl = NULL;
    c->tls_out = NULL;
    struct pd__recs *r = c->recs;
    if (r) {
        EVP_CIPHER_CTX_free(r->tx.ctx);
        EVP_CIPHER_CTX_free(r->rx.ctx);
        if (r->bounce) OPENSSL_cleanse(r->bounce, r->bounce_cap);  // tenants' plaintext
        if (r->ring) OPENSSL_cleanse(r->ring, r->cap);
        free(r->bounce);
        free(r->ring);
        free(r);
        c->recs = NULL;
    }
}
