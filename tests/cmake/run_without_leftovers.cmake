# Runs one test program and fails when it leaves anything behind in the
# build directory or the test's working directory: tests write under a
# temporary directory of their own. Run by ctest as
#   cmake -DTEST=<program> -DBUILD_DIR=<dir> -DWORK_DIR=<dir> -P run_without_leftovers.cmake
# A new entry, or a file rewritten during the run, is a leftover. A program
# whose every case skipped exits 77 (tests/support/skip.h); CMake 3.25's -P
# cannot choose its own exit code, so that becomes the line below, which
# the tests' SKIP_REGULAR_EXPRESSION turns into ctest's "Skipped".
set(tmp_root "$ENV{TMPDIR}")
if(NOT tmp_root)
  set(tmp_root /tmp)
endif()
string(RANDOM LENGTH 8 suffix)
set(marker ${tmp_root}/dtrain-test-start-${suffix})

function(entries out)
  set(all "")
  foreach(dir ${BUILD_DIR} ${WORK_DIR})
    file(GLOB found LIST_DIRECTORIES true ${dir}/*)
    list(APPEND all ${found})
  endforeach()
  set(${out} ${all} PARENT_SCOPE)
endfunction()

entries(before)
file(TOUCH ${marker})
execute_process(COMMAND ${TEST} RESULT_VARIABLE code)
entries(after)
set(left "")
foreach(e ${after})
  list(FIND before ${e} at)
  if(at EQUAL -1)
    list(APPEND left ${e})
  elseif(NOT IS_DIRECTORY ${e} AND ${e} IS_NEWER_THAN ${marker})
    list(APPEND left ${e})
  endif()
endforeach()
file(REMOVE ${marker})
if(left)
  string(REPLACE ";" "\n  " left "${left}")
  message(FATAL_ERROR "${TEST} left files behind (write them under a temporary directory):\n  ${left}")
endif()
if(code EQUAL 77)
  message(STATUS "dtrain-test: every case of ${TEST} skipped (exit 77)")
elseif(NOT code EQUAL 0)
  message(FATAL_ERROR "${TEST} failed: ${code}")
endif()
