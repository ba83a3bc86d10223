# Bootstrap: key-value stores, rendezvous from launcher environments, plexus-run.
add_executable(bootstrap_helper ${CMAKE_CURRENT_LIST_DIR}/bootstrap_helper.cpp)
target_link_libraries(bootstrap_helper PRIVATE plexus::transport)
plexus_target_defaults(bootstrap_helper)

plexus_add_test(bootstrap_protocol_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/bootstrap_protocol_test.cpp
  DEPS plexus_transport_internal LABELS transport TIMEOUT 60)

plexus_add_test(bootstrap_store_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/bootstrap_store_test.cpp
  DEPS plexus_transport_internal plexus::tooling LABELS transport TIMEOUT 120)
target_compile_definitions(bootstrap_store_test PRIVATE
  BOOTSTRAP_HELPER="$<TARGET_FILE:bootstrap_helper>")
add_dependencies(bootstrap_store_test bootstrap_helper)

plexus_add_test(bootstrap_rendezvous_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/bootstrap_rendezvous_test.cpp
          ${CMAKE_CURRENT_LIST_DIR}/bootstrap_jobs_test.cpp
  DEPS plexus_transport_internal plexus::tooling LABELS transport TIMEOUT 120)

if(PLEXUS_BUILD_TOOLS)
  # tools/ is added after tests/, so the plexus-run target is referred to by name only.
  plexus_add_test(bootstrap_run_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/bootstrap_run_test.cpp
    DEPS plexus::tooling LABELS transport TIMEOUT 120)
  target_compile_definitions(bootstrap_run_test PRIVATE
    BOOTSTRAP_HELPER="$<TARGET_FILE:bootstrap_helper>"
    PLEXUS_RUN="$<TARGET_FILE:plexus-run>")
  add_dependencies(bootstrap_run_test bootstrap_helper plexus-run)
endif()

plexus_add_test(bootstrap_server_limits_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/bootstrap_server_limits_test.cpp
  DEPS plexus_transport_internal LABELS transport TIMEOUT 120)

plexus_add_test(bootstrap_process_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/bootstrap_process_test.cpp
  DEPS plexus::transport plexus::tooling LABELS transport TIMEOUT 180)
target_compile_definitions(bootstrap_process_test PRIVATE
  BOOTSTRAP_HELPER="$<TARGET_FILE:bootstrap_helper>")
add_dependencies(bootstrap_process_test bootstrap_helper)
