# Checkpoints: the async cut over two in-process ps tasks (a torn cut
# would show as a != b), and the verification of damaged files.
qr_unit_test(test_ckpt_cut ${CMAKE_CURRENT_LIST_DIR}/test_ckpt_cut.c)
# TensorBoard event files: CRC-32C and the bytes of one scalar event.
qr_unit_test(test_summary ${CMAKE_CURRENT_LIST_DIR}/test_summary.c)
# One shard of a checkpoint written and restored by the format alone (no
# ps, no cluster): every value, slot, average and row bit for bit; damaged
# shards refused.
qr_unit_test(test_ckpt_shard ${CMAKE_CURRENT_LIST_DIR}/test_ckpt_shard.c)
