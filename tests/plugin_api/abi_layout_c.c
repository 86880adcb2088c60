/* Compiled as C99: the header must be valid C, and the layout C sees must equal C++'s. */
#include <stddef.h>
#include <string.h>

#include "plugin_api/coli_plugin.h"

/* Writes "struct.field=offset" entries (offset, then sizeof the struct) into out. */
size_t coli_test_c_layout(size_t* out, size_t capacity) {
  size_t n = 0;
#define X(type, field)                                                   \
  if (n + 2 <= capacity) {                                               \
    out[n] = offsetof(type, field);                                      \
    out[n + 1] = sizeof(type);                                           \
  }                                                                      \
  n += 2;
#include "tests/plugin_api/abi_layout.inc"
#undef X
  return n;
}

/* The defaults helper is usable from C. */
int coli_test_c_defaults_chunk(void) {
  coli_model_options_t options;
  memset(&options, 0xff, sizeof options);
  coli_model_options_defaults(&options);
  return options.chunk;
}
