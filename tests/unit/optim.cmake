# Tests of src/optim: hand-computed steps, the API contract, a sync step's
# fused reduce-and-apply against the two passes it replaces, and the
# reference test that runs every optimizer >= 100 steps on random tensors
# and compares each value with PyTorch or an independent formula
# (tests/optim_ref/check_optim.py drives test_optim_ref_driver).
qr_unit_test(test_optim_hand ${CMAKE_CURRENT_LIST_DIR}/test_optim_hand.c)
qr_unit_test(test_optim_api ${CMAKE_CURRENT_LIST_DIR}/test_optim_api.c)
qr_unit_test(test_optim_delta ${CMAKE_CURRENT_LIST_DIR}/test_optim_delta.c)
qr_unit_test(test_optim_reduce_apply ${CMAKE_CURRENT_LIST_DIR}/test_optim_reduce_apply.c)

add_executable(test_optim_ref_driver ${CMAKE_CURRENT_LIST_DIR}/test_optim_ref_driver.c)
target_link_libraries(test_optim_ref_driver PRIVATE quorum_static)
add_test(NAME test_optim_ref
         COMMAND ${QR_VENV_PYTHON} ${PROJECT_SOURCE_DIR}/tests/optim_ref/check_optim.py
                 --driver $<TARGET_FILE:test_optim_ref_driver>)
set_tests_properties(test_optim_ref PROPERTIES TIMEOUT 300)

# Smoke test of the benchmark (small sizes, a few seconds; no timing check).
if(TARGET quorum-bench-optim)
  add_test(NAME test_optim_bench_smoke COMMAND quorum-bench-optim --quick --json)
  set_tests_properties(test_optim_bench_smoke PROPERTIES TIMEOUT 120)
endif()
