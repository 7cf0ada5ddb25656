// CUDA Graphs (core/cuda_context.h): capture with the allocator's ledger, instantiate, replay.
#include <cuda_runtime.h>

#include <exception>
#include <string>

#include "core/cuda/capture_ledger.h"
#include "core/cuda/check.h"
#include "core/cuda_context.h"
#include "core/error.h"

namespace mt::cuda {

namespace {

// Ends the capture however the body left (returned or threw), so that the stream is usable
// again; returns the captured graph, or null with the status.
cudaGraph_t end_capture(const Stream& stream, cudaError_t* status) {
  cudaGraph_t graph = nullptr;
  *status = cudaStreamEndCapture(stream.handle(), &graph);
  if (*status != cudaSuccess) {
    cudaGetLastError();  // clear this thread's last error
    if (graph != nullptr) cudaGraphDestroy(graph);
    return nullptr;
  }
  return graph;
}

// What the ledger says is wrong with the body, each part led by a space and the parts
// separated by ';', or "" when nothing is.
std::string ledger_problems(const internal::CaptureLedger& ledger) {
  std::string problems;
  if (!ledger.live.empty()) {
    size_t bytes = 0;
    for (const auto& entry : ledger.live) bytes += entry.second;
    problems += detail::str_cat(" it kept ", ledger.live.size(), " tensor(s) it allocated (", format_bytes(bytes),
                                "): write results into tensors made before the capture (out.copy_(result)), and "
                                "keep gradients allocated (zero_grad(/*set_to_none=*/false)) so that backward "
                                "accumulates into them;");
  }
  if (!ledger.deferred.empty()) {
    size_t bytes = 0;
    for (const auto& f : ledger.deferred) bytes += f.nbytes;
    problems += detail::str_cat(" it released ", ledger.deferred.size(), " tensor(s) made before the capture (",
                                format_bytes(bytes),
                                "), which a graph cannot free: release them before capturing, or keep them;");
  }
  if (ledger.host_copies > 0) {
    problems += detail::str_cat(" it copied from host memory ", ledger.host_copies,
                                " time(s), which a replay would read again after it is gone: make such tensors "
                                "before the step (x.copy_(batch) between runs) or on the device (arange, full);");
  }
  if (ledger.other_stream_allocations > 0) {
    problems += detail::str_cat(" it allocated ", ledger.other_stream_allocations,
                                " tensor(s) on another stream, outside the graph;");
  }
  if (!problems.empty()) problems.pop_back();  // the last part's ';'
  return problems;
}

}  // namespace

Graph::~Graph() { reset(); }

Graph::Graph(Graph&& other) noexcept : graph_(other.graph_), exec_(other.exec_), nodes_(other.nodes_) {
  other.graph_ = nullptr;
  other.exec_ = nullptr;
  other.nodes_ = 0;
}

Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    reset();
    graph_ = other.graph_;
    exec_ = other.exec_;
    nodes_ = other.nodes_;
    other.graph_ = nullptr;
    other.exec_ = nullptr;
    other.nodes_ = 0;
  }
  return *this;
}

void Graph::reset() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);  // no throw from a destructor
  if (graph_ != nullptr) cudaGraphDestroy(graph_);
  exec_ = nullptr;
  graph_ = nullptr;
  nodes_ = 0;
}

namespace {

// What a refused capture leaves: tensors made during the step and kept hold addresses that
// were never backed (freeing them later must be a no-op, and using them would fault), and
// tensors made before it that the step released are freed now, with no work left to read them.
void discard_capture(internal::CaptureLedger& ledger) {
  internal::poison(ledger);
  internal::free_deferred(ledger);
}

// What a refused capture tells the user: the step did not run, and what it kept holds no memory.
std::string not_run_note(const internal::CaptureLedger& ledger) {
  if (ledger.live.empty()) return " The step did not run.";
  return detail::str_cat(" The step did not run, and the ", ledger.live.size(),
                         " tensor(s) it made and kept (gradients set to none, say) hold no memory: drop them "
                         "(zero_grad()) before using the model again.");
}

std::string what_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace

void Graph::capture(const Stream& stream, const std::function<void()>& body) {
  reset();
  DeviceGuard on_device(stream.device());
  internal::CaptureLedger ledger;
  ledger.stream = stream.handle();
  MT_CUDA_CHECK(cudaStreamBeginCapture(stream.handle(), cudaStreamCaptureModeThreadLocal));
  internal::set_capture_ledger(&ledger);
  std::exception_ptr body_error;
  try {
    body();
  } catch (...) {
    body_error = std::current_exception();
  }
  internal::set_capture_ledger(nullptr);
  cudaError_t status = cudaSuccess;
  cudaGraph_t graph = end_capture(stream, &status);
  // A refused capture is never launched: a graph whose allocations outlive it, or whose copies
  // read host memory that may be gone, must not run even once. So nothing of the step runs.
  const std::string problems = graph == nullptr || body_error ? std::string() : ledger_problems(ledger);
  if (graph == nullptr || body_error || !problems.empty()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    discard_capture(ledger);
    if (graph == nullptr) {
      throw DeviceError(detail::str_cat(
          "CUDA graph capture on cuda:", stream.device(), " failed: ", cudaGetErrorString(status),
          body_error ? "; while the step ran: " + what_of(body_error) : std::string(),
          ". The captured code must not synchronise with the host (item(), to_vector(), a copy to the host, "
          "Stream::synchronize) and must join any other stream it uses back into the capturing one.",
          not_run_note(ledger)));
    }
    if (body_error) std::rethrow_exception(body_error);
    throw Error(detail::str_cat("CUDA graph capture on cuda:", stream.device(),
                                ": the captured step cannot be replayed as it stands:", problems, ".",
                                not_run_note(ledger)));
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  if (instantiated != cudaSuccess) {
    cudaGetLastError();
    cudaGraphDestroy(graph);
    throw DeviceError(detail::str_cat("CUDA graph on cuda:", stream.device(),
                                      ": cudaGraphInstantiate failed: ", cudaGetErrorString(instantiated)));
  }
  size_t nodes = 0;
  MT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  graph_ = graph;
  exec_ = exec;
  nodes_ = nodes;
}

std::string Graph::observe(const Stream& stream, const std::function<void()>& body) {
  DeviceGuard on_device(stream.device());
  internal::CaptureLedger ledger;
  ledger.stream = stream.handle();
  ledger.capturing = false;
  internal::set_capture_ledger(&ledger);
  try {
    body();
  } catch (...) {
    internal::set_capture_ledger(nullptr);
    internal::free_deferred(ledger);
    throw;
  }
  internal::set_capture_ledger(nullptr);
  ledger.other_stream_allocations = 0;                   // eager work on another stream is no concern here
  const std::string problems = ledger_problems(ledger);  // before the deferred frees empty the ledger
  internal::free_deferred(ledger);
  return problems;
}

void Graph::write_dot(const std::string& path) const {
  MT_CHECK(graph_ != nullptr, "Graph::write_dot: nothing has been captured");
  MT_CUDA_CHECK(cudaGraphDebugDotPrint(graph_, path.c_str(), cudaGraphDebugDotFlagsVerbose));
}

void Graph::replay(const Stream& stream) const {
  MT_CHECK(exec_ != nullptr, "Graph::replay: nothing has been captured");
  DeviceGuard on_device(stream.device());
  MT_CUDA_CHECK(cudaGraphLaunch(exec_, stream.handle()));
}

}  // namespace mt::cuda
