#include "server/rpc/auth.h"

#include <chrono>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/steady_wait.h"
#include "gtest/gtest.h"
#include "server/rpc/rate_limit.h"

namespace idem {
namespace {

constexpr char kConfig[] = R"json({
  "principals": [
    {"name": "payments", "token": "tok-payments-0123456789",
     "tenants": ["tenant-a"], "role": "service"},
    {"name": "ops", "token": "tok-operator-0123456789", "tenants": ["*"],
     "role": "operator"}
  ],
  "certificates": [
    {"san": "spiffe://prod/orders", "name": "orders", "tenants": ["tenant-b"]}
  ]
})json";

TEST(AuthConfigTest, ParsesPrincipalsAndCertificates) {
  absl::StatusOr<AuthConfig> c = ParseAuthConfig(kConfig);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->tokens.size(), 2u);
  EXPECT_EQ(c->tokens[0].second.name, "payments");
  EXPECT_EQ(c->tokens[1].second.role, Role::kOperator);
  ASSERT_EQ(c->certificates.count("spiffe://prod/orders"), 1u);
  EXPECT_EQ(c->certificates["spiffe://prod/orders"].role, Role::kService);
}

TEST(AuthConfigTest, ErrorsNameTheField) {
  const std::pair<std::string, std::string> cases[] = {
      {R"({"principals": [{"name": "x", "token": "0123456789abcdef",
           "tenants": ["a"], "role": "admin"}]})",
       "principals[0].role"},
      {R"({"principals": [{"name": "x", "token": "short", "tenants": ["a"]}]})",
       "principals[0].token"},
      {R"({"principals": [{"name": "x", "token": "0123456789abcdef"}]})",
       "principals[0].tenants"},
      {R"({"principals": [{"name": "x", "token": "0123456789abcdef",
           "tenants": ["a"], "tenant": "b"}]})",
       "principals[0].tenant"},
      {R"({"certificates": [{"name": "x", "tenants": ["a"]}]})",
       "certificates[0].san"},
      {R"({"users": []})", "users"},
      {R"(not json)", "(top level)"},
      // Wrong JSON types name the field instead of throwing.
      {R"({"principals": [{"name": "x", "token": "0123456789abcdef",
           "tenants": ["a"], "role": null}]})",
       "principals[0].role"},
      {R"({"certificates": [{"san": "s", "name": "x", "tenants": ["a"],
           "role": 1}]})",
       "certificates[0].role"},
      {R"({"principals": [{"name": "x", "token": "0123456789abcdef",
           "tenants": ["a"], "role": true}]})",
       "principals[0].role"},
      {R"({"principals": [{"name": "x", "token": "0123456789abcdef",
           "tenants": ["a"], "role": ["operator"]}]})",
       "principals[0].role"},
      {R"({"principals": [{"name": 7, "token": "0123456789abcdef",
           "tenants": ["a"]}]})",
       "principals[0].name"},
      {R"({"principals": [{"name": "x", "token": null, "tenants": ["a"]}]})",
       "principals[0].token"},
      {R"({"principals": [{"name": "x", "token": "0123456789abcdef",
           "tenants": "a"}]})",
       "principals[0].tenants"},
      {R"({"principals": [{"name": "x", "token": "0123456789abcdef",
           "tenants": [1]}]})",
       "principals[0].tenants"},
      {R"({"certificates": [{"san": {}, "name": "x", "tenants": ["a"]}]})",
       "certificates[0].san"},
      {R"({"principals": [null]})", "principals[0]"},
      {R"({"principals": {}})", "principals"},
      {R"([])", "(top level)"},
  };
  for (const auto& [json, field] : cases) {
    absl::StatusOr<AuthConfig> c = ParseAuthConfig(json);
    ASSERT_FALSE(c.ok()) << json;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(field), std::string::npos)
        << c.status() << " should name " << field;
  }
}

TEST(AuthorizeTest, RolesAndTenants) {
  Principal service{"payments", Role::kService, {"tenant-a"}};
  Principal op{"ops", Role::kOperator, {"*"}};
  Principal scoped_op{"ops-a", Role::kOperator, {"tenant-a"}};
  EXPECT_TRUE(Authorize(service, false, "tenant-a").ok());
  EXPECT_EQ(Authorize(service, false, "tenant-b").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Authorize(service, true, "tenant-a").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(Authorize(op, true, "").ok());
  EXPECT_TRUE(Authorize(op, true, "anything").ok());
  EXPECT_TRUE(Authorize(scoped_op, true, "tenant-a").ok());
  EXPECT_EQ(Authorize(scoped_op, true, "").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(ConstantTimeEqualsTest, Compares) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abcd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "abc"));
}

TEST(AuthenticatorTest, IdentifiesAndReloads) {
  const std::string path = ::testing::TempDir() + "/auth-tokens.json";
  std::ofstream(path) << kConfig;
  absl::StatusOr<std::unique_ptr<Authenticator>> auth =
      Authenticator::Create(path);
  ASSERT_TRUE(auth.ok()) << auth.status();
  absl::StatusOr<Principal> p =
      (*auth)->Identify("tok-payments-0123456789", {});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->name, "payments");
  EXPECT_EQ((*auth)->Identify("tok-wrong", {}).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*auth)->Identify("", {}).status().code(),
            absl::StatusCode::kUnauthenticated);
  p = (*auth)->Identify("", {"dns:x", "spiffe://prod/orders"});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->name, "orders");
  EXPECT_EQ((*auth)->Identify("", {"spiffe://prod/other"}).status().code(),
            absl::StatusCode::kUnauthenticated);

  // A new file takes effect; the old token stops working.
  std::ofstream(path, std::ios::trunc)
      << R"({"principals": [{"name": "new", "token": "tok-new-0123456789ab",
             "tenants": ["t"]}]})";
  ASSERT_TRUE((*auth)->ReloadIfChanged().ok());
  EXPECT_TRUE((*auth)->Identify("tok-new-0123456789ab", {}).ok());
  EXPECT_FALSE((*auth)->Identify("tok-payments-0123456789", {}).ok());
  // A broken file keeps the last good principals.
  std::ofstream(path, std::ios::trunc) << "{broken";
  EXPECT_FALSE((*auth)->ReloadIfChanged().ok());
  EXPECT_TRUE((*auth)->Identify("tok-new-0123456789ab", {}).ok());
}

// Removing the file revokes every principal (the old code kept them and
// logged an error every second); writing it back restores them. A file
// missing at start-up refuses to start.
TEST(AuthenticatorTest, RemovingTheFileRevokesEveryPrincipal) {
  const std::string path = ::testing::TempDir() + "/auth-tokens-removed.json";
  std::ofstream(path, std::ios::trunc) << kConfig;
  absl::StatusOr<std::unique_ptr<Authenticator>> auth =
      Authenticator::Create(path);
  ASSERT_TRUE(auth.ok()) << auth.status();
  ASSERT_TRUE((*auth)->Identify("tok-payments-0123456789", {}).ok());
  ASSERT_EQ(std::remove(path.c_str()), 0);
  EXPECT_TRUE((*auth)->ReloadIfChanged().ok());
  EXPECT_EQ((*auth)->Identify("tok-payments-0123456789", {}).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_FALSE((*auth)->Identify("", {"spiffe://prod/orders"}).ok());
  EXPECT_TRUE((*auth)->ReloadIfChanged().ok());
  std::ofstream(path, std::ios::trunc) << kConfig;
  EXPECT_TRUE((*auth)->ReloadIfChanged().ok());
  EXPECT_TRUE((*auth)->Identify("tok-payments-0123456789", {}).ok());

  EXPECT_FALSE(Authenticator::Create(path + ".absent").ok());
}

// The watcher thread re-reads a changed file every second: a file that no
// longer parses (here a role of the wrong JSON type, which once threw out of
// that thread and killed the process) is logged and the previous principals
// stay; a good file later takes effect.
TEST(AuthenticatorTest, WatcherKeepsThePrincipalsOfTheLastGoodFile) {
  const std::string path = ::testing::TempDir() + "/auth-tokens-watched.json";
  std::ofstream(path) << kConfig;
  absl::StatusOr<std::unique_ptr<Authenticator>> auth =
      Authenticator::Create(path);
  ASSERT_TRUE(auth.ok()) << auth.status();
  std::ofstream(path, std::ios::trunc)
      << R"({"principals": [{"name": "new", "token": "tok-new-0123456789ab",
             "tenants": ["t"], "role": null}]})";
  absl::SleepFor(absl::Seconds(3));
  // The watcher has read the change: a reload finds nothing new.
  EXPECT_TRUE((*auth)->ReloadIfChanged().ok());
  EXPECT_TRUE((*auth)->Identify("tok-payments-0123456789", {}).ok());
  EXPECT_FALSE((*auth)->Identify("tok-new-0123456789ab", {}).ok());

  std::ofstream(path, std::ios::trunc)
      << R"({"principals": [{"name": "new", "token": "tok-new-0123456789ab",
             "tenants": ["t"], "role": "operator"}]})";
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (absl::Now() < give_up &&
         !(*auth)->Identify("tok-new-0123456789ab", {}).ok()) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  absl::StatusOr<Principal> p = (*auth)->Identify("tok-new-0123456789ab", {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->role, Role::kOperator);
  EXPECT_FALSE((*auth)->Identify("tok-payments-0123456789", {}).ok());
}

TEST(RateLimiterTest, BucketsArePerTenant) {
  TenantRateLimiter limiter(10, 5);
  const SteadyTime t0 = SteadyClock::now();
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(limiter.Allow("a", t0));
  EXPECT_FALSE(limiter.Allow("a", t0));
  EXPECT_TRUE(limiter.Allow("b", t0));
  // 10 per second: one token back after 100 ms.
  const SteadyTime t1 = t0 + std::chrono::milliseconds(100);
  EXPECT_TRUE(limiter.Allow("a", t1));
  EXPECT_FALSE(limiter.Allow("a", t1));
  // Never more than the burst.
  const SteadyTime t2 = t0 + std::chrono::seconds(60);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(limiter.Allow("a", t2));
  EXPECT_FALSE(limiter.Allow("a", t2));
  TenantRateLimiter off(0, 0);
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(off.Allow("a", t0));
}

// Callers that send a new tenant name on every call, all at once (no
// bucket idle long enough to be full again), keep no more than max_buckets
// buckets; the old limiter kept one per name and scanned them all on every
// call past 100,000.
TEST(RateLimiterTest, ManyTenantsAtOnceStayWithinTheBucketBound) {
  TenantRateLimiter limiter(1, 1, /*max_buckets=*/1000);
  const SteadyTime t0 = SteadyClock::now();
  for (int i = 0; i < 50000; ++i) {
    EXPECT_TRUE(limiter.Allow(absl::StrCat("tenant-", i), t0));
  }
  EXPECT_EQ(limiter.buckets(), 1000u);
  // The most recent tenants keep their (empty) buckets.
  EXPECT_FALSE(limiter.Allow("tenant-49999", t0));
}

// Buckets full again are dropped as calls pass them, so an idle limiter
// shrinks back; a dropped tenant starts again with a full burst.
TEST(RateLimiterTest, FullBucketsAreDropped) {
  TenantRateLimiter limiter(10, 2);
  const SteadyTime t0 = SteadyClock::now();
  for (int i = 0; i < 100; ++i) limiter.Allow(absl::StrCat("t", i), t0);
  EXPECT_EQ(limiter.buckets(), 100u);
  // 200 ms later every bucket holds its burst again.
  const SteadyTime later = t0 + std::chrono::milliseconds(200);
  for (int i = 0; i < 60; ++i) limiter.Allow("x", later);
  EXPECT_EQ(limiter.buckets(), 1u);
  EXPECT_TRUE(limiter.Allow("t0", later));
  EXPECT_TRUE(limiter.Allow("t0", later));
  EXPECT_FALSE(limiter.Allow("t0", later));
}

}  // namespace
}  // namespace idem
