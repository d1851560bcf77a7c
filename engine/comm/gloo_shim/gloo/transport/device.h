// gloo_shim (see ../../README.md): devices and unbound buffers are held by
// pointer only; LibTorch creates and destroys them.
#pragma once

namespace gloo::transport {
class Device;
class UnboundBuffer;
}  // namespace gloo::transport
