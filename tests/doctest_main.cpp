// doctest's main, shared by every test binary, with the skip accounting of
// tests/support/skip.h: a listener tracks the running case and, at the end,
// prints the skipped cases (case, kind, reason) and appends them to
// $DTRAIN_SKIP_LOG; the program exits kSkipExitCode when every case it ran skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "tests/support/skip.h"

namespace {

using dtrain::testing::skip_registry;

std::string program_name;
int cases_run = 0;

// One line, tabs and newlines folded: the log is tab-separated.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\t' || c == '\r') c = ' ';
  return s;
}

struct SkipListener : doctest::IReporter {
  explicit SkipListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    cases_run = int(stats.numTestCasesPassingFilters);
    auto& r = skip_registry();
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.skips.empty()) return;
    std::cout << "\n" << program_name << ": " << r.skipped_cases.size() << " of " << cases_run
              << " cases skipped:\n";
    for (const auto& s : r.skips)
      std::cout << "  SKIPPED " << s.test_case << " (" << s.kind << "): " << one_line(s.reason) << "\n";
    std::cout.flush();
    const char* log = std::getenv("DTRAIN_SKIP_LOG");
    if (!log || !*log) return;
    // Appends (O_APPEND): programs that ctest runs side by side share the file.
    std::ofstream out(log, std::ios::app);
    for (const auto& s : r.skips)
      out << program_name << "\t" << one_line(s.test_case) << "\t" << s.kind << "\t" << one_line(s.reason) << "\n";
  }
  void test_case_start(const doctest::TestCaseData& tc) override {
    auto& r = skip_registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.current_case = tc.m_name;
  }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

REGISTER_LISTENER("dtrain_skips", 1, SkipListener);

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into ctest's pipe: a program killed by a signal keeps
  // what it printed up to the case that died.
  std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);
  program_name = argc > 0 ? argv[0] : "test";
  if (auto slash = program_name.rfind('/'); slash != std::string::npos) program_name.erase(0, slash + 1);
  doctest::Context context(argc, argv);
  const int code = context.run();
  if (context.shouldExit() || code != 0) return code;
  auto& r = skip_registry();
  const bool all_skipped = cases_run > 0 && int(r.skipped_cases.size()) == cases_run;
  return all_skipped ? dtrain::testing::kSkipExitCode : 0;
}
