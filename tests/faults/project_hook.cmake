# Used by run.sh when the build directory does not include tests/faults yet:
# configure the project with -DCMAKE_PROJECT_INCLUDE=<this file> and the
# suite's targets are defined once the top-level CMakeLists.txt has been
# processed (all targets and idem_warnings() exist by then). Harmless once
# tests/CMakeLists.txt has add_subdirectory(faults): the targets exist then
# and this adds nothing.
if(NOT CMAKE_CURRENT_SOURCE_DIR STREQUAL CMAKE_SOURCE_DIR)
  return()
endif()
set(IDEM_FAULTS_HOOK_DIR "${CMAKE_CURRENT_LIST_DIR}")
function(idem_faults_add_late)
  if(NOT TARGET faults_runner)
    set(IDEM_FAULTS_DIR "${IDEM_FAULTS_HOOK_DIR}")
    set(IDEM_FAULTS_BINARY_DIR "${CMAKE_BINARY_DIR}/tests/faults")
    include("${IDEM_FAULTS_HOOK_DIR}/targets.cmake")
  endif()
endfunction()
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL idem_faults_add_late)
