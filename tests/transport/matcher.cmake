# The receive matcher shared by every backend (unit tests, no wire), and the caps on memory
# held for early messages against hostile tcp and shm peers (RSS and VmSize of the process).
plexus_add_test(transport_matcher_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/matcher_test.cpp
                DEPS plexus_transport_internal LABELS transport TIMEOUT 30)

plexus_add_test(transport_held_memory_test
                SOURCES ${CMAKE_CURRENT_LIST_DIR}/held_memory_test.cpp
                DEPS plexus_transport_internal LABELS transport TIMEOUT 180)

# The tcp backend's socket-free protocol decisions, and short striped operations end to end.
plexus_add_test(transport_tcp_protocol_test
                SOURCES ${CMAKE_CURRENT_LIST_DIR}/tcp_protocol_test.cpp
                DEPS plexus_transport_internal LABELS transport TIMEOUT 60)

# The tcp backend's send and receive state without sockets: split streams, stripes, acks,
# malformed frames.
plexus_add_test(transport_tcp_state_test
                SOURCES ${CMAKE_CURRENT_LIST_DIR}/tcp_state_test.cpp
                DEPS plexus_transport_internal LABELS transport TIMEOUT 60)

# Which tcp connections take the loopback path, and the congestion control they get.
plexus_add_test(transport_tcp_sockets_test
                SOURCES ${CMAKE_CURRENT_LIST_DIR}/tcp_sockets_test.cpp
                DEPS plexus_transport_internal LABELS transport TIMEOUT 60)

# The tcp backend's produced sends and consumed receives without sockets: bounded chunks, order,
# annotated callback errors.
plexus_add_test(transport_tcp_produce_consume_test
                SOURCES ${CMAKE_CURRENT_LIST_DIR}/tcp_produce_consume_test.cpp
                DEPS plexus_transport_internal LABELS transport TIMEOUT 60)
