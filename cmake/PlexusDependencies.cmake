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

# PMIx: under mpirun (Open MPI) and srun --mpi=pmix, rank 0 publishes the store address through
# the launcher's PMIx server, so those launchers need no extra variables. Debian's libpmix-dev
# keeps its headers and link library under pmix2/; its pkg-config file adds -I/usr/include, which
# would break libstdc++'s #include_next, so the paths are found directly.
set(PLEXUS_HAVE_PMIX OFF)
if(NOT PLEXUS_WITH_PMIX STREQUAL "OFF")
  find_path(PLEXUS_PMIX_INCLUDE pmix.h
            HINTS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/pmix2/include /usr/lib/pmix2/include)
  find_library(PLEXUS_PMIX_LIB pmix
               HINTS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/pmix2/lib /usr/lib/pmix2/lib)
  if(PLEXUS_PMIX_INCLUDE AND PLEXUS_PMIX_LIB)
    set(PLEXUS_HAVE_PMIX ON)
    # An imported target, not a path, in the exported link interface: plexusConfig.cmake finds
    # libpmix again on the consumer's machine.
    add_library(plexus_pmix::pmix UNKNOWN IMPORTED GLOBAL)
    set_target_properties(plexus_pmix::pmix PROPERTIES IMPORTED_LOCATION ${PLEXUS_PMIX_LIB})
  elseif(PLEXUS_WITH_PMIX STREQUAL "ON")
    message(FATAL_ERROR "PLEXUS_WITH_PMIX=ON but pmix.h or libpmix was not found: "
                        "apt-get install libpmix-dev")
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
