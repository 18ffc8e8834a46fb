# Project-wide target settings and the per-component test helper.

# Common warnings and standards for a scalemm target (no global flag lists).
function(scalemm_target_defaults target)
  target_compile_features(${target} PUBLIC cxx_std_17)
  set_target_properties(${target} PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                                             POSITION_INDEPENDENT_CODE ON)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wall>)
endfunction()

# scalemm_add_test(NAME SOURCES ... [LIBS ...])
# One Catch2 executable per component. Host cases run everywhere; cases tagged [gpu] are registered
# with SKIP_RETURN_CODE 77 so that, on a machine without a CUDA device, CTest reports them Skipped
# (the test main prints the reason) instead of passing them silently. Cases tagged [gpu][serial] read
# device-wide state (free memory) and run with no other test beside them (RUN_SERIAL).
# The cases are listed once after each build (ScalemmDiscoverTests.cmake), like catch_discover_tests
# but with the properties chosen per case by its tags. Tests are named "<executable>:<case>", the
# names catch_discover_tests gave them.
set(_SCALEMM_DISCOVER_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/ScalemmDiscoverTests.cmake)
function(scalemm_add_test name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  scalemm_target_defaults(${name})
  target_link_libraries(${name} PRIVATE scalemm_test_support ${T_LIBS})
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${name}_include.cmake")
  set(tests_file "${CMAKE_CURRENT_BINARY_DIR}/${name}_tests.cmake")
  add_custom_command(TARGET ${name} POST_BUILD
    BYPRODUCTS "${tests_file}"
    COMMAND "${CMAKE_COMMAND}"
            -D "TEST_EXECUTABLE=$<TARGET_FILE:${name}>"
            -D "TEST_PREFIX=${name}:"
            -D "TEST_WORKING_DIR=${CMAKE_CURRENT_BINARY_DIR}"
            -D "CTEST_FILE=${tests_file}"
            -P "${_SCALEMM_DISCOVER_SCRIPT}"
    VERBATIM)
  # Until the executable is built (e.g. after `quickstart.sh demo`), CTest shows one test that says so.
  file(WRITE "${include_file}"
    "if(EXISTS \"${tests_file}\")\n"
    "  include(\"${tests_file}\")\n"
    "else()\n"
    "  add_test(\"${name}: not built (cmake --build . --target ${name})\" \"${name}_NOT_BUILT\")\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")
endfunction()

# scalemm_add_library(NAME EXPORT SOURCES...): a static component library with the public include
# directories, installed and exported as scalemm::<EXPORT> (also the in-tree alias).
function(scalemm_add_library name export)
  add_library(${name} STATIC ${ARGN})
  add_library(scalemm::${export} ALIAS ${name})
  set_target_properties(${name} PROPERTIES EXPORT_NAME ${export} OUTPUT_NAME ${name})
  scalemm_target_defaults(${name})
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  install(TARGETS ${name} EXPORT scalemm-targets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endfunction()
