#include "pagoda/engine/request_timeline.h"

#include <fmt/format.h>

namespace pagoda::engine {
namespace {

std::string ms(double seconds) { return seconds < 0 ? std::string("-") : fmt::format("{:.1f}", seconds * 1e3); }

}  // namespace

std::string format_timeline(const RequestTimeline& t) {
  return fmt::format(
      "request {}: prompt {} (cached {}, host {}): picked up {} ms, admitted {}, load enqueued {} ({} in, {} out), "
      "load done {}, first step {} -> {} ({} seqs, {} tokens, {} admitted), first token {} after {} steps",
      t.request_id, t.prompt_tokens, t.cached_tokens, t.host_hit_tokens, ms(t.picked_up_s), ms(t.admitted_s),
      ms(t.load_enqueued_s), t.admission_h2d_blocks, t.admission_d2h_blocks, ms(t.load_done_s),
      ms(t.first_step_start_s), ms(t.first_step_end_s), t.first_step_sequences, t.first_step_tokens,
      t.admitted_with, ms(t.first_token_s), t.steps_before_first_token);
}

}  // namespace pagoda::engine
