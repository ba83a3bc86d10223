// plexus-bench-collectives-mpi: one rank of the Open MPI allreduce peer of
// plexus-bench-collectives, which starts it under mpirun (btl tcp,self or vader,self); not meant
// to be run by hand. MPI_Allreduce, out of place, f32 sum.
//
//   mpirun -np N --mca btl tcp,self plexus-bench-collectives-mpi --transport tcp [--sizes LIST]
//       [--iters N] [--warmup N]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "bench_common.hpp"

namespace {

namespace pb = plexus::bench;

class MpiAllreduce : public pb::AllreduceUnderTest {
 public:
  MpiAllreduce() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }

  void Prepare(size_t count) override {
    input_.assign(count, 0.0f);
    output_.assign(count, 0.0f);
    pb::FillInput(input_.data(), count, rank_);
  }
  void Run() override {
    MPI_Allreduce(input_.data(), output_.data(), static_cast<int>(input_.size()), MPI_FLOAT,
                  MPI_SUM, MPI_COMM_WORLD);
  }
  size_t RunAndCheck() override {
    pb::FillInput(input_.data(), input_.size(), rank_);
    std::fill(output_.begin(), output_.end(), -1.0f);
    Run();
    return pb::CountWrong(output_.data(), output_.size(), size_);
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
  std::vector<float> input_;
  std::vector<float> output_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  // MPI_Init may have consumed its own arguments; what is left is ours.
  const pb::WorkerOptions options =
      pb::ParseWorkerOptions(argc, argv, "plexus-bench-collectives-mpi");
  {
    MpiAllreduce impl;
    pb::MeasureAllreduce(impl, options, "openmpi");
  }
  MPI_Finalize();
  return 0;
}
