// The KServe v2 request the daemon tests send a deployed image model: `batch` images of 784
// UINT8 pixels (the toy dataset's and MNIST's 28x28), raw, under the input name "input".
#ifndef KILN_TESTS_SUPPORT_UINT8_INFER_REQUEST_H_
#define KILN_TESTS_SUPPORT_UINT8_INFER_REQUEST_H_

#include <string>
#include <utility>

#include "inference/grpc_service.pb.h"

namespace kiln::testing {

// `pixels` holds batch * 784 bytes.
inline inference::ModelInferRequest Uint8InferRequest(const std::string& model, int batch,
                                                      std::string pixels) {
  inference::ModelInferRequest request;
  request.set_model_name(model);
  auto* input = request.add_inputs();
  input->set_name("input");
  input->set_datatype("UINT8");
  input->add_shape(batch);
  input->add_shape(784);
  request.add_raw_input_contents(std::move(pixels));
  return request;
}

}  // namespace kiln::testing

#endif  // KILN_TESTS_SUPPORT_UINT8_INFER_REQUEST_H_
