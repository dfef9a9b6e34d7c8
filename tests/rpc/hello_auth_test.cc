// The hello's proof of the shared secret (rpc/hello_auth.h): a good proof is accepted once; the
// secret never appears in it; a wrong secret, a proof made for another pair of workers, a
// tampered field, a replay, or a clock outside the window is refused with words saying which.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include <cohort/rpc/hello_auth.h>

namespace cohort::rpc {
namespace {

int64_t nowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

TEST(RpcHelloAuth, AGoodProofIsAcceptedOnceAndHoldsNoSecret) {
  HelloReplayGuard guard;
  const std::string secret = "s3cret-that-must-not-travel";
  std::string proof = makeHelloProof(secret, "w0", "w1");
  EXPECT_EQ(proof.find(secret), std::string::npos);
  EXPECT_EQ(proof.find("s3cret"), std::string::npos);
  EXPECT_EQ(proof.rfind("v1:", 0), 0u) << proof;
  EXPECT_EQ(checkHelloProof(secret, "w0", "w1", proof, guard), "");
  EXPECT_EQ(checkHelloProof(secret, "w0", "w1", proof, guard), "worker 'w0' replayed an earlier hello");
  // Two hellos never share a nonce, so a second connection is fine.
  EXPECT_NE(makeHelloProof(secret, "w0", "w1"), proof);
  EXPECT_EQ(checkHelloProof(secret, "w0", "w1", makeHelloProof(secret, "w0", "w1"), guard), "");
}

TEST(RpcHelloAuth, WrongSecretsOtherPairsAndTamperingAreRefused) {
  HelloReplayGuard guard;
  const std::string wrong = "worker 'w0' presented the wrong shared secret";
  std::string proof = makeHelloProof("right", "w0", "w1");
  EXPECT_EQ(checkHelloProof("other", "w0", "w1", proof, guard), wrong);
  // Made for w0 -> w1: no good from w0 to w2, nor claimed by w2.
  EXPECT_EQ(checkHelloProof("right", "w0", "w2", proof, guard), wrong);
  EXPECT_EQ(checkHelloProof("right", "w2", "w1", proof, guard), "worker 'w2' presented the wrong shared secret");
  // Every field is covered by the MAC; malformed ones are refused before it.
  std::string t = proof;
  t[5] = t[5] == 'a' ? 'b' : 'a';  // a nonce digit
  EXPECT_EQ(checkHelloProof("right", "w0", "w1", t, guard), wrong);
  t = proof;
  size_t timeAt = proof.find(':', 3) + 1;
  t[timeAt + 3] = t[timeAt + 3] == '1' ? '2' : '1';  // the time
  EXPECT_EQ(checkHelloProof("right", "w0", "w1", t, guard), wrong);
  t = proof;
  t.back() = t.back() == '0' ? '1' : '0';  // the MAC
  EXPECT_EQ(checkHelloProof("right", "w0", "w1", t, guard), wrong);
  for (const std::string& junk :
       {std::string(), std::string("right"), std::string("v1:"), std::string("v1:zz:1:zz"),
        std::string("v2") + proof.substr(2), proof + "0", proof.substr(0, proof.size() - 1)}) {
    EXPECT_EQ(checkHelloProof("right", "w0", "w1", junk, guard), wrong) << junk;
  }
  // The untampered proof still works (nothing above was admitted).
  EXPECT_EQ(checkHelloProof("right", "w0", "w1", proof, guard), "");
}

TEST(RpcHelloAuth, NoSecretOnBothSidesNeedsNoProofAndAMismatchIsRefused) {
  HelloReplayGuard guard;
  EXPECT_EQ(makeHelloProof("", "w0", "w1"), "");
  EXPECT_EQ(checkHelloProof("", "w0", "w1", "", guard), "");
  EXPECT_EQ(checkHelloProof("", "w0", "w1", makeHelloProof("x", "w0", "w1"), guard),
            "worker 'w0' presented the wrong shared secret");
  EXPECT_EQ(checkHelloProof("x", "w0", "w1", "", guard), "worker 'w0' presented the wrong shared secret");
}

TEST(RpcHelloAuth, AClockOutsideTheWindowIsRefusedNamingTheClocks) {
  HelloReplayGuard guard;
  const int64_t window = std::chrono::milliseconds(kHelloClockWindow).count();
  std::string old = makeHelloProofAt("k", "w0", "w1", std::string(16, 'a'), nowMs() - window - 60'000);
  std::string why = checkHelloProof("k", "w0", "w1", old, guard);
  EXPECT_NE(why.find("worker 'w0''s hello was stamped -"), std::string::npos) << why;
  EXPECT_NE(why.find("check the hosts' clocks"), std::string::npos) << why;
  std::string future = makeHelloProofAt("k", "w0", "w1", std::string(16, 'b'), nowMs() + window + 60'000);
  EXPECT_NE(checkHelloProof("k", "w0", "w1", future, guard).find("check the hosts' clocks"), std::string::npos);
  // Inside the window: accepted.
  std::string skewed = makeHelloProofAt("k", "w0", "w1", std::string(16, 'c'), nowMs() - window / 2);
  EXPECT_EQ(checkHelloProof("k", "w0", "w1", skewed, guard), "");
}

TEST(RpcHelloAuth, TheReplayGuardForgetsOnlyWhatLeftTheWindow) {
  HelloReplayGuard guard;
  const int64_t now = nowMs();
  const int64_t window = std::chrono::milliseconds(kHelloClockWindow).count();
  EXPECT_TRUE(guard.admit("n1", now, now));
  EXPECT_FALSE(guard.admit("n1", now, now + window));     // still remembered inside the window
  EXPECT_TRUE(guard.admit("n1", now, now + 3 * window));  // long gone (its clock refuses it anyway)
  EXPECT_TRUE(guard.admit("n2", now + 3 * window, now + 3 * window));
  EXPECT_FALSE(guard.admit("n2", now + 3 * window, now + 3 * window + 1000));
}

}  // namespace
}  // namespace cohort::rpc
