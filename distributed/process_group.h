// The data-parallel world: one process per device, launched by mpirun (or alone).
//
//   auto& group = mt::dist::ProcessGroup::init();     // MPI_Init_thread when needed
//   group.rank(), group.world_size(), group.local_rank()
//   group.all_reduce_(t);                              // in place, sum (or average)
//
// Rank and world come from MPI; the local rank (this process's index among those on the
// same host, from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)) picks the GPU. CPU tensors
// are reduced through MPI, CUDA tensors through NCCL (one communicator per process, its
// unique id broadcast from rank 0 over MPI), behind the same calls. A program started
// without mpirun is a world of one, and every collective is then a no-op (or a copy).
// Collectives must be called in the same order on every rank, with the same shapes and
// dtypes; the calls check what they can and name the rank in their errors.
#pragma once

#include <memory>
#include <string>

#include "core/tensor.h"

namespace mt::dist {

enum class ReduceOp { sum, average, max };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual void all_reduce_(const Tensor& t, ReduceOp op) = 0;        // contiguous t, in place
  virtual void broadcast_(const Tensor& t, int root) = 0;            // contiguous t, in place
  virtual void all_gather(const Tensor& in, const Tensor& out) = 0;  // out: [world * numel(in)]
};

class ProcessGroup {
 public:
  // The process's group, created on first call (MPI initialised if nobody did).
  static ProcessGroup& init();
  // True when an MPI launcher (mpirun, srun with PMI/PMIx) started this process: programs
  // that also run alone call init() only then, and skip MPI entirely otherwise.
  static bool launched_by_mpi();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;
  ~ProcessGroup();

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  int local_rank() const { return local_rank_; }
  bool is_main() const { return rank_ == 0; }
  std::string describe() const;  // "rank 1 of 2 (local 1)"

  // Collectives on CPU tensors (MPI) or CUDA tensors (NCCL), in place, contiguous tensors.
  void all_reduce_(const Tensor& t, ReduceOp op = ReduceOp::sum);
  void broadcast_(const Tensor& t, int root = 0);
  Tensor all_gather(const Tensor& t);  // [world, ...t's shape]
  void barrier();
  // Average of a host scalar over the ranks (for logging).
  double mean_over_ranks(double value);

 private:
  ProcessGroup();
  Communicator& communicator_for(const Tensor& t);

  int rank_ = 0, world_ = 1, local_rank_ = 0;
  bool owns_mpi_ = false;
  std::unique_ptr<Communicator> mpi_;
  std::unique_ptr<Communicator> nccl_;  // created on the first CUDA collective
};

// NCCL communicator over the group's ranks (defined in nccl_communicator.cpp; throws in
// CPU-only builds).
std::unique_ptr<Communicator> make_nccl_communicator(const ProcessGroup& group, Communicator& bootstrap);
std::unique_ptr<Communicator> make_mpi_communicator();

}  // namespace mt::dist
