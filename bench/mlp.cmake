# MLP benchmark: `quorum bench mlp` (through quorum_bench), the forward and
# backward of model/model.c at a worker's shapes. bench/python/bench_mlp.py
# runs it beside torch. Its CTest smoke test is in tests/integration/bench_mlp.cmake.
target_sources(quorum_bench PRIVATE ${CMAKE_CURRENT_LIST_DIR}/bench_mlp.c)
