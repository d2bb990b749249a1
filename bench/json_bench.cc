// kiln-bench-json: what parsing a KServe v2 REST infer body costs in memory and time
// (ParseInferRequest, server/serving/kserve_json.h), for bodies of about --mib MiB holding one
// input's "data": FP32 values as a client prints them (9 significant digits) and UINT8 values
// 0..255, flat and nested in rows of 28, and UINT8 values of one digit (the shortest numbers, so
// the most of them a byte).
//
// Memory is counted by replacing the global operator new and delete (every allocation the JSON
// parser and protobuf make goes through them): "peak" is the most bytes held at once during the
// parse beyond those held before it (the body itself is not counted), "kept" what the parsed
// request still holds afterwards. expansion = peak / body bytes.
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "server/serving/kserve_json.h"

namespace {

std::atomic<int64_t> g_held{0};
std::atomic<int64_t> g_peak{0};

void* Counted(void* p) {
  if (p == nullptr) throw std::bad_alloc();
  const int64_t held = g_held.fetch_add(static_cast<int64_t>(malloc_usable_size(p))) +
                       static_cast<int64_t>(malloc_usable_size(p));
  int64_t peak = g_peak.load();
  while (held > peak && !g_peak.compare_exchange_weak(peak, held)) {
  }
  return p;
}

void Uncounted(void* p) {
  if (p == nullptr) return;
  g_held.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)));
  std::free(p);
}

void* AlignedAlloc(size_t n, std::align_val_t a) {
  const size_t align = static_cast<size_t>(a);
  return std::aligned_alloc(align, (std::max<size_t>(n, 1) + align - 1) / align * align);
}

}  // namespace

void* operator new(size_t n) { return Counted(std::malloc(std::max<size_t>(n, 1))); }
void* operator new[](size_t n) { return Counted(std::malloc(std::max<size_t>(n, 1))); }
void* operator new(size_t n, std::align_val_t a) { return Counted(AlignedAlloc(n, a)); }
void* operator new[](size_t n, std::align_val_t a) { return Counted(AlignedAlloc(n, a)); }
void operator delete(void* p) noexcept { Uncounted(p); }
void operator delete[](void* p) noexcept { Uncounted(p); }
void operator delete(void* p, size_t) noexcept { Uncounted(p); }
void operator delete[](void* p, size_t) noexcept { Uncounted(p); }
void operator delete(void* p, std::align_val_t) noexcept { Uncounted(p); }
void operator delete[](void* p, std::align_val_t) noexcept { Uncounted(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { Uncounted(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { Uncounted(p); }

namespace {

constexpr int kRow = 28;

struct Case {
  const char* name;
  const char* datatype;
  bool nested;
  int modulo;  // values are 0..modulo-1
};

// One value of the case's datatype, as a client prints it.
std::string Value(const Case& c, int64_t i) {
  const int pixel = static_cast<int>((i * 7919) % c.modulo);
  if (std::string(c.datatype) == "UINT8") return std::to_string(pixel);
  char text[32];
  std::snprintf(text, sizeof(text), "%.9g", static_cast<double>(static_cast<float>(pixel) / 255.f));
  return text;
}

// A body of about `bytes` bytes: one input of shape [rows, 28], rows whole.
std::string Body(const Case& c, size_t bytes, int64_t* elements) {
  std::string data;
  int64_t n = 0;
  while (data.size() + 64 < bytes || n % kRow != 0) {
    if (n % kRow == 0 && c.nested) data += n == 0 ? "[" : "],[";
    if (n % kRow != 0) data += ",";
    if (n % kRow == 0 && n > 0 && !c.nested) data += ",";
    data += Value(c, n);
    ++n;
  }
  if (c.nested) data += "]";
  *elements = n;
  return std::string(R"({"inputs":[{"name":"input","datatype":")") + c.datatype + R"(","shape":[)" +
         std::to_string(n / kRow) + "," + std::to_string(kRow) + R"(],"data":[)" + data + "]}]}";
}

struct Measure {
  int64_t peak = 0;
  int64_t kept = 0;
  double seconds = 0;
};

Measure Parse(const std::string& body, int64_t elements) {
  Measure m;
  const int64_t before = g_held.load();
  g_peak.store(before);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<kiln::serving::RestInferRequest> parsed =
      kiln::serving::ParseInferRequest(body, std::nullopt, "mnist", "");
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.peak = g_peak.load() - before;
  m.kept = g_held.load() - before;
  if (!parsed.ok()) {
    std::fprintf(stderr, "parse failed: %s\n", parsed.status().ToString().c_str());
    std::exit(1);
  }
  const auto& contents = parsed->request.inputs(0).contents();
  const int64_t got = contents.fp32_contents_size() + contents.uint_contents_size();
  if (got != elements) {
    std::fprintf(stderr, "parsed %lld elements of %lld\n", static_cast<long long>(got),
                 static_cast<long long>(elements));
    std::exit(1);
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln-bench-json: memory and time of parsing a KServe v2 REST infer body"};
  double mib = 15;
  int runs = 3;
  app.add_option("--mib", mib, "body size in MiB");
  app.add_option("--runs", runs, "parses per case (the fastest is shown; memory is the same)");
  CLI11_PARSE(app, argc, argv);

  const Case cases[] = {{"FP32, flat", "FP32", false, 256},
                        {"FP32, rows of 28", "FP32", true, 256},
                        {"UINT8, flat", "UINT8", false, 256},
                        {"UINT8, rows of 28", "UINT8", true, 256},
                        {"UINT8 0..9 (one digit), flat", "UINT8", false, 10}};
  std::printf("| body | bytes | elements | peak extra | expansion | kept after | parse time |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Case& c : cases) {
    int64_t elements = 0;
    const std::string body = Body(c, static_cast<size_t>(mib * (1 << 20)), &elements);
    Measure best;
    for (int r = 0; r < runs; ++r) {
      const Measure m = Parse(body, elements);
      if (r == 0 || m.seconds < best.seconds) best = m;
      best.peak = std::max(best.peak, m.peak);
    }
    std::printf("| %s | %zu | %lld | %.1f MiB | %.2fx | %.1f MiB | %.0f ms |\n", c.name,
                body.size(), static_cast<long long>(elements), best.peak / 1048576.0,
                static_cast<double>(best.peak) / static_cast<double>(body.size()),
                best.kept / 1048576.0, best.seconds * 1e3);
  }
  return 0;
}
