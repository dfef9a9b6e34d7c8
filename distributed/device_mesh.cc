#include <cohort/distributed/device_mesh.h>

#include <set>

#include <fmt/format.h>

namespace cohort::dist {

DeviceMesh::DeviceMesh(ProcessGroupPtr world, std::vector<std::pair<std::string, int>> dims)
    : world_(std::move(world)), dims_(std::move(dims)) {
  if (!world_) throw ValueError("DeviceMesh: the world group is null");
  if (dims_.empty()) throw ValueError("DeviceMesh: needs at least one dimension");
  int64_t product = 1;
  std::set<std::string> names;
  std::string shape;
  for (const auto& [name, n] : dims_) {
    if (n < 1) throw ValueError(fmt::format("DeviceMesh: dimension '{}' has size {} (must be >= 1)", name, n));
    if (!names.insert(name).second) throw ValueError(fmt::format("DeviceMesh: dimension '{}' is named twice", name));
    product *= n;
    shape += fmt::format("{}{}={}", shape.empty() ? "" : " x ", name, n);
  }
  if (product != world_->size())
    throw ValueError(fmt::format("DeviceMesh: {} makes {} ranks, the group '{}' has {}", shape, product, world_->name(),
                                 world_->size()));
  coords_ = coordinatesOf(world_->rank());
  for (size_t d = 0; d < dims_.size(); ++d) {
    // Color: the linear index of this rank's coordinates without dimension d.
    int color = 0;
    for (size_t e = 0; e < dims_.size(); ++e)
      if (e != d) color = color * dims_[e].second + coords_[e];
    ProcessGroupOptions o;
    o.name = dims_[d].first;
    o.timeout = world_->timeout();
    groups_.push_back(world_->split(color, coords_[d], o));
  }
}

size_t DeviceMesh::index(const std::string& dim) const {
  for (size_t d = 0; d < dims_.size(); ++d)
    if (dims_[d].first == dim) return d;
  std::string names;
  for (const auto& [n, s] : dims_) names += (names.empty() ? "" : ", ") + n;
  throw ValueError(fmt::format("DeviceMesh: no dimension '{}' (dimensions: {})", dim, names));
}

int DeviceMesh::size(const std::string& dim) const { return dims_[index(dim)].second; }
int DeviceMesh::coordinate(const std::string& dim) const { return coords_[index(dim)]; }
const ProcessGroupPtr& DeviceMesh::group(const std::string& dim) const { return groups_[index(dim)]; }

int DeviceMesh::rankAt(const std::vector<int>& coords) const {
  if (coords.size() != dims_.size())
    throw ValueError(fmt::format("DeviceMesh: {} coordinates for {} dimensions", coords.size(), dims_.size()));
  int rank = 0;
  for (size_t d = 0; d < dims_.size(); ++d) {
    if (coords[d] < 0 || coords[d] >= dims_[d].second)
      throw ValueError(fmt::format("DeviceMesh: coordinate {} along '{}' is outside 0..{}", coords[d], dims_[d].first,
                                   dims_[d].second - 1));
    rank = rank * dims_[d].second + coords[d];
  }
  return rank;
}

std::vector<int> DeviceMesh::coordinatesOf(int rank) const {
  if (rank < 0 || rank >= world_->size())
    throw ValueError(fmt::format("DeviceMesh: rank {} outside 0..{}", rank, world_->size() - 1));
  std::vector<int> c(dims_.size());
  for (size_t d = dims_.size(); d-- > 0;) {
    c[d] = rank % dims_[d].second;
    rank /= dims_[d].second;
  }
  return c;
}

std::string DeviceMesh::describe() const {
  std::string out;
  for (size_t d = 0; d < dims_.size(); ++d)
    out += fmt::format("{}{}={}/{}", out.empty() ? "" : " ", dims_[d].first, coords_[d], dims_[d].second);
  return out;
}

}  // namespace cohort::dist
