# Run after a test executable is built (see scalemm_add_test): lists its Catch2 cases once per class
# and writes one CTest test per case, with the class's properties. Replaces three catch_discover_tests
# calls, each of which warned "contains no tests!" when its tag filter matched nothing in an
# executable; an empty class is normal here (most executables have no [gpu][serial] case).
#
# Inputs (-D): TEST_EXECUTABLE, TEST_PREFIX, TEST_WORKING_DIR, CTEST_FILE.
#   host   ~[gpu]          LABELS host
#   gpu    [gpu]~[serial]  LABELS gpu, SKIP_RETURN_CODE 77 (the test main exits 77 without a device)
#   serial [gpu][serial]   as gpu, plus RUN_SERIAL (reads device-wide state such as free memory)

function(_scalemm_bracket out value)
  # A bracket argument that survives any test name in the generated script.
  set(${out} "[==[${value}]==]" PARENT_SCOPE)
endfunction()

set(_script "")
set(_total 0)
foreach(_class host gpu serial)
  if(_class STREQUAL "host")
    set(_spec "~[gpu]")
    set(_props LABELS host TIMEOUT 600)
  elseif(_class STREQUAL "gpu")
    set(_spec "[gpu]~[serial]")
    set(_props LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 600)
  else()
    set(_spec "[gpu][serial]")
    set(_props LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 600 RUN_SERIAL TRUE)
  endif()
  execute_process(
    COMMAND "${TEST_EXECUTABLE}" "${_spec}" --list-test-names-only
    OUTPUT_VARIABLE _out
    ERROR_VARIABLE _err
    RESULT_VARIABLE _rc
    WORKING_DIRECTORY "${TEST_WORKING_DIR}")
  # Catch2 v2 exits with the number of cases listed; a crash or signal is not a number.
  if(NOT _rc MATCHES "^[0-9]+$")
    message(FATAL_ERROR "cannot list the test cases of ${TEST_EXECUTABLE} (${_spec}): ${_rc}\n${_out}${_err}")
  endif()
  string(REPLACE ";" "\\;" _out "${_out}")
  string(REPLACE "\n" ";" _lines "${_out}")
  foreach(_name IN LISTS _lines)
    if(_name STREQUAL "")
      continue()
    endif()
    # The case name as a Catch2 test spec: ',' '[' ']' would otherwise be read as spec syntax.
    set(_arg "${_name}")
    foreach(_c , [ ])
      string(REPLACE "${_c}" "\\${_c}" _arg "${_arg}")
    endforeach()
    _scalemm_bracket(_test "${TEST_PREFIX}${_name}")
    _scalemm_bracket(_exe "${TEST_EXECUTABLE}")
    _scalemm_bracket(_spec_arg "${_arg}")
    _scalemm_bracket(_wd "${TEST_WORKING_DIR}")
    string(APPEND _script "add_test(${_test} ${_exe} ${_spec_arg})\n")
    string(APPEND _script "set_tests_properties(${_test} PROPERTIES WORKING_DIRECTORY ${_wd} ${_props})\n")
    math(EXPR _total "${_total} + 1")
  endforeach()
endforeach()
if(_total EQUAL 0)
  message(FATAL_ERROR "${TEST_EXECUTABLE} has no test cases")
endif()
file(WRITE "${CTEST_FILE}" "${_script}")
