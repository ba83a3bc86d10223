#include "plexus/tooling/table.hpp"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace plexus::tooling {

std::string FormatTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows,
                        const TableStyle& style) {
  std::vector<size_t> width(header.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    if (row.size() > width.size()) width.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  };
  measure(header);
  for (const auto& row : rows) measure(row);

  std::string text;
  auto line = [&](const std::vector<std::string>& row) {
    std::string out = style.indent;
    for (size_t c = 0; c < row.size(); ++c) {
      const bool right = c < style.right_aligned.size() && style.right_aligned[c];
      const std::string pad(width[c] - row[c].size(), ' ');
      absl::StrAppend(&out, c == 0 ? "" : "  ", right ? pad : "", row[c], right ? "" : pad);
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    absl::StrAppend(&text, out, "\n");
  };
  line(header);
  for (const auto& row : rows) line(row);
  return text;
}

}  // namespace plexus::tooling
