/*
 * DeviceMesh: the ranks of a job laid out as an n-dimensional grid, with a process group per
 * dimension. A 4-rank job as 2 pipeline replicas x 2 stages:
 *
 *   dist::DeviceMesh mesh(world, {{"data", 2}, {"pipe", 2}});
 *   mesh.group("pipe");   // the ranks of this rank's pipeline (same "data" coordinate)
 *   mesh.group("data");   // the ranks holding the same stage in every replica
 *   mesh.coordinate("pipe");   // this rank's stage
 *
 * Ranks are laid out row-major, the last dimension varying fastest: rank = sum(coord[d] *
 * stride[d]); so with {"data", R}, {"pipe", N} the N ranks of one pipeline are consecutive
 * (the same node, when a launcher places consecutive ranks together). Dimension d's group holds
 * the ranks whose coordinates equal this rank's everywhere but along d, ordered by their
 * coordinate along d (group rank = coordinate). Building a mesh is collective over `world`
 * (every rank, same dimensions, same order: one split per dimension).
 */
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <cohort/distributed/process_group.h>

namespace cohort::dist {

class DeviceMesh {
 public:
  // ValueError when the sizes' product is not the world's size, a size is < 1, or names repeat.
  DeviceMesh(ProcessGroupPtr world, std::vector<std::pair<std::string, int>> dims);

  const std::vector<std::pair<std::string, int>>& dims() const { return dims_; }
  int size(const std::string& dim) const;
  int coordinate(const std::string& dim) const;  // this rank's
  // The group of dimension `dim` (see above). ValueError naming the dimensions for another name.
  const ProcessGroupPtr& group(const std::string& dim) const;
  const ProcessGroupPtr& world() const { return world_; }
  // The world rank at `coords` (one per dimension) and the coordinates of a world rank.
  int rankAt(const std::vector<int>& coords) const;
  std::vector<int> coordinatesOf(int rank) const;
  // "data=1/2 pipe=0/2".
  std::string describe() const;

 private:
  size_t index(const std::string& dim) const;

  ProcessGroupPtr world_;
  std::vector<std::pair<std::string, int>> dims_;
  std::vector<int> coords_;
  std::vector<ProcessGroupPtr> groups_;
};

}  // namespace cohort::dist
