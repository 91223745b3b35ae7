"""The baselines the simulator sets Nezha beside, as the same job on other terms.

* Gloo (torch.distributed's CPU backend, one NIC): no negotiation, a flat ring over every rank for
  every size, and for training DDP's 25 MB buckets, fused as they fill; its per-step cost and its
  per-step CPU on shared cores are the profile's "gloo" kind.
* MPTCP: one TCP connection the kernel stripes over every TCP plane (a Nezha job on one rail whose
  rate is the planes' sum times the scheduler's efficiency, profile.extra["mptcp_efficiency"]);
  planes that are not TCP (RDMA, in-network aggregation) it cannot use.
"""
from __future__ import annotations

from typing import List

from .cluster import Cluster, Profile, RailModel

DDP_BUCKET_BYTES = 25 << 20


def gloo_profile(profile: Profile) -> Profile:
    return profile.with_overrides(
        name=profile.name + "+gloo", op_us=profile.extra.get("gloo_op_us", profile.op_us), per_rank_us=0.0,
        step_us={**profile.step_us, "tcp": profile.step("gloo")},
        step_cpu_us={**profile.step_cpu_us,
                     "tcp": profile.step_cpu_us.get("gloo", profile.step_cpu_us.get("tcp", 0.0))},
        negotiation_cpu_us=0.0, inline_ns_per_byte=0.0, inline_bytes=0, logstep_max_bytes=0, halving_max_bytes=0,
        balance_bytes=0, unfused_bytes=0, fusion_bytes=DDP_BUCKET_BYTES, cycle_ms=0.0, hierarchical=False)


def gloo_cluster(cluster: Cluster) -> Cluster:
    """Gloo on the first TCP plane (GLOO_SOCKET_IFNAME names one interface)."""
    tcp = [r for r in cluster.rails if r.kind in ("tcp", "mptcp")]
    if not tcp:
        raise ValueError("Gloo needs a TCP plane; the cluster has none")
    return Cluster(cluster.hosts, cluster.ranks_per_host, [RailModel("gloo:" + tcp[0].name, "tcp", tcp[0].gbps)])


def mptcp_cluster(cluster: Cluster, profile: Profile) -> Cluster:
    tcp: List[RailModel] = [r for r in cluster.rails if r.kind == "tcp"]
    if not tcp:
        raise ValueError("MPTCP needs TCP planes; the cluster has none")
    eff = profile.extra.get("mptcp_efficiency", 1.0)
    return Cluster(cluster.hosts, cluster.ranks_per_host,
                   [RailModel("mptcp", "mptcp", eff * sum(r.gbps for r in tcp))])
