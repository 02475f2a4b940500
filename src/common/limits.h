/*
 * limits.h - the limits on a variable that more than one layer checks: its
 * number of dimensions and the length of its name.
 *
 * They live in common/ rather than in wire/proto.h because the ps store
 * sizes its shape arrays by them (ps/store.h), the worker checks a
 * declaration against them (worker/declare.c) and the wire format carries
 * them (wire/proto.h); common/ is the one folder all three may include
 * without an include pointing up. They keep their QR_PROTO_ names since a
 * CREATE message is where a larger value would be refused.
 */
#ifndef QR_COMMON_LIMITS_H
#define QR_COMMON_LIMITS_H

#define QR_PROTO_MAX_NDIM 8   /* dimensions of a variable's shape */
#define QR_PROTO_MAX_NAME 256 /* bytes of a variable's name, without a NUL */

#endif /* QR_COMMON_LIMITS_H */
