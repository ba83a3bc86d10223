# Fails when any tracked C++ file differs from clang-format's output (.clang-format at the root).
execute_process(COMMAND ${GIT} ls-files -- *.cpp *.hpp *.h *.cc *.cu *.cuh
                WORKING_DIRECTORY ${SOURCE_DIR} OUTPUT_VARIABLE files
                OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "git ls-files failed")
endif()
string(REPLACE "\n" ";" files "${files}")
# One clang-format process for every file (one per file takes minutes on a loaded 2-core
# machine); its messages name the files that need formatting ("<file>:<line>:<col>: error: ...").
set(existing "")
foreach(f IN LISTS files)
  if(EXISTS ${SOURCE_DIR}/${f})
    list(APPEND existing ${f})
  endif()
endforeach()
set(bad "")
execute_process(COMMAND ${CLANG_FORMAT} --dry-run --Werror ${existing}
                WORKING_DIRECTORY ${SOURCE_DIR} RESULT_VARIABLE rc ERROR_VARIABLE messages
                OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  string(REGEX MATCHALL "[^\n:]+:[0-9]+:[0-9]+: error" hits "${messages}")
  foreach(hit IN LISTS hits)
    string(REGEX REPLACE ":[0-9]+:[0-9]+: error$" "" f "${hit}")
    list(APPEND bad ${f})
  endforeach()
  list(REMOVE_DUPLICATES bad)
  if(NOT bad)
    message(FATAL_ERROR "clang-format failed (${rc}):\n${messages}")
  endif()
endif()
list(LENGTH files n)
if(bad)
  string(REPLACE ";" "\n  " bad_list "${bad}")
  message(FATAL_ERROR "clang-format: these files need formatting (run `make format`):\n  ${bad_list}")
endif()
message(STATUS "clang-format: ${n} files clean")
