# Integration tests: real quorum processes on loopback (see the .py files).
set(QR_INTEGRATION_DIR ${CMAKE_CURRENT_LIST_DIR})
function(qr_integration_test name script)
  add_test(NAME ${name}
           COMMAND ${QR_PYTHON} ${QR_INTEGRATION_DIR}/${script} $<TARGET_FILE:quorum> ${ARGN})
  set_tests_properties(${name} PROPERTIES TIMEOUT 600)
endfunction()

qr_integration_test(integration_hostile_client test_hostile.py)
qr_integration_test(integration_connections test_connections.py)
# What one peer can make a ps without a secret hold, and for how long.
foreach(case half_sent idle locked_out)
  qr_integration_test(integration_bounds_${case} test_bounds.py ${case})
endforeach()
qr_integration_test(integration_launch test_launch.py)
qr_integration_test(integration_launch_env test_launch_env.py)
qr_integration_test(integration_cli test_cli.py)
foreach(case many lost needed hung_chief straggler late sigterm hosts orphaned restart_worker restart_chief
             restart_ps hung hung_ps rollbacks_once ps_after_end)
  qr_integration_test(integration_launch_${case} test_launch_tasks.py ${case})
endforeach()
qr_integration_test(integration_train_digits test_train.py digits)
qr_integration_test(integration_train_fashion test_train.py fashion-mnist)
qr_integration_test(integration_optimizers_digits test_optimizers.py digits)
# Seven Fashion-MNIST runs: about 70 s normally, several minutes under the
# sanitizers, which skip tests labelled slow (scripts/test.sh --sanitize).
qr_integration_test(integration_optimizers_fashion test_optimizers.py fashion-mnist)
set_tests_properties(integration_optimizers_fashion PROPERTIES LABELS slow)
foreach(case determinism digits fashion slow kill ps_lost)
  qr_integration_test(integration_sync_${case} test_sync.py ${case})
endforeach()
qr_integration_test(integration_async_modes test_async_modes.py)
foreach(case sync async pipeline flags)
  qr_integration_test(integration_overlap_${case} test_overlap.py ${case})
endforeach()
# Tasks killed and restarted by hand: in-place rollback, the end of a job.
foreach(case bind ps_restart_async chief_first ps0_restart no_checkpoint ps_gone stop_notice job_ended slow_start
             late_worker stale_socket hung_ps paused_ps)
  qr_integration_test(integration_faults_${case} test_faults.py ${case})
endforeach()
# How every task ends after a fault: its exit status and last line.
foreach(case ps_lost_sync ps_lost_async worker_lost restart_digest chief_lost_async chief_lost_sync
             chief_back chief_lost_launch)
  qr_integration_test(integration_exits_${case} test_exits.py ${case})
endforeach()
qr_integration_test(integration_liveness test_liveness.py)
set_tests_properties(integration_liveness PROPERTIES SKIP_RETURN_CODE 77)
qr_integration_test(integration_waits_bounded test_waits.py)
qr_integration_test(integration_fused_apply test_fused_apply.py)
# Checkpoints: resume, fallback, mismatch, async (safetensors read back
# with the venv's Python, which scripts/test.sh makes).
foreach(case resume fallback mismatch async mixed leftovers)
  qr_integration_test(integration_checkpoint_${case} test_checkpoint.py ${QR_VENV_PYTHON} ${case})
endforeach()
# The checkpoint benchmark end to end on a small model (a smoke test: its
# figures are printed, not checked).
add_test(NAME bench_ckpt_smoke COMMAND quorum bench ckpt --quick --json)
set_tests_properties(bench_ckpt_smoke PROPERTIES TIMEOUT 120)
qr_integration_test(integration_ckpt_tool test_ckpt_tool.py ${QR_VENV_PYTHON}
                    ${PROJECT_SOURCE_DIR}/examples/read_checkpoint.py)
# Incremental checkpoints: a chain merged and restored equals a full
# checkpoint row for row; a damaged or missing link falls back; a table
# with a disk tier (rows changed then spilled are in the increment).
foreach(case equal corrupt tiered)
  qr_integration_test(integration_ckpt_incremental_${case} test_ckpt_incremental.py
                      ${QR_VENV_PYTHON} ${PROJECT_SOURCE_DIR}/examples/read_checkpoint.py ${case})
endforeach()
qr_integration_test(integration_summaries test_summaries.py ${QR_VENV_PYTHON})
qr_integration_test(integration_metrics test_metrics.py)

# Embedding tables: click models trained to the hidden model's AUC, tables
# in checkpoints.
foreach(case train checkpoint)
  qr_integration_test(integration_embeddings_${case} test_embeddings.py ${QR_VENV_PYTHON} ${case})
endforeach()
# A table four times --table-memory-mb: the ps's RssAnon within the cap
# plus a fixed overhead, the AUC of the all-in-memory run (test_table_tier
# checks the rows bit for bit).
qr_integration_test(integration_table_tier test_table_tier.py)
# A full checkpoint and a restore of a table several times the cap,
# streamed: the ps's RssAnon within the cap plus a fixed overhead
# throughout, the checkpoint equal row for row to the all-in-memory run's.
qr_integration_test(integration_table_tier_ckpt test_table_tier_ckpt.py ${QR_VENV_PYTHON}
                    ${PROJECT_SOURCE_DIR}/examples/read_checkpoint.py)
# Two copies of every shard (--ps-replicas 2): the backup equals the
# primary bit for bit, duplicate pushes, REPLICATE's checks; failover in
# place of a killed or stopped ps (views, resent pushes, the fence);
# --replication-lag (answers ahead of the backup, at most that many lost);
# re-replication to a replacement, a replacement killed while being copied
# (rerep_killed), and a second failure after it, also in sync mode
# (sync_rerep: the digest of an unkilled run). Sync
# steps on two copies (sync_train), and a sync step in flight when ps 0,
# 1 or 2 is killed (sync_failover_loop; ps 1 takes ps 0's role over); a
# sync push resent to a live ps 0
# after it closed a worker declared hung (sync_worker_stop). ps 0 killed,
# its replacement (told --coordinator 1) re-replicated, killed and
# replaced again, then a worker restarted (coordinator_rerep, sync and
# async); then ps 1, coordinating since, killed: ps 0's replacement takes
# the role back (coordinator_second, sync and async); 4 ps killed in turn,
# a replacement's next ps a replacement itself (rerep_chain); ps 1
# replaced, then ps 0 killed: ps 1's replacement, serving no shard of its
# own, takes over (coordinator_backup); both copies of a shard lost while
# ps 1 coordinates: the run stops and launch starts it again whole from
# its newest checkpoint (coordinator_both_lost); ps 1, coordinating, lost
# while ps 0's replacement is still being copied: launch starts the
# cluster again whole (coordinator_lost_joining).
foreach(case wire train sync_train failover_wire failover_kill coordinator_kill coordinator_rerep
        coordinator_second coordinator_both_lost coordinator_lost_joining failover_stop
        failover_loop lag
        sync_failover_loop sync_worker_stop rerep rerep_second rerep_killed rerep_chain
        coordinator_backup sync_rerep)
  qr_integration_test(integration_replication_${case} test_replication.py ${case})
endforeach()
# Under the sanitizers these take 80 to 120 s each for paths other cases
# run too: coordinator_backup's takeover is replication_ckpt's
# coordinator_backup without the checkpoints.
set_tests_properties(integration_replication_coordinator_backup PROPERTIES LABELS slow)
# Checkpoints with two copies: each shard written once, by the ps serving
# it (after a failover, the promoted copy), a restart restoring both
# copies, a ps killed while a checkpoint is being written, and a sync run
# resumed to the digest of one never stopped; both copies of a shard lost
# together: the rollback to the last checkpoint, or the abort without one;
# ps 0 killed (coordinator): ps 1 writes the checkpoints from then on.
# ps 1 replaced then ps 0 killed: ps 1's replacement, serving no shard of
# its own, coordinates and writes the checkpoints (coordinator_backup).
# ps 2 hung (SIGSTOP) while a checkpoint asks it: given up, not waited for
# (stop_during).
foreach(case failover kill_during stop_during resume coordinator both_lost both_lost_abort
    restored_positions coordinator_backup)
  qr_integration_test(integration_replication_ckpt_${case} test_replication_ckpt.py ${case})
endforeach()
# stop_during draws runs until a stop lands inside a checkpoint, which
# under the sanitizers' timing it often never does (it then only says so).
set_tests_properties(integration_replication_ckpt_stop_during PROPERTIES LABELS slow)
# Dense variables partitioned over the ps: one tensor to the workers.
qr_integration_test(integration_partition test_partition.py ${QR_VENV_PYTHON})
# Tasks in network namespaces of their own, over veth links with real
# addresses and a rate-limited link, as on separate hosts (root; 77: skip).
qr_integration_test(integration_netns test_netns.py sync)
set_tests_properties(integration_netns PROPERTIES SKIP_RETURN_CODE 77)
# The same hosts, 3 ps of two copies: shard 1's primary and backup cut off
# from each other while ps 0 reaches both; ps 0 fails the backup over.
qr_integration_test(integration_netns_replica_partition test_netns.py replica_partition)
set_tests_properties(integration_netns_replica_partition PROPERTIES SKIP_RETURN_CODE 77)
qr_integration_test(integration_auth test_auth.py)
qr_integration_test(integration_auth_wire test_auth_wire.py)
