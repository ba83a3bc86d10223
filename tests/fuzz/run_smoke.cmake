# Builds the fuzz targets with clang and runs each for a bounded time (the `fuzz_smoke` test).
# -DSOURCE_DIR=<repo> -DWORK_DIR=<dir> -DSECONDS=<total budget for all targets>
find_program(CLANGXX NAMES clang++ clang++-14)
if(NOT CLANGXX)
  message(FATAL_ERROR "clang++ not found: apt-get install clang libclang-rt-14-dev")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/fuzz -B ${WORK_DIR} -G Ninja
                -DCMAKE_CXX_COMPILER=${CLANGXX} -DCMAKE_BUILD_TYPE=RelWithDebInfo
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the fuzz targets failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the fuzz targets failed")
endif()
file(READ ${WORK_DIR}/fuzzers.txt fuzzers)
list(LENGTH fuzzers n)
math(EXPR per_target "${SECONDS} / ${n}")
foreach(f IN LISTS fuzzers)
  file(MAKE_DIRECTORY ${WORK_DIR}/corpus/${f})
  message(STATUS "fuzzing ${f} for ${per_target} s")
  execute_process(COMMAND ${WORK_DIR}/${f} -max_total_time=${per_target} -rss_limit_mb=2048
                          -print_final_stats=1 ${WORK_DIR}/corpus/${f}
                  WORKING_DIRECTORY ${WORK_DIR} RESULT_VARIABLE rc ERROR_VARIABLE log)
  if(NOT rc EQUAL 0)
    message("${log}")
    message(FATAL_ERROR "${f} found a crash (artifact in ${WORK_DIR})")
  endif()
  string(REGEX MATCH "stat::number_of_executed_units: *[0-9]+" runs "${log}")
  message(STATUS "${f}: ok, ${runs}")
endforeach()
