# End-to-end run of the plexus-place tool on a bundled scenario: optimize writes a plan that
# simulate then serves at the target rate; compare prints every strategy; bad input fails cleanly.
# Variables: TOOL, INPUT, WORK.
file(MAKE_DIRECTORY ${WORK})

function(run_tool expect_success)
  execute_process(COMMAND ${TOOL} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err TIMEOUT 60)
  if(expect_success AND NOT rc EQUAL 0)
    message(FATAL_ERROR "plexus-place ${ARGN} failed (${rc}):\n${out}\n${err}")
  elseif(NOT expect_success AND rc EQUAL 0)
    message(FATAL_ERROR "plexus-place ${ARGN} should have failed:\n${out}")
  endif()
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

function(expect text haystack)
  string(FIND "${haystack}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "expected '${text}' in:\n${haystack}")
  endif()
endfunction()

run_tool(TRUE optimize ${INPUT} --out ${WORK}/plan.json)
expect("plan 'jb'" "${out}")
expect("VQA" "${out}")

run_tool(TRUE optimize ${INPUT} --strategy lb --json)
expect("\"proven_optimal\": true" "${out}")

run_tool(TRUE simulate ${INPUT} ${WORK}/plan.json --duration 20)
expect("sustained: yes" "${out}")

run_tool(TRUE simulate ${INPUT} ${WORK}/plan.json --duration 20 --json)
expect("\"sustained\": true" "${out}")

run_tool(TRUE compare ${INPUT})
foreach(strategy jb lb bf ff pte ptc spc)
  expect("\n${strategy} " "${out}")
endforeach()

file(WRITE ${WORK}/broken.json "{\"workflow\": {\"operators\": []}}")
run_tool(FALSE optimize ${WORK}/broken.json)
expect("workflow.operators" "${err}")
run_tool(FALSE optimize ${INPUT} --strategy nope)
expect("unknown strategy 'nope'" "${err}")
