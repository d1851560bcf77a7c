# ctest's check that dtrain_test_sources (test_sources.cmake) refuses an
# empty test folder and accepts a real one. Driver:
#   cmake -DSOURCE_DIR=<repo> -P check_test_sources.cmake
# It runs itself with -DFOLDER=<dir> in a child cmake, once per folder, so
# the temporary empty folder is removed whatever the child did.
include(${CMAKE_CURRENT_LIST_DIR}/test_sources.cmake)

if(DEFINED FOLDER)
  dtrain_test_sources(srcs ${FOLDER})
  list(LENGTH srcs n)
  message(STATUS "accepted ${FOLDER}: ${n} test file(s)")
  return()
endif()

function(run_on folder out_code out_text)
  execute_process(COMMAND ${CMAKE_COMMAND} -DFOLDER=${folder} -P ${CMAKE_CURRENT_LIST_FILE}
                  RESULT_VARIABLE code OUTPUT_VARIABLE text ERROR_VARIABLE text)
  message(STATUS "cmake on ${folder}: exit ${code}\n${text}")
  set(${out_code} ${code} PARENT_SCOPE)
  set(${out_text} "${text}" PARENT_SCOPE)
endfunction()

run_on(${SOURCE_DIR}/tests/unit/common code text)
if(NOT code EQUAL 0)
  message(FATAL_ERROR "a test folder with tests was refused")
endif()

string(RANDOM LENGTH 8 suffix)
set(tmp_root "$ENV{TMPDIR}")
if(NOT tmp_root)
  set(tmp_root /tmp)
endif()
set(empty ${tmp_root}/dtrain-empty-test-folder-${suffix})
file(MAKE_DIRECTORY ${empty})
file(WRITE ${empty}/helper.cpp "")  # a source that is not a *_test.cpp does not count
run_on(${empty} code text)
file(REMOVE_RECURSE ${empty})
if(code EQUAL 0 OR NOT text MATCHES "holds no[ \n]+\\*_test\\.cpp")
  message(FATAL_ERROR "an empty test folder was accepted (exit ${code}); it must fail the configure")
endif()
message(STATUS "an empty test folder fails the configure, naming it: OK")
