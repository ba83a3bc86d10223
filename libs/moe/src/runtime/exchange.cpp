#include "plexus/moe/exchange.hpp"

namespace plexus::moe {

ElementExchange ToElementExchange(const RankExchange& exchange, size_t elements_per_token) {
  ElementExchange out;
  auto convert = [&](const std::vector<int64_t>& in, std::vector<size_t>& to) {
    to.resize(in.size());
    for (size_t i = 0; i < in.size(); ++i) to[i] = static_cast<size_t>(in[i]) * elements_per_token;
  };
  convert(exchange.send_counts, out.send_counts);
  convert(exchange.send_offsets, out.send_displs);
  convert(exchange.recv_counts, out.recv_counts);
  convert(exchange.recv_offsets, out.recv_displs);
  for (size_t c : out.send_counts) out.send_elements += c;
  for (size_t c : out.recv_counts) out.recv_elements += c;
  return out;
}

absl::Status DispatchTokens(collectives::Communicator& comm, const ElementExchange& x,
                            const float* send, float* recv) {
  return comm.AllToAllV(send, x.send_counts, x.send_displs, recv, x.recv_counts, x.recv_displs,
                        collectives::DataType::kF32);
}

absl::Status CombineTokens(collectives::Communicator& comm, const ElementExchange& x,
                           const float* results, float* out) {
  return comm.AllToAllV(results, x.recv_counts, x.recv_displs, out, x.send_counts, x.send_displs,
                        collectives::DataType::kF32);
}

}  // namespace plexus::moe
