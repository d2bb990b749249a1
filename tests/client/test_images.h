// Small PNG and JPEG files for the client's image tests, written with libpng and libjpeg so the
// decoders under test read what real tools write.
#pragma once

#include <cstdint>
#include <string>

namespace kiln::client::testing {

// Each writer exists when the client is built with its library (KILN_CLIENT_HAVE_PNG, _JPEG).
// Pixels are interleaved (HWC), `channels` 1 (gray), 2 (gray + alpha), 3 (RGB) or 4 (RGBA).
// Returns false when the file could not be written.
bool WritePng(const std::string& path, int width, int height, int channels,
              const std::string& pixels);
// The same with 16 bits a sample (big-endian pairs, as PNG stores them).
bool WritePng16(const std::string& path, int width, int height, int channels,
                const std::string& pixels);
// Baseline JPEG at quality 95; `channels` 1 (gray) or 3 (RGB).
bool WriteJpeg(const std::string& path, int width, int height, int channels,
               const std::string& pixels);

// A width x height image of `channels` interleaved samples, every sample `value`.
std::string Flat(int width, int height, int channels, uint8_t value);

}  // namespace kiln::client::testing
