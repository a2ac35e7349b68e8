// The transport factories behind Client::connect (client.cpp parses the URI and picks one). Internal to
// libkestrel-client.
#pragma once

#include <memory>
#include <string>

#include "client/lib/client.h"

namespace kestrel::client {

// target: a gRPC target string ("unix:///run/kestrel/kestreld.sock" or "ipv4:127.0.0.1:7777" / "host:port").
// transport_name: "grpc-unix" or "grpc-tcp". Waits up to options.connect_timeout for the channel to be ready.
Expected<std::unique_ptr<Client>> make_grpc_client(const std::string& target, const std::string& transport_name,
                                                   const ClientOptions& options);

// control_socket: the daemon's shm control socket path. Maps the segment the daemon hands over.
Expected<std::unique_ptr<Client>> make_shm_client(const std::string& control_socket, const ClientOptions& options);

}  // namespace kestrel::client
