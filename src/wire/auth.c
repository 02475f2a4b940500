/*
 * auth.c - the connection handshake of auth.h: key derivation, the four
 * messages, and the checks each side makes of the other's.
 *
 * Every check that can fail names what differs, because a refused task is
 * almost always a misconfigured one (another job's secret, another spec),
 * and "authentication failed" alone would send its owner hunting.
 */
#include "wire/auth.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FLAG_ENCRYPT 1u
#define FLAG_AES 2u

struct qr_auth {
    uint8_t key_id[16];
    uint8_t spec_hash[32];
    uint8_t job_key[32];
    bool encrypt;
    bool has_aes; /* this CPU runs AES-256-GCM in hardware (libsodium's test) */
    char key_name[33];
};

static const struct {
    const char *label, *text;
} reasons[] = {
    [QR_HS_OK] = {"ok", "accepted"},
    [QR_HS_VERSION_MISMATCH] = {"version", "the two tasks speak different handshake versions "
                                "(different quorum releases)"},
    [QR_HS_OTHER_SECRET] = {"other_secret", "the two tasks hold different secrets (a task of "
                            "another job, or a wrong --secret-file)"},
    [QR_HS_OTHER_SPEC] = {"other_spec", "the two tasks were started with different cluster "
                          "specs (a task of another job, or one given other ps or worker "
                          "addresses)"},
    [QR_HS_BAD_PROOF] = {"bad_proof", "the proof of the secret is wrong (a replayed or forged "
                         "handshake)"},
    [QR_HS_NO_SECRET] = {"no_secret", "one task has a secret and the other has none (the ps "
                         "was started without --secret-file)"},
    [QR_HS_ENCRYPT_MISMATCH] = {"encrypt_mismatch", "one task encrypts (--encrypt) and the "
                                "other does not"},
    [QR_HS_MALFORMED] = {"malformed", "a handshake message is malformed"},
    [QR_HS_NO_HANDSHAKE] = {"no_handshake", "one task has a secret and the other has none: "
                            "the peer sent a request without authenticating (started without "
                            "--secret-file)"},
    [QR_HS_TIMEOUT] = {"timeout", "the handshake did not complete within "
                       "handshake-timeout-ms"},
};

const char *qr_hs_reason(int refusal) {
    if (refusal < 0 || refusal > QR_HS_REFUSAL_MAX) return "an unknown refusal";
    return reasons[refusal].text;
}

const char *qr_hs_reason_label(int refusal) {
    if (refusal < 0 || refusal > QR_HS_REFUSAL_MAX) return "unknown";
    return reasons[refusal].label;
}

/* ---- keys ------------------------------------------------------------------ */

/* out = BLAKE2b-256(key, label || a || b || c); key may be NULL (unkeyed). */
static void hash_parts(uint8_t out[32], const uint8_t *key, const char *label,
                       const void *a, size_t alen, const void *b, size_t blen,
                       const void *c, size_t clen) {
    crypto_generichash_state st;
    crypto_generichash_init(&st, key, key ? 32 : 0, 32);
    crypto_generichash_update(&st, (const uint8_t *)label, strlen(label) + 1);
    if (alen) crypto_generichash_update(&st, a, alen);
    if (blen) crypto_generichash_update(&st, b, blen);
    if (clen) crypto_generichash_update(&st, c, clen);
    crypto_generichash_final(&st, out, 32);
    sodium_memzero(&st, sizeof st);
}

int qr_auth_new(const uint8_t *secret, size_t len, const char *spec, bool encrypt,
                qr_auth **out) {
    if (!secret || !spec || !out) return qr__fail(QR_EINVAL, "qr_auth_new: NULL argument");
    if (len < QR_SECRET_MIN_BYTES || len > QR_SECRET_MAX_BYTES)
        return qr__fail(QR_EINVAL, "a secret has %d to %d bytes, this one %zu (make one with "
                        "`quorum keygen PATH`)", QR_SECRET_MIN_BYTES, QR_SECRET_MAX_BYTES, len);
    if (sodium_init() < 0) return qr__fail(QR_EIO, "libsodium cannot start");
    qr_auth *a = qr__calloc(1, sizeof *a);
    if (!a) return QR_ENOMEM;
    /* The secret may be longer than a BLAKE2b key (64 bytes): it is
     * condensed first, keyed by nothing but itself. */
    uint8_t master[32];
    crypto_generichash(master, sizeof master, secret, len, NULL, 0);
    uint8_t id[32];
    hash_parts(id, master, "quorum key id v1", NULL, 0, NULL, 0, NULL, 0);
    memcpy(a->key_id, id, sizeof a->key_id);
    hash_parts(a->spec_hash, NULL, "quorum cluster spec v1", spec, strlen(spec), NULL, 0, NULL, 0);
    hash_parts(a->job_key, master, "quorum job key v1", a->spec_hash, 32, NULL, 0, NULL, 0);
    sodium_memzero(master, sizeof master);
    a->encrypt = encrypt;
    a->has_aes = crypto_aead_aes256gcm_is_available() != 0;
    sodium_bin2hex(a->key_name, sizeof a->key_name, a->key_id, sizeof a->key_id);
    *out = a;
    return QR_OK;
}

void qr_auth_free(qr_auth *a) {
    if (!a) return;
    sodium_memzero(a, sizeof *a);
    free(a);
}

bool qr_auth_encrypts(const qr_auth *a) {
    return a && a->encrypt;
}

void qr_auth_without_aes(qr_auth *a) {
    a->has_aes = false;
}

const char *qr_auth_key_name(const qr_auth *a) {
    return a->key_name;
}

/* ---- messages ---------------------------------------------------------------- */

static void put_head(uint8_t *p, uint8_t flags, uint8_t status) {
    p[0] = 'Q', p[1] = 'R', p[2] = 'A', p[3] = 'U';
    p[4] = QR_HS_VERSION;
    p[5] = flags;
    p[6] = status;
    p[7] = 0;
}

bool qr_handshake_is_hello(const uint8_t *p, size_t len) {
    return len >= 4 && p[0] == 'Q' && p[1] == 'R' && p[2] == 'A' && p[3] == 'U';
}

/* A message's head: QR_HS_OK, or the refusal it makes us. The peer's own
 * refusal (its status byte) is reported apart: it is the peer's word. */
static int check_head(const uint8_t *p, size_t len, size_t want) {
    if (len != want || !qr_handshake_is_hello(p, len) || p[7] != 0) return QR_HS_MALFORMED;
    if (p[4] != QR_HS_VERSION) return QR_HS_VERSION_MISMATCH;
    return QR_HS_OK;
}

void qr_handshake_start(qr_handshake *hs, const qr_auth *a, bool server) {
    memset(hs, 0, sizeof *hs);
    hs->auth = a;
    hs->server = server;
    hs->state = server ? QR_HS_WAIT_HELLO : QR_HS_SEND_HELLO;
    randombytes_buf(hs->nonce, sizeof hs->nonce);
}

void qr_handshake_hello(qr_handshake *hs, uint8_t out[QR_HS_HELLO_LEN]) {
    const qr_auth *a = hs->auth;
    put_head(out, (uint8_t)((a->encrypt ? FLAG_ENCRYPT : 0) | (a->has_aes ? FLAG_AES : 0)), 0);
    memcpy(out + 8, a->key_id, 16);
    memcpy(out + 24, a->spec_hash, 32);
    memcpy(out + 56, hs->nonce, 32);
    memcpy(hs->transcript, out, QR_HS_HELLO_LEN);
    hs->state = QR_HS_WAIT_CHALLENGE;
}

size_t qr_handshake_want(const qr_handshake *hs) {
    switch (hs->state) {
    case QR_HS_WAIT_HELLO: return QR_HS_HELLO_LEN;
    case QR_HS_WAIT_CHALLENGE: return QR_HS_CHALLENGE_LEN;
    case QR_HS_WAIT_PROOF: return QR_HS_PROOF_LEN;
    case QR_HS_WAIT_RESULT: return QR_HS_RESULT_LEN;
    default: return 0;
    }
}

void qr_handshake_refuse_hello(uint8_t out[QR_HS_CHALLENGE_LEN]) {
    memset(out, 0, QR_HS_CHALLENGE_LEN);
    put_head(out, 0, QR_HS_NO_SECRET);
}

static void derive_session(qr_handshake *hs) {
    const uint8_t *k = hs->auth->job_key;
    uint8_t c2s[32], s2c[32];
    hash_parts(c2s, k, "quorum c2s v1", hs->transcript, sizeof hs->transcript, hs->proof_s, 32,
               hs->proof_c, 32);
    hash_parts(s2c, k, "quorum s2c v1", hs->transcript, sizeof hs->transcript, hs->proof_s, 32,
               hs->proof_c, 32);
    memcpy(hs->key_tx, hs->server ? s2c : c2s, 32);
    memcpy(hs->key_rx, hs->server ? c2s : s2c, 32);
    sodium_memzero(c2s, sizeof c2s);
    sodium_memzero(s2c, sizeof s2c);
    hs->state = QR_HS_DONE;
}

/* Fail with `refusal`; `out` (out_cap bytes, a message of that size) gets
 * a refusal to send unless the peer refused or out is NULL. */
static int fail(qr_handshake *hs, int refusal, bool by_peer, uint8_t *out, size_t out_len,
                size_t *sent) {
    hs->state = QR_HS_FAILED;
    hs->refusal = refusal;
    hs->refused_by_peer = by_peer;
    *sent = 0;
    if (out && !by_peer) {
        memset(out, 0, out_len);
        put_head(out, 0, (uint8_t)refusal);
        *sent = out_len;
    }
    return qr__fail(QR_EAUTH, "%s: %s", by_peer ? "the peer refused the handshake"
                                               : "the handshake was refused",
                    qr_hs_reason(refusal));
}

static int on_hello(qr_handshake *hs, const uint8_t *in, size_t len, uint8_t *out,
                    size_t *out_len) {
    const qr_auth *a = hs->auth;
    int bad = check_head(in, len, QR_HS_HELLO_LEN);
    if (!bad && (in[6] != 0 || (in[5] & ~(FLAG_ENCRYPT | FLAG_AES)))) bad = QR_HS_MALFORMED;
    if (!bad && sodium_memcmp(in + 8, a->key_id, 16) != 0) bad = QR_HS_OTHER_SECRET;
    if (!bad && sodium_memcmp(in + 24, a->spec_hash, 32) != 0) bad = QR_HS_OTHER_SPEC;
    if (!bad && ((in[5] & FLAG_ENCRYPT) != 0) != a->encrypt) bad = QR_HS_ENCRYPT_MISMATCH;
    if (bad) return fail(hs, bad, false, out, QR_HS_CHALLENGE_LEN, out_len);
    hs->encrypt = a->encrypt;
    hs->aes = a->encrypt && a->has_aes && (in[5] & FLAG_AES);
    put_head(out, (uint8_t)((hs->encrypt ? FLAG_ENCRYPT : 0) | (hs->aes ? FLAG_AES : 0)), 0);
    memcpy(out + 8, hs->nonce, 32);
    memcpy(hs->transcript, in, QR_HS_HELLO_LEN);
    memcpy(hs->transcript + QR_HS_HELLO_LEN, out, 40);
    hash_parts(hs->proof_s, a->job_key, "quorum server proof v1", hs->transcript,
               sizeof hs->transcript, NULL, 0, NULL, 0);
    memcpy(out + 40, hs->proof_s, 32);
    *out_len = QR_HS_CHALLENGE_LEN;
    hs->state = QR_HS_WAIT_PROOF;
    return QR_OK;
}

static int on_challenge(qr_handshake *hs, const uint8_t *in, size_t len, uint8_t *out,
                        size_t *out_len) {
    const qr_auth *a = hs->auth;
    int bad = check_head(in, len, QR_HS_CHALLENGE_LEN);
    if (!bad && in[6] != 0) return fail(hs, in[6], true, NULL, 0, out_len);
    bool encrypt = !bad && (in[5] & FLAG_ENCRYPT), aes = !bad && (in[5] & FLAG_AES);
    if (!bad && (in[5] & ~(FLAG_ENCRYPT | FLAG_AES))) bad = QR_HS_MALFORMED;
    if (!bad && encrypt != a->encrypt) bad = QR_HS_ENCRYPT_MISMATCH;
    if (!bad && aes && !(encrypt && a->has_aes)) bad = QR_HS_MALFORMED; /* we did not offer it */
    if (!bad) {
        memcpy(hs->transcript + QR_HS_HELLO_LEN, in, 40);
        hash_parts(hs->proof_s, a->job_key, "quorum server proof v1", hs->transcript,
                   sizeof hs->transcript, NULL, 0, NULL, 0);
        if (sodium_memcmp(in + 40, hs->proof_s, 32) != 0) bad = QR_HS_BAD_PROOF;
    }
    if (bad) return fail(hs, bad, false, out, QR_HS_PROOF_LEN, out_len);
    hs->encrypt = encrypt;
    hs->aes = aes;
    hash_parts(hs->proof_c, a->job_key, "quorum client proof v1", hs->transcript,
               sizeof hs->transcript, hs->proof_s, 32, NULL, 0);
    put_head(out, 0, 0);
    memcpy(out + 8, hs->proof_c, 32);
    *out_len = QR_HS_PROOF_LEN;
    hs->state = QR_HS_WAIT_RESULT;
    return QR_OK;
}

static int on_proof(qr_handshake *hs, const uint8_t *in, size_t len, uint8_t *out,
                    size_t *out_len) {
    int bad = check_head(in, len, QR_HS_PROOF_LEN);
    if (!bad && in[6] != 0) return fail(hs, in[6], true, NULL, 0, out_len);
    if (!bad && in[5] != 0) bad = QR_HS_MALFORMED;
    if (!bad) {
        hash_parts(hs->proof_c, hs->auth->job_key, "quorum client proof v1", hs->transcript,
                   sizeof hs->transcript, hs->proof_s, 32, NULL, 0);
        if (sodium_memcmp(in + 8, hs->proof_c, 32) != 0) bad = QR_HS_BAD_PROOF;
    }
    if (bad) return fail(hs, bad, false, out, QR_HS_RESULT_LEN, out_len);
    put_head(out, 0, 0);
    *out_len = QR_HS_RESULT_LEN;
    derive_session(hs);
    return QR_OK;
}

static int on_result(qr_handshake *hs, const uint8_t *in, size_t len, size_t *out_len) {
    *out_len = 0;
    int bad = check_head(in, len, QR_HS_RESULT_LEN);
    if (!bad && in[6] != 0) return fail(hs, in[6], true, NULL, 0, out_len);
    if (!bad && in[5] != 0) bad = QR_HS_MALFORMED;
    if (bad) return fail(hs, bad, false, NULL, 0, out_len);
    derive_session(hs);
    return QR_OK;
}

int qr_handshake_step(qr_handshake *hs, const uint8_t *in, size_t len, uint8_t *out,
                      size_t *out_len) {
    *out_len = 0;
    switch (hs->state) {
    case QR_HS_WAIT_HELLO: return on_hello(hs, in, len, out, out_len);
    case QR_HS_WAIT_CHALLENGE: return on_challenge(hs, in, len, out, out_len);
    case QR_HS_WAIT_PROOF: return on_proof(hs, in, len, out, out_len);
    case QR_HS_WAIT_RESULT: return on_result(hs, in, len, out_len);
    default: return qr__fail(QR_EINTERNAL, "handshake step in state %d", (int)hs->state);
    }
}

void qr_handshake_clear(qr_handshake *hs) {
    sodium_memzero(hs, sizeof *hs);
}
