#include "common/client_message.h"

#include "absl/strings/str_cat.h"
#include "common/shown_paths.h"

namespace kiln {
namespace {

std::string Bounded(std::string_view message) {
  if (message.size() <= kMaxClientMessageBytes) return std::string(message);
  size_t cut = kMaxClientMessageBytes - 64;
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(std::string(message.substr(0, cut)), "... (cut short: ", message.size(),
                      " bytes in all)");
}

}  // namespace

std::string ClientMessage(std::string_view message) { return Bounded(WithShownPaths(message)); }

}  // namespace kiln
