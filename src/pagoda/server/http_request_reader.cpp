#include "pagoda/server/http_request_reader.h"

#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <fmt/format.h>

namespace pagoda::server {

namespace http = boost::beast::http;

class HttpRequestReader::Parser {
 public:
  http::request_parser<http::string_body> parser;
};

namespace {

HttpReadError read_error_for(const boost::system::error_code& ec) {
  if (ec == http::error::header_limit) return {431, "the request line and headers are too large"};
  if (ec == http::error::body_limit) return {413, "the request body is too large"};
  if (ec == http::error::bad_version) return {505, "only HTTP/1.0 and HTTP/1.1 are served"};
  if (ec == http::error::bad_content_length || ec == http::error::multiple_content_length)
    return {400, "bad Content-Length"};
  if (ec == http::error::bad_transfer_encoding) return {400, "bad Transfer-Encoding"};
  if (ec == http::error::bad_chunk || ec == http::error::bad_chunk_extension) return {400, "bad chunked body"};
  return {400, fmt::format("malformed HTTP request ({})", ec.message())};
}

}  // namespace

HttpRequestReader::HttpRequestReader(HttpReadLimits limits) : parser_(std::make_unique<Parser>()) {
  parser_->parser.header_limit(static_cast<std::uint32_t>(std::min<size_t>(limits.max_header_bytes, UINT32_MAX)));
  parser_->parser.body_limit(limits.max_body_bytes);
  parser_->parser.eager(true);
}

HttpRequestReader::~HttpRequestReader() = default;

size_t HttpRequestReader::feed(std::string_view bytes) {
  if (failed() || complete()) return 0;
  size_t used = 0;
  while (used < bytes.size() && !parser_->parser.is_done()) {
    boost::system::error_code ec;
    const size_t n =
        parser_->parser.put(boost::asio::const_buffer(bytes.data() + used, bytes.size() - used), ec);
    used += n;
    if (ec == http::error::need_more) break;
    if (ec) {
      error_ = read_error_for(ec);
      return used;
    }
    if (n == 0) break;
  }
  if (header_done() && !failed()) {
    const auto& req = parser_->parser.get();
    const unsigned version = req.version();
    if (version != 10 && version != 11) {
      error_ = HttpReadError{505, "only HTTP/1.0 and HTTP/1.1 are served"};
    } else if (req.target().empty() || req.target().front() != '/') {
      error_ = HttpReadError{400, "the request target must be a path starting with '/'"};
    }
  }
  return used;
}

bool HttpRequestReader::header_done() const { return parser_->parser.is_header_done(); }
bool HttpRequestReader::complete() const { return !failed() && parser_->parser.is_done(); }

bool HttpRequestReader::expects_continue() const {
  if (!header_done()) return false;
  const auto& req = parser_->parser.get();
  const auto it = req.find(http::field::expect);
  if (it == req.end()) return false;
  const auto v = it->value();
  return v.size() == 12 && std::equal(v.begin(), v.end(), "100-continue", [](char a, char b) {
           return std::tolower(static_cast<unsigned char>(a)) == b;
         });
}

bool HttpRequestReader::keep_alive() const { return header_done() && parser_->parser.get().keep_alive(); }

HttpRequest HttpRequestReader::take_request() {
  auto& req = parser_->parser.get();
  HttpRequest out;
  out.method = std::string(req.method_string());
  out.target = std::string(req.target());
  out.path = out.target.substr(0, out.target.find('?'));
  out.version = req.version();
  for (const auto& field : req) out.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  out.body = std::move(req.body());
  return out;
}

}  // namespace pagoda::server
