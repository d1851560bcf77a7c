// doctest for test files that include LibTorch: glog (pulled in by c10)
// defines CHECK*, so include this after the torch/c10 headers and doctest's
// macros win.
#pragma once

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE
#include <doctest/doctest.h>
