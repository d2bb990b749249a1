#include "engine/cpu/dnnl_primitives.h"

#include <functional>

#include "common/status_macros.h"
#include "engine/cpu/dnnl_engine.h"

namespace kiln::cpu_internal {

bool ConvKey::operator==(const ConvKey& o) const {
  return g.batch == o.g.batch && g.in_channels == o.g.in_channels && g.in_h == o.g.in_h &&
         g.in_w == o.g.in_w && g.out_channels == o.g.out_channels && g.kernel_h == o.g.kernel_h &&
         g.kernel_w == o.g.kernel_w && g.stride_h == o.g.stride_h && g.stride_w == o.g.stride_w &&
         g.padding_h == o.g.padding_h && g.padding_w == o.g.padding_w &&
         g.x_layout == o.g.x_layout && g.y_layout == o.g.y_layout && bias == o.bias && act == o.act;
}

size_t ConvKeyHash::operator()(const ConvKey& key) const {
  size_t h = 0;
  for (const int v :
       {key.g.batch, key.g.in_channels, key.g.in_h, key.g.in_w, key.g.out_channels, key.g.kernel_h,
        key.g.kernel_w, key.g.stride_h, key.g.stride_w, key.g.padding_h, key.g.padding_w,
        static_cast<int>(key.g.x_layout), static_cast<int>(key.g.y_layout),
        static_cast<int>(key.bias), static_cast<int>(key.act)}) {
    h = h * 1000003u ^ std::hash<int>()(v);
  }
  return h;
}

DnnlPrimitives::DnnlPrimitives(bool bf16) : stream_(DnnlEngine()), matmuls_(bf16), bf16_(bf16) {}

absl::StatusOr<const ConvForwardPlan*> DnnlPrimitives::Forward(const ConvKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = forward_.find(key);
  if (it != forward_.end()) return it->second.get();
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ConvForwardPlan> plan,
                        ConvForwardPlan::Create(key.g, key.bias, key.act, bf16_));
  if (forward_.size() >= kMaxCachedShapes) forward_.clear();
  return forward_.emplace(key, std::move(plan)).first->second.get();
}

absl::StatusOr<const ConvBackwardPlan*> DnnlPrimitives::Backward(const ConvKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = backward_.find(key);
  if (it != backward_.end()) return it->second.get();
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ConvBackwardPlan> plan,
                        ConvBackwardPlan::Create(key.g, key.bias, key.act, bf16_));
  if (backward_.size() >= kMaxCachedShapes) backward_.clear();
  return backward_.emplace(key, std::move(plan)).first->second.get();
}

}  // namespace kiln::cpu_internal
