/*
 * TCPStore: the Store of a multi-process, multi-host job. One TCPStoreServer (hosted by rank 0,
 * or by the launcher) holds the keys; every rank talks to it through a TCPStore client.
 *
 * Threads. The server runs one Boost.Asio event loop on its own thread and keeps all state on
 * it, so no request ever waits for another. A client owns one connection and one I/O thread;
 * any number of threads may share a client: each request carries an id and the replies are
 * matched by id, so a thread blocked in wait() or get() does not hold up another thread's set().
 * Every blocking call waits on its own deadline on the caller's side, so a hung server costs a
 * TimeoutError, never a hang. After the connection breaks (server gone), every pending and later
 * call throws StoreError naming host:port and the reason; make a new client to reconnect.
 * A client or server belongs to the process that made it: a forked child makes its own (using
 * the parent's throws StoreError; its destructor in the child releases nothing of the parent's).
 *
 * Connecting. The client resolves host:port and connects, retrying with exponential backoff
 * (10 ms doubling to 1 s) until the connect timeout; then it fails with a StoreError naming
 * host:port, how long it tried, how many attempts and the last error.
 *
 * Token. When the server has a token (option, or COHORT_STORE_TOKEN), a client must present the
 * same one in its hello (compared in constant time) or it is refused: the client gets a
 * StoreError saying whether it sent none or a different one. The token travels in clear text; it
 * keeps out strays, not attackers on the wire.
 *
 * ---- Protocol, version 1 --------------------------------------------------------------------
 * Integers are little-endian. Every message both ways is a frame: a u32 body length N, then N
 * bytes of body. Field types: u8, u16, u32, i64; str = u32 length + that many bytes; keys = u32
 * count + that many str.
 *
 * Client request body:   u8 opcode, u32 request id, fields.
 * Server reply body:     u8 status, u32 request id (the request's), fields.
 * Status: 0 ok (fields as below), 1 value error (str message: e.g. add on a key that does not
 * hold an integer; the connection stays), 2 refused (str message; hello only, then the server
 * closes the connection).
 *
 *   op  name         request fields                   ok reply fields
 *    1  hello        u32 magic "CHST" (0x54534843),    u16 version, u32 max key size,
 *                    u16 version, str token            u32 max value size
 *    2  set          str key, str value                -
 *    3  get          str key                           str value   (held until the key exists)
 *    4  add          str key, i64 delta                i64 result
 *    5  compareSet   str key, str expected,            str value the key holds afterwards
 *                    str desired                       (see store.h for the missing-key cases)
 *    6  check        keys                              u32 n, then n × u8 (1: the key exists)
 *    7  delete       str key                           u8 existed
 *    8  numKeys      -                                 i64 count
 *    9  wait         keys                              -           (held until all exist)
 *   10  cancel       - (the id is that of an earlier   no reply
 *                    get/wait the client gave up on)
 *
 * The first frame must be a hello. Get and wait are answered by the server when the keys arrive
 * (it keeps waiters per key): clients never poll. A client that stops waiting sends cancel so
 * the server forgets the waiter; a reply that crosses the cancel is dropped by id.
 *
 * Robustness. The server drops a connection, logging the reason (COHORT_LOG warning), and serves
 * everyone else on: a frame longer than its limit (max key + 2 × max value + 64 bytes; a hello
 * 4160 bytes), a key or value over its limit, a first frame that is not a hello with the right
 * magic, a field running past its frame or trailing bytes, an unknown opcode, a hello that does
 * not arrive within the hello timeout, a peer that disconnects mid-frame, a peer that does not
 * read its replies (more than 2 × max value + 16 MiB queued for it). A hello with the right
 * magic but another version, or the wrong token, gets a refused reply naming the reason first.
 * The client knows the server's limits from the hello reply and rejects an oversized key or
 * value itself with a ValueError, before anything is sent.
 */
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <cohort/distributed/store/store.h>

namespace cohort::dist {

inline constexpr uint16_t kDefaultStorePort = 29500;
inline constexpr size_t kDefaultMaxKeySize = size_t{64} << 10;    // 64 KiB
inline constexpr size_t kDefaultMaxValueSize = size_t{64} << 20;  // 64 MiB

struct TCPStoreServerOptions {
  // The address to bind: a numeric address or a host name ("0.0.0.0" or "::" for every
  // interface). Standalone jobs keep the loopback default.
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: the kernel picks a free port; port() reports it
  // nullopt: COHORT_STORE_TOKEN (unset or empty: no token required). At most 4096 bytes.
  std::optional<std::string> token{};
  size_t maxKeySize = kDefaultMaxKeySize;
  size_t maxValueSize = kDefaultMaxValueSize;  // at most 1 GiB
  // A connection that has not completed its hello by then is dropped.
  Millis helloTimeout{30'000};
};

class TCPStoreServer {
 public:
  // Binds and starts serving on a background thread. Throws StoreError naming host:port when
  // the address cannot be resolved or bound (e.g. the port is taken).
  explicit TCPStoreServer(TCPStoreServerOptions opts = {});
  ~TCPStoreServer();  // stops serving: open connections are closed
  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;

  const std::string& host() const;
  uint16_t port() const;        // the bound port (the picked one when asked for 0)
  std::string address() const;  // "host:port"
  // Connections currently open (hello done or not): for tests and diagnostics.
  size_t numConnections() const;
  // Connections dropped so far for misbehaving (bad frame, magic, version, token, timeout).
  size_t numDropped() const;
  void stop();

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

struct TCPStoreOptions {
  std::string host = "127.0.0.1";
  uint16_t port = kDefaultStorePort;
  Millis timeout = kDefaultStoreTimeout;   // the default deadline of every call
  std::optional<Millis> connectTimeout{};  // nullopt: `timeout`
  // nullopt: COHORT_STORE_TOKEN (unset or empty: present none).
  std::optional<std::string> token{};
  // Also host a TCPStoreServer bound to host:port (port 0: a free one, see port()), with the
  // same token and default limits, living as long as this client. As c10d's is_master.
  bool isServer = false;
};

class TCPStore : public Store {
 public:
  // Connects (and with isServer first starts the server). Throws StoreError when the server
  // cannot be reached within the connect timeout or refuses the hello.
  explicit TCPStore(TCPStoreOptions opts);
  TCPStore(std::string host, uint16_t port, Millis timeout = kDefaultStoreTimeout);
  ~TCPStore() override;

  using Store::set;
  using Store::wait;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  std::string describe() const override;

  const std::string& host() const;
  uint16_t port() const;  // the server's port (the picked one for isServer with port 0)
  // The hosted server (isServer), else null.
  TCPStoreServer* server() const;

  class Impl;

 private:
  std::unique_ptr<TCPStoreServer> server_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cohort::dist
