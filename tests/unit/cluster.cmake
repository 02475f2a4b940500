# Unit tests of src/cluster: the cluster spec and placement.
qr_unit_test(test_cluster_spec ${CMAKE_CURRENT_LIST_DIR}/test_cluster_spec.c)
qr_unit_test(test_cluster_placement ${CMAKE_CURRENT_LIST_DIR}/test_cluster_placement.c)
