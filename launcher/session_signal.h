// Signalling whole sessions: every process whose session id is one of a
// worker's (workers are session leaders, sid = their pid), found in /proc.
// Reaches what a worker spawned even in other process groups (a shell with
// job control puts each background job in its own group). A process that
// starts a session of its own has left the worker's; only a cgroup holds it.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace dtrain::launcher {

// Sends `sig` to every live (not zombie) process in the sessions `sids`, and
// to each process group `sid` (its leader's). Returns how many processes of
// the sessions were signalled.
int signal_sessions(const std::vector<pid_t>& sids, int sig);

// The live (not zombie) processes of the sessions `sids`.
std::vector<pid_t> session_members(const std::vector<pid_t>& sids);

// The sessions of the live processes whose environment holds `entry`
// ("K=V", e.g. "DTRAIN_AGENT_PID=123"), this process's excepted.
std::vector<pid_t> sessions_with_env(const std::string& entry);

// Unlinks the shared-memory segments a dead worker created and could not
// remove (/dev/shm/dtrain-<pid>-<nonce>, engine/comm/shm_segment.cpp: rank 0
// of a node's group unlinks it once every member has mapped it, so a worker
// killed during that set-up leaves it). Returns how many were removed.
int remove_shm_segments_of(pid_t pid);

}  // namespace dtrain::launcher
