# Builds tests/consumer twice: against an installed Plexus (find_package) and vendored
# (add_subdirectory), and runs the program each time; then builds every example folder as a
# project of its own against the installed Plexus, and runs those that run alone.
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE ${WORK_DIR})
# A deep prefix, as a CI folder or a user's install tree may be: CMake wraps its messages at a
# width that depends on the paths in them, and the checks below must not depend on where.
set(prefix ${WORK_DIR}/a-deliberately-long-install-prefix-so-that-cmake-wraps-its-messages/prefix)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

# 1. Install the already-built libraries of the main build into a private prefix.
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

# 2. find_package(plexus) against that prefix, on what stands for a machine without the CUDA
# toolkit and PMIx: any search for them fails (Plexus loads both at run time, when present).
set(no_cuda_no_pmix -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON -DCMAKE_DISABLE_FIND_PACKAGE_CUDA=ON
    -DCMAKE_DISABLE_FIND_PACKAGE_PMIx=ON)
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/installed -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DCMAKE_PREFIX_PATH=${prefix} ${no_cuda_no_pmix})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/installed)
execute_process(COMMAND ${WORK_DIR}/installed/consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE out)
message(STATUS "${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the installed consumer failed (${rc})")
endif()

# 2a. rdma-core, CUDA and PMIx are loaded at run time, never link dependencies of a user's
# program, which therefore starts on a machine without them.
find_program(READELF readelf)
if(READELF)
  execute_process(COMMAND ${READELF} -d ${WORK_DIR}/installed/consumer OUTPUT_VARIABLE dynamic)
  if(dynamic MATCHES "libibverbs|librdmacm|libcudart|libcuda\\.|libpmix")
    message(FATAL_ERROR "the consumer links rdma-core, CUDA or PMIx directly; they must be loaded "
                        "at run time:\n${dynamic}")
  endif()
endif()
# Without a GPU driver the program runs and says why the GPU path is unavailable.
execute_process(COMMAND ldconfig -p OUTPUT_VARIABLE cache ERROR_QUIET)
if(NOT cache MATCHES "libcuda\\.so\\.1" AND NOT out MATCHES "CUDA unavailable: [^\n]*libcuda\\.so\\.1")
  message(FATAL_ERROR "no GPU driver here, but the consumer did not report CUDA unavailable for "
                      "want of libcuda.so.1:\n${out}")
endif()

# 2b. An unknown component fails the configure with a message naming it and what exists.
file(MAKE_DIRECTORY ${WORK_DIR}/unknown)
file(WRITE ${WORK_DIR}/unknown/CMakeLists.txt
     "cmake_minimum_required(VERSION 3.25)\nproject(u LANGUAGES CXX)\n"
     "find_package(plexus REQUIRED COMPONENTS collectives warp_drive)\n")
execute_process(COMMAND ${CMAKE_COMMAND} -S ${WORK_DIR}/unknown -B ${WORK_DIR}/unknown/build
                -DCMAKE_PREFIX_PATH=${prefix} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE out)
# CMake wraps the message at a width that depends on the prefix's length: match it flattened.
string(REGEX REPLACE "[ \t\r\n]+" " " flat "${out}")
if(rc EQUAL 0 OR NOT flat MATCHES "no component 'warp_drive'.*has: [a-z, ]*transport, [a-z, ]*collectives")
  message(FATAL_ERROR "find_package with an unknown component: rc ${rc}, output:\n${out}")
endif()

# 2c. No path of this build tree or source tree in the installed package files.
file(GLOB_RECURSE package_files ${prefix}/lib/cmake/plexus/*.cmake ${prefix}/lib/pkgconfig/*.pc)
foreach(f IN LISTS package_files)
  file(READ ${f} text)
  foreach(forbidden ${BUILD_DIR} ${SOURCE_DIR} libibverbs.so librdmacm.so libpmix.so pmix::pmix
                    CUDA:: CUDAToolkit)
    string(FIND "${text}" "${forbidden}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "${f} names '${forbidden}': the package must not depend on this machine")
    endif()
  endforeach()
endforeach()

# 2d. pkg-config: the same program built by a plain compiler command from the .pc files.
find_program(PKG_CONFIG pkg-config)
find_program(CXX_FOR_PC NAMES c++ g++)
if(PKG_CONFIG AND CXX_FOR_PC)
  set(ENV{PKG_CONFIG_PATH} ${prefix}/lib/pkgconfig)
  execute_process(COMMAND ${PKG_CONFIG} --cflags --libs plexus-collectives plexus-moe
                  RESULT_VARIABLE rc OUTPUT_VARIABLE flags ERROR_VARIABLE err
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config plexus-collectives plexus-moe failed: ${err}")
  endif()
  separate_arguments(flags UNIX_COMMAND "${flags}")
  run(${CXX_FOR_PC} ${SOURCE_DIR}/tests/consumer/main.cpp -o ${WORK_DIR}/consumer-pc ${flags})
  run(${WORK_DIR}/consumer-pc)
else()
  message(STATUS "pkg-config or c++ not found: the pkg-config build is not checked")
endif()

# 2e. An installed tool points at the installed data, not at this checkout.
if(EXISTS ${prefix}/bin/plexus-moe)
  execute_process(COMMAND ${prefix}/bin/plexus-moe --help OUTPUT_VARIABLE help RESULT_VARIABLE rc)
  string(REGEX REPLACE "[ \t\r\n]+" " " flat "${help}")
  if(NOT rc EQUAL 0 OR NOT flat MATCHES "examples in ${prefix}/share/plexus/data/moe")
    message(FATAL_ERROR "the installed plexus-moe --help does not name ${prefix}/share/plexus/data/moe:\n${help}")
  endif()
endif()

# 2f. Every examples/<x> is a project of its own that builds against the installed Plexus (as a
# user copies it), skipped only when it needs a library this installation lacks. The ones that run
# alone and quickly run; placement-vqa reads its input from the installed data.
file(READ ${prefix}/lib/cmake/plexus/plexusConfig.cmake config)
string(REGEX MATCH "set\\(plexus_LIBRARIES \"([^\"]*)\"\\)" found "${config}")
set(installed_libs "${CMAKE_MATCH_1}")
if(NOT installed_libs)
  message(FATAL_ERROR "${prefix}/lib/cmake/plexus/plexusConfig.cmake sets no plexus_LIBRARIES")
endif()
set(run_alone lazarus-plan placement-vqa rpc-kv)
set(example_flags -G ${GENERATOR} -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DCMAKE_PREFIX_PATH=${prefix}
    ${no_cuda_no_pmix})
if(CXX_LAUNCHER)  # the main build's compiler launcher (ccache): a rerun compiles from its cache
  list(APPEND example_flags -DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_LAUNCHER})
endif()
file(GLOB example_dirs LIST_DIRECTORIES true ${SOURCE_DIR}/examples/*)
set(built_examples "")
foreach(dir IN LISTS example_dirs)
  if(NOT IS_DIRECTORY ${dir} OR NOT EXISTS ${dir}/CMakeLists.txt)
    continue()
  endif()
  get_filename_component(name ${dir} NAME)
  file(READ ${dir}/CMakeLists.txt text)
  string(REGEX MATCH "find_package\\(plexus[^)]*COMPONENTS([^)]*)\\)" found "${text}")
  if(NOT found)
    message(FATAL_ERROR "examples/${name}: no find_package(plexus ... COMPONENTS ...)")
  endif()
  separate_arguments(needs UNIX_COMMAND "${CMAKE_MATCH_1}")
  set(missing "")
  foreach(lib IN LISTS needs)
    if(NOT lib IN_LIST installed_libs)
      list(APPEND missing ${lib})
    endif()
  endforeach()
  if(missing)
    list(JOIN missing ", " missing)
    message(STATUS "examples/${name} not built: this installation has no ${missing}")
    continue()
  endif()
  set(bin ${WORK_DIR}/examples/${name})
  run(${CMAKE_COMMAND} -S ${dir} -B ${bin} ${example_flags})
  run(${CMAKE_COMMAND} --build ${bin} -j2)
  list(APPEND built_examples ${name})
  foreach(program IN LISTS run_alone)
    if(EXISTS ${bin}/${program})
      execute_process(COMMAND ${bin}/${program} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                      ERROR_VARIABLE out)
      if(NOT rc EQUAL 0)
        message(FATAL_ERROR "examples/${name}: ${program} built against ${prefix} failed (${rc}):\n${out}")
      endif()
      string(FIND "${out}" "plan for ${prefix}/share/plexus/data/" at)
      if(program STREQUAL "placement-vqa" AND at EQUAL -1)
        message(FATAL_ERROR "placement-vqa built against ${prefix} does not read the installed data:\n${out}")
      endif()
    endif()
  endforeach()
endforeach()
if(NOT built_examples)
  message(FATAL_ERROR "no example was built against ${prefix}")
endif()
string(REPLACE ";" " " built_examples "${built_examples}")
message(STATUS "examples built against the installed Plexus: ${built_examples}")

# 3. add_subdirectory(plexus): only what the consumer links is built.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/vendored -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DPLEXUS_SOURCE_DIR=${SOURCE_DIR})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/vendored --target consumer)
run(${WORK_DIR}/vendored/consumer)
message(STATUS "consumer built and ran with find_package and with add_subdirectory")
# What was built here is a second copy of Plexus; on success only the main build is kept.
file(REMOVE_RECURSE ${WORK_DIR})
