#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings/bindings.h"
#include "graphtrain/options.h"

namespace nb = nanobind;

namespace graphtrain::bindings {

void bind_options(nb::module_& m) {
  m.def(
      "options_list",
      [] {
        nb::list out;
        for (const OptionValue& v : Options::global().values()) {
          const OptionSpec& s = *v.spec;
          nb::dict d;
          d["name"] = s.name;
          d["type"] = to_string(s.type);
          d["value"] = v.value;
          d["source"] = to_string(v.source);
          d["default"] = s.default_value;
          d["env"] = s.env;
          d["doc"] = s.doc;
          d["choices"] = s.choices;
          d["min"] = s.min_value;
          d["max"] = s.max_value;
          out.append(d);
        }
        return out;
      },
      "Every runtime option with its effective value (canonical text) and its source.");
  m.def(
      "set_option",
      [](const std::string& name, const std::string& value) { Options::global().set(name, value); },
      nb::arg("name"), nb::arg("value"), "Set an option from the API (validated; source 'api').");
  m.def(
      "reload_options", [] { Options::global().reload(); },
      "Forget API settings and read every option from the environment again.");
}

}  // namespace graphtrain::bindings
