// The address an agent advertises to the rendezvous: what other nodes dial to
// reach it (MASTER_ADDR when it hosts rank 0). By default the local address
// of its route to the rendezvous, so nodes need no DNS and no unique
// hostname; a user-given address must belong to this host. Also names the
// interface that holds it (for GLOO_SOCKET_IFNAME). Decides nothing else.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dtrain::launcher {

struct Advertised {
  std::string addr;    // numeric IPv4/IPv6 address, e.g. 10.251.77.11
  std::string ifname;  // the interface holding it ("lo" for loopback; "" if none found)
};

// Every address of this host's interfaces, as (address, interface).
std::vector<std::pair<std::string, std::string>> local_addresses();

// `requested` (from --advertise-addr / cluster.rendezvous.advertise_addr;
// "" = pick): checked to be an address of this host (Error(config) naming
// `source` and the host's addresses otherwise). Else the source address the
// kernel uses to reach rdzv_host:rdzv_port (127.0.0.1 for a loopback
// rendezvous). Throws Error(rendezvous) when rdzv_host does not resolve.
Advertised advertise_address(const std::string& requested, const std::string& source,
                             const std::string& rdzv_host, int rdzv_port);

}  // namespace dtrain::launcher
