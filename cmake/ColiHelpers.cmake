# Target helpers: every library, binary, plugin and test in the tree is declared with one of these.
include(GoogleTest)

set(COLI_WARNINGS -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)

function(_coli_common_flags target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${COLI_WARNINGS}>
    $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra -Wno-unused-parameter>)
  if(COLI_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
endfunction()

# coli_cc_library(NAME name SRCS ... [HDRS ...] [DEPS ...] [PUBLIC_DEPS ...])
function(coli_cc_library)
  cmake_parse_arguments(A "" "NAME" "SRCS;HDRS;DEPS;PUBLIC_DEPS" ${ARGN})
  add_library(${A_NAME} STATIC ${A_SRCS} ${A_HDRS})
  _coli_common_flags(${A_NAME})
  target_link_libraries(${A_NAME} PUBLIC ${A_PUBLIC_DEPS} PRIVATE ${A_DEPS})
endfunction()

# coli_cc_binary(NAME name SRCS ... [DEPS ...])
function(coli_cc_binary)
  cmake_parse_arguments(A "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${A_NAME} ${A_SRCS})
  _coli_common_flags(${A_NAME})
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS})
endfunction()

# coli_cc_test(NAME name SRCS ... [DEPS ...] [LABELS ...])
# One GoogleTest binary per library; every TEST becomes its own ctest entry.
function(coli_cc_test)
  cmake_parse_arguments(A "" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${A_NAME} ${A_SRCS} ${PROJECT_SOURCE_DIR}/tests/support/test_env.cc)
  _coli_common_flags(${A_NAME})
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS} GTest::gmock GTest::gtest_main)
  # Tests find the source and build trees through COLI_SOURCE_DIR / COLI_BINARY_DIR.
  target_compile_definitions(${A_NAME} PRIVATE COLI_TEST_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                                COLI_TEST_BINARY_DIR="${PROJECT_BINARY_DIR}")
  set(labels ${A_LABELS})
  if(NOT labels)
    set(labels unit)
  endif()
  gtest_discover_tests(${A_NAME}
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
    PROPERTIES LABELS "${labels}"
    DISCOVERY_TIMEOUT 60)
endfunction()

# coli_plugin(NAME name SRCS ... [DEPS ...]): a model-family plugin, a MODULE .so with hidden
# symbols except coli_plugin_entry, written to ${COLI_PLUGIN_DIR}.
function(coli_plugin)
  cmake_parse_arguments(A "" "NAME" "SRCS;DEPS" ${ARGN})
  add_library(${A_NAME} MODULE ${A_SRCS})
  _coli_common_flags(${A_NAME})
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS})
  set_target_properties(${A_NAME} PROPERTIES
    PREFIX "libcoli_"
    LIBRARY_OUTPUT_DIRECTORY ${COLI_PLUGIN_DIR}
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  target_link_options(${A_NAME} PRIVATE -Wl,--no-undefined)
endfunction()

# coli_add_subdirectories(): adds every child folder that has a CMakeLists.txt, so a new
# library, plugin or test folder needs no edit of its parent.
macro(coli_add_subdirectories)
  file(GLOB _coli_children LIST_DIRECTORIES true RELATIVE ${CMAKE_CURRENT_SOURCE_DIR}
       ${CMAKE_CURRENT_SOURCE_DIR}/*)
  list(SORT _coli_children)
  foreach(_child ${_coli_children})
    if(IS_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/${_child} AND
       EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${_child}/CMakeLists.txt)
      add_subdirectory(${_child})
    endif()
  endforeach()
endmacro()

# coli_include_parts(): includes every *.cmake file of this folder, so several owners can
# declare targets in one folder without editing one shared file.
macro(coli_include_parts)
  file(GLOB _coli_parts ${CMAKE_CURRENT_SOURCE_DIR}/*.cmake)
  list(SORT _coli_parts)
  foreach(_part ${_coli_parts})
    include(${_part})
  endforeach()
endmacro()
