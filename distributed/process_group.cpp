#include "distributed/process_group.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/check_mpi.h"
#include "core/error.h"
#include "ops/elementwise/elementwise.h"

namespace mt::dist {

namespace {

// MPI's element type for a dtype; reductions take floating and 64-bit integer tensors.
MPI_Datatype mpi_type(DType dtype, const char* op) {
  switch (dtype) {
    case DType::f64:
      return MPI_DOUBLE;
    case DType::f32:
      return MPI_FLOAT;
    case DType::i64:
      return MPI_INT64_T;
    case DType::i32:
      return MPI_INT32_T;
    case DType::u8:
    case DType::boolean:
      return MPI_UINT8_T;
    default:
      break;
  }
  throw DTypeError(detail::str_cat(op, ": MPI cannot reduce ", dtype_name(dtype),
                                   " tensors; reduce f32 copies (gradients are f32 with master weights)"));
}

void check_collective_input(const char* op, const Tensor& t) {
  MT_CHECK(t.defined() && t.is_contiguous(), op, ": the tensor must be defined and contiguous, got ",
           t.defined() ? shape_str(t.shape()) + " with strides " + shape_str(t.strides()) : std::string("undefined"));
  MT_CHECK(t.nbytes() <= static_cast<size_t>(INT_MAX), op, ": MPI counts are int; ", shape_str(t.shape()), " ",
           dtype_name(t.dtype()), " is too large for one call");
}

// Waits for a non-blocking MPI request, giving up after the group's timeout.
void wait_or_end_process(MPI_Request* request, const ProcessGroup& group, const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(group.timeout_seconds());
  for (int spins = 0;; ++spins) {
    int done = 0;
    MT_MPI_CHECK(MPI_Test(request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (std::chrono::steady_clock::now() > deadline) {
      end_process_after_collective_failure(group.describe(), what,
                                           detail::str_cat("did not finish within ", group.timeout_seconds(),
                                                           " s (MT_COLLECTIVE_TIMEOUT_S): a peer died or stopped"));
    }
    // Spin briefly (small collectives finish in microseconds), then poll every 100 us.
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// A non-blocking MPI reduction; the average is formed after it completes.
class MpiWork : public Work {
 public:
  MpiWork(const ProcessGroup& group, Tensor t, bool average, std::string what)
      : group_(group), tensor_(std::move(t)), average_(average), what_(std::move(what)) {}
  ~MpiWork() override {
    try {
      if (!waited_) wait();  // a request must complete before its buffer goes
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mixtrain: %s\n", e.what());  // a destructor must not throw
    }
  }
  MPI_Request* request() { return &request_; }
  void wait() override {
    if (waited_) return;
    waited_ = true;
    wait_or_end_process(&request_, group_, what_);
    if (average_) {
      NoGradGuard no_grad;
      tensor_.copy_(mul(tensor_.detach(), 1.0 / group_.world_size()));
    }
  }

 private:
  const ProcessGroup& group_;
  Tensor tensor_;
  bool average_;
  std::string what_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  bool waited_ = false;
};

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(const ProcessGroup& group) : group_(group) {
    // Errors come back as codes (MT_MPI_CHECK turns them into exceptions) instead of aborting.
    MT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    MT_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  std::unique_ptr<Work> all_reduce_async_(const Tensor& t, ReduceOp op, const std::string& what) override {
    check_collective_input("all_reduce_", t);
    MT_CHECK(!t.is_cuda(), "all_reduce_: the MPI communicator takes CPU tensors");
    const MPI_Datatype type = mpi_type(t.dtype(), "all_reduce_");
    auto work = std::make_unique<MpiWork>(group_, t, op == ReduceOp::average, what);
    MT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), static_cast<int>(t.numel()), type,
                                op == ReduceOp::max ? MPI_MAX : MPI_SUM, comm_, work->request()));
    return work;
  }

  void broadcast_(const Tensor& t, int root) override {
    check_collective_input("broadcast_", t);
    MT_CHECK(!t.is_cuda(), "broadcast_: the MPI communicator takes CPU tensors");
    MPI_Request request = MPI_REQUEST_NULL;
    MT_MPI_CHECK(MPI_Ibcast(t.data_ptr(), static_cast<int>(t.nbytes()), MPI_BYTE, root, comm_, &request));
    wait_or_end_process(&request, group_, "broadcast_");
  }

  void all_gather(const Tensor& in, const Tensor& out) override {
    check_collective_input("all_gather", in);
    check_collective_input("all_gather", out);
    MPI_Request request = MPI_REQUEST_NULL;
    MT_MPI_CHECK(MPI_Iallgather(in.data_ptr(), static_cast<int>(in.nbytes()), MPI_BYTE, out.data_ptr(),
                                static_cast<int>(in.nbytes()), MPI_BYTE, comm_, &request));
    wait_or_end_process(&request, group_, "all_gather");
  }

  void barrier() {
    MPI_Request request = MPI_REQUEST_NULL;
    MT_MPI_CHECK(MPI_Ibarrier(comm_, &request));
    wait_or_end_process(&request, group_, "barrier");
  }

 private:
  const ProcessGroup& group_;
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// What a world of one returns: nothing to wait for.
class DoneWork : public Work {
 public:
  void wait() override {}
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const ProcessGroup& group) {
  return std::make_unique<MpiCommunicator>(group);
}

void end_process_after_collective_failure(const std::string& who, const std::string& what, const std::string& why) {
  std::fprintf(stderr, "mixtrain: %s: collective %s %s; ending this process\n", who.c_str(), what.c_str(), why.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(1);
}

bool ProcessGroup::launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "MV2_COMM_WORLD_SIZE"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

ProcessGroup& ProcessGroup::init() {
  static ProcessGroup* group = new ProcessGroup();  // lives to the end: MPI_Finalize runs at exit
  return *group;
}

ProcessGroup::ProcessGroup() {
  int initialized = 0;
  MT_MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    int provided = 0;
    MT_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
    owns_mpi_ = true;
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    });
  }
  MT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_));
  MPI_Comm local = MPI_COMM_NULL;
  MT_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
  MT_MPI_CHECK(MPI_Comm_rank(local, &local_rank_));
  MT_MPI_CHECK(MPI_Comm_size(local, &local_world_));
  MT_MPI_CHECK(MPI_Comm_free(&local));
  if (const char* timeout = std::getenv("MT_COLLECTIVE_TIMEOUT_S")) {
    char* end = nullptr;
    const double seconds = std::strtod(timeout, &end);
    MT_CHECK(end != timeout && *end == '\0' && seconds > 0, "MT_COLLECTIVE_TIMEOUT_S='", timeout,
             "' is not a positive number of seconds");
    timeout_s_ = seconds;
  }
  mpi_ = make_mpi_communicator(*this);
}

void ProcessGroup::set_timeout_seconds(double seconds) {
  MT_CHECK(seconds > 0, "ProcessGroup::set_timeout_seconds: expected a positive number of seconds, got ", seconds);
  timeout_s_ = seconds;
}

ProcessGroup::~ProcessGroup() = default;

std::string ProcessGroup::describe() const {
  return detail::str_cat("rank ", rank_, " of ", world_, " (local ", local_rank_, ")");
}

Communicator& ProcessGroup::communicator_for(const Tensor& t) {
  if (!t.is_cuda()) return *mpi_;
  if (!nccl_) nccl_ = make_nccl_communicator(*this, *mpi_);
  return *nccl_;
}

void ProcessGroup::all_reduce_(const Tensor& t, ReduceOp op) { all_reduce_async_(t, op, "all_reduce_")->wait(); }

std::unique_ptr<Work> ProcessGroup::all_reduce_async_(const Tensor& t, ReduceOp op, const std::string& what) {
  if (world_ == 1) return std::make_unique<DoneWork>();  // sum, average and max of one value are the value
  return communicator_for(t).all_reduce_async_(t, op, what);
}

void ProcessGroup::broadcast_(const Tensor& t, int root) {
  MT_CHECK(root >= 0 && root < world_, "broadcast_: root ", root, " is not a rank of ", describe());
  if (world_ > 1) communicator_for(t).broadcast_(t, root);
}

Tensor ProcessGroup::all_gather(const Tensor& t) {
  Shape shape = t.shape();
  shape.insert(shape.begin(), world_);
  Tensor out = empty(shape, TensorOptions().dtype(t.dtype()).device(t.device()));
  communicator_for(t).all_gather(t, out);
  return out;
}

void ProcessGroup::barrier() {
  if (world_ > 1) static_cast<MpiCommunicator&>(*mpi_).barrier();
}

double ProcessGroup::mean_over_ranks(double value) {
  const Tensor t = from_vector({value}, {1}, DType::f64);
  all_reduce_(t, ReduceOp::average);
  return t.item();
}

}  // namespace mt::dist
