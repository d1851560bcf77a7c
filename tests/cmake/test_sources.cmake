# dtrain_test_sources(<var> <folder>): the *_test.cpp files of one test
# folder. A folder without any is a configure error, not a skipped suite: a
# suite that silently dropped out would "pass" by running nothing. Works in
# script mode too, where check_test_sources.cmake proves the error fires.
function(dtrain_test_sources var folder)
  if(CMAKE_SCRIPT_MODE_FILE)
    file(GLOB srcs ${folder}/*_test.cpp)  # CONFIGURE_DEPENDS is project mode only
  else()
    file(GLOB srcs CONFIGURE_DEPENDS ${folder}/*_test.cpp)
  endif()
  if(NOT srcs)
    message(FATAL_ERROR "test folder ${folder} holds no *_test.cpp: add its tests, or remove "
                        "the folder and its line in tests/CMakeLists.txt")
  endif()
  set(${var} ${srcs} PARENT_SCOPE)
endfunction()
