#include "ops/fp8/fp8_autocast.h"

#include <cstdlib>

#include "core/error.h"

namespace mt {

namespace {

struct PerType {
  bool enabled = false;
  Fp8Recipe recipe;
};

thread_local PerType t_state[2];  // indexed by DeviceType, as autocast's

PerType& for_type(DeviceType t) { return t_state[static_cast<int>(t)]; }

const char* amax_name(DelayedScaling::Amax a) { return a == DelayedScaling::Amax::max ? "max" : "most_recent"; }

}  // namespace

Fp8Recipe Fp8Recipe::delayed(int history_len, DelayedScaling::Amax amax_compute, int margin) {
  Fp8Recipe r;
  r.scaling = Scaling::delayed;
  r.history_len = history_len;
  r.amax_compute = amax_compute;
  r.margin = margin;
  return r;
}

Fp8Recipe Fp8Recipe::current(int margin) {
  Fp8Recipe r;
  r.scaling = Scaling::current;
  r.margin = margin;
  return r;
}

void Fp8Recipe::validate() const {
  MT_CHECK(scaling == Scaling::current || history_len >= 1, "Fp8Recipe: history_len must be at least 1, got ",
           history_len);
  // 2^margin must stay a normal f32 factor of 448 and 57344 (fp8_scaling.h's exact scaled max).
  MT_CHECK(std::abs(margin) <= 64, "Fp8Recipe: margin must lie in [-64, 64], got ", margin);
}

DelayedScaling Fp8Recipe::for_format(DType format) const {
  DelayedScaling d;
  d.history_len = history_len;
  d.amax_compute = amax_compute;
  d.margin = margin;
  d.format = format;
  return d;
}

std::string Fp8Recipe::str() const {
  if (scaling == Scaling::current) return detail::str_cat("current scaling (margin ", margin, ")");
  return detail::str_cat("delayed scaling (history ", history_len, ", amax ", amax_name(amax_compute), ", margin ",
                         margin, ")");
}

bool Fp8Recipe::operator==(const Fp8Recipe& o) const {
  if (scaling != o.scaling || margin != o.margin) return false;
  return scaling == Scaling::current || (history_len == o.history_len && amax_compute == o.amax_compute);
}

Fp8AutocastGuard::Fp8AutocastGuard(DeviceType device_type, const Fp8Recipe& recipe, bool enabled)
    : device_type_(device_type),
      previous_enabled_(for_type(device_type).enabled),
      previous_recipe_(for_type(device_type).recipe) {
  recipe.validate();
  for_type(device_type).enabled = enabled;
  for_type(device_type).recipe = recipe;
}

Fp8AutocastGuard::~Fp8AutocastGuard() {
  for_type(device_type_).enabled = previous_enabled_;
  for_type(device_type_).recipe = previous_recipe_;
}

bool fp8_autocast_enabled(DeviceType device_type) { return for_type(device_type).enabled; }

const Fp8Recipe& fp8_autocast_recipe(DeviceType device_type) { return for_type(device_type).recipe; }

}  // namespace mt
