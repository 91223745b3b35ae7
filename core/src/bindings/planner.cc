// nezha._core.planner: the engine's decision logic without an engine, for the simulator
// (nezha/sim). The rail table (cost models, cold/hot planning, probes, rail states), the share
// balancer that re-splits a striped operation while it runs, and a rail's failover health are the
// same objects the engine uses; the simulator feeds them modelled times instead of measured ones,
// so what it predicts follows every change to these rules with no copy in Python.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>

#include "common/error.h"
#include "engine/execution/share_balancer.h"
#include "engine/request.h"
#include "multirail/planner.h"
#include "multirail/rail_health.h"
#include "multirail/rail_table.h"

namespace py = pybind11;

namespace nezha::bindings {
namespace {

using multirail::RailEstimate;
using multirail::RailShare;
using multirail::RailState;

// Simulated seconds as the steady clock's time points the balancer and the health logic take:
// both only ever compare and subtract them.
Clock::time_point at_seconds(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0)
    throw InvalidArgument("simulated time must be finite and >= 0, got " + std::to_string(seconds));
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
}

double seconds_of(Clock::time_point t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); }

RailState parse_state(const std::string& s) {
  if (s == "up") return RailState::kUp;
  if (s == "down") return RailState::kDown;
  if (s == "probing") return RailState::kProbing;
  throw InvalidArgument("rail state must be up, down or probing, got '" + s + "'");
}

multirail::PlanSource parse_source(const std::string& s) {
  if (s == "negotiation") return multirail::PlanSource::kNegotiation;
  if (s == "round") return multirail::PlanSource::kRound;
  throw InvalidArgument("plan source must be negotiation or round, got '" + s + "'");
}

std::chrono::milliseconds ms(double v) { return std::chrono::milliseconds(static_cast<int64_t>(std::llround(v))); }

}  // namespace

void bind_planner(py::module_& parent) {
  py::module_ m = parent.def_submodule(
      "planner", "The engine's rail table, share balancer and rail health, driven by a caller's clock (nezha.sim).");

  py::class_<RailEstimate>(m, "RailEstimate")
      .def(py::init([](double alpha_us, double beta_gbps, uint64_t samples, double bulk_alpha_us,
                       double mid_alpha_us, double mid_beta_gbps, uint64_t min_striped_bytes) {
             return RailEstimate{alpha_us, beta_gbps, samples, bulk_alpha_us, mid_alpha_us, mid_beta_gbps,
                                 min_striped_bytes};
           }), py::arg("alpha_us") = 0.0, py::arg("beta_gbps") = 0.0, py::arg("samples") = 0,
           py::arg("bulk_alpha_us") = 0.0, py::arg("mid_alpha_us") = 0.0, py::arg("mid_beta_gbps") = 0.0,
           py::arg("min_striped_bytes") = 0)
      .def_readwrite("alpha_us", &RailEstimate::alpha_us)
      .def_readwrite("beta_gbps", &RailEstimate::beta_gbps)
      .def_readwrite("samples", &RailEstimate::samples)
      .def_readwrite("bulk_alpha_us", &RailEstimate::bulk_alpha_us)
      .def_readwrite("mid_alpha_us", &RailEstimate::mid_alpha_us)
      .def_readwrite("mid_beta_gbps", &RailEstimate::mid_beta_gbps)
      .def_readwrite("min_striped_bytes", &RailEstimate::min_striped_bytes)
      .def_property_readonly("known", &RailEstimate::known)
      .def_property_readonly("mid_known", &RailEstimate::mid_known)
      .def("__repr__", [](const RailEstimate& e) {
        return "<RailEstimate alpha_us=" + std::to_string(e.alpha_us) + " beta_gbps=" + std::to_string(e.beta_gbps) +
               " samples=" + std::to_string(e.samples) + " bulk_alpha_us=" + std::to_string(e.bulk_alpha_us) +
               " mid_alpha_us=" + std::to_string(e.mid_alpha_us) + " mid_beta_gbps=" + std::to_string(e.mid_beta_gbps) +
               " min_striped_bytes=" + std::to_string(e.min_striped_bytes) + ">";
      });

  py::class_<RailShare>(m, "RailShare")
      .def_readonly("rail", &RailShare::rail)
      .def_readonly("offset", &RailShare::offset)
      .def_readonly("count", &RailShare::count)
      .def("__repr__", [](const RailShare& s) {
        return "<RailShare rail=" + std::to_string(s.rail) + " offset=" + std::to_string(s.offset) +
               " count=" + std::to_string(s.count) + ">";
      });

  py::class_<multirail::Plan>(m, "Plan")
      .def_readonly("shares", &multirail::Plan::shares)
      .def_readonly("striped", &multirail::Plan::striped)
      .def_readonly("why", &multirail::Plan::why);

  m.def("share_gbps_prior", &multirail::share_gbps_prior, py::arg("link_gbps"), py::arg("collective_rail"),
        py::arg("ranks"), "The bandwidth a rail's cost model expects before it is measured (rail_table.h).");
  m.def("striping_threshold_bytes", &multirail::striping_threshold_bytes, py::arg("estimates"), py::arg("usable"),
        "Smallest payload striping is predicted to pay for (planner.h); 2**64-1 if never.");
  m.def("predicted_seconds", &multirail::predicted_seconds, py::arg("estimate"), py::arg("bytes"),
        "A known rail's predicted time for a whole payload, by the planner's prices (planner.h).");
  m.def("amortized_range_bytes", &multirail::amortized_range_bytes, py::arg("estimate"),
        "Smallest balanced range whose bulk start-up stays a small part of its time (planner.h).");
  m.def("scaled_unfused_bytes", &engine::scaled_unfused_bytes, py::arg("unfused_bytes"), py::arg("estimates"),
        "The unfused threshold rank 0's fusion uses given the rails' estimates (engine/request.h).");
  m.def("calibration_bytes", &multirail::RailTable::calibration_bytes,
        "The payloads the engine's calibration runs on each rail at init, in order.");
  m.attr("BALANCE_MIN_RANGES") = engine::kBalanceMinRanges;
  m.attr("MIN_CLAIM_SPREAD") = engine::kMinClaimSpread;
  m.attr("TAIL_CLAIM_SPREAD") = engine::kTailClaimSpread;

  py::class_<multirail::RailTable>(m, "RailTable",
                                   "The engine's rail table (multirail/rail_table.h), one per simulated job.")
      .def(py::init([](const std::vector<py::dict>& rails) {
             std::vector<multirail::RailDescription> out;
             for (const py::dict& r : rails) {
               multirail::RailDescription d;
               d.name = r["name"].cast<std::string>();
               if (r.contains("latency_us_prior")) d.latency_us_prior = r["latency_us_prior"].cast<double>();
               if (r.contains("gbps_prior")) d.gbps_prior = r["gbps_prior"].cast<double>();
               if (r.contains("max_share_bytes")) d.max_share_bytes = r["max_share_bytes"].cast<size_t>();
               if (r.contains("point_to_point")) d.point_to_point = r["point_to_point"].cast<bool>();
               // A collective rail (not point to point) reduces every dtype and op, as nezha-aggd does.
               if (!d.point_to_point) d.reduces = [](DataType, ReduceOp) { return true; };
               out.push_back(std::move(d));
             }
             return std::make_unique<multirail::RailTable>(std::move(out), multirail::RailCostModelOptions{});
           }), py::arg("rails"),
           "rails: dicts with name and optionally latency_us_prior, gbps_prior, max_share_bytes, "
           "point_to_point (False: reduces allreduces itself, like nezha-aggd).")
      .def("__len__", &multirail::RailTable::size)
      .def("observe", &multirail::RailTable::observe, py::arg("rail"), py::arg("bytes"), py::arg("seconds"))
      .def("observe_operation", &multirail::RailTable::observe_operation, py::arg("bytes"), py::arg("striped"),
           py::arg("seconds"), "An allreduce's time from its shares being posted to its result (StripingCheck).")
      .def("estimates", &multirail::RailTable::estimates)
      .def("set_shared_estimates", &multirail::RailTable::set_shared_estimates, py::arg("estimates"))
      .def("set_state", [](multirail::RailTable& t, int rail, const std::string& s) { t.set_state(rail, parse_state(s)); },
           py::arg("rail"), py::arg("state"))
      .def("state", [](const multirail::RailTable& t, int rail) { return std::string(rail_state_name(t.state(rail))); },
           py::arg("rail"))
      .def("usable", &multirail::RailTable::usable)
      .def("plan", [](multirail::RailTable& t, size_t count, size_t elem_size, bool splittable, bool allreduce,
                      const std::string& source, const std::vector<RailEstimate>& round_estimates) {
             multirail::OpToPlan op;
             op.count = count;
             op.elem_size = elem_size;
             op.splittable = splittable;
             op.allreduce = allreduce;
             return t.plan(op, parse_source(source), round_estimates);
           }, py::arg("count"), py::arg("elem_size"), py::arg("splittable") = true, py::arg("allreduce") = true,
           py::arg("source") = "negotiation", py::arg("round_estimates") = std::vector<RailEstimate>{},
           "The engine's plan of one float32-like operation (no shares: whole on rail 0).")
      .def("record_plan", &multirail::RailTable::record_plan, py::arg("shares"));

  py::class_<engine::ShareBalancer>(m, "ShareBalancer",
                                    "Re-splits one striped operation while it runs (share_balancer.h).")
      .def(py::init([](const std::vector<RailShare>& plan, size_t min_claim, size_t align, size_t floor_claim,
                       size_t tail_claim) {
             if (plan.empty()) throw InvalidArgument("ShareBalancer needs at least one share");
             return std::make_unique<engine::ShareBalancer>(plan, min_claim, align, floor_claim, tail_claim);
           }), py::arg("plan"), py::arg("min_claim"), py::arg("align") = 1, py::arg("floor_claim") = 0,
           py::arg("tail_claim") = 0)
      .def("claim", [](engine::ShareBalancer& b, size_t part, double now_s) {
             if (part >= b.parts()) throw InvalidArgument("ShareBalancer.claim: no part " + std::to_string(part));
             const auto r = b.claim(part, at_seconds(now_s));
             return py::make_tuple(r.offset, r.count);
           }, py::arg("part"), py::arg("now_s"),
           "The next (offset, count) range for `part`'s rail at simulated time now_s (count 0: none left).");

  py::class_<multirail::RailHealth>(m, "RailHealth", "A rail's failover state machine (rail_health.h).")
      .def(py::init([](const std::string& name, double initial_backoff_ms, double max_backoff_ms, double flap_window_ms) {
             multirail::RailHealthOptions o;
             o.initial_backoff = ms(initial_backoff_ms);
             o.max_backoff = ms(max_backoff_ms);
             o.flap_window = ms(flap_window_ms);
             return std::make_unique<multirail::RailHealth>(name, o);
           }), py::arg("name"), py::arg("initial_backoff_ms") = 500.0, py::arg("max_backoff_ms") = 30000.0,
           py::arg("flap_window_ms") = 60000.0)
      .def_property_readonly("state", [](const multirail::RailHealth& h) { return std::string(h.state_name()); })
      .def("mark_failed", [](multirail::RailHealth& h, double t) { h.mark_failed(at_seconds(t)); }, py::arg("now_s"))
      .def("probe_due", [](const multirail::RailHealth& h, double t) { return h.probe_due(at_seconds(t)); }, py::arg("now_s"))
      .def("begin_probe", [](multirail::RailHealth& h, double t) { h.begin_probe(at_seconds(t)); }, py::arg("now_s"))
      .def("probe_succeeded", [](multirail::RailHealth& h, double t) { h.probe_succeeded(at_seconds(t)); }, py::arg("now_s"))
      .def("probe_failed", [](multirail::RailHealth& h, double t) { h.probe_failed(at_seconds(t)); }, py::arg("now_s"))
      .def_property_readonly("next_probe_at_s", [](const multirail::RailHealth& h) { return seconds_of(h.next_probe_at()); });
}

}  // namespace nezha::bindings
