/*
 * seal.h - the record layer of an encrypted connection (--encrypt): each
 * direction's byte stream, after the handshake (auth.h), is a sequence of
 * records sealed with an AEAD under that direction's session key.
 *
 *   record = u32 length (little-endian, 1..QR_SEAL_MAX_RECORD)
 *            || ciphertext (length bytes) || tag (16 bytes)
 *
 * The cipher is AES-256-GCM where both ends have it in hardware, else
 * XChaCha20-Poly1305 (the handshake chooses). The nonce is never sent: it
 * is the record's number in its direction (a 64-bit counter from 0), and
 * the length is authenticated as associated data. A record replayed,
 * dropped, reordered, cut or altered therefore fails to open, and the
 * connection closes. Keys are fresh per connection and direction, so a
 * counter never repeats under one key.
 *
 * Records do not follow message boundaries: the framed messages of
 * proto.h travel inside them unchanged, and a message's bytes may span
 * several records (a payload is sealed in pieces of up to 64 KiB, so the
 * receiver holds one record at most before it can open it).
 */
#ifndef QR_WIRE_SEAL_H
#define QR_WIRE_SEAL_H

#include "common/common.h"

#include <sodium.h>

#define QR_SEAL_MAX_RECORD (64 * 1024)
#define QR_SEAL_LEN_BYTES 4
#define QR_SEAL_TAG_BYTES 16
#define QR_SEAL_OVERHEAD (QR_SEAL_LEN_BYTES + QR_SEAL_TAG_BYTES)

/* One direction's key and record counter. */
typedef struct qr_sealer {
    crypto_aead_aes256gcm_state aes_state; /* the expanded AES key, when aes */
    uint8_t key[32];                       /* XChaCha20-Poly1305's otherwise */
    bool aes;
    uint64_t counter;
} qr_sealer;

void qr_sealer_init(qr_sealer *s, bool aes, const uint8_t key[32]);
void qr_sealer_clear(qr_sealer *s);
/* Name of the cipher ("AES-256-GCM", "XChaCha20-Poly1305"). */
const char *qr_sealer_cipher(const qr_sealer *s);

/* Bytes on the wire for `len` plaintext bytes sealed in records of at
 * most QR_SEAL_MAX_RECORD. */
size_t qr_sealed_size(size_t len);
/* Seal len bytes (any length; split into records) into out, which holds
 * qr_sealed_size(len) bytes; returns the bytes written. */
size_t qr_seal(qr_sealer *s, const uint8_t *plain, size_t len, uint8_t *out);
/* A record's plaintext length from its first 4 bytes; 0 if out of range
 * (the stream cannot be trusted: close). */
uint32_t qr_seal_record_len(const uint8_t head[QR_SEAL_LEN_BYTES]);
/* Open one whole record (QR_SEAL_OVERHEAD + len bytes at rec) in place:
 * its plaintext lands at rec + QR_SEAL_LEN_BYTES. QR_OK, or QR_EAUTH if it
 * was forged, altered, replayed, reordered or cut. */
int qr_unseal(qr_sealer *s, uint8_t *rec, uint32_t len);
/* The same, with the plaintext written to out (len bytes) instead. On
 * failure out may hold garbage: it is for bytes not yet delivered. */
int qr_unseal_to(qr_sealer *s, const uint8_t *rec, uint32_t len, uint8_t *out);

#endif /* QR_WIRE_SEAL_H */
