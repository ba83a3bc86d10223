// plexus-bench-collectives-mpi: one rank of the Open MPI peer of plexus-bench-collectives, which
// starts it under mpirun (btl tcp,self or vader,self); not meant to be run by hand. f32, sum:
// MPI_Allreduce (out of place), MPI_Bcast (root 0), MPI_Allgather, MPI_Reduce_scatter_block and
// MPI_Alltoall.
//
//   mpirun -np N --mca btl tcp,self plexus-bench-collectives-mpi --transport tcp [--sizes LIST]
//       [--ops LIST] [--iters N] [--warmup N]
#include <mpi.h>

#include <string>

#include "bench_common.hpp"

namespace {

namespace pb = plexus::bench;

class MpiCollectives : public pb::CollectiveUnderTest {
 public:
  MpiCollectives() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  bool Supports(pb::Op) const override { return true; }

  void Prepare(pb::OpBuffers& buffers) override { buffers_ = &buffers; }
  void Run() override {
    float* send = buffers_->send();
    float* recv = buffers_->recv();
    const int count = static_cast<int>(buffers_->shape().count);
    switch (buffers_->op()) {
      case pb::Op::kAllreduce:
        MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
      case pb::Op::kReduce:
        MPI_Reduce(send, recv, count, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
        break;
      case pb::Op::kBroadcast:
        MPI_Bcast(recv, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
      case pb::Op::kAllgather:
        MPI_Allgather(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, MPI_COMM_WORLD);
        break;
      case pb::Op::kReduceScatter:
        MPI_Reduce_scatter_block(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
      case pb::Op::kAlltoall:
        MPI_Alltoall(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    }
  }
  void Barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  double Max(double value) override { return Reduce(value, MPI_MAX); }
  double Sum(double value) override { return Reduce(value, MPI_SUM); }

 private:
  static double Reduce(double value, MPI_Op op) {
    double result = 0;
    MPI_Allreduce(&value, &result, 1, MPI_DOUBLE, op, MPI_COMM_WORLD);
    return result;
  }

  int rank_ = 0;
  int size_ = 1;
  pb::OpBuffers* buffers_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  // MPI_Init may have consumed its own arguments; what is left is ours.
  const pb::WorkerOptions options =
      pb::ParseWorkerOptions(argc, argv, "plexus-bench-collectives-mpi");
  {
    MpiCollectives impl;
    pb::MeasureOps(impl, options, [](pb::Op) { return std::string("openmpi"); });
  }
  MPI_Finalize();
  return 0;
}
