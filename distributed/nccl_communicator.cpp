// NCCL for CUDA tensors: one communicator per process on the GPU its local rank picks,
// collectives on a dedicated communication stream ordered after the caller's stream by an
// event; the caller's stream waits for the result when the Work is waited on (never the
// host). A poller thread retires finished collectives and polls NCCL's asynchronous
// errors; a monitor thread, which makes no CUDA call, enforces the timeout.
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
// and when it was launched (for the monitor).
struct InFlight {
  std::shared_ptr<cuda::Event> done;
  std::string what;
  std::chrono::steady_clock::time_point launched;
};

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
    // Setting up the communicator waits for every rank: the monitor times it like a collective.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      launching_ = "setup (ncclCommInitRank)";
      launch_started_ = std::chrono::steady_clock::now();
    }
    monitor_ = std::thread([this] { monitor(); });
    try {
      ncclComm_t comm = nullptr;
      MT_NCCL_CHECK(ncclCommInitRank(&comm, group.world_size(), id, group.rank()));
      {
        std::lock_guard<std::mutex> lock(mutex_);
        comm_ = comm;
        launching_.clear();
      }
      stream_ = cuda::Stream::create(device_, cuda::Stream::Priority::high);
      poller_ = std::thread([this] { poll(); });
    } catch (...) {
      stop_monitoring();  // the destructor will not run
      if (comm_ != nullptr) ncclCommDestroy(comm_);
      throw;
    }
  }
  ~NcclCommunicator() override {
    stop_monitoring();
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
  // stream, and is handed to the poller; the returned Work makes a stream wait for it. It is
  // timed from before its first CUDA call: any of them (and NCCL's launch, which connects to
  // the peers on first use and waits for them there) can block the host.
  template <typename Launch>
  std::unique_ptr<Work> run(const Tensor& t, const std::string& what, Launch&& launch) {
    MT_CHECK(t.is_cuda() && t.device().index == device_, what, ": ", describe_, " communicates on cuda:", device_,
             ", got a tensor on ", t.device().str());
    MT_CHECK(t.is_contiguous(), what, ": the tensor must be contiguous");
    {
      std::lock_guard<std::mutex> lock(mutex_);
      launching_ = what;
      launch_started_ = std::chrono::steady_clock::now();
    }
    std::shared_ptr<cuda::Event> done;
    try {
      cuda::DeviceGuard on_device(device_);
      cuda::Event ready(device_);
      ready.record(cuda::current_stream(device_));
      ready.wait_on(stream_);
      launch(static_cast<cudaStream_t>(stream_.handle()));
      done = std::make_shared<cuda::Event>(device_);
      done->record(stream_);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      launching_.clear();  // nothing is in flight: the monitor must not time it
      throw;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      launching_.clear();
      in_flight_.push_back(InFlight{done, what, std::chrono::steady_clock::now()});
    }
    return std::make_unique<NcclWork>(done, device_);
  }

  void stop_monitoring() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (poller_.joinable()) poller_.join();
    if (monitor_.joinable()) monitor_.join();
  }

  // Two threads watch the collectives, because a CUDA call can block behind a kernel that
  // never ends (an NCCL kernel waiting for a dead peer): with lazy module loading a kernel's
  // first launch synchronises the context, and a copy to the host waits for the device.
  //  - The poller makes the CUDA and NCCL calls: it retires finished collectives and polls
  //    NCCL's asynchronous error. If one of its calls blocks, only the poller stops.
  //  - The monitor makes none: it reads the launch times under the mutex (which nobody holds
  //    across a CUDA call) and gives up once the oldest collective, or a launch, has taken
  //    longer than the group's timeout.
  // Either failure aborts the communicator (freeing the GPU from the stuck kernel) and ends
  // the process: the main thread may be blocked in a CUDA call behind that kernel.
  void poll() {
    // This thread's CUDA calls must go to this rank's GPU: on device 0 they would create a
    // context there, costing every rank's memory on GPU 0.
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::milliseconds(50));
      while (!stop_ && !in_flight_.empty()) {
        std::shared_ptr<cuda::Event> oldest = in_flight_.front().done;
        const std::string what = in_flight_.front().what;
        lock.unlock();
        // Raw queries: this thread must not throw, and at exit the runtime may already be unloading.
        const cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(oldest->handle()));
        lock.lock();
        if (state == cudaErrorNotReady) break;    // in_flight_ still holds the event: nothing is destroyed
        if (state == cudaErrorCudartUnloading) {  // the process is ending: nothing left to time
          stop_ = true;
          wake_.notify_all();
          return;
        }
        if (state != cudaSuccess) fail(what, detail::str_cat("failed: CUDA reports ", cudaGetErrorString(state)));
        in_flight_.pop_front();  // only this thread removes entries
        lock.unlock();
        oldest.reset();  // the event may be destroyed here: never under the lock the monitor needs
        lock.lock();
      }
      lock.unlock();
      ncclResult_t async_error = ncclSuccess;
      const bool polled = ncclCommGetAsyncError(comm_, &async_error) == ncclSuccess;
      lock.lock();
      if (polled && async_error != ncclSuccess && async_error != ncclInProgress) {
        fail(in_flight_.empty() ? std::string("(none in flight)") : in_flight_.front().what,
             detail::str_cat("failed: NCCL reports ", ncclGetErrorString(async_error), " (", ncclGetLastError(comm_),
                             ")"));
      }
    }
  }

  void monitor() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::milliseconds(50));
      const auto now = std::chrono::steady_clock::now();
      const double timeout = group_.timeout_seconds();
      if (!launching_.empty() && std::chrono::duration<double>(now - launch_started_).count() > timeout) {
        fail(launching_, detail::str_cat("could not start within ", timeout,
                                         " s (MT_COLLECTIVE_TIMEOUT_S): a peer died or stopped"));
      }
      if (!in_flight_.empty() && std::chrono::duration<double>(now - in_flight_.front().launched).count() > timeout) {
        fail(in_flight_.front().what, detail::str_cat("did not finish within ", timeout,
                                                      " s (MT_COLLECTIVE_TIMEOUT_S): a peer died or stopped"));
      }
    }
  }

  // Says what failed first, then aborts the communicator (which frees the GPU from the stuck
  // kernel) but gives that no more than two seconds: the process ends either way. Called
  // with the mutex held, which it keeps: the main thread stays out of NCCL meanwhile, and a
  // second failure (the other thread) waits here until the process ends.
  [[noreturn]] void fail(const std::string& what, const std::string& why) {
    std::fprintf(stderr, "mixtrain: %s: NCCL %s %s; aborting the communicator\n", describe_.c_str(), what.c_str(),
                 why.c_str());
    std::fflush(stderr);
    if (comm_ != nullptr) std::thread([comm = comm_] { ncclCommAbort(comm); }).detach();  // null: setup never ended
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
  std::thread poller_;   // CUDA and NCCL queries
  std::thread monitor_;  // the timeouts, with no CUDA call that could block it
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
