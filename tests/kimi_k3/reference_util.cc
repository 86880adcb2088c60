#include "tests/kimi_k3/reference_util.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/json/json.h"
#include "common/status/status.h"

namespace coli::k3::testing {

namespace fs = std::filesystem;

TempDir::TempDir() {
  std::string base = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
  std::string templ = base + "/k3_model_test_XXXXXX";
  char* p = ::mkdtemp(templ.data());
  path_ = p ? std::string(p) : templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

absl::StatusOr<std::string> RunReference(const std::string& args) {
  const std::string cmd = absl::StrCat(K3_TEST_PYTHON, " ", K3_TEST_REF, " ", args);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return absl::InternalError("cannot run " + cmd);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  if (rc != 0) return absl::InternalError(absl::StrCat("reference failed (", rc, "): ", cmd, "\n", out));
  return out;
}

std::vector<float> ReadF32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string b = ss.str();
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

void WriteF32(const std::string& path, const std::vector<float>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
}

double RelL2(const float* a, const float* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double WorstRowError(const std::vector<float>& eng, const std::vector<float>& ref, int64_t width,
                     int64_t* worst_row) {
  if (eng.size() != ref.size() || width <= 0 || eng.size() % width != 0)
    return std::numeric_limits<double>::infinity();
  double worst = 0;
  const int64_t rows = static_cast<int64_t>(eng.size()) / width;
  for (int64_t r = 0; r < rows; ++r) {
    const double e = RelL2(eng.data() + r * width, ref.data() + r * width, width);
    if (e > worst) {
      worst = e;
      if (worst_row) *worst_row = r;
    }
  }
  return worst;
}

double WorstLayerError(const std::vector<float>& eng, const std::vector<float>& ref, int T, int L,
                       int64_t D, int layer) {
  const size_t n = static_cast<size_t>(T) * L * D;
  if (eng.size() != n || ref.size() != n) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (int t = 0; t < T; ++t) {
    const size_t off = (static_cast<size_t>(t) * L + layer) * D;
    worst = std::max(worst, RelL2(eng.data() + off, ref.data() + off, D));
  }
  return worst;
}

std::string JoinIds(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) absl::StrAppend(&s, i ? "," : "", ids[i]);
  return s;
}

std::vector<int32_t> RandomIds(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % vocab);
  return ids;
}

std::vector<int32_t> ParseGreedyIds(const std::string& text) {
  std::vector<int32_t> ids;
  const size_t open = text.find('['), close = text.find(']');
  if (open == std::string::npos || close == std::string::npos) return ids;
  std::stringstream ss(text.substr(open + 1, close - open - 1));
  std::string item;
  while (std::getline(ss, item, ',')) ids.push_back(std::stoi(item));
  return ids;
}

void CopyDir(const std::string& src, const std::string& dst) {
  fs::create_directories(dst);
  fs::copy(src, dst, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
}

absl::Status RewriteShardOf(const std::string& dir, const std::string& tensor,
                            const std::function<void(EditableTensor&)>& edit) {
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::string index_text;
  {
    std::ifstream in(index_path);
    std::stringstream ss;
    ss << in.rdbuf();
    index_text = ss.str();
  }
  COLI_ASSIGN_OR_RETURN(st::Index index, st::ParseIndex(index_text, index_path));
  auto it = index.weight_map.find(tensor);
  if (it == index.weight_map.end()) return absl::NotFoundError(tensor);
  const std::string shard = dir + "/" + it->second;
  std::string bytes;
  {
    std::ifstream in(shard, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    bytes = ss.str();
  }
  COLI_ASSIGN_OR_RETURN(st::Header header, st::ParseFileBytes(bytes, shard));
  st::Writer writer;
  writer.SetMetadata(header.metadata);
  for (const st::TensorInfo& t : header.tensors) {
    EditableTensor e{t.name, t.dtype, t.shape, bytes.substr(t.file_offset, t.nbytes)};
    edit(e);
    if (!e.keep) {
      index.weight_map.erase(t.name);
      continue;
    }
    COLI_RETURN_IF_ERROR(writer.Add(e.name, e.dtype, e.shape, std::move(e.bytes)));
  }
  COLI_RETURN_IF_ERROR(writer.Write(shard));
  return st::WriteIndex(index_path, index.weight_map, index.total_size.value_or(0));
}

}  // namespace coli::k3::testing
