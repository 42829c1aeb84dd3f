// env_choice (Note [Environment switches] in core/env.h).
#include "core/env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace strata {
namespace {

constexpr const char* kVar = "STRATA_TEST_ENV_CHOICE";

int choose() {
  return env_choice(kVar, {{"auto", "pick one"}, {"off", "never"}, {"fast", "always"}});
}

TEST(EnvChoice, UnsetAndEmptyAreTheDefault) {
  unsetenv(kVar);
  EXPECT_EQ(choose(), 0);
  setenv(kVar, "", 1);
  EXPECT_EQ(choose(), 0);
  unsetenv(kVar);
}

TEST(EnvChoice, EachValueGivesItsIndex) {
  setenv(kVar, "auto", 1);
  EXPECT_EQ(choose(), 0);
  setenv(kVar, "off", 1);
  EXPECT_EQ(choose(), 1);
  setenv(kVar, "fast", 1);
  EXPECT_EQ(choose(), 2);
  unsetenv(kVar);
}

TEST(EnvChoice, AnythingElseIsAUserErrorListingTheChoices) {
  for (const char* bad : {"Off", "maybe", "off "}) {
    setenv(kVar, bad, 1);
    try {
      choose();
      ADD_FAILURE() << "no error for " << bad;
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("environment variable STRATA_TEST_ENV_CHOICE=") + bad +
                    " is not a setting; use auto (the default: pick one), off (never) or fast "
                    "(always)");
    }
  }
  unsetenv(kVar);
}

}  // namespace
}  // namespace strata
