#include "tests/fuzz/scratch_file.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"

namespace kiln::fuzz {
namespace {

// The process's directory; removed (with every scratch file) by its destructor at exit.
class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp", "/kiln-fuzz-XXXXXX");
    if (::mkdtemp(pattern.data()) == nullptr) {
      // A fuzz run without a scratch directory would test nothing: stop loudly.
      std::fprintf(stderr, "scratch_file: mkdtemp %s: %s\n", pattern.c_str(), std::strerror(errno));
      std::abort();
    }
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

ScratchFile& ScratchFile::Get(const std::string& name) {
  static ScratchDir dir;
  static std::map<std::string, std::unique_ptr<ScratchFile>> files;
  std::unique_ptr<ScratchFile>& file = files[name];
  if (file == nullptr) file.reset(new ScratchFile(absl::StrCat(dir.path(), "/", name)));
  return *file;
}

absl::Status ScratchFile::Write(std::string_view bytes) const {
  std::ofstream out(path_, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat(path_, ": cannot write the scratch file"));
  return absl::OkStatus();
}

}  // namespace kiln::fuzz
