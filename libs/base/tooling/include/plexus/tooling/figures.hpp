// The one output format of the benchmarks: with --json, one JSON object per line and figure,
// {"bench", "figure", "value", "unit"[, "target", "met"], ...extra fields (size, np, transport,
// runs, min/median/max...)}; without, a readable table of the same figures.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace plexus::tooling {

struct Figure {
  std::string figure;  // what is measured, e.g. "allreduce_busbw"
  double value = 0;    // a non-finite value is written as null
  std::string unit;    // "GB/s", "us", "ms", "ratio", "fraction", "count", ...
  // The goal the figure is held against (a number, or a sentence), and whether it is met.
  nlohmann::json target;  // null: no target
  std::optional<bool> met;
  nlohmann::json extra = nlohmann::json::object();  // free-form fields
};

// The JSON object of one figure of `bench`: bench, figure, value, unit, then target and met
// when set, then the extra fields (which cannot override the first ones).
nlohmann::json FigureJson(const std::string& bench, const Figure& figure);
// The inverse, for a driver that relays its workers' lines: a Figure from one line of
// FigureJson output (bench dropped), or nullopt when `line` is not such an object with a numeric
// value.
std::optional<Figure> FigureFromJsonLine(const std::string& line);

class FigureWriter {
 public:
  // json: every Add() prints its line at once (and flushes); else Add() collects rows for
  // PrintTable().
  FigureWriter(std::string bench, bool json, FILE* out = stdout);

  // Fields of every figure (the run's parameters): in each JSON line (a figure's own extra
  // field of the same name wins), and once in the table's title instead of on every row.
  void SetCommon(nlohmann::json fields);
  void Add(const Figure& figure);
  // The collected figures as a table: figure, value, unit, target, met, extra fields.
  void PrintTable();
  std::string Table() const;

  bool json() const { return json_; }
  const std::vector<Figure>& figures() const { return figures_; }
  // True when no figure with a target missed it.
  bool all_met() const;

 private:
  std::string bench_;
  bool json_;
  FILE* out_;
  std::vector<Figure> figures_;
  nlohmann::json common_ = nlohmann::json::object();
};

}  // namespace plexus::tooling
