#include "plexus/tooling/figures.hpp"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "plexus/tooling/table.hpp"

namespace plexus::tooling {
namespace {

std::string Cell(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) return absl::StrFormat("%.6g", v.get<double>());
  return v.dump();
}

}  // namespace

nlohmann::json FigureJson(const std::string& bench, const Figure& f) {
  nlohmann::json j = nlohmann::json::object();
  j["bench"] = bench;
  j["figure"] = f.figure;
  j["value"] = std::isfinite(f.value) ? nlohmann::json(f.value) : nlohmann::json(nullptr);
  j["unit"] = f.unit;
  if (!f.target.is_null()) j["target"] = f.target;
  if (f.met) j["met"] = *f.met;
  if (f.extra.is_object()) {
    for (auto it = f.extra.begin(); it != f.extra.end(); ++it) {
      if (!j.contains(it.key())) j[it.key()] = it.value();
    }
  }
  return j;
}

std::optional<Figure> FigureFromJsonLine(const std::string& line) {
  if (line.empty() || line[0] != '{') return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("value") || !j["value"].is_number()) {
    return std::nullopt;
  }
  Figure f;
  f.figure = j.value("figure", "");
  f.value = j["value"].get<double>();
  f.unit = j.value("unit", "");
  if (j.contains("target")) f.target = j["target"];
  if (j.contains("met") && j["met"].is_boolean()) f.met = j["met"].get<bool>();
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (key != "bench" && key != "figure" && key != "value" && key != "unit" && key != "target" &&
        key != "met") {
      f.extra[key] = it.value();
    }
  }
  return f;
}

FigureWriter::FigureWriter(std::string bench, bool json, FILE* out)
    : bench_(std::move(bench)), json_(json), out_(out) {}

void FigureWriter::SetCommon(nlohmann::json fields) {
  common_ = fields.is_object() ? std::move(fields) : nlohmann::json::object();
}

void FigureWriter::Add(const Figure& figure) {
  figures_.push_back(figure);
  if (json_) {
    Figure with_common = figure;
    if (!with_common.extra.is_object()) with_common.extra = nlohmann::json::object();
    for (auto it = common_.begin(); it != common_.end(); ++it) {
      if (!with_common.extra.contains(it.key())) with_common.extra[it.key()] = it.value();
    }
    const std::string line = FigureJson(bench_, with_common).dump() + "\n";
    std::fputs(line.c_str(), out_);
    std::fflush(out_);
  }
}

bool FigureWriter::all_met() const {
  return std::none_of(figures_.begin(), figures_.end(),
                      [](const Figure& f) { return f.met && !*f.met; });
}

std::string FigureWriter::Table() const {
  std::vector<std::vector<std::string>> rows;
  for (const Figure& f : figures_) {
    std::string extra;
    if (f.extra.is_object()) {
      for (auto it = f.extra.begin(); it != f.extra.end(); ++it) {
        absl::StrAppend(&extra, extra.empty() ? "" : " ", it.key(), "=", Cell(it.value()));
      }
    }
    rows.push_back({f.figure, std::isfinite(f.value) ? absl::StrFormat("%.6g", f.value) : "n/a",
                    f.unit, f.target.is_null() ? "" : Cell(f.target),
                    f.met ? (*f.met ? "yes" : "NO") : "", extra});
  }
  std::string title = bench_;
  if (!common_.empty()) {
    std::string fields;
    for (auto it = common_.begin(); it != common_.end(); ++it) {
      absl::StrAppend(&fields, fields.empty() ? "" : ", ", it.key(), " ", Cell(it.value()));
    }
    absl::StrAppend(&title, " (", fields, ")");
  }
  return absl::StrCat(title, "\n",
                      FormatTable({"figure", "value", "unit", "target", "met", ""}, rows,
                                  {.indent = "  ", .right_aligned = {false, true}}));
}

void FigureWriter::PrintTable() {
  if (json_) return;
  std::fputs(Table().c_str(), out_);
  std::fflush(out_);
}

}  // namespace plexus::tooling
