# Unit tests of the common layer (options, addresses), the wire codec and
# the ps store.
qr_unit_test(test_wire_proto ${CMAKE_CURRENT_LIST_DIR}/test_wire_proto.c)
qr_unit_test(test_wire_msg ${CMAKE_CURRENT_LIST_DIR}/test_wire_msg.c)
qr_unit_test(test_common_config ${CMAKE_CURRENT_LIST_DIR}/test_common_config.c)
qr_unit_test(test_common_dtype ${CMAKE_CURRENT_LIST_DIR}/test_common_dtype.c)
qr_unit_test(test_common_cpu ${CMAKE_CURRENT_LIST_DIR}/test_common_cpu.c)
qr_unit_test(test_common_addr ${CMAKE_CURRENT_LIST_DIR}/test_common_addr.c)
qr_unit_test(test_ps_store ${CMAKE_CURRENT_LIST_DIR}/test_ps_store.c)
qr_unit_test(test_api_inprocess ${CMAKE_CURRENT_LIST_DIR}/test_api_inprocess.c)
qr_unit_test(test_ps_grad_check ${CMAKE_CURRENT_LIST_DIR}/test_ps_grad_check.c)
qr_unit_test(test_wire_splice ${CMAKE_CURRENT_LIST_DIR}/test_wire_splice.c)
qr_unit_test(test_wire_conn ${CMAKE_CURRENT_LIST_DIR}/test_wire_conn.c)
qr_unit_test(test_wire_auth ${CMAKE_CURRENT_LIST_DIR}/test_wire_auth.c)
