# plexus_rpc_generate(<target> FILES a.proto [b.proto ...] [IMPORT_DIRS dir ...])
# Runs protoc with protoc-gen-plexus on each file and adds the generated <name>.plexus.hpp to
# <target> (its directory on the include path: #include "a.plexus.hpp"). Usable from Plexus's own
# tree and, after find_package(plexus), from a consumer's.
if(NOT PLEXUS_PROTOC_EXECUTABLE)
  find_program(PLEXUS_PROTOC_EXECUTABLE protoc)
endif()

function(plexus_rpc_generate target)
  cmake_parse_arguments(ARG "" "" "FILES;IMPORT_DIRS" ${ARGN})
  if(NOT ARG_FILES)
    message(FATAL_ERROR "plexus_rpc_generate(${target}): no FILES given")
  endif()
  if(NOT PLEXUS_PROTOC_EXECUTABLE)
    message(FATAL_ERROR "plexus_rpc_generate: protoc not found (apt-get install protobuf-compiler)")
  endif()
  if(TARGET protoc-gen-plexus)
    set(_plugin $<TARGET_FILE:protoc-gen-plexus>)
    set(_plugin_dep protoc-gen-plexus)
  else()
    find_program(PLEXUS_PROTOC_GEN_PLEXUS protoc-gen-plexus
                 HINTS ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../../../bin)
    if(NOT PLEXUS_PROTOC_GEN_PLEXUS)
      message(FATAL_ERROR "plexus_rpc_generate: protoc-gen-plexus not found")
    endif()
    set(_plugin ${PLEXUS_PROTOC_GEN_PLEXUS})
    set(_plugin_dep ${PLEXUS_PROTOC_GEN_PLEXUS})
  endif()
  set(_out ${CMAKE_CURRENT_BINARY_DIR}/plexus_rpc_gen)
  file(MAKE_DIRECTORY ${_out})
  foreach(proto IN LISTS ARG_FILES)
    get_filename_component(_abs ${proto} ABSOLUTE)
    get_filename_component(_dir ${_abs} DIRECTORY)
    get_filename_component(_name ${_abs} NAME_WE)
    set(_includes -I${_dir})
    foreach(d IN LISTS ARG_IMPORT_DIRS)
      get_filename_component(_d ${d} ABSOLUTE)
      list(APPEND _includes -I${_d})
    endforeach()
    set(_hdr ${_out}/${_name}.plexus.hpp)
    add_custom_command(
      OUTPUT ${_hdr}
      COMMAND ${PLEXUS_PROTOC_EXECUTABLE} --plugin=protoc-gen-plexus=${_plugin}
              --plexus_out=${_out} ${_includes} ${_abs}
      DEPENDS ${_abs} ${_plugin_dep}
      COMMENT "protoc-gen-plexus ${proto}"
      VERBATIM)
    target_sources(${target} PRIVATE ${_hdr})
  endforeach()
  target_include_directories(${target} PRIVATE ${_out})
endfunction()
