// CudaBackend's sequence ops (transformers) with their kernels: layer normalisation, the
// embedding lookup and its scatter-add, strided batched GEMM (cuBLAS), the fused scaled causal
// softmax, and the 0213 transpose that splits attention heads out and merges them back.
// Reductions run in a fixed order and no float is accumulated with atomics, so every run gives
// the same bits; the embedding ops and the transpose match the CPU bit for bit.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "engine/backend_checks.h"
#include "engine/cuda/cublas_library.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/device_math.cuh"

namespace kiln::cuda_kernels {

namespace {

// Rows of up to this many values are one warp's; longer rows get a block of kThreads each.
constexpr int kWarpRowMax = 1024;
constexpr int kWarpsPerBlock = kThreads / kWarp;
// Row kernels loop over rows; more blocks than this add nothing.
constexpr int64_t kMaxRowBlocks = 65535;

unsigned RowGrid(int64_t rows, int rows_per_block) {
  return static_cast<unsigned>(
      std::min<int64_t>((rows + rows_per_block - 1) / rows_per_block, kMaxRowBlocks));
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// BlockSum (a fixed tree), returned to every thread of the block.
__device__ __forceinline__ float BlockAllSum(float v) {
  __shared__ float total;
  v = BlockSum(v);
  if (threadIdx.x == 0) total = v;
  __syncthreads();
  const float result = total;
  __syncthreads();  // all have read `total` before a later call writes it
  return result;
}

// The maximum over a block of kThreads threads, returned to every thread.
__device__ __forceinline__ float BlockAllMax(float v) {
  __shared__ float partial[kWarpsPerBlock];
  __shared__ float total;
  __syncthreads();  // a previous call's partials may still be being read
  v = WarpMax(v);
  if (threadIdx.x % kWarp == 0) partial[threadIdx.x / kWarp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = partial[0];
    for (int w = 1; w < kWarpsPerBlock; ++w) m = fmaxf(m, partial[w]);
    total = m;
  }
  __syncthreads();
  const float result = total;
  __syncthreads();
  return result;
}

// Who shares a row: one warp (kWarpsPerBlock rows per block) or a whole block of kThreads.
// Rows are dealt out in a grid-stride loop; the row is the same for the whole team, so a team's
// reductions are always called by all of its threads.
template <bool kBlock>
struct RowTeam {
  static constexpr int kSize = kBlock ? kThreads : kWarp;
  static constexpr int kRowsPerBlock = kBlock ? 1 : kWarpsPerBlock;
  __device__ static int Rank() { return kBlock ? threadIdx.x : threadIdx.x % kWarp; }
  __device__ static int64_t FirstRow() {
    return static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (kBlock ? 0 : threadIdx.x / kWarp);
  }
  __device__ static int64_t RowStride() { return static_cast<int64_t>(gridDim.x) * kRowsPerBlock; }
  __device__ static float Sum(float v) {
    if constexpr (kBlock) {
      return BlockAllSum(v);
    } else {
      return WarpSum(v);
    }
  }
};

// --- layer normalisation ---------------------------------------------------------------------

// x, y (rows, cols); mean, rstd (rows). Two passes over the row (the mean, then the squared
// deviations from it), then y; y may be x (each thread rewrites only what it read, after both
// reductions).
template <bool kBlock>
__global__ void layernorm_forward_kernel(int64_t rows, int cols, float eps, const float* x,
                                         const float* gamma, const float* beta, float* y,
                                         float* mean, float* rstd) {
  using Team = RowTeam<kBlock>;
  const float n = static_cast<float>(cols);
  for (int64_t row = Team::FirstRow(); row < rows; row += Team::RowStride()) {
    const float* xr = x + row * cols;
    float sum = 0.0f;
    for (int c = Team::Rank(); c < cols; c += Team::kSize) sum += xr[c];
    const float mu = Team::Sum(sum) / n;
    float squares = 0.0f;
    for (int c = Team::Rank(); c < cols; c += Team::kSize) {
      const float d = xr[c] - mu;
      squares += d * d;
    }
    const float rs = 1.0f / sqrtf(Team::Sum(squares) / n + eps);
    if (Team::Rank() == 0) {
      if (mean != nullptr) mean[row] = mu;
      if (rstd != nullptr) rstd[row] = rs;
    }
    float* yr = y + row * cols;
    for (int c = Team::Rank(); c < cols; c += Team::kSize) {
      float v = (xr[c] - mu) * rs;
      if (gamma != nullptr) v *= gamma[c];
      if (beta != nullptr) v += beta[c];
      yr[c] = v;
    }
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) per row, g = dy * gamma (dy without gamma),
// xhat = (x - mean) * rstd. dx may be dy or x (each thread rewrites only what it read, after the
// reductions).
template <bool kBlock>
__global__ void layernorm_backward_dx_kernel(int64_t rows, int cols, const float* x,
                                             const float* gamma, const float* mean,
                                             const float* rstd, const float* dy, float* dx) {
  using Team = RowTeam<kBlock>;
  const float n = static_cast<float>(cols);
  for (int64_t row = Team::FirstRow(); row < rows; row += Team::RowStride()) {
    const int64_t base = row * cols;
    const float mu = mean[row], rs = rstd[row];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int c = Team::Rank(); c < cols; c += Team::kSize) {
      const float xhat = (x[base + c] - mu) * rs;
      const float g = gamma != nullptr ? dy[base + c] * gamma[c] : dy[base + c];
      sum_g += g;
      sum_gx += g * xhat;
    }
    const float mean_g = Team::Sum(sum_g) / n;
    const float mean_gx = Team::Sum(sum_gx) / n;
    for (int c = Team::Rank(); c < cols; c += Team::kSize) {
      const float xhat = (x[base + c] - mu) * rs;
      const float g = gamma != nullptr ? dy[base + c] * gamma[c] : dy[base + c];
      dx[base + c] = rs * (g - mean_g - xhat * mean_gx);
    }
  }
}

// dgamma and dbeta in two deterministic steps: block (kWarp columns) x (kWarpsPerBlock row
// groups) sums its columns over one chunk of rows (row group g takes rows g, g + 8, ... of the
// chunk, then the groups are added in order) into partial(chunk, cols); then
// layernorm_param_final_kernel adds the chunks in order. The chunks depend on rows alone.
constexpr int kMaxParamChunks = 128;
constexpr int64_t kMinParamChunkRows = 64;

int64_t ParamChunkRows(int64_t rows) {
  return std::max(kMinParamChunkRows, (rows + kMaxParamChunks - 1) / kMaxParamChunks);
}
int ParamChunks(int64_t rows) {
  const int64_t per = ParamChunkRows(rows);
  return static_cast<int>((rows + per - 1) / per);
}

__global__ void layernorm_param_partial_kernel(int64_t rows, int cols, int64_t chunk_rows,
                                               const float* x, const float* mean, const float* rstd,
                                               const float* dy, float* partial_gamma,
                                               float* partial_beta) {
  __shared__ float sum_gamma[kWarpsPerBlock][kWarp];
  __shared__ float sum_beta[kWarpsPerBlock][kWarp];
  const int col = blockIdx.x * kWarp + threadIdx.x, group = threadIdx.y;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
  float g = 0.0f, b = 0.0f;
  if (col < cols) {
    for (int64_t r = begin + group; r < end; r += kWarpsPerBlock) {
      const int64_t i = r * cols + col;
      const float d = dy[i];
      g += d * ((x[i] - mean[r]) * rstd[r]);
      b += d;
    }
  }
  sum_gamma[group][threadIdx.x] = g;
  sum_beta[group][threadIdx.x] = b;
  __syncthreads();
  if (group == 0 && col < cols) {
    float tg = 0.0f, tb = 0.0f;
    for (int k = 0; k < kWarpsPerBlock; ++k) {
      tg += sum_gamma[k][threadIdx.x];
      tb += sum_beta[k][threadIdx.x];
    }
    const int64_t p = static_cast<int64_t>(blockIdx.y) * cols + col;
    if (partial_gamma != nullptr) partial_gamma[p] = tg;
    if (partial_beta != nullptr) partial_beta[p] = tb;
  }
}

__global__ void layernorm_param_final_kernel(int cols, int chunks, const float* partial_gamma,
                                             const float* partial_beta, float* dgamma,
                                             float* dbeta) {
  for (int64_t col = GlobalThread(); col < cols; col += GridThreads()) {
    if (dgamma != nullptr) {
      float total = 0.0f;
      for (int k = 0; k < chunks; ++k) total += partial_gamma[static_cast<int64_t>(k) * cols + col];
      dgamma[col] += total;
    }
    if (dbeta != nullptr) {
      float total = 0.0f;
      for (int k = 0; k < chunks; ++k) total += partial_beta[static_cast<int64_t>(k) * cols + col];
      dbeta[col] += total;
    }
  }
}

// --- embedding -------------------------------------------------------------------------------

// y(count, dim) = table rows by id, zero for an id out of range; kVec = 4 moves float4s (dim % 4
// == 0 and both pointers 16-byte aligned), dim_vecs = dim / kVec.
template <int kVec>
__global__ void embedding_forward_kernel(int64_t n, int vocab, int dim_vecs, const int32_t* ids,
                                         const float* table, float* y) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const int64_t row = i / dim_vecs;
    const int64_t v = i - row * dim_vecs;
    const int32_t id = ids[row];
    const bool in_range = id >= 0 && id < vocab;
    if constexpr (kVec == 4) {
      reinterpret_cast<float4*>(y)[i] =
          in_range ? reinterpret_cast<const float4*>(table)[static_cast<int64_t>(id) * dim_vecs + v]
                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    } else {
      y[i] = in_range ? table[static_cast<int64_t>(id) * dim_vecs + v] : 0.0f;
    }
  }
}

// The backward sorts (id, position) pairs by id with a stable radix sort, so each id's positions
// stay in index order; ids out of range become the key `vocab`, which sorts last and is skipped.
__global__ void embedding_sort_input_kernel(int64_t count, int vocab, const int32_t* ids,
                                            uint32_t* keys, int64_t* positions) {
  for (int64_t i = GlobalThread(); i < count; i += GridThreads()) {
    const int32_t id = ids[i];
    keys[i] = static_cast<uint32_t>(id >= 0 && id < vocab ? id : vocab);
    positions[i] = i;
  }
}

// Sorted item s starts a run of one id when its key differs from item s - 1's; the block that
// takes it adds the run's dy rows, in position order, onto that table row (one column per
// thread), as the CPU's `dtable[id] += dy[i]` for i = 0, 1, ... does. Items are dealt to blocks
// in a grid-stride loop; the test at the top is the same for the whole block.
__global__ void embedding_backward_kernel(int64_t count, int vocab, int dim, const uint32_t* keys,
                                          const int64_t* positions, const float* dy,
                                          float* dtable) {
  for (int64_t s = blockIdx.x; s < count; s += gridDim.x) {
    const uint32_t key = keys[s];
    if (key >= static_cast<uint32_t>(vocab) || (s > 0 && keys[s - 1] == key)) continue;
    float* row = dtable + static_cast<int64_t>(key) * dim;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
      float acc = row[c];
      for (int64_t p = s; p < count && keys[p] == key; ++p) acc += dy[positions[p] * dim + c];
      row[c] = acc;
    }
  }
}

// --- causal softmax --------------------------------------------------------------------------
// The backward's row r of the (batch * t, t) scores is query position r % t: columns 0..i kept.

// One warp per row, the row's kept scores in registers (kPerLane * kWarp >= keys). y may be x: the
// whole row is read before any of it is written. Rows are (queries, keys) matrices' rows; row r
// is query position i = offset + r % queries, which keeps columns 0..i (offset 0 and
// queries = keys = t for a whole sequence).
template <int kPerLane>
__global__ void causal_softmax_forward_warp_kernel(int64_t rows, int queries, int keys, int offset,
                                                   float scale, const float* x, float* y) {
  using Team = RowTeam<false>;
  const int lane = Team::Rank();
  for (int64_t row = Team::FirstRow(); row < rows; row += Team::RowStride()) {
    const int i = offset + static_cast<int>(row % queries);
    const float* xr = x + row * keys;
    float* yr = y + row * keys;
    float v[kPerLane];
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + k * kWarp;
      v[k] = j <= i ? __fmul_rn(scale, xr[j]) : -INFINITY;
      mx = fmaxf(mx, v[k]);
    }
    mx = WarpMax(mx);
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + k * kWarp;
      v[k] = j <= i ? expf(v[k] - mx) : 0.0f;
      sum += v[k];
    }
    const float inv = 1.0f / WarpSum(sum);
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + k * kWarp;
      if (j < keys) yr[j] = v[k] * inv;  // 0 past the query's position
    }
  }
}

// One block per row for keys > kWarpRowMax: three passes over the row (max, sum, write), each
// thread on the same columns in every pass, so y may be x. Rows as the warp kernel's.
__global__ void causal_softmax_forward_block_kernel(int64_t rows, int queries, int keys,
                                                    int offset, float scale, const float* x,
                                                    float* y) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int i = offset + static_cast<int>(row % queries);
    const float* xr = x + row * keys;
    float* yr = y + row * keys;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j <= i; j += kThreads) mx = fmaxf(mx, __fmul_rn(scale, xr[j]));
    mx = BlockAllMax(mx);
    float sum = 0.0f;
    for (int j = threadIdx.x; j <= i; j += kThreads) sum += expf(__fmul_rn(scale, xr[j]) - mx);
    const float inv = 1.0f / BlockAllSum(sum);
    for (int j = threadIdx.x; j < keys; j += kThreads) {
      yr[j] = j <= i ? expf(__fmul_rn(scale, xr[j]) - mx) * inv : 0.0f;
    }
  }
}

// dx = scale * y * (dy - dot), dot = sum over kept columns of dy * y; 0 above the diagonal. One
// warp per row with the row in registers; dx may be dy.
template <int kPerLane>
__global__ void causal_softmax_backward_warp_kernel(int64_t rows, int t, float scale,
                                                    const float* y, const float* dy, float* dx) {
  using Team = RowTeam<false>;
  const int lane = Team::Rank();
  for (int64_t row = Team::FirstRow(); row < rows; row += Team::RowStride()) {
    const int i = static_cast<int>(row % t);
    const int64_t base = row * t;
    float yv[kPerLane], dv[kPerLane];
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + k * kWarp;
      yv[k] = j <= i ? y[base + j] : 0.0f;
      dv[k] = j <= i ? dy[base + j] : 0.0f;
      dot += dv[k] * yv[k];
    }
    dot = WarpSum(dot);
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int j = lane + k * kWarp;
      if (j < t) dx[base + j] = j <= i ? scale * yv[k] * (dv[k] - dot) : 0.0f;
    }
  }
}

// The same with one block per row for t > kWarpRowMax, re-reading the row; dx may be dy.
__global__ void causal_softmax_backward_block_kernel(int64_t rows, int t, float scale,
                                                     const float* y, const float* dy, float* dx) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int i = static_cast<int>(row % t);
    const int64_t base = row * t;
    float dot = 0.0f;
    for (int j = threadIdx.x; j <= i; j += kThreads) dot += dy[base + j] * y[base + j];
    dot = BlockAllSum(dot);
    for (int j = threadIdx.x; j < t; j += kThreads) {
      dx[base + j] = j <= i ? scale * y[base + j] * (dy[base + j] - dot) : 0.0f;
    }
  }
}

// --- Transpose0213 ---------------------------------------------------------------------------

// y(a, c, b, dv) = x(a, b, c, dv), one thread per output element (kVec floats), consecutive
// threads on consecutive elements of both; n = a * b * c * dv.
template <int kVec>
__global__ void transpose0213_kernel(int64_t n, int64_t b, int64_t c, int64_t dv, const float* x,
                                     float* y) {
  for (int64_t o = GlobalThread(); o < n; o += GridThreads()) {
    int64_t rest = o / dv;
    const int64_t di = o - rest * dv;
    const int64_t bi = rest % b;
    rest /= b;
    const int64_t ci = rest % c;
    const int64_t ai = rest / c;
    const int64_t src = ((ai * b + bi) * c + ci) * dv + di;
    if constexpr (kVec == 4) {
      reinterpret_cast<float4*>(y)[o] = reinterpret_cast<const float4*>(x)[src];
    } else {
      y[o] = x[src];
    }
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// --- launchers -------------------------------------------------------------------------------

cudaError_t layernorm_forward(cudaStream_t stream, int64_t rows, int cols, float eps,
                              const float* x, const float* gamma, const float* beta, float* y,
                              float* mean, float* rstd) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (cols <= kWarpRowMax) {
    layernorm_forward_kernel<false><<<RowGrid(rows, kWarpsPerBlock), kThreads, 0, stream>>>(
        rows, cols, eps, x, gamma, beta, y, mean, rstd);
  } else {
    layernorm_forward_kernel<true>
        <<<RowGrid(rows, 1), kThreads, 0, stream>>>(rows, cols, eps, x, gamma, beta, y, mean, rstd);
  }
  return cudaGetLastError();
}

// Bytes of scratch layernorm_backward needs.
size_t layernorm_backward_scratch_bytes(int64_t rows, int cols) {
  return 2 * static_cast<size_t>(ParamChunks(rows)) * static_cast<size_t>(cols) * sizeof(float);
}

// dgamma, dbeta += (when not null) first, then dx (when not null): dx may be dy.
cudaError_t layernorm_backward(cudaStream_t stream, int64_t rows, int cols, const float* x,
                               const float* gamma, const float* mean, const float* rstd,
                               const float* dy, float* dx, float* dgamma, float* dbeta,
                               void* scratch) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (dgamma != nullptr || dbeta != nullptr) {
    const int chunks = ParamChunks(rows);
    float* partial_gamma = static_cast<float*>(scratch);
    float* partial_beta = partial_gamma + static_cast<int64_t>(chunks) * cols;
    const dim3 grid((cols + kWarp - 1) / kWarp, chunks), block(kWarp, kWarpsPerBlock);
    layernorm_param_partial_kernel<<<grid, block, 0, stream>>>(
        rows, cols, ParamChunkRows(rows), x, mean, rstd, dy,
        dgamma != nullptr ? partial_gamma : nullptr, dbeta != nullptr ? partial_beta : nullptr);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess) return rc;
    layernorm_param_final_kernel<<<GridFor(cols), kThreads, 0, stream>>>(
        cols, chunks, partial_gamma, partial_beta, dgamma, dbeta);
    rc = cudaGetLastError();
    if (rc != cudaSuccess) return rc;
  }
  if (dx == nullptr) return cudaSuccess;
  if (cols <= kWarpRowMax) {
    layernorm_backward_dx_kernel<false><<<RowGrid(rows, kWarpsPerBlock), kThreads, 0, stream>>>(
        rows, cols, x, gamma, mean, rstd, dy, dx);
  } else {
    layernorm_backward_dx_kernel<true>
        <<<RowGrid(rows, 1), kThreads, 0, stream>>>(rows, cols, x, gamma, mean, rstd, dy, dx);
  }
  return cudaGetLastError();
}

cudaError_t embedding_forward(cudaStream_t stream, int64_t count, int vocab, int dim,
                              const int32_t* ids, const float* table, float* y) {
  if (count <= 0 || dim <= 0) return cudaSuccess;
  if (dim % 4 == 0 && Aligned16(table) && Aligned16(y)) {
    const int64_t n = count * (dim / 4);
    embedding_forward_kernel<4>
        <<<GridFor(n), kThreads, 0, stream>>>(n, vocab, dim / 4, ids, table, y);
  } else {
    const int64_t n = count * dim;
    embedding_forward_kernel<1><<<GridFor(n), kThreads, 0, stream>>>(n, vocab, dim, ids, table, y);
  }
  return cudaGetLastError();
}

// The embedding backward's scratch: two buffers each of sort keys and positions (cub's double
// buffers: each pass of the sort moves them from one to the other), then cub's own storage.
struct EmbeddingScratch {
  static constexpr size_t kAlign = 256;
  static size_t Round(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

  int end_bit = 0;       // keys are below 2^end_bit
  size_t keys = 0;       // bytes of one key buffer
  size_t positions = 0;  // bytes of one position buffer
  size_t sort = 0;       // cub's temporary storage
  size_t total() const { return 2 * keys + 2 * positions + sort; }
};

// The sort's sizes for `count` ids into a table of `vocab` rows.
cudaError_t embedding_backward_scratch(cudaStream_t stream, int64_t count, int vocab,
                                       EmbeddingScratch* s) {
  s->end_bit = 1;
  while ((int64_t{1} << s->end_bit) <= vocab) ++s->end_bit;  // room for the key `vocab`
  s->keys = EmbeddingScratch::Round(static_cast<size_t>(count) * sizeof(uint32_t));
  s->positions = EmbeddingScratch::Round(static_cast<size_t>(count) * sizeof(int64_t));
  cub::DoubleBuffer<uint32_t> keys(nullptr, nullptr);
  cub::DoubleBuffer<int64_t> positions(nullptr, nullptr);
  size_t sort = 0;
  const cudaError_t rc =
      cub::DeviceRadixSort::SortPairs(nullptr, sort, keys, positions, count, 0, s->end_bit, stream);
  s->sort = EmbeddingScratch::Round(std::max<size_t>(sort, 1));
  return rc;
}

// dtable += dy rows by id, deterministically; scratch holds layout.total() bytes.
cudaError_t embedding_backward(cudaStream_t stream, int64_t count, int vocab, int dim,
                               const int32_t* ids, const float* dy, float* dtable,
                               const EmbeddingScratch& layout, void* scratch) {
  if (count <= 0 || dim <= 0) return cudaSuccess;
  char* p = static_cast<char*>(scratch);
  cub::DoubleBuffer<uint32_t> keys(reinterpret_cast<uint32_t*>(p),
                                   reinterpret_cast<uint32_t*>(p + layout.keys));
  p += 2 * layout.keys;
  cub::DoubleBuffer<int64_t> positions(reinterpret_cast<int64_t*>(p),
                                       reinterpret_cast<int64_t*>(p + layout.positions));
  p += 2 * layout.positions;
  embedding_sort_input_kernel<<<GridFor(count), kThreads, 0, stream>>>(
      count, vocab, ids, keys.Current(), positions.Current());
  cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) return rc;
  size_t sort_bytes = layout.sort;
  // Stable: equal keys keep their positions' (ascending) order. The sorted pairs end in the
  // buffers Current() names afterwards (known on the host: the number of passes is fixed).
  rc = cub::DeviceRadixSort::SortPairs(p, sort_bytes, keys, positions, count, 0, layout.end_bit,
                                       stream);
  if (rc != cudaSuccess) return rc;
  // Threads: the row's columns rounded up to whole warps, at most kThreads.
  const int threads = std::min(kThreads, (dim + kWarp - 1) / kWarp * kWarp);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(count, kMaxBlocks));
  embedding_backward_kernel<<<blocks, threads, 0, stream>>>(count, vocab, dim, keys.Current(),
                                                            positions.Current(), dy, dtable);
  return cudaGetLastError();
}

// Row r of the (batch * queries, keys) scores keeps columns 0..offset + r % queries.
cudaError_t causal_softmax_forward(cudaStream_t stream, int64_t batch, int queries, int keys,
                                   int offset, float scale, const float* x, float* y) {
  const int64_t rows = batch * queries;
  if (rows <= 0) return cudaSuccess;
  const unsigned grid = RowGrid(rows, kWarpsPerBlock);
  const int q = queries, k = keys, o = offset;
  if (keys <= 32) {
    causal_softmax_forward_warp_kernel<1>
        <<<grid, kThreads, 0, stream>>>(rows, q, k, o, scale, x, y);
  } else if (keys <= 64) {
    causal_softmax_forward_warp_kernel<2>
        <<<grid, kThreads, 0, stream>>>(rows, q, k, o, scale, x, y);
  } else if (keys <= 128) {
    causal_softmax_forward_warp_kernel<4>
        <<<grid, kThreads, 0, stream>>>(rows, q, k, o, scale, x, y);
  } else if (keys <= 256) {
    causal_softmax_forward_warp_kernel<8>
        <<<grid, kThreads, 0, stream>>>(rows, q, k, o, scale, x, y);
  } else if (keys <= 512) {
    causal_softmax_forward_warp_kernel<16>
        <<<grid, kThreads, 0, stream>>>(rows, q, k, o, scale, x, y);
  } else if (keys <= kWarpRowMax) {
    causal_softmax_forward_warp_kernel<32>
        <<<grid, kThreads, 0, stream>>>(rows, q, k, o, scale, x, y);
  } else {
    causal_softmax_forward_block_kernel<<<RowGrid(rows, 1), kThreads, 0, stream>>>(rows, q, k, o,
                                                                                   scale, x, y);
  }
  return cudaGetLastError();
}

cudaError_t causal_softmax_backward(cudaStream_t stream, int64_t batch, int t, float scale,
                                    const float* y, const float* dy, float* dx) {
  const int64_t rows = batch * t;
  if (rows <= 0) return cudaSuccess;
  const unsigned grid = RowGrid(rows, kWarpsPerBlock);
  if (t <= 32) {
    causal_softmax_backward_warp_kernel<1>
        <<<grid, kThreads, 0, stream>>>(rows, t, scale, y, dy, dx);
  } else if (t <= 64) {
    causal_softmax_backward_warp_kernel<2>
        <<<grid, kThreads, 0, stream>>>(rows, t, scale, y, dy, dx);
  } else if (t <= 128) {
    causal_softmax_backward_warp_kernel<4>
        <<<grid, kThreads, 0, stream>>>(rows, t, scale, y, dy, dx);
  } else if (t <= 256) {
    causal_softmax_backward_warp_kernel<8>
        <<<grid, kThreads, 0, stream>>>(rows, t, scale, y, dy, dx);
  } else if (t <= 512) {
    causal_softmax_backward_warp_kernel<16>
        <<<grid, kThreads, 0, stream>>>(rows, t, scale, y, dy, dx);
  } else if (t <= kWarpRowMax) {
    causal_softmax_backward_warp_kernel<32>
        <<<grid, kThreads, 0, stream>>>(rows, t, scale, y, dy, dx);
  } else {
    causal_softmax_backward_block_kernel<<<RowGrid(rows, 1), kThreads, 0, stream>>>(rows, t, scale,
                                                                                    y, dy, dx);
  }
  return cudaGetLastError();
}

cudaError_t transpose0213(cudaStream_t stream, int64_t a, int64_t b, int64_t c, int64_t d,
                          const float* x, float* y) {
  const int64_t n = a * b * c * d;
  if (n <= 0) return cudaSuccess;
  if (d % 4 == 0 && Aligned16(x) && Aligned16(y)) {
    transpose0213_kernel<4><<<GridFor(n / 4), kThreads, 0, stream>>>(n / 4, b, c, d / 4, x, y);
  } else {
    transpose0213_kernel<1><<<GridFor(n), kThreads, 0, stream>>>(n, b, c, d, x, y);
  }
  return cudaGetLastError();
}

}  // namespace

}  // namespace kiln::cuda_kernels

namespace kiln {

namespace ck = cuda_kernels;

absl::Status CudaBackend::LayerNormForward(int64_t rows, int cols, float eps, const float* x,
                                           const float* gamma, const float* beta, float* y,
                                           float* mean, float* rstd) {
  KILN_RETURN_IF_ERROR(CheckLayerNorm(rows, cols, eps));
  if (rows == 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::layernorm_forward(stream_, rows, cols, eps, x, gamma, beta, y, mean, rstd));
  return absl::OkStatus();
}

absl::Status CudaBackend::LayerNormBackward(int64_t rows, int cols, const float* x,
                                            const float* gamma, const float* mean,
                                            const float* rstd, const float* dy, float* dx,
                                            float* dgamma, float* dbeta) {
  // The backward has no eps: any valid one checks the shape alone.
  KILN_RETURN_IF_ERROR(CheckLayerNorm(rows, cols, /*eps=*/1.0f));
  if (rows == 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Activate());
  void* scratch = nullptr;
  if (dgamma != nullptr || dbeta != nullptr) {
    KILN_ASSIGN_OR_RETURN(
        scratch, GetScratch(Scratch::kTemp, ck::layernorm_backward_scratch_bytes(rows, cols)));
  }
  KILN_CUDA_CHECK(ck::layernorm_backward(stream_, rows, cols, x, gamma, mean, rstd, dy, dx, dgamma,
                                         dbeta, scratch));
  return absl::OkStatus();
}

absl::Status CudaBackend::EmbeddingForward(int64_t count, int vocab, int dim, const int32_t* ids,
                                           const float* table, float* y) {
  KILN_RETURN_IF_ERROR(CheckEmbedding(count, vocab, dim));
  if (count == 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::embedding_forward(stream_, count, vocab, dim, ids, table, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::EmbeddingBackward(int64_t count, int vocab, int dim, const int32_t* ids,
                                            const float* dy, float* dtable) {
  KILN_RETURN_IF_ERROR(CheckEmbedding(count, vocab, dim));
  if (count == 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Activate());
  ck::EmbeddingScratch layout;
  KILN_CUDA_CHECK(ck::embedding_backward_scratch(stream_, count, vocab, &layout));
  KILN_ASSIGN_OR_RETURN(void* scratch, GetScratch(Scratch::kTemp, layout.total()));
  KILN_CUDA_CHECK(
      ck::embedding_backward(stream_, count, vocab, dim, ids, dy, dtable, layout, scratch));
  return absl::OkStatus();
}

absl::Status CudaBackend::GemmStridedBatched(Transpose ta, Transpose tb, int m, int n, int k,
                                             float alpha, const float* a, int64_t stride_a,
                                             const float* b, int64_t stride_b, float beta, float* c,
                                             int64_t stride_c, int batch) {
  KILN_RETURN_IF_ERROR(CheckGemmStridedBatched(m, n, k, stride_a, stride_b, stride_c, batch));
  if (m == 0 || n == 0 || batch == 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Activate());
  // As in Gemm: row-major C(m,n) is column-major C^T(n,m) = op(B)^T op(A)^T, the operands (and
  // their strides) swapped; TF32 follows the handle's math mode.
  const bool at = ta == Transpose::kYes, bt = tb == Transpose::kYes;
  const int lda = std::max(1, at ? m : k), ldb = std::max(1, bt ? k : n);
  if (options_.bf16) {  // bfloat16 products, float32 accumulation (see Gemm)
    KILN_CUDA_CHECK(blas_->GemmStridedBatchedEx(
        cublas_, bt ? CUBLAS_OP_T : CUBLAS_OP_N, at ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha,
        b, CUDA_R_32F, ldb, stride_b, a, CUDA_R_32F, lda, stride_a, &beta, c, CUDA_R_32F, n,
        stride_c, batch, CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT));
    return absl::OkStatus();
  }
  KILN_CUDA_CHECK(blas_->SgemmStridedBatched(
      cublas_, bt ? CUBLAS_OP_T : CUBLAS_OP_N, at ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
      ldb, stride_b, a, lda, stride_a, &beta, c, n, stride_c, batch));
  return absl::OkStatus();
}

absl::Status CudaBackend::CausalSoftmaxForward(int64_t batch, int t, float scale, const float* x,
                                               float* y) {
  KILN_RETURN_IF_ERROR(CheckCausalSoftmax(batch, t, scale));
  if (batch == 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::causal_softmax_forward(stream_, batch, t, t, 0, scale, x, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::CausalSoftmaxForwardAt(int64_t batch, int queries, int keys, int offset,
                                                 float scale, const float* x, float* y) {
  KILN_RETURN_IF_ERROR(CheckCausalSoftmaxAt(batch, queries, keys, offset, scale));
  if (batch == 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::causal_softmax_forward(stream_, batch, queries, keys, offset, scale, x, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::CausalSoftmaxBackward(int64_t batch, int t, float scale, const float* y,
                                                const float* dy, float* dx) {
  KILN_RETURN_IF_ERROR(CheckCausalSoftmax(batch, t, scale));
  if (batch == 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::causal_softmax_backward(stream_, batch, t, scale, y, dy, dx));
  return absl::OkStatus();
}

absl::Status CudaBackend::Transpose0213(int64_t a, int64_t b, int64_t c, int64_t d, const float* x,
                                        float* y) {
  KILN_RETURN_IF_ERROR(CheckTranspose0213(a, b, c, d));
  if (a == 0 || b == 0 || c == 0 || d == 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::transpose0213(stream_, a, b, c, d, x, y));
  return absl::OkStatus();
}

}  // namespace kiln
