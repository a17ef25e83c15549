// The S3 store against `scripts/s3_strict_peer.py`, an in-tree S3 peer that,
// unlike s3rver, checks every request's SigV4 signature (with botocore's
// signer as the reference) and enforces conditional writes (If-Match /
// If-None-Match). The peer is started by the test (python3 with Debian's
// python3-botocore, installed by scripts/install-deps.sh).

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "runtime/store/s3_store.hpp"
#include "store_fixtures.hpp"
#include "transport/s3_client.hpp"

namespace stitch {
namespace {

using namespace stitch::testing;
using transport::s3_client;
using transport::s3_config;
using transport::s3_write_condition;

constexpr std::string_view bucket = "strict";

/// The peer as a child process; its endpoint is the first line it prints.
class strict_peer {
public:
  strict_peer() {
    int fds[2];
    if (::pipe(fds) != 0)
      return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
      const std::string script = std::string{STITCH_SOURCE_DIR} + "/scripts/s3_strict_peer.py";
      ::execl("/usr/bin/python3", "python3", script.c_str(), "--access-key", "STRICT",
              "--secret-key", "strict-secret-key", nullptr);
      ::_exit(127);
    }
    ::close(fds[1]);
    FILE* out = ::fdopen(fds[0], "r");
    char line[256] = {};
    if (out && std::fgets(line, sizeof line, out))
      endpoint_ = std::string{line}.substr(0, std::string{line}.find('\n'));
    if (out)
      std::fclose(out);
  }
  ~strict_peer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  const std::string& endpoint() const { return endpoint_; }

private:
  pid_t pid_ = -1;
  std::string endpoint_;
};

s3_config config_for(const std::string& endpoint, std::string secret = "strict-secret-key") {
  s3_config c;
  c.endpoint = endpoint;
  c.region = "us-east-1";
  c.credentials = {"STRICT", std::move(secret), ""};
  c.max_attempts = 1;
  return c;
}

class s3_strict_test : public ::testing::Test {
protected:
  void SetUp() override {
    ASSERT_TRUE(peer.endpoint().starts_with("http://"))
      << "scripts/s3_strict_peer.py did not start (python3-botocore missing? "
         "scripts/install-deps.sh installs it)";
    auto c = s3_client::open(config_for(peer.endpoint()));
    ASSERT_TRUE(c) << to_string(c.error());
    raw = std::move(*c);
    ASSERT_TRUE(raw->create_bucket(bucket));
  }

  std::unique_ptr<store_backend> open_store() {
    auto s = store::open_s3_store("s3://" + std::string{bucket} + "/p",
                                  store::s3_options{config_for(peer.endpoint())});
    EXPECT_TRUE(s) << (s ? "" : to_string(s.error()));
    return s ? std::move(*s) : nullptr;
  }

  strict_peer peer;
  std::unique_ptr<s3_client> raw;
};

TEST_F(s3_strict_test, requests_signed_with_another_secret_are_refused) {
  auto wrong = s3_client::open(config_for(peer.endpoint(), "not-the-secret"));
  ASSERT_TRUE(wrong);
  auto put = (*wrong)->put_object(bucket, "k", "v");
  ASSERT_FALSE(put);
  EXPECT_NE(put.error().message.find("SignatureDoesNotMatch"), std::string::npos)
    << put.error().message;
  auto ok = raw->put_object(bucket, "k", "v");
  ASSERT_TRUE(ok) << to_string(ok.error());
  auto got = raw->get_object(bucket, "k");
  ASSERT_TRUE(got) << to_string(got.error());
  EXPECT_EQ(got->body, "v");
  // Keys that need percent-encoding are signed as S3 computes them.
  ASSERT_TRUE(raw->put_object(bucket, "a b/c+d=e~f%", "w"));
  EXPECT_EQ(raw->get_object(bucket, "a b/c+d=e~f%")->body, "w");
}

TEST_F(s3_strict_test, conditional_writes_are_compare_and_swap) {
  auto first = raw->put_object(bucket, "latest", "1", s3_write_condition::absent());
  ASSERT_TRUE(first) << to_string(first.error());
  auto again = raw->put_object(bucket, "latest", "2", s3_write_condition::absent());
  ASSERT_FALSE(again) << "If-None-Match: * on an existing key";
  EXPECT_EQ(again.error().code, errc::conflict);
  auto moved = raw->put_object(bucket, "latest", "2", s3_write_condition::matching(first->etag));
  ASSERT_TRUE(moved) << to_string(moved.error());
  auto stale = raw->put_object(bucket, "latest", "3", s3_write_condition::matching(first->etag));
  ASSERT_FALSE(stale) << "If-Match with a superseded ETag";
  EXPECT_EQ(stale.error().code, errc::conflict);
  EXPECT_EQ(raw->get_object(bucket, "latest")->body, "2");
}

TEST_F(s3_strict_test, two_publishers_racing_on_one_pool_never_both_win_a_step) {
  // Both publishers store the same versions; then each keeps moving the
  // pointer one version on from what it read. With conditional writes
  // enforced, each step is won exactly once and the pointer never goes back.
  auto a = open_store();
  auto b = open_store();
  ASSERT_TRUE(a && b);
  const uint64_t last = 12;
  weights w{{"x", random_bytes(512, 1)}};
  ASSERT_TRUE(put(*a, "default", full_version("r", 0, w)));
  ASSERT_TRUE(a->claim("default", {"r", 0}));
  for (uint64_t v = 1; v <= last; ++v) {
    auto next = w;
    next["x"][v] ^= std::byte{1};
    ASSERT_TRUE(put(*a, "default", delta_version("r", v, w, next)));
    w = next;
  }
  std::atomic<uint64_t> wins{0};
  std::atomic<uint64_t> went_back{0};
  auto race = [&](store_backend& s) {
    uint64_t seen = 0;
    for (int attempts = 0; attempts < 400; ++attempts) {
      auto p = s.read_pointer("default");
      if (!p || !*p)
        continue;
      uint64_t now = (*p)->latest.version;
      if (now < seen)
        ++went_back;
      seen = now;
      if (now >= last)
        return;
      auto moved = s.compare_and_advance_pointer("default", (*p)->latest, {"r", now + 1});
      if (moved)
        ++wins;
      else if (moved.error().code != errc::conflict)
        ADD_FAILURE() << to_string(moved.error());
    }
  };
  std::thread ta{[&] { race(*a); }};
  std::thread tb{[&] { race(*b); }};
  ta.join();
  tb.join();
  auto p = a->read_pointer("default");
  ASSERT_TRUE(p && *p);
  EXPECT_EQ((*p)->latest.version, last);
  EXPECT_EQ(wins.load(), last) << "a step was won twice: the pointer's CAS is not enforced";
  EXPECT_EQ(went_back.load(), 0u);
}

} // namespace
} // namespace stitch
