# The transport contract, checked for every backend (docs/architecture.md).
plexus_add_executable(transport_peer SOURCES transport_peer.cpp DEPS plexus::transport)
plexus_add_test(transport_conformance_test SOURCES conformance_test.cpp
                DEPS plexus::transport plexus::tooling
                LABELS "transport" TIMEOUT 600)
add_dependencies(transport_conformance_test transport_peer)
target_compile_definitions(transport_conformance_test PRIVATE
  PLEXUS_TRANSPORT_PEER="$<TARGET_FILE:transport_peer>")
plexus_add_test(transport_conformance_produce_consume_test
                SOURCES conformance_produce_consume_test.cpp
                DEPS plexus::transport LABELS "transport" TIMEOUT 600)
