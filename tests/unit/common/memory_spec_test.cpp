// Spec rules of the memory features: train.recompute, model.attention and
// parallel.reduce_dtype outside their sets, reduce_dtype bf16 with ZeRO, and
// cluster.memory_per_rank that is not a size, all exit 2 naming the field,
// the value and the fix; byte sizes parse as written.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/byte_size.h"
#include "common/error.h"
#include "common/job_spec.h"
#include "tests/support/spec_errors.h"

namespace {

std::string error_of(const std::vector<std::string>& overrides) {
  const auto e = dtrain::testing::parse_error("model: {layers: 2}\n", "m.yaml", overrides);
  if (e.thrown) CHECK(e.exit_code == 2);
  return e.message;
}

using dtrain::testing::has;

}  // namespace

TEST_CASE("memory spec: the valid values load") {
  for (const char* r : {"none", "full", "selective"}) CHECK(error_of({std::string("train.recompute=") + r}) == "");
  for (const char* a : {"naive", "tiled"}) CHECK(error_of({std::string("model.attention=") + a}) == "");
  CHECK(error_of({"parallel.reduce_dtype=bf16", "cluster.memory_per_rank=80GiB"}) == "");
}

TEST_CASE("memory spec: values outside their sets name the field, the value and the choices") {
  const std::string e = error_of({"train.recompute=partial", "model.attention=flash", "parallel.reduce_dtype=fp16"});
  CHECK(has(e, "train.recompute"));
  CHECK(has(e, "partial"));
  CHECK(has(e, "selective"));
  CHECK(has(e, "model.attention"));
  CHECK(has(e, "flash"));
  CHECK(has(e, "tiled"));
  CHECK(has(e, "parallel.reduce_dtype"));
  CHECK(has(e, "fp16"));
}

TEST_CASE("memory spec: reduce_dtype bf16 with ZeRO and a memory_per_rank that is no size") {
  const std::string e = error_of({"parallel.reduce_dtype=bf16", "parallel.zero=1"});
  CHECK(has(e, "parallel.reduce_dtype"));
  CHECK(has(e, "parallel.zero = 1"));
  const std::string m = error_of({"cluster.memory_per_rank=lots"});
  CHECK(has(m, "cluster.memory_per_rank = lots"));
  CHECK(has(m, "80GiB"));
}

TEST_CASE("byte sizes: binary and decimal units") {
  CHECK(dtrain::parse_byte_size("80GiB") == 80LL << 30);
  CHECK(dtrain::parse_byte_size("512 MiB") == 512LL << 20);
  CHECK(dtrain::parse_byte_size("1.5GB") == 1500000000LL);
  CHECK(dtrain::parse_byte_size("4096") == 4096);
  CHECK(dtrain::parse_byte_size("2k") == 2048);
  CHECK(dtrain::parse_byte_size("lots") == -1);
  CHECK(dtrain::parse_byte_size("5 parsecs") == -1);
  CHECK(dtrain::parse_byte_size("-1GiB") == -1);
}
