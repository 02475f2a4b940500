# Training regimes through the C API: synchronous replicas (exact traces,
# and the push-and-pull in one round trip),
# the asynchronous modes, embedding tables (and their memory per row),
# dense variables partitioned over several ps, non-trainable variables
# (buffers) and data positions kept without checkpoints.
qr_unit_test(test_sync_scenarios ${CMAKE_CURRENT_LIST_DIR}/test_sync_scenarios.c)
qr_unit_test(test_sync_one_trip ${CMAKE_CURRENT_LIST_DIR}/test_sync_one_trip.c)
qr_unit_test(test_async_modes ${CMAKE_CURRENT_LIST_DIR}/test_async_modes.c)
qr_unit_test(test_embedding ${CMAKE_CURRENT_LIST_DIR}/test_embedding.c)
qr_unit_test(test_partition ${CMAKE_CURRENT_LIST_DIR}/test_partition.c)
qr_unit_test(test_slots ${CMAKE_CURRENT_LIST_DIR}/test_slots.c)
qr_unit_test(test_table_tier ${CMAKE_CURRENT_LIST_DIR}/test_table_tier.c)
qr_unit_test(test_table_memory ${CMAKE_CURRENT_LIST_DIR}/test_table_memory.c)
set_tests_properties(test_table_memory PROPERTIES LABELS slow)
qr_unit_test(test_buffers ${CMAKE_CURRENT_LIST_DIR}/test_buffers.c)
