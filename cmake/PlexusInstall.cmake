if(NOT PLEXUS_INSTALL)
  return()
endif()
include(CMakePackageConfigHelpers)

get_property(_plexus_targets GLOBAL PROPERTY PLEXUS_EXPORTED_TARGETS)
if(_plexus_targets)
  install(TARGETS ${_plexus_targets} EXPORT plexusTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT plexusTargets NAMESPACE plexus:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/plexus)
  include(PlexusPkgConfig)
  foreach(_target IN LISTS _plexus_targets)
    plexus_write_pkg_config(${_target})
  endforeach()
endif()

# The data the examples, tools and benchmarks read (with the licences of their sources);
# find_package(plexus) names it in PLEXUS_DATA_DIR.
set(PLEXUS_DATA_INSTALL_DIR ${CMAKE_INSTALL_DATADIR}/plexus/data)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/data/ DESTINATION ${PLEXUS_DATA_INSTALL_DIR})

# The components find_package(plexus COMPONENTS ...) accepts: the libraries installed here.
set(PLEXUS_INSTALLED_LIBS "")
foreach(_target IN LISTS _plexus_targets)
  get_target_property(_name ${_target} EXPORT_NAME)
  if(NOT _name STREQUAL "base")
    list(APPEND PLEXUS_INSTALLED_LIBS ${_name})
  endif()
endforeach()

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/plexusConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/plexusConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/plexus
  PATH_VARS PLEXUS_DATA_INSTALL_DIR)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/plexusConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/plexusConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/plexusConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/plexus)
