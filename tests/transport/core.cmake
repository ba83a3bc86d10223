plexus_add_test(transport_core_test SOURCES core_test.cpp DEPS plexus::transport
                LABELS "transport")
