// Small helpers for engine tests: host<->tensor copies, random data, temp dirs, the devices a
// test parameterised over backends runs on.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/backend_registry.h"
#include "tests/support/status_matchers.h"

namespace kiln::testing {

inline Tensor MakeTensor(Backend& b, const Shape& shape, const std::vector<float>& values) {
  auto t = b.Allocate(DType::kF32, shape);
  EXPECT_OK(t) << t.status();
  EXPECT_EQ(static_cast<int64_t>(values.size()), t->numel());
  EXPECT_OK(b.CopyFromHost(values.data(), values.size() * sizeof(float), &*t));
  return *t;
}

inline std::vector<float> ToHost(Backend& b, const Tensor& t) {
  std::vector<float> out(t.numel());
  EXPECT_OK(b.CopyToHost(t, out.data(), out.size() * sizeof(float)));
  return out;
}

inline std::vector<float> RandomValues(size_t n, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// Distinct values at least `gap` apart, shuffled: keeps max-pool and ReLU away from their kinks.
inline std::vector<float> DistinctValues(size_t n, uint32_t seed, float gap = 0.05f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = (static_cast<float>(i) - static_cast<float>(n) / 2.0f + 0.5f) * gap;
  }
  std::mt19937 gen(seed);
  std::shuffle(v.begin(), v.end(), gen);
  return v;
}

// A fresh empty directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("kiln_test_" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Why a test on `device` ("cpu", "cuda:0") cannot run here, for its skip message ("cuda:0 is not
// present: device cuda:0 not found: ..."); "" when AvailableDevices() lists it.
inline std::string AbsentDeviceReason(const std::string& device) {
  const std::vector<std::string> present = AvailableDevices();
  if (std::find(present.begin(), present.end(), device) != present.end()) return "";
  return device + " is not present: " + std::string(ValidateDevice(device).message());
}

// A device name as the parameter part of a test's name: "cuda:0" -> "cuda_0".
inline std::string DeviceTestName(const std::string& device) {
  std::string out = device;
  for (char& c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return out;
}
// The name generator of a suite parameterised over device names.
inline std::string DeviceParamName(const ::testing::TestParamInfo<std::string>& info) {
  return DeviceTestName(info.param);
}

}  // namespace kiln::testing
