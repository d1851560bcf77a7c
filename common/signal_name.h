// Names of signals for messages ("SIGKILL" for 9), shared by the launcher's
// root-cause block and the rendezvous' failure report. Formatting only.
#pragma once

#include <string>

namespace dtrain {

// "SIGKILL" for 9; "SIGRTMIN+2" for real-time signals; "SIG<n>" otherwise.
std::string signal_name(int sig);

}  // namespace dtrain
