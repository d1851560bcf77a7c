// Heartbeats the server holds (long-poll) until the round moves on or their
// wait ends, so every agent hears of a new round when it is declared instead
// of at its next beat. Bookkeeping only: no gRPC, no lock (the server's mutex
// guards it), no clock (the caller passes `now`); Handle is the server's call.
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rendezvous/round_state.h"

namespace dtrain::rendezvous {

template <class Handle>
class HeldBeats {
 public:
  struct Beat {
    Handle handle;
    std::string node_id;
  };

  // Every held beat names the same round (a beat of another round is
  // answered at once, and due() empties the set when the round moves on).
  void hold(uint64_t ticket, Handle handle, std::string node_id, uint64_t round, TimePoint until) {
    round_ = round;
    beats_.emplace(ticket, Beat{handle, std::move(node_id)});
    deadlines_.emplace(until, ticket);
  }
  // The call went away (cancelled): true, with its handle, if it was held.
  bool drop(uint64_t ticket, Handle* handle) {
    auto it = beats_.find(ticket);
    if (it == beats_.end()) return false;
    *handle = it->second.handle;
    beats_.erase(it);
    return true;
  }
  // The beats to answer now: all of them once `round` is not theirs, else
  // those whose wait ended. O(1) amortised per beat: each deadline is popped
  // once (lazily: an answered beat's entry is skipped when it surfaces).
  std::vector<Beat> due(uint64_t round, TimePoint now) {
    if (beats_.empty()) {
      deadlines_ = {};
      return {};
    }
    if (round != round_) return take_all();
    std::vector<Beat> out;
    while (!deadlines_.empty() && deadlines_.top().first <= now) {
      auto it = beats_.find(deadlines_.top().second);
      deadlines_.pop();
      if (it == beats_.end()) continue;
      out.push_back(std::move(it->second));
      beats_.erase(it);
    }
    return out;
  }
  std::vector<Beat> take_all() {
    std::vector<Beat> out;
    out.reserve(beats_.size());
    for (auto& [ticket, beat] : beats_) out.push_back(std::move(beat));
    beats_.clear();
    deadlines_ = {};
    return out;
  }
  size_t size() const { return beats_.size(); }

 private:
  uint64_t round_ = 0;
  std::unordered_map<uint64_t, Beat> beats_;  // by ticket
  using Deadline = std::pair<TimePoint, uint64_t>;  // until, ticket
  std::priority_queue<Deadline, std::vector<Deadline>, std::greater<Deadline>> deadlines_;
};

}  // namespace dtrain::rendezvous
