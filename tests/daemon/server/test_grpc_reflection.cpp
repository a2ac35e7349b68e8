// gRPC server reflection on GrpcServer (grpc.reflection.v1alpha, what grpcurl uses): the service list names
// kestrel.v1.Kestrel and grpc.health.v1.Health, and the file that defines kestrel.v1.Kestrel comes back as a
// FileDescriptorProto with the Generate method. Debian installs no reflection stubs, so the test speaks the protocol
// through grpc::GenericStub with the few fields it needs encoded by hand (field numbers from reflection.proto).
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "daemon/server/grpc_server.h"
#include "tests/daemon/scratch_dir.h"
#include "tests/daemon/server/fake_service.h"

// ThreadSanitizer cannot judge gRPC calls (the system's gRPC is not built with it; see test_grpc_server.cpp).
#if defined(__SANITIZE_THREAD__)
#define KESTREL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KESTREL_TSAN 1
#endif
#endif

namespace kestrel::daemon {
namespace {

using google::protobuf::UnknownFieldSet;

#ifdef KESTREL_TSAN
class SkipUnderTsan : public ::testing::Environment {
 public:
  void SetUp() override { GTEST_SKIP() << "gRPC is not built with ThreadSanitizer; its synchronization is invisible"; }
};
[[maybe_unused]] ::testing::Environment* const kSkipUnderTsan = ::testing::AddGlobalTestEnvironment(new SkipUnderTsan);
#endif

// A length-delimited protobuf field: tag, varint length, bytes.
std::string length_delimited(int field, const std::string& value) {
  std::string out;
  auto varint = [&](uint64_t v) {
    while (v >= 0x80) {
      out += static_cast<char>((v & 0x7f) | 0x80);
      v >>= 7;
    }
    out += static_cast<char>(v);
  };
  varint(static_cast<uint64_t>(field) << 3 | 2);
  varint(value.size());
  return out + value;
}

// The length-delimited values of `field` in a message.
std::vector<std::string> fields(const std::string& message, int field) {
  UnknownFieldSet set;
  EXPECT_TRUE(set.ParseFromString(message));
  std::vector<std::string> out;
  for (int i = 0; i < set.field_count(); ++i) {
    if (set.field(i).number() == field &&
        set.field(i).type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
      out.push_back(set.field(i).length_delimited());
    }
  }
  return out;
}

// One request on the ServerReflectionInfo stream; returns the response's bytes.
std::string reflect(const std::shared_ptr<grpc::Channel>& channel, const std::string& request) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  auto call = stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  auto step = [&](int tag) {
    void* got = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&got, &ok));
    EXPECT_EQ(got, reinterpret_cast<void*>(static_cast<intptr_t>(tag)));
    return ok;
  };
  auto tag = [](int t) { return reinterpret_cast<void*>(static_cast<intptr_t>(t)); };
  call->StartCall(tag(1));
  EXPECT_TRUE(step(1));
  grpc::Slice slice(request);
  grpc::ByteBuffer out(&slice, 1);
  call->Write(out, tag(2));
  EXPECT_TRUE(step(2));
  grpc::ByteBuffer in;
  call->Read(&in, tag(3));
  EXPECT_TRUE(step(3));
  call->WritesDone(tag(4));
  EXPECT_TRUE(step(4));
  grpc::Status status;
  call->Finish(&status, tag(5));
  EXPECT_TRUE(step(5));
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(in.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes;
}

TEST(GrpcReflection, ListsServicesAndDescribesKestrel) {
  testing::FakeService service;
  RpcHandlers handlers(service);
  ::kestrel::test::ScratchDir dir("kestrel-refl");
  GrpcServerOptions options;
  options.unix_socket_path = (dir / "k.sock").string();
  auto server = GrpcServer::create(handlers, options);
  ASSERT_TRUE(server) << server.error().to_string();
  auto channel = grpc::CreateChannel("unix:" + options.unix_socket_path, grpc::InsecureChannelCredentials());

  // list_services = 7 → list_services_response = 6 { service = 1 { name = 1 } }
  const std::string listed = reflect(channel, length_delimited(7, ""));
  const std::vector<std::string> list = fields(listed, 6);
  ASSERT_EQ(list.size(), 1u) << "no list_services_response";
  std::vector<std::string> names;
  for (const std::string& s : fields(list[0], 1)) {
    for (const std::string& n : fields(s, 1)) names.push_back(n);
  }
  EXPECT_NE(std::find(names.begin(), names.end(), "kestrel.v1.Kestrel"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "grpc.health.v1.Health"), names.end());

  // file_containing_symbol = 4 → file_descriptor_response = 4 { file_descriptor_proto = 1 (bytes) }
  const std::string described = reflect(channel, length_delimited(4, "kestrel.v1.Kestrel"));
  const std::vector<std::string> files = fields(described, 4);
  ASSERT_EQ(files.size(), 1u) << "no file_descriptor_response";
  bool found = false;
  for (const std::string& bytes : fields(files[0], 1)) {
    google::protobuf::FileDescriptorProto file;
    ASSERT_TRUE(file.ParseFromString(bytes));
    for (const auto& svc : file.service()) {
      if (svc.name() != "Kestrel") continue;
      for (const auto& m : svc.method()) found = found || (m.name() == "Generate" && m.server_streaming());
    }
  }
  EXPECT_TRUE(found) << "kestrel.v1.Kestrel/Generate (server streaming) is described";
  (*server)->shutdown(Clock::now() + std::chrono::seconds(1));
}

}  // namespace
}  // namespace kestrel::daemon
