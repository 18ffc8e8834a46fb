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
function(scalemm_add_test name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  scalemm_target_defaults(${name})
  target_link_libraries(${name} PRIVATE scalemm_test_support ${T_LIBS})
  catch_discover_tests(${name}
    TEST_SPEC "~[gpu]" TEST_PREFIX "${name}: "
    PROPERTIES LABELS "host" TIMEOUT 600
    DISCOVERY_TIMEOUT 60)
  catch_discover_tests(${name}
    TEST_SPEC "[gpu]~[serial]" TEST_PREFIX "${name}: "
    PROPERTIES LABELS "gpu" SKIP_RETURN_CODE 77 TIMEOUT 600
    DISCOVERY_TIMEOUT 60)
  catch_discover_tests(${name}
    TEST_SPEC "[gpu][serial]" TEST_PREFIX "${name}: "
    PROPERTIES LABELS "gpu" SKIP_RETURN_CODE 77 TIMEOUT 600 RUN_SERIAL TRUE
    DISCOVERY_TIMEOUT 60)
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
