/*
 * grad_check.c - checks the floats of a pushed gradient for NaN and Inf
 * while the push is still arriving.
 *
 * A ps must know that every gradient of a push is finite before it
 * changes any variable (bad input never corrupts state), so the check is
 * a full pass over the payload. Done after the whole message is in, that
 * pass reads megabytes back from L3 or memory while the worker waits for
 * its answer. Done here, on each piece right after the kernel copied it
 * into the receive buffer, it reads from L2 and mostly fills time the ps
 * would spend waiting for the next piece anyway.
 *
 * The float region of an item is its whole gradient for a dense item and
 * the rows after the int64 indices for a sparse one (indices are checked
 * once the message is complete). Every offset is a multiple of 4, so a
 * region is scanned in whole floats up to the last complete one received.
 * A bf16 or fp16 item is scanned the same way in its own 2-byte elements
 * (its padding is not), then widened to float32 once the push is in
 * (qr__grad_widen): widening is exact, so a NaN or Inf found in the half
 * is the one the float would hold.
 * An item applied as it arrives (fused_apply.c) is not scanned: its apply
 * runs on the same pieces and checks every value it writes.
 */
#include "ps/ps_internal.h"

#include "optim/optim.h"

static void float_region(const push_item *it, uint64_t *lo, uint64_t *hi) {
    const qr_var *v = it->var;
    if (it->nrows >= 0) {
        uint64_t dim = (uint64_t)v->shape[v->ndim - 1];
        *lo = it->offset + 8 * (uint64_t)it->nrows;
        *hi = *lo + 4 * dim * (uint64_t)it->nrows;
    } else {
        *lo = it->offset;
        *hi = it->offset + qr_dt_size(it->dtype) * (uint64_t)v->n;
    }
}

void qr__grad_check_start(grad_check *gc, push_item *items, int nitems) {
    *gc = (grad_check){.items = items, .nitems = nitems};
    for (int i = 0; i < nitems; i++) items[i].nonfinite = false;
}

void qr__grad_check_advance(grad_check *gc, uint64_t got) {
    while (gc->next < gc->nitems) {
        push_item *it = &gc->items[gc->next];
        uint64_t lo, hi;
        float_region(it, &lo, &hi);
        if (gc->done < lo) gc->done = lo;
        uint64_t end = QR_MIN(got, hi);
        uint64_t size = it->nrows >= 0 ? 4 : qr_dt_size(it->dtype);
        if (end > gc->done) {
            end -= (end - gc->done) % size; /* whole elements only */
            const uint8_t *x = it->data + (gc->done - it->offset);
            int64_t count = (int64_t)((end - gc->done) / size);
            if (it->fused) /* the apply checks its results as it writes them */
                qr__fused_advance(it, (int64_t)(gc->done - lo) / 4, (int64_t)(end - lo) / 4);
            else if (!it->nonfinite && size == 4)
                it->nonfinite = !qr_optim_all_finite((const float *)x, count);
            else if (!it->nonfinite)
                it->nonfinite = !qr_dt_half_all_finite(it->dtype, (const uint16_t *)x,
                                                    (size_t)count);
            gc->done = end;
        }
        if (gc->done < hi) return; /* the rest of this item is still on the wire */
        gc->next++;
    }
}

void qr__grad_check_finish(grad_check *gc, uint64_t payload_len) {
    if (gc->items) qr__grad_check_advance(gc, payload_len);
    gc->items = NULL;
}

int qr__grad_widen(qr_ps *ps, push_item *items, int nitems, float **buf, size_t *cap) {
    *buf = NULL;
    *cap = 0;
    size_t floats = 0;
    for (int i = 0; i < nitems; i++)
        if (items[i].dtype != QR_FLOAT32) floats += (size_t)items[i].var->n;
    if (!floats) return QR_OK;
    float *wide = qr__recv_pool_get(&ps->recv_pool, floats * sizeof(float), cap);
    if (!wide) return QR_ENOMEM;
    *buf = wide;
    for (int i = 0; i < nitems; i++) {
        push_item *it = &items[i];
        if (it->dtype == QR_FLOAT32) continue;
        size_t n = (size_t)it->var->n;
        qr_dt_to_f32(it->dtype, wide, it->data, n);
        it->data = (uint8_t *)wide;
        wide += n;
    }
    return QR_OK;
}
