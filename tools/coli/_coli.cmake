# The `coli` executable. Subcommands are added by the other *.cmake files of this folder with
# target_sources(coli PRIVATE ...) and target_link_libraries(coli PRIVATE ...).
coli_cc_binary(NAME coli SRCS ${CMAKE_CURRENT_LIST_DIR}/main.cc ${CMAKE_CURRENT_LIST_DIR}/bench.cc)
target_compile_definitions(coli PRIVATE COLI_VERSION="${PROJECT_VERSION}"
  COLI_DEFAULT_PLUGIN_DIR="${COLI_PLUGIN_DIR}")
