#include "pagoda/parallel/thread_communicator.h"

#include <barrier>
#include <cstring>

namespace pagoda::parallel {
namespace {

enum class Collective : uint8_t { kAllReduce, kAllGather, kBroadcast };

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "all_reduce_sum";
    case Collective::kAllGather: return "all_gather";
    case Collective::kBroadcast: return "broadcast";
  }
  return "collective";
}

// What one rank posted for the current collective.
struct Post {
  Collective collective = Collective::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DType dtype = DType::kF32;
  int32_t root = 0;
};

struct GroupState {
  explicit GroupState(int32_t n) : size(n), rendezvous(n), posts(static_cast<size_t>(n)) {}
  const int32_t size;
  std::barrier<> rendezvous;
  std::vector<Post> posts;  // posts[r] is written by rank r only, before the first rendezvous
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<GroupState> state, int32_t rank) : state_(std::move(state)), rank_(rank) {}

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return state_->size; }

  Status all_reduce_sum(void* data, size_t count, DType dtype) override {
    return run({Collective::kAllReduce, data, data, count, dtype, 0});
  }
  Status all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    return run({Collective::kAllGather, send, recv, count, dtype, 0});
  }
  Status broadcast(void* data, size_t count, DType dtype, int32_t root) override {
    return run({Collective::kBroadcast, data, data, count, dtype, root});
  }
  Status barrier() override {
    state_->rendezvous.arrive_and_wait();
    return ok_status();
  }

 private:
  // Identical on every rank: it reads only the posts.
  Status check_posts() const {
    const Post& first = state_->posts[0];
    const char* name = collective_name(first.collective);
    for (int32_t r = 1; r < state_->size; ++r) {
      const Post& p = state_->posts[static_cast<size_t>(r)];
      if (p.collective != first.collective)
        return invalid_argument_error("rank 0 called {} but rank {} called {}", name, r,
                                      collective_name(p.collective));
      if (p.count != first.count || p.dtype != first.dtype || p.root != first.root)
        return invalid_argument_error("{}: rank 0 gave {} x {} (root {}) but rank {} gave {} x {} (root {})", name,
                                      first.count, dtype_name(first.dtype), first.root, r, p.count,
                                      dtype_name(p.dtype), p.root);
    }
    if (first.collective == Collective::kAllReduce) return check_reduce_dtype(first.dtype, name);
    PAGODA_RETURN_IF_ERROR(check_copy_dtype(first.dtype, name));
    if (first.collective == Collective::kBroadcast && (first.root < 0 || first.root >= state_->size))
      return invalid_argument_error("broadcast: root {} outside the group of {} ranks", first.root, state_->size);
    return ok_status();
  }

  // Sums elements [begin, end) over the ranks' buffers in rank order, into every buffer.
  void reduce_slice(size_t begin, size_t end, DType dtype) const {
    const std::vector<Post>& posts = state_->posts;
    if (dtype == DType::kF32) {
      for (size_t i = begin; i < end; ++i) {
        float sum = static_cast<const float*>(posts[0].recv)[i];
        for (size_t r = 1; r < posts.size(); ++r) sum += static_cast<const float*>(posts[r].recv)[i];
        for (const Post& p : posts) static_cast<float*>(p.recv)[i] = sum;
      }
      return;
    }
    for (size_t i = begin; i < end; ++i) {
      float sum = bf16_to_f32(static_cast<const uint16_t*>(posts[0].recv)[i]);
      for (size_t r = 1; r < posts.size(); ++r) sum += bf16_to_f32(static_cast<const uint16_t*>(posts[r].recv)[i]);
      const uint16_t bits = f32_to_bf16(sum);
      for (const Post& p : posts) static_cast<uint16_t*>(p.recv)[i] = bits;
    }
  }

  Status run(const Post& post) {
    GroupState& s = *state_;
    s.posts[static_cast<size_t>(rank_)] = post;
    s.rendezvous.arrive_and_wait();
    Status status = check_posts();
    if (status.ok()) {
      const size_t n = static_cast<size_t>(s.size), r = static_cast<size_t>(rank_);
      const size_t bytes = post.count * (post.collective == Collective::kAllReduce ? 0 : element_bytes(post.dtype));
      switch (post.collective) {
        case Collective::kAllReduce:
          reduce_slice(r * post.count / n, (r + 1) * post.count / n, post.dtype);
          break;
        case Collective::kAllGather:
          for (size_t from = 0; from < n; ++from)
            if (bytes > 0) std::memcpy(static_cast<char*>(post.recv) + from * bytes, s.posts[from].send, bytes);
          break;
        case Collective::kBroadcast:
          if (rank_ != post.root && bytes > 0)
            std::memcpy(post.recv, s.posts[static_cast<size_t>(post.root)].send, bytes);
          break;
      }
    }
    s.rendezvous.arrive_and_wait();
    return status;
  }

  std::shared_ptr<GroupState> state_;
  const int32_t rank_;
};

}  // namespace

StatusOr<std::vector<std::unique_ptr<Communicator>>> make_thread_communicators(int32_t size) {
  if (size < 1) return invalid_argument_error("a communicator group needs at least 1 rank, got {}", size);
  auto state = std::make_shared<GroupState>(size);
  std::vector<std::unique_ptr<Communicator>> ranks;
  for (int32_t r = 0; r < size; ++r) ranks.push_back(std::make_unique<ThreadCommunicator>(state, r));
  return ranks;
}

}  // namespace pagoda::parallel
