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

# The release's cost model (binary units, fill-in-order shares) prices the same plan at 7.509/h.
run_tool(TRUE optimize ${INPUT} --strategy lb --byte-units binary --share-rule fill_in_order)
expect("total 7.509" "${out}")
run_tool(FALSE optimize ${INPUT} --share-rule evenly)
expect("--share-rule: unknown share rule 'evenly'" "${err}")

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

# Every subcommand answers --help (exit 0); usage errors exit 2.
foreach(command optimize simulate compare validate)
  run_tool(TRUE ${command} --help)
  expect("Usage: plexus-place ${command}" "${out}")
endforeach()
execute_process(COMMAND ${TOOL} simulate ${INPUT} ${WORK}/plan.json --duration abc
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "a bad --duration should exit 2, got ${rc}:\n${err}")
endif()
expect("--duration expects a number in 0.001..1e+07, got 'abc'" "${err}")

# A directory is named as one.
run_tool(FALSE validate ${WORK})
expect("is a directory" "${err}")

# A source rate that overflows the cost arithmetic is refused (it printed -nan costs).
file(READ ${INPUT} scenario)
string(JSON huge SET "${scenario}" infrastructure sources 0 rate 1e308)
string(JSON huge SET "${huge}" infrastructure sources 1 rate 1e308)
file(WRITE ${WORK}/huge-rate.json "${huge}")
run_tool(FALSE compare ${WORK}/huge-rate.json)
expect("at most 1e+12 req/s are supported" "${err}")
if(out MATCHES "nan")
  message(FATAL_ERROR "compare printed NaN costs:\n${out}")
endif()

# The documented maximum worker count loads quickly (the duplicate-name check was quadratic:
# more than 20 s for 100000 workers; a hash set makes it well under a second).
string(JSON many SET "${scenario}" infrastructure workers 0 count 100000)
file(WRITE ${WORK}/many-workers.json "${many}")
string(TIMESTAMP start "%s%f")
run_tool(TRUE validate ${WORK}/many-workers.json)
string(TIMESTAMP end "%s%f")
math(EXPR elapsed_ms "(${end} - ${start}) / 1000")
expect("valid (" "${out}")
if(elapsed_ms GREATER 3000)
  message(FATAL_ERROR "validate of 100000 workers took ${elapsed_ms} ms (limit 3000)")
endif()
message(STATUS "validate of 100000 workers: ${elapsed_ms} ms")
