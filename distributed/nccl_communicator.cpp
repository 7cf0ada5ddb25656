// NCCL for CUDA tensors: one communicator per process on the GPU its local rank picks,
// collectives on a dedicated communication stream ordered after the caller's stream by an
// event; the caller's stream waits for the result when the Work is waited on (never the
// host), and a watchdog thread polls NCCL's asynchronous errors and the timeout.
#include "distributed/process_group.h"

#include "core/error.h"

#if defined(MT_WITH_CUDA)

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

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

// A collective launched on the communication stream: its completion event, what it is,
// and when it was launched (for the watchdog).
struct InFlight {
  std::shared_ptr<cuda::Event> done;
  std::string what;
  std::chrono::steady_clock::time_point launched;
};

// The caller's stream waits for the collective's event; the host never does.
class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<cuda::Event> done, int device) : done_(std::move(done)), device_(device) {}
  void wait() override { done_->wait_on(cuda::current_stream(device_)); }

 private:
  std::shared_ptr<cuda::Event> done_;
  int device_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(const ProcessGroup& group, Communicator& bootstrap)
      : group_(group), device_(group.local_rank() % std::max(1, cuda::device_count())), describe_(group.describe()) {
    MT_CHECK(cuda::device_count() > 0, "NCCL: ", describe_, " has no CUDA device");
    // NCCL bootstraps over a socket and skips the loopback interface; a host without another
    // one (an isolated GPU box) then gets an id with no address. When every rank is on this
    // host, loopback is the right interface anyway; the user's NCCL_SOCKET_IFNAME still wins.
    if (group.local_world_size() == group.world_size()) setenv("NCCL_SOCKET_IFNAME", "lo", /*overwrite=*/0);
    cuda::DeviceGuard on_device(device_);
    ncclUniqueId id{};
    if (group.rank() == 0) MT_NCCL_CHECK(ncclGetUniqueId(&id));
    // The id's raw bytes, kept as u8 (from_blob's result dtype defaults to f32, which would convert them).
    const Tensor bytes = from_blob(&id, {static_cast<int64_t>(sizeof(id))}, DType::u8, DType::u8);
    bootstrap.broadcast_(bytes, 0);
    std::memcpy(&id, bytes.data_ptr(), sizeof(id));
    MT_NCCL_CHECK(ncclCommInitRank(&comm_, group.world_size(), id, group.rank()));
    stream_ = cuda::Stream::create(device_, cuda::Stream::Priority::high);
    watchdog_ = std::thread([this] { watch(); });
  }
  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (comm_ != nullptr) ncclCommDestroy(comm_);  // no throw from a destructor
  }

  std::unique_ptr<Work> all_reduce_async_(const Tensor& t, ReduceOp op, const std::string& what) override {
    return run(t, what, [&](cudaStream_t s) {
      MT_NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                                  nccl_op(op), comm_, s));
    });
  }
  void broadcast_(const Tensor& t, int root) override {
    run(t, "broadcast_", [&](cudaStream_t s) {
      MT_NCCL_CHECK(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, comm_, s));
    })->wait();
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    run(in, "all_gather", [&](cudaStream_t s) {
      MT_NCCL_CHECK(ncclAllGather(in.data_ptr(), out.data_ptr(), in.nbytes(), ncclUint8, comm_, s));
    })->wait();
  }

 private:
  // The collective waits for the caller's stream (an event), runs on the communication
  // stream, and is handed to the watchdog; the returned Work makes a stream wait for it.
  template <typename Launch>
  std::unique_ptr<Work> run(const Tensor& t, const std::string& what, Launch&& launch) {
    MT_CHECK(t.is_cuda() && t.device().index == device_, what, ": ", describe_, " communicates on cuda:", device_,
             ", got a tensor on ", t.device().str());
    MT_CHECK(t.is_contiguous(), what, ": the tensor must be contiguous");
    cuda::DeviceGuard on_device(device_);
    const cuda::Stream compute = cuda::current_stream(device_);
    cuda::Event ready(device_);
    ready.record(compute);
    ready.wait_on(stream_);
    // The launch itself can block the host: NCCL connects to the peers a collective needs on
    // its first use, and waits for them there. The watchdog times that wait too.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      launching_ = what;
      launch_started_ = std::chrono::steady_clock::now();
    }
    try {
      launch(static_cast<cudaStream_t>(stream_.handle()));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      launching_.clear();  // nothing is in flight: the watchdog must not time it
      throw;
    }
    auto done = std::make_shared<cuda::Event>(device_);
    done->record(stream_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      launching_.clear();
      in_flight_.push_back(InFlight{done, what, std::chrono::steady_clock::now()});
    }
    return std::make_unique<NcclWork>(done, device_);
  }

  // The watchdog: every 50 ms, retire finished collectives, poll NCCL's asynchronous error,
  // and give up on the oldest collective once it has run longer than the group's timeout.
  // Either failure aborts the communicator (freeing the GPU from the stuck kernel) and ends
  // the process: the host may be blocked in a CUDA call behind that kernel.
  void watch() {
    // This thread's CUDA calls must go to this rank's GPU: on device 0 they would create a
    // context there, costing every rank's memory on GPU 0.
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::milliseconds(50));
      // Raw queries: this thread must not throw, and at exit the runtime may already be unloading.
      while (!in_flight_.empty()) {
        const cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(in_flight_.front().done->handle()));
        if (state == cudaErrorNotReady) break;
        if (state == cudaErrorCudartUnloading) return;
        if (state != cudaSuccess) {
          fail(in_flight_.front().what, detail::str_cat("failed: CUDA reports ", cudaGetErrorString(state)));
        }
        in_flight_.pop_front();
      }
      ncclResult_t async_error = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &async_error) == ncclSuccess && async_error != ncclSuccess &&
          async_error != ncclInProgress) {
        fail(in_flight_.empty() ? std::string("(none in flight)") : in_flight_.front().what,
             detail::str_cat("failed: NCCL reports ", ncclGetErrorString(async_error), " (", ncclGetLastError(comm_),
                             ")"));
      }
      if (!launching_.empty() &&
          std::chrono::duration<double>(std::chrono::steady_clock::now() - launch_started_).count() >
              group_.timeout_seconds()) {
        fail(launching_, detail::str_cat("could not start within ", group_.timeout_seconds(),
                                         " s (MT_COLLECTIVE_TIMEOUT_S): a peer died or stopped"));
      }
      if (!in_flight_.empty()) {
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - in_flight_.front().launched).count();
        if (seconds > group_.timeout_seconds()) {
          fail(in_flight_.front().what, detail::str_cat("did not finish within ", group_.timeout_seconds(),
                                                        " s (MT_COLLECTIVE_TIMEOUT_S): a peer died or stopped"));
        }
      }
    }
  }

  // Says what failed first, then aborts the communicator (which frees the GPU from the stuck
  // kernel) but gives that no more than two seconds: the process ends either way.
  [[noreturn]] void fail(const std::string& what, const std::string& why) {
    std::fprintf(stderr, "mixtrain: %s: NCCL %s %s; aborting the communicator\n", describe_.c_str(), what.c_str(),
                 why.c_str());
    std::fflush(stderr);
    std::thread([comm = comm_] { ncclCommAbort(comm); }).detach();
    std::this_thread::sleep_for(std::chrono::seconds(2));
    end_process_after_collective_failure(describe_, "NCCL " + what, why);
  }

  const ProcessGroup& group_;
  int device_;
  std::string describe_;
  ncclComm_t comm_ = nullptr;
  cuda::Stream stream_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<InFlight> in_flight_;
  std::string launching_;  // a collective whose launch has not returned yet, or empty
  std::chrono::steady_clock::time_point launch_started_;
  bool stop_ = false;
  std::thread watchdog_;
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
