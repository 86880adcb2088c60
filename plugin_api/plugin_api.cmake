# coli_plugin_api: the C99 ABI header plus the header-only C++ helpers (absl only). Plugins and
# the host both link it; it links nothing of coli's.
add_library(coli_plugin_api INTERFACE)
target_include_directories(coli_plugin_api INTERFACE ${PROJECT_SOURCE_DIR})
target_link_libraries(coli_plugin_api INTERFACE absl::status absl::statusor absl::strings)
