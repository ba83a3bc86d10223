# CUDA kernels without the CUDA runtime: nvcc compiles a .cu file of extern "C" kernels into a
# fatbin (native code for each architecture of CMAKE_CUDA_ARCHITECTURES, PTX where asked), which
# is embedded in the library as a byte array and loaded through the driver when first launched
# (plexus/base/cuda.hpp). Libraries and programs built this way link no CUDA library.
#
# plexus_embed_cuda_kernels(<target> SOURCE <file.cu> SYMBOL <name> NAMESPACE <ns>
#                           [DEPENDS <headers>...] [INCLUDES <dirs>...])
# defines `extern const unsigned char <ns>::<name>[]` in a source added to <target>.
function(plexus_embed_cuda_kernels target)
  cmake_parse_arguments(ARG "" "SOURCE;SYMBOL;NAMESPACE" "DEPENDS;INCLUDES" ${ARGN})
  get_filename_component(_src ${ARG_SOURCE} ABSOLUTE)
  get_filename_component(_stem ${ARG_SOURCE} NAME_WE)
  set(_out ${CMAKE_CURRENT_BINARY_DIR}/cuda_kernels)
  set(_fatbin ${_out}/${_stem}.fatbin)
  set(_cpp ${_out}/${_stem}_fatbin.cpp)
  # CMAKE_CUDA_ARCHITECTURES ("80-real 90-real 90-virtual", "86", "all", "native") as nvcc flags.
  set(_arch_flags "")
  foreach(_arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
    if(_arch MATCHES "^([0-9]+[a-z]?)-real$")
      list(APPEND _arch_flags -gencode arch=compute_${CMAKE_MATCH_1},code=sm_${CMAKE_MATCH_1})
    elseif(_arch MATCHES "^([0-9]+[a-z]?)-virtual$")
      list(APPEND _arch_flags -gencode arch=compute_${CMAKE_MATCH_1},code=compute_${CMAKE_MATCH_1})
    elseif(_arch MATCHES "^([0-9]+[a-z]?)$")
      list(APPEND _arch_flags -gencode arch=compute_${_arch},code=[sm_${_arch},compute_${_arch}])
    else()
      list(APPEND _arch_flags -arch=${_arch})
    endif()
  endforeach()
  set(_includes "")
  foreach(_dir IN LISTS ARG_INCLUDES)
    list(APPEND _includes -I${_dir})
  endforeach()
  add_custom_command(
    OUTPUT ${_fatbin}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${_out}
    COMMAND ${CMAKE_CUDA_COMPILER} -fatbin -std=c++17 -O3 ${_arch_flags} ${_includes}
            -o ${_fatbin} ${_src}
    DEPENDS ${_src} ${ARG_DEPENDS}
    COMMENT "nvcc: ${ARG_SOURCE} -> ${_stem}.fatbin"
    VERBATIM)
  add_custom_command(
    OUTPUT ${_cpp}
    COMMAND ${CMAKE_COMMAND} -DIN=${_fatbin} -DOUT=${_cpp} -DSYMBOL=${ARG_SYMBOL}
            -DNAMESPACE=${ARG_NAMESPACE} -P ${PROJECT_SOURCE_DIR}/cmake/PlexusEmbed.cmake
    DEPENDS ${_fatbin} ${PROJECT_SOURCE_DIR}/cmake/PlexusEmbed.cmake
    COMMENT "embedding ${_stem}.fatbin"
    VERBATIM)
  target_sources(${target} PRIVATE ${_cpp})
endfunction()
