// NCCL for CUDA tensors: one communicator per process on the GPU its local rank picks,
// collectives on a dedicated communication stream ordered after the caller's stream by an
// event, and the caller's stream made to wait for the result (never the host).
#include "distributed/process_group.h"

#include "core/error.h"

#if defined(MT_WITH_CUDA)

#include <cuda_runtime.h>
#include <nccl.h>

#include "core/check_nccl.h"
#include "core/cuda_context.h"

namespace mt::dist {

namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return ncclFloat64;
    case DType::f32:
      return ncclFloat32;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i64:
      return ncclInt64;
    case DType::i32:
      return ncclInt32;
    case DType::u8:
    case DType::boolean:
      return ncclUint8;
    default:
      throw DTypeError(detail::str_cat("NCCL: no NCCL type for ", dtype_name(dtype)));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::average:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
  }
  return ncclSum;
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(const ProcessGroup& group, Communicator& bootstrap)
      : device_(group.local_rank() % std::max(1, cuda::device_count())), describe_(group.describe()) {
    MT_CHECK(cuda::device_count() > 0, "NCCL: ", describe_, " has no CUDA device");
    cuda::DeviceGuard on_device(device_);
    ncclUniqueId id{};
    if (group.rank() == 0) MT_NCCL_CHECK(ncclGetUniqueId(&id));
    const Tensor bytes = from_blob(&id, {static_cast<int64_t>(sizeof(id))}, DType::u8).clone();
    bootstrap.broadcast_(bytes, 0);
    std::memcpy(&id, bytes.data_ptr(), sizeof(id));
    MT_NCCL_CHECK(ncclCommInitRank(&comm_, group.world_size(), id, group.rank()));
    stream_ = cuda::Stream::create(device_, cuda::Stream::Priority::high);
  }
  ~NcclCommunicator() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);  // no throw from a destructor
  }

  void all_reduce_(const Tensor& t, ReduceOp op) override {
    run(t, "all_reduce_", [&](cudaStream_t s) {
      MT_NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                                  nccl_op(op), comm_, s));
    });
  }
  void broadcast_(const Tensor& t, int root) override {
    run(t, "broadcast_", [&](cudaStream_t s) {
      MT_NCCL_CHECK(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, comm_, s));
    });
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    run(in, "all_gather", [&](cudaStream_t s) {
      MT_NCCL_CHECK(ncclAllGather(in.data_ptr(), out.data_ptr(), in.nbytes(), ncclUint8, comm_, s));
    });
  }

 private:
  // The collective waits for the caller's stream, runs on the communication stream, and the
  // caller's stream waits for it.
  template <typename Launch>
  void run(const Tensor& t, const char* op, Launch&& launch) {
    MT_CHECK(t.is_cuda() && t.device().index == device_, op, ": ", describe_, " communicates on cuda:", device_,
             ", got a tensor on ", t.device().str());
    MT_CHECK(t.is_contiguous(), op, ": the tensor must be contiguous");
    cuda::DeviceGuard on_device(device_);
    const cuda::Stream compute = cuda::current_stream(device_);
    cuda::Event ready(device_);
    ready.record(compute);
    ready.wait_on(stream_);
    launch(static_cast<cudaStream_t>(stream_.handle()));
    cuda::Event done(device_);
    done.record(stream_);
    done.wait_on(compute);
  }

  int device_;
  std::string describe_;
  ncclComm_t comm_ = nullptr;
  cuda::Stream stream_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const ProcessGroup& group, Communicator& bootstrap) {
  return std::make_unique<NcclCommunicator>(group, bootstrap);
}

}  // namespace mt::dist

#else

namespace mt::dist {

std::unique_ptr<Communicator> make_nccl_communicator(const ProcessGroup& group, Communicator&) {
  throw DeviceError(detail::str_cat("NCCL: ", group.describe(), ": mixtrain was built without CUDA"));
}

}  // namespace mt::dist

#endif
