# Progress runtime: SPSC queue, engines, live replacement.
plexus_add_test(transport_runtime_spsc_test SOURCES runtime_spsc_test.cpp DEPS plexus::transport
                LABELS "transport" TIMEOUT 60)
plexus_add_test(transport_runtime_test SOURCES runtime_engine_test.cpp DEPS plexus::transport
                LABELS "transport" TIMEOUT 120)
# Not a test: prints the measured chain throughput and swap pause as JSON lines (see its header).
plexus_add_executable(transport_runtime_throughput SOURCES runtime_throughput.cpp
                      DEPS plexus::transport)
