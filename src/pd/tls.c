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
 * forward secrecy. Design notes: docs/pd-protocol.md section 3. */
#include "pd_int.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#define PD__TLS_SALT "kvseal-pd-v2"
#define PD__TLS_REC 16384u /* TLS plaintext record size: small iovecs are coalesced to it */
/* Records are written into a BIO pair of this size and leave in one send():
 * a syscall per 16 KB record costs the sender ~20% of loopback throughput. */
#define PD__TLS_WBUF (256u * 1024u)

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
    SSL_CTX_set_mode(x, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    // read several records per recv (SSL_has_pending then covers the rest)
    SSL_CTX_set_read_ahead(x, 1);
    SSL_CTX_set_default_read_buffer_len(x, 16 * (PD__TLS_REC + 256));
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
    c->tls_more = true;  // the peer's first frames may have come with its last flight
    pd__conn_open(c);
}

// ----------------------------------------------------------------------------
// Data

size_t pd__tls_unsent(const pd_conn *c) { return c->tls_out ? BIO_ctrl_pending(c->tls_out) : 0; }

int pd__tls_push(pd_conn *c) {
    for (;;) {
        char *p;
        int n = BIO_nread0(c->tls_out, &p); // the contiguous run at the ring's head
        if (n <= 0) return 0;
        ssize_t r = send(c->fd, p, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            int e = errno;
            pd__conn_fail(c, (e == EPIPE || e == ECONNRESET) ? KS_ERR_PEER_CLOSED : KS_ERR_IO,
                          "send: %s", strerror(e));
            return -1;
        }
        BIO_nread(c->tls_out, &p, (int)r);
    }
}

/* Only after a read that returned data: once SSL_read said WANT_READ, what
 * OpenSSL still buffers is a partial record that needs the socket, which
 * epoll reports (polling it would spin). */
bool pd__tls_pending(const pd_conn *c) {
    return c->ssl && c->tls_more && SSL_has_pending(c->ssl);
}

ssize_t pd__tls_readv(pd_conn *c, const struct iovec *iov, int n) {
    size_t total = 0;
    c->tls_read_wants_write = false;
    size_t off = 0; // into iov[i]
    for (int i = 0; i < n;) {
        size_t got = 0;
        ERR_clear_error();
        errno = 0;
        // decrypted straight into iov (a KV page, for a sunk payload); a call
        // returns at most one record, so calls go on until iov is full or
        // OpenSSL (which reads several records per recv) needs the socket
        int r = SSL_read_ex(c->ssl, (uint8_t *)iov[i].iov_base + off, iov[i].iov_len - off, &got);
        if (r == 1) {
            total += got;
            off += got;
            if (off == iov[i].iov_len) {
                i++;
                off = 0;
            }
            continue;
        }
        if (total) break;  // report what we have; the condition repeats on the next call
        int e = SSL_get_error(c->ssl, r);
        c->tls_more = false;
        if (pd__tls_unsent(c) && pd__tls_push(c) < 0) return -2; // an alert, say
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
            if (e == SSL_ERROR_WANT_WRITE) {
                c->tls_read_wants_write = true;
                pd__conn_update_events(c);
            }
            errno = EAGAIN;
            return -1;
        }
        if (e == SSL_ERROR_ZERO_RETURN) return 0;
        pd__tls_fail(c, (errno == ECONNRESET || errno == EPIPE) ? KS_ERR_PEER_CLOSED : KS_ERR_IO,
                     "TLS read");
        return -2;
    }
    c->tls_more = true;
    return (ssize_t)total;
}

ssize_t pd__tls_writev(pd_conn *c, const struct iovec *iov, int n) {
    uint8_t stage[PD__TLS_REC];
    size_t total = 0;
    int i = 0;
    size_t off = 0;  // cursor into iov[i]
    c->tls_write_wants_read = false;
    if (pd__tls_push(c) < 0) return -1;
    while (i < n) {
        if (off == iov[i].iov_len) {
            i++;
            off = 0;
            continue;
        }
        // A run of at least one record goes straight from the caller's memory;
        // small pieces (frame and page headers) are coalesced into one record.
        // After WANT_WRITE the retry starts at the same stream position with at
        // least as many bytes, which is all OpenSSL requires.
        const uint8_t *p = (const uint8_t *)iov[i].iov_base + off;
        size_t len = iov[i].iov_len - off;
        if (len < PD__TLS_REC) {
            size_t fill = 0;
            int j = i;
            size_t o = off;
            while (j < n && fill < sizeof stage) {
                size_t take = iov[j].iov_len - o;
                if (take > sizeof stage - fill) take = sizeof stage - fill;
                memcpy(stage + fill, (const uint8_t *)iov[j].iov_base + o, take);
                fill += take;
                o += take;
                if (o == iov[j].iov_len) {
                    j++;
                    o = 0;
                }
            }
            p = stage;
            len = fill;
        }
        size_t w = 0;
        ERR_clear_error();
        errno = 0;
        int r = SSL_write_ex(c->ssl, p, len, &w);
        if (r != 1) {
            int e = SSL_get_error(c->ssl, r);
            if (e == SSL_ERROR_WANT_WRITE) { // the pair is full: drain it, retry if it moved
                size_t before = pd__tls_unsent(c);
                if (pd__tls_push(c) < 0) return -1;
                if (pd__tls_unsent(c) < before) continue;
                return (ssize_t)total;
            }
            if (e == SSL_ERROR_WANT_READ) {
                c->tls_write_wants_read = true;
                return (ssize_t)total;
            }
            pd__tls_fail(c, (errno == EPIPE || errno == ECONNRESET) ? KS_ERR_PEER_CLOSED : KS_ERR_IO,
                         "TLS write");
            return -1;
        }
        total += w;
        // advance the cursor by w bytes
        while (w) {
            size_t room = iov[i].iov_len - off;
            if (w < room) {
                off += w;
                w = 0;
            } else {
                w -= room;
                i++;
                off = 0;
            }
        }
    }
    if (pd__tls_push(c) < 0) return -1;
    return (ssize_t)total;
}

void pd__tls_close_notify(pd_conn *c) {
    if (!c->ssl || c->state != PD__CONN_OPEN) return;
    ERR_clear_error();
    (void)SSL_shutdown(c->ssl);  // best effort, non-blocking: the close follows
    ERR_clear_error();
    char *p;
    int n = BIO_nread0(c->tls_out, &p);
    if (n > 0) (void)!send(c->fd, p, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void pd__tls_free(pd_conn *c) {
    SSL_free(c->ssl); // frees the socket BIO and OpenSSL's end of the pair
    BIO_free(c->tls_out);
    c->ssl = NULL;
    c->tls_out = NULL;
}
