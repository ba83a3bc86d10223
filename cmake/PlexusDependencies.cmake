# Every dependency comes from a Debian package (see the Makefile's deps target); nothing is
# downloaded at configure or build time.
find_package(Threads REQUIRED)
find_package(absl REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)

# RDMA verbs: real code, compiled whenever the headers exist; devices are probed at run time.
set(PLEXUS_HAVE_VERBS OFF)
if(NOT PLEXUS_WITH_VERBS STREQUAL "OFF")
  find_path(PLEXUS_IBVERBS_INCLUDE infiniband/verbs.h)
  find_path(PLEXUS_RDMACM_INCLUDE rdma/rdma_cma.h)
  find_library(PLEXUS_IBVERBS_LIB ibverbs)
  find_library(PLEXUS_RDMACM_LIB rdmacm)
  if(PLEXUS_IBVERBS_INCLUDE AND PLEXUS_RDMACM_INCLUDE AND PLEXUS_IBVERBS_LIB AND PLEXUS_RDMACM_LIB)
    set(PLEXUS_HAVE_VERBS ON)
    # Imported targets rather than paths, so that the installed package names no file of this
    # machine: plexusConfig.cmake finds both libraries again on the consumer's machine.
    foreach(_lib ibverbs rdmacm)
      string(TOUPPER ${_lib} _var)
      add_library(plexus_rdma::${_lib} UNKNOWN IMPORTED GLOBAL)
      set_target_properties(plexus_rdma::${_lib} PROPERTIES
        IMPORTED_LOCATION ${PLEXUS_${_var}_LIB}
        INTERFACE_INCLUDE_DIRECTORIES ${PLEXUS_${_var}_INCLUDE})
    endforeach()
  elseif(PLEXUS_WITH_VERBS STREQUAL "ON")
    message(FATAL_ERROR "PLEXUS_WITH_VERBS=ON but libibverbs/librdmacm headers or libraries were "
                        "not found: apt-get install libibverbs-dev librdmacm-dev")
  endif()
endif()

# CUDA: the runtime API is used by the transport (device memory regions), nvcc by kernels.
set(PLEXUS_HAVE_CUDA OFF)
if(NOT PLEXUS_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # The one place that chooses CUDA architectures, and only when the user has not: Ampere and
    # Hopper natively, PTX for anything newer. Set before enable_language() so that CMake's own
    # default (the compiler's oldest architecture) does not take its place.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
      set(CMAKE_CUDA_ARCHITECTURES 80-real 90-real 90-virtual)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND)
      set(PLEXUS_HAVE_CUDA ON)
    endif()
  endif()
  if(NOT PLEXUS_HAVE_CUDA AND PLEXUS_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "PLEXUS_WITH_CUDA=ON but no CUDA toolkit/nvcc was found "
                        "(expected /usr/local/cuda/bin/nvcc)")
  endif()
endif()
