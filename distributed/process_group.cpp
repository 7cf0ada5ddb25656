#include "distributed/process_group.h"

#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
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

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator() {
    // Errors come back as codes (MT_MPI_CHECK turns them into exceptions) instead of aborting.
    MT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    MT_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  void all_reduce_(const Tensor& t, ReduceOp op) override {
    check_collective_input("all_reduce_", t);
    MT_CHECK(!t.is_cuda(), "all_reduce_: the MPI communicator takes CPU tensors");
    const MPI_Datatype type = mpi_type(t.dtype(), "all_reduce_");
    MT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), static_cast<int>(t.numel()), type,
                               op == ReduceOp::max ? MPI_MAX : MPI_SUM, comm_));
    if (op == ReduceOp::average) {
      int world = 1;
      MT_MPI_CHECK(MPI_Comm_size(comm_, &world));
      NoGradGuard no_grad;
      t.copy_(mul(t.detach(), 1.0 / world));
    }
  }

  void broadcast_(const Tensor& t, int root) override {
    check_collective_input("broadcast_", t);
    MT_CHECK(!t.is_cuda(), "broadcast_: the MPI communicator takes CPU tensors");
    MT_MPI_CHECK(MPI_Bcast(t.data_ptr(), static_cast<int>(t.nbytes()), MPI_BYTE, root, comm_));
  }

  void all_gather(const Tensor& in, const Tensor& out) override {
    check_collective_input("all_gather", in);
    check_collective_input("all_gather", out);
    MT_MPI_CHECK(MPI_Allgather(in.data_ptr(), static_cast<int>(in.nbytes()), MPI_BYTE, out.data_ptr(),
                               static_cast<int>(in.nbytes()), MPI_BYTE, comm_));
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

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
  MT_MPI_CHECK(MPI_Comm_free(&local));
  mpi_ = make_mpi_communicator();
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

void ProcessGroup::all_reduce_(const Tensor& t, ReduceOp op) {
  if (world_ == 1 && op != ReduceOp::max) return;  // sum and average of one are the value itself
  communicator_for(t).all_reduce_(t, op);
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

void ProcessGroup::barrier() { MT_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); }

double ProcessGroup::mean_over_ranks(double value) {
  const Tensor t = from_vector({value}, {1}, DType::f64);
  all_reduce_(t, ReduceOp::average);
  return t.item();
}

}  // namespace mt::dist
