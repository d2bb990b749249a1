// Every layer kiln has, for the model's dispatch on a LayerConfig: each header declares the
// layer's OutputShape, ParameterCount and MakeLayer (engine/layers/layer.h). A new layer adds its
// config to model_config.h's LayerConfig, its own files, and one line here.
#pragma once

#include "engine/layers/activation.h"
#include "engine/layers/add.h"
#include "engine/layers/attention.h"
#include "engine/layers/avgpool2d.h"
#include "engine/layers/batchnorm.h"
#include "engine/layers/concat.h"
#include "engine/layers/conv2d.h"
#include "engine/layers/dropout.h"
#include "engine/layers/embedding.h"
#include "engine/layers/flatten.h"
#include "engine/layers/layernorm.h"
#include "engine/layers/linear.h"
#include "engine/layers/maxpool2d.h"
#include "engine/layers/relu.h"
#include "engine/layers/softmax.h"
