/* seal.c — per-page AES-256-GCM sealing under TLS-exported keys (pd_seal.h). */
#include "kvseal/pd_seal.h"
#include "pd/pd_int.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/ssl.h>
#include <string.h>

#define PD__SEAL_NONCE_BYTES 12
#define PD__SEAL_AD_BYTES 40
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
                          uint64_t req_id, uint64_t seq_uid, uint32_t gen, bool sealer,
                          ks_errbuf *eb) {
    memset(g, 0, sizeof *g);
    static const char info[] = "kvseal-grant";
    uint8_t msg[sizeof info - 1 + 20], key[32];
    memcpy(msg, info, sizeof info - 1);
    pd__be64(msg + sizeof info - 1, req_id);
    pd__be64(msg + sizeof info - 1 + 8, seq_uid);
    pd__be32(msg + sizeof info - 1 + 16, gen);
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
    g->gen = gen;
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
    if (ad->req_id != g->req_id || ad->seq_uid != g->seq_uid || ad->gen != g->gen)
        return ks_seterr(eb, KS_ERR_INVAL, "page of req %llu tag %llu/%u under the key of req "
                         "%llu tag %llu/%u", (unsigned long long)ad->req_id,
                         (unsigned long long)ad->seq_uid, ad->gen, (unsigned long long)g->req_id,
                         (unsigned long long)g->seq_uid, g->gen);
    memset(nonce, 0, PD__SEAL_NONCE_BYTES);
    pd__be32(nonce + 8, ad->page_index);
    pd__be64(aad, ad->req_id);
    pd__be64(aad + 8, ad->seq_uid);
    pd__be32(aad + 16, ad->gen);
    pd__be32(aad + 20, ad->page_id);
    pd__be32(aad + 24, ad->page_index);
    pd__be32(aad + 28, ad->n_rows);
    pd__be32(aad + 32, ad->layer_lo);
    pd__be32(aad + 36, ad->layer_hi);
    return KS_OK;
}

ks_err pd_seal_page(pd_seal_grant *g, const pd_seal_ad *ad, const void *plain, size_t n,
                    void *out, ks_errbuf *eb) {
    uint8_t nonce[PD__SEAL_NONCE_BYTES], aad[PD__SEAL_AD_BYTES];
    ks_err e = pd__seal_prep(g, ad, nonce, aad, eb);
    if (e) return e;
    if (!g->sealer) return ks_seterr(eb, KS_ERR_INVAL, "sealing with an opener");
    if (g->sealed_any && ad->page_index <= g->last_index)
        return ks_seterr(eb, KS_ERR_INVAL, "page index %u sealed after %u: nonce reuse refused",
                         ad->page_index, g->last_index);
    if (n > (size_t)INT32_MAX) return ks_seterr(eb, KS_ERR_INVAL, "page too large to seal");
    g->sealed_any = true; // from here on the nonce counts as used, whatever happens
    g->last_index = ad->page_index;
    int len = 0;
    uint8_t *o = out;
    if (EVP_EncryptInit_ex(g->ctx, NULL, NULL, NULL, nonce) != 1 ||
        EVP_EncryptUpdate(g->ctx, NULL, &len, aad, sizeof aad) != 1 ||
        EVP_EncryptUpdate(g->ctx, o, &len, plain, (int)n) != 1 ||
        EVP_EncryptFinal_ex(g->ctx, o + len, &len) != 1 ||
        EVP_CIPHER_CTX_ctrl(g->ctx, EVP_CTRL_GCM_GET_TAG, PD_SEAL_TAG_BYTES, o + n) != 1)
        return ks_seterr(eb, KS_ERR_INTERNAL, "AES-GCM sealing failed");
    return KS_OK;
}

ks_err pd_seal_open(pd_seal_grant *g, const pd_seal_ad *ad, const void *sealed, size_t n,
                    void *out, ks_errbuf *eb) {
    uint8_t nonce[PD__SEAL_NONCE_BYTES], aad[PD__SEAL_AD_BYTES];
    ks_err e = pd__seal_prep(g, ad, nonce, aad, eb);
    if (e) return e;
    if (g->sealer) return ks_seterr(eb, KS_ERR_INVAL, "opening with a sealer");
    uint8_t bounce[PD__SEAL_BOUNCE], tag[PD_SEAL_TAG_BYTES];
    const uint8_t *s = sealed;
    uint8_t *o = out;
    int len = 0;
    bool ok = EVP_DecryptInit_ex(g->ctx, NULL, NULL, NULL, nonce) == 1 &&
              EVP_DecryptUpdate(g->ctx, NULL, &len, aad, sizeof aad) == 1;
    for (size_t off = 0; ok && off < n; off += PD__SEAL_BOUNCE) {
        size_t k = n - off < PD__SEAL_BOUNCE ? n - off : PD__SEAL_BOUNCE;
        memcpy(bounce, s + off, k);
        ok = EVP_DecryptUpdate(g->ctx, o + off, &len, bounce, (int)k) == 1;
    }
    memcpy(tag, s + n, sizeof tag);
    ok = ok && EVP_CIPHER_CTX_ctrl(g->ctx, EVP_CTRL_GCM_SET_TAG, sizeof tag, tag) == 1 &&
         EVP_DecryptFinal_ex(g->ctx, o + n, &len) == 1;
    if (!ok) {
        memset(out, 0, n); // never readable
        return ks_seterr(eb, KS_ERR_PROTO, "sealed page %u of req %llu: tag does not verify",
                         ad->page_index, (unsigned long long)ad->req_id);
    }
    return KS_OK;
}
