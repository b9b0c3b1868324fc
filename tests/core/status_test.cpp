#include "pagoda/core/status.h"

#include <gtest/gtest.h>

namespace pagoda {
namespace {

StatusOr<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument_error("value {} is not positive", v);
  return v;
}

Status twice(int v, int* out) {
  PAGODA_ASSIGN_OR_RETURN(int x, parse_positive(v));
  *out = 2 * x;
  return ok_status();
}

TEST(StatusTest, OkAndErrorsCarryCodeAndMessage) {
  EXPECT_TRUE(ok_status().ok());
  Status s = not_found_error("tensor '{}' missing", "lm_head.weight");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.to_string(), "NOT_FOUND: tensor 'lm_head.weight' missing");
  EXPECT_EQ(s.with_context("model.safetensors").message(), "model.safetensors: tensor 'lm_head.weight' missing");
}

TEST(StatusTest, AssignOrReturnPropagates) {
  int out = 0;
  EXPECT_TRUE(twice(4, &out).ok());
  EXPECT_EQ(out, 8);
  Status s = twice(-1, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out, 8);
}

}  // namespace
}  // namespace pagoda
