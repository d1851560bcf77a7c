// The job spec's enum fields as C++ enums, each with its name table: the one
// spelling the parser reads, the printer writes and messages quote. A value
// is an index into its table, so the two cannot disagree.
// Not the rules between fields (common/spec_validate.cpp).
#pragma once

#include <concepts>
#include <cstddef>
#include <string>
#include <vector>

namespace dtrain {

enum class DeviceKind { cpu, cuda };                                           // cluster.device
enum class CommBackend { automatic, gloo, nccl };                              // cluster.backend
enum class PipelineSchedule { gpipe, one_f_one_b, interleaved_1f1b, zb_h1 };  // parallel.pipeline.schedule
enum class ReduceDtype { fp32, bf16 };                                         // parallel.reduce_dtype
enum class TpVocab { parallel, replicated };                                   // model.tp_vocab
enum class MoeBalance { aux, bias };                                           // model.moe.balance
enum class AttentionImpl { naive, tiled };                                     // model.attention
enum class Precision { fp32, bf16, fp16 };                                     // train.precision
enum class Recompute { none, full, selective };                                // train.recompute
enum class NonfiniteAction { stop, skip_step };                                // train.nonfinite
enum class DataFormat { bytes, tokens_u16, tokens_u32, indexed, synthetic };    // data.format
enum class GlooReduceScatter { ring, native };                                 // cluster.gloo_reduce_scatter
enum class OffloadTarget { none, host, nvme };                                 // train.offload.optimizer, .params
// fault.kind (common/job_spec.h says what each does)
enum class FaultKind {
  none, kill_after_step, hang, slow, crash_during_save, no_grad_sync, recompute_redraw, raise, nan_grad,
  no_tp_reduce, no_pp_grad, reset_moments_on_load, cp_local_attention,
  offload_no_writeback, offload_truncate, offload_delete
};

// names[i] is the spelling of E(i), in the order messages list them.
template <typename E>
struct SpecEnumNames;
template <>
struct SpecEnumNames<DeviceKind> {
  static inline const std::vector<std::string> names = {"cpu", "cuda"};
};
template <>
struct SpecEnumNames<CommBackend> {
  static inline const std::vector<std::string> names = {"auto", "gloo", "nccl"};
};
template <>
struct SpecEnumNames<PipelineSchedule> {
  static inline const std::vector<std::string> names = {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1"};
};
template <>
struct SpecEnumNames<ReduceDtype> {
  static inline const std::vector<std::string> names = {"fp32", "bf16"};
};
template <>
struct SpecEnumNames<TpVocab> {
  static inline const std::vector<std::string> names = {"parallel", "replicated"};
};
template <>
struct SpecEnumNames<MoeBalance> {
  static inline const std::vector<std::string> names = {"aux", "bias"};
};
template <>
struct SpecEnumNames<AttentionImpl> {
  static inline const std::vector<std::string> names = {"naive", "tiled"};
};
template <>
struct SpecEnumNames<Precision> {
  static inline const std::vector<std::string> names = {"fp32", "bf16", "fp16"};
};
template <>
struct SpecEnumNames<Recompute> {
  static inline const std::vector<std::string> names = {"none", "full", "selective"};
};
template <>
struct SpecEnumNames<NonfiniteAction> {
  static inline const std::vector<std::string> names = {"stop", "skip_step"};
};
template <>
struct SpecEnumNames<DataFormat> {
  static inline const std::vector<std::string> names = {"bytes", "tokens-u16", "tokens-u32", "indexed", "synthetic"};
};

template <>
struct SpecEnumNames<GlooReduceScatter> {
  static inline const std::vector<std::string> names = {"ring", "native"};
};
template <>
struct SpecEnumNames<OffloadTarget> {
  static inline const std::vector<std::string> names = {"none", "host", "nvme"};
};
template <>
struct SpecEnumNames<FaultKind> {
  static inline const std::vector<std::string> names = {
      "none",     "kill_after_step", "hang",         "slow",       "crash_during_save",     "no_grad_sync",
      "recompute_redraw", "raise",   "nan_grad",     "no_tp_reduce", "no_pp_grad", "reset_moments_on_load",
      "cp_local_attention", "offload_no_writeback", "offload_truncate", "offload_delete"};
};
template <typename E>
concept SpecEnum = requires { SpecEnumNames<E>::names; };

template <SpecEnum E>
const std::vector<std::string>& enum_names() {
  return SpecEnumNames<E>::names;
}

template <SpecEnum E>
const std::string& to_string(E value) {
  return enum_names<E>()[static_cast<size_t>(value)];
}

// False (and *out untouched) when `text` is none of E's names.
template <SpecEnum E>
bool parse_enum(const std::string& text, E* out) {
  const auto& names = enum_names<E>();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == text) {
      *out = static_cast<E>(i);
      return true;
    }
  return false;
}

}  // namespace dtrain
