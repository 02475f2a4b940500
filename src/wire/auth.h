/*
 * auth.h - the handshake that opens every connection of a job that has a
 * cluster secret, and the session keys it yields (docs/SECURITY.md).
 *
 * Pure: bytes in, bytes out, no I/O, no clock. secure.c drives it for a
 * connection on the event loop (with a deadline), the worker's heartbeat
 * thread on a blocking socket, and tests/fuzz/fuzz_handshake.c with
 * arbitrary bytes.
 * All cryptography is libsodium's; BLAKE2b (crypto_generichash) keyed by a
 * secret serves as the MAC and the key derivation function.
 *
 * What each side holds (qr_auth), from the secret file and the spec:
 *   key_id    = H(key = secret, "quorum key id v1")[0, 16)
 *               names the secret without revealing it, so a peer with
 *               another job's secret is told so instead of "bad proof";
 *   spec_hash = H("quorum cluster spec v1" || spec)
 *               the cluster spec is public (it is the tasks' addresses);
 *   job_key   = H(key = secret, "quorum job key v1" || spec_hash)
 *               the job's identity: the secret bound to this cluster.
 *
 * The messages, in order; fixed sizes; u32 little-endian; "st" a status
 * byte, 0 or a refusal (qr_hs_refusal); on a refusal the rest is zero and
 * the sender closes the connection after it.
 *   HELLO     client -> server, 88 bytes: magic "QRAU", version, flags
 *             (1 the client encrypts, 2 it has AES-256-GCM), st, 0,
 *             key_id[16], spec_hash[32], nonce_c[32]
 *   CHALLENGE server -> client, 72 bytes: magic, version, flags (1 the
 *             session is encrypted, 2 with AES-256-GCM), st, 0,
 *             nonce_s[32], proof_s[32]
 *   PROOF     client -> server, 40 bytes: magic, version, 0, st, 0,
 *             proof_c[32]
 *   RESULT    server -> client, 8 bytes: magic, version, 0, st, 0
 * With T = HELLO || the first 40 bytes of CHALLENGE (all but its proof):
 *   proof_s = H(key = job_key, "quorum server proof v1" || T)
 *   proof_c = H(key = job_key, "quorum client proof v1" || T || proof_s)
 *   key c2s = H(key = job_key, "quorum c2s v1" || T || proof_s || proof_c)
 *   key s2c = H(key = job_key, "quorum s2c v1" || T || proof_s || proof_c)
 * Each proof covers both fresh nonces, so a recorded handshake replayed
 * fails on the other side's new nonce; the two proofs differ by label and
 * by input, so neither can be reflected back as the other; no secret and
 * no reusable token is ever on the wire. The server proves first and the
 * client checks before it proves, so a client never answers an impostor.
 */
#ifndef QR_WIRE_AUTH_H
#define QR_WIRE_AUTH_H

#include "common/common.h"

#define QR_HS_MAGIC 0x55415251u /* "QRAU" read as bytes Q R A U */
#define QR_HS_VERSION 1
#define QR_HS_HELLO_LEN 88
#define QR_HS_CHALLENGE_LEN 72
#define QR_HS_PROOF_LEN 40
#define QR_HS_RESULT_LEN 8
#define QR_HS_MAX_LEN QR_HS_HELLO_LEN
#define QR_SECRET_MIN_BYTES 32
#define QR_SECRET_MAX_BYTES 4096

/* Why a handshake was refused: the status byte of the refusing message. */
typedef enum qr_hs_refusal {
    QR_HS_OK = 0,
    QR_HS_VERSION_MISMATCH = 1,
    QR_HS_OTHER_SECRET = 2,
    QR_HS_OTHER_SPEC = 3,
    QR_HS_BAD_PROOF = 4,
    QR_HS_NO_SECRET = 5,   /* the server has no secret (no --secret-file) */
    QR_HS_ENCRYPT_MISMATCH = 6,
    QR_HS_MALFORMED = 7,
    QR_HS_NO_HANDSHAKE = 8, /* the client sent a request, no handshake */
    QR_HS_TIMEOUT = 9,
    QR_HS_REFUSAL_MAX = 9,
} qr_hs_refusal;

/* A refusal in words that hold on either side ("the two tasks hold
 * different secrets ..."). */
const char *qr_hs_reason(int refusal);
/* Its label in the metrics ("other_secret"). */
const char *qr_hs_reason_label(int refusal);

/* A job's credentials, shared read-only by every connection of a task. */
typedef struct qr_auth qr_auth;

/* From the secret (QR_SECRET_MIN_BYTES or more) and the cluster spec's
 * canonical text (qr__cluster_spec_text); encrypt asks for sealed
 * sessions (seal.h). QR_EINVAL for a short secret, QR_EIO if libsodium
 * cannot start. */
int qr_auth_new(const uint8_t *secret, size_t len, const char *spec, bool encrypt,
                qr_auth **out);
void qr_auth_free(qr_auth *a);
bool qr_auth_encrypts(const qr_auth *a);
/* Offer XChaCha20-Poly1305 only, as a CPU without AES in hardware does
 * (so the tests cover both ciphers on any machine). */
void qr_auth_without_aes(qr_auth *a);
/* 32 hex digits naming the secret (its key_id): logs can say which one a
 * task holds without giving it away. */
const char *qr_auth_key_name(const qr_auth *a);

typedef enum { QR_HS_SEND_HELLO, QR_HS_WAIT_CHALLENGE, QR_HS_WAIT_RESULT, QR_HS_WAIT_HELLO,
               QR_HS_WAIT_PROOF, QR_HS_DONE, QR_HS_FAILED } qr_hs_state;

/* One side of one connection's handshake. */
typedef struct qr_handshake {
    const qr_auth *auth;
    bool server;
    qr_hs_state state;
    int refusal;             /* why it failed (qr_hs_refusal) */
    bool refused_by_peer;    /* the refusal came from the other side */
    uint8_t nonce[32];       /* this side's */
    uint8_t transcript[QR_HS_HELLO_LEN + 40];
    uint8_t proof_s[32], proof_c[32];
    /* The session, once done: */
    bool encrypt, aes;
    uint8_t key_tx[32], key_rx[32];
} qr_handshake;

/* Start one side. A client then sends qr_handshake_hello's bytes. */
void qr_handshake_start(qr_handshake *hs, const qr_auth *a, bool server);
void qr_handshake_hello(qr_handshake *hs, uint8_t out[QR_HS_HELLO_LEN]);
/* Bytes of the peer's next message (0 once done or failed). */
size_t qr_handshake_want(const qr_handshake *hs);
/* Take the peer's next message: exactly qr_handshake_want bytes. The
 * answer to send (possibly a refusal) goes to out, its length to
 * *out_len (0: nothing to send). QR_OK: go on, or done once state is
 * QR_HS_DONE; QR_EAUTH: refused, by either side (hs->refusal says why;
 * so does qr_last_error), and the connection closes after out is sent. */
int qr_handshake_step(qr_handshake *hs, const uint8_t *in, size_t len, uint8_t *out,
                      size_t *out_len);
/* Wipe the keys. */
void qr_handshake_clear(qr_handshake *hs);

/* For a server without a secret: the CHALLENGE that refuses a HELLO
 * (QR_HS_NO_SECRET), so the client can say why. */
void qr_handshake_refuse_hello(uint8_t out[QR_HS_CHALLENGE_LEN]);
/* True if these first bytes of a connection (4 or more) open a HELLO. */
bool qr_handshake_is_hello(const uint8_t *p, size_t len);

#endif /* QR_WIRE_AUTH_H */
