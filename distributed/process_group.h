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

#include <atomic>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace mt::dist {

enum class ReduceOp { sum, average, max };

// A collective in flight. wait() makes what follows see its result: on CUDA the caller's
// current stream waits for it (the host does not block), on the CPU the call returns once
// it is done. A collective that does not finish within the group's timeout, or that NCCL
// reports failed, ends the process with an error naming the rank and the collective (and
// NCCL's communicator is aborted first), so that a dead or stuck peer never hangs the job.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  // contiguous t, in place; `what` names the collective in errors ("bucket 3 of 7 (25.0 MiB)").
  virtual std::unique_ptr<Work> all_reduce_async_(const Tensor& t, ReduceOp op, const std::string& what) = 0;
  virtual void broadcast_(const Tensor& t, int root) = 0;            // contiguous t, in place
  virtual void all_gather(const Tensor& in, const Tensor& out) = 0;  // out: [world * numel(in)]
  void all_reduce_(const Tensor& t, ReduceOp op) { all_reduce_async_(t, op, "all_reduce_")->wait(); }
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
  int local_world_size() const { return local_world_; }  // ranks on this host
  bool is_main() const { return rank_ == 0; }
  std::string describe() const;  // "rank 1 of 2 (local 1)"

  // Collectives on CPU tensors (MPI) or CUDA tensors (NCCL), in place, contiguous tensors.
  void all_reduce_(const Tensor& t, ReduceOp op = ReduceOp::sum);
  // Started now, finished by Work::wait(): on CUDA it runs on the communicator's own stream,
  // overlapping whatever the caller's stream does until it waits.
  std::unique_ptr<Work> all_reduce_async_(const Tensor& t, ReduceOp op, const std::string& what);
  void broadcast_(const Tensor& t, int root = 0);
  Tensor all_gather(const Tensor& t);  // [world, ...t's shape]
  void barrier();
  // Average of a host scalar over the ranks (for logging).
  double mean_over_ranks(double value);

  // How long a collective may take before the process gives up on its peers (seconds):
  // MT_COLLECTIVE_TIMEOUT_S in the environment, else 600.
  double timeout_seconds() const { return timeout_s_.load(); }
  void set_timeout_seconds(double seconds);

 private:
  ProcessGroup();
  Communicator& communicator_for(const Tensor& t);

  int rank_ = 0, world_ = 1, local_rank_ = 0, local_world_ = 1;
  std::atomic<double> timeout_s_{600};  // read by the NCCL monitor thread
  bool owns_mpi_ = false;
  std::unique_ptr<Communicator> mpi_;
  std::unique_ptr<Communicator> nccl_;  // created on the first CUDA collective
};

// NCCL communicator over the group's ranks (defined in nccl_communicator.cpp; throws in
// CPU-only builds).
std::unique_ptr<Communicator> make_nccl_communicator(const ProcessGroup& group, Communicator& bootstrap);
std::unique_ptr<Communicator> make_mpi_communicator(const ProcessGroup& group);

// Ends the process after a collective failed or timed out: prints
// "mixtrain: <who>: <what> <why>; ending this process" and exits with status 1 (from any
// thread, without unwinding: the stuck collective cannot be unwound). mpirun then ends the job.
[[noreturn]] void end_process_after_collective_failure(const std::string& who, const std::string& what,
                                                       const std::string& why);

}  // namespace mt::dist
