# Wire benchmark: `quorum bench wire` (bench_wire.c in quorum_bench) and the
# standalone quorum-bench-wire, a tiny main that calls the same function.
target_sources(quorum_bench PRIVATE ${CMAKE_CURRENT_LIST_DIR}/bench_wire.c)

add_executable(quorum-bench-wire ${CMAKE_CURRENT_LIST_DIR}/main_wire.c)
target_link_libraries(quorum-bench-wire PRIVATE quorum_bench)

# Its CTest smoke test (--quick --json) is in tests/integration/bench_wire.cmake.
