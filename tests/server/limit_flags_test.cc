// kilnd's --max_* flags reach the checks they name: each limit, set low on the command line,
// refuses what is over it with the limit and the value in the message.
#include <grpcpp/grpcpp.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server_test_support.h"

namespace kiln::server {
namespace {

using ::testing::HasSubstr;

TEST(LimitFlagsTest, LimitsSetOnTheCommandLineRefuseWhatIsOverThem) {
  const std::string root = testing::MakeTempDir("kilnd-limits");
  testing::WriteToyDataset(root + "/data/toy", 64, 16);
  testing::KilndProcess kilnd(
      root + "/state", root + "/data",
      {"--metrics_listen=", "--max_layers=2", "--max_epochs=3", "--max_batch_size=16",
       "--max_parameters=1000", "--max_message_bytes=4096"});
  ASSERT_TRUE(kilnd.Start());
  auto stub = kilnd.NewStub();
  auto submit = [&](const v1::JobSpec& spec) {
    grpc::ClientContext context;
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::Job job;
    return stub->SubmitJob(&context, request, &job);
  };
  struct Case {
    const char* name;
    std::function<void(v1::JobSpec&)> mutate;
    grpc::StatusCode code;
    const char* fragment;
  };
  const Case cases[] = {
      {"layers", [](v1::JobSpec&) {}, grpc::RESOURCE_EXHAUSTED,
       "3 layers exceed the limit of 2 (--max_layers)"},
      {"epochs",
       [](v1::JobSpec& s) {
         s.mutable_model()->mutable_layers()->RemoveLast();
         s.set_epochs(4);
       },
       grpc::INVALID_ARGUMENT, "spec.epochs: must be in [1, 3], got 4"},
      {"batch",
       [](v1::JobSpec& s) {
         s.mutable_model()->mutable_layers()->RemoveLast();
         s.set_batch_size(17);
       },
       grpc::INVALID_ARGUMENT, "spec.batch_size: must be in [1, 16], got 17"},
      {"parameters",
       [](v1::JobSpec& s) {
         s.mutable_model()->mutable_layers()->RemoveLast();
         s.set_batch_size(16);
       },
       grpc::RESOURCE_EXHAUSTED, "parameters exceed the limit of 1000 (--max_parameters)"},
      {"message", [](v1::JobSpec& s) { s.set_dataset(std::string(5000, 'x')); },
       grpc::RESOURCE_EXHAUSTED, "larger than max"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::JobSpec spec = testing::SmallSpec("toy", 1);
    c.mutate(spec);
    grpc::Status status = submit(spec);
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.fragment));
  }
}

// A job is refused before it starts when its memory plan is over --max_job_memory_bytes, with the
// need, its largest part and the layer named; a conv with a large kernel and padding once got
// through every other limit and took kilnd down with std::bad_alloc.
TEST(LimitFlagsTest, AJobWhoseMemoryPlanIsOverTheLimitIsRefusedNamingTheLayer) {
  const std::string root = testing::MakeTempDir("kilnd-limits");
  testing::WriteToyDataset(root + "/data/toy", 64, 16);
  testing::KilndProcess kilnd(root + "/state", root + "/data",
                              {"--metrics_listen=", "--max_job_memory_bytes=12000000"});
  ASSERT_TRUE(kilnd.Start());
  auto stub = kilnd.NewStub();
  auto submit = [&](const v1::JobSpec& spec) {
    grpc::ClientContext context;
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::Job job;
    return stub->SubmitJob(&context, request, &job);
  };
  // 28x28 input, a 28x28 kernel padded by 27: 784 x 3025 im2col columns, twice over in the
  // backward, per thread.
  v1::JobSpec wide = testing::SmallSpec("toy", 1);
  v1::ModelSpec* model = wide.mutable_model();
  model->clear_layers();
  model->clear_input_shape();
  for (int d : {1, 28, 28}) model->add_input_shape(d);
  v1::Conv2dLayer* conv = model->add_layers()->mutable_conv2d();
  conv->set_in_channels(1);
  conv->set_out_channels(1);
  conv->set_kernel_size(28);
  conv->set_padding(27);
  model->add_layers()->mutable_maxpool2d()->set_kernel_size(5);
  model->add_layers()->mutable_flatten();
  v1::LinearLayer* fc = model->add_layers()->mutable_linear();
  fc->set_in_features(121);
  fc->set_out_features(10);
  grpc::Status status = submit(wide);
  EXPECT_EQ(status.error_code(), grpc::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("(the most: layer 0 conv2d workspace: "));
  EXPECT_THAT(status.error_message(), HasSubstr("over the limit of 11.4 MiB (12000000 bytes, "
                                                "--max_job_memory_bytes)"));
  // What fits goes through.
  EXPECT_TRUE(submit(testing::SmallSpec("toy", 1)).ok());
}

TEST(LimitFlagsTest, ANonPositiveLimitStopsKilndAtStart) {
  const std::string root = testing::MakeTempDir("kilnd-limits");
  testing::KilndProcess kilnd(root + "/state", root + "/data",
                              {"--metrics_listen=", "--max_streams=0"});
  EXPECT_FALSE(kilnd.Start()) << "kilnd started with --max_streams=0";
}

TEST(LimitFlagsTest, ConnectionLimitsOutOfRangeStopKilndAtStart) {
  const std::string root = testing::MakeTempDir("kilnd-limits");
  for (const char* flag :
       {"--max_connections=0", "--reserved_descriptors=-1", "--reserved_descriptors=100000000",
        "--connection_handshake_timeout=0s", "--connection_idle_timeout=0s"}) {
    testing::KilndProcess kilnd(root + "/state", root + "/data", {"--metrics_listen=", flag});
    EXPECT_FALSE(kilnd.Start()) << "kilnd started with " << flag;
  }
}

}  // namespace
}  // namespace kiln::server
