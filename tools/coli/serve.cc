// `coli serve`: an OpenAI-compatible HTTP gateway (cpp-httplib) over the host's gRPC API.
//
//   coli serve --model DIR [--port 8000] [--host 127.0.0.1] [--api-key KEY]
//              [--connect ADDR] [--model-id ID] [--max-background N] [--responses-dir DIR]
//
// Without --connect it starts a private `coli-host` (tools/coli/client.h), loads DIR there (the
// K3_* switches apply) and stops it on exit; with --connect it uses a running host. Endpoints:
// GET /v1/models[/ID], POST /v1/chat/completions and POST /v1/completions (SSE when
// stream=true), POST /v1/responses (OpenAI's Responses API over the chat path, see
// serve_responses.h; GET/DELETE /v1/responses/ID, GET /v1/responses/ID/input_items,
// POST /v1/responses/ID/cancel, POST /v1/responses/input_tokens; `background: true` runs at most
// --max-background responses at once, cancelled and joined when the server stops; with
// `stream: true` too its events are kept and GET /v1/responses/ID?stream=true&starting_after=N
// replays and follows them; --responses-dir keeps finished stored responses on disk across
// restarts, serve_responses_disk.h),
// POST /tokenize, /detokenize, /apply-template,
// GET /health, GET /metrics (Prometheus). Errors use OpenAI's error object and name the field.
// Loopback only unless --host names another address, which then requires --api-key (bearer).
// A client that goes away mid-stream cancels its generation at the host (within one token).
// `"return_progress": true` (llama.cpp's field) adds prefill-progress chunks to a stream: an
// empty assistant delta (chat) or empty text (completions) carrying
// "prompt_progress": {"total", "cache", "processed", "time_ms"}.
#include "tools/coli/serve.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status/status.h"
#include "tools/coli/cli_args.h"
#include "tools/coli/client.h"
#include "tools/coli/command.h"
#include "tools/coli/serve_gateway.h"
#include "tools/web/web_assets.h"

namespace coli::cli::serve {
namespace {

std::atomic<httplib::Server*> g_server{nullptr};

void Usage(bool web, FILE* out) {
  std::fprintf(
      out,
      web ? "usage: coli web [--model DIR] [--port 8000] [--host 127.0.0.1] [--api-key KEY]\n"
            "                [--connect ADDR] [--model-id ID] [--allow-origin ORIGIN]\n"
            "                [--http-threads N] [--workers N] [--queue N]\n"
            "  the chat page and the OpenAI API on one port; without --model (or\n"
            "  COLI_MODEL) the embedded tiny Kimi K3 fixture (random weights)\n"
          : "usage: coli serve --model DIR [--port 8000] [--host 127.0.0.1] [--api-key KEY]\n"
            "                  [--connect ADDR] [--model-id ID] [--max-background N]\n"
            "                  [--responses-dir DIR] [--allow-origin ORIGIN] [--http-threads N]\n"
            "                  [--workers N] [--queue N]\n");
  std::fprintf(
      out,
      "  --model DIR    the model folder (env COLI_MODEL)\n"
      "  --port N       TCP port, 0-65535 (0 = any free one, printed at start)\n"
      "  --host ADDR    listen address; anything but loopback requires --api-key\n"
      "  --api-key KEY  require 'Authorization: Bearer KEY' (env COLI_API_KEY)\n"
      "  --connect ADDR use a running coli-host instead of starting one\n"
      "  --model-id ID  the id the model is served as (default: its folder's name)\n"
      "  --served-model-name NAME  another name requests may use (repeatable; the first is the\n"
      "                 id without --model-id)\n"
      "  --max-background N  background /v1/responses running at once, 0-1024 (default 16)\n"
      "  --responses-dir DIR  keep finished stored /v1/responses in DIR, one file each,\n"
      "                 so they survive a restart (env COLI_RESPONSES_DIR; default:\n"
      "                 in memory only)\n"
      "  --allow-origin ORIGIN  let browser pages from ORIGIN (e.g. http://localhost:3000;\n"
      "                 '*' = any) call the API: CORS headers; repeatable. Default: none\n"
      "                 (same-origin only, as the `coli web` page is)\n"
      "  --http-threads N  HTTP connections served at once, open streams included, 4-4096\n"
      "                 (default 256; more wait for a free thread)\n"
      "  --workers N    requests the private coli-host runs at once, batched into shared\n"
      "                 decode passes, 1-1024 (default 4)\n"
      "  --queue N      requests it holds beyond those before answering 429, 1-1000000\n"
      "                 (default 16); with --connect, give both to that coli-host instead\n"
      "  Flags take --flag VALUE or --flag=VALUE; usage errors exit 2.\n");
}

// The command line of `coli serve` / `coli web`, after the environment (flags win).
struct GatewayFlags {
  bool help = false;
  std::string model_dir, host = "127.0.0.1", api_key, connect, model_id, responses_dir;
  int port = 8000;
  size_t max_background = 16;
  size_t http_threads = 256;
  std::vector<std::string> allowed_origins;
  // --served-model-name (vLLM's flag, repeatable): more names requests may use for the model (a
  // client with a fixed model name, such as an agent written for another API); the first is the
  // id when --model-id is not given.
  std::vector<std::string> served_names;
  // The private host's (client::ConnectOptions); 0 = not given.
  int workers = 0, queue = 0;
};

// INVALID_ARGUMENT (NOT_FOUND, FAILED_PRECONDITION for a model folder that is missing, a file or
// unreadable) naming the flag and the value; a usage error either way.
absl::StatusOr<GatewayFlags> ParseGatewayFlags(int argc, char** argv, bool web) {
  GatewayFlags f;
  if (const char* k = std::getenv("COLI_API_KEY"); k && *k) f.api_key = k;
  if (const char* m = std::getenv("COLI_MODEL"); m && *m) f.model_dir = m;
  if (const char* d = std::getenv("COLI_RESPONSES_DIR"); d && *d) f.responses_dir = d;
  bool model_given = false;
  cli::ArgReader args(argc, argv);
  while (args.Next()) {
    if (args.Is("--model")) {
      COLI_ASSIGN_OR_RETURN(f.model_dir, args.Value());
      model_given = true;
    } else if (args.Is("--host")) {
      COLI_ASSIGN_OR_RETURN(f.host, args.NonEmptyValue("an address to listen on"));
    } else if (args.Is("--api-key")) {
      COLI_ASSIGN_OR_RETURN(f.api_key, args.NonEmptyValue("a key"));
    } else if (args.Is("--connect")) {
      COLI_ASSIGN_OR_RETURN(f.connect, args.Value());
      COLI_RETURN_IF_ERROR(cli::CheckGrpcAddress("--connect", f.connect, /*listening=*/false));
    } else if (args.Is("--model-id")) {
      COLI_ASSIGN_OR_RETURN(f.model_id, args.NonEmptyValue("an id"));
    } else if (args.Is("--served-model-name")) {
      COLI_ASSIGN_OR_RETURN(f.served_names.emplace_back(), args.NonEmptyValue("a name"));
    } else if (args.Is("--responses-dir")) {
      COLI_ASSIGN_OR_RETURN(f.responses_dir, args.NonEmptyValue("a folder"));
    } else if (args.Is("--allow-origin")) {
      COLI_ASSIGN_OR_RETURN(const std::string v, args.Value());
      // An origin is scheme://host[:port] and nothing after (a browser's Origin header never
      // has a path or a trailing slash, so such a value could never match).
      const size_t scheme = v.find("://");
      if (v != "*" && (scheme == std::string::npos || scheme == 0 ||
                       v.find('/', scheme + 3) != std::string::npos || v.size() == scheme + 3)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--allow-origin '", v, "' is not an origin (scheme://host[:port] or *)"));
      }
      f.allowed_origins.push_back(v);
    } else if (args.Is("--http-threads")) {
      COLI_ASSIGN_OR_RETURN(const int64_t n, args.Int(4, 4096));
      f.http_threads = static_cast<size_t>(n);
    } else if (args.Is("--port")) {
      COLI_ASSIGN_OR_RETURN(const int64_t n, args.Int(0, 65535));
      f.port = static_cast<int>(n);
    } else if (args.Is("--workers")) {
      COLI_ASSIGN_OR_RETURN(const int64_t n, args.Int(1, 1024));
      f.workers = static_cast<int>(n);
    } else if (args.Is("--queue")) {
      COLI_ASSIGN_OR_RETURN(const int64_t n, args.Int(1, 1000000));
      f.queue = static_cast<int>(n);
    } else if (args.Is("--max-background")) {
      COLI_ASSIGN_OR_RETURN(const int64_t n, args.Int(0, 1024));
      f.max_background = static_cast<size_t>(n);
    } else if (args.Is("--help") || args.Is("-h")) {
      COLI_RETURN_IF_ERROR(args.NoValue());
      f.help = true;
    } else if (args.IsFlag()) {
      return args.Unknown();
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", args.arg(),
                                                     "' (the model is given with --model DIR)"));
    }
  }
  if (f.help) return f;
  if (f.model_id.empty() && !f.served_names.empty()) {
    f.model_id = f.served_names.front();
    f.served_names.erase(f.served_names.begin());
  }
  if (!f.connect.empty() && (f.workers != 0 || f.queue != 0)) {
    // They size the host this command starts; a --connect host was sized when it started.
    return absl::InvalidArgumentError(absl::StrCat(
        f.workers != 0 ? "--workers" : "--queue",
        " sizes the private coli-host; with --connect, give it to that coli-host instead"));
  }
  if (model_given && f.model_dir.empty()) {  // `--model "$UNSET"`: never the fixture instead
    return absl::InvalidArgumentError("--model is empty: give a folder");
  }
  if (f.model_dir.empty() && f.connect.empty()) {
    if (!web) return absl::InvalidArgumentError("--model DIR is required (or COLI_MODEL)");
    f.model_dir = client::ResolveModelDir("");  // the embedded tiny model
  }
  // A private host reads the folder here; a --connect host resolves it on its own machine.
  if (!f.model_dir.empty() && f.connect.empty()) {
    const char* env = std::getenv("COLI_MODEL");
    const char* from = model_given                      ? "--model"
                       : env != nullptr && *env != '\0' ? "COLI_MODEL"
                                                        : "the embedded tiny model";
    COLI_RETURN_IF_ERROR(cli::CheckModelDir(from, f.model_dir));
  }
  return f;
}

// `coli serve` and `coli web` share everything but the page and the default model.
int RunGateway(int argc, char** argv, bool web) {
  const char* name = web ? "coli web" : "coli serve";
  absl::StatusOr<GatewayFlags> parsed = ParseGatewayFlags(argc, argv, web);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s: %s\n(%s --help lists the flags)\n", name,
                 std::string(parsed.status().message()).c_str(), name);
    return 2;
  }
  if (parsed->help) {
    Usage(web, stdout);
    return 0;
  }
  GatewayFlags& flags = *parsed;
  const std::string& model_dir = flags.model_dir;
  const std::string& host = flags.host;
  const std::string& api_key = flags.api_key;
  const std::string& connect = flags.connect;
  const std::string& model_id = flags.model_id;
  const int port = flags.port;
  std::vector<std::string>& allowed_origins = flags.allowed_origins;
  // Any web page reading the API is as wide as any host reaching it: it needs the key too.
  if (api_key.empty() &&
      std::find(allowed_origins.begin(), allowed_origins.end(), "*") != allowed_origins.end()) {
    std::fprintf(stderr,
                 "%s: --allow-origin '*' lets every web page use this server: refusing to serve "
                 "without --api-key\n",
                 name);
    return 2;
  }
  if (!IsLoopback(host) && api_key.empty()) {
    std::fprintf(stderr,
                 "%s: --host %s is not a loopback address: refusing to serve without "
                 "--api-key\n",
                 name, host.c_str());
    return 2;
  }
  std::unique_ptr<ResponseDir> stored_dir;  // before the host starts: a bad DIR fails fast
  if (!flags.responses_dir.empty()) {
    auto opened = ResponseDir::Open(flags.responses_dir);
    if (!opened.ok()) {
      std::fprintf(stderr, "%s: --responses-dir: %s\n", name,
                   std::string(opened.status().message()).c_str());
      return 1;
    }
    stored_dir = *std::move(opened);
  }
  signal(SIGPIPE, SIG_IGN);
  // SIGINT/SIGTERM stop the HTTP server (the host process is stopped by HostProcess). Blocked
  // before any thread starts (gRPC's, httplib's) so only the waiter below takes them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  client::ConnectOptions connect_options;
  connect_options.host = connect;  // empty: a private coli-host, stopped with `client`
  if (flags.workers != 0) connect_options.workers = flags.workers;
  if (flags.queue != 0) connect_options.queue = flags.queue;
  auto client = client::Client::Connect(connect_options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s: %s\n", name, std::string(client.status().message()).c_str());
    return 1;
  }
  // The switches of the environment, read with the tables the host's plugins declare (so the
  // host runs first): the model options for a --model load, and the chat-request defaults
  // (K3_THINK) with or without --connect; a bad value is a usage error, refused before anything
  // loads.
  auto environment = client::ReadEnvironment(**client);
  if (!environment.ok()) {
    std::fprintf(stderr, "%s: %s\n", name, std::string(environment.status().message()).c_str());
    return environment.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  v1::ModelInfo info;
  if (!model_dir.empty()) {
    client::ProgressDisplay bar(stderr);
    auto loaded = (*client)->LoadModel(
        model_dir, environment->options, [&bar](const v1::LoadProgress& p) { bar.Update(p); },
        model_id);
    bar.Done();
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s: %s\n", name, std::string(loaded.status().message()).c_str());
      return 1;
    }
    info = *loaded;
  } else {
    auto models = (*client)->ListModels();
    if (!models.ok() || models->empty()) {
      std::fprintf(stderr, "%s: the host at %s has no model loaded\n", name, connect.c_str());
      return 1;
    }
    info = models->front();
    for (const auto& m : *models) {
      if (m.id() == model_id) info = m;
    }
  }

  httplib::Server server;
  // httplib's default pool is max(8, cores - 1) threads, and every open stream holds one: eight
  // streams made /health and every further request wait, and a burst never reached the host's
  // queue (which answers its excess with a 429). A thread waiting on the host costs no CPU.
  server.new_task_queue = [n = flags.http_threads] { return new httplib::ThreadPool(n); };
  Gateway gateway(&(*client)->stub(), info, api_key, web, flags.max_background,
                  std::move(stored_dir), std::move(allowed_origins));
  gateway.set_request_defaults(std::move(environment->request));
  gateway.set_model_aliases(flags.served_names);
  gateway.Register(&server);
  int bound = port;
  if (port == 0) {
    bound = server.bind_to_any_port(host);
  } else if (!server.bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound < 0) {
    std::fprintf(stderr, "%s: cannot listen on %s:%d: %s\n", name, host.c_str(), port,
                 std::strerror(errno));
    return 1;
  }
  // One line on stdout that scripts and tests wait for.
  // An IPv6 address goes in brackets in a URL ("http://[::1]:8000").
  const std::string url_host =
      host.find(':') != std::string::npos && host.front() != '[' ? "[" + host + "]" : host;
  std::printf("%s: listening on http://%s:%d (model %s)\n", name, url_host.c_str(), bound,
              info.id().c_str());
  if (web) std::printf("%s: open http://%s:%d/ in a browser\n", name, url_host.c_str(), bound);
  std::fflush(stdout);

  g_server = &server;
  std::thread waiter([&signals, &gateway] {
    int sig = 0;
    sigwait(&signals, &sig);
    // Streams and background responses end first: the server's stop waits for its handlers.
    gateway.Shutdown();
    if (httplib::Server* s = g_server.load()) s->stop();
  });
  // A private host that died (killed for memory, crashed) leaves nothing to serve: the server
  // stops and exits 1, so that what supervises it (systemd, a container) can start it again.
  std::atomic<bool> serving{true};
  std::atomic<int> exit_code{0};
  std::thread host_watch([&] {
    bool said = false;
    while (serving.load()) {
      if (std::optional<std::string> ended = (*client)->PrivateHostEnded()) {
        if (!said) {
          std::fprintf(stderr, "%s: %s; stopping\n", name, ended->c_str());
          said = true;
          exit_code = 1;
          gateway.Shutdown();
        }
        // Again until the server has stopped: a stop before it began listening is lost.
        if (httplib::Server* s = g_server.load()) s->stop();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  server.listen_after_bind();
  serving = false;
  host_watch.join();
  g_server = nullptr;
  gateway.Shutdown();  // background responses: cancelled and joined while the host still runs
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  return exit_code.load();  // `client` stops the private host
}

}  // namespace

int RunServe(int argc, char** argv) { return RunGateway(argc, argv, /*web=*/false); }
int RunWeb(int argc, char** argv) { return RunGateway(argc, argv, /*web=*/true); }

}  // namespace coli::cli::serve

COLI_REGISTER_COMMAND(serve, "serve", "OpenAI-compatible HTTP API over the host (--model DIR)",
                      coli::cli::serve::RunServe);
COLI_REGISTER_COMMAND(web, "web", "chat page + OpenAI API in the browser (tiny model by default)",
                      coli::cli::serve::RunWeb);
