// `coli bench stream --model DIR [--json] [--budget-gb X] ...`: how close expert streaming gets
// to the disk, in one run on the same shard files (issue 6).
//
//   (a) ceiling: O_DIRECT reads of randomly chosen experts of the same files with the store's
//       parallelism (load threads), back to back, twice: whole-expert requests, and the
//       store's request size (each expert's aligned cover in --read-pieces pieces, the threads
//       taking pieces in order) — both measured before and after the decode; the ratio is
//       taken against the better of the two means, so splitting cannot flatter it; and once
//       more in per-layer batches (a decode's misses of one layer, then a barrier);
//   (b) cold decode: the streaming store (budget smaller than the expert set, page cache
//       dropped) serving top-k selections per MoE layer per token, each expert computed with
//       the real MXFP4 matmuls of common/kernels (gate, up, SiTU-GLU, down): expert GB/s while
//       reading, s/token, read and compute seconds per token, and the pipeline's overlap;
//       the same with the pipeline off, and with the callbacks doing nothing (the streaming
//       path's own read rate), for comparison;
//   (c) prefill: bytes read per token at chunk C=1 vs C (default 32) on the same selections,
//       the chunk loading each distinct expert once; compared with the routing's bound and
//       with the chunks' expert unions (what C must read at least);
//   (d) checksums (K3_VERIFY, on unless --no-verify): the loaders' time checking experts against
//       a container's stored CRC-32s during the decodes above (each store is new, so every
//       expert read is a first read and is checked), and zlib's CRC-32 over expert bytes in RAM
//       on 1 thread and on the load threads, both against the ceiling.
//
// The pipelined decode is traced (StreamingExpertStore::StartTrace): per MoE-layer call, when
// the first read starts, when the first expert has arrived, when its compute starts, how long
// the disk idles after the last read of the call (the tail) and between calls. `--trace FILE`
// writes the raw events (one JSON object per line).
//
// The selections are synthetic: for every token and layer, top-k distinct experts drawn
// uniformly (K3's router is trained for flat usage, spec §3.6), with random positive weights.
// The forward pass is not run: attention and dense work are absent, so s/token here is the
// expert tier's alone.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/io/io.h"
#include "common/kernels/kernels.h"
#include "common/log/log.h"
#include "common/ops/ops.h"
#include "common/safetensors/crc32.h"
#include "common/safetensors/safetensors.h"
#include "common/status/status.h"
#include "plugins/kimi_k3/expert_store.h"
#include "tools/coli/cli_args.h"
#include "tools/coli/command.h"

namespace coli::cli {
namespace {

using Clock = std::chrono::steady_clock;
using k3::ExpertStoreStats;
using k3::ExpertWeights;
using k3::StreamingExpertStore;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Args {
  std::string model;
  std::vector<std::string> dirs;
  bool json = false;
  double budget_gb = -1;  // < 0: a quarter of the expert set, at most 8
  int tokens = 8;
  int prefill_tokens = 32;
  int chunk = 32;
  int top_k = 16;
  int load_threads = 4;
  int read_pieces = 1;  // the store's default: whole experts
  std::string trace_path;
  double ceiling_gb = 2;
  bool direct = true;
  bool prefill_compute = false;
  bool prefill = true;          // --no-prefill skips (c)
  double sleep_compute_ms = 0;  // > 0: each expert "computed" by sleeping this long
  bool prefault = true;         // --no-prefault: slots allocated on first use
  bool verify = true;           // --no-verify: K3_VERIFY=0

  uint32_t seed = 1;
};

const char kUsage[] =
    "usage: coli bench stream --model DIR [--json] [--budget-gb X] [--tokens N]\n"
    "         [--prefill-tokens N] [--chunk C] [--top-k K] [--load-threads N]\n"
    "         [--ceiling-gb X] [--buffered] [--prefill-compute] [--dirs D1:D2] [--seed N]\n"
    "         [--read-pieces N (1 = whole experts, the default; 0 = one per load thread)]\n"
    "         [--trace FILE] [--no-prefill] [--no-prefault (slots on first use)]\n"
    "         [--no-verify (K3_VERIFY=0: experts not checked against stored CRC-32s)]\n"
    "         [--sleep-compute-ms X (decode experts sleep X ms instead of computing: the\n"
    "         pipeline's structure without CPU contention)]\n";

bool ParseArgs(int argc, char** argv, Args* args, std::string* error) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        *error = absl::StrCat(name, " needs a value");
        return nullptr;
      }
      return argv[++i];
    };
    const char* v = nullptr;
    if (a == "--json") {
      args->json = true;
    } else if (a == "--buffered") {
      args->direct = false;
    } else if (a == "--prefill-compute") {
      args->prefill_compute = true;
    } else if (a == "--no-prefill") {
      args->prefill = false;
    } else if (a == "--prefault") {
      args->prefault = true;
    } else if (a == "--no-prefault") {
      args->prefault = false;
    } else if (a == "--no-verify") {
      args->verify = false;
    } else if (a == "--model" || a == "--budget-gb" || a == "--tokens" || a == "--prefill-tokens" ||
               a == "--chunk" || a == "--top-k" || a == "--load-threads" || a == "--ceiling-gb" ||
               a == "--dirs" || a == "--seed" || a == "--read-pieces" || a == "--trace" ||
               a == "--sleep-compute-ms") {
      if ((v = value(a.c_str())) == nullptr) return false;
      if (a == "--model") args->model = v;
      if (a == "--dirs") args->dirs = absl::StrSplit(v, ':', absl::SkipEmpty());
      if (a == "--budget-gb") args->budget_gb = std::atof(v);
      if (a == "--ceiling-gb") args->ceiling_gb = std::atof(v);
      if (a == "--tokens") args->tokens = std::atoi(v);
      if (a == "--prefill-tokens") args->prefill_tokens = std::atoi(v);
      if (a == "--chunk") args->chunk = std::atoi(v);
      if (a == "--top-k") args->top_k = std::atoi(v);
      if (a == "--load-threads") args->load_threads = std::atoi(v);
      if (a == "--seed") args->seed = static_cast<uint32_t>(std::atoi(v));
      if (a == "--read-pieces") args->read_pieces = std::atoi(v);
      if (a == "--trace") args->trace_path = v;
      if (a == "--sleep-compute-ms") args->sleep_compute_ms = std::atof(v);
    } else {
      *error = absl::StrCat("unknown argument '", a, "'");
      return false;
    }
  }
  if (args->model.empty()) {
    *error = "--model DIR is required";
    return false;
  }
  if (args->tokens < 1 || args->prefill_tokens < 1 || args->chunk < 1 || args->top_k < 1 ||
      args->ceiling_gb <= 0) {
    *error = "--tokens, --prefill-tokens, --chunk, --top-k and --ceiling-gb must be positive";
    return false;
  }
  if (args->read_pieces < 0 || args->read_pieces > 64) {
    *error = "--read-pieces must be 0…64";
    return false;
  }
  return true;
}

// Drops the page cache (needs root); false with the reason when the machine does not allow it.
bool DropPageCache(std::string* why) {
  ::sync();
  std::FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w");
  if (f == nullptr) {
    *why = absl::StrCat("cannot open /proc/sys/vm/drop_caches: ", std::strerror(errno));
    return false;
  }
  const bool wrote = std::fputs("3\n", f) >= 0;
  const bool closed = std::fclose(f) == 0;
  if (!wrote || !closed) {
    *why = absl::StrCat("writing /proc/sys/vm/drop_caches failed: ", std::strerror(errno));
    return false;
  }
  return true;
}

// Top-k distinct experts per (token, layer), uniform, with softmax-like positive weights.
struct Selection {
  std::vector<int32_t> experts;
  std::vector<float> weights;
};
std::vector<std::vector<Selection>> MakeRouting(int tokens, int layers, int experts, int top_k,
                                                uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<Selection>> out(tokens, std::vector<Selection>(layers));
  std::vector<int32_t> ids(experts);
  for (auto& token : out) {
    for (Selection& s : token) {
      for (int e = 0; e < experts; ++e) ids[e] = e;
      float sum = 0;
      for (int k = 0; k < top_k; ++k) {
        std::uniform_int_distribution<int> pick(k, experts - 1);
        std::swap(ids[k], ids[pick(rng)]);
        s.experts.push_back(ids[k]);
        s.weights.push_back(std::uniform_real_distribution<float>(0.1f, 1.0f)(rng));
        sum += s.weights.back();
      }
      for (float& w : s.weights) w /= sum;
    }
  }
  return out;
}

// One routed expert applied to `rows` latent vectors: y = W2 · SiTU-GLU(W1 x, W3 x) (spec
// §3.6 step 5), accumulated with weight w into out. Buffers are reused across calls.
class ExpertCompute {
 public:
  ExpertCompute(int64_t latent, int64_t inter) : latent_(latent), inter_(inter) {}
  absl::Status Apply(const ExpertWeights& w, const float* x, int64_t rows,
                     std::span<const float> weight, float* out) {
    gate_.resize(rows * inter_);
    up_.resize(rows * inter_);
    y_.resize(rows * latent_);
    COLI_RETURN_IF_ERROR(kernels::Matmul(w.w1, x, rows, gate_.data()));
    COLI_RETURN_IF_ERROR(kernels::Matmul(w.w3, x, rows, up_.data()));
    ops::SituGlu(gate_.data(), up_.data(), rows * inter_, 4.0f, 25.0f, gate_.data());
    COLI_RETURN_IF_ERROR(kernels::Matmul(w.w2, gate_.data(), rows, y_.data()));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < latent_; ++c) out[r * latent_ + c] += weight[r] * y_[r * latent_ + c];
    }
    return absl::OkStatus();
  }

 private:
  int64_t latent_, inter_;
  std::vector<float> gate_, up_, y_;
};

struct PhaseResult {
  ExpertStoreStats stats;
  double wall = 0;
  int tokens = 0;
};

// Runs `tokens` tokens through `store` in chunks of `chunk` (1 = decode/C=1 prefill): per
// layer, the chunk's distinct experts in one call, each applied to the rows that chose it.
absl::StatusOr<PhaseResult> RunTokens(StreamingExpertStore* store,
                                      const std::vector<std::vector<Selection>>& routing, int chunk,
                                      bool compute_experts = true, double sleep_ms = 0) {
  const k3::ExpertStoreLayout& layout = store->layout();
  ExpertCompute compute(layout.latent, layout.inter);
  const int tokens = static_cast<int>(routing.size());
  std::mt19937 rng(7);
  std::vector<float> x(static_cast<size_t>(chunk) * layout.latent);
  for (float& v : x) v = std::normal_distribution<float>(0.f, 1.f)(rng);
  std::vector<float> out(x.size()), gathered(x.size()), acc(x.size());
  store->TakeStats();
  PhaseResult result;
  const Clock::time_point start = Clock::now();
  for (int t0 = 0; t0 < tokens; t0 += chunk) {
    const int rows = std::min(chunk, tokens - t0);
    for (size_t li = 0; li < layout.moe_layers.size(); ++li) {
      // Distinct experts of the chunk, with (row, weight) pairs.
      std::map<int32_t, std::vector<std::pair<int, float>>> users;
      for (int r = 0; r < rows; ++r) {
        const Selection& s = routing[t0 + r][li];
        for (size_t k = 0; k < s.experts.size(); ++k)
          users[s.experts[k]].push_back({r, s.weights[k]});
      }
      std::vector<int32_t> list;
      for (const auto& [e, u] : users) list.push_back(e);
      std::fill(out.begin(), out.end(), 0.f);
      COLI_RETURN_IF_ERROR(store->ForEachExpert(
          layout.moe_layers[li], list, [&](int i, const ExpertWeights& w) -> absl::Status {
            if (!compute_experts) return absl::OkStatus();
            if (sleep_ms > 0) {
              std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(sleep_ms));
              return absl::OkStatus();
            }
            const auto& u = users[list[i]];
            std::vector<float> weight;
            for (size_t j = 0; j < u.size(); ++j) {
              std::copy_n(&x[u[j].first * layout.latent], layout.latent,
                          &gathered[j * layout.latent]);
              weight.push_back(u[j].second);
            }
            std::fill_n(acc.begin(), u.size() * layout.latent, 0.f);
            COLI_RETURN_IF_ERROR(compute.Apply(w, gathered.data(), static_cast<int64_t>(u.size()),
                                               weight, acc.data()));
            for (size_t j = 0; j < u.size(); ++j) {
              for (int64_t c = 0; c < layout.latent; ++c) {
                out[u[j].first * layout.latent + c] += acc[j * layout.latent + c];
              }
            }
            return absl::OkStatus();
          }));
    }
  }
  result.wall = Since(start);
  result.stats = store->TakeStats();
  result.tokens = tokens;
  return result;
}

// (a) O_DIRECT reads of random experts with `threads` readers, back to back.
struct Ceiling {
  double gbs = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  bool direct = true;
};
// `pieces` > 1: each expert's 4 KiB-aligned cover is read in that many aligned pieces (the
// store's split), the threads taking pieces in order.
absl::StatusOr<Ceiling> MeasureCeiling(StreamingExpertStore* store, double gb, int threads,
                                       uint32_t seed, int batch = 0, int pieces = 1) {
  const k3::ExpertStoreLayout& layout = store->layout();
  std::mt19937 rng(seed ^ 0x5eed);
  const int n = std::max<int>(
      threads, static_cast<int>(std::ceil(gb * 1e9 / static_cast<double>(layout.ExpertBytes()))));
  std::map<std::string, std::unique_ptr<io::DirectReader>> readers;
  struct Req {
    const io::DirectReader* reader;
    uint64_t offset, nbytes;
  };
  std::vector<Req> reqs;
  std::vector<size_t> group_ends;  // batch > 0: groups read one after the other
  Ceiling c;
  auto add = [&](int layer, int expert) -> absl::Status {
    COLI_ASSIGN_OR_RETURN(StreamingExpertStore::Extent e, store->ExpertExtent(layer, expert));
    auto& reader = readers[e.path];
    if (reader == nullptr) {
      COLI_ASSIGN_OR_RETURN(reader, io::DirectReader::Open(e.path, true));
      if (!reader->is_direct()) c.direct = false;
    }
    if (pieces <= 1) {
      reqs.push_back({reader.get(), e.offset, e.nbytes});
      return absl::OkStatus();
    }
    // The store's split (StreamingExpertStore PlanReads): aligned cover, equal aligned pieces;
    // the first and last piece trimmed to the expert (ReadInto reads their aligned cover).
    constexpr uint64_t kA = io::kDirectAlignment;
    const uint64_t cover_start = e.offset / kA * kA;
    const uint64_t cover_end = (e.offset + e.nbytes + kA - 1) / kA * kA;
    const uint64_t blocks = (cover_end - cover_start) / kA;
    const uint64_t want = std::min<uint64_t>(static_cast<uint64_t>(pieces), blocks);
    const uint64_t piece_bytes = (blocks + want - 1) / want * kA;
    for (uint64_t a = cover_start; a < cover_end; a += piece_bytes) {
      const uint64_t lo = std::max(a, e.offset);
      const uint64_t hi = std::min(a + piece_bytes, e.offset + e.nbytes);
      reqs.push_back({reader.get(), lo, hi - lo});
    }
    return absl::OkStatus();
  };
  if (batch <= 0) {
    for (int i = 0; i < n; ++i) {
      COLI_RETURN_IF_ERROR(add(layout.moe_layers[rng() % layout.moe_layers.size()],
                               static_cast<int>(rng() % layout.experts)));
    }
    group_ends.push_back(reqs.size());
  } else {
    // Like a decode step: `batch` distinct experts of one layer, in file-offset order, then a
    // barrier (the next layer's routing is not known before this layer is done).
    batch = std::min(batch, layout.experts);
    for (int added = 0; added < n; added += batch) {
      const int layer = layout.moe_layers[rng() % layout.moe_layers.size()];
      std::set<int> picked;
      while (static_cast<int>(picked.size()) < batch) picked.insert(rng() % layout.experts);
      const size_t begin = reqs.size();
      for (int e : picked) COLI_RETURN_IF_ERROR(add(layer, e));
      std::stable_sort(reqs.begin() + begin, reqs.end(),
                       [](const Req& a, const Req& b) { return a.offset < b.offset; });
      group_ends.push_back(reqs.size());
    }
  }
  std::vector<absl::Status> status(threads);
  const Clock::time_point start = Clock::now();
  size_t group_begin = 0;
  for (size_t group_end : group_ends) {
    std::atomic<size_t> next{group_begin};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        thread_local io::AlignedBuffer buffer;
        buffer.Reserve(layout.ExpertBytes() + 2 * io::kDirectAlignment);
        for (size_t i; (i = next.fetch_add(1)) < group_end;) {
          absl::StatusOr<const uint8_t*> p =
              reqs[i].reader->ReadInto(reqs[i].offset, reqs[i].nbytes, &buffer);
          if (!p.ok()) {
            status[t] = p.status();
            return;
          }
        }
      });
    }
    for (std::thread& t : pool) t.join();
    group_begin = group_end;
  }
  c.seconds = Since(start);
  for (const absl::Status& s : status) COLI_RETURN_IF_ERROR(s);
  for (const Req& r : reqs) c.bytes += r.nbytes;
  c.gbs = static_cast<double>(c.bytes) / c.seconds / 1e9;
  return c;
}

// Where the disk idles during a traced decode: every second of the phase is either a second
// with a read in flight or one of the idle kinds below (their sum is the phase's wall time).
struct TraceSummary {
  int calls = 0;
  double misses_per_call = 0;
  double wall = 0;           // first call's start → last call's end
  double disk_busy = 0;      // at least one read in flight
  double idle_head = 0;      // call start → its first read (includes waiting for a slot)
  double idle_inside = 0;    // holes between the first read start and the last read end
  double idle_tail = 0;      // last read end → call end (compute of the last arrivals)
  double idle_between = 0;   // one call's end → the next call's start (caller's own work)
  double idle_no_reads = 0;  // calls served entirely from RAM
  double first_arrival = 0;  // mean: call start → first missed expert fully read
  double first_compute = 0;  // mean: call start → compute of the first missed expert starts
  double expert_read = 0;    // mean disk-busy time per missed expert in a call
  double in_order = 0;       // fraction of a call's misses that arrive in disk order
  double last_gap = 0;       // mean: arrival of the second-to-last → last expert of a call
  // Σ over calls of max(disk busy, compute busy) of that call: what a perfect pipeline needs
  // when the load changes during the run (the totals' max(read, compute) is then too low: one
  // call may wait for the disk and the next for the CPU).
  double per_call_bound = 0;
  double compute_busy = 0;
};

TraceSummary SummarizeTrace(const std::vector<k3::ExpertTraceEvent>& events) {
  using Kind = k3::ExpertTraceEvent::Kind;
  TraceSummary t;
  std::vector<const k3::ExpertTraceEvent*> calls;
  for (const auto& e : events) {
    if (e.kind == Kind::kCall) calls.push_back(&e);
  }
  std::sort(calls.begin(), calls.end(), [](auto* a, auto* b) { return a->start < b->start; });
  if (calls.empty()) return t;
  t.calls = static_cast<int>(calls.size());
  t.wall = calls.back()->end - calls.front()->start;
  int with_reads = 0;
  double misses = 0, pairs = 0, ordered = 0;
  for (size_t c = 0; c < calls.size(); ++c) {
    const auto& call = *calls[c];
    if (c + 1 < calls.size()) t.idle_between += calls[c + 1]->start - call.end;
    // Calls are serialised, so the call's reads and computes are the events inside its span.
    std::vector<std::pair<double, double>> reads;
    std::map<int32_t, double> arrival;  // expert -> last piece's end
    std::map<int32_t, double> first_read;
    double miss_compute = 1e30, compute_busy = 0;
    for (const auto& e : events) {
      if (e.layer != call.layer || e.start < call.start || e.end > call.end) continue;
      if (e.kind == Kind::kRead) {
        reads.push_back({e.start, e.end});
        arrival[e.expert] = std::max(arrival[e.expert], e.end);
        auto [it, fresh] = first_read.emplace(e.expert, e.start);
        if (!fresh) it->second = std::min(it->second, e.start);
      } else if (e.kind == Kind::kCompute || e.kind == Kind::kMeanwhile) {
        compute_busy += e.end - e.start;
        if (e.kind == Kind::kCompute && !e.hit) miss_compute = std::min(miss_compute, e.start);
      }
    }
    t.compute_busy += compute_busy;
    if (reads.empty()) {
      t.idle_no_reads += call.end - call.start;
      t.per_call_bound += compute_busy;
      continue;
    }
    ++with_reads;
    misses += static_cast<double>(arrival.size());
    std::sort(reads.begin(), reads.end());
    double busy = 0, cur_lo = reads[0].first, cur_hi = reads[0].second, holes = 0;
    for (size_t i = 1; i < reads.size(); ++i) {
      if (reads[i].first > cur_hi) {
        busy += cur_hi - cur_lo;
        holes += reads[i].first - cur_hi;
        cur_lo = reads[i].first;
      }
      cur_hi = std::max(cur_hi, reads[i].second);
    }
    busy += cur_hi - cur_lo;
    t.disk_busy += busy;
    t.per_call_bound += std::max(busy, compute_busy);
    t.idle_head += reads[0].first - call.start;
    t.idle_inside += holes;
    t.idle_tail += call.end - cur_hi;
    t.expert_read += busy / static_cast<double>(arrival.size());
    std::vector<double> arrivals;  // in disk (expert) order: experts were queued in that order
    std::vector<std::pair<double, int32_t>> by_start;
    for (const auto& [e, start] : first_read) by_start.push_back({start, e});
    std::sort(by_start.begin(), by_start.end());
    for (const auto& [start, e] : by_start) arrivals.push_back(arrival[e]);
    for (size_t i = 1; i < arrivals.size(); ++i) {
      pairs += 1;
      ordered += arrivals[i] >= arrivals[i - 1] ? 1 : 0;
    }
    std::vector<double> sorted = arrivals;
    std::sort(sorted.begin(), sorted.end());
    t.first_arrival += sorted.front() - call.start;
    if (sorted.size() >= 2) t.last_gap += sorted.back() - sorted[sorted.size() - 2];
    if (miss_compute < 1e30) t.first_compute += miss_compute - call.start;
  }
  if (with_reads > 0) {
    t.misses_per_call = misses / with_reads;
    t.first_arrival /= with_reads;
    t.first_compute /= with_reads;
    t.expert_read /= with_reads;
    t.last_gap /= with_reads;
  }
  t.in_order = pairs > 0 ? ordered / pairs : 1;
  return t;
}

absl::Status WriteTrace(const std::string& path, const std::vector<k3::ExpertTraceEvent>& events) {
  std::ofstream out(path);
  if (!out) return absl::NotFoundError(absl::StrCat("--trace '", path, "': cannot create"));
  static const char* kKinds[] = {"call", "read", "compute", "meanwhile"};
  for (const auto& e : events) {
    out << absl::StrFormat(
        "{\"kind\": \"%s\", \"layer\": %d, \"expert\": %d, \"piece\": %d, \"thread\": %d, "
        "\"hit\": %s, \"start\": %.6f, \"end\": %.6f}\n",
        kKinds[static_cast<int>(e.kind)], e.layer, e.expert, e.piece, e.thread,
        e.hit ? "true" : "false", e.start, e.end);
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("--trace '", path, "': write failed"));
  return absl::OkStatus();
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "coli bench stream: %s\n", std::string(s.message()).c_str());
  return 1;
}

// zlib's CRC-32 (what the store checks experts with) over expert-sized buffers already in RAM.
struct CrcRate {
  double one_thread_gbs = 0, all_threads_gbs = 0;
};
CrcRate MeasureCrc(uint64_t expert_bytes, int threads) {
  constexpr int kRounds = 4;
  std::vector<std::vector<char>> experts(static_cast<size_t>(threads));
  for (auto& e : experts) {
    e.resize(static_cast<size_t>(expert_bytes));
    for (size_t i = 0; i < e.size(); ++i) e[i] = static_cast<char>(i * 131 + 7);
  }
  std::atomic<uint32_t> sink{0};
  auto run = [&](int n) {
    const Clock::time_point t0 = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < n; ++t) {
      pool.emplace_back([&, t] {
        uint32_t crc = 0;
        for (int r = 0; r < kRounds; ++r)
          crc = st::Crc32(crc, std::string_view(experts[t].data(), experts[t].size()));
        sink += crc;
      });
    }
    for (std::thread& t : pool) t.join();
    return static_cast<double>(expert_bytes) * kRounds * n / Since(t0) / 1e9;
  };
  CrcRate rate;
  rate.one_thread_gbs = run(1);
  rate.all_threads_gbs = run(threads);
  return rate;
}

int RunBenchStream(int argc, char** argv) {
  Args args;
  std::string error;
  if (WantsHelp(argc, argv)) {
    std::printf("%s", kUsage);
    return 0;
  }
  if (!ParseArgs(argc, argv, &args, &error)) {
    std::fprintf(stderr, "coli bench stream: %s\n%s", error.c_str(), kUsage);
    return 2;
  }
  absl::StatusOr<std::unique_ptr<st::Snapshot>> snapshot =
      st::Snapshot::Open(args.model, st::SnapshotOptions{args.dirs, args.verify});
  if (!snapshot.ok()) return Fail(snapshot.status());
  absl::StatusOr<k3::ExpertStoreLayout> layout = k3::DiscoverExpertLayout(snapshot->get());
  if (!layout.ok()) return Fail(layout.status());
  const int layers = static_cast<int>(layout->moe_layers.size());
  const double set_gb = static_cast<double>(layout->ExpertBytes()) * layers * layout->experts / 1e9;
  if (args.budget_gb < 0) args.budget_gb = std::min(8.0, set_gb / 4);
  if (args.top_k > layout->experts) args.top_k = layout->experts;

  k3::ExpertStoreOptions options;
  options.expert_gb = args.budget_gb;
  options.direct = args.direct;
  options.load_threads = args.load_threads;
  options.read_pieces = args.read_pieces;
  options.prefault = args.prefault;
  options.verify_checksums = args.verify;
  options.record_usage = false;
  options.pin = false;
  auto open = [&](bool pipe) {
    k3::ExpertStoreOptions o = options;
    o.pipe = pipe;
    return StreamingExpertStore::Open(snapshot->get(), *layout, o);
  };
  absl::StatusOr<std::unique_ptr<StreamingExpertStore>> store = open(true);
  if (!store.ok()) return Fail(store.status());
  const k3::ExpertMemoryPlan plan = (*store)->plan();
  COLI_LOG(kInfo) << "bench stream: " << layers << " MoE layers x " << layout->experts
                  << " experts (" << absl::StrFormat("%.2f", set_gb) << " GB), budget "
                  << args.budget_gb << " GB = " << plan.slots_per_layer << " slots/layer, top-"
                  << args.top_k << ", " << args.load_threads << " load threads";

  std::string drop_note;
  bool dropped = DropPageCache(&drop_note);
  // The ceiling is measured right before and right after the decode (the disk may be shared),
  // with whole-expert requests and with the store's pieces; the ratio uses the better mean.
  const int pieces = args.read_pieces > 0 ? args.read_pieces : args.load_threads;
  // Each measurement reads different random experts; the order alternates (whole first before
  // the decode, pieces first after it) so neither request size always gets the first slot.
  auto measure_ceilings = [&](uint32_t seed, bool split_first, Ceiling* whole,
                              Ceiling* split) -> absl::Status {
    for (int k = 0; k < 2; ++k) {
      if ((k == 0) != split_first) {
        COLI_ASSIGN_OR_RETURN(
            *whole, MeasureCeiling(store->get(), args.ceiling_gb, args.load_threads, seed + k));
      } else {
        COLI_ASSIGN_OR_RETURN(*split, MeasureCeiling(store->get(), args.ceiling_gb,
                                                     args.load_threads, seed + k, 0, pieces));
      }
    }
    COLI_LOG(kInfo) << absl::StrFormat(
        "(a) ceiling: whole experts %.3f GB/s, in %d pieces %.3f GB/s (%s)", whole->gbs, pieces,
        split->gbs, whole->direct ? "O_DIRECT" : "buffered: O_DIRECT refused");
    return absl::OkStatus();
  };
  Ceiling whole_before, split_before, whole_after, split_after;
  if (absl::Status s = measure_ceilings(args.seed, false, &whole_before, &split_before); !s.ok()) {
    return Fail(s);
  }

  // (b) cold decode, pipelined (traced), then the same selections with the pipeline off.
  const auto decode_routing =
      MakeRouting(args.tokens, layers, layout->experts, args.top_k, args.seed);
  dropped = DropPageCache(&drop_note) && dropped;
  (*store)->StartTrace();
  absl::StatusOr<PhaseResult> decode =
      RunTokens(store->get(), decode_routing, 1, true, args.sleep_compute_ms);
  if (!decode.ok()) return Fail(decode.status());
  const std::vector<k3::ExpertTraceEvent> trace = (*store)->TakeTrace();
  (*store)->StopTrace();
  const TraceSummary ts = SummarizeTrace(trace);
  if (!args.trace_path.empty()) {
    if (absl::Status s = WriteTrace(args.trace_path, trace); !s.ok()) return Fail(s);
  }
  if (absl::Status s = measure_ceilings(args.seed + 20, true, &whole_after, &split_after);
      !s.ok()) {
    return Fail(s);
  }
  const double whole_gbs = (whole_before.gbs + whole_after.gbs) / 2;
  const double split_gbs = (split_before.gbs + split_after.gbs) / 2;
  Ceiling ceiling_mean;
  ceiling_mean.gbs = std::max(whole_gbs, split_gbs);
  ceiling_mean.direct = whole_before.direct && whole_after.direct;
  const Ceiling* ceiling = &ceiling_mean;
  const double ceiling_before_gbs = std::max(whole_before.gbs, split_before.gbs);
  const double ceiling_after_gbs = std::max(whole_after.gbs, split_after.gbs);
  COLI_LOG(kInfo) << absl::StrFormat(
      "(a) ceiling means: whole %.3f GB/s, %d pieces %.3f GB/s; ratios use %.3f GB/s", whole_gbs,
      pieces, split_gbs, ceiling->gbs);
  COLI_LOG(kInfo) << absl::StrFormat(
      "(b) trace: %d calls, %.1f misses/call; wall %.3f s = disk busy %.3f + idle: head %.3f, "
      "inside %.3f, tail %.3f, between calls %.3f, no-read calls %.3f; per call: first expert "
      "arrives %.1f ms (%.2f expert reads), its compute starts %.1f ms, last two arrivals %.1f "
      "ms apart; %.0f%% arrive in disk order; wall / sum of per-call max(disk busy, compute) = "
      "%.3f",
      ts.calls, ts.misses_per_call, ts.wall, ts.disk_busy, ts.idle_head, ts.idle_inside,
      ts.idle_tail, ts.idle_between, ts.idle_no_reads, 1e3 * ts.first_arrival,
      ts.expert_read > 0 ? ts.first_arrival / ts.expert_read : 0, 1e3 * ts.first_compute,
      1e3 * ts.last_gap, 100 * ts.in_order,
      ts.per_call_bound > 0 ? ts.wall / ts.per_call_bound : 0);
  store->reset();
  absl::StatusOr<std::unique_ptr<StreamingExpertStore>> nopipe_store = open(false);
  if (!nopipe_store.ok()) return Fail(nopipe_store.status());
  dropped = DropPageCache(&drop_note) && dropped;
  absl::StatusOr<PhaseResult> nopipe =
      RunTokens(nopipe_store->get(), decode_routing, 1, true, args.sleep_compute_ms);
  if (!nopipe.ok()) return Fail(nopipe.status());
  nopipe_store->reset();
  // The same decode with the callbacks doing nothing: the streaming path's own read rate,
  // without the expert compute competing for the CPU.
  absl::StatusOr<std::unique_ptr<StreamingExpertStore>> readonly_store = open(true);
  if (!readonly_store.ok()) return Fail(readonly_store.status());
  dropped = DropPageCache(&drop_note) && dropped;
  absl::StatusOr<PhaseResult> readonly =
      RunTokens(readonly_store->get(), decode_routing, 1, /*compute_experts=*/false);
  if (!readonly.ok()) return Fail(readonly.status());
  const double readonly_gbs = readonly->stats.read_gbs();
  // The ceiling again, in per-layer batches of the decode's mean misses per layer with a
  // barrier between them: prices the end-of-layer tail that a decode cannot avoid.
  const int batch = static_cast<int>(std::lround(static_cast<double>(decode->stats.misses) /
                                                 std::max<uint64_t>(1, decode->stats.calls)));
  dropped = DropPageCache(&drop_note) && dropped;
  absl::StatusOr<Ceiling> batched = MeasureCeiling(readonly_store->get(), args.ceiling_gb,
                                                   args.load_threads, args.seed + 3, batch, pieces);
  if (!batched.ok()) return Fail(batched.status());
  COLI_LOG(kInfo) << absl::StrFormat(
      "(a) ceiling in per-layer batches of %d: %.3f GB/s; read-only decode = %.1f%% of it", batch,
      batched->gbs, 100 * readonly_gbs / batched->gbs);
  readonly_store->reset();

  // (d) CRC-32 over expert bytes already in RAM, 1 thread and the load threads.
  const CrcRate crc = MeasureCrc(layout->ExpertBytes(), args.load_threads);
  const ExpertStoreStats& v = readonly->stats;
  const double verify_gbs_per_loader =
      v.verify_seconds > 0 ? static_cast<double>(v.bytes_verified) / v.verify_seconds / 1e9 : 0;
  // The loaders' share of busy time spent checking: verify time / (verify + read time), the
  // read time summed over the loaders as the wall time with reads in flight times the loaders.
  const double verify_share =
      v.verify_seconds / std::max(1e-9, v.verify_seconds + v.read_seconds * args.load_threads);
  COLI_LOG(kInfo) << absl::StrFormat(
      "(d) checksums: %.3f GB checked in the read-only decode at %.3f GB/s per loader (%.1f%% of "
      "the loaders' busy time); CRC-32 in RAM %.3f GB/s on 1 thread, %.3f GB/s on %d = %.2fx "
      "the ceiling",
      v.bytes_verified / 1e9, verify_gbs_per_loader, 100 * verify_share, crc.one_thread_gbs,
      crc.all_threads_gbs, args.load_threads, crc.all_threads_gbs / ceiling->gbs);

  const ExpertStoreStats& d = decode->stats;
  const double T = decode->tokens;
  const double s_per_token = decode->wall / T;
  const double read_s = d.read_seconds / T, compute_s = d.compute_seconds / T;
  const double decode_gbs = d.read_gbs();
  const double overlap_ratio = s_per_token / std::max(read_s, compute_s);
  COLI_LOG(kInfo) << absl::StrFormat(
      "(b) decode: %.3f s/token (read %.3f, compute %.3f, overlap ratio %.3f); %.3f GB/s "
      "while reading = %.1f%% of the ceiling; hit rate %.1f%%; pipeline off: %.3f s/token",
      s_per_token, read_s, compute_s, overlap_ratio, decode_gbs, 100 * decode_gbs / ceiling->gbs,
      100 * d.hit_rate(), nopipe->wall / T);
  COLI_LOG(kInfo) << absl::StrFormat(
      "(b) decode without compute: %.3f GB/s while reading = %.1f%% of the ceiling, %.3f "
      "s/token",
      readonly_gbs, 100 * readonly_gbs / ceiling->gbs, readonly->wall / T);

  // (c) prefill bytes per token at C=1 and C=chunk on the same selections, each from a cold
  // store.
  const auto prefill_routing =
      MakeRouting(args.prefill_tokens, layers, layout->experts, args.top_k, args.seed + 1);
  double bytes_per_token[2] = {0, 0}, prefill_s[2] = {0, 0}, prefill_hits[2] = {0, 0};
  const int chunks[2] = {1, args.chunk};
  for (int c = 0; c < 2 && args.prefill; ++c) {
    absl::StatusOr<std::unique_ptr<StreamingExpertStore>> s = open(true);
    if (!s.ok()) return Fail(s.status());
    dropped = DropPageCache(&drop_note) && dropped;
    absl::StatusOr<PhaseResult> r =
        RunTokens(s->get(), prefill_routing, chunks[c], args.prefill_compute);
    if (!r.ok()) return Fail(r.status());
    bytes_per_token[c] = static_cast<double>(r->stats.bytes_read) / r->tokens;
    prefill_s[c] = r->wall / r->tokens;
    prefill_hits[c] = r->stats.hit_rate();
  }
  // What the routing allows: selections per distinct expert of a chunk.
  uint64_t selections = 0, distinct = 0;
  for (int t0 = 0; t0 < args.prefill_tokens; t0 += args.chunk) {
    for (int li = 0; li < layers; ++li) {
      std::set<int32_t> u;
      for (int t = t0; t < std::min(args.prefill_tokens, t0 + args.chunk); ++t) {
        u.insert(prefill_routing[t][li].experts.begin(), prefill_routing[t][li].experts.end());
        selections += prefill_routing[t][li].experts.size();
      }
      distinct += u.size();
    }
  }
  const double dedup = static_cast<double>(selections) / static_cast<double>(distinct);
  // The least a chunked prefill can read: every chunk's union once. C=1's LRU hits (experts
  // chosen again by a recent token) make C=1 read less than one expert per selection, which is
  // the whole difference between the measured ratio and `dedup` when C reads its union once.
  const double union_bytes_per_token = static_cast<double>(distinct) *
                                       static_cast<double>(layout->ExpertBytes()) /
                                       args.prefill_tokens;
  const double c_vs_union = bytes_per_token[1] / union_bytes_per_token;
  const double prefill_ratio =
      bytes_per_token[1] > 0 ? bytes_per_token[0] / bytes_per_token[1] : 0;  // 0: --no-prefill
  if (args.prefill) {
    COLI_LOG(kInfo) << absl::StrFormat(
        "(c) prefill: %.1f MB/token at C=1 (hit rate %.1f%%), %.1f MB/token at C=%d (%.2fx fewer; "
        "the routing allows %.2fx without C=1 hits, %.2fx with them); C=%d reads %.3fx its "
        "chunks' expert unions; %.3f vs %.3f s/token",
        bytes_per_token[0] / 1e6, 100 * prefill_hits[0], bytes_per_token[1] / 1e6, args.chunk,
        prefill_ratio, dedup, dedup * (1 - prefill_hits[0]), args.chunk, c_vs_union, prefill_s[0],
        prefill_s[1]);
  }
  if (!dropped) {
    COLI_LOG(kWarning) << "page cache NOT dropped between phases: " << drop_note;
  }

  const std::string routing_note =
      absl::StrCat("synthetic uniform top-k routing; ",
                   args.sleep_compute_ms > 0
                       ? absl::StrFormat("decode experts SLEEP %.2f ms instead of computing",
                                         args.sleep_compute_ms)
                       : std::string("real MXFP4 expert matmuls in decode"),
                   args.prefill_compute ? " and prefill" : " (prefill: reads only)",
                   "; no attention/dense work");
  const std::string extra = absl::StrFormat(
      "\"prefault\": %s, \"read_pieces\": %d, \"ceiling_whole_gbs\": %.4f, \"ceiling_pieces_gbs\": "
      "%.4f, "
      "\"trace_calls\": %d, \"trace_misses_per_call\": %.2f, \"trace_wall_s\": %.4f, "
      "\"trace_disk_busy_s\": %.4f, \"trace_idle_head_s\": %.4f, \"trace_idle_inside_s\": %.4f, "
      "\"trace_idle_tail_s\": %.4f, \"trace_idle_between_s\": %.4f, "
      "\"trace_idle_no_reads_s\": %.4f, \"trace_first_arrival_ms\": %.2f, "
      "\"trace_first_arrival_reads\": %.3f, \"trace_first_compute_ms\": %.2f, "
      "\"trace_last_gap_ms\": %.2f, \"trace_expert_read_ms\": %.2f, \"trace_in_order\": %.3f, "
      "\"trace_compute_busy_s\": %.4f, \"trace_per_call_bound_s\": %.4f, "
      "\"trace_overlap_ratio_per_call\": %.4f, "
      "\"prefill_hit_rate_c1\": %.4f, \"prefill_union_bytes_per_token\": %.0f, "
      "\"prefill_c32_vs_union\": %.4f, \"prefill_routing_with_c1_hits\": %.4f, "
      "\"verify\": %s, \"decode_bytes_verified\": %llu, \"decode_verify_s\": %.4f, "
      "\"readonly_bytes_verified\": %llu, \"readonly_verify_s\": %.4f, "
      "\"verify_gbs_per_loader\": %.4f, \"verify_share_of_loader_time\": %.4f, "
      "\"crc_gbs_1_thread\": %.4f, \"crc_gbs_load_threads\": %.4f, "
      "\"crc_vs_ceiling\": %.4f",
      args.prefault ? "true" : "false", pieces, whole_gbs, split_gbs, ts.calls, ts.misses_per_call,
      ts.wall, ts.disk_busy, ts.idle_head, ts.idle_inside, ts.idle_tail, ts.idle_between,
      ts.idle_no_reads, 1e3 * ts.first_arrival,
      ts.expert_read > 0 ? ts.first_arrival / ts.expert_read : 0, 1e3 * ts.first_compute,
      1e3 * ts.last_gap, 1e3 * ts.expert_read, ts.in_order, ts.compute_busy, ts.per_call_bound,
      ts.per_call_bound > 0 ? ts.wall / ts.per_call_bound : 0, prefill_hits[0],
      union_bytes_per_token, c_vs_union, dedup * (1 - prefill_hits[0]),
      args.verify ? "true" : "false", static_cast<unsigned long long>(d.bytes_verified),
      d.verify_seconds, static_cast<unsigned long long>(v.bytes_verified), v.verify_seconds,
      verify_gbs_per_loader, verify_share, crc.one_thread_gbs, crc.all_threads_gbs,
      crc.all_threads_gbs / ceiling->gbs);
  if (args.json) {
    std::printf(
        "{\"ceiling_gbs\": %.4f, \"decode_read_gbs\": %.4f, \"read_ratio\": %.4f, "
        "\"s_per_token\": %.5f, \"read_s_per_token\": %.5f, \"compute_s_per_token\": %.5f, "
        "\"overlap_ratio\": %.4f, \"nopipe_s_per_token\": %.5f, \"hit_rate\": %.4f, "
        "\"ceiling_before_gbs\": %.4f, \"ceiling_after_gbs\": %.4f, "
        "\"prefill_compute\": %s, \"readonly_read_gbs\": %.4f, \"readonly_read_ratio\": %.4f, "
        "\"readonly_s_per_token\": %.5f, \"ceiling_batched_gbs\": %.4f, \"ceiling_batch\": %d, "
        "\"readonly_vs_batched_ratio\": %.4f, "
        "\"prefill_bytes_per_token_c1\": %.0f, \"prefill_bytes_per_token_c32\": %.0f, "
        "\"prefill_ratio\": %.4f, \"prefill_routing_dedup\": %.4f, \"prefill_chunk\": %d, "
        "\"prefill_s_per_token_c1\": %.5f, \"prefill_s_per_token_c32\": %.5f, "
        "\"budget_gb\": %.4f, \"slots_per_layer\": %d, \"expert_set_gb\": %.4f, "
        "\"moe_layers\": %d, \"experts\": %d, \"top_k\": %d, \"tokens\": %d, "
        "\"load_threads\": %d, \"direct\": %s, \"ceiling_direct\": %s, "
        "\"page_cache_dropped\": %s, \"routing\": \"%s\", %s}\n",
        ceiling->gbs, decode_gbs, decode_gbs / ceiling->gbs, s_per_token, read_s, compute_s,
        overlap_ratio, nopipe->wall / T, d.hit_rate(), ceiling_before_gbs, ceiling_after_gbs,
        args.prefill_compute ? "true" : "false", readonly_gbs, readonly_gbs / ceiling->gbs,
        readonly->wall / T, batched->gbs, batch, readonly_gbs / batched->gbs, bytes_per_token[0],
        bytes_per_token[1], prefill_ratio, dedup, args.chunk, prefill_s[0], prefill_s[1],
        args.budget_gb, plan.slots_per_layer, set_gb, layers, layout->experts, args.top_k,
        args.tokens, args.load_threads, args.direct ? "true" : "false",
        ceiling->direct ? "true" : "false", dropped ? "true" : "false", routing_note.c_str(),
        extra.c_str());
  } else {
    std::printf("expert streaming benchmark (%s)\n", routing_note.c_str());
    std::printf("  model            %s: %d MoE layers x %d experts of %llu B (%.2f GB)\n",
                args.model.c_str(), layers, layout->experts,
                static_cast<unsigned long long>(layout->ExpertBytes()), set_gb);
    std::printf("  budget           %.2f GB = %d slots/layer; top-%d; %d load threads; %s\n",
                args.budget_gb, plan.slots_per_layer, args.top_k, args.load_threads,
                args.direct ? "O_DIRECT" : "buffered");
    std::printf(
        "  (a) ceiling      %.3f GB/s (O_DIRECT random expert reads; %.3f before, %.3f "
        "after the decode; whole experts %.3f, in %d pieces %.3f)\n",
        ceiling->gbs, ceiling_before_gbs, ceiling_after_gbs, whole_gbs, pieces, split_gbs);
    std::printf("  (b) decode       %.3f GB/s while reading = %.1f%% of the ceiling\n", decode_gbs,
                100 * decode_gbs / ceiling->gbs);
    std::printf(
        "                   %.3f s/token: read %.3f, compute %.3f, ratio %.3f "
        "(pipeline off: %.3f s/token); hit rate %.1f%%\n",
        s_per_token, read_s, compute_s, overlap_ratio, nopipe->wall / T, 100 * d.hit_rate());
    std::printf(
        "                   disk idle %.3f of %.3f s: head %.3f, inside %.3f, tail "
        "%.3f, between calls %.3f; first expert after %.1f ms (%.2f expert reads)\n",
        ts.wall - ts.disk_busy, ts.wall, ts.idle_head, ts.idle_inside, ts.idle_tail,
        ts.idle_between, 1e3 * ts.first_arrival,
        ts.expert_read > 0 ? ts.first_arrival / ts.expert_read : 0);
    std::printf(
        "                   traced wall / sum of per-call max(disk busy, compute) = "
        "%.3f\n",
        ts.per_call_bound > 0 ? ts.wall / ts.per_call_bound : 0);
    std::printf(
        "                   without compute: %.3f GB/s while reading = %.1f%% of the "
        "ceiling, %.3f s/token\n",
        readonly_gbs, 100 * readonly_gbs / ceiling->gbs, readonly->wall / T);
    std::printf(
        "                   ceiling in per-layer batches of %d: %.3f GB/s (read-only "
        "decode = %.1f%% of it)\n",
        batch, batched->gbs, 100 * readonly_gbs / batched->gbs);
    std::printf(
        "  (d) checksums    %s: %.3f GB checked (read-only decode) at %.3f GB/s per loader, "
        "%.1f%% of the loaders' busy time; CRC-32 in RAM %.3f GB/s (1 thread), %.3f GB/s (%d) "
        "= %.2fx the ceiling\n",
        args.verify ? "on" : "off (--no-verify)", v.bytes_verified / 1e9, verify_gbs_per_loader,
        100 * verify_share, crc.one_thread_gbs, crc.all_threads_gbs, args.load_threads,
        crc.all_threads_gbs / ceiling->gbs);
    if (!args.prefill) {
      std::printf("  (c) prefill      skipped (--no-prefill)\n");
    } else {
      std::printf(
          "  (c) prefill      %.1f MB/token at C=1, %.1f MB/token at C=%d: %.2fx fewer "
          "(routing allows %.2fx; %.2fx given C=1's %.1f%% LRU hits); C=%d reads %.3fx "
          "its chunks' unions\n",
          bytes_per_token[0] / 1e6, bytes_per_token[1] / 1e6, args.chunk, prefill_ratio, dedup,
          dedup * (1 - prefill_hits[0]), 100 * prefill_hits[0], args.chunk, c_vs_union);
    }
    std::printf("  page cache       %s\n",
                dropped ? "dropped between phases" : ("NOT dropped: " + drop_note).c_str());
  }
  return 0;
}

}  // namespace

COLI_REGISTER_BENCH(stream, "stream",
                    "expert streaming vs the disk ceiling: --model DIR [--budget-gb X]",
                    RunBenchStream);

}  // namespace coli::cli
