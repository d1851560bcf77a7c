// Who listens on a TCP port of this machine, for "port P is in use (by pid
// X)" messages: /proc/net/tcp{,6} gives the listening socket's inode,
// /proc/<pid>/fd the process holding it. Best effort (another user's
// processes are not readable); it opens no socket.
#pragma once

#include <string>

namespace dtrain {

// "pid 1234 (dtrain)" for the process listening on `port`, or "" when unknown.
std::string port_owner(int port);

}  // namespace dtrain
