// The web page's static files (HTML, JS, CSS, and the uPlot chart library fetched at build
// time), built into kilnd by server/web/embed_assets.cmake so that the binary is the whole
// install: no path to find at run time, and the page always matches the API it calls.
#pragma once

#include <string_view>
#include <vector>

namespace kiln::web {

struct WebAsset {
  std::string_view path;  // the URL path it is served at, e.g. "/web/app.js"
  std::string_view bytes;
};

// Every file of the page; generated (web_assets_data.cc in the build tree).
const std::vector<WebAsset>& WebAssets();

}  // namespace kiln::web
