# shm backend: frame decoder unit tests, and two-process tests (fork) of the real backend,
# including a peer killed mid-transfer, a stalled peer and a hostile peer corrupting the ring.
plexus_add_test(transport_shm_frame_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/shm_frame_test.cpp
  DEPS plexus::transport LABELS transport TIMEOUT 30)
target_include_directories(transport_shm_frame_test PRIVATE
  ${PROJECT_SOURCE_DIR}/libs/transport/src)

plexus_add_test(transport_shm_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/shm_test.cpp
  DEPS plexus::transport LABELS transport TIMEOUT 120)
target_include_directories(transport_shm_test PRIVATE ${PROJECT_SOURCE_DIR}/libs/transport/src)
