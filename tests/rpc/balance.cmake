# Replica-selection tests (include from tests/rpc/CMakeLists.txt): the policy logic, and a short
# run of the Daronpon simulator (its sources are compiled in, so it needs no tool build).
plexus_add_test(rpc_balance_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/balance_test.cpp
                DEPS plexus::rpc LABELS rpc TIMEOUT 60)
plexus_add_test(rpc_balance_sim_test
                SOURCES ${CMAKE_CURRENT_LIST_DIR}/balance_sim_test.cpp
                        ${PROJECT_SOURCE_DIR}/tools/rpc/sim/simulator.cpp
                DEPS plexus::rpc plexus::base absl::strings LABELS rpc TIMEOUT 120)
target_include_directories(rpc_balance_sim_test PRIVATE ${PROJECT_SOURCE_DIR}/tools/rpc/sim)
