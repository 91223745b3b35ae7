#!/usr/bin/env bash
# Installs the Debian packages the build and the testbed need, if missing. Needs root for apt-get;
# without root it only reports what is missing (the C++ tests and testbed tests then cannot run).
set -euo pipefail
need=()
[ -f /usr/include/openssl/hmac.h ] || need+=(libssl-dev)
[ -f /usr/lib/x86_64-linux-gnu/libgtest.a ] || [ -f /usr/lib/libgtest.a ] || [ -f /usr/lib/aarch64-linux-gnu/libgtest.a ] || need+=(libgtest-dev)
command -v ip >/dev/null || need+=(iproute2)
command -v mptcpize >/dev/null || need+=(mptcpize)
command -v g++ >/dev/null || need+=(g++)
command -v python3 >/dev/null || need+=(python3 python3-venv python3-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)
# libfabric: the ofi rail (RDMA: verbs on IB/RoCE; its tcp and shm providers here). Optional for the
# build (without it an ofi: rail raises a NezhaError), but CI builds and tests it.
[ -f /usr/include/rdma/fabric.h ] || need+=(libfabric-dev)
command -v fi_info >/dev/null || need+=(libfabric-bin)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "missing system packages: ${need[*]} (install them as root)" >&2
  exit 1
fi
echo "installing system packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
