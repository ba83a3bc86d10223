# Tests of plexus-bench-collectives: its size parsing and result checking (bench_common_test),
# and a smoke run of two processes over shm and over tcp, every operation (--ops all), sizes 8
# and 64K, three timed calls, where every reported point must have #wrong == 0.
#
# Included from tests/collectives/CMakeLists.txt (include(bench.cmake)). The same file is the
# test's script: ctest runs it with `cmake -P` (CMAKE_SCRIPT_MODE_FILE is then set).

if(CMAKE_SCRIPT_MODE_FILE)
  set(_expected "")
  foreach(_op allreduce reduce broadcast allgather reduce_scatter alltoall)
    list(APPEND _expected ${_op}:8 ${_op}:65536)
  endforeach()
  execute_process(
    COMMAND ${BENCH} --np 2 --transport ${TRANSPORT} --sizes 8,64K --ops all --iters 3 --json
            --timeout 100
    OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc TIMEOUT 110)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "plexus-bench-collectives over ${TRANSPORT} failed (${_rc}):\n${_out}\n${_err}")
  endif()
  string(REPLACE "\n" ";" _lines "${_out}")
  set(_seen "")
  foreach(_line IN LISTS _lines)
    if(NOT _line MATCHES "^{")
      continue()
    endif()
    string(JSON _impl GET "${_line}" impl)
    string(JSON _wrong GET "${_line}" wrong)
    string(JSON _bytes GET "${_line}" bytes)
    string(JSON _busbw GET "${_line}" busbw)
    string(JSON _op GET "${_line}" op)
    if(NOT _impl STREQUAL "plexus")
      message(FATAL_ERROR "unexpected implementation '${_impl}' in: ${_line}")
    endif()
    if(NOT _wrong EQUAL 0)
      message(FATAL_ERROR "#wrong = ${_wrong} at ${_bytes} bytes over ${TRANSPORT}: ${_line}")
    endif()
    if(NOT _busbw GREATER 0)
      message(FATAL_ERROR "no bandwidth measured at ${_bytes} bytes over ${TRANSPORT}: ${_line}")
    endif()
    list(APPEND _seen ${_op}:${_bytes})
  endforeach()
  if(NOT _seen STREQUAL "${_expected}")
    message(FATAL_ERROR "expected points [${_expected}], got [${_seen}]:\n${_out}\n${_err}")
  endif()
  message(STATUS "plexus-bench-collectives over ${TRANSPORT}: sizes ${_seen}, #wrong 0")
  return()
endif()

if(TARGET plexus_collectives AND PLEXUS_BUILD_BENCH)
  # plexus_bench_collectives_common is defined in bench/collectives (configured after tests/).
  plexus_add_test(collectives_bench_common_test SOURCES bench_common_test.cpp
                  DEPS plexus_bench_collectives_common LABELS "collectives;bench" TIMEOUT 60)
  foreach(_transport shm tcp)
    add_test(NAME collectives_bench_${_transport}
             COMMAND ${CMAKE_COMMAND} -DBENCH=$<TARGET_FILE:plexus-bench-collectives>
                     -DTRANSPORT=${_transport} -P ${CMAKE_CURRENT_LIST_FILE})
    set_tests_properties(collectives_bench_${_transport} PROPERTIES LABELS "collectives;bench"
                         TIMEOUT 120)
  endforeach()
  # --reconfig (live reconfiguration's cost): two shm processes, three rounds; exits non-zero
  # when a launch fails or a landing call's result is wrong.
  add_test(NAME collectives_bench_reconfig
           COMMAND plexus-bench-collectives --reconfig --np 2 --transport shm --sizes 8,64K
                   --iters 3 --timeout 100)
  set_tests_properties(collectives_bench_reconfig PROPERTIES LABELS "collectives;bench"
                       TIMEOUT 120)
endif()
