# Fails when any tracked C++ file differs from clang-format's output (.clang-format at the root).
execute_process(COMMAND ${GIT} ls-files -- *.cpp *.hpp *.h *.cc *.cu *.cuh
                WORKING_DIRECTORY ${SOURCE_DIR} OUTPUT_VARIABLE files
                OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "git ls-files failed")
endif()
string(REPLACE "\n" ";" files "${files}")
set(bad "")
foreach(f IN LISTS files)
  if(EXISTS ${SOURCE_DIR}/${f})
    execute_process(COMMAND ${CLANG_FORMAT} --dry-run --Werror ${f}
                    WORKING_DIRECTORY ${SOURCE_DIR} RESULT_VARIABLE rc ERROR_QUIET OUTPUT_QUIET)
    if(NOT rc EQUAL 0)
      list(APPEND bad ${f})
    endif()
  endif()
endforeach()
list(LENGTH files n)
if(bad)
  string(REPLACE ";" "\n  " bad_list "${bad}")
  message(FATAL_ERROR "clang-format: these files need formatting (run `make format`):\n  ${bad_list}")
endif()
message(STATUS "clang-format: ${n} files clean")
