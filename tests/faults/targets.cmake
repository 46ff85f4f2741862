# The fault suite's targets; IDEM_FAULTS_DIR is tests/faults. Needs
# PostgreSQL, Redis and faketime binaries at run time.
#
# Headers are included as "tests/faults/..." from this suite's repository
# (PROJECT_SOURCE_DIR, unless run.sh grafted the suite onto another tree).
get_filename_component(IDEM_FAULTS_ROOT "${IDEM_FAULTS_DIR}/../.." ABSOLUTE)
set(F "${IDEM_FAULTS_DIR}")

add_library(idem_fault_proxy ${F}/fault_proxy.cc)
target_include_directories(idem_fault_proxy PUBLIC ${IDEM_FAULTS_ROOT})
target_link_libraries(idem_fault_proxy PUBLIC
  absl::status absl::statusor absl::strings absl::synchronization absl::time
  Threads::Threads)
idem_warnings(idem_fault_proxy)

add_executable(fault_proxy ${F}/fault_proxy_main.cc)
target_link_libraries(fault_proxy PRIVATE idem_fault_proxy)
idem_warnings(fault_proxy)

add_library(idem_fault_checker ${F}/history.cc ${F}/checker.cc
  ${F}/selftest.cc)
target_include_directories(idem_fault_checker PUBLIC ${IDEM_FAULTS_ROOT})
target_link_libraries(idem_fault_checker PUBLIC idem_proto absl::statusor
  absl::strings)
idem_warnings(idem_fault_checker)

add_executable(faults_runner ${F}/runner_main.cc ${F}/cluster.cc
  ${F}/workload.cc ${F}/scenarios.cc)
target_link_libraries(faults_runner PRIVATE idem_fault_checker
  idem_fault_proxy idem_testing idem_proto gRPC::grpc++ PkgConfig::PQXX
  PkgConfig::HIREDIS)
target_compile_definitions(faults_runner PRIVATE
  IDEM_SIDECAR_PATH="$<TARGET_FILE:idempotency-sidecar>")
add_dependencies(faults_runner idempotency-sidecar)
idem_warnings(faults_runner)

# Pure unit tests: the checker reports planted violations (double grant,
# lost write, changed replay, ...); the proxy delays, black-holes, resets
# and cuts.
add_executable(faults_checker_test ${F}/checker_test.cc
  ${F}/fault_proxy_test.cc)
target_link_libraries(faults_checker_test PRIVATE idem_fault_checker
  idem_fault_proxy GTest::gtest_main)
idem_warnings(faults_checker_test)
add_test(NAME faults_checker_test COMMAND faults_checker_test)

# The quick fault run (about 5 minutes): every scenario once.
add_test(NAME faults_quick
  COMMAND bash ${F}/run.sh --quick --build-dir ${CMAKE_BINARY_DIR})
set_tests_properties(faults_quick PROPERTIES LABELS pgtest TIMEOUT 900)

# In build/tests/faults/ whichever way the suite was added.
set_target_properties(fault_proxy faults_runner faults_checker_test
  PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${IDEM_FAULTS_BINARY_DIR}")
