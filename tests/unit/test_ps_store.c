/*
 * test_ps_store.c - the ps variable store, and above all the copy-on-write
 * rule: a tensor referenced by a reply in flight is never written in place.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "ps/store.h"

static qr_var *make_var(uint32_t id, const char *name, int64_t n) {
    qr_var *v = calloc(1, sizeof *v);
    v->id = id;
    v->name = strdup(name);
    v->ndim = 1;
    v->shape[0] = n;
    v->n = n;
    v->value = qr_tensor_new(n);
    for (int64_t i = 0; i < n; i++) v->value->data[i] = (float)i;
    return v;
}

static void test_copy_on_write(void **state) {
    (void)state;
    qr_var *v = make_var(0, "w", 8);
    /* Exclusive: written in place. */
    float *before = v->value->data;
    assert_int_equal(qr_var_prepare_write(v), QR_OK);
    assert_ptr_equal(v->value->data, before);

    /* A pull reply in flight holds the tensor: the write gets a copy. */
    qr_tensor *in_flight = qr_tensor_ref(v->value);
    assert_int_equal(qr_var_prepare_write(v), QR_OK);
    assert_ptr_not_equal(v->value, in_flight);
    assert_memory_equal(v->value->data, in_flight->data, 8 * sizeof(float));
    v->value->data[3] = 100.0f;
    assert_true(in_flight->data[3] == 3.0f); /* the reply's bytes are untouched */
    /* The old tensor is the variable's spare now: the reply and the spare. */
    assert_ptr_equal(v->spare, in_flight);
    assert_int_equal(in_flight->refs, 2);

    /* A second reply while the first is still being written: the spare is
     * busy, so the next copy goes to a new tensor and the busy one is
     * retired: kept (a reference of the variable's) to be reused once the
     * first reply lets go of it. */
    qr_tensor *second = qr_tensor_ref(v->value);
    assert_int_equal(qr_var_prepare_write(v), QR_OK);
    assert_ptr_not_equal(v->value, second);
    assert_ptr_not_equal(v->value, in_flight);
    assert_ptr_equal(v->spare, second);
    assert_int_equal(v->nretired, 1);
    assert_ptr_equal(v->retired[0], in_flight);
    assert_int_equal(in_flight->refs, 2);
    assert_true(v->value->data[3] == 100.0f);
    float *retired_data = in_flight->data;
    qr_tensor_unref(in_flight);

    /* Both replies done: the next copy reuses the spare's memory. */
    float *spare_data = second->data;
    qr_tensor *third = qr_tensor_ref(v->value);
    qr_tensor_unref(second);
    v->value->data[5] = -7.0f;
    assert_int_equal(qr_var_prepare_write(v), QR_OK);
    assert_ptr_equal(v->value->data, spare_data);
    assert_true(v->value->data[3] == 100.0f && v->value->data[5] == -7.0f);
    assert_ptr_equal(v->spare, third);

    /* A fourth reply while the third still holds the spare: the retired
     * tensor, free now, takes the copy (no new memory) and the busy spare
     * is retired in its place. */
    qr_tensor *fourth = qr_tensor_ref(v->value);
    assert_int_equal(qr_var_prepare_write(v), QR_OK);
    assert_ptr_equal(v->value->data, retired_data);
    assert_true(v->value->data[5] == -7.0f);
    assert_int_equal(v->nretired, 1);
    assert_ptr_equal(v->retired[0], third);
    qr_tensor_unref(third);
    qr_tensor_unref(fourth);
    qr_var_free(v);
}

/* The out-of-place route (qr_var_prepare_spare + qr_var_swap_spare):
 * the next value is written into a spare no reply reads, never into the
 * tensor a reply holds, and a spare's memory is reused once free. */
static void test_write_into_spare(void **state) {
    (void)state;
    qr_var *v = make_var(0, "w", 8);
    /* No spare yet: one is made. */
    qr_tensor *reply1 = qr_tensor_ref(v->value);
    assert_int_equal(qr_var_prepare_spare(v), QR_OK);
    assert_non_null(v->spare);
    assert_ptr_not_equal(v->spare, reply1);
    assert_int_equal(v->spare->refs, 1);
    for (int i = 0; i < 8; i++) v->spare->data[i] = v->value->data[i] + 10.0f;
    qr_var_swap_spare(v);
    assert_true(v->value->data[2] == 12.0f);
    assert_true(reply1->data[2] == 2.0f); /* the reply's bytes are untouched */
    assert_ptr_equal(v->spare, reply1);

    /* The spare is still read by reply1 and the value by reply2: a new
     * spare again, and the busy one is retired for later reuse. */
    qr_tensor *reply2 = qr_tensor_ref(v->value);
    assert_int_equal(qr_var_prepare_spare(v), QR_OK);
    assert_ptr_not_equal(v->spare, reply1);
    assert_ptr_not_equal(v->spare, reply2);
    assert_int_equal(reply1->refs, 2);
    assert_ptr_equal(v->retired[0], reply1);
    assert_true(reply1->data[2] == 2.0f);
    qr_tensor_unref(reply1);
    for (int i = 0; i < 8; i++) v->spare->data[i] = v->value->data[i] + 1.0f;
    qr_var_swap_spare(v);
    assert_true(v->value->data[2] == 13.0f && reply2->data[2] == 12.0f);

    /* reply2 done: its tensor, now the spare, is reused as is. */
    qr_tensor_unref(reply2);
    float *spare_data = v->spare->data;
    assert_int_equal(qr_var_prepare_spare(v), QR_OK);
    assert_ptr_equal(v->spare->data, spare_data);
    qr_var_free(v);
}

static void test_store_ids_and_names(void **state) {
    (void)state;
    qr_store s;
    qr_store_init(&s);
    assert_int_equal(qr_store_add(&s, make_var(3, "a", 4)), QR_OK);
    assert_int_equal(qr_store_add(&s, make_var(40, "b", 2)), QR_OK);
    assert_non_null(qr_store_get(&s, 3));
    assert_null(qr_store_get(&s, 4));
    assert_null(qr_store_get(&s, 1000000));
    assert_string_equal(qr_store_find_name(&s, "b")->name, "b");
    assert_null(qr_store_find_name(&s, "c"));
    assert_int_equal(s.count, 2);
    assert_int_equal(s.bytes, 24);

    qr_var *dup = make_var(3, "z", 1);
    assert_int_equal(qr_store_add(&s, dup), QR_EEXIST);
    qr_var_free(dup);
    qr_var *huge = make_var(QR_MAX_VAR_ID, "h", 1);
    assert_int_equal(qr_store_add(&s, huge), QR_EINVAL);
    qr_var_free(huge);
    qr_store_free(&s);
}

static void test_shape_str(void **state) {
    (void)state;
    char buf[64];
    int64_t shape[2] = {784, 256};
    qr_shape_str(2, shape, buf, sizeof buf);
    assert_string_equal(buf, "[784,256]");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_on_write),
        cmocka_unit_test(test_write_into_spare),
        cmocka_unit_test(test_store_ids_and_names),
        cmocka_unit_test(test_shape_str),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
