# Runs one command-line invocation and checks how it ends: the exit code must be EXIT exactly
# (a crash or a timeout is no exit code, so it fails even after the expected text was printed)
# and the output (stdout and stderr) must contain EXPECT (or match the regular expression
# MATCH). Variables: TOOL, ARGS (a list), EXIT, EXPECT or MATCH, TIMEOUT (seconds, default 30).
if(NOT DEFINED TIMEOUT)
  set(TIMEOUT 30)
endif()
execute_process(COMMAND ${TOOL} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err TIMEOUT ${TIMEOUT})
set(all "${out}${err}")
string(REPLACE ";" " " shown "${ARGS}")
if(NOT "${rc}" STREQUAL "${EXIT}")
  message(FATAL_ERROR "${TOOL} ${shown}: expected exit code ${EXIT}, got '${rc}'\n${all}")
endif()
if(DEFINED MATCH)
  if(NOT "${all}" MATCHES "${MATCH}")
    message(FATAL_ERROR "${TOOL} ${shown}: expected output matching '${MATCH}':\n${all}")
  endif()
else()
  string(FIND "${all}" "${EXPECT}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${TOOL} ${shown}: expected '${EXPECT}' in the output:\n${all}")
  endif()
endif()
