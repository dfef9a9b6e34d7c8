#include <cohort/rpc/hello_auth.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <array>
#include <cstdlib>

#include <fmt/format.h>

#include <cohort/core/util/error.h>

namespace cohort::rpc {

namespace {

constexpr size_t kNonceBytes = 16;
constexpr size_t kMacBytes = 32;  // SHA-256

std::string toHex(const unsigned char* p, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kDigits[p[i] >> 4];
    s[2 * i + 1] = kDigits[p[i] & 15];
  }
  return s;
}

// Decodes exactly `n` bytes of lower-case hex; false on anything else.
bool fromHex(const std::string& s, unsigned char* out, size_t n) {
  if (s.size() != 2 * n) return false;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < n; ++i) {
    int hi = digit(s[2 * i]), lo = digit(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

std::array<unsigned char, kMacBytes> mac(const std::string& secret, const std::string& from, const std::string& to,
                                         const std::string& nonceHex, int64_t timeMs) {
  std::string data = "cohort-rpc-hello";
  for (const std::string& part : {from, to, nonceHex, std::to_string(timeMs)}) {
    data.push_back('\0');
    data += part;
  }
  std::array<unsigned char, kMacBytes> out{};
  size_t len = 0;
  if (!EVP_Q_mac(nullptr, "HMAC", nullptr, "SHA256", nullptr, secret.data(), secret.size(),
                 reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(), out.size(), &len) ||
      len != kMacBytes) {
    throw RpcError("rpc: computing the hello's HMAC-SHA256 failed (OpenSSL)");
  }
  return out;
}

int64_t nowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string makeHelloProofAt(const std::string& secret, const std::string& from, const std::string& to,
                             const std::string& nonce, int64_t timeMs) {
  std::string nonceHex = toHex(reinterpret_cast<const unsigned char*>(nonce.data()), nonce.size());
  auto m = mac(secret, from, to, nonceHex, timeMs);
  return fmt::format("v1:{}:{}:{}", nonceHex, timeMs, toHex(m.data(), m.size()));
}

std::string makeHelloProof(const std::string& secret, const std::string& from, const std::string& to) {
  if (secret.empty()) return {};
  std::string nonce(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) != 1) {
    throw RpcError("rpc: drawing the hello's random nonce failed (OpenSSL RAND_bytes)");
  }
  return makeHelloProofAt(secret, from, to, nonce, nowMs());
}

bool HelloReplayGuard::admit(const std::string& nonce, int64_t timeMs, int64_t now) {
  std::lock_guard<std::mutex> lock(mu_);
  // Forget what has left the window: a hello that old is refused by its clock anyway.
  const int64_t horizon = now - 2 * std::chrono::milliseconds(kHelloClockWindow).count();
  while (!byTime_.empty() && byTime_.begin()->first < horizon) {
    seen_.erase(byTime_.begin()->second);
    byTime_.erase(byTime_.begin());
  }
  if (!seen_.emplace(nonce, timeMs).second) return false;
  byTime_.emplace(timeMs, nonce);
  return true;
}

std::string checkHelloProof(const std::string& secret, const std::string& from, const std::string& to,
                            const std::string& proof, HelloReplayGuard& guard) {
  const std::string wrong = fmt::format("worker '{}' presented the wrong shared secret", from);
  if (secret.empty()) return proof.empty() ? std::string() : wrong;
  // "v1:" nonce(32 hex) ":" time ":" mac(64 hex)
  if (proof.size() < 3 || proof.compare(0, 3, "v1:") != 0) return wrong;
  size_t a = proof.find(':', 3);
  size_t b = a == std::string::npos ? a : proof.find(':', a + 1);
  if (b == std::string::npos) return wrong;
  std::string nonceHex = proof.substr(3, a - 3);
  std::string timeStr = proof.substr(a + 1, b - a - 1);
  std::string macHex = proof.substr(b + 1);
  unsigned char nonce[kNonceBytes];
  unsigned char got[kMacBytes];
  if (!fromHex(nonceHex, nonce, kNonceBytes) || !fromHex(macHex, got, kMacBytes)) return wrong;
  if (timeStr.empty() || timeStr.size() > 18 || timeStr.find_first_not_of("0123456789") != std::string::npos)
    return wrong;
  const int64_t timeMs = std::strtoll(timeStr.c_str(), nullptr, 10);
  auto want = mac(secret, from, to, nonceHex, timeMs);
  if (CRYPTO_memcmp(want.data(), got, kMacBytes) != 0) return wrong;
  // The MAC is good: the sender knows the secret. Now freshness.
  const int64_t now = nowMs();
  const int64_t window = std::chrono::milliseconds(kHelloClockWindow).count();
  if (timeMs < now - window || timeMs > now + window) {
    return fmt::format("worker '{}''s hello was stamped {:.0f} s from this worker's clock (more than {} s): "
                       "check the hosts' clocks",
                       from, static_cast<double>(timeMs - now) / 1e3, kHelloClockWindow.count());
  }
  if (!guard.admit(nonceHex, timeMs, now)) return fmt::format("worker '{}' replayed an earlier hello", from);
  return {};
}

}  // namespace cohort::rpc
