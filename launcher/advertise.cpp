// advertise_address (see advertise.h): getifaddrs for what is local, a
// connected UDP socket (no packet is sent) for the source address of the
// route to the rendezvous.
#include "launcher/advertise.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace dtrain::launcher {
namespace {

// Numeric text of a socket address, without an IPv6 scope suffix.
std::string numeric(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  else if (sa->sa_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  return buf;
}

// The canonical numeric form of `text` ("" when it is not a numeric address).
std::string canonical(std::string text) {
  if (text.size() > 2 && text.front() == '[' && text.back() == ']') text = text.substr(1, text.size() - 2);
  char buf[INET6_ADDRSTRLEN] = {};
  in6_addr a6{};
  in_addr a4{};
  if (::inet_pton(AF_INET, text.c_str(), &a4) == 1) return ::inet_ntop(AF_INET, &a4, buf, sizeof buf);
  if (::inet_pton(AF_INET6, text.c_str(), &a6) == 1) return ::inet_ntop(AF_INET6, &a6, buf, sizeof buf);
  return "";
}

std::string interface_of(const std::string& addr) {
  for (const auto& [a, ifname] : local_addresses())
    if (a == addr) return ifname;
  return "";
}

std::string address_list() {
  std::string out;
  for (const auto& [a, ifname] : local_addresses())
    if (a.rfind("fe80:", 0) != 0)  // link-local: no use to other nodes
      out += (out.empty() ? "" : ", ") + a + " (" + ifname + ")";
  return out.empty() ? "none found" : out;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> local_addresses() {
  std::vector<std::pair<std::string, std::string>> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
    if (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6) continue;
    out.emplace_back(numeric(i->ifa_addr), i->ifa_name);
  }
  ::freeifaddrs(list);
  return out;
}

Advertised advertise_address(const std::string& requested, const std::string& source,
                             const std::string& rdzv_host, int rdzv_port) {
  if (!requested.empty()) {
    const std::string addr = canonical(requested);
    if (addr.empty())
      throw Error(ErrorCode::config,
                  source + " = '" + requested + "' is not a numeric IP address",
                  "give one of this host's addresses: " + address_list());
    const std::string ifname = interface_of(addr);
    if (ifname.empty())
      throw Error(ErrorCode::config,
                  source + " = " + requested + " is not an address of this host, so no other "
                  "node could reach this one there",
                  "give one of this host's addresses (" + address_list() + ") or leave it out "
                  "(the address of the route to the rendezvous is used)");
    return {addr, ifname};
  }
  std::string host = rdzv_host;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "localhost") host = "127.0.0.1";  // as before: loopback jobs stay on IPv4
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(rdzv_port);
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0 || !res)
    throw Error(ErrorCode::rendezvous,
                "cannot resolve the rendezvous host '" + rdzv_host + "': " + ::gai_strerror(rc),
                "give its address instead: --rdzv 10.0.0.1:" + port + " (or "
                "cluster.rendezvous.endpoint)");
  std::string found, why = "no address";
  for (addrinfo* r = res; r && found.empty(); r = r->ai_next) {
    int fd = ::socket(r->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (::connect(fd, r->ai_addr, r->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0)
      found = numeric(reinterpret_cast<sockaddr*>(&local));
    else
      why = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (found.empty())
    throw Error(ErrorCode::rendezvous,
                "no route from this host to the rendezvous host '" + rdzv_host + "' (" + why + ")",
                "check the network, or give this host's address with --advertise-addr");
  return {found, interface_of(found)};
}

}  // namespace dtrain::launcher
