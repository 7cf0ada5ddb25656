// Contracts of core/tensor.h and core/view.h on the CPU: factories, layout,
// the raw views (which share storage with their base, both ways), copies with
// conversion and broadcasting, printing and the error messages users see.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "core/error.h"
#include "core/float_types.h"
#include "core/tensor.h"
#include "core/view.h"

namespace {

using mt::DType;
using mt::Shape;
using mt::Tensor;

// Runs f, which must throw E; returns what() ("" after recording a failure otherwise).
template <typename E, typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

void expect_contains(const std::string& text, std::initializer_list<const char*> parts) {
  for (const char* part : parts) EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

std::vector<double> iota_values(int64_t n, double start = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + static_cast<double>(i);
  return v;
}

// [2, 3, 4] f32 holding 0..23 in row-major order.
Tensor base_234() { return mt::from_vector(iota_values(24), {2, 3, 4}); }

const DType kAllDTypes[] = {DType::f64,    DType::f32, DType::f16, DType::bf16, DType::f8e4m3,
                            DType::f8e5m2, DType::i64, DType::i32, DType::u8,   DType::boolean};

std::string dtype_test_name(const ::testing::TestParamInfo<DType>& info) { return mt::dtype_name(info.param); }

// ---- factories, per dtype ----

class FactoryTest : public ::testing::TestWithParam<DType> {};

TEST_P(FactoryTest, ShapesStridesAndValues) {
  const DType dtype = GetParam();
  const Tensor e = mt::empty({2, 3, 4}, dtype);
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(e.dtype(), dtype);
  EXPECT_EQ(e.device(), mt::kCPU);
  EXPECT_EQ(e.numel(), 24);
  EXPECT_EQ(e.nbytes(), 24 * mt::element_size(dtype));
  EXPECT_EQ(e.offset(), 0);
  EXPECT_TRUE(e.is_contiguous());

  EXPECT_EQ(mt::zeros({3, 2}, dtype).to_vector<double>(), std::vector<double>(6, 0.0));
  EXPECT_EQ(mt::ones({5}, dtype).to_vector<double>(), std::vector<double>(5, 1.0));
  const double three = dtype == DType::boolean ? 1.0 : 3.0;  // every nonzero is true
  EXPECT_EQ(mt::full({2, 2}, 3.0, dtype).to_vector<double>(), std::vector<double>(4, three));
  const Tensor a = mt::arange(0.0, 4.0, 1.0, dtype);
  EXPECT_EQ(a.dtype(), dtype);
  if (dtype != DType::boolean) EXPECT_EQ(a.to_vector<double>(), (std::vector<double>{0, 1, 2, 3}));
  const Tensor v = mt::from_vector({0, 1, 2, 4, 6, 0}, {3, 2}, dtype);
  EXPECT_EQ(v.shape(), (Shape{3, 2}));
  if (dtype != DType::boolean) EXPECT_EQ(v.to_vector<double>(), (std::vector<double>{0, 1, 2, 4, 6, 0}));
  EXPECT_EQ(mt::zeros_like(v).dtype(), dtype);
  EXPECT_EQ(mt::ones_like(v).to_vector<double>(), std::vector<double>(6, 1.0));
  EXPECT_EQ(mt::empty_like(v).shape(), v.shape());
}

TEST_P(FactoryTest, ToDTypeRoundTripsRepresentableValues) {
  const DType dtype = GetParam();
  const std::vector<double> values =
      dtype == DType::boolean ? std::vector<double>{0, 1, 1, 0} : std::vector<double>{0, 1, 2, 3, 4, 6, 12, 0};
  const Tensor src = mt::from_vector(values, {2, static_cast<int64_t>(values.size()) / 2}, DType::f32);
  const Tensor there = mt::raw::to(src, dtype);
  EXPECT_EQ(there.dtype(), dtype);
  EXPECT_EQ(there.shape(), src.shape());
  const Tensor back = mt::raw::to(there, DType::f32);
  EXPECT_EQ(back.to_vector<float>(), src.to_vector<float>());
  // Converting to the dtype a tensor already has returns that tensor.
  EXPECT_EQ(mt::raw::to(there, dtype).impl(), there.impl());
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, FactoryTest, ::testing::ValuesIn(kAllDTypes), dtype_test_name);

TEST(Factories, ArangeLengthsAndDefaults) {
  EXPECT_EQ(mt::arange(5).dtype(), DType::f32);
  EXPECT_EQ(mt::arange(5).to_vector<double>(), (std::vector<double>{0, 1, 2, 3, 4}));
  EXPECT_EQ(mt::arange(0.0, 10.0, 3.0).to_vector<double>(), (std::vector<double>{0, 3, 6, 9}));
  EXPECT_EQ(mt::arange(1.0, 2.0, 0.25).to_vector<double>(), (std::vector<double>{1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(mt::arange(5.0, 0.0, -2.0).to_vector<double>(), (std::vector<double>{5, 3, 1}));
  EXPECT_EQ(mt::arange(3.0, 3.0).numel(), 0);
  EXPECT_THROW(mt::arange(0.0, 1.0, 0.0), mt::Error);
  EXPECT_THROW(mt::arange(0.0, 5.0, -1.0), mt::Error);
}

TEST(Factories, EmptyAndScalarShapes) {
  const Tensor scalar = mt::full({}, 7.0);
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_TRUE(scalar.is_contiguous());
  EXPECT_EQ(scalar.item(), 7.0);
  const Tensor none = mt::zeros({0, 3});
  EXPECT_EQ(none.numel(), 0);
  EXPECT_EQ(none.shape(), (Shape{0, 3}));
  EXPECT_TRUE(none.is_contiguous());
  EXPECT_TRUE(none.to_vector<float>().empty());
}

TEST(Factories, BadShapesThrowShapeError) {
  EXPECT_THROW(mt::empty({2, -1}), mt::ShapeError);
  EXPECT_THROW(mt::empty(Shape(static_cast<size_t>(mt::kMaxDims) + 1, 1)), mt::ShapeError);
  const std::string msg = message_of<mt::ShapeError>([] { mt::from_vector({1, 2, 3}, {2, 2}); });
  expect_contains(msg, {"from_vector", "3 values", "[2, 2]"});
}

TEST(Factories, FromBlobCopiesAndConverts) {
  const int32_t raw[] = {1, -2, 3, 40};
  const Tensor t = mt::from_blob(raw, {2, 2}, DType::i32, DType::f64);
  EXPECT_EQ(t.dtype(), DType::f64);
  EXPECT_EQ(t.to_vector<double>(), (std::vector<double>{1, -2, 3, 40}));
}

// ---- layout and metadata ----

TEST(Layout, StridesSizesAndContiguity) {
  const Tensor t = mt::zeros({2, 3, 4});
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.stride(-2), 4);
  EXPECT_EQ(mt::contiguous_strides({5, 1, 3}), (Shape{3, 3, 1}));
  EXPECT_EQ(mt::contiguous_strides({2, 0, 3}), (Shape{3, 3, 1}));
  EXPECT_EQ(mt::shape_numel({2, 3, 4}), 24);
  EXPECT_EQ(mt::shape_numel({}), 1);
  EXPECT_EQ(mt::shape_str({2, 3}), "[2, 3]");
  EXPECT_EQ(mt::shape_str({}), "[]");
  EXPECT_FALSE(mt::raw::transpose(t, 0, 2).is_contiguous());
  EXPECT_FALSE(mt::raw::slice(t, 2, 0, 4, 2).is_contiguous());
  EXPECT_TRUE(mt::raw::narrow(t, 0, 1, 1).is_contiguous());
  EXPECT_TRUE(mt::raw::unsqueeze(t, 1).is_contiguous());
}

TEST(Layout, DataChecksTheElementType) {
  const Tensor h = mt::zeros({2}, DType::f16);
  EXPECT_NE(h.data<mt::Half>(), nullptr);
  const std::string msg = message_of<mt::DTypeError>([&] { h.data<float>(); });
  expect_contains(msg, {"f16", "f32"});
  EXPECT_THROW(h.data<mt::BFloat16>(), mt::DTypeError);
}

TEST(Layout, UndefinedTensor) {
  const Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_THROW(t.shape(), mt::Error);
  EXPECT_EQ(t.str(), "tensor(undefined)");
}

// ---- raw views: shapes, strides, values ----

TEST(Views, ViewInfersMinusOneAndSharesStorage) {
  const Tensor t = base_234();
  const Tensor v = mt::raw::view(t, {6, -1});
  EXPECT_EQ(v.shape(), (Shape{6, 4}));
  EXPECT_EQ(v.strides(), (Shape{4, 1}));
  EXPECT_TRUE(v.shares_storage_with(t));
  EXPECT_EQ(mt::raw::view(t, {-1}).shape(), (Shape{24}));
  EXPECT_EQ(mt::raw::view(t, {2, -1, 3}).shape(), (Shape{2, 4, 3}));
  EXPECT_EQ(mt::raw::view(t, {-1}).to_vector<double>(), iota_values(24));
  EXPECT_THROW(mt::raw::view(t, {-1, -1}), mt::ShapeError);
  EXPECT_THROW(mt::raw::view(t, {5, -1}), mt::ShapeError);
  EXPECT_THROW(mt::raw::view(t, {5, 5}), mt::ShapeError);
}

TEST(Views, ViewOfTransposedThrowsNamingBothShapes) {
  const Tensor t = mt::raw::transpose(mt::from_vector(iota_values(6), {2, 3}), 0, 1);  // [3, 2]
  const std::string msg = message_of<mt::ShapeError>([&] { mt::raw::view(t, {6}); });
  expect_contains(msg, {"view", "[3, 2]", "[6]"});
  // A view that keeps the transposed dims apart is fine.
  EXPECT_EQ(mt::raw::view(t, {3, 1, 2}).shape(), (Shape{3, 1, 2}));
}

TEST(Views, ReshapeViewsWhenItCanAndCopiesWhenItMust) {
  const Tensor t = mt::from_vector(iota_values(6), {2, 3});
  const Tensor r = mt::raw::reshape(t, {3, -1});
  EXPECT_TRUE(r.shares_storage_with(t));
  EXPECT_EQ(r.shape(), (Shape{3, 2}));
  const Tensor tt = mt::raw::transpose(t, 0, 1);  // [3, 2]: 0 3 / 1 4 / 2 5
  const Tensor flat = mt::raw::reshape(tt, {-1});
  EXPECT_FALSE(flat.shares_storage_with(t));
  EXPECT_EQ(flat.to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

TEST(Views, TransposeAndPermute) {
  const Tensor t = base_234();
  const Tensor tr = mt::raw::transpose(t, 0, -1);  // [4, 3, 2]
  EXPECT_EQ(tr.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(tr.strides(), (Shape{1, 4, 12}));
  const Tensor p = mt::raw::permute(t, {1, 2, 0});  // p[j][k][i] = t[i][j][k]
  EXPECT_EQ(p.shape(), (Shape{3, 4, 2}));
  EXPECT_EQ(p.strides(), (Shape{4, 1, 12}));
  const std::vector<double> tv = tr.to_vector<double>(), pv = p.to_vector<double>();
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) {
        const double expected = 12 * i + 4 * j + k;
        EXPECT_EQ(tv[static_cast<size_t>(k * 6 + j * 2 + i)], expected);
        EXPECT_EQ(pv[static_cast<size_t>(j * 8 + k * 2 + i)], expected);
      }
    }
  }
  EXPECT_THROW(mt::raw::permute(t, {0, 0, 1}), mt::ShapeError);
  EXPECT_THROW(mt::raw::permute(t, {0, 1}), mt::ShapeError);
}

TEST(Views, NarrowAndSlice) {
  const Tensor t = mt::from_vector(iota_values(10), {10});
  const Tensor n = mt::raw::narrow(t, 0, 2, 3);
  EXPECT_EQ(n.offset(), 2);
  EXPECT_EQ(n.to_vector<double>(), (std::vector<double>{2, 3, 4}));
  EXPECT_EQ(mt::raw::narrow(t, 0, 10, 0).numel(), 0);
  EXPECT_THROW(mt::raw::narrow(t, 0, 8, 3), mt::ShapeError);
  EXPECT_THROW(mt::raw::narrow(t, 0, -1, 3), mt::ShapeError);

  const Tensor s = mt::raw::slice(t, 0, 1, 8, 3);
  EXPECT_EQ(s.shape(), (Shape{3}));
  EXPECT_EQ(s.strides(), (Shape{3}));
  EXPECT_EQ(s.to_vector<double>(), (std::vector<double>{1, 4, 7}));
  EXPECT_EQ(mt::raw::slice(t, 0, -3, 100).to_vector<double>(), (std::vector<double>{7, 8, 9}));
  EXPECT_EQ(mt::raw::slice(t, 0, 1, 7, 2).to_vector<double>(), (std::vector<double>{1, 3, 5}));
  EXPECT_EQ(mt::raw::slice(t, 0, 6, 2).numel(), 0);
  EXPECT_THROW(mt::raw::slice(t, 0, 0, 5, 0), mt::ShapeError);

  const Tensor m = base_234();
  const Tensor ms = mt::raw::slice(mt::raw::narrow(m, 1, 1, 2), 2, 1, 4, 2);  // [2, 2, 2]
  EXPECT_EQ(ms.to_vector<double>(), (std::vector<double>{5, 7, 9, 11, 17, 19, 21, 23}));
}

TEST(Views, ExpandUsesStrideZero) {
  const Tensor col = mt::from_vector({1, 2, 3}, {3, 1});
  const Tensor e = mt::raw::expand(col, {3, 4});
  EXPECT_EQ(e.shape(), (Shape{3, 4}));
  EXPECT_EQ(e.strides(), (Shape{1, 0}));
  EXPECT_TRUE(e.shares_storage_with(col));
  EXPECT_EQ(e.to_vector<double>(), (std::vector<double>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}));
  const Tensor lead = mt::raw::expand(col, {2, -1, 2});
  EXPECT_EQ(lead.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(lead.strides(), (Shape{0, 1, 0}));
  EXPECT_EQ(lead.to_vector<double>(), (std::vector<double>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
  EXPECT_FALSE(e.is_contiguous());
  EXPECT_THROW(mt::raw::expand(col, {2, 4}), mt::ShapeError);
  EXPECT_THROW(mt::raw::expand(col, {4}), mt::ShapeError);
  EXPECT_THROW(mt::raw::expand(col, {-1, 3, 4}), mt::ShapeError);
}

TEST(Views, SqueezeAndUnsqueeze) {
  const Tensor t = mt::zeros({2, 1, 3});
  EXPECT_EQ(mt::raw::squeeze(t, 1).shape(), (Shape{2, 3}));
  EXPECT_EQ(mt::raw::squeeze(t, 1).strides(), (Shape{3, 1}));
  EXPECT_EQ(mt::raw::squeeze(t, 0).shape(), (Shape{2, 1, 3})) << "a dim of size > 1 is left alone";
  EXPECT_EQ(mt::raw::squeeze(t, -2).shape(), (Shape{2, 3}));
  EXPECT_EQ(mt::raw::unsqueeze(t, 0).shape(), (Shape{1, 2, 1, 3}));
  EXPECT_EQ(mt::raw::unsqueeze(t, 3).shape(), (Shape{2, 1, 3, 1}));
  EXPECT_EQ(mt::raw::unsqueeze(t, -1).shape(), (Shape{2, 1, 3, 1}));
  EXPECT_THROW(mt::raw::unsqueeze(t, 4), mt::ShapeError);
  const Tensor s = mt::raw::squeeze(mt::raw::unsqueeze(base_234(), 2), 2);
  EXPECT_EQ(s.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(s.to_vector<double>(), iota_values(24));
}

// ---- a view's writes are visible in its base, and the base's in the view ----

struct ViewCase {
  const char* name;
  std::function<Tensor(const Tensor&)> make;  // a view of the [2, 3, 4] base
  // Row-major index in the view of base element (i, j, k), or -1 where the view does not reach it.
  std::function<int(int, int, int)> index_in_view;
};

class ViewAliasingTest : public ::testing::TestWithParam<ViewCase> {};

TEST_P(ViewAliasingTest, CopyIntoViewWritesTheBase) {
  const ViewCase& c = GetParam();
  const Tensor base = base_234();
  Tensor v = c.make(base);
  ASSERT_TRUE(v.shares_storage_with(base));
  v.copy_(mt::from_vector(iota_values(v.numel(), 100), v.shape()));
  const std::vector<double> got = base.to_vector<double>();
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) {
        const int at = c.index_in_view(i, j, k);
        const double expected = at < 0 ? 12 * i + 4 * j + k : 100 + at;
        EXPECT_EQ(got[static_cast<size_t>(12 * i + 4 * j + k)], expected)
            << "base[" << i << "][" << j << "][" << k << "]";
      }
    }
  }
}

TEST_P(ViewAliasingTest, FillOfViewWritesTheBase) {
  const ViewCase& c = GetParam();
  const Tensor base = base_234();
  const uint64_t version = base.version();
  c.make(base).fill_(-1.0);
  EXPECT_GT(base.version(), version) << "a write through a view bumps the shared version";
  const std::vector<double> got = base.to_vector<double>();
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) {
        const double expected = c.index_in_view(i, j, k) < 0 ? 12 * i + 4 * j + k : -1.0;
        EXPECT_EQ(got[static_cast<size_t>(12 * i + 4 * j + k)], expected);
      }
    }
  }
}

TEST_P(ViewAliasingTest, WritesToTheBaseShowInTheView) {
  const ViewCase& c = GetParam();
  Tensor base = base_234();
  const Tensor v = c.make(base);
  base.copy_(mt::from_vector(iota_values(24, 1000), {2, 3, 4}));
  const std::vector<double> got = v.to_vector<double>();
  int reached = 0;
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) {
        const int at = c.index_in_view(i, j, k);
        if (at < 0) continue;
        ++reached;
        EXPECT_EQ(got[static_cast<size_t>(at)], 1000 + 12 * i + 4 * j + k);
      }
    }
  }
  EXPECT_EQ(reached, v.numel());
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, ViewAliasingTest,
    ::testing::Values(ViewCase{"narrow_last_dim",
                               [](const Tensor& t) { return mt::raw::narrow(t, 2, 1, 2); },  // [2, 3, 2]
                               [](int i, int j, int k) { return k >= 1 && k <= 2 ? i * 6 + j * 2 + (k - 1) : -1; }},
                      ViewCase{"transpose", [](const Tensor& t) { return mt::raw::transpose(t, 0, 2); },  // [4, 3, 2]
                               [](int i, int j, int k) { return k * 6 + j * 2 + i; }},
                      ViewCase{"slice_step_2",
                               [](const Tensor& t) { return mt::raw::slice(t, 1, 0, 3, 2); },  // [2, 2, 4]
                               [](int i, int j, int k) { return j % 2 == 0 ? i * 8 + (j / 2) * 4 + k : -1; }},
                      ViewCase{"permute",
                               [](const Tensor& t) {
                                 return mt::raw::permute(t, {1, 2, 0});
                               },  // [3, 4, 2]
                               [](int i, int j, int k) { return j * 8 + k * 2 + i; }},
                      ViewCase{"narrow_of_transpose",  // [2, 2, 3]: v[i][a][j] = t[i][j][1 + a]
                               [](const Tensor& t) { return mt::raw::narrow(mt::raw::transpose(t, 1, 2), 1, 1, 2); },
                               [](int i, int j, int k) { return k >= 1 && k <= 2 ? i * 6 + (k - 1) * 3 + j : -1; }},
                      ViewCase{"narrow_of_view",  // rows 2 and 3 of the [6, 4] view
                               [](const Tensor& t) {
                                 return mt::raw::narrow(mt::raw::view(t, {6, 4}), 0, 2, 2);
                               },
                               [](int i, int j, int k) {
                                 const int row = 3 * i + j;
                                 return row == 2 || row == 3 ? (row - 2) * 4 + k : -1;
                               }},
                      ViewCase{"squeezed_narrow",  // t[1] as [3, 4]
                               [](const Tensor& t) { return mt::raw::squeeze(mt::raw::narrow(t, 0, 1, 1), 0); },
                               [](int i, int j, int k) { return i == 1 ? j * 4 + k : -1; }},
                      ViewCase{"sliced_transpose_negative_start",  // [2, 2, 3]: v[i][a][j] = t[i][j][2 + a]
                               [](const Tensor& t) { return mt::raw::slice(mt::raw::transpose(t, 1, 2), 1, -2, 4); },
                               [](int i, int j, int k) { return k >= 2 ? i * 6 + (k - 2) * 3 + j : -1; }}),
    [](const ::testing::TestParamInfo<ViewCase>& info) { return std::string(info.param.name); });

// ---- copies ----

TEST(Copy, ConvertsDTypes) {
  const std::vector<double> values = {1.0, 2.5, -3.75, 65520.0, 1e-8, 3.7};
  const Tensor src = mt::from_vector(values, {6}, DType::f32);
  Tensor h = mt::empty({6}, DType::f16);
  h.copy_(src);
  const mt::Half* hp = h.data<mt::Half>();
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(hp[i].x, mt::bits::f32_to_f16(static_cast<float>(values[i]))) << values[i];
  }
  EXPECT_TRUE(std::isinf(h.to_vector<double>()[3])) << "65520 rounds to inf in f16";
  Tensor i32 = mt::empty({6}, DType::i32);
  i32.copy_(src);
  EXPECT_EQ(i32.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, -3, 65520, 0, 3})) << "truncates toward zero";
  Tensor b = mt::empty({6}, DType::boolean);
  b.copy_(mt::from_vector({0, 2, -1, 0, 0.5, 1}, {6}));
  EXPECT_EQ(b.to_vector<double>(), (std::vector<double>{0, 1, 1, 0, 1, 1}));
}

TEST(Copy, Broadcasts) {
  Tensor dst = mt::zeros({2, 3});
  dst.copy_(mt::from_vector({1, 2, 3}, {3}));
  EXPECT_EQ(dst.to_vector<double>(), (std::vector<double>{1, 2, 3, 1, 2, 3}));
  dst.copy_(mt::from_vector({7, 8}, {2, 1}, DType::i64));
  EXPECT_EQ(dst.to_vector<double>(), (std::vector<double>{7, 7, 7, 8, 8, 8}));
  dst.copy_(mt::full({}, 5.0, DType::f16));
  EXPECT_EQ(dst.to_vector<double>(), std::vector<double>(6, 5.0));
  EXPECT_THROW(dst.copy_(mt::zeros({2})), mt::ShapeError);
  EXPECT_THROW(dst.copy_(mt::zeros({3, 3})), mt::ShapeError);
}

TEST(Copy, BetweenStridedViews) {
  const Tensor src = mt::from_vector(iota_values(6), {2, 3});
  Tensor dst = mt::zeros({3, 2});
  dst.copy_(mt::raw::transpose(src, 0, 1));
  EXPECT_EQ(dst.to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  Tensor big = mt::zeros({4, 6}, DType::bf16);
  mt::raw::slice(mt::raw::transpose(big, 0, 1), 0, 1, 6, 2).copy_(mt::raw::expand(mt::from_vector({9}, {1}), {3, 4}));
  const std::vector<double> got = big.to_vector<double>();
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 6; ++c) EXPECT_EQ(got[static_cast<size_t>(r * 6 + c)], c % 2 == 1 ? 9.0 : 0.0);
  }
}

TEST(Copy, ContiguousSharesOnlyWhenAlreadyContiguous) {
  const Tensor t = mt::from_vector(iota_values(6), {2, 3});
  const Tensor same = mt::raw::contiguous(t);
  EXPECT_EQ(same.data_ptr(), t.data_ptr());
  EXPECT_TRUE(same.shares_storage_with(t));
  const Tensor narrowed = mt::raw::narrow(t, 0, 1, 1);  // contiguous, at an offset
  EXPECT_EQ(mt::raw::contiguous(narrowed).data_ptr(), narrowed.data_ptr());
  const Tensor tr = mt::raw::transpose(t, 0, 1);
  const Tensor copy = mt::raw::contiguous(tr);
  EXPECT_FALSE(copy.shares_storage_with(t));
  EXPECT_TRUE(copy.is_contiguous());
  EXPECT_EQ(copy.shape(), (Shape{3, 2}));
  EXPECT_EQ(copy.to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  const Tensor cl = mt::raw::clone(t);
  EXPECT_FALSE(cl.shares_storage_with(t));
  EXPECT_EQ(cl.to_vector<double>(), t.to_vector<double>());
}

TEST(Copy, ItemReadsOneElement) {
  EXPECT_EQ(mt::full({1}, 2.5).item(), 2.5);
  EXPECT_EQ(mt::full({1, 1}, -3.0, DType::i32).item(), -3.0);
  EXPECT_EQ(mt::raw::narrow(mt::from_vector({4, 5, 6}, {3}), 0, 2, 1).item(), 6.0);
  const std::string msg = message_of<mt::Error>([] { mt::zeros({2}).item(); });
  expect_contains(msg, {"item", "2 elements", "[2]"});
}

// ---- printing ----

TEST(Printing, SmallTensorsShowEveryValue) {
  const Tensor t = mt::from_vector({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(t.str(), "tensor([[1.0000, 2.0000],\n        [3.0000, 4.0000]], dtype=f32, device=cpu)");
  const std::string v = mt::from_vector({1, 2.5, -3}, {3}).str();
  expect_contains(v, {"1.0000", "2.5000", "-3.0000", "dtype=f32", "device=cpu"});
  EXPECT_EQ(v.find("..."), std::string::npos);
  expect_contains(mt::from_vector({7, -2}, {2}, DType::i64).str(), {"7", "-2", "dtype=i64"});
  expect_contains(mt::full({}, 0.5, DType::bf16).str(), {"0.5000", "dtype=bf16"});
  expect_contains(mt::zeros({0, 2}).str(), {"[0, 2]"});
}

TEST(Printing, LargeTensorsAreSummarised) {
  const std::string s = mt::arange(0.0, 2000.0).str();
  expect_contains(s, {"...", "0.0000", "2.0000", "1997.0000", "1999.0000", "dtype=f32", "device=cpu"});
  EXPECT_EQ(s.find("1000.0000"), std::string::npos) << "the middle is left out";
  EXPECT_LT(s.size(), 200u);
  const std::string m = mt::raw::view(mt::arange(0.0, 2000.0), {50, 40}).str();
  expect_contains(m, {"...", "39.0000", "1960.0000", "1999.0000"});
  EXPECT_EQ(m.find("1000.0000"), std::string::npos);
}

// ---- errors users see ----

TEST(Errors, WrapDimNamesTheOpAndTheRange) {
  EXPECT_EQ(mt::raw::wrap_dim(-1, 3, "op"), 2);
  EXPECT_EQ(mt::raw::wrap_dim(0, 0, "op"), 0) << "a 0-d tensor accepts dim 0 and -1";
  expect_contains(message_of<mt::ShapeError>([] { mt::raw::wrap_dim(5, 3, "myop"); }),
                  {"myop", "dimension 5", "3 dimensions", "-3..2"});
  expect_contains(message_of<mt::ShapeError>([] {
                    mt::raw::transpose(mt::zeros({2, 3}), 2, 0);
                  }),
                  {"transpose", "dimension 2", "-2..1"});
  expect_contains(message_of<mt::ShapeError>([] { mt::zeros({2, 3}).size(-3); }), {"Tensor::size", "-3"});
}

TEST(Errors, BroadcastShapes) {
  EXPECT_EQ(mt::raw::broadcast_shapes({3, 1}, {1, 4}, "add"), (Shape{3, 4}));
  EXPECT_EQ(mt::raw::broadcast_shapes({5, 1, 3}, {4, 1}, "add"), (Shape{5, 4, 3}));
  EXPECT_EQ(mt::raw::broadcast_shapes({}, {2}, "add"), (Shape{2}));
  EXPECT_EQ(mt::raw::broadcast_shapes({0, 1}, {1, 3}, "add"), (Shape{0, 3}));
  expect_contains(message_of<mt::ShapeError>([] {
                    mt::raw::broadcast_shapes({2, 3}, {4, 3}, "add");
                  }),
                  {"add", "[2, 3]", "[4, 3]"});
}

TEST(Errors, DeviceParsing) {
  const mt::Device d("cuda:1");
  EXPECT_TRUE(d.is_cuda());
  EXPECT_EQ(d.index, 1);
  EXPECT_EQ(d.str(), "cuda:1");
  EXPECT_EQ(mt::Device("cuda"), mt::cuda_device(0));
  EXPECT_EQ(mt::Device("cpu"), mt::kCPU);
  EXPECT_EQ(mt::Device("cuda:12").index, 12);
  EXPECT_NE(mt::Device("cuda:0"), mt::Device("cuda:1"));
  expect_contains(message_of<mt::DeviceError>([] { mt::Device("gpu"); }), {"'gpu'"});
  EXPECT_THROW(mt::Device("cuda:"), mt::DeviceError);
  EXPECT_THROW(mt::Device("cuda:-1"), mt::DeviceError);
  EXPECT_THROW(mt::Device("cuda:1x"), mt::DeviceError);
  EXPECT_THROW(mt::Device("CPU"), mt::DeviceError);
}

TEST(Errors, TypedErrorsShareOneBase) {
  EXPECT_THROW(throw mt::OutOfMemoryError("x"), mt::DeviceError);
  EXPECT_THROW(throw mt::ShapeError("x"), mt::Error);
  EXPECT_THROW(MT_INTERNAL_ASSERT(1 + 1 == 3, "arithmetic"), mt::InternalError);
}

}  // namespace
