# Every dependency comes from a Debian package (see the Makefile's deps target); nothing is
# downloaded at configure or build time.
find_package(Threads REQUIRED)
find_package(absl REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)

# RDMA verbs: real code, compiled whenever the headers exist. The libraries are not linked: the
# transport loads libibverbs.so.1 and librdmacm.so.1 when it first probes for a device, so that a
# program built with verbs runs where rdma-core is absent and the installed package depends on
# nothing of this machine.
set(PLEXUS_HAVE_VERBS OFF)
if(NOT PLEXUS_WITH_VERBS STREQUAL "OFF")
  find_path(PLEXUS_IBVERBS_INCLUDE infiniband/verbs.h)
  find_path(PLEXUS_RDMACM_INCLUDE rdma/rdma_cma.h)
  if(PLEXUS_IBVERBS_INCLUDE AND PLEXUS_RDMACM_INCLUDE)
    set(PLEXUS_HAVE_VERBS ON)
  elseif(PLEXUS_WITH_VERBS STREQUAL "ON")
    message(FATAL_ERROR "PLEXUS_WITH_VERBS=ON but the libibverbs/librdmacm headers were not "
                        "found: apt-get install libibverbs-dev librdmacm-dev")
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
