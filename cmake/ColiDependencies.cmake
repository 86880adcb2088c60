# Every dependency comes from Debian's packages; nothing is downloaded at configure or build time.
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(absl CONFIG REQUIRED)
# Debian ships no protobuf CMake config: module mode.
find_package(Protobuf MODULE REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(ZLIB REQUIRED)  # CRC-32 of the repacked container's tensors
find_package(GTest CONFIG REQUIRED)
find_package(benchmark CONFIG REQUIRED)
find_package(Vulkan REQUIRED COMPONENTS glslangValidator)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
find_package(Python3 REQUIRED COMPONENTS Interpreter)

find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)

# volk is shipped as source (libvulkan-volk-dev): compile its volk.c once.
find_file(VOLK_C volk.c PATHS /usr/include REQUIRED NO_DEFAULT_PATH)
add_library(coli_volk STATIC ${VOLK_C})
target_include_directories(coli_volk SYSTEM PUBLIC /usr/include)
target_compile_definitions(coli_volk PUBLIC VK_NO_PROTOTYPES)
target_link_libraries(coli_volk PUBLIC Vulkan::Headers ${CMAKE_DL_LIBS})
set_target_properties(coli_volk PROPERTIES C_STANDARD 11)

# The numpy reference and fixture tools run on Debian's python3 (python3-numpy).
set(COLI_PYTHON /usr/bin/python3 CACHE FILEPATH "Python with numpy for tools and references")
