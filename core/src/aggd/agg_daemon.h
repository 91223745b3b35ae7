// nezha-aggd's server: one epoll loop serving many jobs over TCP (agg_protocol.h).
//
// Why one loop: the work per byte is a memcpy and an add; a 2-core host saturates 1 Gbit/s links
// with one thread, and one thread needs no locks around the jobs. Each connection authenticates with
// the daemon's key (auth.h, HMAC), joins a job (id, epoch) and streams chunks; jobs are isolated: a
// stranger, a wrong key or a malformed first frame closes that connection only; a malformed chunk or a
// rank whose shape differs from its peers errors that job alone (every rank of it gets kError naming
// the cause); other jobs go on. Memory is bounded: a job reserves AggJob::reserved_bytes() from the
// pool when it is created (a join that does not fit is refused), and nothing else grows with what
// peers send. A job whose rank disconnects, or that makes no progress with chunks open, for
// job_timeout_s is failed and its slots freed. The loop sleeps in epoll_wait when idle (a 1 s tick
// only while connections exist, for the timeouts).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "transport/agg/agg_protocol.h"

namespace nezha::aggd {

struct AggDaemonOptions {
  std::string listen = "0.0.0.0:0";       // ADDR:PORT (port 0: any free port)
  std::string secret;                     // the daemon's key (NEZHA_AGG_SECRET / --secret-file)
  size_t pool_bytes = size_t{512} << 20;  // total memory all jobs may reserve
  double job_timeout_s = 30;              // a dead rank's job is freed after this
  double handshake_timeout_s = 5;         // a connection must have joined a job by then
};

struct AggDaemonStats {
  uint64_t jobs = 0, connections = 0, job_errors = 0, refused = 0, chunks_reduced = 0;
  size_t reserved_bytes = 0;
};

class AggDaemon {
 public:
  // Binds and listens at once (throws NezhaError naming the address on failure).
  explicit AggDaemon(AggDaemonOptions options);
  ~AggDaemon();
  AggDaemon(const AggDaemon&) = delete;
  AggDaemon& operator=(const AggDaemon&) = delete;

  int port() const { return port_; }
  std::string address() const;  // "ADDR:PORT" as bound

  void run();         // serves until stop(); the calling thread runs the loop
  void start();       // runs the loop on a thread of its own (tests)
  void stop();        // thread-safe; run() returns, start()'s thread is joined
  AggDaemonStats stats() const;  // thread-safe

 private:
  struct Conn;
  struct JobEntry;
  void accept_all();
  void on_readable(Conn& c);
  void on_writable(Conn& c);
  void handle_frame(Conn& c, const transport::agg::AggFrame& f);
  void handle_auth(Conn& c, const transport::agg::AggFrame& f);
  void handle_join(Conn& c, const transport::agg::AggFrame& f);
  void handle_chunk(Conn& c, const transport::agg::AggFrame& f);
  void fail_job(uint64_t job_id, const std::string& why);
  void close_conn(Conn& c, const std::string& why);  // deferred: reaped after the event batch
  void reap_closed();
  void queue(Conn& c, std::shared_ptr<const std::string> frame, bool answers_chunk);
  void send_error_and_close(Conn& c, const std::string& why);
  void update_events(Conn& c);
  void check_timeouts();

  AggDaemonOptions opt_;
  int listen_fd_ = -1, epoll_fd_ = -1, wake_fd_ = -1, port_ = 0;
  std::string bound_;
  std::map<int, std::unique_ptr<Conn>> conns_;
  std::map<uint64_t, std::unique_ptr<JobEntry>> jobs_;
  std::atomic<size_t> reserved_{0};  // written by the loop, read by stats()
  AggDaemonStats stats_;  // guarded by stats_mu_ for readers on other threads
  mutable std::mutex stats_mu_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace nezha::aggd
