// kiln-bench-attention: causal self-attention's core (head split, QK^T, causal softmax, times V,
// head merge; forward and backward) on the CPU backend's sequence ops, at nanoGPT's small CPU
// shape (B 12, T 64, H 4, hd 32) and a GPU-sized one (B 12, T 256, H 6, hd 64). Usage:
// kiln-bench-attention THREADS [REPEATS]; prints the medians. Its peer, the same computation in
// PyTorch: bench/torch_attention_peer.py THREADS. The projections around it (plain GEMMs) are
// not timed: this is what the sequence ops add.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include "common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
namespace kiln {
class CausalAttention {
 public:
  CausalAttention(Backend& backend, int batch, int t, int heads, int head_dim)
      : be_(backend),
        b_(batch),
        t_(t),
        h_(heads),
        hd_(head_dim),
        head_(int64_t{batch} * heads * t * head_dim),
        split_(3 * head_),
        scratch_(3 * head_),
        weights_(int64_t{batch} * heads * t * t),
        dweights_(weights_.size()),
        out_(head_),
        dsplit_(3 * head_) {}

  float scale() const { return 1.0f / std::sqrt(static_cast<float>(hd_)); }
  const std::vector<float>& weights() const { return weights_; }

  absl::Status Forward(const float* qkv, float* y) {
    const int64_t c = int64_t{h_} * hd_, rows = int64_t{b_} * t_, bh = int64_t{b_} * h_;
    KILN_RETURN_IF_ERROR(be_.Transpose0213(1, rows, 3, c, qkv, scratch_.data()));
    KILN_RETURN_IF_ERROR(be_.Transpose0213(3 * b_, t_, h_, hd_, scratch_.data(), split_.data()));
    const float *q = split_.data(), *k = q + head_, *v = k + head_;
    const int64_t mat = int64_t{t_} * hd_, sq = int64_t{t_} * t_;
    KILN_RETURN_IF_ERROR(be_.GemmStridedBatched(Transpose::kNo, Transpose::kYes, t_, t_, hd_, 1, q,
                                                mat, k, mat, 0, weights_.data(), sq, bh));
    KILN_RETURN_IF_ERROR(
        be_.CausalSoftmaxForward(bh, t_, scale(), weights_.data(), weights_.data()));
    KILN_RETURN_IF_ERROR(be_.GemmStridedBatched(Transpose::kNo, Transpose::kNo, t_, hd_, t_, 1,
                                                weights_.data(), sq, v, mat, 0, out_.data(), mat,
                                                bh));
    return be_.Transpose0213(b_, h_, t_, hd_, out_.data(), y);
  }

  // dqkv from dy (B, T, H, hd), after Forward.
  absl::Status Backward(const float* dy, float* dqkv) {
    const int64_t c = int64_t{h_} * hd_, rows = int64_t{b_} * t_, bh = int64_t{b_} * h_;
    const int64_t mat = int64_t{t_} * hd_, sq = int64_t{t_} * t_;
    const float *q = split_.data(), *k = q + head_, *v = k + head_;
    float *dq = dsplit_.data(), *dk = dq + head_, *dv = dk + head_;
    float* dout = out_.data();  // the forward's output is not needed again
    KILN_RETURN_IF_ERROR(be_.Transpose0213(b_, t_, h_, hd_, dy, dout));
    KILN_RETURN_IF_ERROR(be_.GemmStridedBatched(Transpose::kNo, Transpose::kYes, t_, t_, hd_, 1,
                                                dout, mat, v, mat, 0, dweights_.data(), sq, bh));
    KILN_RETURN_IF_ERROR(be_.GemmStridedBatched(Transpose::kYes, Transpose::kNo, t_, hd_, t_, 1,
                                                weights_.data(), sq, dout, mat, 0, dv, mat, bh));
    KILN_RETURN_IF_ERROR(be_.CausalSoftmaxBackward(bh, t_, scale(), weights_.data(),
                                                   dweights_.data(), dweights_.data()));
    KILN_RETURN_IF_ERROR(be_.GemmStridedBatched(Transpose::kNo, Transpose::kNo, t_, hd_, t_, 1,
                                                dweights_.data(), sq, k, mat, 0, dq, mat, bh));
    KILN_RETURN_IF_ERROR(be_.GemmStridedBatched(Transpose::kYes, Transpose::kNo, t_, hd_, t_, 1,
                                                dweights_.data(), sq, q, mat, 0, dk, mat, bh));
    KILN_RETURN_IF_ERROR(be_.Transpose0213(3 * b_, h_, t_, hd_, dsplit_.data(), scratch_.data()));
    return be_.Transpose0213(1, 3, rows, c, scratch_.data(), dqkv);
  }

 private:
  Backend& be_;
  const int b_, t_, h_, hd_;
  const int64_t head_;  // the values of one of q, k, v
  std::vector<float> split_, scratch_, weights_, dweights_, out_, dsplit_;
};


}  // namespace kiln
using namespace kiln;
int main(int argc, char** argv) {
  if (argc < 2 || atoi(argv[1]) < 1) {
    fprintf(stderr, "usage: kiln-bench-attention THREADS [REPEATS]\n");
    return 2;
  }
  const int threads = atoi(argv[1]);
  const int reps = argc > 2 ? atoi(argv[2]) : 15;
  CpuBackend cpu(threads);
  cpu.BindCallingThread();
  struct S { int b, t, h, hd; };
  for (S s : {S{12, 64, 4, 32}, S{12, 256, 6, 64}}) {
    const int64_t n = int64_t{s.b} * s.t * s.h * s.hd;
    std::mt19937 gen(1);
    std::normal_distribution<float> dist;
    std::vector<float> qkv(3 * n), dy(n), y(n), dqkv(3 * n);
    for (float& v : qkv) v = dist(gen);
    for (float& v : dy) v = dist(gen);
    CausalAttention att(cpu, s.b, s.t, s.h, s.hd);
    using clk = std::chrono::steady_clock;
    auto step = [&](double* fwd, double* bwd) {
      auto t0 = clk::now();
      if (!att.Forward(qkv.data(), y.data()).ok()) abort();
      auto t1 = clk::now();
      if (!att.Backward(dy.data(), dqkv.data()).ok()) abort();
      auto t2 = clk::now();
      *fwd += std::chrono::duration<double, std::milli>(t1 - t0).count();
      *bwd += std::chrono::duration<double, std::milli>(t2 - t1).count();
    };
    double f = 0, b = 0;
    for (int i = 0; i < 5; ++i) step(&f, &b);
    std::vector<double> fs, bs, ts;
    for (int r = 0; r < reps; ++r) {
      f = b = 0;
      for (int i = 0; i < 5; ++i) step(&f, &b);
      fs.push_back(f / 5); bs.push_back(b / 5); ts.push_back((f + b) / 5);
    }
    auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
    printf("kiln cpu threads %d B=%d T=%d H=%d hd=%d: fwd %.3f ms, bwd %.3f ms, fwd+bwd median %.3f ms (min %.3f)\n",
           threads, s.b, s.t, s.h, s.hd, med(fs), med(bs), med(ts), *std::min_element(ts.begin(), ts.end()));
  }
}
