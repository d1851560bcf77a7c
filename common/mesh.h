// The device mesh: an ordered list of named axes with sizes, the rank order
// it implies and every process group derived from it, declared as data. The
// one definition shared by the spec, placement (rendezvous/), the worker
// environment, comm and the cost model; no LibTorch.
//
// Rank order (Megatron-Core's RankGenerator idea): the axes of `order`,
// innermost first; default tp-cp-dp-pp. world = tp x cp x dp x pp. Expert
// parallelism is not an axis of its own: its groups are consecutive runs of
// `ep` ranks among the ranks of one pipeline stage (in rank order), and edp
// groups hold the ranks with the same experts (Megatron-Core's expert layout
// with expert TP 1). With tp > 1 an ep group holds TP ranks, which hold the
// same tokens and each dispatch their share (engine/model/moe.h).
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::mesh {

enum class Axis : int { tp = 0, cp = 1, dp = 2, pp = 3 };
constexpr int kAxes = 4;
constexpr std::array<Axis, kAxes> kAllAxes = {Axis::tp, Axis::cp, Axis::dp, Axis::pp};
const char* axis_name(Axis axis);
bool parse_axis(std::string_view name, Axis* out);

// The rank order, innermost first.
using Order = std::array<Axis, kAxes>;
constexpr Order kDefaultOrder = {Axis::tp, Axis::cp, Axis::dp, Axis::pp};
std::string format_order(const Order& order);  // "tp-cp-dp-pp"
// "tp-cp-dp-pp" (every axis once, any order) into *out; false with *problem
// naming the unknown, repeated or missing axis.
bool parse_order(std::string_view text, Order* out, std::string* problem);

// The process groups: each holds the ranks that differ only along `varying`
// (the others fixed), except ep and edp, which fold expert parallelism into
// the ranks of a stage. Adding a group is adding a row to group_defs().
enum class GroupKind : int { tp, cp, dp, pp, dp_cp, ep, edp };
struct GroupDef {
  GroupKind kind;
  const char* name;
  std::vector<Axis> varying;  // empty for ep / edp
  const char* role;           // what uses it (docs, `dtrain topo`)
};
const std::vector<GroupDef>& group_defs();
// Where gradients are reduced: every replica of a shard, dp x cp; the dp
// group itself (its name in logs and hang reports) when cp = 1.
inline GroupKind gradient_group(int cp) { return cp > 1 ? GroupKind::dp_cp : GroupKind::dp; }
const char* group_name(GroupKind kind);
bool parse_group(std::string_view name, GroupKind* out);

struct Coord {
  std::array<int, kAxes> at{};  // by Axis
  int ep = 0;                   // index in this rank's ep group
  int operator[](Axis a) const { return at[static_cast<size_t>(a)]; }
  int& operator[](Axis a) { return at[static_cast<size_t>(a)]; }
  bool operator==(const Coord&) const = default;
};

struct Mesh {
  Order order = kDefaultOrder;
  std::array<int, kAxes> sizes{1, 1, 1, 1};  // by Axis
  int ep = 1;

  int size(Axis a) const { return sizes[static_cast<size_t>(a)]; }
  int& size(Axis a) { return sizes[static_cast<size_t>(a)]; }
  int dp() const { return size(Axis::dp); }
  int tp() const { return size(Axis::tp); }
  int pp() const { return size(Axis::pp); }
  int cp() const { return size(Axis::cp); }
  int world() const { return dp() * tp() * pp() * cp(); }
  int stage_ranks() const { return world() / pp(); }  // ranks of one pipeline stage
  bool operator==(const Mesh&) const = default;
};

// dp, tp, pp, cp (and ep) sizes in the default order.
Mesh make_mesh(int dp, int tp, int pp, int ep = 1, int cp = 1, const Order& order = kDefaultOrder);

int rank_of(const Mesh& m, const Coord& c);
Coord coord_of(const Mesh& m, int rank);
// Every group of one kind, each as sorted global ranks; the groups of one
// kind are disjoint and cover all ranks.
std::vector<std::vector<int>> groups(const Mesh& m, GroupKind kind);
// The group of `kind` that holds `rank`.
std::vector<int> group_of(const Mesh& m, GroupKind kind, int rank);
// A rank's index in its group of an axis kind (tp, cp, dp, pp, dp_cp),
// from its coordinates alone: the position group_of would give it.
int index_in_group(const Mesh& m, GroupKind kind, const Coord& c);

// The environment's texts (DTRAIN_MESH, DTRAIN_COORD): axes innermost first,
// then ep: "tp=2,cp=1,dp=2,pp=2,ep=1" and "tp=1,cp=0,dp=1,pp=0,ep=0".
std::string format_mesh(const Mesh& m);
std::string format_coord(const Mesh& m, const Coord& c);
// DTRAIN_MESH text to a Mesh: the axes named in it in that order (innermost
// first), axes not named have size 1 (their place in the order does not
// change a rank's number). false with *problem on bad syntax, an unknown or
// repeated axis, a size below 1, or ep not dividing a stage's ranks.
bool parse_mesh(std::string_view text, Mesh* out, std::string* problem);
// "dp=2,tp=2,pp=2" as `dtrain topo` and the logs print it: dp, tp, pp, then
// cp when > 1, then ep.
std::string describe(const Mesh& m);
// A rank's coordinates in the same style: "dp=1,tp=0,pp=1,ep=0".
std::string describe(const Mesh& m, const Coord& c);

}  // namespace dtrain::mesh
