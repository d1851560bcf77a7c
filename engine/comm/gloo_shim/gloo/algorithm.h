// gloo_shim (see ../README.md): ProcessGroupGloo.hpp includes this; it needs nothing from it.
#pragma once
