# The same program started unchanged by every launcher (no PLEXUS_* variables): alone, under
# plexus-run, under real mpirun (PMIx) and torchrun (torch's TCPStore). tests/transport/
# launchers.sh skips (77) a launcher that is not installed.
add_executable(launch_probe ${CMAKE_CURRENT_LIST_DIR}/launch_probe.cpp)
target_link_libraries(launch_probe PRIVATE plexus::transport)
plexus_target_defaults(launch_probe)

function(plexus_add_launcher_test name mode ranks)
  add_test(NAME ${name} COMMAND sh ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/launchers.sh ${mode}
           $<TARGET_FILE:launch_probe> ${ranks} ${ARGN})
  set_tests_properties(${name} PROPERTIES LABELS "transport;launchers" TIMEOUT 120
                       SKIP_RETURN_CODE ${PLEXUS_SKIP_RETURN_CODE})
endfunction()

plexus_add_launcher_test(launch_alone none 1)
plexus_add_launcher_test(launch_mpirun_2 mpirun 2)
plexus_add_launcher_test(launch_mpirun_3 mpirun 3)
# Real srun --mpi=pmix on a private one-node Slurm that the test starts and stops (root; skips
# without slurm-wlm).
plexus_add_launcher_test(launch_srun_2 srun 2)
if(PLEXUS_BUILD_TOOLS)
  # tools/ is added after tests/, so plexus-run is referred to by name only.
  plexus_add_launcher_test(launch_plexus_run plexus-run 2 $<TARGET_FILE:plexus-run>)
endif()

plexus_add_test(bootstrap_pmix_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/bootstrap_pmix_test.cpp
  DEPS plexus_transport_internal LABELS "transport;launchers" TIMEOUT 60 ARGS "~[pmix]~[loader]")
add_test(NAME bootstrap_pmix_silent COMMAND bootstrap_pmix_test "[pmix]")
set_tests_properties(bootstrap_pmix_silent PROPERTIES LABELS "transport;launchers" TIMEOUT 60
                     SKIP_REGULAR_EXPRESSION "SKIP: ")
# Alone in its process, so that it sees whether anything loaded libpmix before the first use.
add_test(NAME bootstrap_pmix_loader COMMAND bootstrap_pmix_test "[loader]")
set_tests_properties(bootstrap_pmix_loader PROPERTIES LABELS transport TIMEOUT 30)

# A client of torch's TCPStore, against torch's real server (skips without python3-torch).
plexus_add_test(torch_store_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/torch_store_test.cpp
  DEPS plexus::transport LABELS "transport;launchers" TIMEOUT 120)
plexus_add_launcher_test(launch_torchrun_2 torchrun 2)

# EtcdStore and the rendezvous over it, against a real etcd started by the test on 127.0.0.1
# (skips without etcd-server).
plexus_add_test(etcd_store_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/etcd_store_test.cpp
  DEPS plexus::transport plexus::tooling LABELS "transport;launchers" TIMEOUT 120)
target_compile_definitions(etcd_store_test PRIVATE
                           PLEXUS_LAUNCH_PROBE="$<TARGET_FILE:launch_probe>")
add_dependencies(etcd_store_test launch_probe)
if(PLEXUS_BUILD_TOOLS)
  target_compile_definitions(etcd_store_test PRIVATE PLEXUS_RUN="$<TARGET_FILE:plexus-run>")
  add_dependencies(etcd_store_test plexus-run)
endif()
