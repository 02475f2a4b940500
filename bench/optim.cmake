# Optimizer benchmark: `quorum bench optim` (through quorum_bench) and the
# standalone quorum-bench-optim. -O3 like src/optim, so that the bandwidth
# bound kernel measured beside the optimizers is vectorised as they are.
target_sources(quorum_bench PRIVATE ${CMAKE_CURRENT_LIST_DIR}/bench_optim.c)
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/bench_optim.c PROPERTIES COMPILE_OPTIONS "-O3")

add_executable(quorum-bench-optim ${CMAKE_CURRENT_LIST_DIR}/bench_optim.c)
target_compile_definitions(quorum-bench-optim PRIVATE QR_BENCH_OPTIM_STANDALONE)
target_include_directories(quorum-bench-optim PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(quorum-bench-optim PRIVATE quorum_static)

# Its CTest smoke test (--quick) is registered in tests/unit/optim.cmake.
