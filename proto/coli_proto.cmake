# coli_proto: the C++ code generated from proto/coli/v1/*.proto (messages + gRPC stubs), built once
# into one library so nothing else recompiles generated code. Used only by host/ and tools/coli.
set(_coli_proto_src ${CMAKE_CURRENT_LIST_DIR}/coli/v1/coli.proto)
set(_coli_proto_out ${PROJECT_BINARY_DIR}/proto/coli/v1)
set(_coli_proto_generated
  ${_coli_proto_out}/coli.pb.cc ${_coli_proto_out}/coli.pb.h
  ${_coli_proto_out}/coli.grpc.pb.cc ${_coli_proto_out}/coli.grpc.pb.h)
add_custom_command(
  OUTPUT ${_coli_proto_generated}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/proto
  COMMAND ${Protobuf_PROTOC_EXECUTABLE}
    --proto_path=${PROJECT_SOURCE_DIR}/proto
    --cpp_out=${PROJECT_BINARY_DIR}/proto
    --grpc_out=${PROJECT_BINARY_DIR}/proto
    --plugin=protoc-gen-grpc=${GRPC_CPP_PLUGIN}
    ${_coli_proto_src}
  DEPENDS ${_coli_proto_src}
  COMMENT "protoc: coli/v1/coli.proto"
  VERBATIM)
# The standard grpc.health.v1 messages (proto/grpc/health/v1/health.proto): gRPC's built-in
# health service has no protobuf descriptor, so coli-host links these for server reflection only.
set(_coli_health_src ${CMAKE_CURRENT_LIST_DIR}/grpc/health/v1/health.proto)
set(_coli_health_out ${PROJECT_BINARY_DIR}/proto/grpc/health/v1)
set(_coli_health_generated ${_coli_health_out}/health.pb.cc ${_coli_health_out}/health.pb.h)
add_custom_command(
  OUTPUT ${_coli_health_generated}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/proto
  COMMAND ${Protobuf_PROTOC_EXECUTABLE}
    --proto_path=${PROJECT_SOURCE_DIR}/proto
    --cpp_out=${PROJECT_BINARY_DIR}/proto
    ${_coli_health_src}
  DEPENDS ${_coli_health_src}
  COMMENT "protoc: grpc/health/v1/health.proto"
  VERBATIM)
add_library(coli_proto STATIC ${_coli_proto_generated} ${_coli_health_generated})
# Generated code: no project warnings (it is not ours to fix), the include root for
# "coli/v1/coli.pb.h".
target_include_directories(coli_proto SYSTEM PUBLIC ${PROJECT_BINARY_DIR}/proto)
target_link_libraries(coli_proto PUBLIC protobuf::libprotobuf gRPC::grpc++)
