// Column-aligned text tables (kubectl style: upper-case headers, two spaces between columns)
// and aligned "key: value" listings.
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace kiln::client {

// A table of rows under headers; every column is as wide as its widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> headers) : headers_(std::move(headers)) {}

  // Adds a row; missing cells print empty, extra cells are dropped.
  void AddRow(std::vector<std::string> cells);
  bool empty() const { return rows_.empty(); }
  // The table as text, one line per row after the header line, each ending in '\n'.
  std::string Render() const;
  void Print(std::FILE* out) const;

 private:
  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;
};

// "key:   value" lines with the values aligned.
class KeyValueList {
 public:
  void Add(std::string key, std::string value);
  std::string Render() const;
  void Print(std::FILE* out) const;

 private:
  std::vector<std::pair<std::string, std::string>> items_;
};

}  // namespace kiln::client
