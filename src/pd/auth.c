/* auth.c — the KVPD v1 plaintext handshake, used only on a loop with
 * insecure_plaintext (--insecure-plaintext; include/kvseal/pd.h section 4).
 * It can be relayed (docs/pd-protocol.md section 3): every other loop runs
 * TLS 1.3 (tls.c) instead.
 *
 * Both sides send HELLO {role, nonce} at once, then AUTH {mac} as soon as they
 * hold the peer's nonce. The MAC covers a label, the sender's direction and
 * role, and both nonces in sender-first order, so a MAC we send is never one
 * we would accept (direction differs), and a HELLO that echoes our own nonce
 * is refused outright. Until both MACs verified, any other frame closes the
 * connection; the transport caps unauthenticated payloads at 64 bytes so an
 * unknown peer cannot make us allocate. Not covered (by design, documented):
 * frames after the handshake carry no MAC, so an on-path attacker who can
 * inject into the TCP stream is out of scope (use a private network). */
#include "pd_int.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

// ----------------------------------------------------------------------------
// MAC

void pd_auth_mac(const uint8_t *secret, size_t secret_len, bool sender_is_connector,
                 uint8_t sender_role, const uint8_t sender_nonce[PD_NONCE_BYTES],
                 const uint8_t receiver_nonce[PD_NONCE_BYTES], uint8_t mac[PD_MAC_BYTES]) {
    crypto_auth_hmacsha256_state st;
    uint8_t dir = sender_is_connector ? 1 : 2;
    uint8_t role = sender_role;
    crypto_auth_hmacsha256_init(&st, secret, secret_len);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)PD_AUTH_LABEL, strlen(PD_AUTH_LABEL));
    crypto_auth_hmacsha256_update(&st, &dir, 1);
    crypto_auth_hmacsha256_update(&st, &role, 1);
    crypto_auth_hmacsha256_update(&st, sender_nonce, PD_NONCE_BYTES);
    crypto_auth_hmacsha256_update(&st, receiver_nonce, PD_NONCE_BYTES);
    crypto_auth_hmacsha256_final(&st, mac);
    sodium_memzero(&st, sizeof st);
}

// ----------------------------------------------------------------------------
// Handshake steps

void pd__auth_start(pd_conn *c) {
    randombytes_buf(c->nonce, PD_NONCE_BYTES);
    uint8_t hello[4 + PD_NONCE_BYTES] = {0}; // role u8, reserved[3], nonce
    hello[0] = c->loop->cfg.role;
    memcpy(hello + 4, c->nonce, PD_NONCE_BYTES);
    struct iovec iov = {hello, sizeof hello};
    ks_errbuf eb;
    ks_err e = pd__conn_send_raw(c, PD_TYPE_HELLO, 0, &iov, 1, NULL, NULL, &eb);
    if (e) pd__conn_fail(c, e, "auth: cannot send HELLO: %s", eb.msg);
}

static void pd__auth_fail(pd_conn *c, const char *why) {
    c->loop->stats.auth_failures++;
    pd__conn_fail(c, KS_ERR_PROTO, "auth failed: %s", why);
}

void pd__auth_on_frame(pd_conn *c, const pd_frame *f) {
    const pd_loop_cfg *cfg = &c->loop->cfg;
    if (f->hdr.type == PD_TYPE_HELLO) {
        if (c->got_hello) return pd__auth_fail(c, "second HELLO");
        if (f->hdr.len != 4 + PD_NONCE_BYTES) return pd__auth_fail(c, "HELLO of wrong size");
        const uint8_t *peer_nonce = f->payload + 4;
        // Reflection: a peer echoing our nonce could replay our own MAC.
        if (sodium_memcmp(peer_nonce, c->nonce, PD_NONCE_BYTES) == 0)
            return pd__auth_fail(c, "peer HELLO reflects our nonce");
        c->peer_role = f->payload[0];
        if (c->cbs.peer_roles && (c->peer_role >= 32 || !(c->cbs.peer_roles >> c->peer_role & 1))) {
            char msg[64];
            snprintf(msg, sizeof msg, "peer role %u not accepted here", c->peer_role);
            return pd__auth_fail(c, msg);
        }
        memcpy(c->peer_nonce, peer_nonce, PD_NONCE_BYTES);
        c->got_hello = true;
        uint8_t mac[PD_MAC_BYTES];
        pd_auth_mac(cfg->secret, cfg->secret_len, c->initiator, cfg->role, c->nonce,
                    c->peer_nonce, mac);
        struct iovec iov = {mac, sizeof mac};
        ks_errbuf eb;
        ks_err e = pd__conn_send_raw(c, PD_TYPE_AUTH, 0, &iov, 1, NULL, NULL, &eb);
        if (e) pd__conn_fail(c, e, "auth: cannot send AUTH: %s", eb.msg);
        return;
    }
    if (f->hdr.type == PD_TYPE_AUTH) {
        if (!c->got_hello) return pd__auth_fail(c, "AUTH before HELLO");
        if (f->hdr.len != PD_MAC_BYTES) return pd__auth_fail(c, "AUTH of wrong size");
        uint8_t want[PD_MAC_BYTES];
        pd_auth_mac(cfg->secret, cfg->secret_len, !c->initiator, c->peer_role, c->peer_nonce,
                    c->nonce, want);
        int bad = sodium_memcmp(want, f->payload, PD_MAC_BYTES);
        sodium_memzero(want, sizeof want);
        if (bad) return pd__auth_fail(c, "bad MAC (wrong cluster secret?)");
        pd__conn_open(c);
        return;
    }
    char msg[64];
    snprintf(msg, sizeof msg, "frame type %u before authentication", f->hdr.type);
    pd__auth_fail(c, msg);
}
