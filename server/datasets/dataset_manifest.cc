#include "server/datasets/dataset_manifest.h"

#include <fstream>
#include <sstream>

#include "common/atomic_file.h"
#include "nlohmann/json.hpp"

namespace kiln::server {
namespace {

using nlohmann::json;

constexpr int kFormat = 1;
// A manifest is a few hundred bytes; anything much larger is not ours.
constexpr std::streamsize kMaxManifestBytes = 64 << 10;

}  // namespace

absl::Status WriteDatasetManifest(const std::string& dir, const DatasetInfo& info,
                                  const DatasetFileSizes& files) {
  json j = {{"format", kFormat},
            {"train_samples", info.train_samples},
            {"test_samples", info.test_samples},
            {"sample_shape", info.sample_shape},
            {"num_classes", info.num_classes},
            {"data_format", std::string(DatasetFormatName(info.format))},
            {"files", files}};
  if (info.format == DatasetFormat::kCsv) {
    const char* header = info.csv.header == CsvHeader::kPresent  ? "present"
                         : info.csv.header == CsvHeader::kAbsent ? "absent"
                                                                 : "auto";
    j["csv"] = {{"label_column", info.csv.label_column},
                {"header", header},
                {"test_fraction", info.csv.test_fraction}};
  }
  if (IsTokenFormat(info.format)) {
    j["tokens"] = {{"train", info.train_tokens},
                   {"val", info.val_tokens},
                   {"vocab_size", info.vocab_size},
                   {"max_token", info.max_token}};
  }
  return WriteFileAtomically(dir + "/" + kDatasetManifestName, j.dump(2) + "\n");
}

std::optional<DatasetInfo> ReadDatasetManifest(const std::string& dir,
                                               const DatasetFileSizes& files) {
  std::ifstream in(dir + "/" + kDatasetManifestName, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text(kMaxManifestBytes + 1, '\0');
  in.read(text.data(), kMaxManifestBytes + 1);
  if (in.gcount() > kMaxManifestBytes) return std::nullopt;
  text.resize(static_cast<size_t>(in.gcount()));
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  // Any field of the wrong type makes the manifest unusable; the facts are then read afresh.
  try {
    if (j.at("format").get<int>() != kFormat) return std::nullopt;
    if (j.at("files").get<DatasetFileSizes>() != files) return std::nullopt;
    DatasetInfo info;
    info.train_samples = j.at("train_samples").get<int64_t>();
    info.test_samples = j.at("test_samples").get<int64_t>();
    info.sample_shape = j.at("sample_shape").get<Shape>();
    info.num_classes = j.at("num_classes").get<int32_t>();
    // Manifests written before formats existed describe IDX folders.
    if (j.contains("data_format")) {
      std::optional<DatasetFormat> format =
          DatasetFormatFromName(j.at("data_format").get<std::string>());
      if (!format) return std::nullopt;
      info.format = *format;
    }
    if (info.format == DatasetFormat::kCsv) {
      const json& csv = j.at("csv");
      info.csv.label_column = csv.at("label_column").get<std::string>();
      const std::string header = csv.at("header").get<std::string>();
      if (header == "present") {
        info.csv.header = CsvHeader::kPresent;
      } else if (header == "absent") {
        info.csv.header = CsvHeader::kAbsent;
      } else if (header != "auto") {
        return std::nullopt;
      }
      info.csv.test_fraction = csv.at("test_fraction").get<double>();
    }
    if (IsTokenFormat(info.format)) {
      const json& tokens = j.at("tokens");
      info.train_tokens = tokens.at("train").get<int64_t>();
      info.val_tokens = tokens.at("val").get<int64_t>();
      info.vocab_size = tokens.at("vocab_size").get<int32_t>();
      info.max_token = tokens.at("max_token").get<int32_t>();
    }
    return info;
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

}  // namespace kiln::server
