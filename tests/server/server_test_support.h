// Shared pieces of the kilnd tests: tiny generated IDX datasets, a small job spec, waiting, event
// collection, and a kilnd subprocess.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/time/time.h"
#include "kiln/v1/training.grpc.pb.h"
#include "tests/support/kilnd_child.h"

namespace kiln::server::testing {

// A fresh folder under the test's temporary directory.
std::string MakeTempDir(const std::string& prefix);

// Writes the four MNIST IDX files into `dir` (created if needed): 28x28 images whose label (0..9)
// is where a bright 7x7 block sits, plus noise, so a small MLP learns it in a few epochs.
void WriteToyDataset(const std::string& dir, int train_samples, int test_samples,
                     uint32_t seed = 1);
// The bytes of one IDX file as WriteToyDataset writes it (for uploads).
std::string ToyImagesIdx(int samples, uint32_t seed);
std::string ToyLabelsIdx(int samples, uint32_t seed);
// A CIFAR-10 batch of `samples` records: label k (LabelOf, 0..9) puts a bright 8x8 block in cell
// (k / 4, k % 4) of channel k % 3, over noise, so a small CNN learns it in a few epochs.
std::string ToyCifar10(int samples, uint32_t seed);
// `bytes` as one gzip member.
std::string Gzip(const std::string& bytes);
// A gzip file of an unsigned-byte IDX array of `dims`, all zeros: a few hundred KB that inflate
// to the product of dims bytes (a gzip bomb). Built in pieces, so making it costs little memory.
std::string GzippedZeroIdx(const std::vector<uint32_t>& dims);

// The process's peak resident memory (VmHWM) in bytes since the last ResetPeakRss().
int64_t PeakRssBytes();
void ResetPeakRss();

// A 784-32-10 MLP with SGD on `dataset`, batch 32.
v1::JobSpec SmallSpec(const std::string& dataset, int epochs);
// A 2-block character GPT as a user writes it (nanoGPT's names; block 16, d 32, 4 heads, tied
// lm_head over `vocab` tokens), AdamW, 1,000 iterations in intervals of 300, on `dataset`.
v1::JobSpec GptSpec(const std::string& dataset, int vocab);
// A CNN on 3x32x32 images (conv 3->4, relu, maxpool 4, flatten, linear 256->10), SGD, batch 32.
v1::JobSpec SmallColourSpec(const std::string& dataset, int epochs);

// Polls `done` every 10 ms until it holds or `timeout` passes; returns whether it held.
bool WaitFor(const std::function<bool()>& done, absl::Duration timeout);

// Reads a WatchJob stream to its end.
struct WatchResult {
  std::vector<v1::JobEvent> events;
  grpc::Status status;
};
WatchResult WatchToEnd(v1::Training::Stub& stub, const std::string& job_id,
                       bool include_steps = false);
// The same with a deadline of the caller's choosing (the one above allows 120 s).
WatchResult WatchToEnd(v1::Training::Stub& stub, const std::string& job_id, bool include_steps,
                       absl::Duration deadline);

// Polls GetJob until the job is in `state`.
bool WaitForState(v1::Training::Stub& stub, const std::string& job_id, v1::JobState state,
                  absl::Duration timeout);
v1::Job GetJob(v1::Training::Stub& stub, const std::string& job_id);

// SubmitJob; the new job's id, or "" (and a test failure naming the error) when refused.
std::string SubmitJob(v1::Training::Stub& stub, const v1::JobSpec& spec);
// Sends one UploadDataset: a header naming `name`, then each file's chunks of 50,000 bytes with
// the sha256 to claim on the last; `files` are (file name, bytes, sha256) in order.
grpc::Status Upload(v1::Training::Stub& stub, const std::string& name,
                    const std::vector<std::tuple<std::string, std::string, std::string>>& files,
                    v1::Dataset* out, v1::DatasetFormat format = v1::DATASET_FORMAT_UNSPECIFIED);
// ListCheckpoints of a job, oldest first (a test failure when the call fails).
std::vector<v1::Checkpoint> ListCheckpoints(v1::Training::Stub& stub, const std::string& job_id);

// kilnd as a child (tests/support/kilnd_child.h) on the given folders, /metrics off unless
// `extra_args` turn it on.
class KilndProcess : public kiln::testing::KilndChild {
 public:
  KilndProcess(std::string state_dir, std::string data_dir, std::vector<std::string> extra_args)
      : state_dir_(std::move(state_dir)),
        data_dir_(std::move(data_dir)),
        extra_args_(std::move(extra_args)) {}
  bool Start() { return KilndChild::Start(state_dir_, data_dir_, extra_args_); }
  // A Training stub on a channel connected to it.
  std::unique_ptr<v1::Training::Stub> NewStub() const;

 private:
  std::string state_dir_, data_dir_;
  std::vector<std::string> extra_args_;
};

}  // namespace kiln::server::testing
