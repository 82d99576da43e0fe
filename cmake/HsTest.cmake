# SPDX-License-Identifier: Apache-2.0
# hs_add_test(NAME name SOURCES a.c... LIBS libs... [TIMEOUT s] [LABELS l...])
# One Check program per module, registered with CTest under a timeout.
# A test that exits 77 is reported as skipped (GPU tests on CPU-only boxes).
function(hs_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS;ARGS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  if(HS_SANITIZE)
    math(EXPR T_TIMEOUT "${T_TIMEOUT} * 3") # sanitized code runs 2-3x slower
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} hsflow_static PkgConfig::CHECK Threads::Threads m)
  target_include_directories(${T_NAME} PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/tests)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS})
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} SKIP_RETURN_CODE 77
                       ENVIRONMENT "CK_DEFAULT_TIMEOUT=${T_TIMEOUT}")
  if(T_LABELS)
    set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()
