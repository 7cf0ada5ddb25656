// Op micro-benchmarks: one op (or one fused pair) at a time, at GPT-2 124M's shapes, each timed
// against its floor.
//
//   op_bench --device cuda --dtype bf16 [--ops gemm,gemm_bias,layer_norm,attention,attention_bthd,...]
//
//   gemm           y = x W^T               x [rows, width], W [4 width, width] (the MLP's c_fc), forward
//   gemm_bias      y = x W^T + b           the same, with the bias in cuBLASLt's epilogue, forward
//   layer_norm     layer_norm(x, w, b)     x [rows, width], forward + backward of a random dy
//   add_layer_norm the transformer's residual add and norm: add_layer_norm(x, delta, w, b) with
//                  an f32 residual stream x and parameters, delta and the normed output in
//                  --dtype, forward + backward of random gradients of both outputs
//   attention      causal SDPA             q, k, v [batch, heads, seq, width / heads], forward +
//                                          backward of a random dO
//   attention_bthd the same, q, k, v and dO stored [batch, seq, heads, width / heads] and seen
//                  through a transpose: the layout a transformer's heads come from
//   cross_entropy  the LM head and its loss: linear_cross_entropy(x, W, target), x [rows, width],
//                  W [vocab, width], forward + backward (the fused op; PyTorch's twin forms the logits)
//   adamw          one AdamW step over GPT-2's parameter set (--layers blocks; --adamw-dtype, f32 by
//                  default as mixed-precision training keeps its parameters)
// and, only when --ops names them:
//   norm_bytes     layer_norm's rows moved by plain element-wise kernels in the same two steps:
//                  y = x * 1 (reads x, writes y), then dx = dy + x (reads dy and x, writes dx);
//                  what streaming those bytes alone takes at this size, launches and ramps included
//   layer_norm_fwd layer_norm's forward alone (no gradients recorded): its share of layer_norm
//   gelu           gelu(x, tanh), the MLP's activation, x [rows, 4 width], forward + backward of a
//                  random dy (on the CPU: the element loops, `--device cpu --dtype f32 --ops gelu
//                  --rows 1024 --width 128` is the CPU demo's [1024, 512])
//
// Floors. First the device's GEMM rate (a --rate-size cube matmul in --dtype) and its copy bandwidth
// (a --copy-mib device-to-device copy, read + write bytes) are measured; then each op's floor is
// max(FLOPs / GEMM rate, bytes / copy bandwidth), with the op's matrix-product FLOPs and the least
// bytes any implementation must move (formulas at each op). Element-wise arithmetic runs on CUDA
// cores, not tensor cores, so it is not counted against the GEMM rate: those ops are bound by bytes.
//
// Timing: --warmup untimed runs, then --iters timed ones, the median printed. Each op has --sets
// input sets (AdamW one: its state is far larger than L2), used in turn, so that repeated runs do
// not find their inputs in the 50 MB L2. On CUDA the op's runs over the sets, again and again until
// there are at least --graph-runs of them, are captured in one CUDA Graph after the warm-up, and
// each replay is timed between two events, divided by its runs: the op's device time without the
// host's launch gaps (the way to time small ops; --eager times each run between events instead,
// launch gaps included, as a training loop without graphs sees them). A replay also pays its own
// launch, which no op pays inside a training step captured whole; --graph-runs spreads it over
// enough runs that it is a small share of each. The two probes (the GEMM rate and the copy
// bandwidth) are single launches of 0.5 ms or more, timed eagerly (see the copy's). An op whose
// capture is refused is timed eagerly, and the table says so. On the CPU, steady_clock.
// tools/bench/op_bench_torch.py is the PyTorch twin, timed the same way, and prints the same
// `op_bench_torch: <op> <median_ms>` lines.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "core/cuda_context.h"
#include "examples/common/cli.h"
#include "examples/lm/trainer.h"
#include "ops/backends.h"
#include "ops/ops.h"
#include "optim/adamw.h"
#include "tools/bench/bench_common.h"

namespace {

const std::vector<std::string> kOps = {"gemm",      "gemm_bias",      "layer_norm",    "add_layer_norm",
                                       "attention", "attention_bthd", "cross_entropy", "adamw"};
const std::vector<std::string> kReferenceOps = {"norm_bytes", "layer_norm_fwd", "gelu"};  // run only when named

struct Shapes {
  int64_t rows = 16384;  // B * T of the token-wise ops
  int64_t width = 768;
  int64_t batch = 16, seq = 1024, heads = 12;  // attention; seq is also wpe's length in adamw
  int64_t vocab = 50304;
  int64_t layers = 12;        // adamw's parameter set
  int64_t ce_chunk_rows = 0;  // cross_entropy's chunk_rows (0: the op's default)
};

struct Timing {
  mt::Device device;
  int64_t warmup = 5, iters = 50;
  int64_t sets = 4;         // input sets per op, used in turn
  int64_t graph_runs = 32;  // CUDA graphs: the fewest runs of the op per replay (the sets repeated)
  bool graph = true;        // CUDA: time replays of a captured graph
};

// One op's result: the median and what bounds it.
struct Measurement {
  std::string op, shape;
  std::string timed;  // "graph" or "eager", and why eager where a graph was asked for
  double ms = 0;
  double flops = 0;  // matrix-product FLOPs (0: none worth counting)
  double bytes = 0;  // the least the op must read and write
};

struct Rates {
  double flops_per_ms = 0;  // the measured GEMM rate
  double bytes_per_ms = 0;  // the measured copy bandwidth, read + write
};

using bench::median;

// Calls run(i) for i < iters on cuda:index's current stream, each between two events; the ms of each.
std::vector<double> event_times_ms(int index, int64_t iters, const std::function<void(int64_t)>& run) {
  mt::cuda::synchronize_device(index);
  std::vector<mt::cuda::Event> starts, ends;
  for (int64_t i = 0; i < iters; ++i) {
    starts.emplace_back(index, mt::cuda::Event::Timing::enabled);
    ends.emplace_back(index, mt::cuda::Event::Timing::enabled);
  }
  const mt::cuda::Stream stream = mt::cuda::current_stream(index);
  for (int64_t i = 0; i < iters; ++i) {
    starts[i].record(stream);
    run(i);
    ends[i].record(stream);
  }
  mt::cuda::synchronize_device(index);
  std::vector<double> ms;
  for (int64_t i = 0; i < iters; ++i) ms.push_back(starts[i].elapsed_ms(ends[i]));
  return ms;
}

// Runs `body` timing.warmup times untimed, then timing.iters times, each timed; returns the median in ms.
double time_eager_ms(const Timing& timing, const std::function<void(int64_t)>& body, int64_t sets = 1) {
  for (int64_t i = 0; i < timing.warmup; ++i) body(i % sets);
  std::vector<double> ms;
  if (timing.device.is_cuda()) {
    ms = event_times_ms(timing.device.index, timing.iters, [&](int64_t i) { body(i % sets); });
  } else {
    for (int64_t i = 0; i < timing.iters; ++i) {
      const auto start = std::chrono::steady_clock::now();
      body(i % sets);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
  }
  return median(ms);
}

// The first line of an error message, for the table.
std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// Times one op: body(k) runs it on input set k of `sets`. On CUDA with graphs on, after the
// warm-up the runs over the sets, repeated until there are timing.graph_runs of them (a whole number
// of passes), are captured in one graph whose replays are timed; the median replay over its runs is
// the op's time. Sets m->timed to how it was timed.
double time_op_ms(const Timing& timing, int64_t sets, const std::function<void(int64_t)>& body, Measurement* m) {
  if (!timing.device.is_cuda() || !timing.graph) {
    m->timed = "eager";
    return time_eager_ms(timing, body, sets);
  }
  const int index = timing.device.index;
  // At least one eager run: what an op makes lazily (plans, workspaces, state) must exist before
  // the capture, which would refuse it.
  for (int64_t i = 0; i < std::max<int64_t>(timing.warmup, 1); ++i) {
    for (int64_t k = 0; k < sets; ++k) body(k);
  }
  const mt::cuda::Stream stream = mt::cuda::current_stream(index);
  const int64_t passes = std::max<int64_t>(1, (timing.graph_runs + sets - 1) / sets);
  mt::cuda::Graph graph;
  try {
    graph.capture(stream, [&] {
      for (int64_t pass = 0; pass < passes; ++pass) {
        for (int64_t k = 0; k < sets; ++k) body(k);
      }
    });
  } catch (const std::exception& e) {
    m->timed = "eager (capture refused: " + first_line(e.what()) + ")";
    std::fprintf(stderr, "op_bench: %s: %s\n", m->op.c_str(), m->timed.c_str());
    return time_eager_ms(timing, body, sets);
  }
  graph.replay(stream);  // the first replay uploads the graph
  std::vector<double> ms = event_times_ms(index, timing.iters, [&](int64_t) { graph.replay(stream); });
  for (double& each : ms) each /= static_cast<double>(passes * sets);
  m->timed = "graph";
  return median(ms);
}

mt::TensorOptions on(const mt::Device& device, mt::DType dtype, bool requires_grad = false) {
  return mt::TensorOptions().device(device).dtype(dtype).requires_grad(requires_grad);
}

// Drops the leaves' gradients (set to none) after a backward, so that each backward writes fresh
// ones as the first does and a captured run keeps nothing it made.
void clear_grads(std::vector<mt::Tensor> leaves) {
  for (mt::Tensor& t : leaves) t.set_grad(mt::Tensor());
}

// ---- the probes that set the floors ----

// A size^3 matmul in dtype: 2 size^3 FLOPs.
double measure_gemm_rate(const Timing& timing, mt::DType dtype, int64_t size, double* ms_out) {
  mt::Generator generator(1);
  const mt::Tensor a = mt::randn({size, size}, on(timing.device, dtype), &generator);
  const mt::Tensor b = mt::randn({size, size}, on(timing.device, dtype), &generator);
  const double ms = time_eager_ms(timing, [&](int64_t) { mt::matmul(a, b); });
  *ms_out = ms;
  return 2.0 * static_cast<double>(size) * static_cast<double>(size) * static_cast<double>(size) / ms;
}

// A device-to-device copy (cudaMemcpyAsync) of mib MiB of random f32 values: it reads and writes
// every byte. Timed eagerly: captured in a graph the copy becomes a memcpy node that a copy engine
// runs, well below the bandwidth that the same copy launched eagerly, or a copy kernel either way,
// reaches.
double measure_copy_bandwidth(const Timing& timing, int64_t mib, double* ms_out) {
  const int64_t n = mib << 20;  // bytes
  mt::Generator generator(7);
  const mt::Tensor src = mt::randn({n / 4}, on(timing.device, mt::DType::f32), &generator);
  const mt::Tensor dst = mt::empty({n / 4}, on(timing.device, mt::DType::f32));
  const double ms = time_eager_ms(timing, [&](int64_t) { dst.copy_(src); });
  *ms_out = ms;
  return 2.0 * static_cast<double>(n) / ms;
}

// ---- the ops ----

Measurement bench_gemm(const Timing& timing, mt::DType dtype, const Shapes& s, bool with_bias) {
  mt::Generator generator(2);
  const int64_t out = 4 * s.width;
  std::vector<mt::Tensor> x, w, b;  // per input set: [R, C], [N, C], [N] or undefined
  for (int64_t k = 0; k < timing.sets; ++k) {
    x.push_back(mt::randn({s.rows, s.width}, on(timing.device, dtype), &generator));
    w.push_back(mt::randn({out, s.width}, on(timing.device, dtype), &generator));
    b.push_back(with_bias ? mt::randn({out}, on(timing.device, dtype), &generator) : mt::Tensor());
  }
  Measurement m;
  m.op = with_bias ? "gemm_bias" : "gemm";
  m.shape = mt::shape_str(x[0].shape()) + " x " + mt::shape_str(w[0].shape()) + "^T" + (with_bias ? " + b" : "");
  m.ms = time_op_ms(
      timing, timing.sets, [&](int64_t k) { mt::linear(x[k], w[k], b[k]); }, &m);
  // FLOPs = 2 R C N; bytes: read x [R, C] and W [N, C], write y [R, N] (and read the bias [N]).
  const double R = static_cast<double>(s.rows), C = static_cast<double>(s.width), N = static_cast<double>(out);
  const double es = static_cast<double>(mt::element_size(dtype));
  m.flops = 2 * R * C * N;
  m.bytes = es * (R * C + N * C + R * N + (with_bias ? N : 0));
  return m;
}

Measurement bench_layer_norm(const Timing& timing, mt::DType dtype, const Shapes& s) {
  mt::Generator generator(3);
  std::vector<mt::Tensor> x, w, b, dy;  // per input set: [R, C], [C], [C], [R, C]
  for (int64_t k = 0; k < timing.sets; ++k) {
    x.push_back(mt::randn({s.rows, s.width}, on(timing.device, dtype, true), &generator));
    w.push_back(mt::randn({s.width}, on(timing.device, dtype, true), &generator));
    b.push_back(mt::randn({s.width}, on(timing.device, dtype, true), &generator));
    dy.push_back(mt::randn({s.rows, s.width}, on(timing.device, dtype), &generator));
  }
  Measurement m;
  m.op = "layer_norm";
  m.shape = mt::shape_str(x[0].shape()) + " fwd+bwd";
  m.ms = time_op_ms(
      timing, timing.sets,
      [&](int64_t k) {
        mt::layer_norm(x[k], w[k], b[k]).backward(dy[k]);
        clear_grads({x[k], w[k], b[k]});
      },
      &m);
  // Bytes: forward reads x, w, b and writes y and the f32 row statistics (mean, rstd); backward
  // reads dy, x, w and the statistics and writes dx, dw, db. Rows: x twice, y, dy, dx = 5 R C;
  // parameters: w twice, b, dw, db = 5 C; statistics: 2 R f32 written and read.
  const double R = static_cast<double>(s.rows), C = static_cast<double>(s.width);
  const double es = static_cast<double>(mt::element_size(dtype));
  m.bytes = es * (5 * R * C + 5 * C) + 2 * 2 * R * 4;
  return m;
}

// layer_norm's forward alone, on inputs that need no gradients: nothing is saved for a backward.
Measurement bench_layer_norm_forward(const Timing& timing, mt::DType dtype, const Shapes& s) {
  mt::Generator generator(3);
  std::vector<mt::Tensor> x, w, b;  // per input set: [R, C], [C], [C]
  for (int64_t k = 0; k < timing.sets; ++k) {
    x.push_back(mt::randn({s.rows, s.width}, on(timing.device, dtype), &generator));
    w.push_back(mt::randn({s.width}, on(timing.device, dtype), &generator));
    b.push_back(mt::randn({s.width}, on(timing.device, dtype), &generator));
  }
  Measurement m;
  m.op = "layer_norm_fwd";
  m.shape = mt::shape_str(x[0].shape()) + " fwd";
  m.ms = time_op_ms(
      timing, timing.sets, [&](int64_t k) { mt::layer_norm(x[k], w[k], b[k]); }, &m);
  // Bytes: reads x, w and b, writes y and the f32 row statistics (mean, rstd).
  const double R = static_cast<double>(s.rows), C = static_cast<double>(s.width);
  m.bytes = static_cast<double>(mt::element_size(dtype)) * (2 * R * C + 2 * C) + 2 * R * 4;
  return m;
}

// layer_norm's row bytes (x twice, y, dy, dx) moved by two element-wise kernels, as layer_norm's
// forward and backward move them; the parameters and statistics (a few KB) are left out.
Measurement bench_norm_bytes(const Timing& timing, mt::DType dtype, const Shapes& s) {
  mt::Generator generator(3);
  std::vector<mt::Tensor> x, dy;  // per input set: [R, C] each
  for (int64_t k = 0; k < timing.sets; ++k) {
    x.push_back(mt::randn({s.rows, s.width}, on(timing.device, dtype), &generator));
    dy.push_back(mt::randn({s.rows, s.width}, on(timing.device, dtype), &generator));
  }
  Measurement m;
  m.op = "norm_bytes";
  m.shape = mt::shape_str(x[0].shape()) + " y = x * 1; dx = dy + x";
  m.ms = time_op_ms(
      timing, timing.sets,
      [&](int64_t k) {
        mt::mul(x[k], 1.0);
        mt::add(dy[k], x[k]);
      },
      &m);
  const double R = static_cast<double>(s.rows), C = static_cast<double>(s.width);
  m.bytes = static_cast<double>(mt::element_size(dtype)) * 5 * R * C;
  return m;
}

Measurement bench_add_layer_norm(const Timing& timing, mt::DType dtype, const Shapes& s) {
  mt::Generator generator(5);
  const mt::DType f32 = mt::DType::f32;
  std::vector<mt::Tensor> x, delta, w, b, dsum, dy;  // per input set: [R, C] x 2, [C] x 2, [R, C] x 2
  for (int64_t k = 0; k < timing.sets; ++k) {
    x.push_back(mt::randn({s.rows, s.width}, on(timing.device, f32, true), &generator));
    delta.push_back(mt::randn({s.rows, s.width}, on(timing.device, dtype, true), &generator));
    w.push_back(mt::randn({s.width}, on(timing.device, f32, true), &generator));
    b.push_back(mt::randn({s.width}, on(timing.device, f32, true), &generator));
    dsum.push_back(mt::randn({s.rows, s.width}, on(timing.device, f32), &generator));
    dy.push_back(mt::randn({s.rows, s.width}, on(timing.device, dtype), &generator));
  }
  Measurement m;
  m.op = "add_layer_norm";
  m.shape = mt::shape_str(x[0].shape()) + " f32 + " + mt::dtype_name(dtype) + " fwd+bwd";
  m.ms = time_op_ms(
      timing, timing.sets,
      [&](int64_t k) {
        const mt::AddNorm r = mt::add_layer_norm(x[k], delta[k], w[k], b[k], 1e-5, dtype);
        mt::autograd::run_backward({r.sum, r.normed}, {dsum[k], dy[k]}, /*retain_graph=*/false);
        clear_grads({x[k], delta[k], w[k], b[k]});
      },
      &m);
  // Bytes per element: forward reads x (f32) and delta, writes the sum (f32) and y; backward
  // reads dy, the sum and dsum (f32), writes dx (f32) and ddelta: 5 f32 and 4 low-precision
  // rows. Parameters and statistics as layer_norm's, in f32.
  const double R = static_cast<double>(s.rows), C = static_cast<double>(s.width);
  const double es = static_cast<double>(mt::element_size(dtype));
  m.bytes = (5 * 4 + 4 * es) * R * C + 4 * 5 * C + 2 * 2 * R * 4;
  return m;
}

// GELU in GPT-2's tanh form over the MLP's hidden rows.
Measurement bench_gelu(const Timing& timing, mt::DType dtype, const Shapes& s) {
  mt::Generator generator(6);
  const int64_t hidden = 4 * s.width;
  std::vector<mt::Tensor> x, dy;  // per input set: [R, 4 C] each
  for (int64_t k = 0; k < timing.sets; ++k) {
    x.push_back(mt::randn({s.rows, hidden}, on(timing.device, dtype, true), &generator));
    dy.push_back(mt::randn({s.rows, hidden}, on(timing.device, dtype), &generator));
  }
  Measurement m;
  m.op = "gelu";
  m.shape = mt::shape_str(x[0].shape()) + " tanh fwd+bwd";
  m.ms = time_op_ms(
      timing, timing.sets,
      [&](int64_t k) {
        mt::gelu(x[k], mt::GeluApproximation::tanh).backward(dy[k]);
        clear_grads({x[k]});
      },
      &m);
  // Bytes: forward reads x and writes y; backward reads dy and x and writes dx.
  m.bytes =
      static_cast<double>(mt::element_size(dtype)) * 5 * static_cast<double>(s.rows) * static_cast<double>(hidden);
  return m;
}

// bthd: the operands are stored [B, T, H, D] and passed as [B, H, T, D] transposed views.
Measurement bench_attention(const Timing& timing, mt::DType dtype, const Shapes& s, bool bthd) {
  mt::Generator generator(4);
  const int64_t d = s.width / s.heads;
  const mt::Shape shape = {s.batch, s.heads, s.seq, d};  // [B, H, T, D]
  const mt::Shape stored = bthd ? mt::Shape{s.batch, s.seq, s.heads, d} : shape;
  auto view = [&](const mt::Tensor& t) { return bthd ? t.transpose(1, 2) : t; };
  std::vector<mt::Tensor> q, k, v, dout;  // per input set, each stored as `stored`
  for (int64_t set = 0; set < timing.sets; ++set) {
    for (std::vector<mt::Tensor>* leaf : {&q, &k, &v}) {
      leaf->push_back(mt::randn(stored, on(timing.device, dtype, true), &generator));
    }
    dout.push_back(mt::randn(stored, on(timing.device, dtype), &generator));
  }
  Measurement m;
  m.op = bthd ? "attention_bthd" : "attention";
  m.shape = mt::shape_str(shape) + (bthd ? " as BTHD" : "") + " causal fwd+bwd";
  m.ms = time_op_ms(
      timing, timing.sets,
      [&](int64_t set) {
        mt::scaled_dot_product_attention(view(q[set]), view(k[set]), view(v[set]), /*causal=*/true)
            .backward(view(dout[set]));
        clear_grads({q[set], k[set], v[set]});
      },
      &m);
  // FLOPs: forward is Q K^T and P V, 2 * 2 B H T^2 D, half of it under the causal mask; backward
  // is 2.5x forward (S = Q K^T recomputed, dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q), so
  // 3.5 * 0.5 * 4 B H T^2 D in all. Bytes: forward reads q, k, v and writes o and the f32
  // logsumexp [B, H, T]; backward reads q, k, v, o, dO and the logsumexp, writes dq, dk, dv:
  // 12 B H T D elements and 2 B H T f32.
  const double B = static_cast<double>(s.batch), H = static_cast<double>(s.heads);
  const double T = static_cast<double>(s.seq), D = static_cast<double>(d);
  const double es = static_cast<double>(mt::element_size(dtype));
  m.flops = 3.5 * 0.5 * 4 * B * H * T * T * D;
  m.bytes = es * 12 * B * H * T * D + 2 * B * H * T * 4;
  return m;
}

Measurement bench_cross_entropy(const Timing& timing, mt::DType dtype, const Shapes& s) {
  mt::Generator generator(5);
  std::vector<mt::Tensor> x, w, target;  // per input set: [N, C], [V, C], [N]
  for (int64_t k = 0; k < timing.sets; ++k) {
    x.push_back(mt::randn({s.rows, s.width}, on(timing.device, dtype, true), &generator));
    w.push_back(mt::mul(mt::randn({s.vocab, s.width}, on(timing.device, dtype), &generator), 0.02).requires_grad_());
    target.push_back(
        mt::uniform({s.rows}, 0, static_cast<double>(s.vocab), {}, &generator).to(mt::DType::i64).to(timing.device));
  }
  Measurement m;
  m.op = "cross_entropy";
  m.shape = mt::shape_str(x[0].shape()) + " x " + mt::shape_str(w[0].shape()) + "^T fwd+bwd" +
            (s.ce_chunk_rows > 0 ? ", chunks of " + std::to_string(s.ce_chunk_rows) : "");
  m.ms = time_op_ms(
      timing, timing.sets,
      [&](int64_t k) {
        mt::LinearCrossEntropyOptions options;
        options.chunk_rows = s.ce_chunk_rows;
        mt::linear_cross_entropy(x[k], w[k], target[k], options).backward();
        clear_grads({x[k], w[k]});
      },
      &m);
  // FLOPs: the logits x W^T, then dx = dlogits W and dW = dlogits^T x: 3 * 2 N V C. Bytes: read x,
  // W and the i64 targets, write dx and dW; the [N, V] logits need never reach memory.
  const double N = static_cast<double>(s.rows), V = static_cast<double>(s.vocab), C = static_cast<double>(s.width);
  const double es = static_cast<double>(mt::element_size(dtype));
  m.flops = 6 * N * V * C;
  m.bytes = es * (2 * N * C + 2 * V * C) + 8 * N;
  return m;
}

// GPT-2's parameters (ops/nn/gpt.h, the LM head tied to wte): wte [V, C], wpe [T, C]; per block
// ln_1 and ln_2 (w, b [C]), c_attn [3C, C] + [3C], attn c_proj [C, C] + [C], c_fc [4C, C] + [4C],
// mlp c_proj [C, 4C] + [C]; then ln_f. op_bench_torch.py builds the same list.
std::vector<mt::Shape> gpt2_parameter_shapes(const Shapes& s) {
  const int64_t C = s.width;
  std::vector<mt::Shape> shapes = {{s.vocab, C}, {s.seq, C}};
  for (int64_t layer = 0; layer < s.layers; ++layer) {
    const std::vector<mt::Shape> block = {{C}, {C}, {3 * C, C}, {3 * C}, {C, C},     {C},
                                          {C}, {C}, {4 * C, C}, {4 * C}, {C, 4 * C}, {C}};
    shapes.insert(shapes.end(), block.begin(), block.end());
  }
  shapes.push_back({C});
  shapes.push_back({C});
  return shapes;
}

Measurement bench_adamw(const Timing& timing, mt::DType dtype, const Shapes& s) {
  mt::Generator generator(6);
  std::vector<mt::Tensor> params;
  double n = 0;
  for (const mt::Shape& shape : gpt2_parameter_shapes(s)) {
    mt::Tensor p = mt::mul(mt::randn(shape, on(timing.device, dtype), &generator), 0.02).requires_grad_();
    p.set_grad(mt::mul(mt::randn(shape, on(timing.device, dtype), &generator), 1e-3));
    params.push_back(p);
    n += static_cast<double>(p.numel());
  }
  mt::AdamW opt(params, mt::AdamWOptions(1e-4).weight_decay(0.1));
  Measurement m;
  m.op = "adamw";
  char shape[64];
  std::snprintf(shape, sizeof(shape), "%.1fM params, %zu tensors, %s", n / 1e6, params.size(), mt::dtype_name(dtype));
  m.shape = shape;
  m.ms = time_op_ms(
      timing, /*sets=*/1, [&](int64_t) { opt.step(); }, &m);  // its 2 GB of state outruns L2
  // Bytes per parameter: read p, g, exp_avg, exp_avg_sq; write p, exp_avg, exp_avg_sq; the moments
  // are f32 (28 bytes for f32 parameters). PyTorch keeps bf16/f16 parameters' moments in their dtype.
  const double es = static_cast<double>(mt::element_size(dtype));
  m.bytes = n * (3 * es + 4 * 4);
  return m;
}

// "712.3 TFLOP/s", or GFLOP/s below one TFLOP/s (a CPU); the argument is FLOPs per ms.
std::string flops_text(double flops_per_ms) {
  char text[32];
  if (flops_per_ms >= 1e9) {
    std::snprintf(text, sizeof(text), "%.1f TFLOP/s", flops_per_ms / 1e9);
  } else {
    std::snprintf(text, sizeof(text), "%.2f GFLOP/s", flops_per_ms / 1e6);
  }
  return text;
}

// "4123.4 GB/s"; the argument is bytes per ms.
std::string bandwidth_text(double bytes_per_ms) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f GB/s", bytes_per_ms / 1e6);
  return text;
}

// --ops: a comma list of known ops.
CLI::Validator known_ops() {
  return CLI::Validator(
      [](std::string& input) {
        const std::vector<std::string> ops = lm_example::split_commas(input);
        if (ops.empty()) return std::string("expected a comma list of ops, got '") + input + "'";
        for (const std::string& op : ops) {
          if (std::find(kOps.begin(), kOps.end(), op) == kOps.end() &&
              std::find(kReferenceOps.begin(), kReferenceOps.end(), op) == kReferenceOps.end()) {
            std::string known;
            for (const std::string& k : kOps) known += (known.empty() ? "" : ", ") + k;
            for (const std::string& k : kReferenceOps) known += ", " + k;
            return "unknown op '" + op + "' (known: " + known + ")";
          }
        }
        return std::string();
      },
      "OPS");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Time single ops (GEMM, layer norm, attention, cross-entropy, AdamW) against their floors"};
  example::setup(app, "op_bench");
  example::PlacementFlags placement_flags;
  std::string dtype_name = "bf16", adamw_dtype_name = "f32", ops_text;
  for (const std::string& op : kOps) ops_text += (ops_text.empty() ? "" : ",") + op;
  Shapes s;
  int64_t warmup = 5, iters = 50, sets = 4, graph_runs = 32, rate_size = 8192, copy_mib = 1024;
  bool eager = false;
  placement_flags.add_to(app, example::AmpFlag::without);  // --dtype instead
  app.add_option("--dtype", dtype_name, "the ops' dtype")
      ->capture_default_str()
      ->check(example::one_of({"bf16", "f16", "f32"}));
  app.add_option("--warmup", warmup, "untimed iterations per op")
      ->capture_default_str()
      ->check(example::non_negative());
  app.add_option("--iters", iters, "timed iterations per op (the median is printed)")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--sets", sets, "input sets per op, used in turn (AdamW always one)")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--graph-runs", graph_runs,
                 "CUDA graphs: the fewest runs of an op per captured graph (its sets repeated), so that a "
                 "replay's own launch is spread over them")
      ->capture_default_str()
      ->check(example::positive());
  app.add_flag("--eager", eager, "time each run between events, launch gaps included, instead of graph replays");
  app.add_option("--ops", ops_text, "comma-separated ops to run")->capture_default_str()->check(known_ops());
  app.add_option("--rows", s.rows, "rows (B * T) of gemm, layer_norm and cross_entropy")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--ce-chunk-rows", s.ce_chunk_rows,
                 "cross_entropy's rows of logits at a time (0: linear_cross_entropy's default)")
      ->capture_default_str()
      ->check(example::non_negative());
  app.add_option("--width", s.width, "model width C")->capture_default_str()->check(example::positive());
  app.add_option("--batch", s.batch, "attention batch B")->capture_default_str()->check(example::positive());
  app.add_option("--seq", s.seq, "attention sequence length T (also wpe's rows in adamw)")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--heads", s.heads, "attention heads H (head size width / heads)")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--vocab", s.vocab, "vocabulary V of cross_entropy and adamw")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--layers", s.layers, "GPT-2 blocks in adamw's parameter set")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--adamw-dtype", adamw_dtype_name, "adamw's parameter and gradient dtype")
      ->capture_default_str()
      ->check(example::one_of({"bf16", "f16", "f32"}));
  app.add_option("--rate-size", rate_size, "M = N = K of the GEMM-rate probe")
      ->capture_default_str()
      ->check(example::positive());
  app.add_option("--copy-mib", copy_mib, "MiB copied by the bandwidth probe")
      ->capture_default_str()
      ->check(example::positive());
  bool gemm_autotune = false;
  app.add_flag("--gemm-autotune", gemm_autotune,
               "time cuBLASLt's best few algorithms for each GEMM problem and keep the fastest "
               "(mt::backends::set_matmul_autotune)");
  CLI11_PARSE(app, argc, argv);
  mt::backends::set_matmul_autotune(gemm_autotune);

  try {
    const std::vector<std::string> ops = lm_example::split_commas(ops_text);
    const bool attention = std::find(ops.begin(), ops.end(), "attention") != ops.end() ||
                           std::find(ops.begin(), ops.end(), "attention_bthd") != ops.end();
    MT_CHECK(!attention || s.width % s.heads == 0, "--width ", s.width, " is not a multiple of --heads ", s.heads,
             " (attention's head size is width / heads)");
    const mt::Device device = example::resolve_device(placement_flags.device, /*group=*/nullptr);
    const mt::DType dtype = mt::parse_dtype(dtype_name), adamw_dtype = mt::parse_dtype(adamw_dtype_name);
    const Timing timing{device, warmup, iters, sets, graph_runs, /*graph=*/!eager};

    const std::string where =
        device.is_cuda() ? device.str() + " (" + mt::cuda::device_name(device.index) + ")" : device.str();
    const long long n_iters = iters, n_warmup = warmup, n_sets = sets, n_runs = graph_runs;
    if (device.is_cuda() && !eager) {
      std::printf(
          "op_bench on %s, %s: median of %lld timed replays of a CUDA Graph of at least %lld runs over %lld "
          "input sets in turn, after %lld warm-up runs per set (device time per run)\n",
          where.c_str(), mt::dtype_name(dtype), n_iters, n_runs, n_sets, n_warmup);
    } else {
      std::printf("op_bench on %s, %s: median of %lld timed runs after %lld warm-up, %lld input sets in turn\n",
                  where.c_str(), mt::dtype_name(dtype), n_iters, n_warmup, n_sets);
    }
    Rates rates;
    double probe_ms = 0;
    rates.flops_per_ms = measure_gemm_rate(timing, dtype, rate_size, &probe_ms);
    std::printf("GEMM rate:      %lld^3 %s matmul, %.3f ms, %s\n", static_cast<long long>(rate_size),
                mt::dtype_name(dtype), probe_ms, flops_text(rates.flops_per_ms).c_str());
    rates.bytes_per_ms = measure_copy_bandwidth(timing, copy_mib, &probe_ms);
    std::printf("copy bandwidth: %lld MiB copy on %s, %.3f ms, %s (read + write)\n", static_cast<long long>(copy_mib),
                device.str().c_str(), probe_ms, bandwidth_text(rates.bytes_per_ms).c_str());
    std::printf("floor = max(FLOPs / GEMM rate, bytes / copy bandwidth); floor%% = floor / median (100%%: at it)\n");
    std::printf("%-14s %-46s %10s %16s %10s %6s %7s  %s\n", "op", "shape", "median ms", "achieved", "floor ms", "bound",
                "floor%", "timed");
    std::fflush(stdout);

    std::vector<Measurement> results;
    for (const std::string& op : ops) {
      Measurement m;
      if (op == "gemm" || op == "gemm_bias") {
        m = bench_gemm(timing, dtype, s, /*with_bias=*/op == "gemm_bias");
      } else if (op == "layer_norm") {
        m = bench_layer_norm(timing, dtype, s);
      } else if (op == "add_layer_norm") {
        m = bench_add_layer_norm(timing, dtype, s);
      } else if (op == "layer_norm_fwd") {
        m = bench_layer_norm_forward(timing, dtype, s);
      } else if (op == "norm_bytes") {
        m = bench_norm_bytes(timing, dtype, s);
      } else if (op == "attention" || op == "attention_bthd") {
        m = bench_attention(timing, dtype, s, /*bthd=*/op == "attention_bthd");
      } else if (op == "cross_entropy") {
        m = bench_cross_entropy(timing, dtype, s);
      } else if (op == "gelu") {
        m = bench_gelu(timing, dtype, s);
      } else {
        m = bench_adamw(timing, adamw_dtype, s);
      }
      const double flop_floor = m.flops / rates.flops_per_ms, byte_floor = m.bytes / rates.bytes_per_ms;
      const bool flop_bound = flop_floor >= byte_floor;
      const double floor = std::max(flop_floor, byte_floor);
      const std::string achieved = flop_bound ? flops_text(m.flops / m.ms) : bandwidth_text(m.bytes / m.ms);
      std::printf("%-14s %-46s %10.3f %16s %10.3f %6s %6.1f%%  %s\n", m.op.c_str(), m.shape.c_str(), m.ms,
                  achieved.c_str(), floor, flop_bound ? "flops" : "bytes", 100.0 * floor / m.ms, m.timed.c_str());
      std::fflush(stdout);
      results.push_back(m);
    }
    for (const Measurement& m : results) std::printf("op_bench: %s %.4f\n", m.op.c_str(), m.ms);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "op_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
