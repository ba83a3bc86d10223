// The launch order of benchmark runs (order.hpp).
#include "order.hpp"

#include <algorithm>

namespace plexus::bench {

std::vector<size_t> BalancedOrder(size_t n, size_t row) {
  std::vector<size_t> order;
  if (n == 0) return order;
  // The first row is 0, 1, n-1, 2, n-2, ...; row i adds i (mod n); for n odd rows n..2n-1 are
  // rows 0..n-1 reversed, which completes the balance of who follows whom.
  size_t low = 1, high = n - 1;
  order.push_back(0);
  while (order.size() < n) order.push_back(order.size() % 2 == 1 ? low++ : high--);
  for (size_t& k : order) k = (k + row) % n;
  if (n % 2 == 1 && (row / n) % 2 == 1) std::reverse(order.begin(), order.end());
  return order;
}

}  // namespace plexus::bench
