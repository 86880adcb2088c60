// `coli bench repack --model DIR [--json] [--in-flight 1,3] ...`: k3-repack's throughput against
// the disk it reads, in one run on the same source shards (plugins/kimi_k3/repack.h).
//
//   (a) disk: the page cache of the source shards is evicted (posix_fadvise DONTNEED per file:
//       no root needed, nothing else on the machine is touched), then every selected shard is
//       read once, sequentially, with O_DIRECT requests of the repack's piece size, one at a
//       time — the repack reader's own pattern. Measured before and after the repacks; the
//       ratio uses the better of the two (a shared disk may be slower during one of them).
//   (b) for each --in-flight value (default 1 and 3; 1 = reading, quantizing and writing never
//       overlap, the tool before the pipeline): the page cache is evicted again, the shards are
//       repacked into OUT/in-flight-N (removed first), and the wall time, the source rate and
//       its ratio to (a), and each stage's busy seconds are reported. The stages overlap when
//       their busy seconds add up to more than the wall time. With --repeat N the depths
//       alternate N times (1, 3, 1, 3, ...) and each reports its median round: on a shared
//       machine the load drifts between runs.
//       The process's CPU seconds per run say how many cores it got: on a shared box a repack
//       that is short of CPU cannot gain from overlapping its stages.
//   (c) every output shard of every run is compared byte for byte with the first run's
//       (identical: the bytes do not depend on the pipeline depth).
//
// The machine's load average is printed with the result: on a shared box the quantizer's share
// of the cores decides most of the wall time.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/io/io.h"
#include "common/safetensors/safetensors.h"
#include "common/status/status.h"
#include "plugins/kimi_k3/repack.h"
#include "tools/coli/cli_args.h"
#include "tools/coli/command.h"

namespace coli::cli {
namespace {

namespace fs = std::filesystem;

constexpr char kUsage[] =
    "usage: coli bench repack --model DIR [--out DIR] [--bits 8|4] [--threads N]\n"
    "                         [--in-flight 1,3] [--piece-mib 32] [--shards 1,2] [--buffered]\n"
    "                         [--repeat N] [--keep] [--json]\n"
    "  --model      a Kimi K3 Hugging Face snapshot (config.json + index + shards)\n"
    "  --out        where the containers are written (default: a new folder in $TMPDIR or\n"
    "               /tmp, removed at the end unless --keep)\n"
    "  --in-flight  pipeline depths to compare (default 1,3)\n"
    "  --shards     only these shard numbers (default: all)\n"
    "  --repeat     rounds over the depths, alternating; each depth reports its median\n"
    "  --buffered   the repack reads through the page cache (evicted before each run)\n";

struct Args {
  std::string model, out;
  int bits = 8, threads = 0, piece_mib = 32, repeat = 1;
  std::vector<int> in_flight = {1, 3}, shards;
  bool direct = true, keep = false, json = false;
};

bool ParseList(const char* text, std::vector<int>* out) {
  out->clear();
  for (absl::string_view s : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(s, &v) || v < 1) return false;
    out->push_back(v);
  }
  return !out->empty();
}

bool ParseArgs(int argc, char** argv, Args* a, std::string* error) {
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    auto number = [&](int* out, int lo, int hi) {
      if (v == nullptr || !absl::SimpleAtoi(v, out) || *out < lo || *out > hi) {
        *error = absl::StrCat(f, " needs a number in ", lo, "..", hi);
        return false;
      }
      ++i;
      return true;
    };
    if (f == "--json") {
      a->json = true;
    } else if (f == "--buffered") {
      a->direct = false;
    } else if (f == "--keep") {
      a->keep = true;
    } else if (f == "--model" || f == "--out") {
      if (v == nullptr) {
        *error = f + " needs a folder";
        return false;
      }
      (f == "--model" ? a->model : a->out) = v;
      ++i;
    } else if (f == "--bits") {
      if (!number(&a->bits, 4, 8)) return false;
    } else if (f == "--threads") {
      if (!number(&a->threads, 1, 1024)) return false;
    } else if (f == "--repeat") {
      if (!number(&a->repeat, 1, 100)) return false;
    } else if (f == "--piece-mib") {
      if (!number(&a->piece_mib, 1, 4096)) return false;
    } else if (f == "--in-flight" || f == "--shards") {
      if (v == nullptr || !ParseList(v, f == "--in-flight" ? &a->in_flight : &a->shards)) {
        *error = f + " needs a list of positive numbers like 1,3";
        return false;
      }
      ++i;
    } else {
      *error = "unknown argument " + f;
      return false;
    }
  }
  if (a->model.empty()) {
    *error = "--model is required";
    return false;
  }
  return true;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// User + system CPU seconds of this process so far.
double CpuSeconds() {
  struct rusage u;
  ::getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "coli bench repack: %s\n", s.ToString().c_str());
  return 1;
}

// The source shards the repack will read: the index's, narrowed to --shards, present on disk.
absl::StatusOr<std::vector<std::string>> SourceShards(const Args& a) {
  const std::string index_path = (fs::path(a.model) / st::kIndexFileName).string();
  COLI_ASSIGN_OR_RETURN(std::string text, io::ReadFileToString(index_path));
  COLI_ASSIGN_OR_RETURN(st::Index index, st::ParseIndex(text, index_path));
  std::vector<std::string> out;
  for (const std::string& name : index.shards) {
    const std::string path = (fs::path(a.model) / name).string();
    std::error_code ec;
    if (!fs::exists(path, ec)) continue;
    if (!a.shards.empty()) {
      int n = 0;  // model-00003-of-000096.safetensors -> 3
      if (name.size() < 11 || !absl::SimpleAtoi(name.substr(6, 5), &n) ||
          std::find(a.shards.begin(), a.shards.end(), n) == a.shards.end()) {
        continue;
      }
    }
    out.push_back(path);
  }
  if (out.empty())
    return absl::NotFoundError(absl::StrCat("no source shard to read in '", a.model, "'"));
  return out;
}

// Drops the clean cached pages of each file (no root needed; other files are not touched).
absl::Status Evict(const std::vector<std::string>& files) {
  for (const std::string& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::NotFoundError(absl::StrCat("file '", f, "': cannot open"));
    const int err = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    if (err != 0) {
      return absl::InternalError(
          absl::StrCat("file '", f, "': posix_fadvise: ", std::strerror(err)));
    }
  }
  return absl::OkStatus();
}

struct DiskRate {
  double gbs = 0;
  bool direct = true;
};

// (a): every file once, sequentially, in `piece`-byte O_DIRECT requests, one at a time.
absl::StatusOr<DiskRate> MeasureDisk(const std::vector<std::string>& files, uint64_t piece) {
  COLI_RETURN_IF_ERROR(Evict(files));
  io::AlignedBuffer buffer;
  uint64_t bytes = 0;
  DiskRate rate;
  const double t0 = Now();
  for (const std::string& f : files) {
    COLI_ASSIGN_OR_RETURN(std::unique_ptr<io::DirectReader> r, io::DirectReader::Open(f));
    rate.direct = rate.direct && r->is_direct();
    for (uint64_t off = 0; off < r->size(); off += piece) {
      const uint64_t n = std::min(piece, r->size() - off);
      COLI_RETURN_IF_ERROR(r->ReadInto(off, n, &buffer).status());
      bytes += n;
    }
  }
  rate.gbs = bytes / 1e9 / std::max(Now() - t0, 1e-9);
  return rate;
}

struct RunResult {
  int in_flight = 0;
  double wall = 0, gbs = 0;
  double cpu = 0;     // user + system seconds of this process during the run
  std::string walls;  // every round's wall seconds, "a, b, c" (on the median run only)
  k3::RepackSummary summary;
};

// (c): false with the first differing file when two output folders differ.
absl::StatusOr<bool> SameShards(const std::string& a, const std::string& b, std::string* which) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(a)) {
    const std::string n = e.path().filename().string();
    if (n.ends_with(".safetensors")) names.push_back(n);
  }
  std::string x, y;
  for (const std::string& n : names) {
    *which = n;
    const std::string pa = (fs::path(a) / n).string(), pb = (fs::path(b) / n).string();
    std::error_code ec;
    if (!fs::exists(pb, ec)) return false;
    COLI_ASSIGN_OR_RETURN(std::unique_ptr<io::File> fa, io::File::Open(pa));
    COLI_ASSIGN_OR_RETURN(std::unique_ptr<io::File> fb, io::File::Open(pb));
    if (fa->size() != fb->size()) return false;
    constexpr uint64_t kStep = uint64_t{16} << 20;
    for (uint64_t off = 0; off < fa->size(); off += kStep) {
      const uint64_t n = std::min(kStep, fa->size() - off);
      x.resize(n);
      y.resize(n);
      COLI_RETURN_IF_ERROR(fa->ReadAt(off, n, x.data()));
      COLI_RETURN_IF_ERROR(fb->ReadAt(off, n, y.data()));
      if (x != y) return false;
    }
  }
  which->clear();
  return true;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double one = 0, five = 0;
  if (!(in >> one >> five)) return "unknown";
  return absl::StrFormat("%.2f %.2f", one, five);
}

int RunBenchRepack(int argc, char** argv) {
  Args args;
  std::string error;
  if (WantsHelp(argc, argv)) {
    std::printf("%s", kUsage);
    return 0;
  }
  if (!ParseArgs(argc, argv, &args, &error)) {
    std::fprintf(stderr, "coli bench repack: %s\n%s", error.c_str(), kUsage);
    return 2;
  }
  absl::StatusOr<std::vector<std::string>> files = SourceShards(args);
  if (!files.ok()) return Fail(files.status());
  uint64_t source_bytes = 0;
  for (const std::string& f : *files) source_bytes += fs::file_size(f);
  const bool temp_out = args.out.empty();
  if (temp_out) {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/coli_bench_repack_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      return Fail(
          absl::InternalError(absl::StrCat("cannot create '", tmpl, "': ", std::strerror(errno))));
    }
    args.out = tmpl;
  }
  const std::string load_before = LoadAverage();
  const uint64_t piece = static_cast<uint64_t>(args.piece_mib) << 20;
  absl::StatusOr<DiskRate> disk_before = MeasureDisk(*files, piece);
  if (!disk_before.ok()) return Fail(disk_before.status());
  std::fprintf(stderr, "bench repack: disk %.3f GB/s (%s), %zu shards, %.1f MB\n", disk_before->gbs,
               disk_before->direct ? "O_DIRECT" : "buffered: O_DIRECT refused", files->size(),
               source_bytes / 1e6);

  // Rounds alternate the depths (1, 3, 1, 3, ...) so a change in the machine's load hits them
  // alike; each depth reports its median round.
  std::vector<std::vector<RunResult>> rounds(args.in_flight.size());
  for (int round = 0; round < args.repeat; ++round) {
    for (size_t d = 0; d < args.in_flight.size(); ++d) {
      const int depth = args.in_flight[d];
      RunResult r;
      r.in_flight = depth;
      const std::string dst = (fs::path(args.out) / absl::StrCat("in-flight-", depth)).string();
      std::error_code ec;
      fs::remove_all(dst, ec);
      if (absl::Status s = Evict(*files); !s.ok()) return Fail(s);
      k3::RepackOptions o;
      o.bits = args.bits;
      o.threads = args.threads;
      o.in_flight = depth;
      o.piece_bytes = piece;
      o.direct = args.direct;
      o.shards = args.shards;
      const double t0 = Now(), cpu0 = CpuSeconds();
      absl::StatusOr<k3::RepackSummary> s = k3::Repack(args.model, dst, o);
      r.wall = Now() - t0;
      r.cpu = CpuSeconds() - cpu0;
      if (!s.ok()) return Fail(s.status());
      r.summary = *s;
      r.gbs = s->read_bytes / 1e9 / std::max(r.wall, 1e-9);
      std::fprintf(stderr,
                   "bench repack: round %d, in-flight %d: %.2f s, %.3f GB/s; busy read %.2f, "
                   "quantize %.2f, write %.2f, fsync %.2f s\n",
                   round + 1, depth, r.wall, r.gbs, s->read_seconds, s->quantize_seconds,
                   s->write_seconds, s->finish_seconds);
      rounds[d].push_back(r);
    }
  }
  std::vector<RunResult> runs;  // the median round of each depth
  for (std::vector<RunResult>& v : rounds) {
    std::sort(v.begin(), v.end(),
              [](const RunResult& a, const RunResult& b) { return a.wall < b.wall; });
    runs.push_back(v[v.size() / 2]);
    for (const RunResult& r : v) {
      absl::StrAppend(&runs.back().walls, runs.back().walls.empty() ? "" : ", ",
                      absl::StrFormat("%.3f", r.wall));
    }
  }
  absl::StatusOr<DiskRate> disk_after = MeasureDisk(*files, piece);
  if (!disk_after.ok()) return Fail(disk_after.status());
  const double disk = std::max(disk_before->gbs, disk_after->gbs);
  bool identical = true;
  std::string differs;
  for (size_t k = 1; k < runs.size() && identical; ++k) {
    const std::string a =
        (fs::path(args.out) / absl::StrCat("in-flight-", runs[0].in_flight)).string();
    const std::string b =
        (fs::path(args.out) / absl::StrCat("in-flight-", runs[k].in_flight)).string();
    absl::StatusOr<bool> same = SameShards(a, b, &differs);
    if (!same.ok()) return Fail(same.status());
    identical = *same;
  }
  if (!args.keep) {
    std::error_code ec;
    for (const RunResult& r : runs) {
      fs::remove_all(fs::path(args.out) / absl::StrCat("in-flight-", r.in_flight), ec);
    }
    if (temp_out) fs::remove(args.out, ec);
  }
  struct rusage usage;
  ::getrusage(RUSAGE_SELF, &usage);
  const int threads = args.threads > 0
                          ? args.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const std::string load_after = LoadAverage();

  if (args.json) {
    std::string list;
    for (const RunResult& r : runs) {
      const k3::RepackSummary& s = r.summary;
      absl::StrAppend(
          &list, list.empty() ? "" : ", ",
          absl::StrFormat(
              "{\"in_flight\": %d, \"wall_s\": %.3f, \"walls_s\": [%s], \"cpu_s\": %.3f, \"gbs\": "
              "%.4f, "
              "\"ratio_to_disk\": %.4f, "
              "\"read_s\": %.3f, \"quantize_s\": %.3f, \"write_s\": %.3f, \"finish_s\": %.3f, "
              "\"shards_written\": %d}",
              r.in_flight, r.wall, r.walls.c_str(), r.cpu, r.gbs, r.gbs / disk, s.read_seconds,
              s.quantize_seconds, s.write_seconds, s.finish_seconds, s.written));
    }
    std::printf(
        "{\"bench\": \"repack\", \"source_bytes\": %llu, \"shards\": %zu, \"bits\": %d, "
        "\"threads\": %d, \"cores\": %u, \"piece_bytes\": %llu, \"reads\": \"%s\", \"rounds\": %d, "
        "\"disk_gbs\": %.4f, \"disk_gbs_before\": %.4f, \"disk_gbs_after\": %.4f, "
        "\"disk_direct\": %s, \"page_cache\": \"evicted per file (posix_fadvise DONTNEED)\", "
        "\"runs\": [%s], \"identical\": %s, \"max_rss_kb\": %ld, \"load_before\": \"%s\", "
        "\"load_after\": \"%s\"}\n",
        static_cast<unsigned long long>(source_bytes), files->size(), args.bits, threads,
        std::thread::hardware_concurrency(), static_cast<unsigned long long>(piece),
        args.direct ? "O_DIRECT" : "buffered", args.repeat, disk, disk_before->gbs, disk_after->gbs,
        disk_before->direct && disk_after->direct ? "true" : "false", list.c_str(),
        identical ? "true" : "false", usage.ru_maxrss, load_before.c_str(), load_after.c_str());
  } else {
    std::printf(
        "coli bench repack: %zu shards, %.1f MB of source, --bits %d, %d threads on %u "
        "cores, %d MiB pieces, repack reads %s\n",
        files->size(), source_bytes / 1e6, args.bits, threads, std::thread::hardware_concurrency(),
        args.piece_mib, args.direct ? "O_DIRECT" : "buffered");
    std::printf("  (a) disk         %.3f GB/s sequential O_DIRECT (%.3f before, %.3f after)%s\n",
                disk, disk_before->gbs, disk_after->gbs,
                disk_before->direct && disk_after->direct ? "" : " [O_DIRECT refused: buffered]");
    for (const RunResult& r : runs) {
      const k3::RepackSummary& s = r.summary;
      std::printf(
          "  (b) in-flight %-2d %.2f s, %.3f GB/s = %.2f of the disk; busy: read %.2f, "
          "quantize %.2f, write %.2f s (sum %.2f), fsync + rename %.2f s; CPU %.2f s = %.2f "
          "cores; rounds: %s s\n",
          r.in_flight, r.wall, r.gbs, r.gbs / disk, s.read_seconds, s.quantize_seconds,
          s.write_seconds, s.read_seconds + s.quantize_seconds + s.write_seconds, s.finish_seconds,
          r.cpu, r.cpu / std::max(r.wall, 1e-9), r.walls.c_str());
    }
    std::printf("  (c) outputs      %s\n",
                identical ? "identical for every depth" : ("DIFFER: " + differs).c_str());
    std::printf("  page cache       evicted per file (posix_fadvise DONTNEED) before each phase\n");
    std::printf("  load average     %s before, %s after (1 and 5 min); max RSS %.1f MB\n",
                load_before.c_str(), load_after.c_str(), usage.ru_maxrss / 1e3);
  }
  return identical ? 0 : 1;
}

}  // namespace

COLI_REGISTER_BENCH(repack, "repack",
                    "k3-repack's pipeline vs the disk read rate: --model DIR [--in-flight 1,3]",
                    RunBenchRepack);

}  // namespace coli::cli
