# The BLAS kernels quorum runs (tools/quorum.c, src/common/cpu.c): the
# best the CPU's features allow when nothing set OPENBLAS_CORETYPE, a
# user's value kept, and the choice made, logged once and inherited by the
# tasks of `quorum launch` when OpenBLAS (played by an LD_PRELOAD library)
# chose SSE3 kernels.
add_library(fake_openblas_corename SHARED ${CMAKE_CURRENT_LIST_DIR}/fake_openblas_corename.c)
target_link_libraries(fake_openblas_corename PRIVATE ${CMAKE_DL_LIBS})
add_test(NAME integration_blas_kernel
         COMMAND ${QR_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_blas_kernel.py $<TARGET_FILE:quorum>
                 $<TARGET_FILE:fake_openblas_corename>)
set_tests_properties(integration_blas_kernel PROPERTIES TIMEOUT 300)
