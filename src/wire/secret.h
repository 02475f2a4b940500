/*
 * secret.h - a task's credentials from its options: the cluster secret
 * read from its file (whose permissions are checked first) and bound to
 * the cluster spec (auth.h), or none when the job has no secret.
 */
#ifndef QR_WIRE_SECRET_H
#define QR_WIRE_SECRET_H

#include "cluster/cluster.h"
#include "wire/auth.h"

/* The secret file a task uses: the secret-file option ("none": none,
 * whatever the environment says), else $QUORUM_SECRET_FILE, else ""
 * (none). */
const char *qr__secret_path(const qr_config *cfg);

/* Read a secret file: its bytes, less one trailing newline. Refused
 * (QR_EINVAL, the message says why and how to fix it) if others may read
 * it or anyone but its owner may write it, if it is shorter than
 * QR_SECRET_MIN_BYTES or longer than QR_SECRET_MAX_BYTES; QR_EIO if it
 * cannot be read. buf holds QR_SECRET_MAX_BYTES + 2 bytes. */
int qr__read_secret_file(const char *path, uint8_t *buf, size_t *len);

/* Write a new secret to path: 32 random bytes as 64 hex digits and a
 * newline, mode 0600. Never overwrites (QR_EEXIST). */
int qr__write_secret_file(const char *path);

/* The spec's canonical text, the part of the job identity the handshake
 * binds: "ps=ADDR,ADDR;worker=ADDR,...". Freed by the caller. */
char *qr__cluster_spec_text(const qr_cluster *cl);

/* The credentials for cfg and cl into *out: NULL when the job has no
 * secret (and then encrypt is refused: it needs one). */
int qr__auth_from_config(const qr_config *cfg, const qr_cluster *cl, qr_auth **out);

#endif /* QR_WIRE_SECRET_H */
