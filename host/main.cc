// coli-host: loads the model-family plugins and serves coli.v1 over gRPC.
//
//   coli-host [--plugin-dir DIR] [--listen unix:/path | 127.0.0.1:PORT] [--allow-remote]
//             [--workers N] [--queue N] [--pool N] [--model DIR]... [--ready-fd FD]
//             [--decode-delay-ms N]   (pace decoding, for demos and UI tests)
//             [--prefill-delay-ms N]  (pace prefill chunks, for the prefill-progress tests)
//             [--max-batch N]         (decode rows of one model per decode call; 1 = off)
//   coli-host --switches [--plugin-dir DIR]  (the model switches of the environment, as the
//                                             plugins declare them, then exit)
//
// SIGINT/SIGTERM end it cleanly: requests in flight finish with UNAVAILABLE, then it exits 0.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/flags/flags.h"
#include "common/log/log.h"
#include "common/status/status.h"
#include "host/engine.h"
#include "host/model_options_env.h"
#include "host/openmp_policy.h"
#include "host/plugin.h"
#include "host/service.h"

namespace {

constexpr char kUsage[] =
    "usage: coli-host [--plugin-dir DIR] [--listen ADDR] [--allow-remote]\n"
    "                 [--workers N] [--queue N] [--pool N] [--model DIR]... [--ready-fd FD]\n"
    "                 [--decode-delay-ms N] [--prefill-delay-ms N] [--max-batch N]\n"
    "                 [--max-sessions N] [--spare-idle-s N]\n"
    "       coli-host --switches [--plugin-dir DIR]\n"
    "  ADDR: unix:/path (default unix:$XDG_RUNTIME_DIR/coli-host.sock or\n"
    "        /tmp/coli-host-$UID.sock), 127.0.0.1:PORT, localhost:PORT, [::1]:PORT;\n"
    "        any other address needs --allow-remote\n"
    "  --workers N (1-1024, default 4)  --queue N (1-1000000, default 16)\n"
    "  --pool N (0-1024, 0 = one per worker; env COLI_POOL_SESSIONS)\n"
    "  --max-sessions N (1-100000, default 16; env COLI_MAX_SESSIONS) sessions kept per model:\n"
    "        one more closes the least recently used idle one; at least the pooled\n"
    "        sessions + 1\n"
    "  --spare-idle-s N (0-604800, default 60; env COLI_SPARE_IDLE_S) an idle spare plugin\n"
    "        session (an ended choice's, a closed one's) is freed after N seconds\n"
    "  --max-batch N (1-1024, default 8; 1 = no batching)\n"
    "  --decode-delay-ms N / --prefill-delay-ms N (0-60000; env COLI_DECODE_DELAY_MS,\n"
    "        COLI_PREFILL_DELAY_MS)\n"
    "  COLI_LOG_LEVEL (debug, info, warning, error), COLI_HUGEPAGES (0, 1), COLI_ISA\n"
    "  (scalar, avx2, avxvnni, avx512) and COLI_ROW_STREAMS (1, 2, 4) are checked at start.\n"
    "  GOMP_SPINCOUNT: 1000 unless GOMP_SPINCOUNT or OMP_WAIT_POLICY is set (libgomp's\n"
    "        300000 stalls every parallel region when all cores are busy).\n"
    "  Models named with --model load with the model switches of the environment, which\n"
    "  each plugin declares (--switches lists them), checked before loading.\n"
    "  Flags take --flag VALUE or --flag=VALUE; usage errors exit 2.\n";

constexpr int64_t kMaxDelayMs = 60000;
constexpr int64_t kMaxSpareIdleS = 7 * 24 * 3600;  // a week
constexpr int64_t kMaxThreads = 1024;

std::string DefaultListen() {
  if (const char* run = std::getenv("XDG_RUNTIME_DIR"); run && *run) {
    return std::string("unix:") + run + "/coli-host.sock";
  }
  return "unix:/tmp/coli-host-" + std::to_string(getuid()) + ".sock";
}

struct Flags {
  coli::host::EngineOptions engine;
  coli::host::ServerOptions server;
  std::vector<std::string> models;
  int ready_fd = -1;
  bool help = false;
  bool list_switches = false;
};

// An integer environment variable in [lo, hi] into *out (unset or empty: unchanged). Read after
// the flags, and only where no flag set the value: a stale variable a flag overrides is no error.
absl::Status FromEnv(const char* name, int64_t lo, int64_t hi, bool flag_given, int* out) {
  const char* v = std::getenv(name);
  if (flag_given || v == nullptr || *v == '\0') return absl::OkStatus();
  COLI_ASSIGN_OR_RETURN(int64_t n, coli::flags::ParseWholeNumber(name, v, lo, hi));
  *out = static_cast<int>(n);
  return absl::OkStatus();
}

// The process-wide switches the libraries read by themselves (common/log, common/kernels,
// common/memory), checked here so that a misspelt value stops the host instead of being
// ignored (COLI_LOG_LEVEL, COLI_HUGEPAGES) or only warned about (COLI_ISA, COLI_ROW_STREAMS) in a
// log line.
absl::Status CheckWordSwitches() {
  struct Switch {
    const char* name;
    std::vector<std::string> values;
  };
  const Switch switches[] = {{"COLI_LOG_LEVEL", {"debug", "info", "warning", "warn", "error"}},
                             {"COLI_HUGEPAGES", {"0", "1"}},
                             {"COLI_ISA", {"scalar", "avx2", "avxvnni", "avx512"}},
                             {"COLI_ROW_STREAMS", {"1", "2", "4"}}};
  for (const Switch& sw : switches) {
    const char* v = std::getenv(sw.name);
    if (v == nullptr || *v == '\0') continue;
    bool known = false;
    for (const std::string& value : sw.values) known = known || value == v;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("environment variable ", sw.name, "='", v,
                                                     "': expected ",
                                                     absl::StrJoin(sw.values, ", ")));
    }
  }
  return absl::OkStatus();
}

// The command line, then the environment where no flag gave the value (flags win).
// INVALID_ARGUMENT / NOT_FOUND / FAILED_PRECONDITION naming the flag and the value.
absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  f.engine.plugin_dir = COLI_PLUGIN_DIR;
  if (const char* dir = std::getenv("COLI_PLUGIN_DIR"); dir && *dir) f.engine.plugin_dir = dir;
  bool decode_delay_flag = false, prefill_delay_flag = false, pool_flag = false;
  bool max_sessions_flag = false, spare_idle_flag = false;
  int spare_idle_s = f.engine.spare_idle_ms / 1000;
  coli::flags::ArgReader args(argc, argv);
  auto number = [&args](int64_t lo, int64_t hi, int* out) -> absl::Status {
    COLI_ASSIGN_OR_RETURN(int64_t n, args.Int(lo, hi));
    *out = static_cast<int>(n);
    return absl::OkStatus();
  };
  while (args.Next()) {
    if (args.Is("--plugin-dir")) {
      COLI_ASSIGN_OR_RETURN(f.engine.plugin_dir, args.Value());
      COLI_RETURN_IF_ERROR(coli::flags::CheckModelDir("--plugin-dir", f.engine.plugin_dir));
    } else if (args.Is("--listen")) {
      COLI_ASSIGN_OR_RETURN(f.server.listen, args.Value());
      COLI_RETURN_IF_ERROR(
          coli::flags::CheckGrpcAddress("--listen", f.server.listen, /*listening=*/true));
    } else if (args.Is("--allow-remote")) {
      COLI_RETURN_IF_ERROR(args.NoValue());
      f.server.allow_remote = true;
    } else if (args.Is("--workers")) {
      COLI_RETURN_IF_ERROR(number(1, kMaxThreads, &f.engine.workers));
    } else if (args.Is("--queue")) {
      COLI_RETURN_IF_ERROR(number(1, 1000000, &f.engine.queue_capacity));
    } else if (args.Is("--decode-delay-ms")) {
      COLI_RETURN_IF_ERROR(number(0, kMaxDelayMs, &f.engine.decode_delay_ms));
      decode_delay_flag = true;
    } else if (args.Is("--prefill-delay-ms")) {
      COLI_RETURN_IF_ERROR(number(0, kMaxDelayMs, &f.engine.prefill_delay_ms));
      prefill_delay_flag = true;
    } else if (args.Is("--max-batch")) {
      COLI_RETURN_IF_ERROR(number(1, kMaxThreads, &f.engine.max_batch));
    } else if (args.Is("--pool")) {
      COLI_RETURN_IF_ERROR(number(0, kMaxThreads, &f.engine.pool_sessions));
      pool_flag = true;
    } else if (args.Is("--max-sessions")) {
      COLI_RETURN_IF_ERROR(number(1, 100000, &f.engine.max_sessions));
      max_sessions_flag = true;
    } else if (args.Is("--spare-idle-s")) {
      COLI_RETURN_IF_ERROR(number(0, kMaxSpareIdleS, &spare_idle_s));
      spare_idle_flag = true;
    } else if (args.Is("--model")) {
      COLI_ASSIGN_OR_RETURN(std::string dir, args.Value());
      COLI_RETURN_IF_ERROR(coli::flags::CheckModelDir("--model", dir));
      f.models.push_back(std::move(dir));
    } else if (args.Is("--ready-fd")) {
      COLI_RETURN_IF_ERROR(number(0, std::numeric_limits<int>::max(), &f.ready_fd));
      if (fcntl(f.ready_fd, F_GETFD) < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--ready-fd ", f.ready_fd, " is not an open file descriptor: ", std::strerror(errno)));
      }
    } else if (args.Is("--switches")) {
      COLI_RETURN_IF_ERROR(args.NoValue());
      f.list_switches = true;
    } else if (args.Is("--help") || args.Is("-h")) {
      COLI_RETURN_IF_ERROR(args.NoValue());
      f.help = true;
    } else if (args.IsFlag()) {
      return args.Unknown();
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", args.arg(),
                                                     "' (models are given with --model DIR)"));
    }
  }
  // Private hosts inherit the client's environment: COLI_DECODE_DELAY_MS paces them too.
  COLI_RETURN_IF_ERROR(FromEnv("COLI_DECODE_DELAY_MS", 0, kMaxDelayMs, decode_delay_flag,
                               &f.engine.decode_delay_ms));
  COLI_RETURN_IF_ERROR(
      FromEnv("COLI_POOL_SESSIONS", 0, kMaxThreads, pool_flag, &f.engine.pool_sessions));
  COLI_RETURN_IF_ERROR(
      FromEnv("COLI_MAX_SESSIONS", 1, 100000, max_sessions_flag, &f.engine.max_sessions));
  COLI_RETURN_IF_ERROR(
      FromEnv("COLI_SPARE_IDLE_S", 0, kMaxSpareIdleS, spare_idle_flag, &spare_idle_s));
  f.engine.spare_idle_ms = spare_idle_s * 1000;
  COLI_RETURN_IF_ERROR(FromEnv("COLI_PREFILL_DELAY_MS", 0, kMaxDelayMs, prefill_delay_flag,
                               &f.engine.prefill_delay_ms));
  // The pooled sessions (one per worker, or --pool) are kept whatever the bound, so an explicit
  // bound must leave room for one more; below that it was raised without a word (17 sessions
  // held under --max-sessions 8). The default (16) is raised quietly: nobody asked for it.
  const char* max_sessions_env = std::getenv("COLI_MAX_SESSIONS");
  const bool max_sessions_given =
      max_sessions_flag || (max_sessions_env != nullptr && *max_sessions_env != '\0');
  const int pool = std::max({1, f.engine.workers, f.engine.pool_sessions});
  if (max_sessions_given && f.engine.max_sessions < pool + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        max_sessions_flag ? "--max-sessions" : "COLI_MAX_SESSIONS", " ", f.engine.max_sessions,
        " is below the pooled sessions + 1 = ", pool + 1,
        " (one pooled session per worker, --workers ", f.engine.workers, ", or --pool ",
        f.engine.pool_sessions, "; each is kept): use at least ", pool + 1, " or fewer workers"));
  }
  COLI_RETURN_IF_ERROR(CheckWordSwitches());
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  // First, before a plugin brings libgomp in (it reads its environment once, on loading).
  const bool spin_default_applies = coli::host::SetOpenMpSpinDefault();
  absl::StatusOr<Flags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "coli-host: %s\n(coli-host --help lists the flags)\n",
                 std::string(flags.status().message()).c_str());
    return 2;
  }
  if (flags->help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (flags->list_switches) {
    const coli::host::PluginSet plugins = coli::host::PluginSet::LoadDir(flags->engine.plugin_dir);
    const std::vector<coli::v1::ModelSwitch> family_switches = plugins.Switches();
    std::fputs(coli::host::SwitchListing(coli::host::WithHostSwitches(family_switches)).c_str(),
               stdout);
    return 0;
  }
  coli::host::EngineOptions& engine_options = flags->engine;
  coli::host::ServerOptions& server_options = flags->server;
  const std::vector<std::string>& models = flags->models;
  const int ready_fd = flags->ready_fd;
  // (HostServer::Start removes a stale socket a crashed host left, never a live host's.)
  if (server_options.listen.empty()) server_options.listen = DefaultListen();

  // Signals are taken by sigwait below, so every thread (gRPC's included) must block them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (!spin_default_applies) {
    COLI_LOG(kWarning) << "libgomp was loaded before main(): its spin count is the environment's "
                          "(GOMP_SPINCOUNT; a busy machine may slow decoding)";
  }
  coli::host::Engine engine(engine_options);
  // The model switches the loaded plugins declare (and the host's own) apply to --model loads as
  // they do to the models `coli` loads (it reads them with the tables Health reports and sends
  // them in LoadModel; a LoadModel request carries its own options, so the environment is read
  // only here). A bad value is a usage error, refused before anything loads.
  coli::v1::ModelOptions model_options;
  if (!models.empty()) {
    const std::vector<coli::v1::ModelSwitch> family_switches = engine.plugins().Switches();
    absl::StatusOr<coli::v1::ModelOptions> from_env =
        coli::host::ModelOptionsFromEnv(coli::host::WithHostSwitches(family_switches));
    if (!from_env.ok()) {
      std::fprintf(stderr, "coli-host: %s\n", std::string(from_env.status().message()).c_str());
      return 2;
    }
    model_options = *std::move(from_env);
  }
  for (const auto& dir : models) {
    coli::v1::LoadModelRequest request;
    request.set_model_dir(dir);
    *request.mutable_options() = model_options;
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
