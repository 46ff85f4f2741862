// A gRPC message allocator that puts a call's request and response on one
// protobuf arena whose first block comes with it: parsing the request and
// filling the response then cost one allocation per call instead of one per
// string and submessage (a replayed Begin made about 20 of those).
#ifndef IDEM_SERVER_ARENA_MESSAGES_H_
#define IDEM_SERVER_ARENA_MESSAGES_H_

#include <google/protobuf/arena.h>
#include <grpcpp/support/message_allocator.h>

#include <cstddef>

#include "server/proto_arena.h"

namespace idem {

template <typename Request, typename Response>
class ArenaMessages final : public grpc::MessageAllocator<Request, Response> {
 public:
  grpc::MessageHolder<Request, Response>* AllocateMessages() override {
    return new Holder;
  }

 private:
  // Enough for a Begin with a small result; larger ones add heap blocks.
  static constexpr size_t kFirstBlock = 4096;

  class Holder final : public grpc::MessageHolder<Request, Response> {
   public:
    Holder() : arena_(Options(block_)) {
      this->set_request(
          google::protobuf::Arena::CreateMessage<Request>(&arena_));
      this->set_response(
          google::protobuf::Arena::CreateMessage<Response>(&arena_));
    }
    void Release() override { delete this; }

   private:
    static google::protobuf::ArenaOptions Options(char* block) {
      google::protobuf::ArenaOptions options;
      options.initial_block = block;
      options.initial_block_size = kFirstBlock;
      return options;
    }

    // Before arena_, which allocates from it until the arena is gone.
    alignas(alignof(std::max_align_t)) char block_[kFirstBlock];
    google::protobuf::Arena arena_;
  };
};

}  // namespace idem

#endif  // IDEM_SERVER_ARENA_MESSAGES_H_
