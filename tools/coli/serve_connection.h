// tools/coli/serve_connection: tells a `coli serve` handler whether its HTTP client is still
// there. cpp-httplib (0.11) gives a handler no way to see its socket, and a non-streaming reply
// writes nothing until the generation ends, so a client that went away was noticed only then —
// after up to a whole context of tokens. ConnectionWatch finds the handler's own TCP socket by its
// two endpoints and peeks at it without reading.
//
//   ConnectionWatch watch(req.local_port, req.remote_addr, req.remote_port);
//   ... per token: if (watch.PeerClosed()) cancel the generation;
//
// The socket is the calling thread's own connection for the duration of the handler (httplib
// closes it only after the handler returns), so the descriptor stays valid while it is used.
#ifndef COLI_TOOLS_COLI_SERVE_CONNECTION_H_
#define COLI_TOOLS_COLI_SERVE_CONNECTION_H_

#include <string>

namespace coli::cli::serve {

class ConnectionWatch {
 public:
  // Finds the connected TCP socket of this process whose local port is `local_port` and whose
  // peer is `remote_addr`:`remote_port` (numeric address as httplib reports it). When none is
  // found (or several match and the address does not single one out) the watch is inert:
  // PeerClosed() is always false.
  ConnectionWatch(int local_port, const std::string& remote_addr, int remote_port);

  // True once the peer has closed its end (an orderly EOF with no request bytes pending, or a
  // reset). Never blocks and never consumes input.
  bool PeerClosed() const;

  // The socket found, or -1.
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

}  // namespace coli::cli::serve

#endif  // COLI_TOOLS_COLI_SERVE_CONNECTION_H_
