// coli-host: loads the model-family plugins and serves coli.v1 over gRPC.
//
//   coli-host [--plugin-dir DIR] [--listen unix:/path | 127.0.0.1:PORT] [--allow-remote]
//             [--workers N] [--queue N] [--pool N] [--model DIR]... [--ready-fd FD]
//             [--decode-delay-ms N]   (pace decoding, for demos and UI tests)
//             [--prefill-delay-ms N]  (pace prefill chunks, for the prefill-progress tests)
//             [--max-batch N]         (decode rows of one model per decode call; 1 = off)
//
// SIGINT/SIGTERM end it cleanly: requests in flight finish with UNAVAILABLE, then it exits 0.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/log/log.h"
#include "host/engine.h"
#include "host/service.h"

namespace {

void Usage() {
  std::fprintf(
      stderr,
      "usage: coli-host [--plugin-dir DIR] [--listen ADDR] [--allow-remote]\n"
      "                 [--workers N] [--queue N] [--pool N] [--model DIR]... [--ready-fd FD]\n"
      "                 [--decode-delay-ms N] [--prefill-delay-ms N] [--max-batch N]\n"
      "  ADDR: unix:/path (default unix:$XDG_RUNTIME_DIR/coli-host.sock or\n"
      "        /tmp/coli-host-$UID.sock), 127.0.0.1:PORT, localhost:PORT, [::1]:PORT;\n"
      "        any other address needs --allow-remote\n");
}

std::string DefaultListen() {
  if (const char* run = std::getenv("XDG_RUNTIME_DIR"); run && *run) {
    return std::string("unix:") + run + "/coli-host.sock";
  }
  return "unix:/tmp/coli-host-" + std::to_string(getuid()) + ".sock";
}

}  // namespace

int main(int argc, char** argv) {
  coli::host::EngineOptions engine_options;
  engine_options.plugin_dir = COLI_PLUGIN_DIR;
  if (const char* dir = std::getenv("COLI_PLUGIN_DIR"); dir && *dir)
    engine_options.plugin_dir = dir;
  // Private hosts inherit the client's environment: COLI_DECODE_DELAY_MS paces them too.
  if (const char* delay = std::getenv("COLI_DECODE_DELAY_MS");
      delay && *delay && !absl::SimpleAtoi(delay, &engine_options.decode_delay_ms)) {
    std::fprintf(stderr, "coli-host: COLI_DECODE_DELAY_MS='%s' is not a number\n", delay);
    return 2;
  }
  if (const char* pool = std::getenv("COLI_POOL_SESSIONS");
      pool && *pool && !absl::SimpleAtoi(pool, &engine_options.pool_sessions)) {
    std::fprintf(stderr, "coli-host: COLI_POOL_SESSIONS='%s' is not a number\n", pool);
    return 2;
  }
  if (const char* delay = std::getenv("COLI_PREFILL_DELAY_MS");
      delay && *delay && !absl::SimpleAtoi(delay, &engine_options.prefill_delay_ms)) {
    std::fprintf(stderr, "coli-host: COLI_PREFILL_DELAY_MS='%s' is not a number\n", delay);
    return 2;
  }
  coli::host::ServerOptions server_options;
  std::vector<std::string> models;
  int ready_fd = -1;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "coli-host: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto number = [&](int* out) {
      const char* v = value();
      if (!absl::SimpleAtoi(v, out)) {
        std::fprintf(stderr, "coli-host: %s: '%s' is not a number\n", arg.c_str(), v);
        std::exit(2);
      }
    };
    if (arg == "--plugin-dir")
      engine_options.plugin_dir = value();
    else if (arg == "--listen")
      server_options.listen = value();
    else if (arg == "--allow-remote")
      server_options.allow_remote = true;
    else if (arg == "--workers")
      number(&engine_options.workers);
    else if (arg == "--queue")
      number(&engine_options.queue_capacity);
    else if (arg == "--decode-delay-ms")
      number(&engine_options.decode_delay_ms);
    else if (arg == "--prefill-delay-ms")
      number(&engine_options.prefill_delay_ms);
    else if (arg == "--max-batch")
      number(&engine_options.max_batch);
    else if (arg == "--pool")
      number(&engine_options.pool_sessions);
    else if (arg == "--model")
      models.push_back(value());
    else if (arg == "--ready-fd")
      number(&ready_fd);
    else if (arg == "--help" || arg == "-h") {
      Usage();
      return 0;
    } else {
      std::fprintf(stderr, "coli-host: unknown argument '%s'\n", arg.c_str());
      Usage();
      return 2;
    }
  }
  if (engine_options.pool_sessions < 0 || engine_options.pool_sessions > 1024) {
    std::fprintf(stderr, "coli-host: --pool / COLI_POOL_SESSIONS: %d is not in [0, 1024]\n",
                 engine_options.pool_sessions);
    return 2;
  }
  if (server_options.listen.empty()) server_options.listen = DefaultListen();
  if (server_options.listen.rfind("unix:", 0) == 0) {
    unlink(server_options.listen.c_str() + 5);  // a stale socket from a crashed host
  }

  // Signals are taken by sigwait below, so every thread (gRPC's included) must block them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  coli::host::Engine engine(engine_options);
  for (const auto& dir : models) {
    coli::v1::LoadModelRequest request;
    request.set_model_dir(dir);
    auto info = engine.LoadModel(request, nullptr);
    if (!info.ok()) {
      COLI_LOG(kError) << info.status().message();
      return 1;
    }
  }
  auto server = coli::host::HostServer::Start(&engine, server_options);
  if (!server.ok()) {
    COLI_LOG(kError) << server.status().message();
    return 1;
  }
  if (ready_fd >= 0) {
    std::string line = "READY " + (*server)->address() + "\n";
    if (write(ready_fd, line.data(), line.size()) < 0) {
      COLI_LOG(kWarning) << "--ready-fd " << ready_fd << ": " << std::strerror(errno);
    }
    close(ready_fd);
  }
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  COLI_LOG(kInfo) << "coli-host: signal " << signal_number << ", shutting down";
  (*server)->Shutdown();
  if (server_options.listen.rfind("unix:", 0) == 0) unlink(server_options.listen.c_str() + 5);
  return 0;
}
