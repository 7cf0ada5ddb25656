// CPU kernels of the conv family. Convolution is im2col + one Eigen GEMM per
// (image, group); pooling is direct loops over each [H, W] plane.
//
// For image n and group g (Cg = C / groups input channels, Og = O / groups
// output channels, K = Cg * kH * kW, P = OH * OW):
//   col   [K, P]  = im2col(x[n, g*Cg : (g+1)*Cg])   col[(c*kH + p)*kW + q, i*OW + j]
//                                                  = x[n, g*Cg + c, i*sh - ph + p*dh, j*sw - pw + q*dw] (0 outside)
//   y_g   [Og, P] = w_g [Og, K] * col
//   dcol  [K, P]  = w_g^T * dy_g,      dx[n, group g] = col2im(dcol)  (the adjoint of im2col: sums overlaps)
//   dw_g [Og, K] += dy_g * col^T       (summed over n)
// Everything runs in acc_t: f16/bf16 tensors are converted to f32 first and the
// result rounded once at the end.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dispatch.h"
#include "core/view.h"
#include "ops/conv/conv_kernels.h"

namespace mt::ops {

namespace {

template <typename A>
using RowMatrix = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename A>
using MatrixMap = Eigen::Map<RowMatrix<A>>;
template <typename A>
using ConstMatrixMap = Eigen::Map<const RowMatrix<A>>;

// ---- conv2d ----

// col [K, P] from one group of one image: x points at [Cg, H, W].
template <typename A>
void im2col(const A* x, A* col, const Conv2dGeometry& g) {
  const int64_t cg = g.in_channels / g.groups, plane = g.out_h * g.out_w;
  for (int64_t c = 0; c < cg; ++c) {
    for (int64_t p = 0; p < g.kernel_h; ++p) {
      for (int64_t q = 0; q < g.kernel_w; ++q) {
        A* row = col + ((c * g.kernel_h + p) * g.kernel_w + q) * plane;
        for (int64_t i = 0; i < g.out_h; ++i) {
          const int64_t ih = i * g.stride_h - g.padding_h + p * g.dilation_h;
          for (int64_t j = 0; j < g.out_w; ++j) {
            const int64_t iw = j * g.stride_w - g.padding_w + q * g.dilation_w;
            const bool inside = ih >= 0 && ih < g.in_h && iw >= 0 && iw < g.in_w;
            row[i * g.out_w + j] = inside ? x[(c * g.in_h + ih) * g.in_w + iw] : A(0);
          }
        }
      }
    }
  }
}

// The adjoint of im2col: dx [Cg, H, W] += col2im(dcol [K, P]).
template <typename A>
void col2im_add(const A* dcol, A* dx, const Conv2dGeometry& g) {
  const int64_t cg = g.in_channels / g.groups, plane = g.out_h * g.out_w;
  for (int64_t c = 0; c < cg; ++c) {
    for (int64_t p = 0; p < g.kernel_h; ++p) {
      for (int64_t q = 0; q < g.kernel_w; ++q) {
        const A* row = dcol + ((c * g.kernel_h + p) * g.kernel_w + q) * plane;
        for (int64_t i = 0; i < g.out_h; ++i) {
          const int64_t ih = i * g.stride_h - g.padding_h + p * g.dilation_h;
          if (ih < 0 || ih >= g.in_h) continue;
          for (int64_t j = 0; j < g.out_w; ++j) {
            const int64_t iw = j * g.stride_w - g.padding_w + q * g.dilation_w;
            if (iw >= 0 && iw < g.in_w) dx[(c * g.in_h + ih) * g.in_w + iw] += row[i * g.out_w + j];
          }
        }
      }
    }
  }
}

// Per-(image, group) offsets and sizes into the contiguous NCHW / OIHW buffers.
struct GroupLayout {
  int64_t cg, og, k, p;  // channels per group in and out, GEMM depth K, output plane size P
  explicit GroupLayout(const Conv2dGeometry& g)
      : cg(g.in_channels / g.groups),
        og(g.out_channels / g.groups),
        k(g.in_channels / g.groups * g.kernel_h * g.kernel_w),
        p(g.out_h * g.out_w) {}
};

template <typename A>
void conv_forward(A* y, const A* x, const A* w, const Conv2dGeometry& g) {
  const GroupLayout l(g);
  std::vector<A> col(static_cast<size_t>(l.k * l.p));
  const ConstMatrixMap<A> col_m(col.data(), l.k, l.p);
  for (int64_t n = 0; n < g.batch; ++n) {
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      im2col(x + (n * g.in_channels + grp * l.cg) * g.in_h * g.in_w, col.data(), g);
      const ConstMatrixMap<A> w_g(w + grp * l.og * l.k, l.og, l.k);
      MatrixMap<A> y_g(y + (n * g.out_channels + grp * l.og) * l.p, l.og, l.p);
      y_g.noalias() = w_g * col_m;
    }
  }
}

template <typename A>
void conv_backward_input(A* dx, const A* dy, const A* w, const Conv2dGeometry& g) {
  const GroupLayout l(g);
  std::fill(dx, dx + g.batch * g.in_channels * g.in_h * g.in_w, A(0));
  RowMatrix<A> dcol(l.k, l.p);
  for (int64_t n = 0; n < g.batch; ++n) {
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      const ConstMatrixMap<A> w_g(w + grp * l.og * l.k, l.og, l.k);
      const ConstMatrixMap<A> dy_g(dy + (n * g.out_channels + grp * l.og) * l.p, l.og, l.p);
      dcol.noalias() = w_g.transpose() * dy_g;
      col2im_add(dcol.data(), dx + (n * g.in_channels + grp * l.cg) * g.in_h * g.in_w, g);
    }
  }
}

template <typename A>
void conv_backward_weight(A* dw, const A* dy, const A* x, const Conv2dGeometry& g) {
  const GroupLayout l(g);
  std::fill(dw, dw + g.out_channels * l.k, A(0));
  std::vector<A> col(static_cast<size_t>(l.k * l.p));
  const ConstMatrixMap<A> col_m(col.data(), l.k, l.p);
  for (int64_t n = 0; n < g.batch; ++n) {
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      im2col(x + (n * g.in_channels + grp * l.cg) * g.in_h * g.in_w, col.data(), g);
      const ConstMatrixMap<A> dy_g(dy + (n * g.out_channels + grp * l.og) * l.p, l.og, l.p);
      MatrixMap<A> dw_g(dw + grp * l.og * l.k, l.og, l.k);
      dw_g.noalias() += dy_g * col_m.transpose();
    }
  }
}

// t itself when it already has dtype A, else a contiguous converted copy.
template <typename A>
Tensor in_acc(const Tensor& t) {
  return t.dtype() == dtype_of<A>() ? t : raw::to(t, dtype_of<A>());
}

// Runs body(out_acc, in_acc...) with every tensor in acc_t, then rounds the
// result into `out` once.
template <typename Body>
void run_in_acc(const char* op, const Tensor& out, const Tensor& a, const Tensor& b, Body body) {
  dispatch_floating(out.dtype(), op, [&](auto tag) {
    using A = acc_t<typename decltype(tag)::type>;
    const Tensor a_acc = in_acc<A>(a), b_acc = in_acc<A>(b);
    const Tensor out_acc =
        out.dtype() == dtype_of<A>() ? out : empty(out.shape(), TensorOptions().dtype(dtype_of<A>()));
    body(out_acc.data<A>(), static_cast<const A*>(a_acc.data_ptr()), static_cast<const A*>(b_acc.data_ptr()));
    if (!out_acc.shares_storage_with(out)) out.copy_(out_acc);
  });
}

// ---- pooling ----

// The window of output (i, j), clipped to the image: rows [h0, h1), columns [w0, w1).
struct Window {
  int64_t h0, h1, w0, w1;
  Window(const Pool2dGeometry& g, int64_t i, int64_t j) {
    const int64_t hs = i * g.stride_h - g.padding_h, ws = j * g.stride_w - g.padding_w;
    h0 = std::max<int64_t>(hs, 0);
    h1 = std::min(hs + g.kernel_h, g.in_h);
    w0 = std::max<int64_t>(ws, 0);
    w1 = std::min(ws + g.kernel_w, g.in_w);
  }
};

template <typename T>
void max_pool_forward(T* y, int64_t* indices, const T* x, const Pool2dGeometry& g) {
  using A = acc_t<T>;
  const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
  for (int64_t plane = 0; plane < g.batch * g.channels; ++plane) {
    const T* xp = x + plane * in_plane;
    for (int64_t i = 0; i < g.out_h; ++i) {
      for (int64_t j = 0; j < g.out_w; ++j) {
        // Padding is at most half the kernel, so the window holds at least one element.
        const Window win(g, i, j);
        int64_t best_at = win.h0 * g.in_w + win.w0;
        A best = convert<A>(xp[best_at]);
        for (int64_t h = win.h0; h < win.h1; ++h) {
          for (int64_t w = win.w0; w < win.w1; ++w) {
            const A v = convert<A>(xp[h * g.in_w + w]);
            if (v > best || (std::isnan(v) && !std::isnan(best))) {  // the first maximum wins; NaN propagates
              best = v;
              best_at = h * g.in_w + w;
            }
          }
        }
        y[plane * out_plane + i * g.out_w + j] = convert<T>(best);
        indices[plane * out_plane + i * g.out_w + j] = best_at;
      }
    }
  }
}

template <typename T>
void max_pool_backward(T* dx, const T* dy, const int64_t* indices, const Pool2dGeometry& g) {
  using A = acc_t<T>;
  const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
  std::vector<A> acc(static_cast<size_t>(in_plane));
  for (int64_t plane = 0; plane < g.batch * g.channels; ++plane) {
    std::fill(acc.begin(), acc.end(), A(0));
    for (int64_t o = 0; o < out_plane; ++o)
      acc[indices[plane * out_plane + o]] += convert<A>(dy[plane * out_plane + o]);
    for (int64_t e = 0; e < in_plane; ++e) dx[plane * in_plane + e] = convert<T>(acc[e]);
  }
}

template <typename T>
void avg_pool_forward(T* y, const T* x, const Pool2dGeometry& g) {
  using A = acc_t<T>;
  const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
  const A divisor = static_cast<A>(g.kernel_h * g.kernel_w);  // padding counts (count_include_pad)
  for (int64_t plane = 0; plane < g.batch * g.channels; ++plane) {
    const T* xp = x + plane * in_plane;
    for (int64_t i = 0; i < g.out_h; ++i) {
      for (int64_t j = 0; j < g.out_w; ++j) {
        const Window win(g, i, j);
        A total = 0;
        for (int64_t h = win.h0; h < win.h1; ++h) {
          for (int64_t w = win.w0; w < win.w1; ++w) total += convert<A>(xp[h * g.in_w + w]);
        }
        y[plane * out_plane + i * g.out_w + j] = convert<T>(total / divisor);
      }
    }
  }
}

template <typename T>
void avg_pool_backward(T* dx, const T* dy, const Pool2dGeometry& g) {
  using A = acc_t<T>;
  const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
  const A divisor = static_cast<A>(g.kernel_h * g.kernel_w);
  std::vector<A> acc(static_cast<size_t>(in_plane));
  for (int64_t plane = 0; plane < g.batch * g.channels; ++plane) {
    std::fill(acc.begin(), acc.end(), A(0));
    for (int64_t i = 0; i < g.out_h; ++i) {
      for (int64_t j = 0; j < g.out_w; ++j) {
        const Window win(g, i, j);
        const A share = convert<A>(dy[plane * out_plane + i * g.out_w + j]) / divisor;
        for (int64_t h = win.h0; h < win.h1; ++h) {
          for (int64_t w = win.w0; w < win.w1; ++w) acc[h * g.in_w + w] += share;
        }
      }
    }
    for (int64_t e = 0; e < in_plane; ++e) dx[plane * in_plane + e] = convert<T>(acc[e]);
  }
}

}  // namespace

void conv2d_forward_cpu(const Tensor& y, const Tensor& x, const Tensor& w, const Conv2dGeometry& g) {
  run_in_acc("conv2d", y, x, w, [&](auto* y_, const auto* x_, const auto* w_) { conv_forward(y_, x_, w_, g); });
}

void conv2d_backward_input_cpu(const Tensor& dx, const Tensor& dy, const Tensor& w, const Conv2dGeometry& g) {
  run_in_acc("conv2d", dx, dy, w,
             [&](auto* dx_, const auto* dy_, const auto* w_) { conv_backward_input(dx_, dy_, w_, g); });
}

void conv2d_backward_weight_cpu(const Tensor& dw, const Tensor& dy, const Tensor& x, const Conv2dGeometry& g) {
  run_in_acc("conv2d", dw, dy, x,
             [&](auto* dw_, const auto* dy_, const auto* x_) { conv_backward_weight(dw_, dy_, x_, g); });
}

void max_pool2d_forward_cpu(const Tensor& y, const Tensor& indices, const Tensor& x, const Pool2dGeometry& g) {
  dispatch_floating(x.dtype(), "max_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    max_pool_forward(y.data<T>(), indices.data<int64_t>(), static_cast<const T*>(x.data_ptr()), g);
  });
}

void max_pool2d_backward_cpu(const Tensor& dx, const Tensor& dy, const Tensor& indices, const Pool2dGeometry& g) {
  dispatch_floating(dx.dtype(), "max_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    max_pool_backward(dx.data<T>(), static_cast<const T*>(dy.data_ptr()),
                      static_cast<const int64_t*>(indices.data_ptr()), g);
  });
}

void avg_pool2d_forward_cpu(const Tensor& y, const Tensor& x, const Pool2dGeometry& g) {
  dispatch_floating(x.dtype(), "avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    avg_pool_forward(y.data<T>(), static_cast<const T*>(x.data_ptr()), g);
  });
}

void avg_pool2d_backward_cpu(const Tensor& dx, const Tensor& dy, const Pool2dGeometry& g) {
  dispatch_floating(dx.dtype(), "avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    avg_pool_backward(dx.data<T>(), static_cast<const T*>(dy.data_ptr()), g);
  });
}

}  // namespace mt::ops
