/*
 * heartbeat.h - the thread that tells ps 0 a worker is alive (heartbeat.c).
 */
#ifndef QR_WORKER_HEARTBEAT_H
#define QR_WORKER_HEARTBEAT_H

#include "common/common.h"
#include "wire/auth.h"

typedef struct qr_heartbeat qr_heartbeat;

/* Send BEAT(worker) to ps0 (its address) every period_ms until stopped;
 * with auth (the worker's credentials, which must outlive it), over an
 * authenticated connection. */
int qr_heartbeat_start(qr_heartbeat **out, const char *ps0, bool prefer_unix, int worker,
                       int period_ms, const qr_auth *auth, int handshake_timeout_ms);
/* The coordinator moved (ps 0 failed over): beat to this address from
 * the next beat on. */
int qr_heartbeat_move(qr_heartbeat *h, const char *coordinator);
void qr_heartbeat_stop(qr_heartbeat *h);

#endif
