// The order in which a benchmark launches the systems it compares, run after run: balanced, so
// that a disturbance, a warm cache or a cold one falls on every system alike.
#pragma once

#include <cstddef>
#include <vector>

namespace plexus::bench {

// Row `row` (any number: rows repeat) of a balanced (Williams) Latin square of n items, the
// order of one run's launches: over n rows (2n for n odd) every item takes every position once
// (twice) and directly follows every other item once (twice).
std::vector<size_t> BalancedOrder(size_t n, size_t row);

}  // namespace plexus::bench
