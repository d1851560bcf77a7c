// The pp group's send/recv decorator (shm_p2p.h) over the rings of
// shm_rings.h: which messages take the rings, the works that wait on them,
// and the collective set-up with its fallback to the inner group.
#include "engine/comm/shm_p2p.h"
#include "engine/comm/shm_rings.h"

#include <atomic>
#include <utility>

#include "common/error.h"
#include "common/log.h"
#include "engine/comm/forwarding_group.h"
#include "engine/comm/gloo_group.h"

namespace dtrain::engine::comm::detail {

namespace {

class P2pWork : public Work {
 public:
  P2pWork(std::shared_ptr<ShmRings> channel, OpPtr op, const char* what, int peer)
      : channel_(std::move(channel)), op_(std::move(op)), what_(what), peer_(peer) {}
  void wait() override { channel_->wait(op_, what_, peer_); }

 private:
  std::shared_ptr<ShmRings> channel_;
  OpPtr op_;
  const char* what_;
  int peer_;
};

class ShmP2pGroup : public ForwardingGroup {
 public:
  ShmP2pGroup(std::unique_ptr<Group> inner, std::shared_ptr<ShmRings> channel)
      : ForwardingGroup(std::move(inner)), channel_(std::move(channel)) {}

  // The path is chosen by the peer alone, so both sides of a pair agree;
  // a tensor Gloo would refuse goes to Gloo, which says why.
  WorkPtr send(const at::Tensor& t, int peer, int tag) override {
    if (!ours(t, peer, tag)) return inner_->send(t, peer, tag);
    bytes_ += t.nbytes();
    return std::make_shared<P2pWork>(channel_, channel_->post_send(t, peer, tag), "send", peer);
  }
  WorkPtr recv(at::Tensor& t, int peer, int tag) override {
    if (!ours(t, peer, tag)) return inner_->recv(t, peer, tag);
    return std::make_shared<P2pWork>(channel_, channel_->post_recv(t, peer, tag), "recv", peer);
  }
  uint64_t bytes_sent() const override { return inner_->bytes_sent() + bytes_.load(); }
  void reset_bytes_sent() override {
    inner_->reset_bytes_sent();
    bytes_.store(0);
  }

 private:
  bool ours(const at::Tensor& t, int peer, int tag) const {
    return channel_->has_ring(peer) && tag >= 0 && tag < kMaxUserTag && t.device().is_cpu() && t.is_contiguous();
  }

  std::shared_ptr<ShmRings> channel_;
  std::atomic<uint64_t> bytes_{0};
};
}  // namespace

std::unique_ptr<Group> with_shm_p2p(std::unique_ptr<Group> inner, const c10::intrusive_ptr<c10d::Store>& store,
                                    const std::string& key, const ShmOptions& options, int64_t ring_bytes) {
  if (inner->size() == 1) return inner;
  std::string why;
  std::shared_ptr<ShmRings> rings;
  try {
    rings = open_shm_rings(*inner, *store, key, options, ring_bytes, why);
  } catch (...) {
    rethrow_comm_error(inner->name(), "setting up the shared-memory send/recv");
  }
  if (!rings) {
    if (inner->rank() == 0)
      DTRAIN_INFO("group {} ({} ranks): send/recv over {}: {}", inner->name(), inner->size(), inner->backend(), why);
    return inner;
  }
  return std::make_unique<ShmP2pGroup>(std::move(inner), std::move(rings));
}

bool uses_shm_p2p(const Group& g) { return dynamic_cast<const ShmP2pGroup*>(&g) != nullptr; }

}  // namespace dtrain::engine::comm::detail
