/*
 * test_wire_conn.c - the transport (src/wire/conn_*.c) end to end on one
 * libuv loop: a listener and a client over a Unix socket and over TCP.
 *
 * The case here is the one a worker makes all the time: small sends with
 * no callback, which qr_conn_send writes straight into the socket when
 * nothing is queued, handing only what the socket did not take to
 * uv_write. The reader is paused while the client sends more than the
 * socket buffers hold, so some send is cut in the middle (often inside
 * one of its payload buffers) and the rest of it, and every send after
 * it, must follow in order. Each message carries a numbered pattern in
 * three payload buffers of odd sizes; the reader checks every byte and
 * the order once it resumes.
 *
 * Every other send has a callback, as a ps's replies do. A send written
 * whole at once still runs its callback later, never inside
 * qr_conn_send, once, with QR_OK, in the order of the sends, and before
 * the connection's `lost` when it is closed right after.
 *
 * The same runs again on authenticated connections (wire/auth.h) and on
 * encrypted ones (every message sealed in records, wire/seal.h), where a
 * message's bytes reach the reader through records cut anywhere; and a
 * client with another secret is refused on both ends.
 *
 * A connection paused from a message's callback delivers nothing more of
 * the read that message came in until it resumes, then all of it in order
 * (a ps's parked push keeps the requests behind it waiting).
 *
 * A payload placed in stages (qr_conn_expect_rest, a re-replication's
 * snapshot): its length word, then the head it gives the length of, then
 * the rest into buffers named once the head is in; what no call names is
 * discarded and the next message still arrives whole.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/common.h"
#include "wire/conn.h"
#include "wire/secret.h"

#include <sodium.h>

#define MESSAGES 64
#define PIECES 3
static const size_t piece_len[PIECES] = {1000, 40000, 19004}; /* 60004 bytes a message */
#define PAYLOAD (1000 + 40000 + 19004)

typedef struct side {
    uv_loop_t loop;
    qr_conn *server, *client;
    bool connected;
    int received, lost;
    uint8_t *in;               /* the message being received */
    uint8_t *out[MESSAGES][PIECES];
    bool bad;
    char why[200];
    /* send callbacks */
    bool in_send;
    int callbacks, next_callback;
    bool client_lost;
    bool auth;        /* authenticated: pause the server once it is */
    int connect_status;
    int server_lost_status;
} side;

static void on_sent(qr_conn *c, int status, void *ctx) {
    side *s = qr_conn_data(c);
    int k = (int)(intptr_t)ctx;
    if (s->bad) return;
    s->bad = s->in_send || status != QR_OK || k != s->next_callback || s->client_lost;
    if (s->bad)
        snprintf(s->why, sizeof s->why, "callback of send %d (expected %d): status %d%s%s", k,
                 s->next_callback, status, s->in_send ? ", inside qr_conn_send" : "",
                 s->client_lost ? ", after lost" : "");
    s->callbacks++;
    s->next_callback = k + 2;
}

static uint8_t pattern(int msg, size_t i) {
    return (uint8_t)(msg * 31 + i * 7 + (i >> 9));
}

static void on_connected(qr_conn *c, int status) {
    side *s = qr_conn_data(c);
    s->connected = status == QR_OK;
    s->connect_status = status;
    /* The handshake is over on both ends once the client hears so. */
    if (s->connected && s->auth && s->server) qr_conn_pause(s->server);
}

static void on_accepted(qr_listener *l, qr_conn *c) {
    side *s = qr_listener_data(l);
    s->server = c;
    qr_conn_set_data(c, s);
    /* Read nothing until the client has sent everything (with auth, once
     * the handshake is done: on_connected). */
    if (!s->auth) qr_conn_pause(c);
}

static int on_header(qr_conn *c, const qr_frame *f, const uint8_t *meta) {
    (void)meta;
    side *s = qr_conn_data(c);
    if (f->payload_len != PAYLOAD) {
        s->bad = true;
        snprintf(s->why, sizeof s->why, "message %d: payload of %llu bytes", s->received,
                 (unsigned long long)f->payload_len);
        return QR_OK;
    }
    qr_iov iov = {s->in, PAYLOAD};
    return qr_conn_expect(c, &iov, 1);
}

static void on_message(qr_conn *c, const qr_frame *f, const uint8_t *meta) {
    side *s = qr_conn_data(c);
    int k = s->received++;
    if (s->bad) return;
    if (f->request_id != (uint32_t)k + 1 || f->meta_len != 4 || memcmp(meta, &k, 4)) {
        s->bad = true;
        snprintf(s->why, sizeof s->why, "message %d arrived as request %u", k, f->request_id);
        return;
    }
    size_t at = 0;
    for (int p = 0; p < PIECES; p++)
        for (size_t i = 0; i < piece_len[p]; i++, at++)
            if (s->in[at] != pattern(k, at)) {
                s->bad = true;
                snprintf(s->why, sizeof s->why, "message %d: byte %zu is %u, not %u", k, at,
                         s->in[at], pattern(k, at));
                return;
            }
}

static void on_lost(qr_conn *c, int status) {
    side *s = qr_conn_data(c);
    if (status != QR_ESTOPPED)
        fprintf(stderr, "%s lost: %s\n", c == s->client ? "client" : "server", qr_strerror(status));
    if (c == s->client) s->client_lost = true;
    else s->server_lost_status = status;
    s->lost++;
}

static void tick(uv_timer_t *t) {
    (void)t;
}

static bool both_ends_up(const side *s) {
    return (s->connected && s->server) || s->lost;
}

static bool all_in(const side *s) {
    return s->received == MESSAGES || s->bad || s->lost;
}

/* Turn the loop until done(s) or 10 s pass (a 10 ms ticker keeps each
 * turn from sleeping longer). */
static bool turn_until(side *s, bool (*done)(const side *)) {
    uv_timer_t ticker;
    uv_timer_init(&s->loop, &ticker);
    uv_timer_start(&ticker, tick, 10, 10);
    uint64_t end = uv_now(&s->loop) + 10000;
    while (!done(s) && uv_now(&s->loop) < end) uv_run(&s->loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&ticker, NULL);
    uv_run(&s->loop, UV_RUN_NOWAIT);
    return done(s);
}

/* cipher: the one both ends must use (NULL: not encrypted). */
static void small_sends_survive_a_full_socket(const char *address, const qr_auth *auth,
                                              const char *cipher) {
    side *s = calloc(1, sizeof *s);
    assert_non_null(s);
    s->auth = auth != NULL;
    uv_loop_init(&s->loop);
    s->in = malloc(PAYLOAD);
    assert_non_null(s->in);
    qr_conn_events ev = {.connected = on_connected, .header = on_header,
                         .message = on_message, .lost = on_lost, .accepted = on_accepted};
    /* Small buffers: the sends below outgrow them many times over. */
    qr_conn_options opt = {.socket_buffer_bytes = 64 * 1024, .max_payload = 1 << 20,
                           .auth = auth};
    qr_addr addr;
    assert_int_equal(qr_addr_parse(address, &addr), QR_OK);
    qr_listener *l = NULL;
    assert_int_equal(qr_listen(&s->loop, &addr, NULL, !strncmp(address, "127.", 4), &opt, &ev, s, &l),
                     QR_OK);
    assert_int_equal(qr_connect(&s->loop, &addr, false, &opt, &ev, s, &s->client), QR_OK);
    assert_true(turn_until(s, both_ends_up));
    assert_true(s->connected && s->server);
    assert_true(qr_conn_paused(s->server));
    const char *got[2] = {qr_conn_cipher(s->client), qr_conn_cipher(s->server)};
    for (int i = 0; i < 2; i++) {
        if (!cipher) assert_null(got[i]);
        else assert_string_equal(got[i], cipher);
    }

    size_t queued_max = 0;
    for (int k = 0; k < MESSAGES; k++) {
        qr_iov iov[PIECES];
        size_t at = 0;
        for (int p = 0; p < PIECES; p++) {
            s->out[k][p] = malloc(piece_len[p]);
            assert_non_null(s->out[k][p]);
            for (size_t i = 0; i < piece_len[p]; i++) s->out[k][p][i] = pattern(k, at + i);
            at += piece_len[p];
            iov[p] = (qr_iov){s->out[k][p], piece_len[p]};
        }
        qr_frame f = {.type = QR_MSG_PUSH, .request_id = (uint32_t)k + 1};
        s->in_send = true;
        assert_int_equal(qr_conn_send(s->client, &f, &k, 4, iov, PIECES, k % 2 ? NULL : on_sent,
                                      (void *)(intptr_t)k),
                         QR_OK);
        s->in_send = false;
        queued_max = QR_MAX(queued_max, qr_conn_pending_bytes(s->client));
    }
    /* The socket filled up: the later sends waited in libuv's queue. */
    assert_true(queued_max > 0);

    qr_conn_resume(s->server);
    turn_until(s, all_in);
    if (s->bad) fail_msg("%s: %s", address, s->why);
    assert_int_equal(s->lost, 0);
    assert_int_equal(s->received, MESSAGES);
    assert_int_equal(s->callbacks, MESSAGES / 2);

    /* A small send with a callback, written at once, then the connection
     * closed before the loop turns: the callback still comes, first. */
    qr_frame f = {.type = QR_MSG_STEP, .request_id = 999};
    s->in_send = true;
    assert_int_equal(qr_conn_send(s->client, &f, NULL, 0, NULL, 0, on_sent,
                                  (void *)(intptr_t)MESSAGES),
                     QR_OK);
    s->in_send = false;
    assert_int_equal(s->callbacks, MESSAGES / 2);
    qr_conn_close(s->client);
    qr_conn_close(s->server);
    qr_listener_close(l);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    if (s->bad) fail_msg("%s: %s", address, s->why);
    assert_int_equal(s->callbacks, MESSAGES / 2 + 1);
    assert_int_equal(s->lost, 2);
    assert_int_equal(uv_loop_close(&s->loop), 0);
    for (int k = 0; k < MESSAGES; k++)
        for (int p = 0; p < PIECES; p++) free(s->out[k][p]);
    free(s->in);
    free(s);
}

static void unix_address(char *address, size_t len) {
    snprintf(address, len, "unix:/tmp/qr-test-conn-%d.sock", (int)getpid());
}

/* A port the kernel picks as free (tests may run in parallel). */
static void tcp_address(char *address, size_t size) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sin;
    assert_true(fd >= 0 && !bind(fd, (struct sockaddr *)&sin, sizeof sin) &&
                !getsockname(fd, (struct sockaddr *)&sin, &len));
    close(fd);
    snprintf(address, size, "127.0.0.1:%d", ntohs(sin.sin_port));
}

static const uint8_t secret[] = "a secret of thirty-two bytes or more, for tests";
static const uint8_t other_secret[] = "another secret of thirty-two bytes, another job";

static qr_auth *make_auth(const uint8_t *key, bool encrypt) {
    qr_auth *a = NULL;
    assert_int_equal(qr_auth_new(key, 40, "ps=test;worker=test", encrypt, &a), QR_OK);
    return a;
}

static void test_unix(void **state) {
    (void)state;
    char address[96];
    unix_address(address, sizeof address);
    small_sends_survive_a_full_socket(address, NULL, NULL);
}

static void test_tcp(void **state) {
    (void)state;
    char address[64];
    tcp_address(address, sizeof address);
    small_sends_survive_a_full_socket(address, NULL, NULL);
}

static void test_authenticated_and_encrypted(void **state) {
    (void)state;
    /* authenticated only; encrypted (AES-256-GCM where the CPU has it);
     * encrypted with XChaCha20-Poly1305 (a client without AES) */
    for (int variant = 0; variant < 3; variant++) {
        qr_auth *a = make_auth(secret, variant > 0);
        if (variant == 2) qr_auth_without_aes(a);
        const char *cipher = variant == 0 ? NULL
                             : variant == 1 && crypto_aead_aes256gcm_is_available() ? "AES-256-GCM"
                                                                                     : "XChaCha20-Poly1305";
        char address[96];
        unix_address(address, sizeof address);
        small_sends_survive_a_full_socket(address, a, cipher);
        tcp_address(address, sizeof address);
        small_sends_survive_a_full_socket(address, a, cipher);
        qr_auth_free(a);
    }
}

/* A client with another job's secret: its `connected` says why, and the
 * server's end is lost with QR_EAUTH and the same reason. */
static void test_other_secret_refused_on_both_ends(void **state) {
    (void)state;
    qr_auth *mine = make_auth(secret, false), *theirs = make_auth(other_secret, false);
    side *s = calloc(1, sizeof *s);
    assert_non_null(s);
    s->auth = true;
    uv_loop_init(&s->loop);
    qr_conn_events ev = {.connected = on_connected, .header = on_header,
                         .message = on_message, .lost = on_lost, .accepted = on_accepted};
    qr_conn_options server_opt = {.max_payload = 1 << 20, .auth = mine};
    qr_conn_options client_opt = {.max_payload = 1 << 20, .auth = theirs};
    char address[64];
    tcp_address(address, sizeof address);
    qr_addr addr;
    assert_int_equal(qr_addr_parse(address, &addr), QR_OK);
    qr_listener *l = NULL;
    assert_int_equal(qr_listen(&s->loop, &addr, NULL, true, &server_opt, &ev, s, &l), QR_OK);
    assert_int_equal(qr_connect(&s->loop, &addr, false, &client_opt, &ev, s, &s->client), QR_OK);
    uv_timer_t ticker;
    uv_timer_init(&s->loop, &ticker);
    uv_timer_start(&ticker, tick, 10, 10);
    uint64_t end = uv_now(&s->loop) + 10000;
    while (s->lost < 2 && uv_now(&s->loop) < end) uv_run(&s->loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&ticker, NULL);
    assert_int_equal(s->lost, 2);
    assert_int_equal(s->connect_status, QR_EAUTH);
    assert_int_equal(s->server_lost_status, QR_EAUTH);
    assert_int_equal(s->received, 0);
    qr_listener_close(l);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&s->loop), 0);
    free(s);
    qr_auth_free(mine);
    qr_auth_free(theirs);
}

/* ---- a pause in the middle of a read ------------------------------------ */

/* A ps pauses a connection from a message's callback (a push parked for a
 * checkpoint's cut) while the same read holds the peer's next requests.
 * None of them may be delivered until it resumes, and not inside
 * qr_conn_resume; then all, in order. */
#define BURST 100
typedef struct pauser {
    uv_loop_t loop;
    qr_conn *server, *client;
    bool connected, paused, in_resume, bad;
    int received, pauses, lost;
    uv_timer_t resume;
    char why[200];
} pauser;

static void pauser_accepted(qr_listener *l, qr_conn *c) {
    pauser *p = qr_listener_data(l);
    p->server = c;
    qr_conn_set_data(c, p);
}

static void pauser_connected(qr_conn *c, int status) {
    pauser *p = qr_conn_data(c);
    p->connected = status == QR_OK;
}

static int pauser_header(qr_conn *c, const qr_frame *f, const uint8_t *meta) {
    (void)c, (void)f, (void)meta;
    return QR_OK;
}

static void on_resume_due(uv_timer_t *t) {
    pauser *p = t->data;
    p->paused = false;
    p->in_resume = true;
    qr_conn_resume(p->server);
    p->in_resume = false;
}

static void pauser_message(qr_conn *c, const qr_frame *f, const uint8_t *meta) {
    (void)meta;
    pauser *p = qr_conn_data(c);
    if (p->bad) return;
    if (p->paused || p->in_resume || f->request_id != (uint32_t)p->received + 1) {
        p->bad = true;
        snprintf(p->why, sizeof p->why, "request %u delivered %s (expected %d)", f->request_id,
                 p->paused ? "while paused" : p->in_resume ? "inside qr_conn_resume" : "out of order",
                 p->received + 1);
        return;
    }
    if (++p->received % 7 == 0) {
        qr_conn_pause(c);
        p->paused = true;
        p->pauses++;
        uv_timer_start(&p->resume, on_resume_due, 2, 0);
    }
}

static void pauser_lost(qr_conn *c, int status) {
    (void)status;
    pauser *p = qr_conn_data(c);
    p->lost++;
}

/* A listener on a fresh Unix socket and a client connecting to it, on
 * loop, with events ev and owner data: the loop turns until *connected
 * and *server are set (the events' own flags) or 10 s pass. */
static qr_listener *listen_and_connect(uv_loop_t *loop, const qr_conn_events *ev, void *data,
                                       qr_conn **client, const bool *connected,
                                       qr_conn *const *server) {
    qr_conn_options opt = {.max_payload = 1 << 20};
    char address[96];
    unix_address(address, sizeof address);
    qr_addr addr;
    assert_int_equal(qr_addr_parse(address, &addr), QR_OK);
    qr_listener *l = NULL;
    assert_int_equal(qr_listen(loop, &addr, NULL, false, &opt, ev, data, &l), QR_OK);
    assert_int_equal(qr_connect(loop, &addr, false, &opt, ev, data, client), QR_OK);
    uint64_t end = uv_now(loop) + 10000;
    while (!(*connected && *server) && uv_now(loop) < end) uv_run(loop, UV_RUN_ONCE);
    assert_true(*connected && *server);
    return l;
}

static void test_pause_holds_the_rest_of_a_read(void **state) {
    (void)state;
    pauser *p = calloc(1, sizeof *p);
    assert_non_null(p);
    uv_loop_init(&p->loop);
    uv_timer_init(&p->loop, &p->resume);
    p->resume.data = p;
    qr_conn_events ev = {.connected = pauser_connected, .header = pauser_header,
                         .message = pauser_message, .lost = pauser_lost,
                         .accepted = pauser_accepted};
    qr_listener *l = listen_and_connect(&p->loop, &ev, p, &p->client, &p->connected, &p->server);
    /* Every request written before the loop turns: the server reads many
     * of them at once. */
    for (int k = 0; k < BURST; k++) {
        qr_frame f = {.type = QR_MSG_STEP, .request_id = (uint32_t)k + 1};
        assert_int_equal(qr_conn_send(p->client, &f, &k, 4, NULL, 0, NULL, NULL), QR_OK);
    }
    uint64_t end = uv_now(&p->loop) + 10000;
    uv_timer_t ticker; /* so that no turn sleeps past the last message */
    uv_timer_init(&p->loop, &ticker);
    uv_timer_start(&ticker, tick, 10, 10);
    while (p->received < BURST && !p->bad && uv_now(&p->loop) < end) uv_run(&p->loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&ticker, NULL);
    if (p->bad) fail_msg("%s", p->why);
    assert_int_equal(p->received, BURST);
    assert_int_equal(p->pauses, BURST / 7);
    assert_int_equal(p->lost, 0);
    qr_conn_close(p->client);
    qr_conn_close(p->server);
    qr_listener_close(l);
    uv_close((uv_handle_t *)&p->resume, NULL);
    uv_run(&p->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&p->loop), 0);
    free(p);
}

/* ---- a payload placed in stages ------------------------------------------ */

#define STAGED 12
typedef struct stager {
    uv_loop_t loop;
    qr_conn *server, *client;
    bool connected, bad;
    int received, lost;
    uint64_t payload_len, head_len;
    uint8_t len8[8];
    uint8_t head[64];
    uint8_t *rest_a, *rest_b; /* the rest, split where the head says */
    size_t split, named;
    char why[200];
} stager;

/* Message k: its head is 8 + (k % 5) * 8 bytes, its rest 40 KiB + k * 1000
 * (odd k: 100 bytes, read through the staging buffer); bytes numbered. */
static uint64_t staged_head(int k) { return 8 + (uint64_t)(k % 5) * 8; }
static uint64_t staged_rest(int k) { return k % 2 ? 100 : 40 * 1024 + (uint64_t)k * 1000; }
static uint8_t staged_byte(int k, uint64_t i) { return (uint8_t)(k * 13 + i * 5 + (i >> 8)); }

static void stager_accepted(qr_listener *l, qr_conn *c) {
    stager *p = qr_listener_data(l);
    p->server = c;
    qr_conn_set_data(c, p);
}

static void stager_connected(qr_conn *c, int status) {
    stager *p = qr_conn_data(c);
    p->connected = status == QR_OK;
}

static int stager_header(qr_conn *c, const qr_frame *f, const uint8_t *meta) {
    (void)meta;
    stager *p = qr_conn_data(c);
    p->payload_len = f->payload_len;
    p->head_len = 0;
    qr_iov iov = {p->len8, 8};
    return qr_conn_expect_rest(c, &iov, 1);
}

/* The head is in: the rest goes to rest_a and rest_b; every third
 * message, the second two thirds are named nowhere. */
static int name_rest(stager *p, qr_conn *c, int k) {
    uint64_t rest = p->payload_len - p->head_len;
    p->split = (size_t)rest / 3;
    p->named = k % 3 == 2 ? p->split : (size_t)rest;
    qr_iov iov[2] = {{p->rest_a, p->split}, {p->rest_b, p->named - p->split}};
    return qr_conn_expect_rest(c, iov, p->named > p->split ? 2 : 1);
}

static void stager_payload(qr_conn *c, uint64_t got) {
    stager *p = qr_conn_data(c);
    int k = p->received;
    int rc = QR_OK;
    if (!p->head_len && got == 8) {
        memcpy(&p->head_len, p->len8, 8);
        qr_iov iov = {p->head, (size_t)p->head_len - 8};
        rc = p->head_len > 8 ? qr_conn_expect_rest(c, &iov, 1) : name_rest(p, c, k);
    } else if (p->head_len && got == p->head_len) {
        rc = name_rest(p, c, k);
    }
    if (rc && !p->bad) {
        p->bad = true;
        snprintf(p->why, sizeof p->why, "message %d: refused at %llu bytes: %s", k,
                 (unsigned long long)got, qr_last_error());
    }
}

static void stager_message(qr_conn *c, const qr_frame *f, const uint8_t *meta) {
    (void)c, (void)meta;
    stager *p = qr_conn_data(c);
    int k = p->received++;
    if (p->bad) return;
    uint64_t want = staged_head(k) + staged_rest(k);
    if (f->request_id != (uint32_t)k + 1 || f->payload_len != want ||
        p->head_len != staged_head(k)) {
        p->bad = true;
        snprintf(p->why, sizeof p->why, "message %d arrived as request %u of %llu bytes", k,
                 f->request_id, (unsigned long long)f->payload_len);
        return;
    }
    for (uint64_t i = 8; i < p->head_len; i++)
        if (p->head[i - 8] != staged_byte(k, i)) p->bad = true;
    for (size_t i = 0; i < p->named; i++) {
        uint8_t b = i < p->split ? p->rest_a[i] : p->rest_b[i - p->split];
        if (b != staged_byte(k, p->head_len + i)) p->bad = true;
    }
    if (p->bad) snprintf(p->why, sizeof p->why, "message %d: a byte landed wrong", k);
}

static void stager_lost(qr_conn *c, int status) {
    (void)status;
    stager *p = qr_conn_data(c);
    p->lost++;
}

static void test_payload_placed_in_stages(void **state) {
    (void)state;
    stager *p = calloc(1, sizeof *p);
    assert_non_null(p);
    p->rest_a = malloc(64 * 1024);
    p->rest_b = malloc(64 * 1024);
    assert_true(p->rest_a && p->rest_b);
    uv_loop_init(&p->loop);
    qr_conn_events ev = {.connected = stager_connected, .header = stager_header,
                         .payload = stager_payload, .message = stager_message,
                         .lost = stager_lost, .accepted = stager_accepted};
    qr_listener *l = listen_and_connect(&p->loop, &ev, p, &p->client, &p->connected, &p->server);
    uint8_t *out[STAGED];
    for (int k = 0; k < STAGED; k++) { /* all written before the loop turns */
        uint64_t head = staged_head(k), len = head + staged_rest(k);
        out[k] = malloc(len);
        assert_non_null(out[k]);
        memcpy(out[k], &head, 8);
        for (uint64_t i = 8; i < len; i++) out[k][i] = staged_byte(k, i);
        qr_frame f = {.type = QR_MSG_STEP, .request_id = (uint32_t)k + 1};
        qr_iov iov = {out[k], (size_t)len};
        assert_int_equal(qr_conn_send(p->client, &f, NULL, 0, &iov, 1, NULL, NULL), QR_OK);
    }
    uint64_t end = uv_now(&p->loop) + 10000;
    uv_timer_t ticker;
    uv_timer_init(&p->loop, &ticker);
    uv_timer_start(&ticker, tick, 10, 10);
    while (p->received < STAGED && !p->bad && uv_now(&p->loop) < end) uv_run(&p->loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&ticker, NULL);
    if (p->bad) fail_msg("%s", p->why);
    assert_int_equal(p->received, STAGED);
    assert_int_equal(p->lost, 0);
    qr_conn_close(p->client);
    qr_conn_close(p->server);
    qr_listener_close(l);
    uv_run(&p->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&p->loop), 0);
    for (int k = 0; k < STAGED; k++) free(out[k]);
    free(p->rest_a);
    free(p->rest_b);
    free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unix),
        cmocka_unit_test(test_tcp),
        cmocka_unit_test(test_authenticated_and_encrypted),
        cmocka_unit_test(test_other_secret_refused_on_both_ends),
        cmocka_unit_test(test_pause_holds_the_rest_of_a_read),
        cmocka_unit_test(test_payload_placed_in_stages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
