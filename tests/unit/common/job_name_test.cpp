// job.name's rule (common/spec_job_name.cpp): what is accepted (any valid
// UTF-8 without control characters, up to 128 bytes) and each way a name is
// refused, with the field, an escaped excerpt, the offset and the fix.
#include <doctest/doctest.h>

#include <string>

#include "tests/support/spec_errors.h"

namespace {

std::string name_error(const std::string& name) {
  return dtrain::testing::config_error_of("job: {name: \"" + name + "\"}\n", "t.yaml");
}

}  // namespace

TEST_CASE("job.name: valid UTF-8 up to 128 bytes without control characters is accepted") {
  for (const std::string& ok : {std::string("gpt-3d"), std::string("caf\xc3\xa9 \xe8\xae\xad\xe7\xbb\x83"),
                                std::string("\xf0\x9f\x9a\x80 rocket"), std::string(128, 'n')}) {
    CAPTURE(ok);
    CHECK(name_error(ok) == "");
  }
}

TEST_CASE("job.name: too long, malformed UTF-8 or a control character is refused, naming the offset") {
  struct Case {
    std::string name, expect;
  };
  const Case cases[] = {
      {std::string(129, 'n'), "(129 bytes) is longer than 128 bytes"},
      {"ab\xff", "is not valid UTF-8 (byte 0xff at offset 2)"},
      {"a\xc0\xaf", "is not valid UTF-8 (byte 0xc0 at offset 1)"},       // overlong '/'
      {"a\xed\xa0\x80", "is not valid UTF-8 (byte 0xed at offset 1)"},   // a UTF-16 surrogate
      {"a\xe2\x82", "is not valid UTF-8 (byte 0xe2 at offset 1)"},       // cut short
      {"a\xf4\x90\x80\x80", "is not valid UTF-8 (byte 0xf4 at offset 1)"},  // past U+10FFFF
      {"tab\\there", "holds a control character at offset 3"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.expect);
    const std::string e = name_error(c.name);
    CHECK(dtrain::testing::has(e, "t.yaml:1:"));
    CHECK(dtrain::testing::has(e, "job.name = \""));
    CHECK(dtrain::testing::has(e, c.expect));
    CHECK(dtrain::testing::has(e, "use a short name of letters, digits"));
  }
  CHECK(dtrain::testing::has(name_error("ab\xff"), "job.name = \"ab\\xff\" (3 bytes)"));
}
