"""Nezha's simulator: the engine's own planner, balancer and failover logic (nezha._core.planner)
on modelled rails, collectives as their step schedules, and a training step as compute plus the
gradients' allreduces. `python -m nezha.sim --help`; validation and predictions in
benchmarks/SCALE.md."""
from .cluster import Cluster, Profile, RailModel, load_profile, parse_rails
from .engine import SimJob

__all__ = ["Cluster", "Profile", "RailModel", "SimJob", "load_profile", "parse_rails"]
