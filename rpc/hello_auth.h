#pragma once

// Proof of the shared secret in a connection's hello, without sending the secret.
//
// A worker connecting to another presents, instead of `RpcOptions::secret` itself:
//
//   "v1:" hex(nonce) ":" time_ms ":" hex(HMAC-SHA256(secret, "cohort-rpc-hello" \0 from \0 to \0
//                                                     nonce \0 time_ms))
//
// with a fresh 16-byte random nonce and the sender's wall clock. The receiver recomputes the MAC
// with its own secret (compared in constant time), requires the clock to be within
// kHelloClockWindow of its own, and refuses a nonce it has already accepted within that window.
// So someone who reads the network learns neither the secret nor a hello they could replay (to
// this worker: a hello names its sender and receiver, so it is no good for any other pair either).
//
// What it does not do: it authenticates the connection's first message only, and nothing is
// encrypted. Someone able to inject into an established TCP connection, or to read the tensors on
// it, is not kept out; use a private network (or a VPN) for that. HMAC and the nonces come from
// OpenSSL's libcrypto.

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace cohort::rpc {

inline constexpr std::chrono::seconds kHelloClockWindow{300};

// The hello's secret field for a connection from worker `from` to worker `to`; "" when secret is "".
std::string makeHelloProof(const std::string& secret, const std::string& from, const std::string& to);

// Remembers the nonces accepted in the last kHelloClockWindow (per receiving agent).
class HelloReplayGuard {
 public:
  // True if the nonce is new (it is remembered from now on); false if it was seen.
  bool admit(const std::string& nonce, int64_t timeMs, int64_t nowMs);

 private:
  std::mutex mu_;
  std::multimap<int64_t, std::string> byTime_;
  std::map<std::string, int64_t> seen_;
};

// Checks a hello's secret field from worker `from` received by worker `to`, against this worker's
// secret. Empty when accepted, else why not, in words for the refusal ("presented the wrong shared
// secret", "replayed an earlier hello", a clock off by more than the window).
std::string checkHelloProof(const std::string& secret, const std::string& from, const std::string& to,
                            const std::string& proof, HelloReplayGuard& guard);

// For tests: a proof with a chosen nonce and time.
std::string makeHelloProofAt(const std::string& secret, const std::string& from, const std::string& to,
                             const std::string& nonce, int64_t timeMs);

}  // namespace cohort::rpc
