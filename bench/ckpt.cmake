# Checkpoint benchmark: `quorum bench ckpt` (through quorum_bench). Its
# CTest smoke test (--quick) is registered in tests/integration/core.cmake.
target_sources(quorum_bench PRIVATE ${CMAKE_CURRENT_LIST_DIR}/bench_ckpt.c)
