#include "server/web/compressed_assets.h"

#include <brotli/encode.h>
#include <zlib.h>

#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kiln::web {
namespace {

// Whether `coding` is listed in `accept` with a weight above 0.
bool Accepts(std::string_view accept, std::string_view coding) {
  for (absl::string_view item :
       absl::StrSplit(absl::string_view(accept.data(), accept.size()), ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(item, ';');
    if (absl::StripAsciiWhitespace(parts[0]) != absl::string_view(coding.data(), coding.size())) {
      continue;
    }
    for (size_t i = 1; i < parts.size(); ++i) {
      absl::string_view p = absl::StripAsciiWhitespace(parts[i]);
      if (absl::ConsumePrefix(&p, "q=")) {
        // q=0, q=0.0, q=0.000: refused; anything else accepts.
        return p.find_first_not_of("0.") != absl::string_view::npos;
      }
    }
    return true;
  }
  return false;
}

std::string Brotli(std::string_view in) {
  std::string out(BrotliEncoderMaxCompressedSize(in.size()), '\0');
  size_t size = out.size();
  if (out.empty() ||
      !BrotliEncoderCompress(BROTLI_MAX_QUALITY, BROTLI_DEFAULT_WINDOW, BROTLI_MODE_TEXT, in.size(),
                             reinterpret_cast<const uint8_t*>(in.data()), &size,
                             reinterpret_cast<uint8_t*>(out.data()))) {
    return "";
  }
  out.resize(size);
  return out;
}

std::string Gzip(std::string_view in) {
  z_stream z;
  std::memset(&z, 0, sizeof(z));
  // 15 + 16: a gzip header and trailer, not zlib's.
  if (deflateInit2(&z, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    return "";
  }
  std::string out(deflateBound(&z, in.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return rc == Z_STREAM_END ? out : "";
}

}  // namespace

ContentEncoding ChooseEncoding(std::string_view accept_encoding) {
  if (Accepts(accept_encoding, "br")) return ContentEncoding::kBrotli;
  if (Accepts(accept_encoding, "gzip")) return ContentEncoding::kGzip;
  return ContentEncoding::kIdentity;
}

const char* EncodingName(ContentEncoding encoding) {
  switch (encoding) {
    case ContentEncoding::kBrotli:
      return "br";
    case ContentEncoding::kGzip:
      return "gzip";
    default:
      return "";
  }
}

std::string_view CompressedAsset::Get(ContentEncoding encoding, ContentEncoding* used) {
  *used = ContentEncoding::kIdentity;
  if (encoding == ContentEncoding::kIdentity) return bytes_;
  Variant& v = variants_[static_cast<int>(encoding)];
  std::call_once(v.once, [&] {
    std::string compressed = encoding == ContentEncoding::kBrotli ? Brotli(bytes_) : Gzip(bytes_);
    if (!compressed.empty() && compressed.size() < bytes_.size()) v.bytes = std::move(compressed);
    std::lock_guard<std::mutex> lock(mu_);
    ++compressions_;
  });
  if (v.bytes.empty()) return bytes_;
  *used = encoding;
  return v.bytes;
}

int CompressedAsset::compressions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return compressions_;
}

}  // namespace kiln::web
