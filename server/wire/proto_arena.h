// One switch for the code that puts protobuf messages on arenas.
#ifndef IDEM_SERVER_WIRE_PROTO_ARENA_H_
#define IDEM_SERVER_WIRE_PROTO_ARENA_H_

namespace idem {

// Whether to put messages on arenas. Not under GCC's ThreadSanitizer:
// protobuf's headers then give every map field two more members than
// Debian's uninstrumented libprotobuf has, and destroying a map field on an
// arena runs the library's code on the other layout (a crash in
// redis_store_test_tsan). Those builds allocate messages on the heap.
#if defined(__SANITIZE_THREAD__) || defined(THREAD_SANITIZER)
inline constexpr bool kProtoArenas = false;
#else
inline constexpr bool kProtoArenas = true;
#endif

}  // namespace idem

#endif  // IDEM_SERVER_WIRE_PROTO_ARENA_H_
