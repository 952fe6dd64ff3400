// Whether an HTTP client is still there while the server works on its request. Debian's httplib
// (0.11) tells a streaming response when its client has gone (the sink stops being writable) but
// gives a plain handler nothing: a non-streaming request whose client timed out and left would run
// to its end. The handler finds its connection's socket among the process's descriptors by the
// connection's two ends, and peeks at it while the request waits or runs (as vLLM polls
// is_disconnected for every request).
#pragma once

#include <string>

namespace lragent::server {

// The descriptor of the TCP connection whose peer is remote_addr:remote_port (as httplib writes
// the address: getnameinfo, numeric) and whose own port is local_port; -1 when there is none or
// it cannot be told (no /proc/self/fd). Linux.
int find_client_socket(const std::string& remote_addr, int remote_port, int local_port);

// False once the peer of connected socket `fd` has closed it or reset it (a peek reads EOF or an
// error); bytes it sent ahead (a pipelined next request) keep it there. Never blocks.
bool client_still_there(int fd);

}  // namespace lragent::server
