# Builds tests/consumer twice: against an installed Plexus (find_package) and vendored
# (add_subdirectory), and runs the program each time.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

# 1. Install the already-built libraries of the main build into a private prefix.
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

# 2. find_package(plexus) against that prefix.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/installed -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/installed)
run(${WORK_DIR}/installed/consumer)

# 3. add_subdirectory(plexus): only what the consumer links is built.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/vendored -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DPLEXUS_SOURCE_DIR=${SOURCE_DIR})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/vendored --target consumer)
run(${WORK_DIR}/vendored/consumer)
message(STATUS "consumer built and ran with find_package and with add_subdirectory")
