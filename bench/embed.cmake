# Embedding-table benchmark: `quorum bench embed` (through quorum_bench).
# Its CTest smoke test (--quick) is tests/integration/bench_embed.cmake.
target_sources(quorum_bench PRIVATE ${CMAKE_CURRENT_LIST_DIR}/bench_embed.c)
