// tools/coli/serve: `coli serve`, the OpenAI-compatible HTTP gateway over the host's gRPC API.
// The OpenAI logic without networking is in serve_openai.h.
#ifndef COLI_TOOLS_COLI_SERVE_H_
#define COLI_TOOLS_COLI_SERVE_H_

namespace coli::cli::serve {

// `coli serve --model DIR [--port N] [--host ADDR --api-key KEY] [--connect ADDR]`; argv[0] is
// "serve". Returns the process exit code (2 for usage errors).
int RunServe(int argc, char** argv);
// `coli web [--model DIR] ...`: the same gateway plus the chat page at /, on the embedded tiny
// model when no model is given.
int RunWeb(int argc, char** argv);

}  // namespace coli::cli::serve

#endif  // COLI_TOOLS_COLI_SERVE_H_
