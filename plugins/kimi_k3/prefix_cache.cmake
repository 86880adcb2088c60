# The model-wide prefix cache (prefix_cache.h; owner: prefix cache): whole per-sequence states
# at shared prompt prefixes, restored by any session of the model. Part of kimi_k3_core (it
# holds Session::TakePrefixState's states); tests in tests/kimi_k3/prefix_cache.cmake.
target_sources(kimi_k3_core PRIVATE ${CMAKE_CURRENT_LIST_DIR}/prefix_cache.cc
                                    ${CMAKE_CURRENT_LIST_DIR}/prefix_cache_tag.cc)
# prefix_cache_tag hashes its own loaded code (dl_iterate_phdr).
target_link_libraries(kimi_k3_core PRIVATE ${CMAKE_DL_LIBS})
