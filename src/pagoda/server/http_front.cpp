#include "pagoda/server/http_front.h"

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <fmt/format.h>

#include "pagoda/server/api_error.h"

namespace pagoda::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// Bytes of a pipelined next request kept while a reply is in progress; past
// it the front stops reading that connection until the reply is done.
constexpr size_t kMaxPipelinedBytes = 64u << 10;
constexpr size_t kReadChunk = 16u << 10;
// What a closing connection reads and drops before it closes anyway.
constexpr size_t kMaxLingerBytes = 256u << 10;

int kernel_somaxconn() {
  std::ifstream in("/proc/sys/net/core/somaxconn");
  int value = 0;
  if (in >> value && value > 0) return value;
  return 4096;
}

int connection_cap_from_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 10'000;
  // Leave room for the model files, logs, the engine and the listening socket.
  return static_cast<int>(std::max<rlim_t>(16, std::min<rlim_t>(limit.rlim_cur, 1'000'000) * 9 / 10 - 32));
}

std::string sanitize_header_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v)
    if (c != '\r' && c != '\n') out += c;
  return out;
}

std::string error_body(int status, std::string_view code, std::string message) {
  ApiError e;
  e.http_status = status;
  e.code = std::string(code);
  e.type = status >= 500 ? "server_error" : "invalid_request_error";
  e.message = std::move(message);
  return e.body();
}

HttpResponse error_response(int status, std::string_view code, std::string message) {
  HttpResponse r;
  r.status = status;
  r.body = error_body(status, code, std::move(message));
  return r;
}

// Status line and headers. content_length nullopt: chunked (HTTP/1.1) or
// until close (HTTP/1.0).
std::string format_head(const HttpResponse& r, std::optional<size_t> content_length, bool chunked, bool keep_alive) {
  std::string head = fmt::format("HTTP/1.1 {} {}\r\n", r.status, http_reason_phrase(r.status));
  if (!r.content_type.empty()) head += "Content-Type: " + sanitize_header_value(r.content_type) + "\r\n";
  for (const auto& [name, value] : r.headers)
    head += sanitize_header_value(name) + ": " + sanitize_header_value(value) + "\r\n";
  if (content_length) head += fmt::format("Content-Length: {}\r\n", *content_length);
  if (chunked) head += "Transfer-Encoding: chunked\r\n";
  head += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return head;
}

void append_chunk(std::string& out, std::string_view data) {
  if (data.empty()) return;
  out += fmt::format("{:x}\r\n", data.size());
  out += data;
  out += "\r\n";
}

}  // namespace

// ---- handler workers ------------------------------------------------------------

// A fixed set of threads over a bounded queue: try_submit refuses instead of
// queueing without limit.
class BoundedWorkQueue {
 public:
  BoundedWorkQueue(int threads, int capacity) : capacity_(static_cast<size_t>(std::max(1, capacity))) {
    for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { run(); });
  }
  ~BoundedWorkQueue() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      jobs_.clear();
    }
    ready_.notify_all();
    for (auto& t : threads_) t.join();
  }
  bool try_submit(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_ || jobs_.size() >= capacity_) return false;
      jobs_.push_back(std::move(job));
    }
    ready_.notify_one();
    return true;
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (stopping_) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  const size_t capacity_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// ---- the server -------------------------------------------------------------------

class Session;

// Whether other threads may still post to the event loop: closed (under its
// mutex) before the loop is torn down, so a late wake from the engine thread
// never touches a loop that is gone.
struct LoopGate {
  std::mutex mutex;
  bool open = true;
  asio::io_context* io = nullptr;
};

class HttpFront::Impl : public std::enable_shared_from_this<HttpFront::Impl> {
 public:
  explicit Impl(HttpFrontConfig config)
      : config_(std::move(config)), acceptor_(io_), force_close_timer_(io_), accept_retry_timer_(io_) {
    gate_->io = &io_;
    if (config_.max_connections <= 0) config_.max_connections = connection_cap_from_file_limit();
    if (config_.listen_backlog <= 0) config_.listen_backlog = kernel_somaxconn();
  }

  struct Route {
    std::string method;
    RouteRuns where;
    RouteHandler handler;
  };

  StatusOr<int> bind();
  Status serve();
  void stop(std::chrono::milliseconds grace);
  void accept_next();
  void on_accept(const boost::system::error_code& ec, tcp::socket socket);
  void refuse_connection(tcp::socket& socket);

  void add_session(Session* s);
  void remove_session(Session* s);

  void count(int64_t HttpFrontCounters::*field, int64_t delta = 1) {
    std::lock_guard lock(counters_mutex_);
    counters_.*field += delta;
  }
  void count_response(int status) {
    std::lock_guard lock(counters_mutex_);
    ++counters_.responses_by_status[status];
  }

  HttpFrontConfig config_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer force_close_timer_;
  asio::steady_timer accept_retry_timer_;
  std::unique_ptr<BoundedWorkQueue> workers_;
  std::unordered_map<std::string, std::vector<Route>> routes_;  // path -> methods
  std::map<std::string, std::vector<Route>> prefix_routes_;     // prefix -> methods

  // The routes of `path`: its exact ones, else those of its longest prefix; null if none.
  const std::vector<Route>* find_routes(const std::string& path) const {
    if (const auto exact = routes_.find(path); exact != routes_.end()) return &exact->second;
    const std::vector<Route>* best = nullptr;
    size_t best_length = 0;
    for (const auto& [prefix, routes] : prefix_routes_)
      if (path.starts_with(prefix) && (best == nullptr || prefix.size() > best_length)) {
        best = &routes;
        best_length = prefix.size();
      }
    return best;
  }
  std::atomic<bool> stopping_{false};
  std::atomic<bool> bound_{false};

  std::mutex sessions_mutex_;
  std::unordered_set<Session*> sessions_;
  std::shared_ptr<LoopGate> gate_ = std::make_shared<LoopGate>();

  mutable std::mutex counters_mutex_;
  HttpFrontCounters counters_;
};

// Lets other threads (the engine's, via ReplySource::start's wake) ask a
// session to pull from its reply source. Coalesces wakes: one pump at a time
// is queued.
class Waker {
 public:
  Waker(std::weak_ptr<Session> session, std::shared_ptr<LoopGate> gate)
      : session_(std::move(session)), gate_(std::move(gate)) {}
  void wake();
  void disarm() { armed_ = false; }
  void pumped() { pending_ = false; }

 private:
  std::atomic<bool> armed_{true};
  std::atomic<bool> pending_{false};
  std::weak_ptr<Session> session_;
  std::shared_ptr<LoopGate> gate_;
};

// One connection. Every method runs on the session's strand.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(std::shared_ptr<HttpFront::Impl> front, tcp::socket socket)
      : front_(std::move(front)),
        socket_(std::move(socket)),
        strand_(asio::make_strand(front_->io_)),
        deadline_(strand_) {}
  ~Session() {
    if (waker_) waker_->disarm();
    if (source_) source_->cancel();
    front_->remove_session(this);
  }

  void start() {
    front_->add_session(this);
    boost::system::error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);
    socket_.non_blocking(true, ec);
    const auto remote = socket_.remote_endpoint(ec);
    if (!ec) {
      remote_address_ = remote.address().to_string();
      remote_port_ = remote.port();
    }
    asio::dispatch(strand_, [self = shared_from_this()] {
      self->phase_ = Phase::kReadingHead;  // the first request's head is due from the connection's start
      self->arm_deadline(self->front_->config_.header_timeout);
      self->read_more();
    });
  }

  // stop(): close unless a reply is in progress; that one closes when done.
  void begin_shutdown() {
    asio::dispatch(strand_, [self = shared_from_this()] {
      self->keep_alive_ = false;
      if (self->phase_ == Phase::kIdle || self->phase_ == Phase::kReadingHead || self->phase_ == Phase::kReadingBody ||
          self->phase_ == Phase::kLingering)
        self->close();
    });
  }
  void force_close() {
    asio::dispatch(strand_, [self = shared_from_this()] { self->close(); });
  }

  // Waker entry (on the loop, any strand): pump() on this session's strand.
  void post_pump() {
    asio::dispatch(strand_, [self = shared_from_this()] { self->pump(); });
  }

 private:
  // kLingering: the answer is out and our side shut down; the rest of what the
  // client sends is read and dropped for a moment, so closing does not reset
  // the connection before the client has read the answer.
  enum class Phase { kIdle, kReadingHead, kReadingBody, kHandling, kReplying, kLingering, kClosed };

  void pump();
  void read_more();
  void on_readable(const boost::system::error_code& ec);
  void process_input();
  void dispatch_request();
  void on_reply(HttpReply reply);
  void write_response(const HttpResponse& response);
  void queue_output(std::string bytes);
  void start_write();
  void on_write(const boost::system::error_code& ec);
  void finish_exchange();
  void answer_error_and_close(int status, std::string_view code, std::string message);
  void arm_deadline(std::chrono::milliseconds after);
  void cancel_deadline();
  void on_deadline(uint64_t generation);
  void peer_left();
  void close();

  std::shared_ptr<HttpFront::Impl> front_;
  tcp::socket socket_;
  asio::strand<asio::io_context::executor_type> strand_;
  asio::steady_timer deadline_;
  uint64_t deadline_generation_ = 0;
  std::string remote_address_;
  int remote_port_ = 0;

  Phase phase_ = Phase::kIdle;
  bool keep_alive_ = true;
  bool reading_ = false;
  std::string input_;  // received, not yet parsed
  std::unique_ptr<HttpRequestReader> reader_;
  bool continue_sent_ = false;
  size_t lingered_bytes_ = 0;
  unsigned request_version_ = 11;

  std::shared_ptr<ReplySource> source_;
  std::shared_ptr<Waker> waker_;
  bool head_sent_ = false;
  bool streamed_ = false;
  bool reply_done_ = false;
  std::string out_pending_;
  std::string out_inflight_;
  bool writing_ = false;
};

void Waker::wake() {
  if (!armed_ || pending_.exchange(true)) return;  // disarmed, or a pump is already on its way
  std::lock_guard lock(gate_->mutex);
  if (!gate_->open) return;
  asio::post(*gate_->io, [weak = session_] {
    if (auto s = weak.lock()) s->post_pump();
  });
}

// ---- reading ------------------------------------------------------------------------

void Session::read_more() {
  if (reading_ || phase_ == Phase::kClosed) return;
  // While a reply is in progress the connection is read only to notice the
  // client leaving; a pipelined next request is kept, up to a bound.
  if ((phase_ == Phase::kHandling || phase_ == Phase::kReplying) && input_.size() >= kMaxPipelinedBytes) return;
  reading_ = true;
  socket_.async_wait(tcp::socket::wait_read,
                     asio::bind_executor(strand_, [self = shared_from_this()](const boost::system::error_code& ec) {
                       self->on_readable(ec);
                     }));
}

void Session::on_readable(const boost::system::error_code& ec) {
  reading_ = false;
  if (phase_ == Phase::kClosed) return;
  if (ec) return peer_left();
  std::array<char, kReadChunk> buffer;
  for (;;) {
    boost::system::error_code read_ec;
    const size_t n = socket_.read_some(asio::buffer(buffer), read_ec);
    if (read_ec == asio::error::would_block || read_ec == asio::error::try_again) break;
    if (read_ec) return phase_ == Phase::kLingering ? close() : peer_left();  // end of stream, reset
    if (phase_ == Phase::kLingering) {  // dropped, up to a bound
      lingered_bytes_ += n;
      if (lingered_bytes_ > kMaxLingerBytes) return close();
      continue;
    }
    input_.append(buffer.data(), n);
    if (n < buffer.size() || input_.size() >= kMaxPipelinedBytes) break;
  }
  if (phase_ == Phase::kLingering) return read_more();
  process_input();
}

void Session::process_input() {
  if (phase_ == Phase::kHandling || phase_ == Phase::kReplying) return read_more();
  if (phase_ == Phase::kIdle) {
    if (input_.empty()) return read_more();
    phase_ = Phase::kReadingHead;  // its first byte: the head is due within header_timeout
    arm_deadline(front_->config_.header_timeout);
  }
  if (!reader_) {
    reader_ = std::make_unique<HttpRequestReader>(front_->config_.limits);
    continue_sent_ = false;
  }
  const size_t used = reader_->feed(input_);
  input_.erase(0, used);
  if (reader_->failed()) {
    front_->count(&HttpFrontCounters::malformed_requests);
    const HttpReadError error = *reader_->error();
    return answer_error_and_close(error.http_status, error.http_status == 413 ? "request_too_large" : "bad_request",
                                  error.message);
  }
  if (reader_->header_done() && phase_ == Phase::kReadingHead) {
    phase_ = Phase::kReadingBody;
    if (!reader_->complete()) arm_deadline(front_->config_.body_timeout);  // the whole body from here
    if (!reader_->complete() && reader_->expects_continue() && !continue_sent_) {
      continue_sent_ = true;
      queue_output("HTTP/1.1 100 Continue\r\n\r\n");
    }
  }
  if (reader_->complete()) return dispatch_request();
  read_more();
}

void Session::dispatch_request() {
  cancel_deadline();
  keep_alive_ = reader_->keep_alive() && !front_->stopping_.load();
  HttpRequest request = reader_->take_request();
  reader_.reset();
  request.remote_address = remote_address_;
  request.remote_port = remote_port_;
  request_version_ = request.version;
  phase_ = Phase::kHandling;

  const std::vector<HttpFront::Impl::Route>* found = front_->find_routes(request.path);
  if (found == nullptr)
    return on_reply(HttpReply{error_response(404, "not_found", fmt::format("no route for {} {}", request.method,
                                                                             request.path.substr(0, 256))),
                              nullptr});
  const HttpFront::Impl::Route* route = nullptr;
  std::string allowed;
  for (const auto& r : *found) {
    if (r.method == request.method) route = &r;
    allowed += (allowed.empty() ? "" : ", ") + r.method;
  }
  if (route == nullptr) {
    HttpResponse r = error_response(405, "method_not_allowed",
                                    fmt::format("{} takes {}", request.path, allowed));
    r.headers.emplace_back("Allow", allowed);
    return on_reply(HttpReply{std::move(r), nullptr});
  }
  if (route->where == RouteRuns::kOnLoop) {
    HttpReply reply;
    try {
      reply = route->handler(request);
    } catch (...) {
      reply = HttpReply{error_response(500, "internal_error", "internal error"), nullptr};
    }
    return on_reply(std::move(reply));
  }
  // On a worker; meanwhile keep reading, to notice the client leaving.
  auto job = [self = shared_from_this(), handler = route->handler, request = std::move(request)]() mutable {
    HttpReply reply;
    try {
      reply = handler(request);
    } catch (...) {
      reply = HttpReply{error_response(500, "internal_error", "internal error"), nullptr};
    }
    asio::post(self->strand_, [self, reply = std::move(reply)]() mutable { self->on_reply(std::move(reply)); });
  };
  if (!front_->workers_->try_submit(std::move(job))) {
    front_->count(&HttpFrontCounters::busy_refusals);
    HttpResponse r = error_response(429, "server_busy", "the server is busy; retry shortly");
    r.headers.emplace_back("Retry-After", std::to_string(front_->config_.retry_after_seconds));
    return on_reply(HttpReply{std::move(r), nullptr});
  }
  read_more();
}

// ---- replying -------------------------------------------------------------------------

void Session::on_reply(HttpReply reply) {
  if (phase_ == Phase::kClosed) {
    if (reply.source) reply.source->cancel();  // the client left while the handler ran
    return;
  }
  phase_ = Phase::kReplying;
  head_sent_ = false;
  streamed_ = false;
  reply_done_ = false;
  if (!reply.source) {
    write_response(reply.response);
    reply_done_ = true;
    if (!writing_ && out_pending_.empty()) finish_exchange();
    return;
  }
  source_ = std::move(reply.source);
  waker_ = std::make_shared<Waker>(weak_from_this(), front_->gate_);
  source_->start([waker = waker_] { waker->wake(); });
  pump();
  read_more();
}

void Session::write_response(const HttpResponse& response) {
  front_->count_response(response.status);
  queue_output(format_head(response, response.body.size(), false, keep_alive_) + response.body);
}

void Session::pump() {
  if (waker_) waker_->pumped();
  while (source_ && phase_ == Phase::kReplying) {
    ReplyPiece piece;
    try {
      piece = source_->pull();
    } catch (...) {
      // A reply that cannot go on: nothing sensible can follow a started answer.
      return close();
    }
    if (!piece.has_head && piece.data.empty() && !piece.done) break;
    if (piece.has_head && !head_sent_) {
      head_sent_ = true;
      streamed_ = piece.streamed;
      if (!streamed_) {
        write_response(piece.head);
        piece.done = true;
      } else {
        // HTTP/1.0 has no chunked coding: the stream ends with the connection.
        const bool chunked = request_version_ >= 11;
        if (!chunked) keep_alive_ = false;
        front_->count_response(piece.head.status);
        queue_output(format_head(piece.head, std::nullopt, chunked, keep_alive_));
      }
    }
    if (streamed_ && !piece.data.empty()) {
      std::string framed;
      if (request_version_ >= 11)
        append_chunk(framed, piece.data);
      else
        framed = std::move(piece.data);
      queue_output(std::move(framed));
    }
    if (piece.done) {
      if (streamed_ && request_version_ >= 11) queue_output("0\r\n\r\n");
      source_.reset();
      if (waker_) waker_->disarm();
      waker_.reset();
      reply_done_ = true;
    }
    if (out_pending_.size() > front_->config_.max_unsent_bytes) {
      // The client does not read what it asked for: stop the work behind it.
      front_->count(&HttpFrontCounters::slow_readers_dropped);
      return close();
    }
  }
  if (reply_done_ && !writing_ && out_pending_.empty()) finish_exchange();
}

void Session::queue_output(std::string bytes) {
  if (phase_ == Phase::kClosed) return;
  out_pending_ += bytes;
  start_write();
}

void Session::start_write() {
  if (writing_ || out_pending_.empty() || phase_ == Phase::kClosed) return;
  writing_ = true;
  out_inflight_.swap(out_pending_);
  out_pending_.clear();
  // A reply's writes are bounded in time; request reading keeps its own deadline.
  if (phase_ == Phase::kReplying || phase_ == Phase::kHandling) arm_deadline(front_->config_.write_timeout);
  asio::async_write(socket_, asio::buffer(out_inflight_),
                    asio::bind_executor(strand_, [self = shared_from_this()](const boost::system::error_code& ec,
                                                                           size_t) { self->on_write(ec); }));
}

void Session::on_write(const boost::system::error_code& ec) {
  writing_ = false;
  out_inflight_.clear();
  if (phase_ == Phase::kClosed || phase_ == Phase::kLingering) return;
  if (ec) return peer_left();
  if (phase_ == Phase::kReplying || phase_ == Phase::kHandling) cancel_deadline();
  if (!out_pending_.empty()) return start_write();
  if (phase_ == Phase::kReplying && reply_done_) finish_exchange();
}

void Session::finish_exchange() {
  if (phase_ != Phase::kReplying) return;
  reply_done_ = false;
  if (!keep_alive_ || front_->stopping_.load()) {
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    phase_ = Phase::kLingering;
    input_.clear();
    arm_deadline(std::chrono::milliseconds(1000));
    return read_more();
  }
  phase_ = Phase::kIdle;
  arm_deadline(front_->config_.keep_alive_timeout);
  process_input();  // a pipelined request may be waiting already
}

void Session::answer_error_and_close(int status, std::string_view code, std::string message) {
  keep_alive_ = false;
  phase_ = Phase::kReplying;
  reader_.reset();
  input_.clear();
  write_response(error_response(status, code, std::move(message)));
  reply_done_ = true;
}

// ---- deadlines and closing -----------------------------------------------------------

void Session::arm_deadline(std::chrono::milliseconds after) {
  const uint64_t generation = ++deadline_generation_;
  deadline_.expires_after(after);
  deadline_.async_wait([self = shared_from_this(), generation](const boost::system::error_code& ec) {
    if (!ec) self->on_deadline(generation);
  });
}

void Session::cancel_deadline() {
  ++deadline_generation_;
  deadline_.cancel();
}

void Session::on_deadline(uint64_t generation) {
  if (generation != deadline_generation_ || phase_ == Phase::kClosed) return;
  switch (phase_) {
    case Phase::kIdle: front_->count(&HttpFrontCounters::idle_closes); break;
    case Phase::kReadingHead: front_->count(&HttpFrontCounters::header_timeouts); break;
    case Phase::kReadingBody: front_->count(&HttpFrontCounters::body_timeouts); break;
    case Phase::kLingering: break;
    default: front_->count(&HttpFrontCounters::slow_readers_dropped); break;  // a write did not finish in time
  }
  close();
}

void Session::peer_left() {
  if (phase_ == Phase::kClosed) return;
  if (source_ || phase_ == Phase::kHandling) front_->count(&HttpFrontCounters::client_disconnects);
  close();
}

void Session::close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  if (source_) {
    source_->cancel();
    source_.reset();
  }
  if (waker_) waker_->disarm();
  waker_.reset();
  cancel_deadline();
  boost::system::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
}

// ---- accepting ------------------------------------------------------------------------

StatusOr<int> HttpFront::Impl::bind() {
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(config_.host, ec);
  if (ec) return invalid_argument_error("cannot listen on '{}': not an IP address", config_.host);
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(config_.port));
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (ec) return io_error("cannot bind {}:{} ({})", config_.host, config_.port, ec.message());
  acceptor_.listen(config_.listen_backlog, ec);
  if (ec) return io_error("cannot listen on {}:{} ({})", config_.host, config_.port, ec.message());
  bound_ = true;
  return static_cast<int>(acceptor_.local_endpoint().port());
}

void HttpFront::Impl::accept_next() {
  if (stopping_) return;
  acceptor_.async_accept(io_,
                         [self = shared_from_this()](const boost::system::error_code& ec, tcp::socket socket) {
                           self->on_accept(ec, std::move(socket));
                         });
}

void HttpFront::Impl::on_accept(const boost::system::error_code& ec, tcp::socket socket) {
  if (stopping_ || ec == asio::error::operation_aborted) return;
  if (ec) {
    // Out of descriptors or memory: the kernel keeps the backlog; try again shortly.
    accept_retry_timer_.expires_after(std::chrono::milliseconds(50));
    accept_retry_timer_.async_wait([self = shared_from_this()](const boost::system::error_code& e) {
      if (!e) self->accept_next();
    });
    return;
  }
  count(&HttpFrontCounters::connections_accepted);
  size_t open;
  {
    std::lock_guard lock(sessions_mutex_);
    open = sessions_.size();
  }
  if (static_cast<int64_t>(open) >= config_.max_connections) {
    refuse_connection(socket);
  } else {
    std::make_shared<Session>(shared_from_this(), std::move(socket))->start();
  }
  accept_next();
}

void HttpFront::Impl::refuse_connection(tcp::socket& socket) {
  // Best effort, without waiting: the answer fits the socket's send buffer.
  count(&HttpFrontCounters::connections_refused);
  count_response(503);
  HttpResponse r = error_response(503, "too_many_connections", "the server holds as many connections as it can");
  r.headers.emplace_back("Retry-After", std::to_string(config_.retry_after_seconds));
  const std::string bytes = format_head(r, r.body.size(), false, false) + r.body;
  boost::system::error_code ignored;
  socket.non_blocking(true, ignored);
  socket.write_some(asio::buffer(bytes), ignored);
  socket.shutdown(tcp::socket::shutdown_both, ignored);
  socket.close(ignored);
}

void HttpFront::Impl::add_session(Session* s) {
  std::lock_guard lock(sessions_mutex_);
  sessions_.insert(s);
  std::lock_guard counters_lock(counters_mutex_);
  counters_.connections_open = static_cast<int64_t>(sessions_.size());
}

void HttpFront::Impl::remove_session(Session* s) {
  bool last;
  {
    std::lock_guard lock(sessions_mutex_);
    sessions_.erase(s);
    last = sessions_.empty();
    std::lock_guard counters_lock(counters_mutex_);
    counters_.connections_open = static_cast<int64_t>(sessions_.size());
  }
  // Draining and nothing left: end serve() without waiting for the grace deadline.
  if (last && stopping_) asio::post(io_, [self = shared_from_this()] { self->force_close_timer_.cancel(); });
}

Status HttpFront::Impl::serve() {
  if (!bound_) return failed_precondition_error("serve() before bind()");
  workers_ = std::make_unique<BoundedWorkQueue>(config_.worker_threads, config_.max_queued_handlers);
  if (!stopping_) accept_next();
  std::vector<std::thread> extra;
  for (int i = 1; i < config_.io_threads; ++i) extra.emplace_back([this] { io_.run(); });
  io_.run();
  for (auto& t : extra) t.join();
  return ok_status();
}

void HttpFront::Impl::stop(std::chrono::milliseconds grace) {
  if (stopping_.exchange(true)) return;
  asio::post(io_, [self = shared_from_this(), grace] {
    boost::system::error_code ignored;
    self->acceptor_.close(ignored);
    self->accept_retry_timer_.cancel();
    std::vector<std::shared_ptr<Session>> open;
    {
      std::lock_guard lock(self->sessions_mutex_);
      for (Session* s : self->sessions_)
        if (auto p = s->weak_from_this().lock()) open.push_back(std::move(p));
    }
    for (auto& s : open) s->begin_shutdown();
    if (open.empty()) return;
    // Replies in progress get `grace`; then every connection closes.
    self->force_close_timer_.expires_after(grace);
    self->force_close_timer_.async_wait([self](const boost::system::error_code& ec) {
      if (ec) return;
      std::vector<std::shared_ptr<Session>> left;
      {
        std::lock_guard lock(self->sessions_mutex_);
        for (Session* s : self->sessions_)
          if (auto p = s->weak_from_this().lock()) left.push_back(std::move(p));
      }
      for (auto& s : left) s->force_close();
    });
  });
}

// ---- facade ---------------------------------------------------------------------------

HttpFront::HttpFront(HttpFrontConfig config) : impl_(std::make_shared<Impl>(std::move(config))) {}

HttpFront::~HttpFront() {
  stop(std::chrono::milliseconds(0));
  {
    // From here no other thread posts to the loop.
    std::lock_guard lock(impl_->gate_->mutex);
    impl_->gate_->open = false;
  }
  impl_->workers_.reset();  // joins; queued jobs are dropped with their sessions
  // Run the loop down: every session closes, its pending operations complete,
  // and the sessions (which hold the Impl) are released.
  impl_->io_.restart();
  asio::post(impl_->io_, [impl = impl_] {
    std::vector<std::shared_ptr<Session>> open;
    {
      std::lock_guard lock(impl->sessions_mutex_);
      for (Session* s : impl->sessions_)
        if (auto p = s->weak_from_this().lock()) open.push_back(std::move(p));
    }
    for (auto& s : open) s->force_close();
    impl->force_close_timer_.cancel();
  });
  impl_->io_.run();
}

void HttpFront::route(std::string method, std::string path, RouteRuns where, RouteHandler handler) {
  impl_->routes_[std::move(path)].push_back(Impl::Route{std::move(method), where, std::move(handler)});
}

void HttpFront::route_prefix(std::string method, std::string prefix, RouteRuns where, RouteHandler handler) {
  impl_->prefix_routes_[std::move(prefix)].push_back(Impl::Route{std::move(method), where, std::move(handler)});
}

StatusOr<int> HttpFront::bind() { return impl_->bind(); }
Status HttpFront::serve() { return impl_->serve(); }
void HttpFront::stop(std::chrono::milliseconds grace) { impl_->stop(grace); }
bool HttpFront::stopping() const { return impl_->stopping_.load(); }

HttpFrontCounters HttpFront::counters() const {
  std::lock_guard lock(impl_->counters_mutex_);
  return impl_->counters_;
}

}  // namespace pagoda::server
