include(GNUInstallDirs)

# Common settings of every Plexus-owned target.
function(plexus_target_defaults target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${PLEXUS_WARNING_FLAGS}>)
  target_compile_features(${target} PUBLIC cxx_std_20)
endfunction()

# plexus_add_library(<lib> SOURCES ... [DEPS ...] [PRIVATE_DEPS ...])
# Creates plexus_<lib> with alias plexus::<lib>, public headers in libs/<lib>/include.
function(plexus_add_library lib)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(plexus_${lib} STATIC ${ARG_SOURCES})
  add_library(plexus::${lib} ALIAS plexus_${lib})
  set_target_properties(plexus_${lib} PROPERTIES EXPORT_NAME ${lib} OUTPUT_NAME plexus_${lib})
  target_include_directories(plexus_${lib} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_link_libraries(plexus_${lib} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  plexus_target_defaults(plexus_${lib})
  set_property(GLOBAL APPEND PROPERTY PLEXUS_EXPORTED_TARGETS plexus_${lib})
  # Sanitized archives need the sanitizer runtime on every consumer's link line.
  if(PLEXUS_SANITIZE)
    target_link_options(plexus_${lib} INTERFACE -fsanitize=${PLEXUS_SANITIZE})
  endif()
  # plexus_<lib>_internal: the library plus its private headers, for Plexus's own tests (never
  # exported), so that no test reaches into src/ by path.
  add_library(plexus_${lib}_internal INTERFACE)
  target_include_directories(plexus_${lib}_internal INTERFACE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_link_libraries(plexus_${lib}_internal INTERFACE plexus_${lib})
  if(PLEXUS_INSTALL)
    install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  endif()
endfunction()

# plexus_add_executable(<name> SOURCES ... [DEPS ...] [INSTALL]): a tool, bench or example
# program; INSTALL puts it in the install tree's bin/ (every tool is installed).
function(plexus_add_executable name)
  cmake_parse_arguments(ARG "INSTALL" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  plexus_target_defaults(${name})
  if(ARG_INSTALL AND PLEXUS_INSTALL)
    install(TARGETS ${name} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endfunction()
