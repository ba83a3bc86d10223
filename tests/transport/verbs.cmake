# Verbs backend: the protocol engine (pure C++, always runs) and a hardware loopback test that
# exits 77 (skipped) with the probe's reason where no RDMA device exists.
set(_verbs_protocol_sources verbs_protocol_test.cpp verbs_codec_test.cpp)
if(NOT PLEXUS_HAVE_VERBS)
  # Without libibverbs the library leaves src/verbs/ out; its protocol is still tested.
  list(APPEND _verbs_protocol_sources
       ${PROJECT_SOURCE_DIR}/libs/transport/src/verbs/protocol.cpp)
endif()
plexus_add_test(transport_verbs_protocol_test SOURCES ${_verbs_protocol_sources}
                DEPS plexus_transport_internal LABELS "transport;verbs" TIMEOUT 120)

# A path's binding (GID choice, flow label, validation) without hardware.
set(_verbs_path_sources verbs_path_test.cpp)
if(NOT PLEXUS_HAVE_VERBS)
  list(APPEND _verbs_path_sources ${PROJECT_SOURCE_DIR}/libs/transport/src/verbs/path_gid.cpp)
endif()
plexus_add_test(transport_verbs_path_test SOURCES ${_verbs_path_sources}
                DEPS plexus_transport_internal LABELS "transport;verbs" TIMEOUT 60)

plexus_add_test(transport_verbs_loopback_test SOURCES verbs_loopback_test.cpp
                DEPS plexus::transport LABELS "transport;verbs" TIMEOUT 180)
