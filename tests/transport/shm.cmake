# shm backend: frame decoder unit tests, and two-process tests (fork) of the real backend,
# including a peer killed mid-transfer, a stalled peer and a hostile peer corrupting the ring.
plexus_add_test(transport_shm_frame_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/shm_frame_test.cpp
  DEPS plexus_transport_internal LABELS transport TIMEOUT 30)

plexus_add_test(transport_shm_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/shm_test.cpp
  DEPS plexus_transport_internal LABELS transport TIMEOUT 120)

# Which path each message takes (ring or cross-memory pull), in one process.
plexus_add_test(transport_shm_paths_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/shm_paths_test.cpp
  DEPS plexus_transport_internal LABELS transport TIMEOUT 60)
