// Aligned text columns: the readable output of the tools and benchmarks (FigureWriter's table is
// one). Each column is as wide as its widest cell, header included; two spaces separate columns.
#pragma once

#include <string>
#include <vector>

namespace plexus::tooling {

struct TableStyle {
  std::string indent{};               // printed before every line
  std::vector<bool> right_aligned{};  // per column (numbers); a column not listed is left-aligned
};

// The header line, then one line per row; lines end in '\n' and carry no trailing spaces. A row
// may have fewer cells than the header (the rest are blank) or more (columns without a title).
std::string FormatTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows,
                        const TableStyle& style = {});

}  // namespace plexus::tooling
