# Listeners under hostile or broken clients (tcp and shm), half-open tcp socket groups,
# ConnectFullMesh with an intruder; the tcp data path over IPv6 runs as its own entry, which
# is skipped (exit 77, with the reason) where the host has no IPv6 loopback.
plexus_add_test(transport_listener_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/listener_test.cpp
  DEPS plexus_transport_internal LABELS transport TIMEOUT 120 ARGS "~[ipv6]")
add_test(NAME transport_tcp_ipv6_test COMMAND transport_listener_test "[ipv6]")
set_tests_properties(transport_tcp_ipv6_test PROPERTIES LABELS transport TIMEOUT 60
                     SKIP_RETURN_CODE ${PLEXUS_SKIP_RETURN_CODE})
