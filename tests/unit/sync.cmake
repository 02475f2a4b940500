# Synchronous replicas: exact traces through the C API.
qr_unit_test(test_sync_scenarios ${CMAKE_CURRENT_LIST_DIR}/test_sync_scenarios.c)
