# Build options. Tests, examples, benchmarks and tools default to ON only when Plexus is the
# top-level project, so that add_subdirectory(plexus) in a user's tree builds just the libraries.
if(CMAKE_SOURCE_DIR STREQUAL PROJECT_SOURCE_DIR)
  set(_plexus_top ON)
else()
  set(_plexus_top OFF)
endif()

option(PLEXUS_BUILD_TESTS "Build the Plexus tests" ${_plexus_top})
option(PLEXUS_BUILD_EXAMPLES "Build the Plexus examples" ${_plexus_top})
option(PLEXUS_BUILD_BENCH "Build the Plexus benchmarks" ${_plexus_top})
option(PLEXUS_BUILD_TOOLS "Build the Plexus command-line tools" ${_plexus_top})
option(PLEXUS_INSTALL "Generate install rules" ON)
option(PLEXUS_WARNINGS_AS_ERRORS "Turn compiler warnings into errors" OFF)
set(PLEXUS_SANITIZE "" CACHE STRING "Comma-separated sanitizers, e.g. address,undefined")

set(PLEXUS_WITH_VERBS AUTO CACHE STRING "RDMA verbs backend: AUTO (on when headers found), ON, OFF")
set_property(CACHE PLEXUS_WITH_VERBS PROPERTY STRINGS AUTO ON OFF)
set(PLEXUS_WITH_CUDA AUTO CACHE STRING "CUDA support: AUTO (on when nvcc/toolkit found), ON, OFF")
set_property(CACHE PLEXUS_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)
set(PLEXUS_WITH_TORCH AUTO CACHE STRING
    "torch.distributed backend (libs/torch): AUTO (on when libtorch, pybind11 and a Python that imports torch are found), ON, OFF")
set_property(CACHE PLEXUS_WITH_TORCH PROPERTY STRINGS AUTO ON OFF)

set(PLEXUS_WITH_PMIX AUTO CACHE STRING
    "PMIx bootstrap under mpirun/srun: AUTO (on when libpmix-dev is found), ON, OFF")
set_property(CACHE PLEXUS_WITH_PMIX PROPERTY STRINGS AUTO ON OFF)

foreach(opt PLEXUS_WITH_VERBS PLEXUS_WITH_CUDA PLEXUS_WITH_PMIX PLEXUS_WITH_TORCH)
  if(NOT ${opt} MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${opt} must be AUTO, ON or OFF (got '${${opt}}')")
  endif()
endforeach()

if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE RelWithDebInfo CACHE STRING "Build type" FORCE)
endif()

# Applied to Plexus's own targets only (never to a consumer's), see plexus_target_defaults().
# Options structs are filled by designated initializers that name only what differs from the
# defaults (`{.max_in_flight_per_connection = 4}`), which GCC's -Wextra reports member by member.
set(PLEXUS_WARNING_FLAGS -Wall -Wextra -Wpedantic -Wno-missing-field-initializers)
if(PLEXUS_WARNINGS_AS_ERRORS)
  list(APPEND PLEXUS_WARNING_FLAGS -Werror)
endif()

# Debug information is most of a build's size (several GB for the tests alone); compressing it
# keeps a full build within small CI disks, and gdb, perf and addr2line read it unchanged.
option(PLEXUS_COMPRESS_DEBUG_INFO "Compress the debug sections of objects and programs (-gz)" ON)
if(PLEXUS_COMPRESS_DEBUG_INFO AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  include(CheckCXXSourceCompiles)
  set(CMAKE_REQUIRED_FLAGS -gz)
  set(CMAKE_REQUIRED_LINK_OPTIONS -gz)
  check_cxx_source_compiles("int main() { return 0; }" PLEXUS_HAVE_GZ)
  unset(CMAKE_REQUIRED_FLAGS)
  unset(CMAKE_REQUIRED_LINK_OPTIONS)
  if(PLEXUS_HAVE_GZ)
    add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-gz>)
    add_link_options($<$<LINK_LANGUAGE:C,CXX>:-gz>)
  endif()
endif()

if(PLEXUS_SANITIZE)
  add_compile_options(-fsanitize=${PLEXUS_SANITIZE} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${PLEXUS_SANITIZE})
endif()
