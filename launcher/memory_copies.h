// The node's RAM directory for in-memory checkpoint copies (checkpoint.memory):
// the agent makes it, hands it to its workers as DTRAIN_MEMORY_DIR (they
// write and read the copies: engine/checkpoint/memory_snapshot.h) and
// removes it when it ends; the worker watch removes it when the agent dies.
// An agent outlives its workers, so the copies outlive a round's workers.
#pragma once

#include <memory>
#include <string>

namespace dtrain::launcher {

class MemoryCopies {
 public:
  // /dev/shm/dtrain-mem-<job>-<node id>, made now, empty, mode 0700. Null, with a warning, when it cannot
  // be made: restarts then read checkpoint.dir only.
  static std::unique_ptr<MemoryCopies> create(const std::string& job, const std::string& node_id);
  ~MemoryCopies();  // removes the directory and everything in it
  MemoryCopies(const MemoryCopies&) = delete;
  MemoryCopies& operator=(const MemoryCopies&) = delete;

  const std::string& dir() const { return dir_; }
  // Removes everything in the directory (it stays); returns how many entries went.
  int clear();

 private:
  explicit MemoryCopies(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

}  // namespace dtrain::launcher
