#include "server/datasets/gunzip_stream.h"

#include <memory>

#include "absl/strings/str_cat.h"

namespace kiln::server {
namespace {

constexpr size_t kOutBytes = size_t{64} << 10;
constexpr int kGzipOnly = 15 + 16;  // windowBits: 32 KiB window, gzip wrapper required

}  // namespace

GunzipStream::GunzipStream(std::string name) : name_(std::move(name)) {}

GunzipStream::~GunzipStream() {
  if (initialized_) inflateEnd(&z_);
}

absl::Status GunzipStream::Feed(absl::string_view compressed, const Sink& sink) {
  if (!initialized_) {
    if (inflateInit2(&z_, kGzipOnly) != Z_OK) {
      return absl::ResourceExhaustedError(absl::StrCat(name_, ": cannot start inflating"));
    }
    initialized_ = true;
  }
  // One buffer per call: 64 KiB on the heap, not on a gRPC thread's stack.
  auto out = std::make_unique<unsigned char[]>(kOutBytes);
  z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
  z_.avail_in = static_cast<uInt>(compressed.size());
  while (z_.avail_in > 0) {
    if (!in_member_) {
      // Past the end of a member only another member may follow.
      if (saw_member_) inflateReset(&z_);
      in_member_ = true;
      saw_member_ = true;
    }
    z_.next_out = out.get();
    z_.avail_out = kOutBytes;
    const int rc = inflate(&z_, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
      return absl::DataLossError(absl::StrCat(
          name_, ": corrupt gzip stream: ", z_.msg != nullptr ? z_.msg : "inflate failed"));
    }
    const size_t produced = kOutBytes - z_.avail_out;
    if (rc == Z_BUF_ERROR && produced == 0) {
      return absl::DataLossError(absl::StrCat(name_, ": corrupt gzip stream: no progress"));
    }
    if (produced > 0) {
      if (absl::Status s = sink(absl::string_view(reinterpret_cast<char*>(out.get()), produced));
          !s.ok()) {
        return s;
      }
    }
    if (rc == Z_STREAM_END) in_member_ = false;
  }
  return absl::OkStatus();
}

absl::Status GunzipStream::Finish() const {
  if (!saw_member_) return absl::DataLossError(absl::StrCat(name_, ": empty gzip stream"));
  if (in_member_) {
    return absl::DataLossError(
        absl::StrCat(name_, ": truncated gzip stream: it ends inside a compressed member"));
  }
  return absl::OkStatus();
}

}  // namespace kiln::server
