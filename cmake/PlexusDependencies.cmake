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
# the launcher's PMIx server, so those launchers need no extra variables. Only the headers are
# needed here: libpmix is not linked but loaded when a rendezvous first uses it
# (libs/transport/src/bootstrap/pmix_exchange.cpp), so programs start, and an installed Plexus is
# found, on machines without it. Debian's libpmix-dev keeps its headers under pmix2/; its
# pkg-config file adds -I/usr/include, which would break libstdc++'s #include_next, so the path is
# found directly.
set(PLEXUS_HAVE_PMIX OFF)
if(NOT PLEXUS_WITH_PMIX STREQUAL "OFF")
  find_path(PLEXUS_PMIX_INCLUDE pmix.h
            HINTS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/pmix2/include /usr/lib/pmix2/include)
  if(PLEXUS_PMIX_INCLUDE)
    set(PLEXUS_HAVE_PMIX ON)
  elseif(PLEXUS_WITH_PMIX STREQUAL "ON")
    message(FATAL_ERROR "PLEXUS_WITH_PMIX=ON but pmix.h was not found: apt-get install libpmix-dev")
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

# torch.distributed backend: libtorch's CMake config (Debian: libtorch-dev), pybind11
# (pybind11-dev) and a Python interpreter that imports torch (python3-torch). Debian's interpreter
# is /usr/bin/python3, which may not be the python3 first on PATH: it is tried first.
set(PLEXUS_HAVE_TORCH OFF)
if(NOT PLEXUS_WITH_TORCH STREQUAL "OFF")
  set(_plexus_torch_why "")
  find_package(Torch CONFIG QUIET
               HINTS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake/Torch /usr/share/cmake/Torch)
  if(NOT Torch_FOUND)
    set(_plexus_torch_why "libtorch's CMake config (TorchConfig.cmake) was not found")
  else()
    if(NOT DEFINED PLEXUS_TORCH_PYTHON)
      set(_plexus_torch_candidates /usr/bin/python3)
      find_program(_plexus_path_python3 python3)
      if(_plexus_path_python3)
        list(APPEND _plexus_torch_candidates ${_plexus_path_python3})
      endif()
      foreach(py IN LISTS _plexus_torch_candidates)
        if(EXISTS ${py})
          execute_process(COMMAND ${py} -c "import torch; print(torch.__version__)"
                          RESULT_VARIABLE _rc OUTPUT_VARIABLE _ver ERROR_QUIET
                          OUTPUT_STRIP_TRAILING_WHITESPACE)
          if(_rc EQUAL 0)
            set(PLEXUS_TORCH_PYTHON ${py} CACHE FILEPATH "Python interpreter that imports torch")
            break()
          endif()
        endif()
      endforeach()
    endif()
    if(NOT PLEXUS_TORCH_PYTHON)
      set(_plexus_torch_why "no Python interpreter imports torch (apt-get install python3-torch)")
    else()
      set(Python3_EXECUTABLE ${PLEXUS_TORCH_PYTHON})
      find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
      find_package(pybind11 CONFIG QUIET)
      find_library(PLEXUS_TORCH_PYTHON_LIBRARY torch_python
                   HINTS ${TORCH_INSTALL_PREFIX}/lib /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE})
      if(NOT Python3_Development.Module_FOUND)
        set(_plexus_torch_why "Python development headers were not found (python3-dev)")
      elseif(NOT pybind11_FOUND)
        set(_plexus_torch_why "pybind11 was not found (pybind11-dev)")
      elseif(NOT PLEXUS_TORCH_PYTHON_LIBRARY)
        set(_plexus_torch_why "libtorch_python was not found")
      else()
        set(PLEXUS_HAVE_TORCH ON)
      endif()
    endif()
  endif()
  if(NOT PLEXUS_HAVE_TORCH)
    if(PLEXUS_WITH_TORCH STREQUAL "ON")
      message(FATAL_ERROR "PLEXUS_WITH_TORCH=ON but ${_plexus_torch_why} "
                          "(apt-get install python3-torch libtorch-dev pybind11-dev)")
    endif()
    message(STATUS "plexus: torch backend not built: ${_plexus_torch_why}")
  endif()
endif()
