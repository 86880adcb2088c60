# `coli bench vk` (the Vulkan expert tier's uploads and expert chain, and with --dense the shared
# experts' block, against the device's own copy and memory-bandwidth probes, and the CPU's
# exact-float block) and its smoke test
# (label bench_smoke; a --quick run on lavapipe in a few seconds; skipped without any Vulkan
# device unless COLI_REQUIRE_VULKAN=1).
target_sources(coli PRIVATE ${CMAKE_CURRENT_LIST_DIR}/bench_vk.cc)
target_link_libraries(coli PRIVATE coli_vk coli_kernels coli_ops)

if(COLI_BUILD_TESTS)
  add_test(NAME vk_bench_smoke
    COMMAND ${COLI_PYTHON} ${PROJECT_SOURCE_DIR}/bench/vk/check_bench_json.py
            $<TARGET_FILE:coli>)
  set_tests_properties(vk_bench_smoke PROPERTIES LABELS bench_smoke TIMEOUT 120
                                                 SKIP_RETURN_CODE 77)
endif()
