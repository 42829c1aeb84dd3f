#include "models/flat_params.h"

#include <algorithm>
#include <numeric>

#include "offload/memory_stats.h"

namespace strata::models {

int64_t FlatUnit::num_parameters() const {
  return std::accumulate(numels.begin(), numels.end(), int64_t{0});
}

namespace {

bool under(const std::string& name, const std::string& prefix) {
  return prefix.empty() ||
         (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
          name[prefix.size()] == '.');
}

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

tensor::Tensor make_buffer(int64_t size, DType dtype, Device device, offload::Category category,
                           bool released) {
  offload::CategoryScope scope(category);
  return released ? tensor::Tensor::empty_released({size}, dtype, device)
                  : tensor::Tensor::empty({size}, dtype, device);
}

}  // namespace

std::vector<FlatUnit> flatten_parameters(nn::Module& root, const std::vector<UnitSpec>& specs,
                                         int64_t align) {
  STRATA_CHECK(align >= 1, "alignment {} must be positive", align);
  std::vector<std::pair<std::string, autograd::Variable>> all = root.named_parameters();
  std::vector<int> owner(all.size(), -1);
  for (size_t i = 0; i < all.size(); ++i)
    for (size_t u = 0; u < specs.size(); ++u)
      for (const std::string& prefix : specs[u].prefixes)
        if (under(all[i].first, prefix)) {
          STRATA_CHECK(owner[i] < 0 || owner[i] == static_cast<int>(u),
                       "parameter '{}' matches units '{}' and '{}'", all[i].first,
                       specs[owner[i]].name, specs[u].name);
          owner[i] = static_cast<int>(u);
        }
  for (size_t i = 0; i < all.size(); ++i)
    STRATA_CHECK(owner[i] >= 0, "parameter '{}' belongs to no unit", all[i].first);

  std::vector<FlatUnit> units;
  units.reserve(specs.size());
  for (size_t u = 0; u < specs.size(); ++u) {
    std::vector<size_t> members;
    for (size_t i = 0; i < all.size(); ++i)
      if (owner[i] == static_cast<int>(u)) members.push_back(i);
    std::sort(members.begin(), members.end(),
              [&](size_t a, size_t b) { return all[a].first < all[b].first; });

    FlatUnit unit;
    unit.name = specs[u].name;
    unit.prefixes = specs[u].prefixes;
    unit.users = specs[u].users;
    int64_t size = 0;
    for (size_t i : members) {
      const autograd::Variable& v = all[i].second;
      STRATA_CHECK(v.dtype() == DType::F32, "parameter '{}' is {}, flat buffers are f32",
                   all[i].first, v.data().str());
      unit.names.push_back(all[i].first);
      unit.offsets.push_back(size);
      unit.numels.push_back(v.numel());
      unit.shapes.push_back(v.shape());
      unit.variables.push_back(v);
      size = round_up(size + v.numel(), align);
    }
    Device device = members.empty() ? Device::cpu() : all[members[0]].second.device();
    // Note [Deferred initialisation]: released buffers, nothing to copy.
    const bool deferred = nn::DeferredInitScope::active();
    unit.params = make_buffer(size, DType::F32, device, offload::Category::Param, deferred);
    unit.grads = make_buffer(size, DType::F32, device, offload::Category::Grad, deferred);
    // Zero first so the alignment padding is zero (Note [Flat parameters]).
    if (!deferred) {
      unit.params.zero_();
      unit.grads.zero_();
    }
    for (size_t k = 0; k < unit.variables.size(); ++k) {
      autograd::Variable& v = unit.variables[k];
      tensor::Tensor pview =
          unit.params.narrow(0, unit.offsets[k], unit.numels[k]).view(unit.shapes[k]);
      tensor::Tensor gview =
          unit.grads.narrow(0, unit.offsets[k], unit.numels[k]).view(unit.shapes[k]);
      if (!deferred) pview.copy_(v.data());
      v.set_data(pview);  // the old storage is freed once nothing else holds it
      v.set_grad(gview);
    }
    units.push_back(std::move(unit));
  }
  return units;
}

void zero_flat_grads(std::vector<FlatUnit>& units) {
  for (FlatUnit& u : units)
    if (!u.grads.storage()->is_released()) u.grads.zero_();
}

namespace {

// Replaces a unit's buffers by new ones of `size` elements and `dtype` on `device`, values
// converted (and copied across devices), the new tail zero, every view rebound (Note [Flat
// parameters]).
void rebuild_unit(FlatUnit& unit, int64_t size, DType dtype, Device device) {
  const int64_t old_size = unit.size();
  // Note [Deferred initialisation]: a unit not initialised yet has both buffers released and
  // gets released ones of the new layout.
  const bool released = unit.params.storage()->is_released();
  STRATA_CHECK(released == unit.grads.storage()->is_released(),
               "rebuilding unit '{}' with one of its buffers released", unit.name);
  tensor::Tensor params = make_buffer(size, dtype, device, offload::Category::Param, released);
  tensor::Tensor grads = make_buffer(size, dtype, device, offload::Category::Grad, released);
  if (!released) {
    params.narrow(0, old_size, size - old_size).zero_();
    grads.narrow(0, old_size, size - old_size).zero_();
  }
  if (old_size > 0 && !released) {
    params.narrow(0, 0, old_size).copy_(unit.params);
    grads.narrow(0, 0, old_size).copy_(unit.grads);
  }
  for (size_t k = 0; k < unit.variables.size(); ++k) {
    autograd::Variable& v = unit.variables[k];
    v.set_data(params.narrow(0, unit.offsets[k], unit.numels[k]).view(unit.shapes[k]));
    v.set_grad(grads.narrow(0, unit.offsets[k], unit.numels[k]).view(unit.shapes[k]));
  }
  unit.params = std::move(params);
  unit.grads = std::move(grads);
}

}  // namespace

void repad_flat_units(std::vector<FlatUnit>& units, int64_t multiple) {
  STRATA_CHECK(multiple >= 1, "padding multiple {} must be positive", multiple);
  for (FlatUnit& unit : units) {
    const int64_t size = round_up(unit.size(), multiple);
    if (size != unit.size()) rebuild_unit(unit, size, unit.params.dtype(), unit.params.device());
  }
}

void cast_flat_units(std::vector<FlatUnit>& units, DType dtype) {
  STRATA_CHECK(is_floating(dtype), "flat units cast to {}", dtype_name(dtype));
  for (FlatUnit& unit : units)
    if (unit.params.dtype() != dtype) rebuild_unit(unit, unit.size(), dtype, unit.params.device());
}

void move_flat_units(std::vector<FlatUnit>& units, Device device) {
  for (FlatUnit& unit : units)
    if (unit.params.device() != device)
      rebuild_unit(unit, unit.size(), unit.params.dtype(), device);
}

tensor::Tensor rebind_unit_params(FlatUnit& unit, tensor::Tensor params) {
  STRATA_CHECK(params.ndim() == 1 && params.numel() == unit.size(),
               "unit '{}' of {} elements bound to parameters {}", unit.name, unit.size(),
               params.str());
  for (size_t k = 0; k < unit.variables.size(); ++k)
    unit.variables[k].set_data(
        params.narrow(0, unit.offsets[k], unit.numels[k]).view(unit.shapes[k]));
  std::swap(unit.params, params);
  return params;
}

}  // namespace strata::models
