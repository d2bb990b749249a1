#include "client/table.h"

#include <algorithm>

namespace kiln::client {
namespace {

// Display width of UTF-8 text: code points, not bytes (cells may hold "—" or "…").
size_t DisplayWidth(const std::string& s) {
  size_t width = 0;
  for (unsigned char c : s) width += (c & 0xC0) != 0x80;
  return width;
}

void AppendPadded(std::string* line, const std::string& cell, size_t width) {
  line->append(cell);
  line->append(width - std::min(width, DisplayWidth(cell)), ' ');
}

}  // namespace

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  rows_.push_back(std::move(cells));
}

std::string Table::Render() const {
  std::vector<size_t> widths(headers_.size());
  for (size_t c = 0; c < headers_.size(); ++c) {
    widths[c] = DisplayWidth(headers_[c]);
    for (const auto& row : rows_) widths[c] = std::max(widths[c], DisplayWidth(row[c]));
  }
  std::string text;
  auto render_row = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c + 1 == cells.size()) {
        line.append(cells[c]);
      } else {
        AppendPadded(&line, cells[c], widths[c] + 2);
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    text.append(line).push_back('\n');
  };
  render_row(headers_);
  for (const auto& row : rows_) render_row(row);
  return text;
}

void Table::Print(std::FILE* out) const { std::fputs(Render().c_str(), out); }

void KeyValueList::Add(std::string key, std::string value) {
  items_.emplace_back(std::move(key), std::move(value));
}

std::string KeyValueList::Render() const {
  size_t width = 0;
  for (const auto& [key, value] : items_) width = std::max(width, DisplayWidth(key) + 1);
  std::string text;
  for (const auto& [key, value] : items_) {
    AppendPadded(&text, key + ":", width + 2);
    text.append(value);
    while (!text.empty() && text.back() == ' ') text.pop_back();
    text.push_back('\n');
  }
  return text;
}

void KeyValueList::Print(std::FILE* out) const { std::fputs(Render().c_str(), out); }

}  // namespace kiln::client
