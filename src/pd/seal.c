/* seal.c — per-page AES-256-GCM sealing under TLS-exported keys (pd_seal.h). */
#include "kvseal/pd_seal.h"
#include "pd/pd_int.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/ssl.h>
#include <string.h>

#define PD__SEAL_NONCE_BYTES 12
#define PD__SEAL_AD_BYTES 44
/* pd_seal_open reads the sealed bytes through a private buffer in pieces of
 * this size: the bytes authenticated are then exactly the bytes decrypted even
 * if a late one-sided write changes the source meanwhile. */
#define PD__SEAL_BOUNCE 16384

static void pd__be32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (24 - 8 * i));
}
static void pd__be64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (56 - 8 * i));
}

ks_err pd_seal_link_key(pd_conn *c, uint64_t link_epoch, uint8_t key[PD_SEAL_KEY_BYTES],
                        ks_errbuf *eb) {
    if (!c->ssl)
        return ks_seterr(eb, KS_ERR_UNSUPPORTED,
                         "page sealing needs a TLS link (not --insecure-plaintext)");
    uint8_t ctx[8];
    pd__be64(ctx, link_epoch);
    if (SSL_export_keying_material(c->ssl, key, PD_SEAL_KEY_BYTES, PD_SEAL_LABEL,
                                   strlen(PD_SEAL_LABEL), ctx, sizeof ctx, 1) != 1)
        return ks_seterr(eb, KS_ERR_INTERNAL, "TLS exporter failed (handshake not complete?)");
    return KS_OK;
}

ks_err pd_seal_grant_init(pd_seal_grant *g, const uint8_t link_key[PD_SEAL_KEY_BYTES],
                          uint64_t req_id, uint64_t seq_uid, bool sealer, ks_errbuf *eb) {
    memset(g, 0, sizeof *g);
    static const char info[] = "kvseal-grant";
    uint8_t msg[sizeof info - 1 + 16], key[32];
    memcpy(msg, info, sizeof info - 1);
    pd__be64(msg + sizeof info - 1, req_id);
    pd__be64(msg + sizeof info - 1 + 8, seq_uid);
    unsigned klen = 0;
    if (!HMAC(EVP_sha256(), link_key, PD_SEAL_KEY_BYTES, msg, sizeof msg, key, &klen) ||
        klen != sizeof key)
        return ks_seterr(eb, KS_ERR_INTERNAL, "grant key derivation failed");
    g->ctx = EVP_CIPHER_CTX_new();
    if (!g->ctx) {
        OPENSSL_cleanse(key, sizeof key);
        return ks_seterr(eb, KS_ERR_NOMEM, "no memory for a cipher context");
    }
    int ok = sealer ? EVP_EncryptInit_ex(g->ctx, EVP_aes_256_gcm(), NULL, key, NULL)
                    : EVP_DecryptInit_ex(g->ctx, EVP_aes_256_gcm(), NULL, key, NULL);
    OPENSSL_cleanse(key, sizeof key);
    if (ok != 1) {
        pd_seal_grant_free(g);
        return ks_seterr(eb, KS_ERR_INTERNAL, "AES-256-GCM set-up failed");
    }
    g->req_id = req_id;
    g->seq_uid = seq_uid;
    g->sealer = sealer;
    return KS_OK;
}

void pd_seal_grant_free(pd_seal_grant *g) {
    EVP_CIPHER_CTX_free(g->ctx); // also wipes the expanded key
    g->ctx = NULL;
}

/* Checks ad against g and fills the nonce and AAD bytes. */
static ks_err pd__seal_prep(const pd_seal_grant *g, const pd_seal_ad *ad,
                           uint8_t nonce[PD__SEAL_NONCE_BYTES], uint8_t aad[PD__SEAL_AD_BYTES],
                           ks_errbuf *eb) {
    if (!g->ctx) return ks_seterr(eb, KS_ERR_INVAL, "sealing grant not initialized");
    if (ad->req_id != g->req_id || ad->seq_uid != g->seq_uid)
        return ks_seterr(eb, KS_ERR_INVAL, "page of req %llu seq %llu under the key of req %llu "
                         "seq %llu", (unsigned long long)ad->req_id,
                         (unsigned long long)ad->seq_uid, (unsigned long long)g->req_id,
                         (unsigned long long)g->seq_uid);
    memset(nonce, 0, PD__SEAL_NONCE_BYTES);
    pd__be32(nonce + 8, ad->record);
    pd__be64(aad, ad->req_id);
    pd__be64(aad + 8, ad->seq_uid);
    pd__be64(aad + 16, ad->gen);
    pd__be32(aad + 24, ad->page_id);
    pd__be32(aad + 28, ad->page_index);
    pd__be32(aad + 32, ad->n_rows);
    pd__be32(aad + 36, ad->layer_lo);
    pd__be32(aad + 40, ad->layer_hi);
    return KS_OK;
}

ks_err pd_seal_pagev(pd_seal_grant *g, const pd_seal_ad *ad, const struct iovec *iov, int n_iov,
                     void *out, ks_errbuf *eb) {
    uint8_t nonce[PD__SEAL_NONCE_BYTES], aad[PD__SEAL_AD_BYTES];
    ks_err e = pd__seal_prep(g, ad, nonce, aad, eb);
    if (e) return e;
    if (!g->sealer) return ks_seterr(eb, KS_ERR_INVAL, "sealing with an opener");
    if (g->sealed_any && ad->record <= g->last_record)
        return ks_seterr(eb, KS_ERR_INVAL, "record %u sealed after %u: nonce reuse refused",
                         ad->record, g->last_record);
    g->sealed_any = true; // from here on the nonce counts as used, whatever happens
    g->last_record = ad->record;
    int len = 0;
    uint8_t *o = out;
    size_t off = 0;
    bool ok = EVP_EncryptInit_ex(g->ctx, NULL, NULL, NULL, nonce) == 1 &&
              EVP_EncryptUpdate(g->ctx, NULL, &len, aad, sizeof aad) == 1;
    for (int i = 0; ok && i < n_iov; i++) {
        if (iov[i].iov_len > (size_t)INT32_MAX) ok = false;
        else ok = EVP_EncryptUpdate(g->ctx, o + off, &len, iov[i].iov_base, (int)iov[i].iov_len) == 1;
        off += iov[i].iov_len;
    }
    ok = ok && EVP_EncryptFinal_ex(g->ctx, o + off, &len) == 1 &&
         EVP_CIPHER_CTX_ctrl(g->ctx, EVP_CTRL_GCM_GET_TAG, PD_SEAL_TAG_BYTES, o + off) == 1;
    if (!ok) return ks_seterr(eb, KS_ERR_INTERNAL, "AES-GCM sealing failed");
    return KS_OK;
}

ks_err pd_seal_page(pd_seal_grant *g, const pd_seal_ad *ad, const void *plain, size_t n,
                    void *out, ks_errbuf *eb) {
    struct iovec iov = {.iov_base = (void *)plain, .iov_len = n};
    return pd_seal_pagev(g, ad, &iov, 1, out, eb);
}

ks_err pd_seal_openv(pd_seal_grant *g, const pd_seal_ad *ad, const void *sealed, size_t n,
                     const struct iovec *dst, int n_dst, ks_errbuf *eb) {
    uint8_t nonce[PD__SEAL_NONCE_BYTES], aad[PD__SEAL_AD_BYTES];
    ks_err e = pd__seal_prep(g, ad, nonce, aad, eb);
    if (e) return e;
    if (g->sealer) return ks_seterr(eb, KS_ERR_INVAL, "opening with a sealer");
    size_t total = 0;
    for (int i = 0; i < n_dst; i++) total += dst[i].iov_len;
    if (total != n) return ks_seterr(eb, KS_ERR_INVAL, "open: %zu destination bytes for %zu", total, n);
    uint8_t bounce[PD__SEAL_BOUNCE], tag[PD_SEAL_TAG_BYTES];
    const uint8_t *s = sealed;
    int len = 0;
    bool ok = EVP_DecryptInit_ex(g->ctx, NULL, NULL, NULL, nonce) == 1 &&
              EVP_DecryptUpdate(g->ctx, NULL, &len, aad, sizeof aad) == 1;
    size_t off = 0; // into sealed
    for (int i = 0; ok && i < n_dst; i++) {
        uint8_t *o = dst[i].iov_base;
        for (size_t d = 0; ok && d < dst[i].iov_len;) {
            size_t k = dst[i].iov_len - d < PD__SEAL_BOUNCE ? dst[i].iov_len - d : PD__SEAL_BOUNCE;
            memcpy(bounce, s + off, k);
            ok = EVP_DecryptUpdate(g->ctx, o + d, &len, bounce, (int)k) == 1;
            d += k;
            off += k;
        }
    }
    memcpy(tag, s + n, sizeof tag);
    ok = ok && EVP_CIPHER_CTX_ctrl(g->ctx, EVP_CTRL_GCM_SET_TAG, sizeof tag, tag) == 1 &&
         EVP_DecryptFinal_ex(g->ctx, bounce, &len) == 1;
    if (!ok) {
        for (int i = 0; i < n_dst; i++) memset(dst[i].iov_base, 0, dst[i].iov_len); // never readable
        return ks_seterr(eb, KS_ERR_PROTO, "sealed record %u (page %u) of req %llu: tag does not "
                         "verify", ad->record, ad->page_index, (unsigned long long)ad->req_id);
    }
    return KS_OK;
}

ks_err pd_seal_open(pd_seal_grant *g, const pd_seal_ad *ad, const void *sealed, size_t n,
                    void *out, ks_errbuf *eb) {
    struct iovec iov = {.iov_base = out, .iov_len = n};
    return pd_seal_openv(g, ad, sealed, n, &iov, 1, eb);
}
