// Test-only helpers for tests that make files: a temporary folder, deterministic bytes, and a
// raw reader and writer (header-only).
#ifndef COLI_TESTS_COMMON_IO_TEST_FILES_H_
#define COLI_TESTS_COMMON_IO_TEST_FILES_H_

#include <stdlib.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace coli::test_files {

// A fresh folder, removed with everything in it at the end of the test. Made under `base`
// when given, else $COLI_BINARY_DIR (the build tree: a real disk where O_DIRECT works), else
// /var/tmp, else /tmp.
class TempDir {
 public:
  explicit TempDir(const std::string& base = "") {
    std::string root = base;
    if (root.empty()) {
      const char* bin = std::getenv("COLI_BINARY_DIR");
      root =
          bin != nullptr ? bin : (std::filesystem::is_directory("/var/tmp") ? "/var/tmp" : "/tmp");
    }
    std::string tmpl = root + "/coli_test.XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr)
        << "mkdtemp in " << root << ": " << std::strerror(errno);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  // Creates (if needed) and returns the sub-folder `name`.
  std::string Sub(const std::string& name) const {
    std::filesystem::create_directories(File(name));
    return File(name);
  }

 private:
  std::string path_;
};

// `n` deterministic pseudo-random bytes.
inline std::string Pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

// The whole content of `path` ("" when it cannot be read, failing the test).
inline std::string ReadRaw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::string bytes(std::istreambuf_iterator<char>(in), {});
  EXPECT_FALSE(in.bad()) << "cannot read " << path;
  return bytes;
}

// Writes `bytes` to `path` (replacing it), failing the test on error.
inline void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  EXPECT_TRUE(out.good()) << "cannot write " << path;
}

}  // namespace coli::test_files

#endif  // COLI_TESTS_COMMON_IO_TEST_FILES_H_
