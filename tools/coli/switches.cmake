# `coli switches` (switches.cc): the model switches of the environment, from the host's plugins.
target_sources(coli PRIVATE ${CMAKE_CURRENT_LIST_DIR}/switches.cc)
