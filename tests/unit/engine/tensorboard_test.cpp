// The TensorBoard event encoder (common/tensorboard.h) against known
// bytes: each expected string is what tensorboard 2.20's own Python writer
// produces for the same message (tensorboard.compat.proto *_pb2 messages'
// SerializeToString, and summary.writer.record_writer.RecordWriter for the
// framing), and the masked CRC of "123456789" is its masked_crc32c's.
#include <doctest/doctest.h>

#include <string>

#include "common/crc32c.h"
#include "common/error.h"
#include "common/tensorboard.h"

namespace tb = dtrain::tb::detail;

namespace {

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) out += {digits[c >> 4], digits[c & 15]};
  return out;
}

}  // namespace

TEST_CASE("tensorboard: masked CRC32C and TFRecord framing equal TensorBoard's own bytes") {
  CHECK(dtrain::crc32c("123456789", 9) == 0xE3069283u);  // the CRC-32C check value
  CHECK(tb::masked_crc32c("123456789") == 0xc78ab0e5u);
  // Event{wall_time 1234.5, file_version "brain.Event:2"} as one record:
  // length 0x18, its masked CRC, the message, the message's masked CRC.
  CHECK(hex(tb::tfrecord(tb::version_event(1234.5))) ==
        "1800000000000000a37f4b22"
        "0900000000004a93401a0d627261696e2e4576656e743a32"
        "65b8d3fb");
}

TEST_CASE("tensorboard: Event messages equal protobuf's serialization of the same Event") {
  CHECK(hex(tb::scalars_event(1.5, 7, {{"loss", 2.5f}, {"comm/dp", 0.0f}})) ==
        "09000000000000f83f10072a1d0a0b0a046c6f737315000020400a0e0a07636f6d6d2f64701500000000");
  CHECK(hex(tb::text_event(2.0, 0, "spec", "a: 1")) ==
        "0900000000000000402a1e0a1c0a0473706563420a080712004204613a20314a080a060a0474657874");
  CHECK(hex(tb::session_start_event(3.0, 5)) == "09000000000000084010053a020801");
}

TEST_CASE("tensorboard: a metrics record's scalars are its numbers, nested keys as key/sub") {
  int64_t step = 0;
  const auto values = tb::record_scalars(
      R"({"step": 12, "loss": 5.5450000000000001, "lr": null, "nonfinite": true, "rss_bytes": 123456789,)"
      R"( "comm_path": {"dp": "shm"}, "moe": {"max_load": 1.25, "deep": {"x": -2}}})",
      &step);
  CHECK(step == 12);
  // nlohmann's object is ordered by key; the step is the event's step, not a scalar.
  const std::vector<std::pair<std::string, float>> want = {
      {"loss", 5.545f}, {"moe/deep/x", -2.0f}, {"moe/max_load", 1.25f}, {"rss_bytes", 123456789.0f}};
  CHECK(values == want);
  CHECK_THROWS_AS(tb::record_scalars("not json", &step), dtrain::Error);
  CHECK_THROWS_AS(tb::record_scalars(R"({"loss": 1})", &step), dtrain::Error);
}
