// Registers `fd` in the epoll set `epoll_fd` for readability (level-triggered; the event carries
// the fd). Returns epoll_ctl's result (errno set on failure).
#pragma once

#include <sys/epoll.h>

namespace nezha {

inline int epoll_add_readable(int epoll_fd, int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  return ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
}

}  // namespace nezha
