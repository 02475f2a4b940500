/*
 * test_wire_auth.c - the handshake (src/wire/auth.c), the sealed records
 * (src/wire/seal.c) and the secret file (src/wire/secret.c), as pieces:
 * two sides of a handshake talk through buffers here, with no socket.
 *
 * What must hold: two tasks of one job agree on session keys; every way a
 * peer can be wrong (another secret, another spec, --encrypt on one side
 * only, a replayed or altered message, another version) is refused with
 * that reason on both sides; a record opens only once, in order, unaltered.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wire/auth.h"
#include "wire/seal.h"
#include "wire/secret.h"

static const uint8_t secret_a[40] = "secret A: forty bytes of shared secret!";
static const uint8_t secret_b[40] = "secret B: forty bytes of shared secret!";
#define SPEC "ps=127.0.0.1:2222;worker=127.0.0.1:2223"

static qr_auth *make_auth(const uint8_t *secret, const char *spec, bool encrypt) {
    qr_auth *a = NULL;
    assert_int_equal(qr_auth_new(secret, 40, spec, encrypt, &a), QR_OK);
    return a;
}

/* The messages of one handshake, as sent. */
typedef struct transcript {
    uint8_t hello[QR_HS_HELLO_LEN], challenge[QR_HS_CHALLENGE_LEN], proof[QR_HS_PROOF_LEN],
        result[QR_HS_RESULT_LEN];
    size_t challenge_len, proof_len, result_len;
    int server_rc, client_rc;
} transcript;

/* Run a handshake between c and s to its end, recording what was sent.
 * tamper (may be NULL) may change a message before the other side sees it. */
static void run(qr_handshake *c, qr_handshake *s, transcript *t,
                void (*tamper)(int msg, uint8_t *p, size_t len)) {
    memset(t, 0, sizeof *t);
    qr_handshake_hello(c, t->hello);
    if (tamper) tamper(0, t->hello, sizeof t->hello);
    assert_int_equal(qr_handshake_want(s), QR_HS_HELLO_LEN);
    t->server_rc = qr_handshake_step(s, t->hello, sizeof t->hello, t->challenge, &t->challenge_len);
    assert_int_equal(t->challenge_len, QR_HS_CHALLENGE_LEN); /* an answer, or a refusal */
    if (tamper) tamper(1, t->challenge, sizeof t->challenge);
    t->client_rc = qr_handshake_step(c, t->challenge, t->challenge_len, t->proof, &t->proof_len);
    if (t->client_rc || t->server_rc) return;
    assert_int_equal(t->proof_len, QR_HS_PROOF_LEN);
    if (tamper) tamper(2, t->proof, sizeof t->proof);
    t->server_rc = qr_handshake_step(s, t->proof, t->proof_len, t->result, &t->result_len);
    if (t->server_rc) return; /* refused (a RESULT saying so), or the proof was a refusal */
    assert_int_equal(t->result_len, QR_HS_RESULT_LEN);
    if (tamper) tamper(3, t->result, sizeof t->result);
    t->client_rc = qr_handshake_step(c, t->result, t->result_len, t->proof, &t->proof_len);
}

static void test_same_job_agrees_on_keys(void **state) {
    (void)state;
    for (int encrypt = 0; encrypt < 2; encrypt++) {
        qr_auth *ca = make_auth(secret_a, SPEC, encrypt), *sa = make_auth(secret_a, SPEC, encrypt);
        qr_handshake c, s, c2, s2;
        transcript t, t2;
        qr_handshake_start(&c, ca, false);
        qr_handshake_start(&s, sa, true);
        run(&c, &s, &t, NULL);
        assert_int_equal(t.server_rc, QR_OK);
        assert_int_equal(t.client_rc, QR_OK);
        assert_int_equal(c.state, QR_HS_DONE);
        assert_int_equal(s.state, QR_HS_DONE);
        assert_int_equal(qr_handshake_want(&c), 0);
        assert_memory_equal(c.key_tx, s.key_rx, 32);
        assert_memory_equal(c.key_rx, s.key_tx, 32);
        assert_memory_not_equal(c.key_tx, c.key_rx, 32); /* one key per direction */
        assert_int_equal(c.encrypt, encrypt);
        assert_int_equal(s.encrypt, encrypt);
        assert_int_equal(c.aes, s.aes);
        /* A second connection: fresh nonces, so other proofs and keys. */
        qr_handshake_start(&c2, ca, false);
        qr_handshake_start(&s2, sa, true);
        run(&c2, &s2, &t2, NULL);
        assert_int_equal(t2.client_rc, QR_OK);
        assert_memory_not_equal(t.hello + 56, t2.hello + 56, 32);
        assert_memory_not_equal(t.challenge + 8, t2.challenge + 8, 32);
        assert_memory_not_equal(c.key_tx, c2.key_tx, 32);
        /* The secret itself is nowhere on the wire. */
        assert_null(memmem(&t, sizeof t, secret_a, 8));
        qr_auth_free(ca);
        qr_auth_free(sa);
    }
}

/* Both sides fail with `refusal`; the side that did not decide hears it
 * from the other. */
static void expect_refused(qr_auth *ca, qr_auth *sa, int refusal, bool server_decides) {
    qr_handshake c, s;
    transcript t;
    qr_handshake_start(&c, ca, false);
    qr_handshake_start(&s, sa, true);
    run(&c, &s, &t, NULL);
    assert_int_equal(t.client_rc, QR_EAUTH);
    assert_int_equal(c.refusal, refusal);
    assert_int_equal(c.state, QR_HS_FAILED);
    assert_int_equal(qr_handshake_want(&c), 0);
    assert_int_equal(c.refused_by_peer, server_decides);
    if (server_decides) {
        assert_int_equal(t.server_rc, QR_EAUTH);
        assert_int_equal(s.refusal, refusal);
        assert_int_equal(t.challenge[6], refusal); /* the refusal the client read */
        assert_non_null(strstr(qr_last_error(), qr_hs_reason(refusal)));
    }
}

static void test_wrong_peers_are_refused_with_the_reason(void **state) {
    (void)state;
    qr_auth *a = make_auth(secret_a, SPEC, false);
    qr_auth *other_secret = make_auth(secret_b, SPEC, false);
    qr_auth *other_spec = make_auth(secret_a, "ps=127.0.0.1:2222;worker=127.0.0.1:9999", false);
    qr_auth *encrypting = make_auth(secret_a, SPEC, true);
    expect_refused(other_secret, a, QR_HS_OTHER_SECRET, true);
    expect_refused(other_spec, a, QR_HS_OTHER_SPEC, true);
    expect_refused(encrypting, a, QR_HS_ENCRYPT_MISMATCH, true);
    expect_refused(a, encrypting, QR_HS_ENCRYPT_MISMATCH, true);
    /* The reasons read the same from either side. */
    assert_non_null(strstr(qr_hs_reason(QR_HS_OTHER_SECRET), "different secrets"));
    assert_non_null(strstr(qr_hs_reason(QR_HS_OTHER_SPEC), "cluster specs"));
    assert_string_equal(qr_hs_reason_label(QR_HS_BAD_PROOF), "bad_proof");
    qr_auth_free(a);
    qr_auth_free(other_secret);
    qr_auth_free(other_spec);
    qr_auth_free(encrypting);
}

static void test_replayed_handshake_is_refused(void **state) {
    (void)state;
    qr_auth *ca = make_auth(secret_a, SPEC, false), *sa = make_auth(secret_a, SPEC, false);
    qr_handshake c, s;
    transcript t;
    qr_handshake_start(&c, ca, false);
    qr_handshake_start(&s, sa, true);
    run(&c, &s, &t, NULL);
    assert_int_equal(t.client_rc, QR_OK);
    /* An eavesdropper replays the client's HELLO and PROOF on a new
     * connection: the server's new nonce makes the recorded proof wrong. */
    qr_handshake s2;
    qr_handshake_start(&s2, sa, true);
    uint8_t out[QR_HS_MAX_LEN];
    size_t out_len = 0;
    assert_int_equal(qr_handshake_step(&s2, t.hello, sizeof t.hello, out, &out_len), QR_OK);
    assert_int_equal(qr_handshake_step(&s2, t.proof, sizeof t.proof, out, &out_len), QR_EAUTH);
    assert_int_equal(s2.refusal, QR_HS_BAD_PROOF);
    assert_int_equal(out_len, QR_HS_RESULT_LEN);
    assert_int_equal(out[6], QR_HS_BAD_PROOF); /* the RESULT says so */
    /* And a recorded CHALLENGE replayed to a new client (an impostor ps). */
    qr_handshake c2;
    qr_handshake_start(&c2, ca, false);
    uint8_t hello[QR_HS_HELLO_LEN];
    qr_handshake_hello(&c2, hello);
    assert_int_equal(qr_handshake_step(&c2, t.challenge, sizeof t.challenge, out, &out_len),
                     QR_EAUTH);
    assert_int_equal(c2.refusal, QR_HS_BAD_PROOF);
    assert_int_equal(out[6], QR_HS_BAD_PROOF); /* its PROOF refuses instead of proving */
    qr_auth_free(ca);
    qr_auth_free(sa);
}

static int tamper_msg = -1, tamper_byte;
static void flip(int msg, uint8_t *p, size_t len) {
    if (msg == tamper_msg && (size_t)tamper_byte < len) p[tamper_byte] ^= 0x10;
}

static void test_altered_messages_are_refused(void **state) {
    (void)state;
    qr_auth *ca = make_auth(secret_a, SPEC, false), *sa = make_auth(secret_a, SPEC, false);
    /* Every byte of the HELLO, CHALLENGE and PROOF, flipped in turn: the
     * handshake never completes (unused bits are malformed, and the
     * proofs cover every other byte). */
    int sizes[3] = {QR_HS_HELLO_LEN, QR_HS_CHALLENGE_LEN, QR_HS_PROOF_LEN};
    for (tamper_msg = 0; tamper_msg < 3; tamper_msg++)
        for (tamper_byte = 0; tamper_byte < sizes[tamper_msg]; tamper_byte++) {
            qr_handshake c, s;
            transcript t;
            qr_handshake_start(&c, ca, false);
            qr_handshake_start(&s, sa, true);
            run(&c, &s, &t, flip);
            bool ok = t.server_rc == QR_OK && t.client_rc == QR_OK && c.state == QR_HS_DONE &&
                      s.state == QR_HS_DONE;
            if (ok) fail_msg("flipping byte %d of message %d went unnoticed", tamper_byte,
                             tamper_msg);
        }
    tamper_msg = -1;
    qr_auth_free(ca);
    qr_auth_free(sa);
}

static void test_no_secret_and_versions(void **state) {
    (void)state;
    qr_auth *ca = make_auth(secret_a, SPEC, false);
    qr_handshake c;
    qr_handshake_start(&c, ca, false);
    uint8_t hello[QR_HS_HELLO_LEN], refusal[QR_HS_CHALLENGE_LEN], out[QR_HS_MAX_LEN];
    size_t out_len;
    qr_handshake_hello(&c, hello);
    assert_true(qr_handshake_is_hello(hello, 4));
    qr_handshake_refuse_hello(refusal); /* a ps without a secret */
    assert_int_equal(qr_handshake_step(&c, refusal, sizeof refusal, out, &out_len), QR_EAUTH);
    assert_int_equal(c.refusal, QR_HS_NO_SECRET);
    assert_true(c.refused_by_peer);
    assert_int_equal(out_len, 0);
    /* Another handshake version is named as such. */
    qr_auth *sa = make_auth(secret_a, SPEC, false);
    qr_handshake s;
    qr_handshake_start(&s, sa, true);
    hello[4] = QR_HS_VERSION + 1;
    assert_int_equal(qr_handshake_step(&s, hello, sizeof hello, out, &out_len), QR_EAUTH);
    assert_int_equal(s.refusal, QR_HS_VERSION_MISMATCH);
    /* A short secret is refused. */
    qr_auth *a = NULL;
    assert_int_equal(qr_auth_new(secret_a, 31, SPEC, false, &a), QR_EINVAL);
    assert_null(a);
    qr_auth_free(ca);
    qr_auth_free(sa);
}

/* ---- records ------------------------------------------------------------------ */

static void seal_pair(qr_sealer *tx, qr_sealer *rx, bool aes) {
    uint8_t key[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(i * 7 + 1);
    qr_sealer_init(tx, aes, key);
    qr_sealer_init(rx, aes, key);
}

static void test_records_round_trip(void **state) {
    (void)state;
    size_t sizes[] = {1, 64, QR_SEAL_MAX_RECORD, QR_SEAL_MAX_RECORD + 1, 200000};
    for (int aes = 0; aes < 2; aes++) {
        if (aes && !crypto_aead_aes256gcm_is_available()) continue;
        qr_sealer tx, rx;
        seal_pair(&tx, &rx, aes);
        for (size_t k = 0; k < QR_ARRAY_LEN(sizes); k++) {
            size_t n = sizes[k];
            uint8_t *plain = malloc(n), *wire = malloc(qr_sealed_size(n));
            for (size_t i = 0; i < n; i++) plain[i] = (uint8_t)(i * 13 + k);
            size_t len = qr_seal(&tx, plain, n, wire);
            assert_int_equal(len, qr_sealed_size(n));
            if (n >= 16) assert_null(memmem(wire, len, plain, 16)); /* not in the clear */
            size_t at = 0, got = 0;
            while (at < len) {
                uint32_t rlen = qr_seal_record_len(wire + at);
                assert_true(rlen >= 1 && rlen <= QR_SEAL_MAX_RECORD);
                assert_int_equal(qr_unseal(&rx, wire + at, rlen), QR_OK);
                assert_memory_equal(wire + at + QR_SEAL_LEN_BYTES, plain + got, rlen);
                got += rlen;
                at += QR_SEAL_OVERHEAD + rlen;
            }
            assert_int_equal(got, n);
            free(plain);
            free(wire);
        }
    }
}

static void test_records_refuse_tampering_replay_and_reordering(void **state) {
    (void)state;
    for (int aes = 0; aes < 2; aes++) {
        if (aes && !crypto_aead_aes256gcm_is_available()) continue;
        qr_sealer tx, rx;
        uint8_t a[100], b[100], one[100 + QR_SEAL_OVERHEAD], two[100 + QR_SEAL_OVERHEAD],
            copy[sizeof one];
        memset(a, 'a', sizeof a);
        memset(b, 'b', sizeof b);
        /* Any byte altered: length, ciphertext or tag. */
        for (size_t i = 0; i < sizeof one; i++) {
            seal_pair(&tx, &rx, aes);
            qr_seal(&tx, a, sizeof a, one);
            one[i] ^= 1;
            uint32_t len = qr_seal_record_len(one);
            if (len == 0 || len > sizeof a) continue; /* a length out of range: closed anyway */
            if (len != sizeof a) continue;            /* (a shorter one is cut: fails to open) */
            assert_int_equal(qr_unseal(&rx, one, len), QR_EAUTH);
        }
        /* Replayed: the first record twice. */
        seal_pair(&tx, &rx, aes);
        qr_seal(&tx, a, sizeof a, one);
        qr_seal(&tx, b, sizeof b, two);
        memcpy(copy, one, sizeof one);
        assert_int_equal(qr_unseal(&rx, one, sizeof a), QR_OK);
        assert_int_equal(qr_unseal(&rx, copy, sizeof a), QR_EAUTH);
        /* Reordered: the second before the first. */
        seal_pair(&tx, &rx, aes);
        qr_seal(&tx, a, sizeof a, one);
        qr_seal(&tx, b, sizeof b, two);
        assert_int_equal(qr_unseal(&rx, two, sizeof b), QR_EAUTH);
        /* Another key (another connection's) does not open it either. */
        qr_sealer other;
        uint8_t key[32] = {9};
        qr_sealer_init(&other, aes, key);
        seal_pair(&tx, &rx, aes);
        qr_seal(&tx, a, sizeof a, one);
        assert_int_equal(qr_unseal(&other, one, sizeof a), QR_EAUTH);
    }
    uint8_t head[4] = {0, 0, 0, 0};
    assert_int_equal(qr_seal_record_len(head), 0);
    head[2] = 2; /* 128 KiB: over the limit */
    assert_int_equal(qr_seal_record_len(head), 0);
}

/* ---- the secret file ------------------------------------------------------------ */

static void test_secret_file(void **state) {
    (void)state;
    char dir[] = "/tmp/qr-test-secret-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128], other[128];
    snprintf(path, sizeof path, "%s/secret", dir);
    snprintf(other, sizeof other, "%s/other", dir);
    assert_int_equal(qr__write_secret_file(path), QR_OK);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(qr__write_secret_file(path), QR_EEXIST); /* never overwritten */
    uint8_t buf[QR_SECRET_MAX_BYTES + 2];
    size_t len = 0;
    assert_int_equal(qr__read_secret_file(path, buf, &len), QR_OK);
    assert_int_equal(len, 64); /* 32 random bytes as hex; the newline dropped */
    /* Readable by others: refused, naming the fix. */
    chmod(path, 0644);
    assert_int_equal(qr__read_secret_file(path, buf, &len), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "chmod 600"));
    chmod(path, 0640); /* a group may read it (a Kubernetes fsGroup) */
    assert_int_equal(qr__read_secret_file(path, buf, &len), QR_OK);
    /* Too short. */
    int fd = open(other, O_WRONLY | O_CREAT, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "short\n", 6), 6);
    close(fd);
    assert_int_equal(qr__read_secret_file(other, buf, &len), QR_EINVAL);
    assert_non_null(strstr(qr_last_error(), "holds 5 bytes"));
    assert_int_equal(qr__read_secret_file("/nonexistent/secret", buf, &len), QR_EIO);
    unlink(path);
    unlink(other);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_job_agrees_on_keys),
        cmocka_unit_test(test_wrong_peers_are_refused_with_the_reason),
        cmocka_unit_test(test_replayed_handshake_is_refused),
        cmocka_unit_test(test_altered_messages_are_refused),
        cmocka_unit_test(test_no_secret_and_versions),
        cmocka_unit_test(test_records_round_trip),
        cmocka_unit_test(test_records_refuse_tampering_replay_and_reordering),
        cmocka_unit_test(test_secret_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
