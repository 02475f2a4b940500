/*
 * fuzz_handshake.c - libFuzzer target: the handshake (src/wire/auth.c) and
 * the sealed records (src/wire/seal.c) fed arbitrary peer messages, with
 * no socket in between.
 *
 * The first byte picks what the input drives:
 *   mode (bits 0-1)  0 a server: the input stands in for a client's HELLO
 *                      and PROOF; 1 a client: for a server's CHALLENGE and
 *                      RESULT; 2 and 3 sealed records only (below).
 *   bit 2            in modes 0 and 1 both sides have encrypt on; in
 *                      modes 2 and 3 the records use AES-256-GCM (where
 *                      this CPU has it) instead of XChaCha20-Poly1305.
 * In modes 0 and 1 the second byte says where the two messages the side
 * under test reads come from, the first message in its low nibble, the
 * second in its high one (each taken modulo 5):
 *   0  bytes of the input, exactly as many as the message has;
 *   1  the genuine message: a real peer of the same job (a qr_handshake
 *      of its own) answers the side under test;
 *   2  the genuine message with one byte changed (two input bytes: the
 *      position, the bits to flip);
 *   3  first message: the genuine one of a real peer of another job (one
 *      input byte picks: another secret, another cluster spec, the other
 *      encrypt setting; for a client also a ps without a secret, whose
 *      qr_handshake_refuse_hello answers); second message: a well-formed
 *      refusal (one input byte: the status, 0 read as 1);
 *   4  bytes of the input of a length the input picks (one byte, 0-255).
 * Whatever is left is read as sealed-record operations (records()), with
 * the session's keys if the side under test got to DONE, else with a
 * fixed key.
 *
 * Nonces are fixed here (each side's is overwritten after
 * qr_handshake_start), so an input always replays the same way and
 * tests/fuzz/seeds.py can compute whole valid transcripts with hashlib.
 *
 * What must hold, with abort() on any violation: every step's answer and
 * state match the protocol of auth.h, checked against an independent
 * computation of the keys and proofs (the oracle below, from the
 * documented formulas): a step is accepted only if the peer's message is
 * well-formed and, where it carries one, its proof is right, so a side
 * never reaches DONE unless its peer knew the job key; DONE comes with the
 * documented session keys; a genuine peer of the same job is accepted and
 * one of another job is refused for the right reason; a refusal is always
 * a failure; qr_handshake_want is 0 once done or failed; an answer is
 * exactly its message's size (or nothing), and a refusal has the
 * documented form; a step after the end is refused and changes nothing.
 * For records: qr_seal_record_len reads the length as documented; a record
 * that opens is byte for byte the sealing of what it opened to at that
 * position (so the input could only have copied a genuine one); genuine
 * records open to their plaintext, in order, however the payload was
 * split; an altered, cut, replayed, reordered or foreign record never
 * opens, and a failure leaves the record counter where it was.
 *
 * Build and run: scripts/fuzz.sh [seconds]. Seeds: tests/fuzz/seeds.py.
 */
#include "wire/auth.h"
#include "wire/seal.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "fuzz_handshake: %s:%d: violated: %s\n", __FILE__, __LINE__, \
                    #cond);                                                             \
            abort();                                                                    \
        }                                                                               \
    } while (0)

/* Mirrored by tests/fuzz/seeds.py. */
static const char SECRET[] = "fuzz_handshake: the cluster secret of this job";
static const char OTHER_SECRET[] = "fuzz_handshake: the secret of some other job!";
static const char SPEC[] = "ps=127.0.0.1:2222;worker=127.0.0.1:2223";
static const char OTHER_SPEC[] = "ps=127.0.0.1:2222;worker=127.0.0.1:9999";
#define NONCE_C_BASE 0x00 /* the client's nonce: 0x00, 0x01, ... 0x1f */
#define NONCE_S_BASE 0x80 /* the server's: 0x80 ... 0x9f */
#define RECORD_KEY_BASE 0x40

enum { MODE_SERVER = 0, MODE_CLIENT = 1 };
enum { SRC_FUZZ, SRC_GENUINE, SRC_CHANGED, SRC_OTHER, SRC_FUZZ_LEN, NSRC };

/* ---- the input -------------------------------------------------------------- */

typedef struct input {
    const uint8_t *p;
    size_t n;
} input;

static uint8_t byte_of(input *in) {
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

/* Two bytes of the input, little-endian. */
static size_t u16_of(input *in) {
    size_t lo = byte_of(in);
    return lo | (size_t)byte_of(in) << 8;
}

/* n bytes of the input; zeros once it runs out. */
static void take(input *in, uint8_t *out, size_t n) {
    size_t k = n < in->n ? n : in->n;
    if (k) memcpy(out, in->p, k);
    memset(out + k, 0, n - k);
    in->p += k;
    in->n -= k;
}

/* ---- the oracle: the keys and proofs of auth.h, computed apart -------------- */

typedef struct peer {
    qr_auth *auth;
    bool encrypt;
    uint8_t key_id[16], spec_hash[32], job_key[32];
} peer;

/* [which][encrypt]: 0 this job, 1 another secret, 2 another spec. */
static peer peers[3][2];
static bool has_aes;
static uint8_t nonce_c[32], nonce_s[32], record_key[32];

/* BLAKE2b-256 of label (with its NUL) || a, keyed by key unless NULL. */
static void H(uint8_t out[32], const uint8_t *key, const char *label, const void *a, size_t alen) {
    crypto_generichash_state st;
    crypto_generichash_init(&st, key, key ? 32 : 0, 32);
    crypto_generichash_update(&st, (const unsigned char *)label, strlen(label) + 1);
    if (alen) crypto_generichash_update(&st, a, alen);
    crypto_generichash_final(&st, out, 32);
}

static void make_peer(peer *p, const char *secret, const char *spec, bool encrypt) {
    qr_auth *a = NULL;
    if (qr_auth_new((const uint8_t *)secret, strlen(secret), spec, encrypt, &a) != QR_OK) {
        fprintf(stderr, "fuzz_handshake: qr_auth_new: %s\n", qr_last_error());
        abort();
    }
    p->auth = a;
    p->encrypt = encrypt;
    uint8_t master[32], id[32];
    crypto_generichash(master, 32, (const uint8_t *)secret, strlen(secret), NULL, 0);
    H(id, master, "quorum key id v1", NULL, 0);
    memcpy(p->key_id, id, 16);
    H(p->spec_hash, NULL, "quorum cluster spec v1", spec, strlen(spec));
    H(p->job_key, master, "quorum job key v1", p->spec_hash, 32);
    CHECK(qr_auth_encrypts(a) == encrypt);
    char name[33];
    sodium_bin2hex(name, sizeof name, p->key_id, 16);
    CHECK(strcmp(qr_auth_key_name(a), name) == 0);
}

static void init(void) {
    if (sodium_init() < 0) abort();
    for (int e = 0; e < 2; e++) {
        make_peer(&peers[0][e], SECRET, SPEC, e);
        make_peer(&peers[1][e], OTHER_SECRET, SPEC, e);
        make_peer(&peers[2][e], SECRET, OTHER_SPEC, e);
    }
    has_aes = crypto_aead_aes256gcm_is_available() != 0;
    qr_auth *none = NULL;
    CHECK(qr_auth_new((const uint8_t *)SECRET, QR_SECRET_MIN_BYTES - 1, SPEC, false, &none) ==
          QR_EINVAL && !none);
    for (int i = 0; i < 32; i++) {
        nonce_c[i] = (uint8_t)(NONCE_C_BASE + i);
        nonce_s[i] = (uint8_t)(NONCE_S_BASE + i);
        record_key[i] = (uint8_t)(RECORD_KEY_BASE + i);
    }
}

/* ---- one side, stepped with every check --------------------------------------- */

typedef struct side {
    qr_handshake hs;
    const peer *p;
    /* What the harness saw: T = HELLO || CHALLENGE[0, 40), and the proofs
     * and keys a correct implementation computes from it. */
    uint8_t t[QR_HS_HELLO_LEN + 40];
    uint8_t proof_s[32], proof_c[32], c2s[32], s2c[32];
} side;

static void start(side *s, const peer *p, bool server) {
    memset(s, 0, sizeof *s);
    s->p = p;
    qr_handshake_start(&s->hs, p->auth, server);
    memcpy(s->hs.nonce, server ? nonce_s : nonce_c, 32);
    CHECK(s->hs.state == (server ? QR_HS_WAIT_HELLO : QR_HS_SEND_HELLO));
    CHECK(qr_handshake_want(&s->hs) == (server ? QR_HS_HELLO_LEN : 0));
}

static void hello(side *s, uint8_t out[QR_HS_HELLO_LEN]) {
    qr_handshake_hello(&s->hs, out);
    const peer *p = s->p;
    uint8_t flags = (uint8_t)((p->encrypt ? 1 : 0) | (has_aes ? 2 : 0));
    CHECK(qr_handshake_is_hello(out, QR_HS_HELLO_LEN));
    CHECK(out[4] == QR_HS_VERSION && out[5] == flags && out[6] == 0 && out[7] == 0);
    CHECK(memcmp(out + 8, p->key_id, 16) == 0);
    CHECK(memcmp(out + 24, p->spec_hash, 32) == 0);
    CHECK(memcmp(out + 56, nonce_c, 32) == 0);
    CHECK(s->hs.state == QR_HS_WAIT_CHALLENGE);
    CHECK(qr_handshake_want(&s->hs) == QR_HS_CHALLENGE_LEN);
    memcpy(s->t, out, QR_HS_HELLO_LEN);
}

static bool head_ok(const uint8_t *m, size_t len, size_t want) {
    return len == want && m[0] == 'Q' && m[1] == 'R' && m[2] == 'A' && m[3] == 'U' &&
           m[4] == QR_HS_VERSION && m[7] == 0;
}

static bool all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

/* A refusal as auth.h has it: a head with the status, the rest zero. */
static void check_refusal(const uint8_t *out, size_t len, int refusal) {
    CHECK(head_ok(out, len, len));
    CHECK(out[5] == 0 && out[6] == refusal);
    CHECK(all_zero(out + 8, len - 8));
}

static void derive(side *s) {
    const uint8_t *k = s->p->job_key;
    H(s->proof_s, k, "quorum server proof v1", s->t, sizeof s->t);
    uint8_t buf[sizeof s->t + 64];
    memcpy(buf, s->t, sizeof s->t);
    memcpy(buf + sizeof s->t, s->proof_s, 32);
    H(s->proof_c, k, "quorum client proof v1", buf, sizeof s->t + 32);
    memcpy(buf + sizeof s->t + 32, s->proof_c, 32);
    H(s->c2s, k, "quorum c2s v1", buf, sizeof buf);
    H(s->s2c, k, "quorum s2c v1", buf, sizeof buf);
}

static void check_done(side *s) {
    qr_handshake *hs = &s->hs;
    CHECK(hs->state == QR_HS_DONE);
    CHECK(memcmp(hs->key_tx, hs->server ? s->s2c : s->c2s, 32) == 0);
    CHECK(memcmp(hs->key_rx, hs->server ? s->c2s : s->s2c, 32) == 0);
    CHECK(hs->encrypt == s->p->encrypt);
    CHECK(!hs->aes || (hs->encrypt && has_aes));
}

/* Give the side msg (len bytes) as the peer's next message; check all
 * that must hold of the answer (written to out, QR_HS_MAX_LEN bytes). */
static int step(side *s, const uint8_t *msg, size_t len, uint8_t *out, size_t *out_len) {
    qr_handshake *hs = &s->hs;
    const peer *p = s->p;
    qr_hs_state before = hs->state;
    size_t want = qr_handshake_want(hs);
    /* The caller hands over the bytes of a whole message (secure.c
     * reads exactly `want`); a shorter len must still be refused. */
    size_t cap = len > want ? len : want;
    uint8_t *in = malloc(cap ? cap : 1);
    memset(in, 0, cap);
    if (len) memcpy(in, msg, len);
    *out_len = 12345;
    int rc = qr_handshake_step(hs, in, len, out, out_len);
    free(in);

    if (before == QR_HS_DONE || before == QR_HS_FAILED || before == QR_HS_SEND_HELLO) {
        CHECK(rc != QR_OK);
        CHECK(*out_len == 0 && hs->state == before && qr_handshake_want(hs) == 0);
        return rc;
    }
    CHECK(rc == QR_OK || rc == QR_EAUTH);
    /* A message that carries a refusal (a status byte) is never accepted. */
    CHECK(!(rc == QR_OK && len > 6 && msg[6] != 0));
    if (rc == QR_EAUTH) {
        CHECK(hs->state == QR_HS_FAILED && qr_handshake_want(hs) == 0);
        CHECK(strlen(qr_hs_reason(hs->refusal)) > 0 && strlen(qr_hs_reason_label(hs->refusal)));
        CHECK(strstr(qr_last_error(), qr_hs_reason(hs->refusal)) != NULL);
        if (hs->refused_by_peer) {
            /* Only a well-formed message can say the peer refused. */
            CHECK(before != QR_HS_WAIT_HELLO);
            CHECK(head_ok(msg, len, want) && msg[6] != 0 && hs->refusal == msg[6]);
            CHECK(*out_len == 0);
        } else {
            CHECK(hs->refusal >= 1 && hs->refusal <= QR_HS_REFUSAL_MAX);
            size_t answer = before == QR_HS_WAIT_HELLO   ? QR_HS_CHALLENGE_LEN
                            : before == QR_HS_WAIT_CHALLENGE ? QR_HS_PROOF_LEN
                            : before == QR_HS_WAIT_PROOF     ? QR_HS_RESULT_LEN
                                                             : 0;
            CHECK(*out_len == 0 || *out_len == answer);
            if (*out_len) check_refusal(out, *out_len, hs->refusal);
        }
        return rc;
    }

    /* Accepted: the message was well-formed and proved what it must. */
    CHECK(head_ok(msg, len, want) && msg[6] == 0);
    switch (before) {
    case QR_HS_WAIT_HELLO:
        CHECK(memcmp(msg + 8, p->key_id, 16) == 0);
        CHECK(memcmp(msg + 24, p->spec_hash, 32) == 0);
        CHECK(((msg[5] & 1) != 0) == p->encrypt);
        CHECK(*out_len == QR_HS_CHALLENGE_LEN && head_ok(out, *out_len, QR_HS_CHALLENGE_LEN));
        /* Sessions use AES-256-GCM exactly when both ends have it. */
        CHECK(out[5] == ((p->encrypt ? 1 : 0) | (p->encrypt && has_aes && (msg[5] & 2) ? 2 : 0)));
        CHECK(out[6] == 0 && memcmp(out + 8, nonce_s, 32) == 0);
        memcpy(s->t, msg, QR_HS_HELLO_LEN);
        memcpy(s->t + QR_HS_HELLO_LEN, out, 40);
        derive(s);
        CHECK(memcmp(out + 40, s->proof_s, 32) == 0);
        CHECK(hs->state == QR_HS_WAIT_PROOF && qr_handshake_want(hs) == QR_HS_PROOF_LEN);
        break;
    case QR_HS_WAIT_CHALLENGE:
        CHECK((msg[5] & ~3) == 0 && ((msg[5] & 1) != 0) == p->encrypt);
        CHECK(!(msg[5] & 2) || (p->encrypt && has_aes));
        memcpy(s->t + QR_HS_HELLO_LEN, msg, 40);
        derive(s);
        CHECK(memcmp(msg + 40, s->proof_s, 32) == 0); /* the server knew the job key */
        CHECK(*out_len == QR_HS_PROOF_LEN && head_ok(out, *out_len, QR_HS_PROOF_LEN));
        CHECK(out[5] == 0 && out[6] == 0 && memcmp(out + 8, s->proof_c, 32) == 0);
        CHECK(hs->encrypt == ((msg[5] & 1) != 0) && hs->aes == ((msg[5] & 2) != 0));
        CHECK(hs->state == QR_HS_WAIT_RESULT && qr_handshake_want(hs) == QR_HS_RESULT_LEN);
        break;
    case QR_HS_WAIT_PROOF:
        CHECK(msg[5] == 0 && memcmp(msg + 8, s->proof_c, 32) == 0); /* the client knew it */
        CHECK(*out_len == QR_HS_RESULT_LEN && head_ok(out, *out_len, QR_HS_RESULT_LEN));
        CHECK(out[5] == 0 && out[6] == 0);
        check_done(s);
        CHECK(hs->aes == (s->t[QR_HS_HELLO_LEN + 5] & 2) >> 1);
        break;
    case QR_HS_WAIT_RESULT:
        CHECK(msg[5] == 0 && *out_len == 0);
        check_done(s);
        break;
    default:
        CHECK(!"a step from an unknown state");
    }
    return rc;
}

/* The message the side under test reads next (into msg, 512 bytes; its
 * length returned), from `src`; genuine (glen bytes, NULL if the real peer
 * has none) is what the real peer sent. *real says whether it is exactly
 * the genuine one. SRC_OTHER is handled by the caller for the first
 * message; for the second it is a refusal. */
static size_t pick(input *in, int src, const uint8_t *genuine, size_t glen, size_t want,
                   uint8_t *msg, bool *real) {
    *real = false;
    switch (src) {
    case SRC_GENUINE:
    case SRC_CHANGED:
    case SRC_OTHER:
        if (!genuine) {
            memset(msg, 0, want);
            return want;
        }
        memcpy(msg, genuine, glen);
        if (src == SRC_CHANGED) {
            uint8_t pos = byte_of(in), bits = byte_of(in);
            msg[pos % glen] ^= bits ? bits : 1;
        } else {
            *real = true;
        }
        return glen;
    case SRC_FUZZ_LEN: {
        size_t len = byte_of(in);
        take(in, msg, len);
        return len;
    }
    default:
        take(in, msg, want);
        return want;
    }
}

/* A well-formed refusal with the status the input gives. */
static size_t refusal_msg(input *in, size_t want, uint8_t *msg) {
    uint8_t st = byte_of(in);
    memset(msg, 0, want);
    msg[0] = 'Q', msg[1] = 'R', msg[2] = 'A', msg[3] = 'U', msg[4] = QR_HS_VERSION;
    msg[6] = st ? st : 1;
    return want;
}

/* The peer of another job that SRC_OTHER picks, and the refusal it earns;
 * NULL (if none_ok) for a ps without a secret, which refuses any HELLO. */
static const peer *other_peer(input *in, bool encrypt, bool none_ok, int *refusal) {
    switch (byte_of(in) % (none_ok ? 4 : 3)) {
    case 0: *refusal = QR_HS_OTHER_SECRET; return &peers[1][encrypt];
    case 1: *refusal = QR_HS_OTHER_SPEC; return &peers[2][encrypt];
    case 2: *refusal = QR_HS_ENCRYPT_MISMATCH; return &peers[0][!encrypt];
    default: *refusal = QR_HS_NO_SECRET; return NULL;
    }
}

/* ---- records ------------------------------------------------------------------ */

static uint8_t *copy_of(const uint8_t *p, size_t n) {
    uint8_t *c = malloc(n);
    memcpy(c, p, n);
    return c;
}

/* Open one record (exactly its bytes, copied so that ASan sees any read
 * past them); on success it must be what sealing its plaintext at this
 * position gives, byte for byte. Returns QR_OK or QR_EAUTH. */
static int open_record(qr_sealer *rx, const uint8_t *key, const uint8_t *rec, uint32_t len,
                       uint8_t *plain_out) {
    size_t total = QR_SEAL_OVERHEAD + (size_t)len;
    uint8_t *r = copy_of(rec, total);
    uint64_t counter = rx->counter;
    int rc = qr_unseal(rx, r, len);
    if (rc == QR_OK) {
        CHECK(rx->counter == counter + 1);
        qr_sealer again;
        qr_sealer_init(&again, rx->aes, key);
        again.counter = counter;
        uint8_t *re = malloc(qr_sealed_size(len));
        CHECK(qr_seal(&again, r + QR_SEAL_LEN_BYTES, len, re) == total);
        CHECK(memcmp(re, rec, total) == 0); /* no record opens that was not sealed so */
        if (plain_out) memcpy(plain_out, r + QR_SEAL_LEN_BYTES, len);
        free(re);
        qr_sealer_clear(&again);
    } else {
        CHECK(rc == QR_EAUTH && rx->counter == counter);
    }
    free(r);
    return rc;
}

/* The plaintext of a genuine record: n bytes, the first k from the input. */
static uint8_t *plaintext(input *in, size_t n, size_t k) {
    uint8_t *p = malloc(n ? n : 1);
    take(in, p, k);
    for (size_t i = k; i < n; i++) p[i] = (uint8_t)(i * 31 + 7);
    return p;
}

/* Seal n bytes with tx at rx's position; the caller frees. */
static uint8_t *seal_at(const uint8_t *key, bool aes, uint64_t counter, const uint8_t *plain,
                        size_t n, size_t *wire_len) {
    qr_sealer tx;
    qr_sealer_init(&tx, aes, key);
    tx.counter = counter;
    uint8_t *wire = malloc(qr_sealed_size(n) ? qr_sealed_size(n) : 1);
    *wire_len = qr_seal(&tx, plain, n, wire);
    CHECK(*wire_len == qr_sealed_size(n));
    CHECK(tx.counter == counter + (n + QR_SEAL_MAX_RECORD - 1) / QR_SEAL_MAX_RECORD);
    qr_sealer_clear(&tx);
    return wire;
}

/* The rest of the input as operations on one direction of a session whose
 * sender seals with key_tx and whose receiver opens with key_rx (the same
 * key: a handshake's two ends agree, which step() has checked). Each operation's first byte picks:
 *   0 a record of the input's bytes (its 4-byte length head, then as many
 *     bytes as that length and the tag need);
 *   1 genuine records of a plaintext (one byte: 0-254 its length - 1, then
 *     the plaintext; 255: two more bytes give a length up to 256 KiB of a
 *     fixed pattern, sealed as several records);
 *   2 a genuine record with a byte altered (its length - 1, the position
 *     (two bytes), the bits to flip, the plaintext);
 *   3 a genuine record out of place (how: replayed, ahead or under another
 *     key; by how much; its length - 1; the plaintext). */
static void records(input *in, bool aes, const uint8_t key_tx[32], const uint8_t key_rx[32]) {
    qr_sealer rx;
    qr_sealer_init(&rx, aes, key_rx);
    CHECK(strlen(qr_sealer_cipher(&rx)) > 0);
    for (int ops = 0; in->n && ops < 32; ops++) {
        uint8_t op = byte_of(in);
        switch (op % 4) {
        case 0: {
            uint8_t head[QR_SEAL_LEN_BYTES];
            take(in, head, sizeof head);
            uint32_t v = (uint32_t)head[0] | (uint32_t)head[1] << 8 | (uint32_t)head[2] << 16 |
                         (uint32_t)head[3] << 24;
            uint32_t len = qr_seal_record_len(head);
            CHECK(len == (v >= 1 && v <= QR_SEAL_MAX_RECORD ? v : 0));
            if (!len) return; /* the connection closes */
            size_t total = QR_SEAL_OVERHEAD + (size_t)len;
            if (in->n < total - QR_SEAL_LEN_BYTES) return; /* cut short: it waits for more */
            uint8_t *rec = malloc(total);
            memcpy(rec, head, sizeof head);
            take(in, rec + QR_SEAL_LEN_BYTES, total - QR_SEAL_LEN_BYTES);
            open_record(&rx, key_rx, rec, len, NULL);
            free(rec);
            break;
        }
        case 1: {
            uint8_t b = byte_of(in);
            size_t n = (size_t)b + 1, k = n;
            if (b == 255) n = 1 + u16_of(in) * 4, k = 0;
            uint8_t *plain = plaintext(in, n, k), *got = malloc(n);
            size_t wire_len, at = 0, done = 0;
            uint8_t *wire = seal_at(key_tx, aes, rx.counter, plain, n, &wire_len);
            while (at < wire_len) {
                uint32_t len = qr_seal_record_len(wire + at);
                CHECK(len >= 1 && at + QR_SEAL_OVERHEAD + len <= wire_len);
                CHECK(len == QR_SEAL_MAX_RECORD || at + QR_SEAL_OVERHEAD + len == wire_len);
                CHECK(open_record(&rx, key_rx, wire + at, len, got + done) == QR_OK);
                CHECK(memcmp(got + done, plain + done, len) == 0);
                at += QR_SEAL_OVERHEAD + len;
                done += len;
            }
            CHECK(done == n);
            free(wire);
            free(plain);
            free(got);
            break;
        }
        case 2: {
            size_t n = (size_t)byte_of(in) + 1;
            size_t pos = u16_of(in);
            uint8_t bits = byte_of(in);
            uint8_t *plain = plaintext(in, n, n);
            size_t wire_len;
            uint8_t *wire = seal_at(key_tx, aes, rx.counter, plain, n, &wire_len);
            wire[pos % wire_len] ^= bits ? bits : 1;
            uint32_t len = qr_seal_record_len(wire);
            if (len && len <= n) /* longer: it would wait for bytes that never come */
                CHECK(open_record(&rx, key_rx, wire, len, NULL) == QR_EAUTH);
            free(wire);
            free(plain);
            break;
        }
        default: {
            uint8_t how = byte_of(in), d = byte_of(in);
            size_t n = (size_t)byte_of(in) + 1;
            uint8_t *plain = plaintext(in, n, n);
            uint64_t counter;
            uint8_t key[32];
            memcpy(key, key_tx, 32);
            if (how % 3 == 0 && rx.counter > 0) counter = rx.counter - 1 - d % rx.counter;
            else if (how % 3 == 1) counter = rx.counter + 1 + d;
            else counter = rx.counter, key[d % 32] ^= (uint8_t)(how | 1);
            size_t wire_len;
            uint8_t *wire = seal_at(key, aes, counter, plain, n, &wire_len);
            CHECK(open_record(&rx, key_rx, wire, (uint32_t)n, NULL) == QR_EAUTH);
            free(wire);
            free(plain);
            break;
        }
        }
    }
    qr_sealer_clear(&rx);
}

/* ---- the two sides -------------------------------------------------------------- */

/* After a handshake: the rest of the input as records of its session when
 * the side under test is done (sent by its peer, as a correct peer would
 * seal them), else under the fixed key. */
static void session_records(input *in, side *s, bool aes_bit) {
    if (s->hs.state == QR_HS_DONE) {
        const uint8_t *peer_tx = s->hs.server ? s->c2s : s->s2c;
        records(in, s->hs.aes, peer_tx, s->hs.key_rx);
    } else {
        records(in, aes_bit && has_aes, record_key, record_key);
    }
}

/* The side after its end: refuses another step and changes nothing. */
static void after_end(side *s) {
    uint8_t msg[QR_HS_MAX_LEN] = {0}, *out = malloc(QR_HS_MAX_LEN);
    size_t out_len;
    if (s->hs.state == QR_HS_DONE || s->hs.state == QR_HS_FAILED)
        step(s, msg, sizeof msg, out, &out_len);
    free(out);
    qr_handshake_clear(&s->hs);
}

/* A server under test; its client is real (of this job, or another). */
static void server_side(input *in, bool encrypt, uint8_t sources) {
    int src1 = (sources & 15) % NSRC, src2 = (sources >> 4) % NSRC;
    const peer *me = &peers[0][encrypt], *them = me;
    int expect_refusal = 0;
    if (src1 == SRC_OTHER) them = other_peer(in, encrypt, false, &expect_refusal);
    side cli, srv;
    start(&cli, them, false);
    start(&srv, me, true);
    uint8_t ghello[QR_HS_HELLO_LEN], msg[512], *out = malloc(QR_HS_MAX_LEN),
                                               *cout = malloc(QR_HS_MAX_LEN);
    size_t out_len, cout_len = 0;
    bool real;
    hello(&cli, ghello);

    /* HELLO */
    size_t len = pick(in, src1, ghello, sizeof ghello, QR_HS_HELLO_LEN, msg, &real);
    int rc = step(&srv, msg, len, out, &out_len);
    if (real && them == me) CHECK(rc == QR_OK);
    if (real && them != me) CHECK(rc == QR_EAUTH && srv.hs.refusal == expect_refusal);
    /* The real client reads the CHALLENGE (or the refusal). */
    if (out_len) {
        int crc = step(&cli, out, out_len, cout, &cout_len);
        if (rc) CHECK(crc == QR_EAUTH && cli.hs.refused_by_peer &&
                      cli.hs.refusal == srv.hs.refusal);
        if (!rc && real) CHECK(crc == QR_OK); /* the client's own HELLO: it trusts the server */
        if (crc) cout_len = 0;
    }

    /* PROOF */
    if (srv.hs.state == QR_HS_WAIT_PROOF) {
        bool have = cout_len == QR_HS_PROOF_LEN;
        if (src2 == SRC_OTHER) len = refusal_msg(in, QR_HS_PROOF_LEN, msg);
        else len = pick(in, src2, have ? cout : NULL, QR_HS_PROOF_LEN, QR_HS_PROOF_LEN, msg,
                        &real);
        bool genuine = src2 == SRC_GENUINE && have;
        rc = step(&srv, msg, len, out, &out_len);
        /* A proof made by a real client over the same transcript passes. */
        if (genuine) CHECK(rc == QR_OK);
        if (out_len && cli.hs.state == QR_HS_WAIT_RESULT) {
            int crc = step(&cli, out, out_len, cout, &cout_len);
            CHECK((crc == QR_OK) == (rc == QR_OK));
            if (!crc) {
                CHECK(memcmp(cli.hs.key_tx, srv.hs.key_rx, 32) == 0);
                CHECK(memcmp(cli.hs.key_rx, srv.hs.key_tx, 32) == 0);
                CHECK(cli.hs.aes == srv.hs.aes && cli.hs.encrypt == srv.hs.encrypt);
            }
        }
    }
    after_end(&cli);
    session_records(in, &srv, encrypt);
    after_end(&srv);
    free(out);
    free(cout);
}

/* A client under test; its server is real (of this job, or another). */
static void client_side(input *in, bool encrypt, uint8_t sources) {
    int src1 = (sources & 15) % NSRC, src2 = (sources >> 4) % NSRC;
    const peer *me = &peers[0][encrypt], *them = me;
    int expect_refusal = 0;
    if (src1 == SRC_OTHER) them = other_peer(in, encrypt, true, &expect_refusal);
    side cli, srv;
    start(&cli, me, false);
    start(&srv, them ? them : me, true); /* (not stepped if the ps has no secret) */
    uint8_t ghello[QR_HS_HELLO_LEN], msg[512], *out = malloc(QR_HS_MAX_LEN),
                                               *sout = malloc(QR_HS_MAX_LEN);
    size_t out_len, sout_len;
    bool real;
    hello(&cli, ghello);
    /* The real server answers the client's HELLO. */
    if (them) {
        int srv_rc = step(&srv, ghello, sizeof ghello, sout, &sout_len);
        if (them == me) CHECK(srv_rc == QR_OK);
        else CHECK(srv_rc == QR_EAUTH && srv.hs.refusal == expect_refusal);
    } else {
        qr_handshake_refuse_hello(sout);
        sout_len = QR_HS_CHALLENGE_LEN;
        check_refusal(sout, sout_len, QR_HS_NO_SECRET);
    }

    /* CHALLENGE */
    size_t len = pick(in, src1, sout, sout_len, QR_HS_CHALLENGE_LEN, msg, &real);
    int rc = step(&cli, msg, len, out, &out_len);
    if (real && them == me) CHECK(rc == QR_OK);
    if (real && them != me)
        CHECK(rc == QR_EAUTH && cli.hs.refused_by_peer && cli.hs.refusal == expect_refusal);
    bool genuine_challenge = real && them == me;

    /* RESULT: the real server reads the client's PROOF first. */
    if (cli.hs.state == QR_HS_WAIT_RESULT) {
        bool have = false;
        if (srv.hs.state == QR_HS_WAIT_PROOF) {
            int s2 = step(&srv, out, out_len, sout, &sout_len);
            if (genuine_challenge) CHECK(s2 == QR_OK);
            have = sout_len == QR_HS_RESULT_LEN;
        }
        if (src2 == SRC_OTHER) len = refusal_msg(in, QR_HS_RESULT_LEN, msg);
        else len = pick(in, src2, have ? sout : NULL, QR_HS_RESULT_LEN, QR_HS_RESULT_LEN, msg,
                        &real);
        rc = step(&cli, msg, len, out, &out_len);
        if (src2 == SRC_GENUINE && have && srv.hs.state == QR_HS_DONE) {
            CHECK(rc == QR_OK);
            CHECK(memcmp(cli.hs.key_tx, srv.hs.key_rx, 32) == 0);
            CHECK(memcmp(cli.hs.key_rx, srv.hs.key_tx, 32) == 0);
        }
    }
    after_end(&srv);
    session_records(in, &cli, encrypt);
    after_end(&cli);
    free(out);
    free(sout);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static bool ready;
    if (!ready) {
        init();
        ready = true;
    }
    input in = {data, size};
    uint8_t sel = byte_of(&in);
    bool bit = sel & 4;
    switch (sel & 3) {
    case MODE_SERVER: server_side(&in, bit, byte_of(&in)); break;
    case MODE_CLIENT: client_side(&in, bit, byte_of(&in)); break;
    default: records(&in, bit && has_aes, record_key, record_key); break;
    }
    return 0;
}
