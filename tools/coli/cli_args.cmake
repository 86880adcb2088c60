# coli_cli_args: what the `coli` subcommands share at their command line (tools/coli/cli_args.h:
# `--flag VALUE` / `--flag=VALUE`, numbers with ranges, the prompt's UTF-8 check, the model
# folder check, host errors as text for a person) and `coli run`'s flags (run_flags.h);
# unit-tested in tests/coli/cli_args_test.cc.
coli_cc_library(NAME coli_cli_args
  SRCS ${CMAKE_CURRENT_LIST_DIR}/cli_args.cc ${CMAKE_CURRENT_LIST_DIR}/run_flags.cc
  HDRS ${CMAKE_CURRENT_LIST_DIR}/cli_args.h ${CMAKE_CURRENT_LIST_DIR}/run_flags.h
  PUBLIC_DEPS coli_flags coli_client absl::status absl::statusor
  DEPS coli_status absl::strings absl::str_format)
target_link_libraries(coli PRIVATE coli_cli_args)
