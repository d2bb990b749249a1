#include "server/web/web_page.h"

#include <httplib.h>

#include <memory>
#include <string>

#include "server/web/compressed_assets.h"
#include "server/web/web_assets.h"

namespace kiln::web {
namespace {

constexpr char kContentSecurityPolicy[] =
    "default-src 'self'; img-src 'self' data: blob:; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'";

std::string ContentTypeOf(std::string_view path) {
  if (path.ends_with(".js")) return "text/javascript; charset=utf-8";
  if (path.ends_with(".css")) return "text/css; charset=utf-8";
  if (path.ends_with(".txt")) return "text/plain; charset=utf-8";
  return "text/html; charset=utf-8";  // "/"
}

}  // namespace

void AddWebPageRoutes(http::HttpServer* server) {
  for (const WebAsset& asset : WebAssets()) {
    auto compressed = std::make_shared<CompressedAsset>(asset.bytes);
    server->Get(std::string(asset.path), http::Access::kOpen,
                [compressed, type = ContentTypeOf(asset.path)](
                    const httplib::Request& req, httplib::Response& res, const server::Caller&) {
                  res.status = 200;
                  // A new kilnd may serve a new page: the browser asks again each time.
                  res.set_header("Cache-Control", "no-cache");
                  res.set_header("X-Content-Type-Options", "nosniff");
                  // The page holds a token: nothing but its own files may run or be fetched in
                  // it, and no other site may frame it.
                  res.set_header("Content-Security-Policy", kContentSecurityPolicy);
                  res.set_header("Vary", "Accept-Encoding");
                  ContentEncoding used;
                  const std::string_view bytes = compressed->Get(
                      ChooseEncoding(req.get_header_value("Accept-Encoding")), &used);
                  if (used != ContentEncoding::kIdentity) {
                    res.set_header("Content-Encoding", EncodingName(used));
                  }
                  // A provider of known length: httplib compresses a body on every response,
                  // but never a sized provider's bytes, which are the cached ones here.
                  res.set_content_provider(
                      bytes.size(), type,
                      [compressed, bytes](size_t offset, size_t length, httplib::DataSink& sink) {
                        return sink.write(bytes.data() + offset, length);
                      });
                });
  }
}

}  // namespace kiln::web
