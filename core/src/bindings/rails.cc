// nezha._core's view of the rail kind table and the spec grammar (transport/rail_spec.h): Python
// parses NEZHA_RAILS here and only turns interfaces and subnets into addresses (nezha/rails.py).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common/error.h"
#include "engine/engine.h"
#include "transport/ofi/ofi_providers.h"
#include "transport/rail_factory.h"

namespace py = pybind11;

namespace nezha::bindings {

void bind_rails(py::module_& m, py::module_& testing) {
  using transport::RailTarget;
  py::enum_<RailTarget>(m, "RailTarget", "How a rail kind's target resolves (transport/rail_spec.h).")
      .value("none", RailTarget::kNone)
      .value("local_address", RailTarget::kLocalAddress)
      .value("provider_at_local_address", RailTarget::kProviderAtLocalAddress)
      .value("host_port", RailTarget::kHostPort);

  py::class_<transport::RailItem>(m, "RailItem", "One item of a rail spec as written, its target unresolved.")
      .def_readonly("text", &transport::RailItem::text)
      .def_readonly("kind", &transport::RailItem::kind)
      .def_readonly("target_form", &transport::RailItem::target_form)
      .def_readonly("target", &transport::RailItem::target)
      .def_readonly("options", &transport::RailItem::options, "(key, value) pairs in the order written.")
      .def("__repr__", [](const transport::RailItem& i) { return "<RailItem " + i.text + ">"; });
  m.def("parse_rails", &transport::parse_rail_list, py::arg("spec"),
        "Parses a comma list of rails (NEZHA_RAILS); ValueError naming the item that is wrong.");

  m.def("rail_kind_table", [] {
    py::list out;
    for (const auto& k : transport::rail_kind_table()) {
      py::dict row;
      row["kind"] = k.kind;
      row["target"] = k.target;
      row["target_continues_after_semicolon"] = k.target_continues_after_semicolon;
      row["control_path"] = k.message_path != nullptr;
      out.append(row);
    }
    return out;
  }, "The rail kind table, one dict per kind, sorted by kind.");
  m.def("rail_kinds", &transport::known_rail_kinds, "Every rail kind the core's rail factory builds.");
  m.def("ofi_available", &transport::ofi::ofi_available,
        "Whether this build has the ofi rail (libfabric was found when nezha._core was built).");
  m.def("ofi_providers", &transport::ofi::ofi_rdm_providers,
        "libfabric providers on this host with RDM tagged endpoints (e.g. 'tcp;ofi_rxm', "
        "'verbs;ofi_rxm'); empty without libfabric.");

  testing.def("register_rail_kind", [](const std::string& kind, RailTarget target, const std::string& like,
                                       bool target_continues_after_semicolon) {
    const transport::RailKind* model = transport::find_rail_kind(like);
    if (!model) throw InvalidArgument("register_rail_kind: no kind '" + like + "' to borrow a maker from");
    transport::register_rail_kind({kind, model->maker, target, target_continues_after_semicolon, nullptr});
  }, py::arg("kind"), py::arg("target"), py::arg("like"), py::arg("target_continues_after_semicolon") = false,
     "Adds a row to the kind table whose rails are built by the maker of kind `like` (tests: a kind "
     "the table does not ship, with no Python change).");

  py::class_<engine::RailConfig>(m, "RailConfig")
      .def(py::init([](std::string name, std::string addr, std::string kind,
                       std::map<std::string, std::string> options) {
             return engine::RailConfig{name, addr, kind, std::move(options)};
           }), py::arg("name"), py::arg("local_addr"), py::arg("kind") = "tcp",
           py::arg("options") = std::map<std::string, std::string>{})
      .def_readonly("name", &engine::RailConfig::name)
      .def_readonly("local_addr", &engine::RailConfig::local_addr)
      .def_readonly("kind", &engine::RailConfig::kind)
      .def_readonly("options", &engine::RailConfig::options)
      .def_readwrite("automatic", &engine::RailConfig::automatic,
                     "Added by nezha (NEZHA_AUTO_SHM), not named by the user: dropped where it cannot serve.");
}

}  // namespace nezha::bindings
