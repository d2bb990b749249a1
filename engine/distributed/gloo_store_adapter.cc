#include "engine/distributed/gloo_store_adapter.h"

#include <string>

#include "gloo/common/error.h"

namespace kiln {

namespace {

void ThrowIfError(const absl::Status& s) {
  if (!s.ok()) throw gloo::IoException(std::string(s.message()));
}

}  // namespace

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  ThrowIfError(store_->Set(key, std::string(data.begin(), data.end())));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  absl::StatusOr<std::string> value = store_->Get(key, timeout_);
  ThrowIfError(value.status());
  return std::vector<char>(value->begin(), value->end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) {
  ThrowIfError(store_->Wait(keys, timeout_));
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  // Gloo passes kNoTimeout (zero) for "no limit of its own".
  const absl::Duration limit = timeout.count() > 0 ? absl::FromChrono(timeout) : timeout_;
  ThrowIfError(store_->Wait(keys, limit));
}

}  // namespace kiln
