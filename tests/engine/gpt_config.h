// nanoGPT's GPT as a ModelConfig: token and position embeddings, n_layer pre-norm blocks
// (x + attn(ln_1(x)), then + mlp(ln_2(.)) with a 4 n_embd GELU MLP), ln_f and an lm_head without
// bias, named as nanoGPT's state dict ("h.0.attn", "lm_head"). For tests and benchmarks.
#pragma once

#include <string>

#include "engine/model/model_config.h"

namespace kiln::testing {

struct GptShape {
  int64_t vocab = 0, block_size = 0, n_layer = 0, n_head = 0, n_embd = 0;
  bool tied = false;  // lm_head's weight is wte's
};

inline ModelConfig GptConfig(const GptShape& g) {
  ModelConfig c{{g.block_size}, {}};
  auto node = [&](LayerConfig layer, const std::string& name, std::vector<std::string> in = {}) {
    c.layers.push_back(std::move(layer));
    c.names.push_back(name);
    c.inputs.push_back(std::move(in));
  };
  const int64_t d = g.n_embd;
  node(EmbeddingConfig{g.vocab, d}, "wte");
  node(PositionEmbeddingConfig{g.block_size, d}, "wpe");
  std::string x = "wpe";
  for (int64_t l = 0; l < g.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l);
    node(LayerNormConfig{d}, h + ".ln_1", {x});
    node(CausalSelfAttentionConfig{g.n_head, d}, h + ".attn");
    node(AddConfig{}, h + ".res_1", {x, h + ".attn"});
    node(LayerNormConfig{d}, h + ".ln_2");
    node(LinearConfig{d, 4 * d}, h + ".mlp.c_fc");
    node(GeluConfig{}, h + ".mlp.gelu");
    node(LinearConfig{4 * d, d}, h + ".mlp.c_proj");
    node(AddConfig{}, h + ".res_2", {h + ".res_1", h + ".mlp.c_proj"});
    x = h + ".res_2";
  }
  node(LayerNormConfig{d}, "ln_f", {x});
  LinearConfig head{d, g.vocab};
  head.bias = false;
  if (g.tied) head.tie_weight = "wte";
  node(head, "lm_head");
  return c;
}

}  // namespace kiln::testing
