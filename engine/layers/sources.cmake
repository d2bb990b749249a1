# The layers' sources, named once: kiln_model builds them (engine/CMakeLists.txt) and the fuzz
# build, which compiles the model's sources itself, takes the same list (tests/fuzz).
set(kiln_layer_sources
  parameter_init.cc
  linear.cc
  conv2d.cc
  relu.cc
  maxpool2d.cc
  flatten.cc
  dropout.cc
  batchnorm.cc
  softmax.cc
  activation.cc
  avgpool2d.cc
  add.cc
  concat.cc
  layernorm.cc
  embedding.cc
  attention.cc
)
