// The page's files compressed once per encoding and served from the cache; the encoding chosen
// from Accept-Encoding as RFC 9110 reads it.
#include "server/web/compressed_assets.h"

#include <brotli/decode.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <string>
#include <thread>
#include <vector>

namespace kiln::web {
namespace {

std::string Unbrotli(std::string_view in, size_t size) {
  std::string out(size, '\0');
  size_t got = size;
  EXPECT_EQ(BrotliDecoderDecompress(in.size(), reinterpret_cast<const uint8_t*>(in.data()), &got,
                                    reinterpret_cast<uint8_t*>(out.data())),
            BROTLI_DECODER_RESULT_SUCCESS);
  out.resize(got);
  return out;
}

std::string Ungzip(std::string_view in, size_t size) {
  z_stream z{};
  EXPECT_EQ(inflateInit2(&z, 15 + 16), Z_OK);
  std::string out(size, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(inflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  inflateEnd(&z);
  return out;
}

TEST(CompressedAssetTest, EachEncodingIsCompressedOnceWhateverTheRequestsAndThreads) {
  std::string text;
  for (int i = 0; i < 2000; ++i)
    text += "function f" + std::to_string(i % 7) + "() { return 1; }\n";
  CompressedAsset asset(text);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        ContentEncoding used;
        asset.Get(ContentEncoding::kBrotli, &used);
        asset.Get(ContentEncoding::kGzip, &used);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(asset.compressions(), 2);

  ContentEncoding used;
  std::string_view br = asset.Get(ContentEncoding::kBrotli, &used);
  EXPECT_EQ(used, ContentEncoding::kBrotli);
  EXPECT_LT(br.size(), text.size());
  EXPECT_EQ(Unbrotli(br, text.size()), text);
  std::string_view gz = asset.Get(ContentEncoding::kGzip, &used);
  EXPECT_EQ(used, ContentEncoding::kGzip);
  EXPECT_EQ(Ungzip(gz, text.size()), text);
  EXPECT_EQ(asset.Get(ContentEncoding::kIdentity, &used), text);
  EXPECT_EQ(used, ContentEncoding::kIdentity);
  EXPECT_EQ(asset.compressions(), 2);
}

TEST(CompressedAssetTest, AFileThatDoesNotShrinkIsServedAsItIs) {
  CompressedAsset asset("x");
  ContentEncoding used;
  EXPECT_EQ(asset.Get(ContentEncoding::kBrotli, &used), "x");
  EXPECT_EQ(used, ContentEncoding::kIdentity);
}

TEST(CompressedAssetTest, TheEncodingFollowsAcceptEncodingAndItsWeights) {
  EXPECT_EQ(ChooseEncoding("gzip, deflate, br"), ContentEncoding::kBrotli);
  EXPECT_EQ(ChooseEncoding("gzip"), ContentEncoding::kGzip);
  EXPECT_EQ(ChooseEncoding("br;q=0, gzip"), ContentEncoding::kGzip);
  EXPECT_EQ(ChooseEncoding("br;q=0.0"), ContentEncoding::kIdentity);
  EXPECT_EQ(ChooseEncoding("br;q=0.5"), ContentEncoding::kBrotli);
  EXPECT_EQ(ChooseEncoding("identity"), ContentEncoding::kIdentity);
  EXPECT_EQ(ChooseEncoding(""), ContentEncoding::kIdentity);
  EXPECT_EQ(ChooseEncoding("xbr"), ContentEncoding::kIdentity);
}

}  // namespace
}  // namespace kiln::web
