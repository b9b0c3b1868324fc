#include "pagoda/engine/stop_string_matcher.h"

#include <gtest/gtest.h>

namespace pagoda::engine {
namespace {

TEST(StopStringMatcherTest, NoStopsPassesEverythingThrough) {
  StopStringMatcher m;
  EXPECT_EQ(m.append("hello"), "hello");
  EXPECT_FALSE(m.stopped());
}

TEST(StopStringMatcherTest, FindsStopSpanningTokensAndNeverEmitsItsStart) {
  StopStringMatcher m({"###"});
  EXPECT_EQ(m.append("abc#"), "abc");
  EXPECT_EQ(m.append("#"), "");
  EXPECT_EQ(m.append("#tail"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.append("more"), "");
}

TEST(StopStringMatcherTest, IncludeStopEndsTheTextWithTheStopThatMatched) {
  StopStringMatcher m({"###"}, true);
  EXPECT_EQ(m.append("abc#"), "abc");
  EXPECT_EQ(m.append("#"), "");
  EXPECT_EQ(m.append("#tail"), "###") << "the held start and the rest of the stop, nothing after it";
  EXPECT_TRUE(m.stopped());
  // The earliest match wins; at one place the first stop given (here the shorter).
  StopStringMatcher e({"cd", "bc", "bcd"}, true);
  EXPECT_EQ(e.append("abcde"), "abc");
}

TEST(StopStringMatcherTest, PassEmitsHeldTextAndMatchesNothing) {
  StopStringMatcher m({"STOP"});
  EXPECT_EQ(m.append("go ST"), "go ");
  EXPECT_EQ(m.pass("OP now"), "STOP now");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.append(" STOP"), " ");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.pass("x"), "");
  // A stop string may start in passed text and end in appended text.
  StopStringMatcher across({"STOP"});
  EXPECT_EQ(across.pass("go ST"), "go ");
  EXPECT_EQ(across.append("OP"), "");
  EXPECT_TRUE(across.stopped());
}

TEST(StopStringMatcherTest, ReleasesHeldTextWhenItDiverges) {
  StopStringMatcher m({"STOP"});
  EXPECT_EQ(m.append("go ST"), "go ");
  EXPECT_EQ(m.append("OP"), "");  // completes
  EXPECT_TRUE(m.stopped());

  StopStringMatcher d({"STOP"});
  EXPECT_EQ(d.append("ST"), "");
  EXPECT_EQ(d.append("ART"), "START");
  EXPECT_FALSE(d.stopped());
  EXPECT_EQ(d.append("S"), "");
  EXPECT_EQ(d.flush(), "S");
}

TEST(StopStringMatcherTest, EarliestOfSeveralStopsWins) {
  StopStringMatcher m({"world", "lo w"});
  EXPECT_EQ(m.append("hello world"), "hel");
  EXPECT_TRUE(m.stopped());
}

TEST(StopStringMatcherTest, StopInsideOneChunk) {
  StopStringMatcher m({"\n\n"});
  EXPECT_EQ(m.append("line\n\nnext"), "line");
  EXPECT_TRUE(m.stopped());
}

TEST(StopStringMatcherTest, OverlappingPrefixesAreHandled) {
  StopStringMatcher m({"aab"});
  EXPECT_EQ(m.append("a"), "");
  EXPECT_EQ(m.append("a"), "");
  EXPECT_EQ(m.append("a"), "a");  // "aaa": only the last "aa" can still become "aab"
  EXPECT_EQ(m.append("b"), "");
  EXPECT_TRUE(m.stopped());
}

}  // namespace
}  // namespace pagoda::engine
