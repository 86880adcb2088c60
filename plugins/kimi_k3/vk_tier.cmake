# kimi_k3_vk_tier: the Vulkan expert tier (vk_tier.h; owner: vktier) — hot routed experts
# resident on a Vulkan device (common/vk), computed there beside the CPU's expert source — and
# the shared experts on the same device (vk_dense.h, COLI_VK_DENSE).
# Linked into k3-run and the kimi_k3 plugin; opened only when COLI_VULKAN=1 / K3_VK=1.
coli_cc_library(NAME kimi_k3_vk_tier
  SRCS ${CMAKE_CURRENT_LIST_DIR}/vk_tier.cc ${CMAKE_CURRENT_LIST_DIR}/vk_dense.cc
  HDRS ${CMAKE_CURRENT_LIST_DIR}/vk_tier.h ${CMAKE_CURRENT_LIST_DIR}/vk_dense.h
  PUBLIC_DEPS kimi_k3_core coli_vk absl::status absl::statusor
  DEPS kimi_k3_expert_store coli_io coli_log coli_status absl::strings absl::str_format Threads::Threads)
target_link_libraries(k3-run PRIVATE kimi_k3_vk_tier)
if(TARGET kimi_k3)
  target_link_libraries(kimi_k3 PRIVATE kimi_k3_vk_tier)
endif()
