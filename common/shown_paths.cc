#include "common/shown_paths.h"

#include <algorithm>
#include <memory>
#include <mutex>

namespace kiln {
namespace {

using Roots = std::vector<std::pair<std::string, std::string>>;

std::mutex roots_mu;
std::shared_ptr<const Roots>& CurrentRoots() {
  static auto* roots = new std::shared_ptr<const Roots>(std::make_shared<const Roots>());
  return *roots;
}

std::string WithoutTrailingSlash(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

}  // namespace

void SetShownPathRoots(Roots roots) {
  for (auto& [path, name] : roots) path = WithoutTrailingSlash(std::move(path));
  std::erase_if(roots, [](const auto& r) { return r.first.empty() || r.first == "/"; });
  // Longer roots first, so a root inside another is shown by its own name.
  std::sort(roots.begin(), roots.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  auto shared = std::make_shared<const Roots>(std::move(roots));
  std::lock_guard<std::mutex> lock(roots_mu);
  CurrentRoots() = std::move(shared);
}

std::string WithShownPaths(std::string_view text) {
  std::shared_ptr<const Roots> roots;
  {
    std::lock_guard<std::mutex> lock(roots_mu);
    roots = CurrentRoots();
  }
  std::string out(text);
  for (const auto& [path, name] : *roots) {
    for (size_t at = out.find(path); at != std::string::npos; at = out.find(path, at)) {
      const size_t end = at + path.size();
      if (end < out.size() && out[end] != '/') {  // "/srv/data2" is not under "/srv/data"
        at = end;
        continue;
      }
      out.replace(at, path.size(), name);
      at += name.size();
    }
  }
  return out;
}

}  // namespace kiln
