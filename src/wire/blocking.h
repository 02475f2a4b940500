/*
 * blocking.h - a client of the wire protocol over a plain blocking
 * socket, for a thread that must not share an event loop and sends a
 * small frame now and then (the worker's heartbeat): connect, send and
 * receive whole buffers, and the handshake of auth.h driven by blocking
 * reads with a deadline. Everything else speaks through conn.h.
 */
#ifndef QR_WIRE_BLOCKING_H
#define QR_WIRE_BLOCKING_H

#include "common/addr.h"
#include "wire/auth.h"
#include "wire/seal.h"

/* Connect to addr the way a conn.h connection goes: over a Unix socket
 * for a local one when prefer_unix allows it, else TCP (no Nagle). The
 * socket's descriptor, or -1. */
int qr_blocking_connect(const qr_addr *addr, bool prefer_unix);

/* Does nothing listen at addr? A connect (bounded by timeout_ms) that the
 * other machine's kernel refuses: true for a process that is gone, false
 * for one that accepts (even one stopped: its backlog takes it), for a
 * backlog full, a timeout or an unreachable host (nothing known). */
bool qr_blocking_refused(const qr_addr *addr, bool prefer_unix, int timeout_ms);

/* Send or receive exactly len bytes (retried across signals); false if
 * the peer closed, the socket failed or a timeout set on it passed. */
bool qr_blocking_send_all(int fd, const void *buf, size_t len);
bool qr_blocking_recv_all(int fd, void *buf, size_t len);

/* Run the handshake as the client on the fresh connection fd, each read
 * and write bounded by timeout_ms (the bounds stay on the socket). peer
 * names the other end in a failure's message. On success with
 * encryption, *tx is a new sealer for what this end sends (the caller's to
 * free); otherwise *tx is left alone. */
int qr_blocking_handshake(int fd, const qr_auth *auth, int timeout_ms, const char *peer,
                          qr_sealer **tx);

void qr_blocking_close(int fd);

#endif
