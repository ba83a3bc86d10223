# Replica selection (round robin, random, po2, Daronpon): pure policy code shared by plexus_rpc
# and the simulator tools/rpc/sim. libs/rpc/CMakeLists.txt does `include(balance.cmake OPTIONAL)`
# and adds ${PLEXUS_RPC_BALANCE_SOURCES} to plexus_rpc (it needs absl::status, absl::statusor and
# absl::strings, which plexus_rpc links anyway).
list(APPEND PLEXUS_RPC_BALANCE_SOURCES ${CMAKE_CURRENT_LIST_DIR}/src/balance/balance.cpp)
