/*
 * seal.c - AEAD records for encrypted connections (seal.h), on libsodium.
 */
#include "wire/seal.h"

#include <string.h>

void qr_sealer_init(qr_sealer *s, bool aes, const uint8_t key[32]) {
    memset(s, 0, sizeof *s);
    s->aes = aes;
    if (aes) crypto_aead_aes256gcm_beforenm(&s->aes_state, key);
    else memcpy(s->key, key, 32);
}

void qr_sealer_clear(qr_sealer *s) {
    sodium_memzero(s, sizeof *s);
}

const char *qr_sealer_cipher(const qr_sealer *s) {
    return s->aes ? "AES-256-GCM" : "XChaCha20-Poly1305";
}

size_t qr_sealed_size(size_t len) {
    size_t records = (len + QR_SEAL_MAX_RECORD - 1) / QR_SEAL_MAX_RECORD;
    return len + records * QR_SEAL_OVERHEAD;
}

/* The record's nonce: its number, little-endian, zero-padded to the
 * cipher's nonce size (12 bytes for AES-GCM, 24 for XChaCha20). */
static void make_nonce(uint64_t counter, uint8_t nonce[24]) {
    memset(nonce, 0, 24);
    for (int i = 0; i < 8; i++) nonce[i] = (uint8_t)(counter >> (8 * i));
}

static void put_len(uint8_t *p, uint32_t len) {
    p[0] = (uint8_t)len, p[1] = (uint8_t)(len >> 8), p[2] = (uint8_t)(len >> 16),
    p[3] = (uint8_t)(len >> 24);
}

uint32_t qr_seal_record_len(const uint8_t head[QR_SEAL_LEN_BYTES]) {
    uint32_t len = (uint32_t)head[0] | (uint32_t)head[1] << 8 | (uint32_t)head[2] << 16 |
                   (uint32_t)head[3] << 24;
    return len >= 1 && len <= QR_SEAL_MAX_RECORD ? len : 0;
}

size_t qr_seal(qr_sealer *s, const uint8_t *plain, size_t len, uint8_t *out) {
    uint8_t *start = out;
    while (len > 0) {
        uint32_t n = (uint32_t)QR_MIN(len, (size_t)QR_SEAL_MAX_RECORD);
        uint8_t nonce[24];
        make_nonce(s->counter++, nonce);
        put_len(out, n);
        uint8_t *ct = out + QR_SEAL_LEN_BYTES;
        if (s->aes)
            crypto_aead_aes256gcm_encrypt_detached_afternm(ct, ct + n, NULL, plain, n, out,
                                                           QR_SEAL_LEN_BYTES, NULL, nonce,
                                                           &s->aes_state);
        else
            crypto_aead_xchacha20poly1305_ietf_encrypt_detached(ct, ct + n, NULL, plain, n, out,
                                                                QR_SEAL_LEN_BYTES, NULL, nonce,
                                                                s->key);
        out += QR_SEAL_OVERHEAD + n;
        plain += n;
        len -= n;
    }
    return (size_t)(out - start);
}

int qr_unseal_to(qr_sealer *s, const uint8_t *rec, uint32_t len, uint8_t *out) {
    uint8_t nonce[24];
    make_nonce(s->counter, nonce);
    const uint8_t *ct = rec + QR_SEAL_LEN_BYTES;
    int rc = s->aes ? crypto_aead_aes256gcm_decrypt_detached_afternm(
                          out, NULL, ct, len, ct + len, rec, QR_SEAL_LEN_BYTES, nonce,
                          &s->aes_state)
                    : crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
                          out, NULL, ct, len, ct + len, rec, QR_SEAL_LEN_BYTES, nonce, s->key);
    if (rc != 0)
        return qr__fail(QR_EAUTH, "record %llu does not open: forged, altered, replayed or "
                        "out of order", (unsigned long long)s->counter);
    s->counter++;
    return QR_OK;
}

int qr_unseal(qr_sealer *s, uint8_t *rec, uint32_t len) {
    return qr_unseal_to(s, rec, len, rec + QR_SEAL_LEN_BYTES);
}
