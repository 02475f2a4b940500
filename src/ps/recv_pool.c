/*
 * recv_pool.c - the receive buffers of a ps: where pushed gradients (and
 * the discarded values of a repeated CREATE) land.
 *
 * One pool for the whole ps instead of a buffer per connection, handed
 * out last-in first-out. Pushes from different workers mostly arrive one
 * after another, so the buffer a push gets is the one the previous push
 * just used, still in L2: the kernel's copy into it and the scan and apply
 * that read it run at cache speed. With a buffer per worker, four workers
 * cycle through four buffers and every push writes into cold memory
 * (measured with 4 workers and 1 MiB pushes: 0.64-0.78 of the raw-socket
 * baseline, against 0.69-0.98 with the pool). Reuse also spares
 * synchronous pushes a fresh, page-faulting allocation per step.
 *
 * A handful of idle buffers is kept: at most POOL_MAX_IDLE, and beyond
 * POOL_MAX_IDLE_BYTES only the most recent one; the coldest go first.
 */
#include "ps/ps_internal.h"

#include <stdlib.h>

#define POOL_MAX_IDLE QR_RECV_POOL_MAX_IDLE
#define POOL_MAX_IDLE_BYTES ((size_t)256 << 20)
/* Sizes are rounded up so that pushes of slightly different sizes share. */
#define POOL_GRAIN ((size_t)64 << 10)

/* Take idle[i] out of the pool, keeping the others in order. */
static recv_buf remove_at(recv_pool *pool, int i) {
    recv_buf b = pool->idle[i];
    for (int j = i; j < pool->nidle - 1; j++) pool->idle[j] = pool->idle[j + 1];
    pool->nidle--;
    pool->idle_bytes -= b.cap;
    return b;
}

float *qr__recv_pool_get(recv_pool *pool, size_t bytes, size_t *cap) {
    /* The most recently returned buffer that is large enough. */
    for (int i = pool->nidle - 1; i >= 0; i--) {
        if (pool->idle[i].cap < bytes) continue;
        recv_buf b = remove_at(pool, i);
        *cap = b.cap;
        return b.data;
    }
    size_t rounded = (QR_MAX(bytes, 1) + POOL_GRAIN - 1) / POOL_GRAIN * POOL_GRAIN;
    float *data = qr__aligned_alloc_uninit(rounded); /* always received whole */
    if (!data) {
        qr__fail(QR_ENOMEM, "out of memory for a %zu-byte receive buffer", rounded);
        return NULL;
    }
    *cap = rounded;
    return data;
}

static void drop_coldest(recv_pool *pool) {
    free(remove_at(pool, 0).data);
}

void qr__recv_pool_put(recv_pool *pool, float *data, size_t cap) {
    if (!data) return;
    if (pool->nidle == POOL_MAX_IDLE) drop_coldest(pool);
    pool->idle[pool->nidle++] = (recv_buf){data, cap};
    pool->idle_bytes += cap;
    while (pool->nidle > 1 && pool->idle_bytes > POOL_MAX_IDLE_BYTES) drop_coldest(pool);
}

void qr__recv_pool_free(recv_pool *pool) {
    for (int i = 0; i < pool->nidle; i++) free(pool->idle[i].data);
    *pool = (recv_pool){0};
}
