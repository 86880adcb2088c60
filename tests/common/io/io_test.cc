#include "common/io/io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/log/log.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/io/test_files.h"

namespace coli::io {
namespace {

using ::coli::testing::IsOk;
using ::coli::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

namespace fs = std::filesystem;

using ::coli::test_files::Pattern;
using ::coli::test_files::TempDir;
using ::coli::test_files::WriteRaw;

// Ranges that start and end on and off 4 KiB boundaries, at the start, middle and end of a
// file of `size` bytes.
std::vector<std::pair<uint64_t, uint64_t>> InterestingRanges(uint64_t size) {
  std::vector<std::pair<uint64_t, uint64_t>> r = {
      {0, 1},        {0, 4096},     {0, 4097},           {1, 4095},           {1, 4096},
      {4095, 2},     {4096, 4096},  {4100, 10000},       {12287, 1},          {100, 0},
      {8191, 8194},  {size - 1, 1}, {size - 4097, 4097}, {size - 5000, 5000}, {0, size},
      {3, size - 3}, {size, 0}};
  return r;
}

TEST(IoFile, ReadsExactRanges) {
  TempDir dir;
  const std::string bytes = Pattern(70000, 1);
  WriteRaw(dir.File("a.bin"), bytes);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f, File::Open(dir.File("a.bin")));
  EXPECT_EQ(f->size(), bytes.size());
  EXPECT_EQ(f->path(), dir.File("a.bin"));
  EXPECT_GE(f->fd(), 0);
  for (auto [offset, length] : InterestingRanges(bytes.size())) {
    std::string got(length, '\0');
    ASSERT_OK(f->ReadAt(offset, length, got.data()));
    EXPECT_EQ(got, bytes.substr(offset, length)) << offset << "+" << length;
  }
}

TEST(IoFile, RangePastEndIsDataLossNamingFile) {
  TempDir dir;
  WriteRaw(dir.File("short.bin"), Pattern(100, 2));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f, File::Open(dir.File("short.bin")));
  std::string got(200, '\0');
  EXPECT_THAT(f->ReadAt(50, 51, got.data()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("short.bin")));
  EXPECT_THAT(f->ReadAt(101, 0, got.data()), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(f->ReadAt(~uint64_t{0}, 2, got.data()), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(IoFile, MissingFileIsNotFound) {
  TempDir dir;
  EXPECT_THAT(File::Open(dir.File("nope.bin")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope.bin")));
}

TEST(IoFile, DirectoryIsRefused) {
  TempDir dir;
  EXPECT_THAT(File::Open(dir.path()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is a directory")));
  EXPECT_THAT(MappedFile::Map(dir.path()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is a directory")));
  EXPECT_THAT(DirectReader::Open(dir.path()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is a directory")));
}

// A FIFO where a model file belongs (mkfifo, a process substitution) made open() wait for a
// writer forever: coli run hung. It is refused as not a regular file, at once.
TEST(IoFile, FifoIsRefusedWithoutBlocking) {
  TempDir dir;
  const std::string fifo = dir.File("model-00003-of-000016.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  EXPECT_THAT(File::Open(fifo), StatusIs(absl::StatusCode::kInvalidArgument,
                                         AllOf(HasSubstr(fifo), HasSubstr("not a regular file"))));
  EXPECT_THAT(ReadFileToString(fifo, 1 << 20),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a regular file")));
  EXPECT_THAT(DirectReader::Open(fifo),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a regular file")));
}

TEST(IoFile, EmptyFile) {
  TempDir dir;
  WriteRaw(dir.File("empty"), "");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f, File::Open(dir.File("empty")));
  EXPECT_EQ(f->size(), 0u);
  EXPECT_OK(f->ReadAt(0, 0, nullptr));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<MappedFile> m, MappedFile::Map(dir.File("empty")));
  EXPECT_EQ(m->size(), 0u);
  EXPECT_EQ(m->data(), nullptr);
}

TEST(IoReadFileToString, ReadsAllAndHonoursLimit) {
  TempDir dir;
  const std::string bytes = Pattern(5000, 3);
  WriteRaw(dir.File("f"), bytes);
  ASSERT_OK_AND_ASSIGN(std::string got, ReadFileToString(dir.File("f")));
  EXPECT_EQ(got, bytes);
  EXPECT_THAT(ReadFileToString(dir.File("f"), 4999),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("/f'")));
}

TEST(IoMappedFile, ViewMatchesFile) {
  TempDir dir;
  const std::string bytes = Pattern(12345, 4);
  WriteRaw(dir.File("m"), bytes);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<MappedFile> m, MappedFile::Map(dir.File("m")));
  ASSERT_EQ(m->size(), bytes.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->data()), m->size()), bytes);
  EXPECT_THAT(MappedFile::Map(dir.File("missing")), StatusIs(absl::StatusCode::kNotFound));
}

// What a process reads back from a folder others may write to: its own regular files only.
TEST(IoMappedFile, OwnFileOnlyRefusesALink) {
  TempDir dir;
  WriteRaw(dir.File("m"), Pattern(100, 5));
  ASSERT_EQ(::symlink(dir.File("m").c_str(), dir.File("link").c_str()), 0);
  EXPECT_OK(MappedFile::Map(dir.File("link")).status());
  EXPECT_OK(MappedFile::Map(dir.File("m"), /*own_file_only=*/true).status());
  EXPECT_FALSE(MappedFile::Map(dir.File("link"), /*own_file_only=*/true).ok());
}

TEST(IoAlignedBuffer, AlignedAndGrows) {
  AlignedBuffer empty;
  EXPECT_EQ(empty.capacity(), 0u);
  AlignedBuffer b(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kDirectAlignment, 0u);
  EXPECT_EQ(b.capacity(), 4096u);
  b.Reserve(10000);
  EXPECT_EQ(b.capacity(), 12288u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kDirectAlignment, 0u);
  b.Reserve(10);  // never shrinks
  EXPECT_EQ(b.capacity(), 12288u);
  AlignedBuffer moved(std::move(b));
  EXPECT_EQ(moved.capacity(), 12288u);
  EXPECT_EQ(b.capacity(), 0u);  // NOLINT(bugprone-use-after-move): documented moved-from state
  EXPECT_EQ(b.data(), nullptr);
}

// Compares ReadInto and Read of every interesting range against the bytes written.
void ExpectReaderMatches(const DirectReader& reader, const std::string& bytes) {
  AlignedBuffer buffer;
  for (auto [offset, length] : InterestingRanges(bytes.size())) {
    ASSERT_OK_AND_ASSIGN(const uint8_t* p, reader.ReadInto(offset, length, &buffer));
    if (length > 0) {
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(p), length), bytes.substr(offset, length))
          << "ReadInto " << offset << "+" << length;
    }
    // Read into a deliberately misaligned destination.
    std::string dst(length + 1, '\0');
    ASSERT_OK(reader.Read(offset, length, dst.data() + 1));
    EXPECT_EQ(dst.substr(1), bytes.substr(offset, length)) << "Read " << offset << "+" << length;
  }
  // The aligned fast path (aligned offset, length and destination).
  AlignedBuffer dst(8192);
  ASSERT_OK(reader.Read(4096, 8192, dst.data()));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(dst.data()), 8192), bytes.substr(4096, 8192));
  // Past the end.
  EXPECT_THAT(reader.ReadInto(bytes.size() - 10, 11, &buffer),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(reader.path())));
  EXPECT_THAT(reader.Read(bytes.size() + 1, 0, dst.data()), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(IoDirectReader, AnyRangeOnRealDisk) {
  TempDir dir;  // build tree or /var/tmp: a real filesystem
  const std::string bytes = Pattern(3 * 4096 * 5 + 1234, 5);  // ends off a 4 KiB boundary
  WriteRaw(dir.File("d"), bytes);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DirectReader> r, DirectReader::Open(dir.File("d")));
  EXPECT_EQ(r->size(), bytes.size());
  ExpectReaderMatches(*r, bytes);
  if (!r->is_direct()) {
    // Some container filesystems refuse O_DIRECT: the data was right, but the direct path
    // was not exercised here.
    GTEST_SKIP() << "O_DIRECT refused on " << dir.path() << ": " << r->fallback_reason();
  }
}

TEST(IoDirectReader, LargeUnalignedReadUsesSeveralBouncePieces) {
  TempDir dir;
  const std::string bytes = Pattern((uint64_t{9} << 20) + 777, 6);  // > 8 MiB bounce piece
  WriteRaw(dir.File("big"), bytes);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DirectReader> r, DirectReader::Open(dir.File("big")));
  std::string dst(bytes.size() - 100, '\0');
  ASSERT_OK(r->Read(33, dst.size(), dst.data()));
  EXPECT_TRUE(dst == bytes.substr(33, dst.size()));
}

TEST(IoDirectReader, BufferedWhenAsked) {
  TempDir dir;
  const std::string bytes = Pattern(20000, 7);
  WriteRaw(dir.File("b"), bytes);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DirectReader> r,
                       DirectReader::Open(dir.File("b"), /*direct=*/false));
  EXPECT_FALSE(r->is_direct());
  EXPECT_EQ(r->fallback_reason(), "");
  ExpectReaderMatches(*r, bytes);
}

// Captures log messages for the duration of a test.
class LogCapture {
 public:
  LogCapture() {
    SetLogSink([this](LogLevel level, std::string_view message) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.emplace_back(message);
    });
  }
  ~LogCapture() { SetLogSink(nullptr); }
  std::string All() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string all;
    for (const std::string& l : lines_) all += l + "\n";
    return all;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

TEST(IoDirectReader, FallsBackWithLoggedReasonWhenRefused) {
  TempDir dir;
  const std::string bytes = Pattern(50000, 8);
  WriteRaw(dir.File("refused"), bytes);
  LogCapture log;
  internal::SetDirectOpenErrnoForTesting(EINVAL);  // what tmpfs answered before Linux 6.6
  absl::StatusOr<std::unique_ptr<DirectReader>> r = DirectReader::Open(dir.File("refused"));
  internal::SetDirectOpenErrnoForTesting(0);
  ASSERT_OK(r.status());
  EXPECT_FALSE((*r)->is_direct());
  EXPECT_THAT((*r)->fallback_reason(), HasSubstr("refused O_DIRECT"));
  EXPECT_THAT(log.All(), HasSubstr(dir.File("refused")));
  EXPECT_THAT(log.All(), HasSubstr("reading buffered"));
  ExpectReaderMatches(**r, bytes);
}

TEST(IoDirectReader, OtherOpenErrorsAreNotHidden) {
  TempDir dir;
  WriteRaw(dir.File("x"), "abc");
  internal::SetDirectOpenErrnoForTesting(EACCES);
  absl::StatusOr<std::unique_ptr<DirectReader>> r = DirectReader::Open(dir.File("x"));
  internal::SetDirectOpenErrnoForTesting(0);
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("O_DIRECT")));
}

TEST(IoDirectReader, TmpfsReadsCorrectlyDirectOrNot) {
  // /dev/shm is tmpfs: older kernels refuse O_DIRECT there (fallback), newer accept it.
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  TempDir dir("/dev/shm");
  const std::string bytes = Pattern(40000, 9);
  WriteRaw(dir.File("t"), bytes);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DirectReader> r, DirectReader::Open(dir.File("t")));
  if (!r->is_direct()) {
    EXPECT_THAT(r->fallback_reason(), HasSubstr("O_DIRECT"));
  }
  ExpectReaderMatches(*r, bytes);
}

TEST(IoDirectReader, ConcurrentReadsFromOneReader) {
  TempDir dir;
  const std::string bytes = Pattern(200000, 14);
  WriteRaw(dir.File("c"), bytes);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DirectReader> r, DirectReader::Open(dir.File("c")));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<uint32_t>(t));
      AlignedBuffer buffer;
      for (int i = 0; i < 200; ++i) {
        uint64_t offset = rng() % bytes.size();
        uint64_t length = rng() % std::min<uint64_t>(bytes.size() - offset + 1, 20000);
        absl::StatusOr<const uint8_t*> p = r->ReadInto(offset, length, &buffer);
        if (!p.ok() || std::memcmp(*p, bytes.data() + offset, length) != 0) ++mismatches[t];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_THAT(mismatches, ::testing::Each(0));
}

TEST(IoReadBatch, ManyRangesAcrossFilesInParallel) {
  TempDir dir;
  const std::string a = Pattern(100000, 10);
  const std::string b = Pattern(60000, 11);
  WriteRaw(dir.File("a"), a);
  WriteRaw(dir.File("b"), b);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> fa, File::Open(dir.File("a")));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> fb, File::Open(dir.File("b")));
  std::mt19937 rng(12);
  std::vector<ReadRequest> requests;
  std::vector<std::string> out(200);
  std::vector<std::string> expected(200);
  for (size_t i = 0; i < out.size(); ++i) {
    const bool use_a = rng() % 2 == 0;
    const std::string& src = use_a ? a : b;
    uint64_t offset = rng() % src.size();
    uint64_t length = rng() % (src.size() - offset + 1);
    out[i].assign(length, '\0');
    expected[i] = src.substr(offset, length);
    requests.push_back({use_a ? fa.get() : fb.get(), offset, length, out[i].data()});
  }
  for (int threads : {1, 4}) {
    for (std::string& o : out) std::fill(o.begin(), o.end(), '\0');
    ASSERT_OK(ReadBatch(requests, threads));
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], expected[i]) << i;
  }
  EXPECT_OK(ReadBatch({}, 4));
}

TEST(IoReadBatch, ReportsBadRequests) {
  TempDir dir;
  WriteRaw(dir.File("a"), Pattern(1000, 13));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<File> f, File::Open(dir.File("a")));
  std::string dst(2000, '\0');
  std::vector<ReadRequest> past_end = {{f.get(), 0, 10, dst.data()},
                                       {f.get(), 900, 200, dst.data()}};
  EXPECT_THAT(ReadBatch(past_end, 2), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("/a'")));
  std::vector<ReadRequest> null_file = {{nullptr, 0, 10, dst.data()}};
  EXPECT_THAT(ReadBatch(null_file, 2), StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<ReadRequest> null_dst = {{f.get(), 0, 10, nullptr}};
  EXPECT_THAT(ReadBatch(null_dst, 2), StatusIs(absl::StatusCode::kInvalidArgument));
}

std::vector<std::string> Listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(IoWriteFileAtomic, WritesAndReplacesWithoutLeftovers) {
  TempDir dir;
  ASSERT_OK(WriteFileAtomic(dir.File("out.json"), "first"));
  ASSERT_OK_AND_ASSIGN(std::string got, ReadFileToString(dir.File("out.json")));
  EXPECT_EQ(got, "first");
  ASSERT_OK(WriteFileAtomic(dir.File("out.json"), "second, longer"));
  ASSERT_OK_AND_ASSIGN(got, ReadFileToString(dir.File("out.json")));
  EXPECT_EQ(got, "second, longer");
  EXPECT_EQ(Listing(dir.path()), std::vector<std::string>{"out.json"});
  EXPECT_EQ(fs::status(dir.File("out.json")).permissions() & fs::perms::others_read,
            fs::perms::others_read);
}

// The permission bits of `path`.
int ModeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return static_cast<int>(st.st_mode & 07777);
}

TEST(IoWriteFileAtomic, GivesTheFileExactlyTheModeAsked) {
  TempDir dir;
  const mode_t old_umask = ::umask(022);  // a mode is exact, not reduced by the umask either way
  ASSERT_OK(WriteFileAtomic(dir.File("default"), "x"));
  EXPECT_EQ(ModeOf(dir.File("default")), 0644);
  ASSERT_OK(WriteFileAtomic(dir.File("private"), "secret", 0600));
  EXPECT_EQ(ModeOf(dir.File("private")), 0600);
  ASSERT_OK(WriteFileAtomic(dir.File("group"), "x", 0664));  // more than the umask allows
  EXPECT_EQ(ModeOf(dir.File("group")), 0664);
  // Replacing a readable file with a private one: the new file has the new mode.
  ASSERT_OK(WriteFileAtomic(dir.File("default"), "now secret", 0600));
  EXPECT_EQ(ModeOf(dir.File("default")), 0600);
  ASSERT_OK_AND_ASSIGN(std::string got, ReadFileToString(dir.File("default")));
  EXPECT_EQ(got, "now secret");
  ::umask(old_umask);
  EXPECT_THAT(WriteFileAtomic(dir.File("bad"), "x", S_IFREG | 0644),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad")));
  EXPECT_EQ(Listing(dir.path()), (std::vector<std::string>{"default", "group", "private"}));
}

TEST(IoWriteFileAtomic, FailureLeavesNothingBehind) {
  TempDir dir;
  EXPECT_THAT(WriteFileAtomic(dir.File("no/such/dir/f"), "x"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no/such/dir/f")));
  fs::create_directory(dir.File("sub"));
  WriteRaw(dir.File("sub/keep"), "keep");
  // Renaming a file over a non-empty folder fails; the folder and its content stay.
  EXPECT_THAT(WriteFileAtomic(dir.File("sub"), "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sub")));
  EXPECT_EQ(Listing(dir.path()), std::vector<std::string>{"sub"});
  EXPECT_EQ(Listing(dir.File("sub")), std::vector<std::string>{"keep"});
}

}  // namespace
}  // namespace coli::io
