# Tables larger than memory: `quorum bench tier` (through quorum_bench).
# Its CTest smoke test is tests/integration/bench_tier.cmake.
target_sources(quorum_bench PRIVATE ${CMAKE_CURRENT_LIST_DIR}/bench_tier.c)
