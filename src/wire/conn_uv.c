/*
 * conn_uv.c - the libuv implementation of conn.h over TCP and Unix-domain
 * stream sockets: a connection's life (made, its socket tuned, closed, its
 * handles released), connecting, listening and the accessors.
 *
 * The transport's other files share its state through conn_internal.h:
 * conn_read.c receives (the state machine, in place or staged),
 * conn_write.c sends (writev, written at once, or spliced), conn_secure.c
 * answers the security layer (secure.h), conn_limits.c bounds what a
 * listener's peers may hold. A callback of a send, or the bytes a paused
 * connection held, run from the prepare handle here (on_defer), before the
 * loop next waits.
 */
#include "wire/conn_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

struct qr_listener {
    uv_tcp_t tcp;
    uv_pipe_t pipe;
    bool has_tcp, has_pipe;
    int open_handles;
    char unix_path[108];
    uv_loop_t *loop;
    const qr_conn_events *ev;
    void *data;
    qr_conn_options opt;
    qr_conn_limits *lim; /* shared with the connections it accepted; NULL: none */
};

/* Events of a connection that failed before its owner could see it. */
static const qr_conn_events no_events;

/* ---- connection setup and teardown ------------------------------------ */

/* Writing to a socket whose peer is gone raises SIGPIPE, whose default
 * action kills the process: a ps would die with the worker it was
 * answering. libuv writes with writev (no MSG_NOSIGNAL) and Linux has no
 * SO_NOSIGPIPE, so the signal is ignored process-wide, unless the program
 * installed a handler of its own. The failed write then returns EPIPE and
 * closes that one connection. */
static void ignore_sigpipe(void) {
    struct sigaction old;
    if (sigaction(SIGPIPE, NULL, &old) == 0 && old.sa_handler == SIG_DFL)
        signal(SIGPIPE, SIG_IGN);
}

static qr_conn *conn_new(uv_loop_t *loop, bool is_tcp, const qr_conn_options *opt,
                         const qr_conn_events *ev, void *data) {
    ignore_sigpipe();
    qr_conn *c = qr__calloc(1, sizeof *c);
    if (!c) return NULL;
    /* A connection that must authenticate gets its staging buffer only
     * once it has: until then it holds a few hundred bytes (hs_buf), so
     * connections opened by someone without the secret cost the ps little. */
    if (!opt->auth && qr__conn_alloc_staging(c)) {
        free(c);
        return NULL;
    }
    c->loop = loop;
    c->is_tcp = is_tcp;
    c->opt = *opt;
    c->ev = ev;
    c->data = data;
    qr_secure_init(&c->sec, &qr__conn_secure_io, c, c->peer, opt->handshake_timeout_ms);
    c->state = RX_HEADER;
    c->splicer.pipe[0] = c->splicer.pipe[1] = -1;
    c->splice_fd = -1;
    c->open_handles = 1;
    if (is_tcp)
        uv_tcp_init(loop, &c->h.tcp);
    else
        uv_pipe_init(loop, &c->h.pipe, 0);
    c->h.handle.data = c;
    return c;
}

static void conn_free(qr_conn *c) {
    qr_secure_free(&c->sec);
    free(c->meta);
    free(c->iov);
    free(c->staging);
    free(c->held);
    free(c);
}

void qr__conn_release(qr_conn *c) {
    if (--c->open_handles == 0) conn_free(c);
}

static void on_defer(uv_prepare_t *h) {
    qr_conn *c = h->data;
    qr__conn_finish_written(c);
    uv_prepare_stop(h);
    if (c->budget_granted) qr__conn_budget_granted(c);
    qr__conn_walk_held(c);
}

/* Run on_defer before the loop next waits. */
void qr__conn_defer(qr_conn *c) {
    if (!c->defer_ready) {
        uv_prepare_init(c->loop, &c->defer); /* cannot fail */
        c->defer.data = c;
        c->defer_ready = true;
        c->open_handles++;
    }
    uv_prepare_start(&c->defer, on_defer);
}

static void on_defer_closed(uv_handle_t *h) {
    qr__conn_release(h->data);
}

static void on_close(uv_handle_t *h) {
    qr_conn *c = h->data;
    qr__conn_finish_written(c);
    qr__conn_fail_spliced(c, c->close_status);
    if (c->ev->lost) c->ev->lost(c, c->close_status);
    if (c->lim) qr__conn_limits_lost(c);
    qr__conn_release(c);
}

static void on_splice_poll_closed(uv_handle_t *h) {
    qr__conn_release(h->data);
}

static void on_hs_timer_closed(uv_handle_t *h) {
    qr__conn_release(h->data);
}

void qr__conn_close_with(qr_conn *c, int status) {
    if (c->closing) return;
    c->closing = true;
    c->close_status = status;
    if (c->lim) qr__conn_limits_close(c);
    if (c->splice_ready) {
        /* Every descriptor of the socket and the pipe is closed before
         * this returns, so the kernel drops the pages lent to them: the
         * buffers of the failed sends may be reused at once. */
        uv_close((uv_handle_t *)&c->splice_poll, on_splice_poll_closed);
        close(c->splice_fd);
        c->splice_fd = -1;
        qr_splicer_close(&c->splicer);
    }
    /* The stream's close callback runs the deferred send callbacks (before
     * `lost`), so this handle's may come after it. */
    if (c->defer_ready) uv_close((uv_handle_t *)&c->defer, on_defer_closed);
    if (c->hs_timer_ready) uv_close((uv_handle_t *)&c->hs_timer, on_hs_timer_closed);
    uv_close(&c->h.handle, on_close);
}

void qr_conn_close(qr_conn *c) {
    if (c) qr__conn_close_with(c, QR_ESTOPPED);
}

/* A TCP peer whose process dies is seen at once (its kernel closes the
 * connection), but one whose machine or network goes away sends nothing:
 * an idle connection would stay open forever, and one with data waiting
 * for an acknowledgement for about 15 minutes of retransmissions. Within
 * peer_timeout_ms either way: keepalive probes start after half of it of
 * silence and a few unanswered ones close the connection; TCP_USER_TIMEOUT
 * bounds how long sent data may stay unacknowledged. A live peer's kernel
 * answers probes even while its process computes, so a slow worker is
 * never mistaken for a dead one. Unix sockets need none of this: a peer on
 * this machine cannot vanish without its end being closed. */
static void set_liveness(qr_conn *c) {
    int ms = c->opt.peer_timeout_ms;
    uv_os_fd_t fd;
    if (!c->is_tcp || ms <= 0 || uv_fileno(&c->h.handle, &fd)) return;
    int total = QR_MAX(ms / 1000, 2); /* keepalive counts whole seconds */
    int idle = total / 2;
    int interval = QR_MAX((total - idle) / 5, 1);
    int probes = QR_MAX((total - idle) / interval, 1);
    int on = 1;
    unsigned int user_timeout = (unsigned int)ms;
    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval) ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes) ||
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout))
        qr__log(QR_LOG_WARN, "connection to %s: cannot set keepalive (%s); a vanished peer "
                "may go unnoticed", c->peer, strerror(errno));
}

static void tune_socket(qr_conn *c) {
    if (c->is_tcp) uv_tcp_nodelay(&c->h.tcp, 1);
    set_liveness(c);
    int size = c->opt.socket_buffer_bytes;
    if (size > 0) {
        /* Small default buffers made 1 MiB transfers 3-5x slower on Unix
         * sockets when this was measured; the size comes from the
         * socket-buffer-kb option (common/config.c). */
        uv_send_buffer_size(&c->h.handle, &size);
        size = c->opt.socket_buffer_bytes;
        uv_recv_buffer_size(&c->h.handle, &size);
    }
}

/* ---- accessors ------------------------------------------------------------ */

void qr_conn_set_data(qr_conn *c, void *data) {
    c->data = data;
}
void *qr_conn_data(const qr_conn *c) {
    return c->data;
}
const char *qr_conn_kind(const qr_conn *c) {
    return c->is_tcp ? "tcp" : "unix";
}
const char *qr_conn_peer(const qr_conn *c) {
    return c->peer;
}
uint64_t qr_conn_messages_in(const qr_conn *c) {
    return c->messages_in;
}
int qr_conn_refusal(const qr_conn *c) {
    return qr_secure_refusal(&c->sec);
}
const char *qr_conn_cipher(const qr_conn *c) {
    return qr_secure_cipher(&c->sec);
}
const char *qr_conn_refusal_message(const qr_conn *c) {
    return qr_secure_reason(&c->sec);
}
void *qr_listener_data(const qr_listener *l) {
    return l->data;
}

/* ---- connecting ------------------------------------------------------------ */

static int resolve(const qr_addr *a, struct sockaddr_storage *ss) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    char port[16];
    snprintf(port, sizeof port, "%d", a->port);
    int rc = getaddrinfo(a->host, port, &hints, &res);
    if (rc || !res)
        return qr__fail(QR_EINVAL, "cannot resolve host '%s': %s", a->host, gai_strerror(rc));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return QR_OK;
}

static void on_connect(uv_connect_t *req, int status) {
    qr_conn *c = req->data;
    if (status == 0) {
        c->connected = true;
        tune_socket(c);
        if (c->opt.auth) {
            /* `connected` comes once the handshake is done (secure.c). */
            int hrc = qr_secure_start(&c->sec, c->opt.auth, false);
            if (!hrc) hrc = qr__conn_start_reading(c);
            if (hrc) qr_secure_lost(&c->sec, hrc);
            return;
        }
        if (qr__conn_start_reading(c)) status = UV_EIO;
    }
    int rc = status ? qr__conn_from_uv(status) : QR_OK;
    if (rc) qr__fail(rc, "cannot connect to %s: %s", c->peer, uv_strerror(status));
    if (c->ev->connected) c->ev->connected(c, rc);
    if (rc) qr__conn_close_with(c, rc);
}

int qr_connect(uv_loop_t *loop, const qr_addr *addr, bool prefer_unix,
               const qr_conn_options *opt, const qr_conn_events *ev, void *data,
               qr_conn **out) {
    char unix_path[108] = "";
    if (addr->kind == QR_ADDR_UNIX) {
        snprintf(unix_path, sizeof unix_path, "%s", addr->path);
    } else if (prefer_unix && addr->loopback) {
        struct stat st;
        if (qr_addr_local_unix_path(addr, unix_path, sizeof unix_path) == QR_OK &&
            (stat(unix_path, &st) != 0 || !S_ISSOCK(st.st_mode)))
            unix_path[0] = 0; /* the ps serves no Unix socket (yet): use TCP */
    }
    struct sockaddr_storage ss;
    if (!unix_path[0]) {
        int rc = resolve(addr, &ss);
        if (rc) return rc;
    }
    qr_conn *c = conn_new(loop, !unix_path[0], opt, ev, data);
    if (!c) return QR_ENOMEM;
    c->connect_req.data = c;
    int rc;
    if (unix_path[0]) {
        snprintf(c->peer, sizeof c->peer, "unix:%s", unix_path);
        uv_pipe_connect(&c->connect_req, &c->h.pipe, unix_path, on_connect);
        rc = 0;
    } else {
        snprintf(c->peer, sizeof c->peer, "%s:%d", addr->host, addr->port);
        rc = uv_tcp_connect(&c->connect_req, &c->h.tcp, (struct sockaddr *)&ss, on_connect);
    }
    if (rc) {
        int status = qr__fail(QR_EIO, "cannot connect to %s: %s", c->peer, uv_strerror(rc));
        c->closing = true;
        c->ev = &no_events;
        uv_close(&c->h.handle, on_close);
        return status;
    }
    *out = c;
    return QR_OK;
}

/* ---- listening ------------------------------------------------------------ */

static void on_connection(uv_stream_t *server, int status) {
    qr_listener *l = server->data;
    if (status < 0) {
        qr__log(QR_LOG_WARN, "accept failed: %s", uv_strerror(status));
        return;
    }
    bool is_tcp = server->type == UV_TCP;
    qr_conn *c = conn_new(l->loop, is_tcp, &l->opt, l->ev, l->data);
    if (!c) return;
    if (uv_accept(server, &c->h.stream)) {
        c->closing = true;
        c->ev = &no_events;
        uv_close(&c->h.handle, on_close);
        return;
    }
    c->connected = true;
    c->accepted = true;
    if (l->lim) qr__conn_limits_attach(c, l->lim);
    if (is_tcp) {
        struct sockaddr_storage ss;
        int len = sizeof ss;
        char host[64] = "?";
        int port = 0;
        if (uv_tcp_getpeername(&c->h.tcp, (struct sockaddr *)&ss, &len) == 0) {
            if (ss.ss_family == AF_INET) {
                uv_ip4_name((struct sockaddr_in *)&ss, host, sizeof host);
                port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
            } else {
                struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
                port = ntohs(sin6->sin6_port);
                if (IN6_IS_ADDR_V4MAPPED(&sin6->sin6_addr)) /* an IPv4 peer of a "::" listener */
                    inet_ntop(AF_INET, &sin6->sin6_addr.s6_addr[12], host, sizeof host);
                else
                    uv_ip6_name(sin6, host, sizeof host);
            }
        }
        snprintf(c->peer, sizeof c->peer, "%s:%d", host, port);
    } else {
        /* A Unix socket's peer has no address: its process says who it is. */
        struct ucred cred;
        socklen_t len = sizeof cred;
        uv_os_fd_t fd;
        if (!uv_fileno(&c->h.handle, &fd) &&
            !getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len))
            snprintf(c->peer, sizeof c->peer, "unix:%s (pid %d, uid %u)", l->unix_path,
                     (int)cred.pid, (unsigned)cred.uid);
        else
            snprintf(c->peer, sizeof c->peer, "unix:%s", l->unix_path);
    }
    tune_socket(c);
    /* Accepted at once, before the handshake, so the owner's cap on
     * connections (max-connections) counts those still authenticating. */
    if (l->ev->accepted) l->ev->accepted(l, c);
    if (!c->closing && c->opt.auth && qr_secure_start(&c->sec, c->opt.auth, true)) {
        qr__conn_close_with(c, QR_ENOMEM);
        return;
    }
    /* The owner may have paused or closed it already. */
    if (!c->paused && !c->closing && qr__conn_start_reading(c)) qr__conn_close_with(c, QR_EIO);
}

static void on_listener_close(uv_handle_t *h) {
    qr_listener *l = h->data;
    if (--l->open_handles == 0) {
        qr__conn_limits_unref(l->lim);
        free(l);
    }
}

const char *qr_listener_unix_path(const qr_listener *l) {
    return l && l->has_pipe ? l->unix_path : NULL;
}

void qr_listener_close(qr_listener *l) {
    if (!l) return;
    if (l->has_pipe) {
        unlink(l->unix_path);
        uv_close((uv_handle_t *)&l->pipe, on_listener_close);
    }
    if (l->has_tcp) uv_close((uv_handle_t *)&l->tcp, on_listener_close);
}

/* Make way for a Unix socket at path. A socket file left by a killed
 * (SIGKILLed) process would make bind fail, and is removed: stale when
 * `owned` (the TCP bind of the same address, done first, proved no live
 * process serves it), else when nothing listens on it. A socket a live
 * process listens on, or a file that is no socket, is refused, naming it:
 * removing it would steal another task's address. */
static int clear_stale_socket(const char *path, bool owned) {
    struct stat st;
    if (lstat(path, &st)) return QR_OK;
    if (!S_ISSOCK(st.st_mode))
        return qr__fail(QR_EIO, "cannot listen on unix:%s: it exists and is not a socket", path);
    if (!owned) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int rc = fd < 0 ? -1 : connect(fd, (struct sockaddr *)&sa, sizeof sa);
        int e = errno;
        if (fd >= 0) close(fd);
        if (!rc || e != ECONNREFUSED)
            return qr__fail(QR_EIO, "cannot listen on unix:%s: %s", path,
                            rc ? strerror(e) : "another process listens on it");
    }
    if (unlink(path) && errno != ENOENT)
        return qr__fail(QR_EIO, "cannot remove the stale socket unix:%s: %s", path,
                        strerror(errno));
    return QR_OK;
}

static int listen_unix(qr_listener *l, const char *path, bool owned) {
    snprintf(l->unix_path, sizeof l->unix_path, "%s", path);
    int rc = clear_stale_socket(path, owned);
    if (rc) return rc;
    uv_pipe_init(l->loop, &l->pipe, 0);
    l->pipe.data = l;
    l->has_pipe = true;
    l->open_handles++;
    rc = uv_pipe_bind(&l->pipe, path);
    if (!rc) rc = uv_listen((uv_stream_t *)&l->pipe, 128, on_connection);
    if (rc) return qr__fail(QR_EIO, "cannot listen on unix:%s: %s", path, uv_strerror(rc));
    return QR_OK;
}

/* The address to bind: bind_host (any interface: "0.0.0.0", or "::" for
 * IPv4 and IPv6 together) at addr's port, or addr itself. */
static int resolve_bind(const qr_addr *addr, const char *bind_host,
                        struct sockaddr_storage *ss) {
    if (!bind_host || !*bind_host) return resolve(addr, ss);
    qr_addr at = *addr;
    snprintf(at.host, sizeof at.host, "%s", bind_host);
    return resolve(&at, ss);
}

int qr_listen(uv_loop_t *loop, const qr_addr *addr, const char *bind_host, bool tcp_only,
              const qr_conn_options *opt, const qr_conn_events *ev, void *data,
              qr_listener **out) {
    qr_listener *l = qr__calloc(1, sizeof *l);
    if (!l) return QR_ENOMEM;
    l->loop = loop;
    l->ev = ev;
    l->data = data;
    l->opt = *opt;
    int rc = qr__conn_limits_new(opt, &l->lim);
    if (rc) {
        free(l);
        return rc;
    }
    if (addr->kind == QR_ADDR_UNIX) {
        rc = listen_unix(l, addr->path, false);
    } else {
        struct sockaddr_storage ss;
        rc = resolve_bind(addr, bind_host, &ss);
        if (rc) {
            qr__conn_limits_unref(l->lim);
            free(l);
            return rc;
        }
        uv_tcp_init(loop, &l->tcp);
        l->tcp.data = l;
        l->has_tcp = true;
        l->open_handles++;
        int urc = uv_tcp_bind(&l->tcp, (struct sockaddr *)&ss, 0);
        if (!urc) urc = uv_listen((uv_stream_t *)&l->tcp, 128, on_connection);
        if (urc) {
            rc = qr__fail(QR_EIO, "cannot listen on %s:%d: %s",
                          bind_host && *bind_host ? bind_host : addr->host, addr->port,
                          uv_strerror(urc));
        } else if (addr->loopback) {
            /* TCP only: no Unix socket, but one a killed run of this
             * address left would still draw local peers to it. */
            char path[108];
            rc = qr_addr_local_unix_path(addr, path, sizeof path);
            if (!rc) rc = tcp_only ? clear_stale_socket(path, true) : listen_unix(l, path, true);
        }
    }
    if (rc) {
        if (!l->open_handles) free(l); /* refused before any handle was made */
        else qr_listener_close(l);
        return rc;
    }
    *out = l;
    return QR_OK;
}
