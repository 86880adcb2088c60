# The engine on spec §9.8's full-precision vendor-style snapshot (build/fixtures/k3_vendor_f32:
# every tensor F32, routed experts as plain w{1,2,3}.weight F32, no quantization_config; random
# weights) against the independent float64 reference tools/k3/k3_ref.py: the streaming store
# and pread sources (chunked and token-at-a-time), the Vulkan tier's off switch, k3-repack's
# refusal, damaged variants. Logits, greedy ids, per-layer hidden states and load-time quantization: in
# k3_model_test. Plugin-level: k3_vendor_plugin_test.
coli_cc_test(NAME k3_vendor_f32_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/vendor_f32_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/reference_util.cc
  DEPS kimi_k3_vk_tier kimi_k3_expert_store kimi_k3_repack kimi_k3_core coli_vk coli_sampling
       coli_safetensors coli_json coli_status absl::strings)
target_compile_definitions(k3_vendor_f32_test PRIVATE
  K3_TEST_PYTHON="${COLI_PYTHON}"
  K3_TEST_REF="${PROJECT_SOURCE_DIR}/tools/k3/k3_ref.py"
  PROJECT_TOOLS_K3="${PROJECT_SOURCE_DIR}/tools/k3"
  K3_TEST_VENDOR="${CMAKE_BINARY_DIR}/fixtures/k3_vendor_f32")
if(TARGET k3_tiny_fixture)
  add_dependencies(k3_vendor_f32_test k3_tiny_fixture)
endif()

# The same snapshot through the plugin's C ABI (its streaming expert store).
if(TARGET kimi_k3)
  coli_cc_test(NAME k3_vendor_plugin_test
    SRCS ${CMAKE_CURRENT_LIST_DIR}/vendor_plugin_test.cc
         ${CMAKE_CURRENT_LIST_DIR}/reference_util.cc
    DEPS coli_host_core coli_plugin_api coli_safetensors coli_json coli_status absl::strings)
  target_compile_definitions(k3_vendor_plugin_test PRIVATE
    K3_TEST_PYTHON="${COLI_PYTHON}"
    K3_TEST_REF="${PROJECT_SOURCE_DIR}/tools/k3/k3_ref.py"
    COLI_K3_TINY_DIR="${PROJECT_BINARY_DIR}/fixtures/k3_vendor_f32"
    COLI_PLUGIN_DIR_FOR_TEST="${COLI_PLUGIN_DIR}")
  add_dependencies(k3_vendor_plugin_test kimi_k3)
  if(TARGET k3_tiny_fixture)
    add_dependencies(k3_vendor_plugin_test k3_tiny_fixture)
  endif()
endif()
