// The page's static files, each compressed at most once per encoding (brotli at its best
// quality, gzip) on first use and served from then on as cached bytes. httplib would otherwise
// compress every response at brotli quality 11 (250 ms of CPU for the page's files, per
// request: eight clients slowed training epochs thirtyfold). Thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace kiln::web {

enum class ContentEncoding { kIdentity, kBrotli, kGzip };

// The encoding to answer with for an Accept-Encoding header: brotli where it is accepted, else
// gzip, else none (a q=0 excludes one).
ContentEncoding ChooseEncoding(std::string_view accept_encoding);

// "br", "gzip", or "" for identity: the Content-Encoding header's value.
const char* EncodingName(ContentEncoding encoding);

class CompressedAsset {
 public:
  // `bytes` must outlive this (the assets are built into kilnd).
  explicit CompressedAsset(std::string_view bytes) : bytes_(bytes) {}

  // The asset in `encoding`, compressed on the first call for it. An encoding whose compression
  // fails (out of memory) or does not shrink the file is answered as identity: check
  // `*used`.
  std::string_view Get(ContentEncoding encoding, ContentEncoding* used);

  // How many compressions this asset has run (tests: at most one per encoding).
  int compressions() const;

 private:
  struct Variant {
    std::once_flag once;
    std::string bytes;  // empty: not smaller, or failed: serve identity
  };
  std::string_view bytes_;
  std::array<Variant, 3> variants_;
  mutable std::mutex mu_;
  int compressions_ = 0;
};

}  // namespace kiln::web
