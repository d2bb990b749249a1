#include "server_test_support.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/support/connected_channel.h"
#include "tests/support/status_matchers.h"

namespace kiln::server::testing {
namespace fs = std::filesystem;
namespace {

void PutBigEndian32(std::string* out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out->push_back(static_cast<char>((v >> shift) & 0xff));
}

int LabelOf(int i, uint32_t seed) { return static_cast<int>((i * 7 + seed) % 10); }

}  // namespace

std::string MakeTempDir(const std::string& prefix) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string root = base != nullptr ? base : fs::temp_directory_path().string();
  std::string pattern = absl::StrCat(root, "/", prefix, "-XXXXXX");
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  char* made = mkdtemp(buffer.data());
  EXPECT_NE(made, nullptr) << pattern;
  return made != nullptr ? std::string(made) : pattern;
}

std::string ToyImagesIdx(int samples, uint32_t seed) {
  std::string out;
  PutBigEndian32(&out, 0x00000803);
  PutBigEndian32(&out, samples);
  PutBigEndian32(&out, 28);
  PutBigEndian32(&out, 28);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> noise(0, 60);
  for (int i = 0; i < samples; ++i) {
    const int label = LabelOf(i, seed);
    // Label k puts the block in cell (k / 4, k % 4) of a 4x4 grid of 7x7 cells.
    const int row0 = (label / 4) * 7, col0 = (label % 4) * 7;
    for (int r = 0; r < 28; ++r) {
      for (int c = 0; c < 28; ++c) {
        const bool on = r >= row0 && r < row0 + 7 && c >= col0 && c < col0 + 7;
        out.push_back(static_cast<char>(on ? 255 - noise(rng) : noise(rng)));
      }
    }
  }
  return out;
}

std::string ToyCifar10(int samples, uint32_t seed) {
  std::string out;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> noise(0, 60);
  for (int i = 0; i < samples; ++i) {
    const int label = LabelOf(i, seed);
    out.push_back(static_cast<char>(label));
    const int row0 = (label / 4) * 8, col0 = (label % 4) * 8;
    for (int ch = 0; ch < 3; ++ch) {
      for (int r = 0; r < 32; ++r) {
        for (int c = 0; c < 32; ++c) {
          const bool on = ch == label % 3 && r >= row0 && r < row0 + 8 && c >= col0 && c < col0 + 8;
          out.push_back(static_cast<char>(on ? 255 - noise(rng) : noise(rng)));
        }
      }
    }
  }
  return out;
}

std::string ToyLabelsIdx(int samples, uint32_t seed) {
  std::string out;
  PutBigEndian32(&out, 0x00000801);
  PutBigEndian32(&out, samples);
  for (int i = 0; i < samples; ++i) out.push_back(static_cast<char>(LabelOf(i, seed)));
  return out;
}

namespace {

// Deflates `pieces` (called until it returns false, each time filling `in`) into one gzip member.
std::string GzipPieces(const std::function<bool(std::string* in)>& pieces) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out, in;
  char buf[1 << 16];
  bool more = true;
  while (more) {
    in.clear();
    more = pieces(&in);
    z.next_in = reinterpret_cast<Bytef*>(in.data());
    z.avail_in = static_cast<uInt>(in.size());
    int rc;
    do {
      z.next_out = reinterpret_cast<Bytef*>(buf);
      z.avail_out = sizeof(buf);
      rc = deflate(&z, more ? Z_NO_FLUSH : Z_FINISH);
      out.append(buf, sizeof(buf) - z.avail_out);
    } while (z.avail_out == 0 || (!more && rc != Z_STREAM_END));
  }
  deflateEnd(&z);
  return out;
}

}  // namespace

std::string Gzip(const std::string& bytes) {
  return GzipPieces([&](std::string* in) {
    *in = bytes;
    return false;
  });
}

std::string GzippedZeroIdx(const std::vector<uint32_t>& dims) {
  std::string header;
  PutBigEndian32(&header, 0x00000800 | static_cast<uint32_t>(dims.size()));
  uint64_t left = 1;
  for (uint32_t d : dims) {
    PutBigEndian32(&header, d);
    left *= d;
  }
  bool header_sent = false;
  return GzipPieces([&](std::string* in) {
    if (!header_sent) {
      header_sent = true;
      *in = header;
      return true;
    }
    const uint64_t n = std::min<uint64_t>(left, 1 << 20);
    in->assign(n, '\0');
    left -= n;
    return left > 0;
  });
}

int64_t PeakRssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // in kB
  }
  ADD_FAILURE() << "no VmHWM in /proc/self/status";
  return 0;
}

void ResetPeakRss() {
  // "5" resets the peak RSS to the current RSS (Linux 4.0 and later).
  std::ofstream("/proc/self/clear_refs") << "5";
}

void WriteToyDataset(const std::string& dir, int train_samples, int test_samples, uint32_t seed) {
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
  };
  write("train-images-idx3-ubyte", ToyImagesIdx(train_samples, seed));
  write("train-labels-idx1-ubyte", ToyLabelsIdx(train_samples, seed));
  if (test_samples > 0) {
    write("t10k-images-idx3-ubyte", ToyImagesIdx(test_samples, seed + 1));
    write("t10k-labels-idx1-ubyte", ToyLabelsIdx(test_samples, seed + 1));
  }
}

v1::JobSpec GptSpec(const std::string& dataset, int vocab) {
  std::string layers = absl::StrCat(
      R"({"name": "wte", "embedding": {"num_embeddings": )", vocab, R"(, "embedding_dim": 32}},
          {"name": "wpe", "position_embedding": {"block_size": 16, "embedding_dim": 32}})");
  std::string last = "wpe";
  for (int b = 0; b < 2; ++b) {
    const std::string h = absl::StrCat("h.", b);
    layers += absl::StrCat(
        R"(, {"name": ")", h, R"(.ln_1", "layernorm": {"normalized_shape": 32}, "inputs": [")",
        last, R"("]},
        {"name": ")", h, R"(.attn", "causal_self_attention": {"n_head": 4, "n_embd": 32}},
        {"name": ")", h, R"(.res_1", "add": {}, "inputs": [")", last, R"(", ")", h, R"(.attn"]},
        {"name": ")", h, R"(.ln_2", "layernorm": {"normalized_shape": 32}},
        {"name": ")", h, R"(.mlp.c_fc", "linear": {"in_features": 32, "out_features": 128}},
        {"name": ")", h, R"(.mlp.gelu", "gelu": {}},
        {"name": ")", h, R"(.mlp.c_proj", "linear": {"in_features": 128, "out_features": 32}},
        {"name": ")", h, R"(.res_2", "add": {}, "inputs": [")", h, R"(.res_1", ")", h,
        R"(.mlp.c_proj"]})");
    last = h + ".res_2";
  }
  layers += absl::StrCat(R"(, {"name": "ln_f", "layernorm": {"normalized_shape": 32}},
      {"name": "lm_head", "linear": {"in_features": 32, "out_features": )", vocab,
                         R"(, "bias": false, "tie_weight": "wte"}})");
  const std::string json = absl::StrCat(
      R"({"model": {"input_shape": [16], "init": "INIT_RULE_GPT2", "layers": [)", layers,
      R"(]}, "optimizer": {"kind": "KIND_ADAMW", "lr": 0.001, "weight_decay": 0.1},
      "dataset": ")", dataset, R"(", "batch_size": 12, "max_iters": 1000, "eval_interval": 300,
      "eval_iters": 5, "gradient_accumulation_steps": 2, "grad_clip": 1.0})");
  v1::JobSpec spec;
  auto parsed = google::protobuf::util::JsonStringToMessage(json, &spec);
  EXPECT_TRUE(parsed.ok()) << parsed.ToString();
  return spec;
}

v1::JobSpec SmallSpec(const std::string& dataset, int epochs) {
  v1::JobSpec spec;
  spec.set_dataset(dataset);
  spec.set_epochs(epochs);
  spec.set_batch_size(32);
  spec.set_seed(7);
  spec.set_device("cpu");
  v1::ModelSpec* model = spec.mutable_model();
  model->add_input_shape(784);
  v1::LinearLayer* fc1 = model->add_layers()->mutable_linear();
  fc1->set_in_features(784);
  fc1->set_out_features(32);
  model->add_layers()->mutable_relu();
  v1::LinearLayer* fc2 = model->add_layers()->mutable_linear();
  fc2->set_in_features(32);
  fc2->set_out_features(10);
  v1::OptimizerSpec* opt = spec.mutable_optimizer();
  opt->set_kind(v1::OptimizerSpec::KIND_SGD);
  opt->set_lr(0.05f);
  opt->set_momentum(0.9f);
  return spec;
}

v1::JobSpec SmallColourSpec(const std::string& dataset, int epochs) {
  v1::JobSpec spec = SmallSpec(dataset, epochs);
  v1::ModelSpec* model = spec.mutable_model();
  model->Clear();
  for (int64_t d : {3, 32, 32}) model->add_input_shape(d);
  v1::Conv2dLayer* conv = model->add_layers()->mutable_conv2d();
  conv->set_in_channels(3);
  conv->set_out_channels(4);
  conv->set_kernel_size(3);
  conv->set_padding(1);
  model->add_layers()->mutable_relu();
  model->add_layers()->mutable_maxpool2d()->set_kernel_size(4);
  model->add_layers()->mutable_flatten();
  v1::LinearLayer* fc = model->add_layers()->mutable_linear();
  fc->set_in_features(4 * 8 * 8);
  fc->set_out_features(10);
  return spec;
}

bool WaitFor(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

WatchResult WatchToEnd(v1::Training::Stub& stub, const std::string& job_id, bool include_steps) {
  return WatchToEnd(stub, job_id, include_steps, absl::Seconds(120));
}

WatchResult WatchToEnd(v1::Training::Stub& stub, const std::string& job_id, bool include_steps,
                       absl::Duration deadline) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  request.set_include_steps(include_steps);
  auto reader = stub.WatchJob(&context, request);
  WatchResult result;
  v1::JobEvent event;
  while (reader->Read(&event)) result.events.push_back(event);
  result.status = reader->Finish();
  return result;
}

v1::Job GetJob(v1::Training::Stub& stub, const std::string& job_id) {
  grpc::ClientContext context;
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::Job job;
  grpc::Status status = stub.GetJob(&context, request, &job);
  EXPECT_OK(status) << status.error_message();
  return job;
}

bool WaitForState(v1::Training::Stub& stub, const std::string& job_id, v1::JobState state,
                  absl::Duration timeout) {
  return WaitFor([&] { return GetJob(stub, job_id).state() == state; }, timeout);
}

std::string SubmitJob(v1::Training::Stub& stub, const v1::JobSpec& spec) {
  grpc::ClientContext context;
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::Job job;
  grpc::Status status = stub.SubmitJob(&context, request, &job);
  EXPECT_OK(status) << "SubmitJob: " << status.error_message();
  return status.ok() ? job.id() : "";
}

grpc::Status Upload(v1::Training::Stub& stub, const std::string& name,
                    const std::vector<std::tuple<std::string, std::string, std::string>>& files,
                    v1::Dataset* out, v1::DatasetFormat format) {
  grpc::ClientContext context;
  auto writer = stub.UploadDataset(&context, out);
  v1::UploadDatasetRequest header;
  header.mutable_header()->set_name(name);
  header.mutable_header()->set_format(format);
  writer->Write(header);
  for (const auto& [file, bytes, sha] : files) {
    for (size_t offset = 0; offset < bytes.size(); offset += 50000) {
      v1::UploadDatasetRequest r;
      r.mutable_chunk()->set_file_name(file);
      r.mutable_chunk()->set_data(bytes.substr(offset, 50000));
      if (offset + 50000 >= bytes.size()) r.mutable_chunk()->set_sha256(sha);
      if (!writer->Write(r)) break;
    }
  }
  writer->WritesDone();
  return writer->Finish();
}

std::vector<v1::Checkpoint> ListCheckpoints(v1::Training::Stub& stub, const std::string& job_id) {
  grpc::ClientContext context;
  v1::ListCheckpointsRequest request;
  request.set_job_id(job_id);
  v1::ListCheckpointsResponse response;
  grpc::Status status = stub.ListCheckpoints(&context, request, &response);
  EXPECT_OK(status) << "ListCheckpoints " << job_id << ": " << status.error_message();
  return {response.checkpoints().begin(), response.checkpoints().end()};
}

std::unique_ptr<v1::Training::Stub> KilndProcess::NewStub() const {
  return v1::Training::NewStub(kiln::testing::ConnectedChannel(address()));
}

}  // namespace kiln::server::testing
